//! The SandboxClaim controller (reference: `pkg/controller/sandboxclaim`): claims `replicas`
//! sandboxes from a SandboxSet in batches, then completes and, after its TTL, deletes the claim.
//!
//! # Expected flow
//!
//! [`plan_sandbox_claim`] decides, from the claim, whether its SandboxSet exists, the sandboxes
//! the claim owns (annotation `agents.kruise.io/owner` = the claim's uid, as the reference
//! finds them) and `now`:
//!
//! 1. **Completed** is terminal: nothing changes the phase again. The TTL runs from
//!    `status.completionTime`: a negative `ttlAfterCompleted` keeps the claim forever;
//!    once `ttlAfterCompleted` has elapsed the claim is deleted (only the claim, never its
//!    sandboxes); before that, look again when it will have.
//! 2. The SandboxSet named by `spec.templateName` is missing ⇒ Completed, with
//!    `Completed=True`, reason `SandboxSetNotFound`.
//! 3. An empty phase ⇒ `Claiming`, `claimStartTime = now` (written at once, so the claim shows
//!    Claiming while its first batch runs); then the Claiming rules below apply in the same pass.
//! 4. `status.claimedReplicas >= replicas` ⇒ Completed (`Completed=True`, `AllReplicasClaimed`,
//!    "Successfully claimed N/M sandboxes").
//! 5. `claimTimeout` elapsed since `claimStartTime` ⇒ Completed, with `TimedOut=True`
//!    (`ClaimTimeoutReached`) and `Completed=True` (`TimeoutReached`).
//! 6. **Claiming.** `current = max(status.claimedReplicas, owned)`, where `owned` counts the
//!    claim's sandboxes that are neither dead nor `reserved-failed-sandbox` (so a status write
//!    lost after a batch loses no sandbox):
//!    - `current >= replicas` ⇒ `claimedReplicas = current`, message "Completed: N/M claimed",
//!      event `ClaimCompleted`, look again at once (rule 4 completes the claim);
//!    - a field the runtime cannot honour ([`unsupported_field`]: `dynamicVolumesMount`, an
//!      `inplaceUpdate` of memory or of another resource than CPU, a `runtimes` entry other
//!      than `agent-runtime`) ⇒ Completed with `Completed=True`, reason `UnsupportedField`,
//!      the message naming the field, and a Warning event; nothing is claimed;
//!    - otherwise a [`ClaimBatch`] of `min(replicas - current, 50)` claims through the
//!      [`SandboxClaimer`], started 5 at a time and doubling while every claim succeeds
//!      (the reference's slow start). After the batch ([`ClaimBatch::after`]):
//!      `claimedReplicas = current + claimed`, message "Claiming sandboxes: N/M claimed";
//!      something claimed ⇒ event `SandboxClaimed`, look again at once; nothing ⇒ Warning
//!      `NoAvailableSandboxes`, look again after 2 s (or at the claim timeout, if sooner).
//!
//! Every status the planner writes also carries `observedGeneration`. Timestamps it writes are
//! whole seconds (what a Kubernetes `Time` keeps), so a status read back equals the one
//! planned and re-planning it writes nothing. [`execute`] applies the plan through the
//! [`Store`]: the status as a whole-status update with the observed `resourceVersion`, the
//! delete with the claim's uid and `resourceVersion` as preconditions, the batch through the
//! claimer, events through the [`EventRecorder`].
//!
//! # What one claimed sandbox gets
//!
//! The claimer ([`ClaimRequest`]) writes, in the one compare-and-swap write of the manager's
//! claim engine: label `agents.kruise.io/claim-name`, the claim's `labels` (also on the pod
//! template) and `annotations`, `agents.kruise.io/owner` = the claim's uid, `spec.shutdownTime`,
//! and the `inplaceUpdate`: the first container's `image`, and its CPU request and limit where
//! the sandbox's template sets them (a pool whose members reference their SandboxTemplate gets
//! the template copied onto the sandbox for it). With an `inplaceUpdate` the claim then waits,
//! up to `waitReadyTimeout`, until the sandbox controller has made it (CPU limits change live
//! in the sandbox's cgroups; a new image restarts the sandbox on it, see the sandbox module)
//! and the sandbox is Running and Ready again;
//! then, unless `skipInitRuntime`, the agent runtime's `/init` with `envVars` and a fresh access
//! token (recorded in `agents.kruise.io/runtime-access-token`), the E2B create's init path. An
//! empty pool makes a new sandbox when `createOnNoStock` (awaited up to `waitReadyTimeout`). A
//! sandbox whose claim fails after it was taken is deleted, or kept with label
//! `agents.kruise.io/reserved-failed-sandbox=true` when `reserveFailedSandbox`.
//!
//! # Deleting a claim
//!
//! As in the reference, a claim has no finalizer and its sandboxes no owner reference to it:
//! deleting the claim (by hand or by its TTL) leaves its sandboxes running, claimed, until their
//! own `shutdownTime` or their deletion.
//!
//! # Where the controller lives, and why
//!
//! The planner, the executor and the runner are here with the other controllers; the claiming
//! itself is the manager's claim engine behind the [`SandboxClaimer`] trait this crate owns,
//! which `oka serve` implements over `oka_manager::acquire`. So there is one claim path (the
//! E2B API's), and the crate map keeps its edges: the controllers know no manager, the manager
//! knows no controller.
//!
//! # Guarantees
//!
//! - The planner is pure: same claim, same SandboxSet presence, same owned sandboxes, same
//!   `now` ⇒ same plan.
//! - `claimedReplicas` never exceeds `replicas` through this controller's claims: a batch is
//!   at most `replicas - current`, and `current` counts every live sandbox the claim owns.
//! - A Completed claim is never moved back to Claiming; its `completionTime` never moves.
//! - Re-planning a status the planner wrote, at the same `now`, writes nothing.
//! - A reconcile that starts from a cached claim older than this controller's own last write is
//!   skipped ([`WrittenVersions`]): the write's watch event brings the claim back.
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
//! - `claimTimeout`, `ttlAfterCompleted` and `waitReadyTimeout` that do not parse as Go
//!   durations (the API server rejects them; the embedded store may not) are an error of the
//!   claim: reported, not retried until the claim changes.
//! - The reference initialises the agent runtime only when the SandboxSet declares one; every
//!   oka sandbox runs one (`oka-envd`), so every claim without `skipInitRuntime` initialises it.
//!   Each sandbox gets its own access token (the reference shares one per batch).
//! - The reference accepts `dynamicVolumesMount` and acts on it in Kubernetes (CSI mounts);
//!   oka's local runtime mounts no volumes yet, so such a claim completes at once with reason
//!   `UnsupportedField` instead of claiming sandboxes that lack what was asked.
//! - `inplaceUpdate.image` is a root filesystem directory for oka's local runtime when it is
//!   an absolute path; any other image runs on the default root (no OCI image is pulled yet).
//!   The reference ignores resources other than CPU and CPU the template does not set; oka
//!   refuses the former (`UnsupportedField`) and, like the reference, leaves unset CPU unset.
//!   A templateRef pool's member gets the referenced template copied onto it, where the
//!   reference's update would do nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::common::RUNTIME_AGENT_RUNTIME;
use oka_api::conditions::sandbox_claim::{
    COMPLETED, TIMED_OUT, completed_reason, timed_out_reason,
};
use oka_api::{
    ApiError, Sandbox, SandboxClaim, SandboxClaimPhase, SandboxClaimSpec, SandboxClaimStatus,
    SandboxSet, SandboxState, labels, sandbox_state,
};
use oka_store::{Preconditions, Store, StoreError};
use tracing::{debug, info, warn};

