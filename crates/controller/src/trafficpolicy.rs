//! The TrafficPolicy controllers: the egress rules of TrafficPolicies and GlobalTrafficPolicies
//! enforced on the sandboxes they select, through the runtime's egress policy
//! ([`Runtime::set_egress`]), and each policy's `Accepted` condition.
//!
//! # Expected flow
//!
//! - **Egress** (keyed by Sandbox, in the node's scope, so each node agent enforces its own
//!   sandboxes): a change of a Sandbox, of any TrafficPolicy of its namespace, or of any
//!   GlobalTrafficPolicy (which may select a sandbox of any namespace: every sandbox is looked
//!   at again, and those whose result did not change cost no runtime call) reconciles it. The
//!   pure [`plan::effective_egress`] gives the sandbox's policy from every TrafficPolicy of its
//!   namespace and every GlobalTrafficPolicy, merged in one priority order (higher first; at
//!   equal priority the TrafficPolicy first: the reference leaves ties unsaid, and the
//!   namespace's own word is the more specific one); when the cached
//!   policies give another policy than was last made this sandbox's ([`AppliedEgress`], which
//!   the manager's direct application shares, so the reconcile after a create is a no-op), the
//!   policies are read again from the store and their result applied with `set_egress` (a
//!   cache a moment behind the manager's write never undoes its policy). A sandbox that no policy selects keeps its network unless this
//!   process made it a policy before, which then goes (allow all). Only running or paused
//!   sandboxes are touched; a loopback-only sandbox (not outbound) reaches nothing anyway, so
//!   a policy for it is recorded as done.
//! - **Status** (keyed by TrafficPolicy, and by GlobalTrafficPolicy in a controller of its
//!   own): `Accepted` True (`Accepted`) or False with the reason [`plan::acceptance`] names,
//!   written only when it changes.
//!
//! # Guarantees and limits
//!
//! - Restarts converge: the first reconcile of every sandbox after a start applies the policy
//!   its policies give. A policy deleted while no controller ran stays in force on the sandboxes
//!   it selected until their next policy change (nothing records who made the runtime's
//!   policy).
//! - GlobalTrafficPolicies are read as the store keeps cluster-scoped kinds
//!   ([`oka_store::Clustered`]), so the same code lists them from `oka serve`'s store and from
//!   the API server.

pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use oka_api::trafficpolicy::{CONDITION_ACCEPTED, TrafficPolicySpec, TrafficPolicyStatus};
use oka_api::{GlobalTrafficPolicy, Sandbox, SandboxPhase, TrafficPolicy};
use oka_cache::{Action, Cache, Controller, Informers, ObjectKey};
use oka_runtime_api::{EgressPolicy, Runtime, RuntimeError, SandboxId};
use oka_store::{CLUSTER_NAMESPACE, Clustered, Selector, Store, StoreError};
use tracing::{debug, info, warn};

use crate::Config;
use crate::plan::Clock;
use plan::PolicyView;

/// A GlobalTrafficPolicy as the store keeps it (cluster-scoped: [`oka_store::cluster`]).
pub type StoredGlobalPolicy = Clustered<GlobalTrafficPolicy>;

/// The egress policy this process last made each sandbox's (by runtime id), shared by the
/// controller and the manager's direct application.
#[derive(Debug, Default)]
pub struct AppliedEgress(Mutex<HashMap<String, EgressPolicy>>);

impl AppliedEgress {
    fn get(&self, id: &str) -> Option<EgressPolicy> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned()
    }

    /// Records `policy` as sandbox `id`'s.
    pub fn record(&self, id: &str, policy: &EgressPolicy) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_owned(), policy.clone());
    }

    fn forget(&self, id: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum TrafficPolicyError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The sandbox has no runtime id yet.
    #[error("{0}")]
    Id(String),
}

