//! One sandbox for one caller, from the pool or made anew, with its agent runtime initialised:
//! the path every claim takes, whether it comes from the E2B API or a SandboxClaim.
//!
//! # Expected flow
//!
//! [`ClaimEngine::claim_or_create`] is the choice between the two ways to get a sandbox:
//!
//! 1. [`ClaimEngine::claim`]: one compare-and-swap write of an available pool member.
//! 2. The pool has nothing to claim and the caller allows create-on-no-stock ⇒
//!    [`ClaimEngine::create_new`]: a new, already claimed sandbox, awaited until it runs.
//!
//! [`acquire`] is that plus the rest of a SandboxClaim's claim (the reference's
//! `TryClaimSandbox` post-processing):
//!
//! 3. With an in-place update in the options, a pool member's update is awaited
//!    ([`ClaimEngine::await_inplace_update`], bounded by its `ready_timeout`, the claim's
//!    `waitReadyTimeout`); a new sandbox was made with it and already runs.
//! 4. With an access token in the options, the agent runtime's `/init` through the
//!    [`SandboxInitializer`] (the same call the E2B create makes), carrying the env vars.
//! 5. A failure after the sandbox was claimed ⇒ [`ClaimEngine::discard_failed`]: deleted, or kept
//!    and labelled `agents.kruise.io/reserved-failed-sandbox=true` when the caller reserves
//!    failed sandboxes. A sandbox is never left claimed and uninitialised without that label.
//!
//! The E2B create uses steps 1 to 3 and does its own init, because it moves the sandbox's clock
//! between the two and answers a failure with its own error.

use std::sync::Arc;

use oka_api::{Sandbox, labels};
use oka_store::{Preconditions, Store, StoreError};
use tracing::{info, warn};

use crate::claim::{ClaimEngine, ClaimError, ClaimOptions, ClaimedSandbox, PoolRef};
use crate::create::CreateConfig;
use crate::init::SandboxInitializer;

/// How [`acquire`] gets and prepares one sandbox besides what [`ClaimOptions`] writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcquireOptions {
    /// Create a new sandbox when the pool has none to claim (`createOnNoStock`), with these
    /// settings (its `ready_timeout` is the claim's `waitReadyTimeout`); `None`: never.
    pub create_on_no_stock: Option<CreateConfig>,
    /// Keep a sandbox whose claim failed after it was claimed (`reserveFailedSandbox`),
    /// labelled `agents.kruise.io/reserved-failed-sandbox=true`, instead of deleting it.
    pub reserve_failed: bool,
}

/// Why [`acquire`] failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AcquireError {
    /// No sandbox could be claimed or created; nothing was written.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The claimed sandbox's agent runtime refused or did not answer `/init`; the sandbox was
    /// deleted or reserved.
    #[error("sandbox {sandbox}: {reason}")]
    Init {
        /// The sandbox's name.
        sandbox: String,
        /// What failed.
        reason: String,
    },
}

impl<S: Store> ClaimEngine<S> {
    /// A claimed sandbox of `pool` for `owner`: a pool member, else (when `no_stock` gives
    /// the settings and the options of a new one) a new sandbox; the flag says whether it is
    /// new. See the [module documentation](self).
    ///
    /// # Errors
    ///
    /// [`ClaimEngine::claim`]'s errors, and [`ClaimEngine::create_new`]'s after an empty pool.
    pub async fn claim_or_create(
        &self,
        pool: &PoolRef,
        owner: &str,
        options: &ClaimOptions,
        no_stock: Option<(&CreateConfig, &ClaimOptions)>,
    ) -> Result<(ClaimedSandbox, bool), ClaimError> {
        match self.claim(pool, owner, options).await {
            Err(ClaimError::PoolExhausted { .. }) if let Some((config, fresh)) = no_stock => {
                Ok((self.create_new(pool, owner, fresh, config).await?, true))
            }
            other => other.map(|claimed| (claimed, false)),
        }
    }

