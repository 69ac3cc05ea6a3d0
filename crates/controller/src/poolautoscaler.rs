//! The PoolAutoscaler controller (an oka extension; the reference has only a design
//! document): scales a SandboxSet's `spec.replicas` on cron schedules or to keep a target of
//! available sandboxes, always within `minReplicas..=maxReplicas`.
//!
//! # Expected flow
//!
//! [`reconcile_pool_autoscaler`] reads the target SandboxSet from the store (a fresh read, as
//! a GET of its scale subresource would be), the older autoscalers of the same target from
//! the cache, the sandboxes of the pool when a scale-up is in flight, and the time zones the
//! cron policies name, then calls the pure [`plan_pool_autoscaler`], in this order:
//!
//! 1. The target or the policy kind changed since the last pass: forget the samples and the
//!    recommendation history, clear `status.pendingScaleUp`.
//! 2. `spec.suspend`: `suspended: true`, `ScalingActive=False/Suspended`, forget samples and
//!    history, and **nothing else** (bounds are not enforced either). On the first pass after
//!    the suspension every `appliedCronPolicies[].observedTime` becomes `now`: fires that fell
//!    in the suspension are skipped, never caught up.
//! 3. A target that is not a SandboxSet of `agents.kruise.io`: `AbleToScale=False/InvalidTarget`.
//!    A missing SandboxSet: `AbleToScale=False/TargetNotFound`, look again in 30 s (the
//!    autoscaler resumes when the SandboxSet is created).
//! 4. One autoscaler per target: when another one in the namespace targets the same
//!    SandboxSet, only the oldest (creation time, then name) acts; the others report
//!    `AbleToScale=False/AmbiguousTarget` and do nothing.
//! 5. `current` is the target's `spec.replicas`, `observed` its `status.replicas`, `available`
//!    its `status.availableReplicas`. The policy gives a raw value:
//!    - **both policy kinds** (admission refuses this; an object written around it):
//!      `ScalingActive=False/InvalidPolicyCombination`, bounds only;
//!    - **cron** ([`cron`](self#cron-policies)): the latest due fire's `targetReplicas`, else
//!      `current`;
//!    - **capacity** ([`capacity`](self#capacity-policy)): the stabilized recommendation;
//!    - **neither**: `current` (a guardrail: bounds only).
//! 6. `final = max(minReplicas, min(raw, maxReplicas))`, `ScalingLimited` says whether a bound
//!    applied. Bounds are enforced on every pass, so a manual scale outside them, or an edit
//!    of them, is corrected at once.
//! 7. `final != current`: write the target's `spec.replicas` (and nothing else) with the read
//!    `resourceVersion`, so a concurrent change wins and the next pass sees it; record
//!    `lastScaleTime`, a `SuccessfulRescale` event, and in capacity mode after a scale-up
//!    `pendingScaleUp = {now, final − current}`.
//! 8. Write the status only when it changed; look again per mode: capacity at the next
//!    sampling tick, cron one second after the next fire (at most 5 minutes), bounds-only and
//!    suspended every 5 minutes (and on every change of the autoscaler or its SandboxSet).
//!
//! # Cron policies
//!
//! Schedules are [`oka_api::cron`] in the policy's `timeZone` (else the controller's zone).
//! Per policy, `baseline = max(lastScheduleTime, observedTime)` and the policy is due when a
//! fire `t` has `baseline < t <= now`; only the latest such fire applies (a `MissedSchedule`
//! event when earlier fires were dropped or the applied one is over a minute old), and the
//! lookback is a year at most. Among due policies the latest fire wins, then the larger
//! target, then the earlier policy; every due policy is consumed (`lastScheduleTime = t`).
//! Nothing due leaves `current` (a manual scale between fires persists, within bounds). A new
//! policy, or one whose schedule or zone changed, starts at `observedTime = now`: it fires at
//! its next schedule, never for a past one. A zone that cannot be loaded or a schedule that
//! does not parse stops the autoscaler (bounds included) with `UnknownTimeZone` /
//! `InvalidSchedule`.
//!
//! # Capacity policy
//!
//! Once per sampling tick (a pass at least half an interval after the last sample; the
//! passes a SandboxSet change triggers in between only enforce bounds), while the target's
//! status is current (`observedGeneration >= generation`, else the tick is skipped and after a
//! minute `ScalingActive=False/StaleTargetStatus`):
//!
//! 1. Sample `(observed, available)`; drop samples older than the observation window; use the
//!    means.
//! 2. The band ([`Band`]): `targetAvailable ± tolerance`, percentages of `current`, rounded
//!    up. Outside it (strictly), recommend `ceil(max(0, observed − available − inflight)) +
//!    target`, inside keep `current`.
//! 3. The in-flight guard: the sandboxes this autoscaler added and that are not ready yet are
//!    not demand. `inflight = max(0, min(observed − available, pending − readySince))` where
//!    `readySince` counts the pool's sandboxes created since the scale-up that became
//!    available or were claimed. The record is cleared once they are all ready or after the
//!    settle timeout.
//! 4. Stabilization ([`stabilize`]): up only to the smallest recommendation of the scale-up
//!    window, down only to the largest of the scale-down window. After a (re)start, a change
//!    of target or policy kind, or a suspension, the history starts with `(now, current)`, so
//!    nothing scales down before a full scale-down window.
//!
//! # Guarantees
//!
//! - The planner is pure: the same observation, memory, settings and `now` give the same
//!   plan. Re-planning what it wrote, at the same `now`, writes nothing.
//! - Every write to the target is within `minReplicas..=maxReplicas`, and only `spec.replicas`
//!   changes.
//! - Within a stabilization window there is no flapping: no scale-down within the scale-down
//!   window of a scale-up, no scale-up within the scale-up window of a scale-down (unless
//!   someone else changed the target meanwhile).
//!
//! # Where this differs from the proposal, and why
//!
//! - The sampling interval, the observation window, the default tolerance and the settle
//!   timeout are the controller's [`Settings`], not fields of the object (the proposal calls
//!   them system-level configuration).
//! - The samples and the history live in memory and are lost on a restart; the history is
//!   then seeded so a restart never causes a scale-down.
//! - No rate limits beyond the windows: the proposal's struct has only stabilization windows
//!   and `lastScaleTime` is informational, so a scale goes straight to the stabilized value.
//! - The scale is written as a replace of the SandboxSet as read (its `resourceVersion` as the
//!   precondition) that changes `spec.replicas` alone: the store has no scale subresource of
//!   its own; on the wire it is the same change, and a concurrent one wins.
//! - A capacity `targetAvailable` or `tolerance` that is neither a count nor a percentage
//!   (admission's schema lets any string through) is reported as
//!   `ScalingActive=False/InvalidCapacityPolicy` and the autoscaler enforces bounds only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::conditions::pool_autoscaler::{
    ABLE_TO_SCALE, SCALING_ACTIVE, SCALING_LIMITED, able_to_scale_reason as able,
    scaling_active_reason as active, scaling_limited_reason as limited,
};
use oka_api::cron::Schedule;
use oka_api::poolautoscaler::{
    AppliedCronPolicy, CurrentCapacity, DEFAULT_TOLERANCE, PendingScaleUp, ScaleTargetRef,
};
use oka_api::sandboxset::SANDBOX_SET_KIND;
use oka_api::{
    PoolAutoscaler, PoolAutoscalerStatus, Sandbox, SandboxSet, SandboxState, labels, sandbox_state,
};
use oka_store::{Requirement, Selector, Store, StoreError};
use tracing::{debug, info};