/// What the egress reconciles share.
pub struct EgressContext<S> {
    store: S,
    runtime: Arc<dyn Runtime>,
    policies: Cache<TrafficPolicy>,
    globals: Cache<StoredGlobalPolicy>,
    applied: Arc<AppliedEgress>,
}

/// The policy `sandbox` gets from the TrafficPolicies of `policies` (with `replacing` in place
/// of its cached version, when given: a policy just written) and every GlobalTrafficPolicy of
/// `globals`; `None` when none selects it.
pub fn desired_egress(
    sandbox: &Sandbox,
    policies: &Cache<TrafficPolicy>,
    globals: &Cache<StoredGlobalPolicy>,
    replacing: Option<&TrafficPolicy>,
) -> Option<EgressPolicy> {
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let mut listed = policies.list_namespace(namespace);
    if let Some(new) = replacing {
        listed.retain(|p| p.metadata.name != new.metadata.name);
        listed.push(Arc::new(new.clone()));
    }
    let globals = globals.list();
    plan::effective_egress(sandbox, &views(&listed, &globals))
}

/// The planner's views of `policies` and `globals`, in one list.
fn views<'a>(
    policies: &'a [Arc<TrafficPolicy>],
    globals: &'a [Arc<StoredGlobalPolicy>],
) -> Vec<PolicyView<'a>> {
    policies
        .iter()
        .map(|p| PolicyView::namespaced(p))
        .chain(globals.iter().map(|g| PolicyView::global(&g.0)))
        .collect()
}

fn sandbox_id(sandbox: &Sandbox) -> Result<SandboxId, TrafficPolicyError> {
    crate::sandbox::runtime_id(sandbox).map_err(|e| TrafficPolicyError::Id(e.to_string()))
}

/// Makes `policy` sandbox `sandbox`'s egress policy unless it already is, recording it. A
/// loopback-only sandbox counts as done.
///
/// # Errors
///
/// The runtime's error.
pub async fn enforce(
    runtime: &dyn Runtime,
    applied: &AppliedEgress,
    sandbox: &Sandbox,
    policy: &EgressPolicy,
) -> Result<bool, TrafficPolicyError> {
    let id = sandbox_id(sandbox)?;
    if applied.get(id.as_str()).as_ref() == Some(policy) {
        return Ok(false);
    }
    match runtime.set_egress(&id, policy).await {
        Ok(()) | Err(RuntimeError::Unsupported { .. }) => {
            applied.record(id.as_str(), policy);
            Ok(true)
        }
        Err(e) => Err(e.into()),
    }
}

/// Reconciles one sandbox's egress policy. The cache decides whether anything changed; what
/// is applied is read from the store, so a policy the cache has not seen yet (the manager's,
/// written just before it applied it) is never undone.
///
/// # Errors
///
/// [`TrafficPolicyError`] from the store or the runtime.
pub async fn reconcile_egress<S: Store>(
    sandbox: Arc<Sandbox>,
    ctx: Arc<EgressContext<S>>,
) -> Result<Action, TrafficPolicyError> {
    let live = sandbox.metadata.deletion_timestamp.is_none()
        && matches!(sandbox.phase(), Some(SandboxPhase::Running | SandboxPhase::Paused));
    if !live {
        if sandbox.metadata.deletion_timestamp.is_some()
            && let Ok(id) = sandbox_id(&sandbox)
        {
            ctx.applied.forget(id.as_str());
        }
        return Ok(Action::await_change());
    }
    let id = sandbox_id(&sandbox)?;
    let applied = ctx.applied.get(id.as_str());
    let cached = desired_egress(&sandbox, &ctx.policies, &ctx.globals, None);
    if cached == applied || (cached.is_none() && applied.is_none()) {
        return Ok(Action::await_change());
    }
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let listed = ctx.store.list::<TrafficPolicy>(Some(namespace), &Selector::everything()).await?;
    let globals = ctx.store.list::<StoredGlobalPolicy>(None, &Selector::everything()).await?;
    let desired = match plan::effective_egress(&sandbox, &views(&listed.items, &globals.items)) {
        Some(policy) => policy,
        None if applied.is_some() => EgressPolicy::allow_all(),
        None => return Ok(Action::await_change()),
    };
    if enforce(ctx.runtime.as_ref(), &ctx.applied, &sandbox, &desired).await? {
        info!(
            sandbox = sandbox.metadata.name.as_deref().unwrap_or_default(),
            rules = desired.rules.len(),
            "egress policy from traffic policies in force"
        );
    }
    Ok(Action::await_change())
}