use crate::Config;
use crate::events::{EventRecorder, EventType};
use crate::plan::{Clock, Plan};
use crate::versions::WrittenVersions;
use oka_cache::{Action, Controller};
use oka_cache::{Cache, Informers, ObjectKey};

mod claimer;

pub use claimer::{ClaimFailure, ClaimRequest, InplaceUpdateRequest, NoClaimer, SandboxClaimer};

/// The most sandboxes one reconcile claims (the reference's `--sandboxclaim-max-batch-size`).
pub const MAX_CLAIM_BATCH: i32 = 50;
/// How many claims of a batch start together at first; each round that fully succeeds doubles
/// it (the reference's `--sandboxclaim-initial-batch-size`).
pub const INITIAL_CLAIM_BATCH: usize = 5;
/// How long a claim that found nothing to claim waits before it tries again.
pub const CLAIM_RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// An Event the executor records about the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimEvent {
    /// Normal or Warning.
    pub type_: EventType,
    /// The reference's reason (`SandboxClaimed`, `NoAvailableSandboxes`, ...).
    pub reason: &'static str,
    /// The reference's message.
    pub message: String,
}

/// One step the claim executor takes.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimAction {
    /// Replace the claim's status with this one.
    UpdateStatus(SandboxClaimStatus),
    /// Record an Event about the claim.
    Record(ClaimEvent),
    /// Claim sandboxes, then write the status [`ClaimBatch::after`] gives.
    Claim(Box<ClaimBatch>),
    /// Delete the claim (its TTL after completion has elapsed).
    Delete,
}