use crate::Config;
use crate::events::{EventRecorder, EventType};
use crate::plan::{Clock, Plan, whole_seconds};
use oka_cache::{Action, Controller};
use oka_cache::{Cache, Informers, ObjectKey};

pub mod capacity;

pub use capacity::{Amount, Band, Held, Recommendation, stabilize};

/// How often a suspended, bounds-only or blocked autoscaler looks again without a change.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How soon an autoscaler whose SandboxSet is missing looks again.
pub const TARGET_NOT_FOUND_RETRY: Duration = Duration::from_secs(30);
/// A cron autoscaler looks again this long after the next fire, so the fire is due then.
const AFTER_FIRE: Duration = Duration::from_secs(1);
/// How long the target's status may lag its spec before `StaleTargetStatus` is reported.
const STALE_AFTER: SignedDuration = SignedDuration::from_secs(60);
/// A catch-up older than this is reported as a `MissedSchedule` even when no fire was dropped.
const LATE_FIRE: SignedDuration = SignedDuration::from_secs(60);
/// How many dropped fires a `MissedSchedule` event counts exactly.
const MISSED_COUNT_LIMIT: usize = 10_000;

/// The event reasons of the autoscaler.
pub mod event_reason {
    /// Normal: the target was rescaled.
    pub const SUCCESSFUL_RESCALE: &str = "SuccessfulRescale";
    /// Warning: writing the target's replicas failed.
    pub const FAILED_RESCALE: &str = "FailedRescale";
    /// Warning: reading the target failed.
    pub const FAILED_GET_SCALE: &str = "FailedGetScale";
    /// Warning: the SandboxSet does not exist.
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    /// Warning: another, older autoscaler targets the same SandboxSet.
    pub const AMBIGUOUS_TARGET: &str = "AmbiguousTarget";
    /// Warning: a policy names a zone that cannot be loaded.
    pub const UNKNOWN_TIME_ZONE: &str = "UnknownTimeZone";
    /// Warning: a schedule does not parse.
    pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
    /// Normal: a catch-up fire was applied after downtime.
    pub const MISSED_SCHEDULE: &str = "MissedSchedule";
    /// Warning: a percentage target cannot lift a pool out of zero replicas.
    pub const PERCENT_TARGET_FROM_ZERO: &str = "PercentTargetFromZero";
}

/// `ScalingActive=False` when `targetAvailable` or `tolerance` is neither a count nor a
/// percentage (an oka addition to the proposal's reasons).
pub const INVALID_CAPACITY_POLICY: &str = "InvalidCapacityPolicy";

/// The controller-wide settings of the autoscaler (flags in the proposal).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How often a capacity policy samples its target (5 to 30 s).
    pub sampling_interval: Duration,
    /// How far back samples are averaged (30 to 300 s, at least the sampling interval).
    pub observation_window: Duration,
    /// The tolerance of a capacity policy that sets none.
    pub default_tolerance: IntOrString,
    /// How long a scale-up may stay in flight before its guard is dropped.
    pub settle_timeout: Duration,
    /// The zone of a cron policy that names none.
    pub default_zone: TimeZone,
}

impl Default for Settings {
    /// 15 s sampling, 60 s window, 10 % tolerance, 5 min settle timeout, UTC.
    fn default() -> Self {
        Settings {
            sampling_interval: Duration::from_secs(15),
            observation_window: Duration::from_secs(60),
            default_tolerance: IntOrString::String(DEFAULT_TOLERANCE.to_owned()),
            settle_timeout: Duration::from_secs(300),
            default_zone: TimeZone::UTC,
        }
    }
}

impl Settings {
    /// The settings from the controller's flags: the sampling interval clamped to 5–30 s, the
    /// observation window to 30–300 s and to at least the interval, the tolerance a count
    /// (`"2"`) or a percentage (`"10%"`), and the zone of cron policies that name none the
    /// process's (`TZ`, else `/etc/localtime`, else UTC).
    pub fn from_flags(
        sampling_interval: Duration,
        observation_window: Duration,
        default_tolerance: &str,
        settle_timeout: Duration,
    ) -> Settings {
        let sampling_interval =
            sampling_interval.clamp(Duration::from_secs(5), Duration::from_secs(30));
        let observation_window = observation_window
            .clamp(Duration::from_secs(30), Duration::from_secs(300))
            .max(sampling_interval);
        let tolerance = default_tolerance.trim();
        let default_tolerance = match tolerance.parse::<i32>() {
            Ok(count) => IntOrString::Int(count),
            Err(_) => IntOrString::String(tolerance.to_owned()),
        };
        Settings {
            sampling_interval,
            observation_window,
            default_tolerance,
            settle_timeout,
            default_zone: TimeZone::system(),
        }
    }
}

