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
//! - **Flapping**, in layers: the probe thresholds (the runner's `successThreshold` /
//!   `failureThreshold`); the hold times measured from the later of the condition's and
//!   Ready's (or SandboxPaused's) transitions, so a resumed sandbox has `minRunningSeconds`
//!   before it can be paused again and a paused one `minPausedSeconds` before it is resumed;
//!   in-sandbox probe conditions reset to `Unknown` across a pause (the runner's rule), so
//!   their hold restarts after a resume; and a per-sandbox **action budget** ([`Budget`]): at
//!   most `max_per_hour` pauses and resumes by the policy in any hour (`oka serve`'s
//!   `controllers.autoPauseMaxActionsPerHour`, default 20, 0 = unlimited). A pause or resume
//!   the budget refuses is `AutoPaused=False/RateLimited` (Event `AutoPauseRateLimited`), and
//!   the planner looks again when the oldest action of the hour leaves it.
//! - The planner asks to be called again when the nearest hold ends.
//!
//! # Where oka differs from the proposal, and why
//!
//! - The budget counts the actions this controller made since it started (kept in memory,
//!   [`ActionLog`]): a restart forgets them, as the proposal's in-memory leader state does.
//! - The write is an update with the sandbox's resourceVersion as precondition (the store's
//!   compare-and-swap), not a merge patch: the same guarantee.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use oka_api::conditions::sandbox::{AUTO_PAUSED, PAUSED, READY, auto_paused_reason};
use oka_api::conditions::{FALSE, TRUE};
use oka_api::probes::{AutoPausePolicy, ResumeScope, SandboxProbe, probe_condition_type};
use oka_api::{Sandbox, SandboxPhase, SandboxStatus, annotations};

/// How long an action stays in the budget's window.
pub const BUDGET_WINDOW: SignedDuration = SignedDuration::from_hours(1);

/// The per-sandbox action budget the policy decides within: the times of its recent pauses and
/// resumes of the sandbox and how many an hour allows (0: unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget<'a> {
    /// The policy's pauses and resumes of this sandbox (older ones may be included; only
    /// those within [`BUDGET_WINDOW`] of `now` count).
    pub recent: &'a [Timestamp],
    /// The most actions in any hour; 0 means no budget.
    pub max_per_hour: u32,
}

impl Budget<'_> {
    /// `None` while another action fits at `now`, else how long until one does (the oldest
    /// action of the window leaves it).
    pub fn exhausted(&self, now: Timestamp) -> Option<Duration> {
        if self.max_per_hour == 0 {
            return None;
        }
        let start = now.saturating_sub(BUDGET_WINDOW).unwrap_or(Timestamp::MIN);
        let mut within: Vec<Timestamp> =
            self.recent.iter().copied().filter(|t| *t > start && *t <= now).collect();
        if within.len() < self.max_per_hour as usize {
            return None;
        }
        within.sort();
        // Room for one more once the oldest `len - max + 1` have left the window.
        let leaving = within[within.len() - self.max_per_hour as usize];
        remaining(leaving, BUDGET_WINDOW, now).or(Some(Duration::from_secs(1)))
    }
}

/// The times of the policy's actions per sandbox (by uid), kept in memory by the controller
/// for the [`Budget`]; entries older than [`BUDGET_WINDOW`] are dropped as they are read.
#[derive(Debug, Default)]
pub struct ActionLog {
    actions: std::sync::Mutex<std::collections::HashMap<String, Vec<Timestamp>>>,
}

impl ActionLog {
    /// The actions on `uid` within the window before `now`.
    pub fn recent(&self, uid: &str, now: Timestamp) -> Vec<Timestamp> {
        let start = now.saturating_sub(BUDGET_WINDOW).unwrap_or(Timestamp::MIN);
        let mut actions = self.actions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(times) = actions.get_mut(uid) else { return Vec::new() };
        times.retain(|t| *t > start);
        if times.is_empty() {
            actions.remove(uid);
            return Vec::new();
        }
        times.clone()
    }

    /// Records an action on `uid` at `at`.
    pub fn record(&self, uid: &str, at: Timestamp) {
        let mut actions = self.actions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        actions.entry(uid.to_owned()).or_default().push(at);
    }

    /// Forgets `uid` (its sandbox is gone).
    pub fn forget(&self, uid: &str) {
        self.actions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(uid);
    }
}

/// The step of an action the budget refuses, or `decision` when it allows it.
fn within_budget(mut step: Step, decision: Decision, budget: &Budget<'_>, now: Timestamp) -> Step {
    match budget.exhausted(now) {
        None => step.decision = decision,
        Some(wait) => {
            let what = if decision == Decision::Pause { "pause" } else { "resume" };
            let message = format!(
                "the auto-pause policy may act at most {} times an hour on a sandbox; its next \
                 {what} waits {}s",
                budget.max_per_hour,
                wait.as_secs().max(1)
            );
            step.condition = Some((FALSE, auto_paused_reason::RATE_LIMITED, message));
            step.decision = Decision::Wait(wait);
        }
    }
    step
}

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
    budget: &Budget<'_>,
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
        return match waits.into_iter().flatten().max() {
            Some(wait) => Step { decision: Decision::Wait(wait), ..step },
            None => within_budget(step, Decision::Pause, budget, now),
        };
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
        return match waits.into_iter().flatten().max() {
            Some(wait) => Step { decision: Decision::Wait(wait), ..step },
            None => within_budget(step, Decision::Resume, budget, now),
        };
    }
    step
}
