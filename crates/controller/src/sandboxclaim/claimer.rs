//! The seam through which the SandboxClaim controller claims sandboxes: [`SandboxClaimer`].
//!
//! The controller crate owns the trait and the manager's claim engine sits behind it (`oka
//! serve` adapts `oka_manager::acquire`), so the crate map stays as it is: the controllers
//! know no E2B and no manager, the manager knows no controller, and there is one claim path in
//! the code base, the engine's, which the E2B API uses too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oka_api::Sandbox;

/// One sandbox to claim for a SandboxClaim: everything the claim's spec asks of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// The namespace of the claim and its SandboxSet.
    pub namespace: String,
    /// The SandboxSet to claim from (`spec.templateName`).
    pub pool: String,
    /// The claim's uid, written as the sandbox's `agents.kruise.io/owner`: how a claim finds
    /// its sandboxes again.
    pub owner: String,
    /// The claim's name (label `agents.kruise.io/claim-name`).
    pub claim_name: String,
    /// `spec.labels`: on the sandbox and its pod template.
    pub labels: BTreeMap<String, String>,
    /// `spec.annotations`: on the sandbox.
    pub annotations: BTreeMap<String, String>,
    /// `spec.envVars`, sent to the agent runtime's `/init`.
    pub env_vars: BTreeMap<String, String>,
    /// Whether to initialise the agent runtime (`!spec.skipInitRuntime`).
    pub init_runtime: bool,
    /// `spec.shutdownTime`, set on the sandbox.
    pub shutdown_time: Option<Timestamp>,
    /// `spec.createOnNoStock`: an empty pool makes a new sandbox.
    pub create_on_no_stock: bool,
    /// `spec.waitReadyTimeout`: how long a new sandbox may take to run.
    pub wait_ready_timeout: Duration,
    /// `spec.reserveFailedSandbox`: a sandbox whose claim failed after it was taken is kept
    /// (label `agents.kruise.io/reserved-failed-sandbox`) instead of deleted.
    pub reserve_failed_sandbox: bool,
    /// `spec.inplaceUpdate`: what the claim changes in each sandbox it takes, awaited (up to
    /// `wait_ready_timeout`) before `/init`.
    pub inplace_update: Option<InplaceUpdateRequest>,
}

/// A SandboxClaim's `inplaceUpdate`, checked ([`super::unsupported_field`] refuses memory and
/// other resources): the first container's new image and CPU request and limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InplaceUpdateRequest {
    /// `image`.
    pub image: Option<String>,
    /// `resources.requests.cpu`.
    pub cpu_request: Option<Quantity>,
    /// `resources.limits.cpu`.
    pub cpu_limit: Option<Quantity>,
}

/// Why one claim of a [`ClaimRequest`] failed; the batch goes on, and the claim retries later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimFailure {
    /// The pool had nothing to claim (and no new sandbox could be made).
    #[error("no stock: {0}")]
    NoStock(String),
    /// A sandbox was taken but could not be made ready, or the store failed.
    #[error("{0}")]
    Failed(String),
}

/// Claims sandboxes for SandboxClaims; implemented over the manager's claim engine.
pub trait SandboxClaimer: Send + Sync + 'static {
    /// Claims one sandbox for `request`: one compare-and-swap write of a pool member (or a new
    /// sandbox when the request allows it), then the agent runtime's `/init`. Returns the
    /// sandbox's name.
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<String, ClaimFailure>>;

    /// The sandboxes of `namespace` whose `agents.kruise.io/owner` is `owner`, as fresh as the
    /// claims this claimer made (its own writes included).
    fn owned(&self, namespace: &str, owner: &str) -> Vec<Arc<Sandbox>>;
}

/// A claimer that claims nothing (every claim finds no stock); for controllers run without a
/// manager, such as tests of the lifecycle alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoClaimer;

impl SandboxClaimer for NoClaimer {
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<String, ClaimFailure>> {
        Box::pin(async move { Err(ClaimFailure::NoStock(format!("pool {}", request.pool))) })
    }

    fn owned(&self, _namespace: &str, _owner: &str) -> Vec<Arc<Sandbox>> {
        Vec::new()
    }
}