/// One batch of claims and what to write after it (see the [module flow](self), rule 6).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimBatch {
    /// What each claim asks for.
    pub request: ClaimRequest,
    /// How many sandboxes to claim now (`1..=MAX_CLAIM_BATCH`, at most what is missing).
    pub count: i32,
    /// How many the claim had before the batch.
    pub claimed: i32,
    /// `spec.replicas`.
    pub desired: i32,
    /// The status as planned before the batch, which the batch's outcome completes.
    pub status: SandboxClaimStatus,
    /// The time left until the claim times out.
    pub time_left: Duration,
}

impl ClaimBatch {
    /// What the claim's status, its next look and its Event are once `claimed` of the batch's
    /// claims succeeded (pure).
    pub fn after(&self, claimed: i32) -> (SandboxClaimStatus, Duration, ClaimEvent) {
        let claimed = claimed.clamp(0, self.count);
        let total = self.claimed + claimed;
        let mut status = self.status.clone();
        status.claimed_replicas = Some(total);
        status.message = Some(format!("Claiming sandboxes: {total}/{} claimed", self.desired));
        if claimed > 0 {
            let message = format!("Claimed {claimed} sandbox(es), total: {total}/{}", self.desired);
            let event = ClaimEvent { type_: EventType::Normal, reason: "SandboxClaimed", message };
            (status, Duration::ZERO, event)
        } else {
            let message = format!("No available sandboxes in pool {}", self.request.pool);
            let event =
                ClaimEvent { type_: EventType::Warning, reason: "NoAvailableSandboxes", message };
            (status, CLAIM_RETRY_INTERVAL.min(self.time_left), event)
        }
    }
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

/// How many of `owned` count as claimed (pure): those neither dead at `now` (deleted, past
/// their shutdown time, failed) nor reserved after a failed claim.
pub fn count_claimed(owned: &[Arc<Sandbox>], now: Timestamp) -> i32 {
    let live = owned
        .iter()
        .filter(|s| {
            let reserved = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::RESERVED_FAILED_SANDBOX))
                .is_some_and(|v| v == labels::TRUE);
            !reserved && sandbox_state(s, now).state != SandboxState::Dead
        })
        .count();
    i32::try_from(live).unwrap_or(i32::MAX)
}