/// Backs off on any error (a runtime that failed may succeed later).
pub fn egress_error_policy<S>(
    sandbox: &Sandbox,
    error: &TrafficPolicyError,
    _ctx: &EgressContext<S>,
) -> Action {
    warn!(sandbox = sandbox.metadata.name.as_deref().unwrap_or_default(), %error, "egress policy not applied");
    Action::backoff()
}

/// Runs the egress controller over the Sandboxes of `config`'s scope until `shutdown`.
pub async fn run_egress_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    runtime: Arc<dyn Runtime>,
    applied: Arc<AppliedEgress>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let informers: Informers<S> = informers.into();
    let policies = informers.all::<TrafficPolicy>();
    let globals = informers.all::<StoredGlobalPolicy>();
    let controller = Controller::<Sandbox, S>::shared("traffic-egress", &informers, config.runner);
    let sandboxes = controller.cache();
    let every_sandbox = controller.cache();
    let store = informers.store().clone();
    let ctx = Arc::new(EgressContext {
        store,
        runtime,
        policies: policies.cache(),
        globals: globals.cache(),
        applied,
    });
    controller
        .watches_shared(policies, move |policy: &TrafficPolicy| {
            let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
            sandboxes.list_namespace(namespace).iter().map(|s| ObjectKey::of(s.as_ref())).collect()
        })
        .watches_shared(globals, move |_: &StoredGlobalPolicy| {
            every_sandbox.list().iter().map(|s| ObjectKey::of(s.as_ref())).collect()
        })
        .shutdown_on(shutdown)
        .run(reconcile_egress, egress_error_policy, ctx)
        .await;
}

/// The `Accepted` condition `policy` should carry at `now` (its transition time kept when the
/// status does not change).
pub fn plan_accepted(policy: &TrafficPolicy, now: jiff::Timestamp) -> Option<TrafficPolicyStatus> {
    accepted(&policy.spec, policy.status.as_ref(), policy.metadata.generation, now)
}

/// [`plan_accepted`] of a GlobalTrafficPolicy.
pub fn plan_global_accepted(
    policy: &GlobalTrafficPolicy,
    now: jiff::Timestamp,
) -> Option<TrafficPolicyStatus> {
    accepted(&policy.spec.0, policy.status.as_ref(), policy.metadata.generation, now)
}