    /// Deletes the claimed `sandbox` whose claim failed, or, with `reserve`, keeps it for
    /// debugging with label `agents.kruise.io/reserved-failed-sandbox=true` (a claim counts it
    /// no more, and the pool never takes it back).
    ///
    /// # Errors
    ///
    /// [`ClaimError::Store`] when the write fails for another reason than the sandbox being
    /// gone already.
    pub async fn discard_failed(&self, sandbox: &Sandbox, reserve: bool) -> Result<(), ClaimError> {
        let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
        let name = sandbox.metadata.name.clone().unwrap_or_default();
        if !reserve {
            let preconditions =
                Preconditions { uid: sandbox.metadata.uid.clone(), resource_version: None };
            return match self.store.delete::<Sandbox>(&namespace, &name, &preconditions).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {
                    self.index().forget_sandbox(sandbox);
                    Ok(())
                }
                Err(error) => Err(error.into()),
            };
        }
        // The label goes on the newest version: the sandbox controller writes its status
        // meanwhile, so a conflict reads again and retries.
        let mut current = sandbox.clone();
        for _ in 0..8 {
            current
                .metadata
                .labels
                .get_or_insert_default()
                .insert(labels::RESERVED_FAILED_SANDBOX.into(), labels::TRUE.into());
            match self.store.update(&namespace, &current).await {
                Ok(written) => {
                    info!(sandbox = %name, "failed sandbox reserved for debugging");
                    self.index().apply_sandbox(Arc::new(written));
                    return Ok(());
                }
                Err(StoreError::Conflict { .. }) => {
                    current = self.store.get::<Sandbox>(&namespace, &name).await?;
                }
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(error) => return Err(error.into()),
            }
        }
        Err(ClaimError::TooManyConflicts { pool: PoolRef::new(namespace, name), attempts: 8 })
    }
}

/// Claims one sandbox of `pool` for `owner` and initialises its agent runtime; see the
/// [module documentation](self).
///
/// # Errors
///
/// [`AcquireError::Claim`] when nothing was claimed, [`AcquireError::Init`] when the claimed
/// sandbox's `/init` failed (it was then discarded).
pub async fn acquire<S: Store>(
    engine: &ClaimEngine<S>,
    initializer: &dyn SandboxInitializer,
    pool: &PoolRef,
    owner: &str,
    options: &ClaimOptions,
    how: &AcquireOptions,
) -> Result<ClaimedSandbox, AcquireError> {
    let create = how
        .create_on_no_stock
        .as_ref()
        .map(|config| CreateConfig { reserve_failed: how.reserve_failed, ..config.clone() });
    let no_stock = create.as_ref().map(|config| (config, options));
    let (mut claimed, new) = engine.claim_or_create(pool, owner, options, no_stock).await?;
    // A new sandbox was made with the update and awaited running; a pool member's is waited for.
    if let Some(update) = options.inplace_update.as_ref().filter(|_| !new) {
        let sandbox = Arc::clone(&claimed.sandbox);
        match engine.await_inplace_update(pool, claimed, update.ready_timeout).await {
            Ok(updated) => claimed = updated,
            Err(error) => {
                let name = sandbox.metadata.name.clone().unwrap_or_default();
                warn!(%pool, sandbox = %name, %error, "the in-place update did not complete");
                if let Err(discard) = engine.discard_failed(&sandbox, how.reserve_failed).await {
                    warn!(sandbox = %name, error = %discard, "cannot discard the sandbox");
                }
                return Err(error.into());
            }
        }
    }
    if let Some(token) = &options.access_token
        && let Err(error) = initializer.init(&claimed.sandbox, &options.env_vars, token).await
    {
        let sandbox = claimed.sandbox.metadata.name.clone().unwrap_or_default();
        warn!(%pool, %sandbox, %error, reserve = how.reserve_failed, "init failed after the claim");
        if let Err(discard) = engine.discard_failed(&claimed.sandbox, how.reserve_failed).await {
            warn!(%sandbox, error = %discard, "cannot discard the sandbox whose init failed");
        }
        return Err(AcquireError::Init { sandbox, reason: error.to_string() });
    }
    Ok(claimed)
}
