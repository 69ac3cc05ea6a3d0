//! The AutoPausePolicy decisions (oka extension, seed-extensions §2.5), pure: what the sandbox
//! planner does with a sandbox's probe conditions.
//!
//! # Rules
//!
//! - **Mode 2** (no `autoPausePolicy`): nothing; the probe runner only reports conditions.
//! - **Invalid policy** (the pause rule names no probe of the spec, or the resume rule names one
//!   that is not external): `AutoPaused=False/InvalidPolicy`, no action.
//! - **Pause** (mode 1) when all hold: not deleting, `spec.paused` false, phase Running with
//!   `Ready=True`, not controlled by a SandboxSet; the pause probe's condition has the rule's
//!   status; `now − max(its lastTransitionTime, Ready's) ≥ forSeconds`; `now − Ready's
//!   lastTransitionTime ≥ minRunningSeconds`; no `shutdownTime` reached. The write is the
//!   timers' own (`spec.paused: true`, with the paused-retention rule), plus the marker
//!   `agents.kruise.io/paused-by: auto-pause-policy`, so the gateway wakes the sandbox on its
//!   next request as it does for a timer pause.
//! - **Resume** when all hold: a resume rule; `spec.paused` true, phase Paused,
//!   `SandboxPaused=True`; scope `AnyPause`, or the marker present; the resume probe's condition
//!   has the rule's status for `forSeconds` since the later of its transition and
//!   `SandboxPaused`'s; `minPausedSeconds` since `SandboxPaused`'s transition; no
//!   `shutdownTime` reached. The write: `spec.paused: false`, the marker removed, a reached
//!   `pauseTime` cleared (else the timer would pause it again at once).
//! - **`AutoPaused`**: `True/ProbeDriven` while paused with the marker; `False/ManualOverride`
//!   (and the marker removed) when `spec.paused` is false but the marker is still there (a user
//!   resumed it); `False/AutoResumed` once a sandbox it paused runs again without the marker
//!   (the resume rule's write or the gateway's wake, which removes the marker).
//! - **Flapping**: the probe thresholds, the hold times measured from the later of the
//!   condition's and Ready's (or SandboxPaused's) transitions, so a resumed sandbox has
//!   `minRunningSeconds` before it can be paused again, and in-sandbox probe conditions reset to
//!   `Unknown` across a pause (the runner's rule), so their hold restarts after a resume.
//! - The planner asks to be called again when the nearest hold ends.
//!
//! # Where oka differs from the proposal, and why
//!
//! - No per-sandbox action budget (`--auto-pause-max-actions-per-hour`, `RateLimited`) yet; the
//!   hold times and `minRunningSeconds`/`minPausedSeconds` are the protection.
//! - No `AutoPaused`/`AutoResumed` Events yet (the sandbox's phase Events still tell the pause).
//! - The write is an update with the sandbox's resourceVersion as precondition (the store's
//!   compare-and-swap), not a merge patch: the same guarantee.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use oka_api::conditions::sandbox::{AUTO_PAUSED, PAUSED, READY, auto_paused_reason};
use oka_api::conditions::{FALSE, TRUE};
use oka_api::probes::{AutoPausePolicy, ResumeScope, SandboxProbe, probe_condition_type};
use oka_api::{Sandbox, SandboxPhase, SandboxStatus, annotations};

/// What the policy asks of the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing now.
    Nothing,
    /// Nothing now; decide again after this long (a hold ends).
    Wait(Duration),
    /// Pause the sandbox.
    Pause,
    /// Resume the sandbox.
    Resume,
}

/// The policy's decision and what it says in `AutoPaused`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The action.
    pub decision: Decision,
    /// `AutoPaused` as (status, reason, message), when it should be set.
    pub condition: Option<(&'static str, &'static str, String)>,
    /// Remove the `paused-by` marker (a user resumed a policy-paused sandbox).
    pub clear_marker: bool,
}

fn marker(sandbox: &Sandbox) -> bool {
    sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::PAUSED_BY))
        .is_some_and(|v| v == annotations::PAUSED_BY_AUTO_PAUSE_POLICY)
}

fn secs(n: i32) -> SignedDuration {
    SignedDuration::from_secs(i64::from(n.max(0)))
}

