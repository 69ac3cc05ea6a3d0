//! The SandboxClaim controller's [`SandboxClaimer`] over the manager's claim engine: each claim
//! is `oka_manager::acquire` (one compare-and-swap write of a pool member, or a new sandbox on
//! no stock, then the agent runtime's `/init`), the same engine, index and initializer the E2B
//! API uses, so there is one claim path and two callers of it.

use std::sync::Arc;

use futures::future::BoxFuture;
use oka_controller::sandboxclaim::{ClaimFailure, ClaimRequest, SandboxClaimer};
use oka_manager::claim::{ClaimEngine, ClaimError, ClaimOptions, InplaceUpdate, PoolRef};
use oka_manager::{AcquireError, AcquireOptions, CreateConfig, SandboxInitializer};
use oka_store::Store;

/// Claims for SandboxClaims through `engine`, initialising with `initializer`.
pub struct EngineClaimer<S> {
    /// The E2B API's claim engine.
    pub engine: Arc<ClaimEngine<S>>,
    /// The E2B API's initializer (envd's `/init`).
    pub initializer: Arc<dyn SandboxInitializer>,
    /// The manager's create-on-no-stock settings: when they disable it, a claim's
    /// `createOnNoStock` finds no stock instead.
    pub create: CreateConfig,
}

impl<S: Store> EngineClaimer<S> {
    /// What the engine writes for `request` (pure but for the fresh access token).
    fn options(request: &ClaimRequest) -> ClaimOptions {
        ClaimOptions {
            shutdown_time: request.shutdown_time,
            labels: request.labels.clone(),
            annotations: request.annotations.clone(),
            env_vars: request.env_vars.clone(),
            access_token: request.init_runtime.then(|| uuid::Uuid::new_v4().to_string()),
            claim_name: Some(request.claim_name.clone()),
            pod_labels: request.labels.clone(),
            inplace_update: request.inplace_update.as_ref().map(|update| InplaceUpdate {
                image: update.image.clone(),
                cpu_request: update.cpu_request.clone(),
                cpu_limit: update.cpu_limit.clone(),
                ready_timeout: request.wait_ready_timeout,
            }),
            ..ClaimOptions::default()
        }
    }
}

impl<S: Store> SandboxClaimer for EngineClaimer<S> {
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<String, ClaimFailure>> {
        Box::pin(async move {
            let pool = PoolRef::new(request.namespace.clone(), request.pool.clone());
            let options = Self::options(request);
            let how = AcquireOptions {
                create_on_no_stock: (request.create_on_no_stock && self.create.enabled).then(
                    || CreateConfig {
                        ready_timeout: request.wait_ready_timeout,
                        ..self.create.clone()
                    },
                ),
                reserve_failed: request.reserve_failed_sandbox,
            };
            let result = oka_manager::acquire(
                &self.engine,
                self.initializer.as_ref(),
                &pool,
                &request.owner,
                &options,
                &how,
            )
            .await;
            match result {
                Ok(claimed) => Ok(claimed.sandbox.metadata.name.clone().unwrap_or_default()),
                Err(AcquireError::Claim(
                    error @ (ClaimError::PoolExhausted { .. }
                    | ClaimError::RateLimited { .. }
                    | ClaimError::TooManyConflicts { .. }),
                )) => Err(ClaimFailure::NoStock(error.to_string())),
                Err(error) => Err(ClaimFailure::Failed(error.to_string())),
            }
        })
    }

    fn owned(&self, namespace: &str, owner: &str) -> Vec<Arc<oka_api::Sandbox>> {
        self.engine.index().owned_by(namespace, owner)
    }
}
