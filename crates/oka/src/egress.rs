//! Egress policies of `oka serve`'s sandboxes, enforced by the local runtime: the manager's
//! [`EgressApplier`] over [`Runtime::set_egress`], available while the feature board says
//! outbound networking is on (nftables).

use std::sync::Arc;

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_manager::egress::EgressApplier;
use oka_runtime_api::features::Feature;
use oka_runtime_api::{EgressAction, EgressPolicy, Runtime, RuntimeError, SandboxId};

use crate::features::FeatureBoard;

/// The manager's egress applier of `oka serve`.
pub struct RuntimeEgress {
    /// The runtime the sandboxes run on.
    pub runtime: Arc<dyn Runtime>,
    /// Whether outbound networking is on now.
    pub features: Arc<FeatureBoard>,
}

impl EgressApplier for RuntimeEgress {
    fn available(&self) -> Result<(), String> {
        self.features.current().require(Feature::OutboundNetwork).map_err(|off| off.to_string())
    }

    /// A loopback-only sandbox (its template is not outbound) reaches nothing: a policy that
    /// allows nothing in particular (no allow rule) is already true of it; one that names
    /// destinations to allow cannot be, and fails naming the template annotation.
    fn apply<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        policy: &'a EgressPolicy,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let id = oka_api::runtime_id::runtime_id(sandbox).map_err(|e| e.to_string())?;
            let id = SandboxId::new(id).map_err(|e| e.to_string())?;
            match self.runtime.set_egress(&id, policy).await {
                Ok(()) => Ok(()),
                Err(RuntimeError::Unsupported { .. })
                    if !policy.rules.iter().any(|r| r.action == EgressAction::Allow) =>
                {
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        })
    }
}
