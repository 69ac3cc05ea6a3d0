//! The SandboxClaim lifecycle controller (reference: `pkg/controller/sandboxclaim`), without
//! the claiming step itself, which needs sandboxes and comes next.
//!
//! # Expected flow
//!
//! [`plan_sandbox_claim`] decides, from the claim, whether its SandboxSet exists, and `now`:
//!
//! 1. **Completed** is terminal: nothing changes the phase again. The TTL runs from
//!    `status.completionTime`: a negative `ttlAfterCompleted` keeps the claim forever;
//!    once `ttlAfterCompleted` has elapsed the claim is deleted (only the claim, never its
//!    sandboxes); before that, look again when it will have.
//! 2. The SandboxSet named by `spec.templateName` is missing ⇒ Completed, with
//!    `Completed=True`, reason `SandboxSetNotFound`.
//! 3. An empty phase ⇒ `Claiming`, `claimStartTime = now`; then the Claiming rules below
//!    apply in the same pass.
//! 4. `claimedReplicas >= replicas` ⇒ Completed (`Completed=True`, `AllReplicasClaimed`,
//!    "Successfully claimed N/M sandboxes").
//! 5. `claimTimeout` elapsed since `claimStartTime` ⇒ Completed, with `TimedOut=True`
//!    (`ClaimTimeoutReached`) and `Completed=True` (`TimeoutReached`).
//! 6. Otherwise, while Claiming, look again at the claim-timeout deadline.
//!
//! Every status the planner writes also carries `observedGeneration`. Timestamps it writes are
//! whole seconds (what a Kubernetes `Time` keeps), so a status read back equals the one
//! planned and re-planning it writes nothing. [`execute`] applies the plan through the
//! [`Store`]: the status as a whole-status update with the observed `resourceVersion`, the
//! delete with the claim's uid and `resourceVersion` as preconditions.
//!
//! # Guarantees
//!
//! - The planner is pure: same claim, same SandboxSet presence, same `now` ⇒ same plan.
//! - A Completed claim is never moved back to Claiming; its `completionTime` never moves.
//! - Re-planning a status the planner wrote, at the same `now`, writes nothing.
//! - Every planned requeue is a deadline in the future (the claim timeout or the TTL end),
//!   and at that deadline the planner acts.
//! - `SandboxSetNotFound` is written only after the store itself answered "not found"
//!   (the cache may lag behind a SandboxSet just created).
//!
//! # Where this differs from the reference, and why
//!
//! - The reference checks for the SandboxSet before looking at the phase, so a Completed
//!   claim whose SandboxSet is gone is re-completed on every reconcile with a fresh
//!   `completionTime`, and its TTL never expires. Here Completed is checked first, as the
//!   reference's own `CalculateClaimStatus` documents.
//! - A Claiming claim without `claimStartTime` (written by hand) gets one, so it can time out;
//!   the reference would wait forever.
//! - `claimTimeout` and `ttlAfterCompleted` that do not parse as Go durations (the API server
//!   rejects them; the embedded store may not) are an error of the claim: reported, not
//!   retried until the claim changes.

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::conditions::sandbox_claim::{
    COMPLETED, TIMED_OUT, completed_reason, timed_out_reason,
};
use oka_api::{ApiError, SandboxClaim, SandboxClaimPhase, SandboxClaimStatus, SandboxSet};
use oka_store::{Preconditions, Store, StoreError};
use tracing::{debug, info};

use crate::controller::{Action, Config, Controller};
use crate::plan::{Clock, Plan};
use crate::reflector::{Cache, Informer, ObjectKey};

/// One write the claim executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimAction {
    /// Replace the claim's status with this one.
    UpdateStatus(SandboxClaimStatus),
    /// Delete the claim (its TTL after completion has elapsed).
    Delete,
}

/// Why a claim cannot be planned: its spec is invalid. Retrying does not help; changing the
/// claim does.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid spec.{field}: {source}")]
pub struct InvalidClaim {
    /// The JSON name of the field.
    pub field: &'static str,
    /// What is wrong with it.
    #[source]
    pub source: ApiError,
}

