//! The controllers: pure planners plus executors, run by `oka-cache`'s controller runner
//! (work queue, list+watch caches, workers, error policy).
//!
//! # The shape of a controller: planner + executor
//!
//! Every controller is three small pieces:
//!
//! 1. **A planner**, `plan_<kind>(observed…, now) -> Plan<XAction>`: a pure function from what
//!    the controller observes (the object, its children, whether a referenced object exists)
//!    and the time to a [`Plan`]: the writes to make, in order, and when to look again
//!    ([`Plan::requeue_after`]). No IO, no clock reads, no knowledge of why it was called.
//!    This is where the rules live, and it is tested exhaustively: a table of cases plus
//!    property tests of its invariants (for example: re-planning what a plan wrote writes
//!    nothing; a planned requeue is exactly the next deadline).
//! 2. **An executor**, `execute(store, observed, &plan) -> Result<Action, E>`: applies each
//!    action through the [`oka_store::Store`] (with the observed `resourceVersion` as
//!    precondition, so a plan made from a stale cache fails with a conflict instead of
//!    overwriting newer state) and turns the plan's requeue into an [`Action`]. It is the only
//!    code that writes, and each action is idempotent.
//! 3. **A reconcile function** that glues them: read what the planner needs from the
//!    [`oka_cache::Cache`]s in its context, read `now` from the context's [`Clock`], plan, execute.
//!    Plus an **error policy**, `(object, &error, &ctx) -> Action`, kept apart from the
//!    reconciler so backoff is chosen in one place, by error kind.
//!
//! [`oka_cache::Controller`] runs the reconcile function: it lists and watches the kind into a
//! cache, turns every change into a key on a work queue, and lets N workers reconcile keys,
//! never one key twice at once. See [`oka_cache::controller`] for the flow, guarantees and
//! caveats.
//!
//! # Writing a controller
//!
//! ```no_run
//! use std::sync::Arc;
//! use oka_cache::{Action, Config, Controller, default_error_policy};
//! use oka_controller::{Clock, Plan};
//! # use oka_api::SandboxClaim;
//! # #[derive(Debug, thiserror::Error)] #[error("e")] struct Error;
//! # #[derive(Debug)] enum MyAction {}
//! # fn plan_claim(_: &SandboxClaim, _: jiff::Timestamp) -> Plan<MyAction> { Plan::nothing() }
//! # async fn execute<S>(_: &S, _: &SandboxClaim, p: &Plan<MyAction>) -> Result<Action, Error> { Ok(p.next_action()) }
//!
//! struct Ctx<S> { store: S, clock: Clock }
//!
//! async fn reconcile<S: oka_store::Store>(obj: Arc<SandboxClaim>, ctx: Arc<Ctx<S>>) -> Result<Action, Error> {
//!     let plan = plan_claim(&obj, ctx.clock.now()); // pure: all the rules are here
//!     execute(&ctx.store, &obj, &plan).await // the only writes
//! }
//!
//! async fn run<S: oka_store::Store>(store: S, shutdown: impl Future<Output = ()> + Send + 'static) {
//!     let ctx = Arc::new(Ctx { store: store.clone(), clock: Clock::system() });
//!     Controller::<SandboxClaim, S>::new("claims", store, Config::default().workers(4))
//!         .shutdown_on(shutdown)
//!         .run(reconcile, default_error_policy, ctx)
//!         .await;
//! }
//! ```
//!
//! # Modules
//!
//! - [`config`]: a controller's [`Config`]: the runner's settings and its metrics.
//! - [`plan`]: [`Plan`] and [`Clock`].
//! - [`sandbox`]: the Sandbox controller (one sandbox, one runtime instance).
//! - [`checkpoint`]: the Checkpoint controller (snapshots of sandboxes in the runtime).
//! - [`sandboxset`]: the SandboxSet controller (a warm pool of sandboxes).
//! - [`sandboxclaim`]: the SandboxClaim lifecycle controller.
//! - [`poolautoscaler`]: the PoolAutoscaler controller (a SandboxSet's replicas on cron
//!   schedules or to a target of available sandboxes, within bounds).
//! - [`trafficpolicy`]: TrafficPolicies' egress rules onto the runtime's egress policies, and
//!   their `Accepted` condition.
//! - [`revision`]: the revision hashes of sandboxes and pools.
//! - [`versions`]: skipping reconciles of a cache older than our own last write.
//!
//! # Architecture invariant
//!
//! Planners do no IO and read no clock; only executors write.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod config;
pub mod events;
pub mod metrics;
pub mod placement;
pub mod plan;
pub mod podruntime;
pub mod policy_metrics;
pub mod poolautoscaler;
pub mod probe;
pub mod revision;
pub mod sandbox;
pub mod sandboxclaim;
pub mod sandboxset;
pub mod sandboxupdateops;
pub mod trace;
pub mod trafficpolicy;
pub mod versions;

pub use config::Config;
pub use plan::{Clock, Plan};
pub use versions::WrittenVersions;