/// The zones the cron policies name, as loaded: the zone or why it cannot be loaded.
pub type Zones = BTreeMap<String, Result<TimeZone, String>>;

/// Loads every zone `autoscaler`'s cron policies name from the system's time zone database.
pub fn load_zones(autoscaler: &PoolAutoscaler) -> Zones {
    autoscaler
        .spec
        .cron_policies
        .iter()
        .flatten()
        .filter_map(|p| p.time_zone.clone())
        .map(|name| {
            let zone = jiff::tz::db().get(&name).map_err(|e| e.to_string());
            (name, zone)
        })
        .collect()
}

/// What the target looked like.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// The SandboxSet does not exist.
    NotFound,
    /// The SandboxSet, and how many of the pool's sandboxes created since
    /// `status.pendingScaleUp.startTime` became available or were claimed ([`ready_since`]).
    Found {
        /// The SandboxSet as read.
        set: &'a SandboxSet,
        /// Sandboxes of the in-flight scale-up that are ready.
        ready_since: i32,
    },
}

/// Everything [`plan_pool_autoscaler`] looks at besides its memory and the time.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The autoscaler.
    pub autoscaler: &'a PoolAutoscaler,
    /// Its target.
    pub target: Target<'a>,
    /// The name of an older autoscaler of the same target in the namespace, if any.
    pub older: Option<&'a str>,
    /// The zones its cron policies name ([`load_zones`]).
    pub zones: &'a Zones,
}

/// The policy kind of an autoscaler: a change of it starts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only bounds.
    BoundsOnly,
    /// Cron policies.
    Cron,
    /// A capacity policy.
    Capacity,
    /// Both kinds (invalid): bounds only.
    Both,
}

impl Mode {
    /// The mode of `autoscaler`'s spec.
    pub fn of(autoscaler: &PoolAutoscaler) -> Mode {
        let cron = autoscaler.spec.cron_policies.as_ref().is_some_and(|p| !p.is_empty());
        match (cron, autoscaler.spec.capacity_policy.is_some()) {
            (true, true) => Mode::Both,
            (true, false) => Mode::Cron,
            (false, true) => Mode::Capacity,
            (false, false) => Mode::BoundsOnly,
        }
    }
}

/// One sample of the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was taken.
    pub at: Timestamp,
    /// The target's `status.replicas`.
    pub observed: i32,
    /// The target's `status.availableReplicas`.
    pub available: i32,
}

/// What an autoscaler remembers between passes (in memory: a restart loses it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memory {
    /// The target and mode of the last pass.
    pub identity: Option<(String, Mode)>,
    /// The samples of the observation window, oldest first.
    pub samples: Vec<Sample>,
    /// The recommendations of the stabilization windows, oldest first.
    pub history: Vec<Recommendation>,
    /// The history starts over with `(now, current)` at the next decision.
    pub seed: bool,
    /// The schedule and zone last seen per cron policy.
    pub schedules: BTreeMap<String, (String, Option<String>)>,
    /// Since when the target's status has lagged its spec.
    pub stale_since: Option<Timestamp>,
    /// A `PercentTargetFromZero` warning was given for the current empty pool.
    pub warned_from_zero: bool,
}

/// One thing the executor does.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoscalerAction {
    /// Set the target's `spec.replicas` from `from` to `to`.
    Scale {
        /// The value read.
        from: i32,
        /// The value to write.
        to: i32,
    },
    /// Record an event about the autoscaler.
    Event {
        /// Normal or Warning.
        type_: EventType,
        /// The reason.
        reason: &'static str,
        /// The message.
        message: String,
    },
    /// Replace the autoscaler's status with this one.
    UpdateStatus(Box<PoolAutoscalerStatus>),
}

/// A plan and the memory to keep for the next pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// What to do.
    pub plan: Plan<AutoscalerAction>,
    /// What to remember.
    pub memory: Memory,
}

/// The status being built, with the events of the pass.
struct Pass<'a> {
    before: &'a PoolAutoscalerStatus,
    status: PoolAutoscalerStatus,
    events: Vec<AutoscalerAction>,
    stamp: Time,
    generation: Option<i64>,
}

impl Pass<'_> {
    /// Sets a condition; returns whether its reason or status differs from the one before the
    /// pass (so warnings are given once per transition, not on every pass).
    fn condition(&mut self, type_: &str, ok: bool, reason: &str, message: String) -> bool {
        let status = if ok { oka_api::conditions::TRUE } else { oka_api::conditions::FALSE };
        let conditions = self.status.conditions.get_or_insert_with(Vec::new);
        oka_api::conditions::set(
            conditions,
            Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
                last_transition_time: self.stamp.clone(),
                observed_generation: self.generation,
            },
        );
        let old = self.before.conditions.as_deref().unwrap_or_default();
        oka_api::conditions::find(old, type_)
            .is_none_or(|c| c.status != status || c.reason != reason)
    }

    fn event(&mut self, type_: EventType, reason: &'static str, message: String) {
        self.events.push(AutoscalerAction::Event { type_, reason, message });
    }

    /// A condition that stops the pass, with a warning event on its transition.
    fn blocked(&mut self, type_: &str, reason: &'static str, message: String) {
        if self.condition(type_, false, reason, message.clone()) {
            self.event(EventType::Warning, reason, message);
        }
    }

    /// The plan: the target write (if any) first, then the events, then the status if it
    /// changed.
    fn finish(
        self,
        scale: Option<AutoscalerAction>,
        requeue: Option<Duration>,
    ) -> Plan<AutoscalerAction> {
        let mut plan = Plan::nothing();
        if let Some(scale) = scale {
            plan = plan.with(scale);
        }
        for event in self.events {
            plan = plan.with(event);
        }
        if &self.status != self.before {
            plan = plan.with(AutoscalerAction::UpdateStatus(Box::new(self.status)));
        }
        match requeue {
            Some(after) => plan.requeue_after(after),
            None => plan,
        }
    }
}