/// The `Accepted` condition of a policy of either kind: its spec, status and generation.
fn accepted(
    spec: &TrafficPolicySpec,
    current: Option<&TrafficPolicyStatus>,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Option<TrafficPolicyStatus> {
    let (status, reason, message) = match plan::acceptance(spec) {
        Ok(()) => ("True", "Accepted", "enforced on the sandboxes it selects".to_owned()),
        Err((reason, message)) => ("False", reason, message),
    };
    let current = current.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let old = current.iter().find(|c| c.type_ == CONDITION_ACCEPTED);
    if old.is_some_and(|c| {
        c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == generation
    }) {
        return None;
    }
    let transition = match old {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let mut conditions: Vec<Condition> =
        current.iter().filter(|c| c.type_ != CONDITION_ACCEPTED).cloned().collect();
    conditions.push(Condition {
        type_: CONDITION_ACCEPTED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: transition,
    });
    Some(TrafficPolicyStatus { conditions })
}

/// What the status reconciles share.
pub struct StatusContext<S> {
    store: S,
    clock: Clock,
}

/// Writes a TrafficPolicy's `Accepted` condition when it changes.
///
/// # Errors
///
/// The store's.
pub async fn reconcile_status<S: Store>(
    policy: Arc<TrafficPolicy>,
    ctx: Arc<StatusContext<S>>,
) -> Result<Action, TrafficPolicyError> {
    let Some(status) = plan_accepted(&policy, ctx.clock.now()) else {
        return Ok(Action::await_change());
    };
    let mut updated = policy.as_ref().clone();
    updated.status = Some(status);
    let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
    match ctx.store.update_status(namespace, &updated).await {
        Ok(_) => Ok(Action::await_change()),
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
            debug!("TrafficPolicy changed under its status write; looking again");
            Ok(Action::await_change())
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes a GlobalTrafficPolicy's `Accepted` condition when it changes.
///
/// # Errors
///
/// The store's.
pub async fn reconcile_global_status<S: Store>(
    policy: Arc<StoredGlobalPolicy>,
    ctx: Arc<StatusContext<S>>,
) -> Result<Action, TrafficPolicyError> {
    let Some(status) = plan_global_accepted(&policy.0, ctx.clock.now()) else {
        return Ok(Action::await_change());
    };
    let mut updated = policy.as_ref().clone();
    updated.0.status = Some(status);
    match ctx.store.update_status(CLUSTER_NAMESPACE, &updated).await {
        Ok(_) => Ok(Action::await_change()),
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
            debug!("GlobalTrafficPolicy changed under its status write; looking again");
            Ok(Action::await_change())
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs the status controller of every GlobalTrafficPolicy until `shutdown`.
pub async fn run_global_status_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller = Controller::<StoredGlobalPolicy, S>::shared(
        "global-traffic-policy",
        &informers,
        config.runner,
    );
    controller
        .shutdown_on(shutdown)
        .run(
            reconcile_global_status,
            oka_cache::default_error_policy,
            Arc::new(StatusContext { store, clock }),
        )
        .await;
}

/// Runs the status controller of every TrafficPolicy until `shutdown`.
pub async fn run_status_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller =
        Controller::<TrafficPolicy, S>::shared("traffic-policy", &informers, config.runner);
    controller
        .shutdown_on(shutdown)
        .run(
            reconcile_status,
            oka_cache::default_error_policy,
            Arc::new(StatusContext { store, clock }),
        )
        .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn policy(yaml: &str) -> TrafficPolicy {
        let mut p = TrafficPolicy::new("p", serde_yaml::from_str(yaml).unwrap());
        p.metadata.namespace = Some("team".into());
        p.metadata.generation = Some(1);
        p
    }

    #[test]
    fn accepted_is_written_once_and_keeps_its_transition_time() {
        let t0: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let mut p = policy("selector: {}\negress: {rules: [{action: reject}]}");
        let status = plan_accepted(&p, t0).unwrap();
        let accepted = &status.conditions[0];
        assert_eq!((accepted.type_.as_str(), accepted.status.as_str()), ("Accepted", "True"));
        p.status = Some(status);
        assert_eq!(plan_accepted(&p, t1), None, "nothing changed: no write");
        // A new generation with the same verdict keeps the transition time.
        p.metadata.generation = Some(2);
        let again = plan_accepted(&p, t1).unwrap();
        assert_eq!(again.conditions[0].last_transition_time.0, t0);
        assert_eq!(again.conditions[0].observed_generation, Some(2));
        // What cannot be enforced turns it False, naming why.
        p.spec = serde_yaml::from_str(
            "selector: {}\negress: {rules: [{action: allow, to: [{workload: {namespace: db, selector: {app: pg}}}]}]}",
        )
        .unwrap();
        let refused = plan_accepted(&p, t1).unwrap();
        let c = &refused.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "UnresolvablePeer"));
        assert_eq!(c.last_transition_time.0, t1);
        assert!(c.message.contains("workload in \"db\""), "{}", c.message);
    }
}