/// The first field of `spec` that oka cannot honour, with the message a user reads (pure):
/// `dynamicVolumesMount` (the local runtime mounts no CSI volumes: volumes are not built yet),
/// an `inplaceUpdate` of memory (the reference refuses it too) or of another resource than
/// `cpu` (the reference ignores those; oka says so), a CPU value that is not a positive
/// quantity, a `runtimes` entry other than `agent-runtime` (oka's sandboxes run the agent
/// runtime and nothing else is injected), and, as the reference refuses it,
/// `agents.kruise.io/sandbox-id` in `labels` or `annotations`.
pub fn unsupported_field(spec: &SandboxClaimSpec) -> Option<String> {
    if spec.dynamic_volumes_mount.as_ref().is_some_and(|m| !m.is_empty()) {
        return Some(
            "spec.dynamicVolumesMount is not supported: oka's local runtime mounts no CSI \
             volumes into a sandbox (volumes are not built yet); remove the field"
                .to_owned(),
        );
    }
    let resources = spec.inplace_update.as_ref().and_then(|u| u.resources.as_ref());
    for (list, values) in [
        ("requests", resources.and_then(|r| r.requests.as_ref())),
        ("limits", resources.and_then(|r| r.limits.as_ref())),
    ] {
        for (name, value) in values.into_iter().flatten() {
            match name.as_str() {
                "cpu" => {
                    let positive =
                        oka_api::quantity::parse(&value.0).is_ok_and(|q| q.is_positive());
                    if !positive {
                        return Some(format!(
                            "spec.inplaceUpdate.resources.{list}.cpu {:?}: target cpu must be a \
                             positive value",
                            value.0
                        ));
                    }
                }
                "memory" => {
                    return Some(format!(
                        "spec.inplaceUpdate.resources.{list}.memory: memory inplace update is not \
                         supported; remove it"
                    ));
                }
                other => {
                    return Some(format!(
                        "spec.inplaceUpdate.resources.{list}.{other} is not supported: only cpu \
                         changes in place; remove it"
                    ));
                }
            }
        }
    }
    let reserved = |map: &Option<std::collections::BTreeMap<String, String>>| {
        map.as_ref().is_some_and(|m| m.contains_key(labels::SANDBOX_ID))
    };
    for (field, map) in [("labels", &spec.labels), ("annotations", &spec.annotations)] {
        if reserved(map) {
            return Some(format!(
                "spec.{field} may not set {}: the sandbox's ID is the manager's to choose; \
                 remove the key",
                labels::SANDBOX_ID
            ));
        }
    }
    if let Some(runtime) = spec.runtimes.iter().flatten().find(|r| r.name != RUNTIME_AGENT_RUNTIME)
    {
        return Some(format!(
            "spec.runtimes entry {:?} is not supported: oka's sandboxes run only the agent \
             runtime ({RUNTIME_AGENT_RUNTIME:?}); remove the entry",
            runtime.name
        ));
    }
    None
}

/// What each claim of `claim`'s batches asks for (pure).
fn claim_request(claim: &SandboxClaim) -> Result<ClaimRequest, InvalidClaim> {
    let spec = &claim.spec;
    let wait_ready_timeout = spec
        .wait_ready_timeout()
        .map_err(|source| InvalidClaim { field: "waitReadyTimeout", source })?;
    Ok(ClaimRequest {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        pool: spec.template_name.clone(),
        owner: claim.metadata.uid.clone().unwrap_or_default(),
        claim_name: claim.metadata.name.clone().unwrap_or_default(),
        labels: spec.labels.clone().unwrap_or_default(),
        annotations: spec.annotations.clone().unwrap_or_default(),
        env_vars: spec.env_vars.clone().unwrap_or_default(),
        init_runtime: !spec.skip_init_runtime,
        shutdown_time: spec.shutdown_time.as_ref().map(|t| t.0),
        create_on_no_stock: spec.create_on_no_stock,
        wait_ready_timeout,
        reserve_failed_sandbox: spec.reserve_failed_sandbox.unwrap_or(false),
        inplace_update: inplace_update_request(spec),
    })
}