/// Whether `reference` names a SandboxSet of `agents.kruise.io`.
pub fn is_valid_target(reference: &ScaleTargetRef) -> bool {
    reference.kind == SANDBOX_SET_KIND
        && reference.api_version.split('/').next() == Some("agents.kruise.io")
        && !reference.name.is_empty()
}

/// How many sandboxes of pool `pool` created at or after `since` are available or were
/// claimed (running or paused): the ready part of an in-flight scale-up.
pub fn ready_since(
    sandboxes: &[Arc<Sandbox>],
    pool: &str,
    since: Timestamp,
    now: Timestamp,
) -> i32 {
    let count = sandboxes
        .iter()
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::SANDBOX_POOL))
                .is_some_and(|p| p == pool)
        })
        .filter(|s| s.metadata.creation_timestamp.as_ref().is_some_and(|t| t.0 >= since))
        .filter(|s| {
            matches!(
                sandbox_state(s, now).state,
                SandboxState::Available | SandboxState::Running | SandboxState::Paused
            )
        })
        .count();
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// The outcome of a policy: the raw replicas, why, and when to look again.
struct Raw {
    replicas: i64,
    why: Option<String>,
    requeue: Option<Duration>,
    held: Option<Held>,
    /// The policy made no decision this pass (a capacity policy between its ticks).
    undecided: bool,
}

impl Raw {
    fn keep(current: i64, requeue: Duration) -> Raw {
        Raw { replicas: current, why: None, requeue: Some(requeue), held: None, undecided: false }
    }

    /// No decision: keep `current` and say nothing new about it.
    fn undecided(current: i64, requeue: Duration) -> Raw {
        Raw { undecided: true, ..Raw::keep(current, requeue) }
    }
}

/// Plans one pass of `observed.autoscaler`; see the [module documentation](self).
pub fn plan_pool_autoscaler(
    observed: &Observed<'_>,
    memory: &Memory,
    settings: &Settings,
    now: Timestamp,
) -> Planned {
    let pa = observed.autoscaler;
    let spec = &pa.spec;
    let before = pa.status.clone().unwrap_or_default();
    let mut pass = Pass {
        before: &before,
        status: before.clone(),
        events: Vec::new(),
        stamp: whole_seconds(now),
        generation: pa.metadata.generation,
    };
    pass.status.observed_generation = pa.metadata.generation;
    let mut memory = memory.clone();
    let mode = Mode::of(pa);
    let identity = (spec.scale_target_ref.name.clone(), mode);
    match &memory.identity {
        None => memory.seed = true,
        Some(old) if *old != identity => {
            memory.samples.clear();
            memory.history.clear();
            memory.seed = true;
            memory.stale_since = None;
            pass.status.pending_scale_up = None;
        }
        Some(_) => {}
    }
    memory.identity = Some(identity);

    if spec.suspend {
        pass.status.suspended = Some(true);
        pass.condition(SCALING_ACTIVE, false, active::SUSPENDED, "spec.suspend is set".into());
        memory.samples.clear();
        memory.history.clear();
        memory.seed = true;
        return Planned { plan: pass.finish(None, Some(RESYNC)), memory };
    }
    if before.suspended == Some(true) {
        for applied in pass.status.applied_cron_policies.iter_mut().flatten() {
            applied.observed_time = Some(pass.stamp.clone());
        }
    }
    pass.status.suspended = Some(false);

    let reference = &spec.scale_target_ref;
    if !is_valid_target(reference) {
        let message = format!(
            "the target must be a SandboxSet of agents.kruise.io, not {} {}",
            reference.api_version, reference.kind
        );
        pass.condition(ABLE_TO_SCALE, false, able::INVALID_TARGET, message);
        return Planned { plan: pass.finish(None, None), memory };
    }
    let Target::Found { set, ready_since } = observed.target else {
        let message = format!("SandboxSet {} not found", reference.name);
        pass.blocked(ABLE_TO_SCALE, able::TARGET_NOT_FOUND, message);
        return Planned { plan: pass.finish(None, Some(TARGET_NOT_FOUND_RETRY)), memory };
    };
    if let Some(older) = observed.older {
        let message =
            format!("PoolAutoscaler {older} already targets SandboxSet {}", reference.name);
        pass.blocked(ABLE_TO_SCALE, able::AMBIGUOUS_TARGET, message);
        return Planned { plan: pass.finish(None, Some(RESYNC)), memory };
    }

    let current = i64::from(set.spec.replicas);
    let set_status = set.status.clone().unwrap_or_default();
    let observed_replicas = set_status.replicas;
    let available = set_status.available_replicas;
    pass.status.current_replicas = Some(observed_replicas);
    pass.status.current_capacity = Some(CurrentCapacity { available: Some(available) });

    let raw = match mode {
        Mode::Both => {
            let message =
                "cron and capacity policies are mutually exclusive; enforcing bounds only";
            pass.condition(
                SCALING_ACTIVE,
                false,
                active::INVALID_POLICY_COMBINATION,
                message.into(),
            );
            Raw::keep(current, RESYNC)
        }
        Mode::BoundsOnly => {
            let message = "no policy; enforcing minReplicas and maxReplicas only";
            pass.condition(SCALING_ACTIVE, true, active::BOUNDS_ONLY, message.into());
            Raw::keep(current, RESYNC)
        }
        Mode::Cron => match plan_cron(observed, &mut pass, &mut memory, settings, current, now) {
            Some(raw) => raw,
            None => return Planned { plan: pass.finish(None, Some(RESYNC)), memory },
        },
        Mode::Capacity => {
            let sample = Sample { at: now, observed: observed_replicas, available };
            plan_capacity(pa, set, sample, ready_since, &mut pass, &mut memory, settings, current)
        }
    };

    let (min, max) = (i64::from(spec.min_replicas), i64::from(spec.max_replicas));
    let final_ = raw.replicas.min(max).max(min);
    let bound = if raw.replicas < min {
        let message = format!("the desired replicas {} are below minReplicas {min}", raw.replicas);
        pass.condition(SCALING_LIMITED, true, limited::TOO_FEW_REPLICAS, message);
        Some("below minReplicas")
    } else if raw.replicas > max {
        let message = format!("the desired replicas {} are above maxReplicas {max}", raw.replicas);
        pass.condition(SCALING_LIMITED, true, limited::TOO_MANY_REPLICAS, message);
        Some("above maxReplicas")
    } else {
        let message = "the desired replicas are within range".to_owned();
        pass.condition(SCALING_LIMITED, false, limited::DESIRED_WITHIN_RANGE, message);
        None
    };
    let to = i32::try_from(final_).unwrap_or(spec.max_replicas);
    pass.status.desired_replicas = Some(to);

    let mut scale = None;
    if final_ != current {
        let why = match (bound, &raw.why) {
            (Some(bound), _) if final_ != raw.replicas => bound.to_owned(),
            (_, Some(why)) => why.clone(),
            (Some(bound), None) => bound.to_owned(),
            (None, None) => "the policy".to_owned(),
        };
        let message = format!("New size: {to}; reason: {why}");
        pass.condition(ABLE_TO_SCALE, true, able::SUCCEEDED_RESCALE, message.clone());
        pass.event(EventType::Normal, event_reason::SUCCESSFUL_RESCALE, message);
        pass.status.last_scale_time = Some(pass.stamp.clone());
        if mode == Mode::Capacity && final_ > current {
            let replicas = i32::try_from(final_ - current).unwrap_or(i32::MAX);
            pass.status.pending_scale_up =
                Some(PendingScaleUp { start_time: pass.stamp.clone(), replicas });
        }
        scale = Some(AutoscalerAction::Scale { from: set.spec.replicas, to });
    } else {
        let (reason, message) = match raw.held {
            Some(Held::ScaleUp) => (
                able::SCALE_UP_STABILIZED,
                "recent recommendations were lower; holding the scale-up".to_owned(),
            ),
            Some(Held::ScaleDown) => (
                able::SCALE_DOWN_STABILIZED,
                "recent recommendations were higher; holding the scale-down".to_owned(),
            ),
            None => (able::SUCCEEDED_GET_SCALE, "the target's scale was read".to_owned()),
        };
        // A pass that changes nothing leaves a `SucceededRescale` in place: it names the last
        // rescale, and re-planning what a rescale wrote then writes nothing. A pass without a
        // decision leaves any `True` as it is.
        let last = before.conditions.as_deref().unwrap_or_default();
        let keep = oka_api::conditions::find(last, ABLE_TO_SCALE).is_some_and(|c| {
            c.status == oka_api::conditions::TRUE
                && (raw.undecided || (raw.held.is_none() && c.reason == able::SUCCEEDED_RESCALE))
        });
        if !keep {
            pass.condition(ABLE_TO_SCALE, true, reason, message);
        }
    }
    Planned { plan: pass.finish(scale, raw.requeue), memory }
}