/// Why a claim reconcile failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClaimError {
    /// The claim's spec cannot be acted on.
    #[error(transparent)]
    Invalid(#[from] InvalidClaim),
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// Plans the lifecycle of `claim`; see the [module documentation](self) for the rules.
/// `sandbox_set` is the SandboxSet `spec.templateName` names, when it exists.
///
/// # Errors
///
/// [`InvalidClaim`] when `claimTimeout` or `ttlAfterCompleted` is not a Go duration.
pub fn plan_sandbox_claim(
    claim: &SandboxClaim,
    sandbox_set: Option<&SandboxSet>,
    now: Timestamp,
) -> Result<Plan<ClaimAction>, InvalidClaim> {
    let spec = &claim.spec;
    let observed = claim.status.clone().unwrap_or_default();
    let mut status = observed.clone();
    status.observed_generation = claim.metadata.generation;
    let stamp = whole_seconds(now);
    let ttl = || {
        spec.ttl_after_completed()
            .map_err(|source| InvalidClaim { field: "ttlAfterCompleted", source })
    };

    let mut plan = Plan::nothing();
    match status.phase {
        Some(SandboxClaimPhase::Completed) => {
            if let (Some(ttl), Some(completed)) = (ttl()?, &status.completion_time) {
                let remaining = remaining(completed.0, ttl, now);
                if remaining.is_zero() {
                    return Ok(plan.with(ClaimAction::Delete));
                }
                plan = plan.requeue_after(remaining);
            }
        }
        _ if sandbox_set.is_none() => {
            let message = format!("SandboxSet {} not found", spec.template_name);
            complete(&mut status, &message, &stamp);
            set(&mut status, COMPLETED, completed_reason::SANDBOX_SET_NOT_FOUND, &message, &stamp);
            plan = requeue_after_ttl(plan, ttl()?, &stamp, now);
        }
        _ => {
            if status.phase.is_none() {
                status.phase = Some(SandboxClaimPhase::Claiming);
                status.claim_start_time = Some(stamp.clone());
            }
            let claiming = status.phase == Some(SandboxClaimPhase::Claiming);
            let desired = spec.replicas;
            let claimed = status.claimed_replicas.unwrap_or(0);
            let timeout = claim_timeout(claim)?;
            let started = match &status.claim_start_time {
                Some(started) => started.0,
                None if claiming => {
                    status.claim_start_time = Some(stamp.clone());
                    stamp.0
                }
                None => now,
            };
            let left = remaining(started, timeout, now);
            if claimed >= desired {
                let message = format!("Successfully claimed {claimed}/{desired} sandboxes");
                complete(&mut status, &message, &stamp);
                let detail = format!("Successfully claimed all {claimed} sandboxes");
                set(
                    &mut status,
                    COMPLETED,
                    completed_reason::ALL_REPLICAS_CLAIMED,
                    &detail,
                    &stamp,
                );
                plan = requeue_after_ttl(plan, ttl()?, &stamp, now);
            } else if left.is_zero() && status.claim_start_time.is_some() {
                let elapsed = go_duration(now.duration_since(started));
                let message = format!(
                    "Timeout reached after {elapsed}, claimed {claimed}/{desired} sandboxes"
                );
                complete(&mut status, &message, &stamp);
                let detail = format!("Timeout after {elapsed}, claimed {claimed}/{desired}");
                set(
                    &mut status,
                    TIMED_OUT,
                    timed_out_reason::CLAIM_TIMEOUT_REACHED,
                    &detail,
                    &stamp,
                );
                set(&mut status, COMPLETED, completed_reason::TIMEOUT_REACHED, &message, &stamp);
                plan = requeue_after_ttl(plan, ttl()?, &stamp, now);
            } else if claiming {
                // The claiming step goes here. Until then: look again at the deadline.
                plan = plan.requeue_after(left);
            }
            // An unknown phase (written by another version) is left alone, as the reference
            // does, apart from the two terminal checks above.
        }
    }
    if status != observed {
        plan.actions.insert(0, ClaimAction::UpdateStatus(status));
    }
    Ok(plan)
}

/// After completing at `stamp`: look again when the TTL ends (never, if it is negative).
fn requeue_after_ttl(
    plan: Plan<ClaimAction>,
    ttl: Option<Duration>,
    stamp: &Time,
    now: Timestamp,
) -> Plan<ClaimAction> {
    match ttl {
        Some(ttl) => plan.requeue_after(remaining(stamp.0, ttl, now)),
        None => plan,
    }
}

fn claim_timeout(claim: &SandboxClaim) -> Result<Duration, InvalidClaim> {
    claim.spec.claim_timeout().map_err(|source| InvalidClaim { field: "claimTimeout", source })
}

/// The time left until `start + length`, zero when it has passed.
fn remaining(start: Timestamp, length: Duration, now: Timestamp) -> Duration {
    let elapsed = now.duration_since(start);
    if elapsed.is_negative() {
        // A start in the future (clock skew): the whole length is still ahead, and more.
        return length.saturating_add(elapsed.unsigned_abs());
    }
    length.saturating_sub(elapsed.unsigned_abs())
}

/// Phase, message and completion time of a completion; the caller sets the conditions (in
/// the reference's order).
fn complete(status: &mut SandboxClaimStatus, message: &str, now: &Time) {
    status.phase = Some(SandboxClaimPhase::Completed);
    status.message = Some(message.to_owned());
    status.completion_time = Some(now.clone());
}

/// Sets condition `type_` to `True` with the reference's semantics
/// ([`oka_api::conditions::set`]: an identical one is a no-op; `lastTransitionTime` moves only
/// when the status flips).
fn set(status: &mut SandboxClaimStatus, type_: &str, reason: &str, message: &str, now: &Time) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    oka_api::conditions::set(
        conditions,
        Condition {
            type_: type_.to_owned(),
            status: oka_api::conditions::TRUE.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: now.clone(),
            observed_generation: None,
        },
    );
}

