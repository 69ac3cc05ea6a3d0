//! Create-on-no-stock: when a pool has nothing to claim, create a new sandbox from its
//! SandboxSet, already claimed, and wait until it runs (the reference's `lockType=create`).
//!
//! # Expected flow
//!
//! [`ClaimEngine::create_new`]`(pool, owner, options)`:
//!
//! 1. **Admit**: take a token from the [`TokenBucket`] (`--max-create-qps`,
//!    [`crate::ClaimConfig::max_create_qps`], burst = rate); none
//!    ⇒ [`ClaimError::RateLimited`] at once (the caller answers 503 with `Retry-After`).
//! 2. **Build** (pure, [`new_claimed_sandbox`]): the SandboxSet's template (and the referenced
//!    SandboxTemplate's fields where the set has none), the pool labels (`sandbox-pool`,
//!    `sandbox-template`, `template-hash` = the set's `updateRevision`), annotation
//!    `agents.kruise.io/sandbox-priority=100`, then the same claim metadata a pool claim writes
//!    ([`claim_object`]) — and no ownerReference, so the pool never counts it.
//! 3. **Create** it in the store, then **wait**, driven by the index's watch, until the sandbox
//!    controller reports it Running and Ready, at most [`CreateConfig::ready_timeout`].
//! 4. It failed (phase Failed/Succeeded, deleted) or did not run in time ⇒ it is deleted (or,
//!    with [`CreateConfig::reserve_failed`], kept and labelled
//!    `agents.kruise.io/reserved-failed-sandbox`) and [`ClaimError::CreateFailed`] returned.
//!
//! # Caveats
//!
//! - The reference waits without bound unless the request sets `wait-ready-timeout-seconds`;
//!   here the wait is always bounded, so a create never hangs.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use oka_api::{
    Checkpoint, Sandbox, SandboxPhase, SandboxSet, SandboxSpec, SandboxTemplate, annotations,
    labels,
};
use oka_store::Store;
use tracing::{info, warn};

use crate::claim::{ClaimEngine, ClaimError, ClaimOptions, ClaimedSandbox, PoolRef, claim_object};
use crate::index::sandbox_id;

/// The priority annotation value the manager writes on sandboxes it creates for a caller.
pub const CREATED_PRIORITY: &str = "100";
/// The longest `generateName` prefix (the reference's 58).
const MAX_GENERATE_NAME: usize = 58;

/// Settings of create-on-no-stock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateConfig {
    /// Whether an empty pool creates a new sandbox (`create-on-no-stock`). Default true. The
    /// rate is [`crate::ClaimConfig::max_create_qps`].
    pub enabled: bool,
    /// How long a create waits for the new sandbox to run. Default 50 s: with the `/init` and
    /// the route after it, the answer comes within the SDKs' 60 s request timeout.
    pub ready_timeout: Duration,
    /// Keep a new sandbox that failed or did not run in time, labelled
    /// `agents.kruise.io/reserved-failed-sandbox=true` for debugging, instead of deleting it
    /// (a SandboxClaim's `reserveFailedSandbox`). Default false.
    pub reserve_failed: bool,
}

impl Default for CreateConfig {
    fn default() -> Self {
        Self { enabled: true, ready_timeout: Duration::from_secs(50), reserve_failed: false }
    }
}