/// The cron part of a pass; `None` when a zone or a schedule stops the autoscaler.
fn plan_cron(
    observed: &Observed<'_>,
    pass: &mut Pass<'_>,
    memory: &mut Memory,
    settings: &Settings,
    current: i64,
    now: Timestamp,
) -> Option<Raw> {
    let policies = observed.autoscaler.spec.cron_policies.as_deref().unwrap_or_default();
    let mut parsed = Vec::with_capacity(policies.len());
    for policy in policies {
        let zone = match &policy.time_zone {
            None => settings.default_zone.clone(),
            Some(name) => match observed.zones.get(name) {
                Some(Ok(zone)) => zone.clone(),
                Some(Err(error)) => {
                    let message =
                        format!("cron policy {}: unknown time zone {name}: {error}", policy.name);
                    pass.blocked(SCALING_ACTIVE, active::UNKNOWN_TIME_ZONE, message);
                    return None;
                }
                None => {
                    let message = format!("cron policy {}: unknown time zone {name}", policy.name);
                    pass.blocked(SCALING_ACTIVE, active::UNKNOWN_TIME_ZONE, message);
                    return None;
                }
            },
        };
        match Schedule::parse(&policy.schedule) {
            Ok(schedule) => parsed.push((policy, zone, schedule)),
            Err(error) => {
                let message = format!("cron policy {}: {error}", policy.name);
                pass.blocked(SCALING_ACTIVE, active::INVALID_SCHEDULE, message);
                return None;
            }
        }
    }
    pass.condition(
        SCALING_ACTIVE,
        true,
        active::CRON_POLICY_ACTIVE,
        "cron policies are in effect".into(),
    );

    let previous: BTreeMap<String, AppliedCronPolicy> = pass
        .status
        .applied_cron_policies
        .take()
        .into_iter()
        .flatten()
        .map(|a| (a.name.clone(), a))
        .collect();
    let mut applied = Vec::with_capacity(parsed.len());
    // (fire, target, index) of the winner so far.
    let mut winner: Option<(Timestamp, i32, usize, &str)> = None;
    let mut next: Option<Timestamp> = None;
    for (index, (policy, zone, schedule)) in parsed.iter().enumerate() {
        let fingerprint = (policy.schedule.clone(), policy.time_zone.clone());
        let changed = memory.schedules.get(&policy.name).is_some_and(|seen| *seen != fingerprint);
        let mut entry = match previous.get(&policy.name) {
            Some(entry) if !changed => entry.clone(),
            Some(entry) => {
                AppliedCronPolicy { observed_time: Some(pass.stamp.clone()), ..entry.clone() }
            }
            None => AppliedCronPolicy {
                name: policy.name.clone(),
                last_schedule_time: None,
                observed_time: Some(pass.stamp.clone()),
            },
        };
        let baseline = [&entry.last_schedule_time, &entry.observed_time]
            .into_iter()
            .flatten()
            .map(|t| t.0)
            .max()
            .unwrap_or(now);
        if let Some((fire, dropped)) = schedule.latest_in(zone, baseline, now, MISSED_COUNT_LIMIT) {
            entry.last_schedule_time = Some(Time(fire));
            let late = now.duration_since(fire) > LATE_FIRE;
            if dropped > 0 || late {
                let count = if dropped >= MISSED_COUNT_LIMIT {
                    format!("at least {dropped}")
                } else {
                    dropped.to_string()
                };
                pass.event(
                    EventType::Normal,
                    event_reason::MISSED_SCHEDULE,
                    format!("cron policy {} applied its fire of {fire} late; {count} earlier fires skipped", policy.name),
                );
            }
            let better = winner.is_none_or(|(t, target, _, _)| {
                fire > t || (fire == t && policy.target_replicas > target)
            });
            if better {
                winner = Some((fire, policy.target_replicas, index, &policy.name));
            }
        }
        if let Some(fire) = schedule.next_after(zone, now) {
            next = Some(next.map_or(fire, |n| n.min(fire)));
        }
        memory.schedules.insert(policy.name.clone(), fingerprint);
        applied.push(entry);
    }
    memory.schedules.retain(|name, _| parsed.iter().any(|(p, _, _)| p.name == *name));
    pass.status.applied_cron_policies = Some(applied);

    let requeue = next
        .map(|fire| crate::plan::until(now, fire).saturating_add(AFTER_FIRE).min(RESYNC))
        .unwrap_or(RESYNC);
    Some(match winner {
        Some((fire, target, _, name)) => Raw {
            replicas: i64::from(target),
            why: Some(format!("cron policy {name} fired at {fire}")),
            requeue: Some(requeue),
            held: None,
            undecided: false,
        },
        None => Raw::keep(current, requeue),
    })
}