/// The claim's `inplaceUpdate` as the claimer takes it: `None` when it asks for nothing.
fn inplace_update_request(spec: &SandboxClaimSpec) -> Option<InplaceUpdateRequest> {
    let update = spec.inplace_update.as_ref()?;
    let resources = update.resources.as_ref();
    let cpu = |list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| { list.and_then(|l| l.get("cpu")).cloned() };
    let request = InplaceUpdateRequest {
        image: update.image.clone().filter(|i| !i.is_empty()),
        cpu_request: cpu(resources.and_then(|r| r.requests.as_ref())),
        cpu_limit: cpu(resources.and_then(|r| r.limits.as_ref())),
    };
    (request != InplaceUpdateRequest::default()).then_some(request)
}

/// Plans the lifecycle of `claim`; see the [module documentation](self) for the rules.
/// `sandbox_set` is the SandboxSet `spec.templateName` names, when it exists; `owned` the
/// sandboxes whose `agents.kruise.io/owner` is the claim's uid.
///
/// # Errors
///
/// [`InvalidClaim`] when `claimTimeout`, `ttlAfterCompleted` or `waitReadyTimeout` is not a Go
/// duration.
pub fn plan_sandbox_claim(
    claim: &SandboxClaim,
    sandbox_set: Option<&SandboxSet>,
    owned: &[Arc<Sandbox>],
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
    let mut batch = None;
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
                let request = claim_request(claim)?;
                let current = claimed.max(count_claimed(owned, now));
                status.claimed_replicas = Some(current);
                if current >= desired {
                    let message = format!("Successfully claimed {current}/{desired} sandboxes");
                    plan = plan.with(ClaimAction::Record(ClaimEvent {
                        type_: EventType::Normal,
                        reason: "ClaimCompleted",
                        message,
                    }));
                    status.message = Some(format!("Completed: {current}/{desired} claimed"));
                    plan = plan.requeue_after(Duration::ZERO);
                } else if let Some(message) = unsupported_field(spec) {
                    complete(&mut status, &message, &stamp);
                    set(
                        &mut status,
                        COMPLETED,
                        completed_reason::UNSUPPORTED_FIELD,
                        &message,
                        &stamp,
                    );
                    plan = plan.with(ClaimAction::Record(ClaimEvent {
                        type_: EventType::Warning,
                        reason: completed_reason::UNSUPPORTED_FIELD,
                        message,
                    }));
                    plan = requeue_after_ttl(plan, ttl()?, &stamp, now);
                } else {
                    batch = Some(ClaimBatch {
                        request,
                        count: (desired - current).min(MAX_CLAIM_BATCH),
                        claimed: current,
                        desired,
                        status: status.clone(),
                        time_left: left,
                    });
                }
            }
            // An unknown phase (written by another version) is left alone, as the reference
            // does, apart from the two terminal checks above.
        }
    }
    // The status goes first: a new claim shows Claiming while its first batch runs.
    let new_phase = observed.phase.is_none() && status.phase.is_some();
    let write = status != observed && (batch.is_none() || new_phase);
    if write {
        plan.actions.insert(0, ClaimAction::UpdateStatus(status));
    }
    if let Some(batch) = batch {
        plan.actions.push(ClaimAction::Claim(Box::new(batch)));
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

/// Applies `plan` to `claim` through the context's store, claimer and event recorder, and
/// returns the runtime's next step.
///
/// A claim that disappeared meanwhile is not an error (there is nothing left to do). A stale
/// `resourceVersion` fails with [`StoreError::Conflict`]: the cache will bring the newer
/// version, and the claim is planned again (sandboxes a batch claimed before are counted then,
/// as the claim's owned sandboxes).
///
/// # Errors
///
/// [`ClaimError::Store`] when a write fails for another reason than "not found".
pub async fn execute<S: Store>(
    ctx: &ClaimContext<S>,
    claim: &SandboxClaim,
    plan: &Plan<ClaimAction>,
) -> Result<Action, ClaimError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let mut current = claim.clone();
    let mut next = plan.next_action();
    for action in &plan.actions {
        match action {
            ClaimAction::UpdateStatus(status) => {
                match write_status(ctx, &namespace, &current, status).await? {
                    Some(written) => current = written,
                    None => return Ok(Action::await_change()),
                }
            }
            ClaimAction::Record(event) => {
                ctx.events.record(&current, event.type_, event.reason, &event.message);
            }
            ClaimAction::Claim(batch) => {
                let (claimed, failed) = claim_batch(ctx.claimer.as_ref(), batch).await;
                if let Some(metrics) = &ctx.metrics {
                    let set = &claim.spec.template_name;
                    let count = |n: i32| u64::try_from(n).unwrap_or(0);
                    metrics.claimed(&namespace, set, count(claimed), count(failed));
                }
                let (status, requeue, event) = batch.after(claimed);
                ctx.events.record(&current, event.type_, event.reason, &event.message);
                if current.status.as_ref() != Some(&status) {
                    match write_status(ctx, &namespace, &current, &status).await? {
                        Some(written) => current = written,
                        None => return Ok(Action::await_change()),
                    }
                }
                next = Action::requeue_after(requeue);
            }
            ClaimAction::Delete => {
                let preconditions = Preconditions {
                    uid: current.metadata.uid.clone(),
                    resource_version: current.metadata.resource_version.clone(),
                };
                match ctx.store.delete::<SandboxClaim>(&namespace, &name, &preconditions).await {
                    Ok(_) => {
                        info!("claim deleted: ttlAfterCompleted elapsed");
                        if let Some(metrics) = &ctx.metrics {
                            metrics.claim_expired(&namespace);
                        }
                    }
                    Err(StoreError::NotFound { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
                return Ok(Action::await_change());
            }
        }
    }
    Ok(next)
}

/// Writes `status` over `current`; the written claim, `None` when it is gone.
async fn write_status<S: Store>(
    ctx: &ClaimContext<S>,
    namespace: &str,
    current: &SandboxClaim,
    status: &SandboxClaimStatus,
) -> Result<Option<SandboxClaim>, ClaimError> {
    let mut update = current.clone();
    update.status = Some(status.clone());
    match ctx.store.update_status(namespace, &update).await {
        Ok(written) => {
            debug!(phase = ?status.phase, claimed = ?status.claimed_replicas, "claim status updated");
            ctx.written.record(&written);
            Ok(Some(written))
        }
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Runs `batch.count` claims through `claimer`, [`INITIAL_CLAIM_BATCH`] at once and doubling
/// after each round in which every claim succeeded; stops after a round with a failure (the
/// pool is empty or failing: the next reconcile tries again). Returns how many succeeded and
/// how many failed (an empty pool is no failure).
async fn claim_batch(claimer: &dyn SandboxClaimer, batch: &ClaimBatch) -> (i32, i32) {
    let mut left = usize::try_from(batch.count).unwrap_or(0);
    let mut round = INITIAL_CLAIM_BATCH;
    let mut claimed = 0i32;
    let mut failures = 0i32;
    while left > 0 {
        let size = round.min(left);
        let results = join_all((0..size).map(|_| claimer.claim(&batch.request))).await;
        let mut failed = false;
        for result in results {
            match result {
                Ok(sandbox) => {
                    claimed += 1;
                    debug!(%sandbox, "sandbox claimed for the claim");
                }
                Err(ClaimFailure::NoStock(why)) => {
                    failed = true;
                    debug!(%why, "no sandbox to claim");
                }
                Err(ClaimFailure::Failed(why)) => {
                    failed = true;
                    failures += 1;
                    warn!(%why, "a claim failed");
                }
            }
        }
        if failed {
            break;
        }
        left -= size;
        round = round.saturating_mul(2);
    }
    if claimed > 0 {
        info!(
            claimed,
            total = batch.claimed + claimed,
            desired = batch.desired,
            "claimed sandboxes"
        );
    }
    (claimed, failures)
}

/// What the claim reconciler reads and writes through: the store, the SandboxSet cache, the
/// claimer, the clock.
pub struct ClaimContext<S: Store> {
    /// Where claims are written and SandboxSet absence is confirmed.
    pub store: S,
    /// The SandboxSets, kept by an informer the controller runs.
    pub sandbox_sets: Cache<SandboxSet>,
    /// Where `now` comes from.
    pub clock: Clock,
    /// Where sandboxes are claimed (the manager's claim engine in `oka serve`).
    pub claimer: Arc<dyn SandboxClaimer>,
    /// Where the claim's Events go.
    pub events: EventRecorder,
    /// The claim versions this controller wrote, so a reconcile from an older cache waits.
    pub written: WrittenVersions,
    /// Where claims and expiries are counted.
    pub metrics: Option<Arc<crate::metrics::ControllerMetrics>>,
}

impl<S: Store> ClaimContext<S> {
    /// A context over `store` and `sandbox_sets` that claims through `claimer`; Events are not
    /// recorded (see [`ClaimContext::with_events`]).
    pub fn new(
        store: S,
        sandbox_sets: Cache<SandboxSet>,
        clock: Clock,
        claimer: Arc<dyn SandboxClaimer>,
    ) -> Self {
        Self {
            store,
            sandbox_sets,
            clock,
            claimer,
            events: EventRecorder::disabled(),
            written: WrittenVersions::default(),
            metrics: None,
        }
    }

    /// This context, recording Events with `events`.
    #[must_use]
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = events;
        self
    }
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
    if ctx.written.is_stale(claim.as_ref()) {
        // Our own last write has not reached the cache yet; its event brings the claim back.
        return Ok(Action::await_change());
    }
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let template = &claim.spec.template_name;
    let phase = claim.status.as_ref().and_then(|s| s.phase.clone());
    let completed = phase == Some(SandboxClaimPhase::Completed);
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
    let owned = match (&claim.metadata.uid, completed) {
        (Some(uid), false) => ctx.claimer.owned(&namespace, uid),
        _ => Vec::new(),
    };
    let plan = plan_sandbox_claim(&claim, sandbox_set.as_deref(), &owned, ctx.clock.now())?;
    execute(&ctx, &claim, &plan).await
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

/// Builds the SandboxClaim controller over `informers` (shared, or a store for its own), claiming
/// through `claimer`: claims are the primary kind; SandboxSets are cached for the reconciler, and a
/// SandboxSet change wakes the unfinished claims that name it. Events go to the store. Run it with
/// [`run_sandbox_claim_controller`] or by hand with `controller.run(reconcile_claim,
/// claim_error_policy, ctx)`.
pub fn sandbox_claim_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    claimer: Arc<dyn SandboxClaimer>,
) -> (Controller<SandboxClaim, S>, Arc<ClaimContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller =
        Controller::<SandboxClaim, S>::shared("sandboxclaim", &informers, config.runner);
    let claims = controller.cache();
    let sets = informers.all::<SandboxSet>();
    let events = EventRecorder::spawn(store.clone(), "sandboxclaim");
    let mut ctx = ClaimContext::new(store, sets.cache(), clock, claimer).with_events(events);
    ctx.metrics = config.metrics.clone();
    let ctx = Arc::new(ctx);
    let controller = match config.metrics.clone() {
        Some(metrics) => {
            metrics.watch_claims(controller.cache());
            controller.on_change(move |change| metrics.observe_claim(change))
        }
        None => controller,
    };
    let controller = controller.watches_shared(sets, move |set: &SandboxSet| {
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
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    claimer: Arc<dyn SandboxClaimer>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = sandbox_claim_controller(informers, config, clock, claimer);
    controller.shutdown_on(shutdown).run(reconcile_claim, claim_error_policy, ctx).await;
}

#[cfg(test)]
mod tests;