/// A token bucket: `rate` tokens per second, at most `rate` (at least 1) stored.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    /// (tokens, when they were counted).
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64) -> Self {
        let rate = rate.max(0.0);
        let burst = rate.max(1.0);
        Self { rate, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Takes one token if there is one (never waits).
    pub fn try_take(&self) -> bool {
        self.try_take_at(Instant::now())
    }

    fn try_take_at(&self, now: Instant) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * self.rate).min(self.burst);
        state.1 = now;
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A new sandbox of `set` (pure), claimed for `owner`: see step 2 of the
/// [module documentation](self). `referenced` is the SandboxTemplate `spec.templateRef` names.
pub fn new_claimed_sandbox(
    set: &SandboxSet,
    referenced: Option<&SandboxTemplate>,
    owner: &str,
    options: &ClaimOptions,
    id: &str,
    lock: &str,
    now: Timestamp,
) -> Sandbox {
    let name = set.metadata.name.clone().unwrap_or_default();
    let spec = &set.spec;
    let fallback = referenced.map(|t| &t.spec);
    let template = spec.template.clone().or_else(|| fallback.and_then(|t| t.template.clone()));
    let keep = |key: &String| {
        !key.starts_with("agents.kruise.io/")
            || annotations::PRESERVED_ON_CREATION.contains(&key.as_str())
    };
    let meta = template.as_ref().and_then(|t| t.metadata.as_ref());
    let copy = |map: Option<&std::collections::BTreeMap<String, String>>| {
        map.into_iter()
            .flatten()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let mut sandbox_labels = copy(meta.and_then(|m| m.labels.as_ref()));
    let mut sandbox_annotations = copy(meta.and_then(|m| m.annotations.as_ref()));
    let template_name = spec.template_ref.as_ref().map_or(name.clone(), |r| r.name.clone());
    sandbox_labels.insert(labels::SANDBOX_POOL.into(), name.clone());
    sandbox_labels.insert(labels::SANDBOX_TEMPLATE.into(), template_name);
    if let Some(revision) = set.status.as_ref().and_then(|s| s.update_revision.clone()) {
        sandbox_labels.insert(labels::TEMPLATE_HASH.into(), revision);
    }
    sandbox_annotations.insert(annotations::SANDBOX_PRIORITY.into(), CREATED_PRIORITY.into());
    let mut prefix: String = name.chars().take(MAX_GENERATE_NAME - 1).collect();
    prefix.push('-');
    let sandbox = Sandbox {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            generate_name: Some(prefix),
            namespace: set.metadata.namespace.clone(),
            labels: Some(sandbox_labels),
            annotations: Some(sandbox_annotations),
            ..Default::default()
        },
        spec: SandboxSpec {
            pause_strategy: spec
                .pause_strategy
                .clone()
                .or_else(|| fallback.and_then(|t| t.pause_strategy.clone())),
            persistent_contents: spec
                .persistent_contents
                .clone()
                .or_else(|| fallback.and_then(|t| t.persistent_contents.clone())),
            runtimes: spec.runtimes.clone().or_else(|| fallback.and_then(|t| t.runtimes.clone())),
            template_ref: spec.template_ref.clone(),
            // An in-place update is written on the sandbox's own template (see
            // `InplaceUpdate`), so it gets the referenced one's.
            template: if options.inplace_update.is_some() {
                template
            } else {
                spec.template.clone()
            },
            volume_claim_templates: spec.volume_claim_templates.clone(),
            probes: spec.probes.clone().or_else(|| fallback.and_then(|t| t.probes.clone())),
            auto_pause_policy: spec
                .auto_pause_policy
                .clone()
                .or_else(|| fallback.and_then(|t| t.auto_pause_policy.clone())),
            ..SandboxSpec::default()
        },
        status: None,
    };
    claim_object(&sandbox, owner, options, id, lock, now)
}

/// Why waiting for a new (or updated) sandbox failed: it is being deleted or it ended.
pub(crate) fn failed(sandbox: &Sandbox) -> Option<String> {
    if sandbox.metadata.deletion_timestamp.is_some() {
        return Some("it is being deleted".into());
    }
    match sandbox.phase() {
        Some(phase @ (SandboxPhase::Failed | SandboxPhase::Succeeded)) => Some(format!(
            "it ended ({phase}): {}",
            sandbox.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default()
        )),
        _ => None,
    }
}

impl<S: Store> ClaimEngine<S> {
    /// Creates a new sandbox of `pool` for `owner` and waits until it runs; see the
    /// [module documentation](self).
    ///
    /// # Errors
    ///
    /// [`ClaimError::RateLimited`] without a token, [`ClaimError::CreateFailed`] when the
    /// sandbox failed or did not run in time (it is deleted), [`ClaimError::Store`].
    pub async fn create_new(
        &self,
        pool: &PoolRef,
        owner: &str,
        options: &ClaimOptions,
        config: &CreateConfig,
    ) -> Result<ClaimedSandbox, ClaimError> {
        if !self.create_limiter.try_take() {
            return Err(ClaimError::RateLimited { pool: pool.clone() });
        }
        let set = self
            .index()
            .sandbox_set(Some(&pool.namespace), &pool.name)
            .ok_or_else(|| ClaimError::PoolExhausted { pool: pool.clone() })?;
        let referenced = match &set.spec.template_ref {
            Some(reference) => {
                match self.store.get::<SandboxTemplate>(&pool.namespace, &reference.name).await {
                    Ok(template) => Some(template),
                    Err(error) if error.is_not_found() => None,
                    Err(error) => return Err(error.into()),
                }
            }
            None => None,
        };
        let id = self.ids.next_id();
        let lock = uuid::Uuid::new_v4().to_string();
        let now = Timestamp::now();
        let mut sandbox =
            new_claimed_sandbox(&set, referenced.as_ref(), owner, options, &id, &lock, now);
        oka_telemetry::context::inject(&mut sandbox.metadata);
        let charged = self.admit(owner, &lock, &sandbox, options).await?;
        let created =
            Arc::new(self.create_admitted(&pool.namespace, &sandbox, owner, &lock, charged).await?);
        self.index().apply_sandbox(Arc::clone(&created));
        let name = created.metadata.name.as_deref().unwrap_or_default();
        info!(%pool, sandbox = %id, %name, "no stock: created a new sandbox");
        self.await_running(pool, created, id, lock, config).await
    }

    /// Creates a new sandbox from the snapshot `checkpoint` (its SandboxTemplate of the same
    /// name, annotated `agents.kruise.io/restore-from: <checkpointId>`) for `owner`, and waits
    /// until it runs (the reference's clone). `options.access_token` should be the snapshot's
    /// (the restored agent runtime keeps it; [`snapshot_access_token`]).
    ///
    /// # Errors
    ///
    /// [`ClaimError::RateLimited`] without a token, [`ClaimError::CreateFailed`] when the
    /// snapshot has no template or the sandbox failed or did not run in time (it is deleted),
    /// [`ClaimError::Store`].
    pub async fn create_from_snapshot(
        &self,
        checkpoint: &Checkpoint,
        owner: &str,
        options: &ClaimOptions,
        config: &CreateConfig,
    ) -> Result<ClaimedSandbox, ClaimError> {
        let namespace = checkpoint.metadata.namespace.clone().unwrap_or_default();
        let name = checkpoint.metadata.name.clone().unwrap_or_default();
        let pool = PoolRef::new(namespace.clone(), name.clone());
        if !self.create_limiter.try_take() {
            return Err(ClaimError::RateLimited { pool });
        }
        let template = match self.store.get::<SandboxTemplate>(&namespace, &name).await {
            Ok(template) => template,
            Err(error) if error.is_not_found() => {
                let reason = format!("the snapshot's SandboxTemplate {name} is gone");
                return Err(ClaimError::CreateFailed { pool, reason });
            }
            Err(error) => return Err(error.into()),
        };
        let id = self.ids.next_id();
        let lock = uuid::Uuid::new_v4().to_string();
        let mut sandbox =
            new_cloned_sandbox(checkpoint, &template, owner, options, &id, &lock, Timestamp::now());
        oka_telemetry::context::inject(&mut sandbox.metadata);
        let charged = self.admit(owner, &lock, &sandbox, options).await?;
        let created =
            Arc::new(self.create_admitted(&namespace, &sandbox, owner, &lock, charged).await?);
        self.index().apply_sandbox(Arc::clone(&created));
        info!(snapshot = %name, sandbox = %id, "creating a sandbox from a snapshot");
        self.await_running(&pool, created, id, lock, config).await
    }

    /// Creates the admitted `sandbox`; when the store provably wrote nothing (refused as
    /// invalid, conflicting or existing), the quota charge is given back; an ambiguous failure
    /// keeps it (anti-drift releases it after its grace period if no sandbox appears).
    async fn create_admitted(
        &self,
        namespace: &str,
        sandbox: &Sandbox,
        owner: &str,
        lock: &str,
        charged: bool,
    ) -> Result<Sandbox, ClaimError> {
        match self.store.create(namespace, sandbox).await {
            Ok(created) => Ok(created),
            Err(error) => {
                if matches!(
                    error,
                    oka_store::StoreError::Invalid(_)
                        | oka_store::StoreError::AlreadyExists { .. }
                        | oka_store::StoreError::Conflict { .. }
                        | oka_store::StoreError::NotFound { .. }
                ) {
                    self.unadmit(owner, lock, charged).await;
                }
                Err(error.into())
            }
        }
    }

    /// Waits until the just created sandbox `created` (ID `id`) runs; deletes it when it fails
    /// or does not run within [`CreateConfig::ready_timeout`].
    async fn await_running(
        &self,
        pool: &PoolRef,
        created: Arc<Sandbox>,
        id: String,
        lock: String,
        config: &CreateConfig,
    ) -> Result<ClaimedSandbox, ClaimError> {
        let name = created.metadata.name.clone().unwrap_or_default();
        let namespace = created.metadata.namespace.clone().unwrap_or_default();
        let key = crate::index::ObjectKey::new(namespace.as_str(), name.as_str());
        let outcome = self
            .index()
            .wait_for(config.ready_timeout, |index| {
                let current = index.by_id(&id)?;
                if let Some(why) = failed(&current) {
                    return Some(Err(why));
                }
                (current.phase() == Some(&SandboxPhase::Running) && current.is_ready())
                    .then_some(Ok(current))
            })
            .await
            .unwrap_or_else(|| {
                Err(format!("it did not run within {}s", config.ready_timeout.as_secs()))
            });
        match outcome {
            Ok(running) => {
                let sandbox_id = sandbox_id(&running).unwrap_or(id);
                Ok(ClaimedSandbox { sandbox: running, sandbox_id, lock, attempts: 1 })
            }
            Err(why) => {
                warn!(%pool, sandbox = %key, %why, "new sandbox failed");
                if let Err(error) = self.discard_failed(&created, config.reserve_failed).await {
                    warn!(sandbox = %key, %error, "cannot discard the failed sandbox");
                }
                Err(ClaimError::CreateFailed { pool: pool.clone(), reason: why })
            }
        }
    }
}

/// The agent runtime's access token a snapshot was taken with (from its
/// `agents.kruise.io/init-runtime-request` annotation): a sandbox created from the snapshot
/// runs the restored agent runtime, which accepts only that token.
pub fn snapshot_access_token(checkpoint: &Checkpoint) -> Option<String> {
    let request =
        checkpoint.metadata.annotations.as_ref()?.get(annotations::INIT_RUNTIME_REQUEST)?;
    let value: serde_json::Value = serde_json::from_str(request).ok()?;
    value.get("accessToken")?.as_str().filter(|t| !t.is_empty()).map(str::to_owned)
}

/// A new sandbox (pure) made from the snapshot `checkpoint` and its SandboxTemplate `template`,
/// claimed for `owner`: named `<checkpointId>-…`, label `agents.kruise.io/sandbox-template`,
/// annotation `agents.kruise.io/restore-from: <checkpointId>` (the sandbox controller creates
/// it from the runtime's snapshot), then the claim metadata of [`claim_object`].
pub fn new_cloned_sandbox(
    checkpoint: &Checkpoint,
    template: &SandboxTemplate,
    owner: &str,
    options: &ClaimOptions,
    id: &str,
    lock: &str,
    now: Timestamp,
) -> Sandbox {
    let checkpoint_id =
        checkpoint.status.as_ref().and_then(|s| s.checkpoint_id.clone()).unwrap_or_default();
    let template_name = template.metadata.name.clone().unwrap_or_default();
    let spec = &template.spec;
    let mut prefix: String = checkpoint_id.chars().take(MAX_GENERATE_NAME - 1).collect();
    prefix.push('-');
    let sandbox = Sandbox {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            generate_name: Some(prefix),
            namespace: checkpoint.metadata.namespace.clone(),
            labels: Some([(labels::SANDBOX_TEMPLATE.to_owned(), template_name)].into()),
            annotations: Some(
                [
                    (annotations::RESTORE_FROM.to_owned(), checkpoint_id),
                    (annotations::SANDBOX_PRIORITY.to_owned(), CREATED_PRIORITY.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: SandboxSpec {
            template: spec.template.clone(),
            volume_claim_templates: spec.volume_claim_templates.clone(),
            persistent_contents: spec.persistent_contents.clone(),
            runtimes: spec.runtimes.clone(),
            pause_strategy: spec.pause_strategy.clone(),
            probes: spec.probes.clone(),
            auto_pause_policy: spec.auto_pause_policy.clone(),
            ..SandboxSpec::default()
        },
        status: None,
    };
    claim_object(&sandbox, owner, options, id, lock, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        let bucket = TokenBucket::new(2.0);
        let start = Instant::now();
        assert!(bucket.try_take_at(start));
        assert!(bucket.try_take_at(start));
        assert!(!bucket.try_take_at(start));
        assert!(bucket.try_take_at(start + Duration::from_millis(500)));
        assert!(!bucket.try_take_at(start + Duration::from_millis(600)));
        let off = TokenBucket::new(0.0);
        assert!(off.try_take_at(start), "a zero rate still holds one token");
        assert!(!off.try_take_at(start + Duration::from_secs(100)));
    }

    #[test]
    fn the_new_sandbox_is_claimed_and_not_a_pool_member() {
        let mut set = SandboxSet::new("base", oka_api::SandboxSetSpec::default());
        set.metadata.namespace = Some("default".into());
        set.status = Some(oka_api::SandboxSetStatus {
            update_revision: Some("rev-1".into()),
            ..Default::default()
        });
        let now = Timestamp::from_second(1_767_225_600).unwrap();
        let sandbox =
            new_claimed_sandbox(&set, None, "me", &ClaimOptions::default(), "abc", "l", now);
        assert!(sandbox.metadata.owner_references.is_none());
        assert_eq!(sandbox.metadata.generate_name.as_deref(), Some("base-"));
        let l = sandbox.metadata.labels.as_ref().unwrap();
        assert_eq!(l[labels::SANDBOX_POOL], "base");
        assert_eq!(l[labels::SANDBOX_CLAIMED], "true");
        assert_eq!(l[labels::SANDBOX_ID], "abc");
        assert_eq!(l[labels::TEMPLATE_HASH], "rev-1");
        let a = sandbox.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[annotations::SANDBOX_PRIORITY], "100");
        assert_eq!(a[annotations::OWNER], "me");
        assert_eq!(a[annotations::LOCK], "l");
    }
}