/// The capacity part of a pass.
#[allow(clippy::too_many_arguments)]
fn plan_capacity(
    pa: &PoolAutoscaler,
    set: &SandboxSet,
    sample: Sample,
    ready_since: i32,
    pass: &mut Pass<'_>,
    memory: &mut Memory,
    settings: &Settings,
    current: i64,
) -> Raw {
    let now = sample.at;
    let Some(policy) = pa.spec.capacity_policy.as_ref() else {
        return Raw::keep(current, RESYNC);
    };
    let tolerance = policy.tolerance_or(settings.default_tolerance.clone());
    let (Some(target), Some(tolerance)) =
        (Amount::parse(&policy.target_available), Amount::parse(&tolerance))
    else {
        let message = "targetAvailable and tolerance must each be a count >= 0 or a percentage from 0% to 100%; enforcing bounds only";
        pass.condition(SCALING_ACTIVE, false, INVALID_CAPACITY_POLICY, message.into());
        return Raw::keep(current, RESYNC);
    };
    let interval = settings.sampling_interval.max(Duration::from_secs(1));

    if matches!(target, Amount::Percent(_)) && current == 0 {
        if !memory.warned_from_zero {
            memory.warned_from_zero = true;
            pass.event(
                EventType::Warning,
                event_reason::PERCENT_TARGET_FROM_ZERO,
                "a percentage targetAvailable cannot scale a pool of 0 replicas; set minReplicas to at least 1".into(),
            );
        }
    } else {
        memory.warned_from_zero = false;
    }

    // A status that lags the spec describes another pool size: skip the tick.
    let generation = set.metadata.generation.unwrap_or(0);
    let status_generation = set.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
    if status_generation < generation {
        let since = *memory.stale_since.get_or_insert(now);
        if now.duration_since(since) >= STALE_AFTER {
            let message = format!(
                "SandboxSet status is of generation {status_generation}, its spec of {generation}"
            );
            pass.condition(SCALING_ACTIVE, false, active::STALE_TARGET_STATUS, message);
        }
        return Raw::undecided(current, interval);
    }
    memory.stale_since = None;
    pass.condition(
        SCALING_ACTIVE,
        true,
        active::CAPACITY_POLICY_ACTIVE,
        "the capacity policy is in effect".into(),
    );

    let half = SignedDuration::try_from(interval / 2).unwrap_or(SignedDuration::ZERO);
    if let Some(last) = memory.samples.last()
        && now.duration_since(last.at) < half
    {
        let next = last.at.checked_add(interval).unwrap_or(now);
        return Raw::undecided(current, crate::plan::until(now, next).max(Duration::from_secs(1)));
    }
    memory.samples.push(sample);
    let window = SignedDuration::try_from(settings.observation_window.max(interval))
        .unwrap_or(SignedDuration::MAX);
    let oldest = now.checked_sub(window).unwrap_or(Timestamp::MIN);
    memory.samples.retain(|s| s.at > oldest);
    let n = memory.samples.len().max(1) as f64;
    let obs_avg = memory.samples.iter().map(|s| f64::from(s.observed)).sum::<f64>() / n;
    let avail_avg = memory.samples.iter().map(|s| f64::from(s.available)).sum::<f64>() / n;

    let mut own_inflight = 0.0;
    if let Some(pending) = &pass.status.pending_scale_up {
        let settle =
            SignedDuration::try_from(settings.settle_timeout).unwrap_or(SignedDuration::MAX);
        if ready_since >= pending.replicas || now.duration_since(pending.start_time.0) >= settle {
            pass.status.pending_scale_up = None;
        } else {
            let creating = (obs_avg - avail_avg).max(0.0);
            own_inflight = creating.min(f64::from(pending.replicas - ready_since)).max(0.0);
        }
    }

    let band = Band::new(target, tolerance, current);
    let rec = band.recommend(current, obs_avg, avail_avg, own_inflight);
    let why = if avail_avg < band.lower as f64 {
        Some(format!("available {} below lower watermark {}", round2(avail_avg), band.lower))
    } else if avail_avg > band.upper as f64 {
        Some(format!("available {} above upper watermark {}", round2(avail_avg), band.upper))
    } else {
        None
    };
    if memory.seed {
        memory.history = vec![Recommendation { at: now, replicas: current }];
        memory.seed = false;
    }
    let up = Duration::from_secs(u64::try_from(policy.scale_up_window_seconds()).unwrap_or(0));
    let down = Duration::from_secs(u64::try_from(policy.scale_down_window_seconds()).unwrap_or(0));
    let (replicas, held) = stabilize(&mut memory.history, current, rec, up, down, now);
    Raw { replicas, why, requeue: Some(interval), held, undecided: false }
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// The status and event of a failed read of the target: `AbleToScale=False/FailedGetScale`
/// and a `FailedGetScale` warning (once per transition).
pub fn plan_failed_get(pa: &PoolAutoscaler, error: &str, now: Timestamp) -> Plan<AutoscalerAction> {
    plan_failure(
        pa,
        able::FAILED_GET_SCALE,
        event_reason::FAILED_GET_SCALE,
        format!("cannot read the target: {error}"),
        now,
    )
}

/// The status and event of a failed write of the target's replicas:
/// `AbleToScale=False/FailedUpdateScale` and a `FailedRescale` warning.
pub fn plan_failed_rescale(
    pa: &PoolAutoscaler,
    error: &str,
    now: Timestamp,
) -> Plan<AutoscalerAction> {
    plan_failure(
        pa,
        able::FAILED_UPDATE_SCALE,
        event_reason::FAILED_RESCALE,
        format!("cannot rescale the target: {error}"),
        now,
    )
}

fn plan_failure(
    pa: &PoolAutoscaler,
    reason: &str,
    event: &'static str,
    message: String,
    now: Timestamp,
) -> Plan<AutoscalerAction> {
    let before = pa.status.clone().unwrap_or_default();
    let mut pass = Pass {
        before: &before,
        status: before.clone(),
        events: Vec::new(),
        stamp: whole_seconds(now),
        generation: pa.metadata.generation,
    };
    if pass.condition(ABLE_TO_SCALE, false, reason, message.clone()) {
        pass.event(EventType::Warning, event, message);
    }
    pass.finish(None, None)
}

/// Why a PoolAutoscaler reconcile failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AutoscalerError {
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Writing the target's replicas failed.
    #[error("rescale: {0}")]
    Rescale(StoreError),
}