/// `now` truncated to whole seconds, as a Kubernetes `Time` serializes it.
fn whole_seconds(now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// A duration as Go's `time.Duration.String` prints it (`1m0.5s`, `1.5ms`, `0s`), for
/// messages that match the reference's.
pub fn go_duration(duration: SignedDuration) -> String {
    fn fraction(value: u128, digits: usize) -> String {
        if value == 0 {
            return String::new();
        }
        let text = format!("{value:0digits$}");
        format!(".{}", text.trim_end_matches('0'))
    }
    let nanos = duration.as_nanos().unsigned_abs();
    let sign = if duration.is_negative() { "-" } else { "" };
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        let (unit, digits, scale) = match nanos {
            0..1_000 => ("ns", 0, 1),
            1_000..1_000_000 => ("µs", 3, 1_000),
            _ => ("ms", 6, 1_000_000),
        };
        return format!("{sign}{}{}{unit}", nanos / scale, fraction(nanos % scale, digits));
    }
    let seconds = nanos / 1_000_000_000;
    let tail = format!("{}{}s", seconds % 60, fraction(nanos % 1_000_000_000, 9));
    let minutes = seconds / 60;
    let hours = minutes / 60;
    match (hours, minutes) {
        (0, 0) => format!("{sign}{tail}"),
        (0, _) => format!("{sign}{}m{tail}", minutes % 60),
        _ => format!("{sign}{hours}h{}m{tail}", minutes % 60),
    }
}