/// What is still missing of `hold` since `since`, or `None` when it is over.
fn remaining(since: Timestamp, hold: SignedDuration, now: Timestamp) -> Option<Duration> {
    let end = since.saturating_add(hold).unwrap_or(Timestamp::MAX);
    (end > now).then(|| Duration::try_from(end.duration_since(now)).unwrap_or(Duration::ZERO))
}

/// Why `policy` cannot be applied to `probes`, if it cannot.
pub fn invalid(policy: &AutoPausePolicy, probes: &[SandboxProbe]) -> Option<String> {
    if !probes.iter().any(|p| p.name == policy.pause.probe_name) {
        return Some(format!("pause.probeName {:?} names no probe", policy.pause.probe_name));
    }
    if let Some(resume) = &policy.resume
        && !probes.iter().any(|p| p.name == resume.probe_name && p.is_external())
    {
        return Some(format!("resume.probeName {:?} names no external probe", resume.probe_name));
    }
    None
}

/// The policy's step for `sandbox`, whose status the planner is drafting as `status`, at `now`
/// (see the module rules).
pub fn decide(
    sandbox: &Sandbox,
    policy: Option<&AutoPausePolicy>,
    probes: &[SandboxProbe],
    status: &SandboxStatus,
    now: Timestamp,
) -> Step {
    let nothing = Step { decision: Decision::Nothing, condition: None, clear_marker: false };
    let Some(policy) = policy else { return nothing };
    if sandbox.metadata.deletion_timestamp.is_some() {
        return nothing;
    }
    if let Some(why) = invalid(policy, probes) {
        return Step {
            condition: Some((FALSE, auto_paused_reason::INVALID_POLICY, why)),
            ..nothing
        };
    }
    let paused = sandbox.is_paused();
    let marked = marker(sandbox);
    let auto_paused_true = status.condition(AUTO_PAUSED).is_some_and(|c| c.status == TRUE);
    let mut step = nothing;
    if !paused && marked {
        step.clear_marker = true;
        let message = "spec.paused was set to false by someone else".to_owned();
        step.condition = Some((FALSE, auto_paused_reason::MANUAL_OVERRIDE, message));
        return step;
    }
    if paused && marked {
        let message =
            format!("paused by the auto-pause policy (probe {})", policy.pause.probe_name);
        step.condition = Some((TRUE, auto_paused_reason::PROBE_DRIVEN, message));
    }
    if !paused && auto_paused_true {
        let message = "the sandbox was resumed".to_owned();
        step.condition = Some((FALSE, auto_paused_reason::AUTO_RESUMED, message));
    }
    let shutdown_reached = sandbox.spec.shutdown_time.as_ref().is_some_and(|t| t.0 <= now);
    if shutdown_reached || sandbox.is_controlled_by_sandbox_set() {
        return step;
    }
    let phase = status.phase.as_ref();
    if !paused && phase == Some(&SandboxPhase::Running) {
        let Some(ready) = status.condition(READY).filter(|c| c.status == TRUE) else {
            return step;
        };
        let ready_at = ready.last_transition_time.0;
        let rule = &policy.pause;
        let Some(probe) = status.condition(&probe_condition_type(&rule.probe_name)) else {
            return step;
        };
        if probe.status != rule.status.as_str() {
            return step;
        }
        let held_since = probe.last_transition_time.0.max(ready_at);
        let waits = [
            remaining(held_since, secs(rule.for_seconds), now),
            remaining(ready_at, secs(policy.min_running_seconds), now),
        ];
        step.decision = match waits.into_iter().flatten().max() {
            Some(wait) => Decision::Wait(wait),
            None => Decision::Pause,
        };
        return step;
    }
    if let Some(rule) = &policy.resume
        && paused
        && phase == Some(&SandboxPhase::Paused)
        && (marked || rule.scope == ResumeScope::AnyPause)
    {
        let Some(done) = status.condition(PAUSED).filter(|c| c.status == TRUE) else {
            return step;
        };
        let paused_at = done.last_transition_time.0;
        let Some(probe) = status.condition(&probe_condition_type(&rule.probe_name)) else {
            return step;
        };
        if probe.status != rule.status.as_str() {
            return step;
        }
        let held_since = probe.last_transition_time.0.max(paused_at);
        let waits = [
            remaining(held_since, secs(rule.for_seconds), now),
            remaining(paused_at, secs(policy.min_paused_seconds), now),
        ];
        step.decision = match waits.into_iter().flatten().max() {
            Some(wait) => Decision::Wait(wait),
            None => Decision::Resume,
        };
    }
    step
}