/// Applies `plan` and returns the runtime's next step.
///
/// The scale is a replace of the SandboxSet `set` as read, carrying its `resourceVersion`,
/// that differs from it only in `spec.replicas`: the store's equivalent of an update of the
/// scale subresource. A conflict (the SandboxSet changed since it was read) plans again at
/// once, from the newer object, and skips the rest of the plan.
///
/// # Errors
///
/// [`AutoscalerError::Rescale`] when the scale fails for another reason than a lost race or a
/// deleted target (the rest of the plan is skipped: its status assumed the scale),
/// [`AutoscalerError::Store`] when a status write does.
pub async fn execute<S: Store>(
    store: &S,
    recorder: &EventRecorder,
    pa: &PoolAutoscaler,
    set: Option<&SandboxSet>,
    plan: &Plan<AutoscalerAction>,
) -> Result<Action, AutoscalerError> {
    let namespace = pa.metadata.namespace.clone().unwrap_or_default();
    for action in &plan.actions {
        match action {
            AutoscalerAction::Scale { from, to } => {
                let Some(set) = set else { continue };
                let mut update = set.clone();
                update.spec.replicas = *to;
                match store.update(&namespace, &update).await {
                    Ok(_) => info!(
                        autoscaler = ?pa.metadata.name, target = ?set.metadata.name, from, to,
                        "pool rescaled"
                    ),
                    Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
                        debug!("target changed before the rescale; planning again");
                        return Ok(Action::requeue_after(Duration::ZERO));
                    }
                    Err(error) => return Err(AutoscalerError::Rescale(error)),
                }
            }
            AutoscalerAction::Event { type_, reason, message } => {
                recorder.record(pa, *type_, reason, message);
            }
            AutoscalerAction::UpdateStatus(status) => {
                let mut update = pa.clone();
                update.status = Some((**status).clone());
                match store.update_status(&namespace, &update).await {
                    Ok(_) => {}
                    Err(StoreError::NotFound { .. }) => return Ok(Action::await_change()),
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }
    Ok(plan.next_action())
}

/// What the autoscaler reconciler reads and keeps.
pub struct AutoscalerContext<S: Store> {
    /// Where targets are read and written.
    pub store: S,
    /// The autoscalers (the controller's own cache), for the one-per-target rule.
    pub autoscalers: Cache<PoolAutoscaler>,
    /// Where events go.
    pub recorder: EventRecorder,
    /// Where `now` comes from.
    pub clock: Clock,
    /// The controller-wide settings.
    pub settings: Settings,
    /// Each autoscaler's memory.
    pub memory: Mutex<HashMap<ObjectKey, Memory>>,
    /// Where reconciles are counted and timed (`pool_autoscaler_*`).
    pub metrics: Option<Arc<crate::metrics::ControllerMetrics>>,
}

impl<S: Store> std::fmt::Debug for AutoscalerContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AutoscalerContext")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The oldest other autoscaler of `pa`'s namespace with the same target (creation time, then
/// name), if it is older than `pa`.
pub fn older_autoscaler<'a>(
    pa: &PoolAutoscaler,
    others: &'a [Arc<PoolAutoscaler>],
) -> Option<&'a str> {
    let rank = |p: &PoolAutoscaler| {
        (
            p.metadata.creation_timestamp.as_ref().map_or(Timestamp::MAX, |t| t.0),
            p.metadata.name.clone().unwrap_or_default(),
        )
    };
    let own = rank(pa);
    others
        .iter()
        .filter(|o| o.metadata.uid != pa.metadata.uid || o.metadata.name != pa.metadata.name)
        .filter(|o| o.spec.scale_target_ref.name == pa.spec.scale_target_ref.name)
        .filter(|o| rank(o) < own)
        .min_by_key(|o| rank(o))
        .and_then(|o| o.metadata.name.as_deref())
}