/// Applies `plan` to `claim` through `store` and returns the runtime's next step.
///
/// A claim that disappeared meanwhile is not an error (there is nothing left to do). A stale
/// `resourceVersion` fails with [`StoreError::Conflict`]: the cache will bring the newer
/// version, and the claim is planned again.
///
/// # Errors
///
/// [`ClaimError::Store`] when a write fails for another reason than "not found".
pub async fn execute<S: Store>(
    store: &S,
    claim: &SandboxClaim,
    plan: &Plan<ClaimAction>,
) -> Result<Action, ClaimError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let mut current = claim.clone();
    for action in &plan.actions {
        match action {
            ClaimAction::UpdateStatus(status) => {
                let mut update = current.clone();
                update.status = Some(status.clone());
                match store.update_status(&namespace, &update).await {
                    Ok(written) => {
                        debug!(phase = ?status.phase, "claim status updated");
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(Action::await_change()),
                    Err(error) => return Err(error.into()),
                }
            }
            ClaimAction::Delete => {
                let preconditions = Preconditions {
                    uid: current.metadata.uid.clone(),
                    resource_version: current.metadata.resource_version.clone(),
                };
                match store.delete::<SandboxClaim>(&namespace, &name, &preconditions).await {
                    Ok(_) => info!("claim deleted: ttlAfterCompleted elapsed"),
                    Err(StoreError::NotFound { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
                return Ok(Action::await_change());
            }
        }
    }
    Ok(plan.next_action())
}

/// What the claim reconciler reads: the store, the SandboxSet cache, the clock.
pub struct ClaimContext<S: Store> {
    /// Where claims are written and SandboxSet absence is confirmed.
    pub store: S,
    /// The SandboxSets, kept by an informer the controller runs.
    pub sandbox_sets: Cache<SandboxSet>,
    /// Where `now` comes from.
    pub clock: Clock,
}

impl<S: Store> std::fmt::Debug for ClaimContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimContext").field("sandbox_sets", &self.sandbox_sets).finish()
    }
}

/// Reconciles one SandboxClaim: observe, [`plan_sandbox_claim`], [`execute`].
///
/// # Errors
///
/// [`ClaimError`] from planning or from the store.
pub async fn reconcile_claim<S: Store>(
    claim: Arc<SandboxClaim>,
    ctx: Arc<ClaimContext<S>>,
) -> Result<Action, ClaimError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let template = &claim.spec.template_name;
    let completed =
        claim.status.as_ref().is_some_and(|s| s.phase == Some(SandboxClaimPhase::Completed));
    // A Completed claim does not look at its SandboxSet; otherwise a cache miss is confirmed
    // with the store before it counts as "not found", because that decision is final.
    let sandbox_set = match ctx.sandbox_sets.get_named(&namespace, template) {
        Some(set) => Some(set),
        None if completed => None,
        None => match ctx.store.get::<SandboxSet>(&namespace, template).await {
            Ok(set) => Some(Arc::new(set)),
            Err(StoreError::NotFound { .. }) => None,
            Err(error) => return Err(error.into()),
        },
    };
    let plan = plan_sandbox_claim(&claim, sandbox_set.as_deref(), ctx.clock.now())?;
    execute(&ctx.store, &claim, &plan).await
}

/// The claim controller's error policy: an invalid spec waits for the claim to change;
/// store failures (conflicts included: the cache catches up meanwhile) back off per claim.
pub fn claim_error_policy<S: Store>(
    _claim: &SandboxClaim,
    error: &ClaimError,
    _ctx: &ClaimContext<S>,
) -> Action {
    match error {
        ClaimError::Invalid(_) => Action::await_change(),
        ClaimError::Store(_) => Action::backoff(),
    }
}

/// Builds the SandboxClaim controller over `store`: claims are the primary kind; SandboxSets
/// are cached for the reconciler, and a SandboxSet change wakes the unfinished claims that
/// name it. Run it with [`run_sandbox_claim_controller`] or by hand with
/// `controller.run(reconcile_claim, claim_error_policy, ctx)`.
pub fn sandbox_claim_controller<S: Store>(
    store: S,
    config: Config,
    clock: Clock,
) -> (Controller<SandboxClaim, S>, Arc<ClaimContext<S>>) {
    let controller = Controller::<SandboxClaim, S>::new("sandboxclaim", store.clone(), config);
    let claims = controller.cache();
    let sets = Informer::<SandboxSet, S>::new(store.clone());
    let ctx = Arc::new(ClaimContext { store, sandbox_sets: sets.cache(), clock });
    let controller = controller.watches(sets, move |set: &SandboxSet| {
        let namespace = set.metadata.namespace.clone().unwrap_or_default();
        let name = set.metadata.name.as_deref().unwrap_or_default();
        claims
            .list_namespace(&namespace)
            .iter()
            .filter(|claim| claim.spec.template_name == name)
            .filter(|claim| {
                claim.status.as_ref().is_none_or(|s| s.phase != Some(SandboxClaimPhase::Completed))
            })
            .map(|claim| ObjectKey::of(claim.as_ref()))
            .collect()
    });
    (controller, ctx)
}

/// Runs the SandboxClaim controller until `shutdown` resolves (then finishes in-flight
/// reconciles).
pub async fn run_sandbox_claim_controller<S: Store>(
    store: S,
    config: Config,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = sandbox_claim_controller(store, config, clock);
    controller.shutdown_on(shutdown).run(reconcile_claim, claim_error_policy, ctx).await;
}

#[cfg(test)]
mod tests;
