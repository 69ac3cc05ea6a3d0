//! Egress policies of `oka serve`'s sandboxes, enforced by the local runtime: the manager's
//! [`EgressApplier`] over [`Runtime::set_egress`], available while the feature board says
//! outbound networking is on (nftables). The policy applied is what the TrafficPolicy
//! controller's planner gives the sandbox from every TrafficPolicy of its namespace (the one
//! the manager just wrote included) and every GlobalTrafficPolicy, recorded where the controller looks, so its reconcile
//! after a create is a no-op.

use std::sync::Arc;

use futures::future::BoxFuture;
use oka_api::{Sandbox, TrafficPolicy};
use oka_cache::SharedInformer;
use oka_controller::trafficpolicy::{AppliedEgress, StoredGlobalPolicy, desired_egress, enforce};
use oka_manager::egress::EgressApplier;
use oka_runtime_api::features::Feature;
use oka_runtime_api::{EgressAction, EgressPolicy, Runtime};

use crate::features::FeatureBoard;

/// The manager's egress applier of `oka serve`.
pub struct RuntimeEgress {
    /// The runtime the sandboxes run on.
    pub runtime: Arc<dyn Runtime>,
    /// Whether outbound networking is on now.
    pub features: Arc<FeatureBoard>,
    /// Every TrafficPolicy.
    pub policies: SharedInformer<TrafficPolicy>,
    /// Every GlobalTrafficPolicy.
    pub globals: SharedInformer<StoredGlobalPolicy>,
    /// What each sandbox was last given (shared with the TrafficPolicy controller).
    pub applied: Arc<AppliedEgress>,
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
        policy: &'a TrafficPolicy,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.policies.start();
            self.globals.start();
            let (policies, globals) = (self.policies.cache(), self.globals.cache());
            let desired = desired_egress(sandbox, &policies, &globals, Some(policy))
                .unwrap_or_else(EgressPolicy::allow_all);
            let id = oka_api::runtime_id::runtime_id(sandbox).map_err(|e| e.to_string())?;
            let id = oka_runtime_api::SandboxId::new(id).map_err(|e| e.to_string())?;
            if !desired.rules.iter().any(|r| r.action == EgressAction::Allow) {
                // Nothing to let out: true of a loopback-only sandbox already.
                return enforce(self.runtime.as_ref(), &self.applied, sandbox, &desired)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string());
            }
            self.runtime.set_egress(&id, &desired).await.map_err(|e| e.to_string())?;
            self.applied.record(id.as_str(), &desired);
            Ok(())
        })
    }
}