/// Reconciles one PoolAutoscaler: read the target and what the guard needs,
/// [`plan_pool_autoscaler`], [`execute`].
///
/// # Errors
///
/// [`AutoscalerError`] from the store.
pub async fn reconcile_pool_autoscaler<S: Store>(
    pa: Arc<PoolAutoscaler>,
    ctx: Arc<AutoscalerContext<S>>,
) -> Result<Action, AutoscalerError> {
    let started = std::time::Instant::now();
    let mut scaled = "none";
    let result = reconcile_once(pa, &ctx, &mut scaled).await;
    if let Some(metrics) = &ctx.metrics {
        metrics.policy.autoscaler_reconciled(scaled, result.is_err(), started.elapsed());
    }
    result
}

/// One reconcile; `scaled` becomes `scale_up` or `scale_down` when the plan rescales its pool.
async fn reconcile_once<S: Store>(
    pa: Arc<PoolAutoscaler>,
    ctx: &AutoscalerContext<S>,
    scaled: &mut &'static str,
) -> Result<Action, AutoscalerError> {
    let namespace = pa.metadata.namespace.clone().unwrap_or_default();
    let key = ObjectKey::of(pa.as_ref());
    let now = ctx.clock.now();
    let reference = &pa.spec.scale_target_ref;
    let set = if is_valid_target(reference) && !pa.spec.suspend {
        match ctx.store.get::<SandboxSet>(&namespace, &reference.name).await {
            Ok(set) => Some(set),
            Err(StoreError::NotFound { .. }) => None,
            Err(error) => {
                let plan = plan_failed_get(&pa, &error.to_string(), now);
                execute(&ctx.store, &ctx.recorder, &pa, None, &plan).await?;
                return Err(error.into());
            }
        }
    } else {
        None
    };
    let pending = pa.status.as_ref().and_then(|s| s.pending_scale_up.as_ref());
    let ready = match (&set, pending) {
        (Some(_), Some(pending)) => {
            let selector = Selector::new(vec![Requirement::Equals(
                labels::SANDBOX_POOL.into(),
                reference.name.clone(),
            )]);
            let sandboxes = ctx.store.list::<Sandbox>(Some(&namespace), &selector).await?.items;
            ready_since(&sandboxes, &reference.name, pending.start_time.0, now)
        }
        _ => 0,
    };
    let siblings = ctx.autoscalers.list_namespace(&namespace);
    let older = older_autoscaler(&pa, &siblings);
    let zones = load_zones(&pa);
    let target = match &set {
        Some(set) => Target::Found { set, ready_since: ready },
        None => Target::NotFound,
    };
    let observed = Observed { autoscaler: &pa, target, older, zones: &zones };
    let memory = ctx.memory.lock().ok().and_then(|m| m.get(&key).cloned()).unwrap_or_default();
    let planned = plan_pool_autoscaler(&observed, &memory, &ctx.settings, now);
    if let Ok(mut all) = ctx.memory.lock() {
        all.insert(key, planned.memory);
    }
    for action in &planned.plan.actions {
        if let AutoscalerAction::Scale { from, to } = action {
            *scaled = if to > from { "scale_up" } else { "scale_down" };
        }
    }
    match execute(&ctx.store, &ctx.recorder, &pa, set.as_ref(), &planned.plan).await {
        Err(AutoscalerError::Rescale(error)) => {
            let plan = plan_failed_rescale(&pa, &error.to_string(), now);
            execute(&ctx.store, &ctx.recorder, &pa, None, &plan).await?;
            Err(AutoscalerError::Rescale(error))
        }
        result => result,
    }
}

/// Builds the PoolAutoscaler controller over `informers` (shared, or a store for its own):
/// autoscalers are the primary kind; a change of a SandboxSet wakes the autoscalers that target it;
/// a deleted autoscaler's memory is dropped.
pub fn pool_autoscaler_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    settings: Settings,
    recorder: EventRecorder,
) -> (Controller<PoolAutoscaler, S>, Arc<AutoscalerContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller =
        Controller::<PoolAutoscaler, S>::shared("poolautoscaler", &informers, config.runner);
    let autoscalers = controller.cache();
    let ctx = Arc::new(AutoscalerContext {
        store: store.clone(),
        autoscalers: autoscalers.clone(),
        recorder,
        clock,
        settings,
        memory: Mutex::new(HashMap::new()),
        metrics: config.metrics.clone(),
    });
    if let Some(metrics) = &config.metrics {
        metrics.watch_autoscalers(autoscalers.clone());
    }
    let forget = Arc::clone(&ctx);
    let controller = controller
        .watches_shared(informers.all::<SandboxSet>(), move |set: &SandboxSet| {
            let namespace = set.metadata.namespace.clone().unwrap_or_default();
            let name = set.metadata.name.as_deref().unwrap_or_default();
            autoscalers
                .list_namespace(&namespace)
                .iter()
                .filter(|pa| pa.spec.scale_target_ref.name == name)
                .map(|pa| ObjectKey::of(pa.as_ref()))
                .collect()
        })
        .on_delete(move |pa: &PoolAutoscaler| {
            if let Ok(mut all) = forget.memory.lock() {
                all.remove(&ObjectKey::of(pa));
            }
        });
    (controller, ctx)
}

/// Runs the PoolAutoscaler controller until `shutdown` resolves.
pub async fn run_pool_autoscaler_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let informers: Informers<S> = informers.into();
    let recorder = EventRecorder::spawn(informers.store().clone(), "poolautoscaler-controller");
    let (controller, ctx) =
        pool_autoscaler_controller(informers, config, clock, settings, recorder);
    controller
        .shutdown_on(shutdown)
        .run(reconcile_pool_autoscaler, oka_cache::default_error_policy, ctx)
        .await;
}

#[cfg(test)]
mod tests;
