//! The derived state of a sandbox: `creating`, `available`, `running`, `paused` or `dead`.
//!
//! Pools count `creating + available` members, claims pick `available` ones, the E2B API shows
//! `running`/`paused`, and `dead` sandboxes are cleaned up. The rules are the reference's
//! `GetSandboxState`, evaluated in order; the first that matches decides:
//!
//! | # | Condition | State | Reason |
//! |---|---|---|---|
//! | 1 | `deletionTimestamp` set | dead | `ResourceDeleted` |
//! | 2 | `spec.shutdownTime` before now | dead | `ShutdownTimeReached` |
//! | 3 | phase `Pending` | creating | `ResourcePending` |
//! | 4 | phase `Succeeded` / `Failed` / `Terminating` | dead | `ResourceSucceeded` / `ResourceFailed` / `ResourceTerminating` |
//! | 5 | controlled by a SandboxSet, `Ready=True` | available | `ResourceControlledBySbsAndReady` |
//! | 6 | controlled by a SandboxSet, not Ready | creating | `ResourceControlledBySbsButNotReady` |
//! | 7 | phase `Running`, `spec.paused` | paused | `RunningResourceClaimedAndPaused` |
//! | 8 | phase `Running`, `Ready=True` | running | `RunningResourceClaimedAndReady` |
//! | 9 | phase `Running`, not Ready | dead | `RunningResourceClaimedButNotReady` |
//! | 10 | any other phase (Paused, Resuming, Upgrading, Recycling, empty, unknown) | paused | `NotRunningResourceClaimed` |
//!
//! "Controlled by a SandboxSet" means the first ownerReference with `controller: true` has kind
//! `SandboxSet` and apiVersion exactly `agents.kruise.io/v1alpha1`. Like the reference, an empty
//! phase is not treated as Pending here (the controller writes Pending first thing).

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::sandbox::{Sandbox, SandboxPhase};

/// The derived state of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Being created: pending, or a pool member that is not ready yet.
    Creating,
    /// A ready pool member that can be claimed.
    Available,
    /// Claimed (or created directly), running and ready.
    Running,
    /// Claimed and paused, pausing, resuming, upgrading or being returned to the pool.
    Paused,
    /// Deleted, past its shutdown time, finished, or claimed and running but not ready.
    Dead,
}

impl SandboxState {
    /// Every state.
    pub const ALL: [SandboxState; 5] = [
        SandboxState::Creating,
        SandboxState::Available,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Dead,
    ];

    /// The reference's string for the state.
    pub const fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Available => "available",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Dead => "dead",
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which rule decided the state; [`StateReason::as_str`] is the reference's reason string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateReason {
    /// Rule 1.
    ResourceDeleted,
    /// Rule 2.
    ShutdownTimeReached,
    /// Rule 3.
    ResourcePending,
    /// Rule 4, `Succeeded`.
    ResourceSucceeded,
    /// Rule 4, `Failed`.
    ResourceFailed,
    /// Rule 4, `Terminating`.
    ResourceTerminating,
    /// Rule 5.
    ResourceControlledBySbsAndReady,
    /// Rule 6.
    ResourceControlledBySbsButNotReady,
    /// Rule 7.
    RunningResourceClaimedAndPaused,
    /// Rule 8.
    RunningResourceClaimedAndReady,
    /// Rule 9.
    RunningResourceClaimedButNotReady,
    /// Rule 10.
    NotRunningResourceClaimed,
}

impl StateReason {
    /// The reference's reason string.
    pub const fn as_str(self) -> &'static str {
        match self {
            StateReason::ResourceDeleted => "ResourceDeleted",
            StateReason::ShutdownTimeReached => "ShutdownTimeReached",
            StateReason::ResourcePending => "ResourcePending",
            StateReason::ResourceSucceeded => "ResourceSucceeded",
            StateReason::ResourceFailed => "ResourceFailed",
            StateReason::ResourceTerminating => "ResourceTerminating",
            StateReason::ResourceControlledBySbsAndReady => "ResourceControlledBySbsAndReady",
            StateReason::ResourceControlledBySbsButNotReady => "ResourceControlledBySbsButNotReady",
            StateReason::RunningResourceClaimedAndPaused => "RunningResourceClaimedAndPaused",
            StateReason::RunningResourceClaimedAndReady => "RunningResourceClaimedAndReady",
            StateReason::RunningResourceClaimedButNotReady => "RunningResourceClaimedButNotReady",
            StateReason::NotRunningResourceClaimed => "NotRunningResourceClaimed",
        }
    }
}

impl fmt::Display for StateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A derived state and the rule that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DerivedState {
    /// The state.
    pub state: SandboxState,
    /// Why.
    pub reason: StateReason,
}

/// Whether a kill handed `sandbox` back to its pool: `agents.kruise.io/cleanup` (or `reuse`) is
/// set on a sandbox whose template enables recycling (`cleanup-enabled` or `reuse-enabled`).
/// The sandbox controller then recycles it; for its user it is gone, as a deleted one.
pub fn recycle_requested(sandbox: &Sandbox) -> bool {
    use crate::annotations;
    let notes = sandbox.metadata.annotations.as_ref();
    let on = |key: &str| notes.and_then(|a| a.get(key)).is_some_and(|v| v == "true");
    (on(annotations::CLEANUP) || on(annotations::REUSE))
        && (on(annotations::CLEANUP_ENABLED) || on(annotations::REUSE_ENABLED))
}

/// Derives the state of `sandbox` at `now` (see the module documentation for the rules).
pub fn sandbox_state(sandbox: &Sandbox, now: Timestamp) -> DerivedState {
    use SandboxState::*;
    use StateReason::*;
    let derived = |state, reason| DerivedState { state, reason };

    if sandbox.metadata.deletion_timestamp.is_some() {
        return derived(Dead, ResourceDeleted);
    }
    if sandbox.spec.shutdown_time.as_ref().is_some_and(|t| t.0 < now) {
        return derived(Dead, ShutdownTimeReached);
    }
    let phase = sandbox.phase();
    match phase {
        Some(SandboxPhase::Pending) => return derived(Creating, ResourcePending),
        Some(SandboxPhase::Succeeded) => return derived(Dead, ResourceSucceeded),
        Some(SandboxPhase::Failed) => return derived(Dead, ResourceFailed),
        Some(SandboxPhase::Terminating) => return derived(Dead, ResourceTerminating),
        _ => {}
    }
    let ready = sandbox.is_ready();
    if sandbox.is_controlled_by_sandbox_set() {
        return if ready {
            derived(Available, ResourceControlledBySbsAndReady)
        } else {
            derived(Creating, ResourceControlledBySbsButNotReady)
        };
    }
    if phase == Some(&SandboxPhase::Running) {
        if sandbox.is_paused() {
            derived(Paused, RunningResourceClaimedAndPaused)
        } else if ready {
            derived(Running, RunningResourceClaimedAndReady)
        } else {
            derived(Dead, RunningResourceClaimedButNotReady)
        }
    } else {
        derived(Paused, NotRunningResourceClaimed)
    }
}

#[cfg(test)]
mod tests {
    use jiff::{SignedDuration, Timestamp};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;
    use crate::sandbox::SandboxPhase as P;
    use crate::testing::SandboxBuilder;

    const NOW: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    #[track_caller]
    fn check(fixture: SandboxBuilder, expected: (SandboxState, &str)) {
        let sandbox = fixture.build();
        let got = sandbox_state(&sandbox, now());
        assert_eq!((got.state, got.reason.as_str()), expected, "{sandbox:#?}");
    }

    use SandboxState::{Available, Creating, Dead, Paused, Running};

    // Rule 1: deletion wins over everything.
    #[test]
    fn deleting_is_dead() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running).ready().deleting(),
            (Dead, "ResourceDeleted"),
        );
    }

    #[test]
    fn deleting_claimed_running_is_dead() {
        check(
            Sandbox::test().claimed().phase(P::Running).ready().deleting(),
            (Dead, "ResourceDeleted"),
        );
    }

    // Rule 2.
    #[test]
    fn past_shutdown_time_is_dead() {
        let past = now() - SignedDuration::from_secs(1);
        check(
            Sandbox::test().claimed().phase(P::Running).ready().shutdown_at(past),
            (Dead, "ShutdownTimeReached"),
        );
    }

    #[test]
    fn past_shutdown_time_wins_over_pending() {
        let past = now() - SignedDuration::from_secs(60);
        check(Sandbox::test().phase(P::Pending).shutdown_at(past), (Dead, "ShutdownTimeReached"));
    }

    #[test]
    fn shutdown_time_equal_to_now_is_not_reached() {
        check(
            Sandbox::test().claimed().phase(P::Running).ready().shutdown_at(now()),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    #[test]
    fn future_shutdown_time_is_ignored() {
        let future = now() + SignedDuration::from_secs(1);
        check(
            Sandbox::test().claimed().phase(P::Running).ready().shutdown_at(future),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    // Rule 3.
    #[test]
    fn pending_is_creating() {
        check(Sandbox::test().phase(P::Pending), (Creating, "ResourcePending"));
    }

    #[test]
    fn pending_pool_member_is_creating_by_phase() {
        check(
            Sandbox::test().pooled("pool").phase(P::Pending).ready(),
            (Creating, "ResourcePending"),
        );
    }

    // Rule 4.
    #[test]
    fn succeeded_is_dead() {
        check(
            Sandbox::test().pooled("pool").phase(P::Succeeded).ready(),
            (Dead, "ResourceSucceeded"),
        );
    }

    #[test]
    fn failed_is_dead() {
        check(Sandbox::test().claimed().phase(P::Failed), (Dead, "ResourceFailed"));
    }

    #[test]
    fn terminating_is_dead() {
        check(Sandbox::test().claimed().phase(P::Terminating), (Dead, "ResourceTerminating"));
    }

    // Rules 5 and 6.
    #[test]
    fn ready_pool_member_is_available() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running).ready(),
            (Available, "ResourceControlledBySbsAndReady"),
        );
    }

    #[test]
    fn unready_pool_member_is_creating() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running).not_ready(),
            (Creating, "ResourceControlledBySbsButNotReady"),
        );
    }

    #[test]
    fn pool_member_without_conditions_is_creating() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running),
            (Creating, "ResourceControlledBySbsButNotReady"),
        );
    }

    #[test]
    fn paused_flag_does_not_matter_for_pool_members() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running).ready().paused(),
            (Available, "ResourceControlledBySbsAndReady"),
        );
    }

    #[test]
    fn pool_member_in_other_phase_follows_readiness() {
        check(
            Sandbox::test().pooled("pool").phase(P::Recycling).ready(),
            (Available, "ResourceControlledBySbsAndReady"),
        );
        check(
            Sandbox::test().pooled("pool").phase(P::Upgrading).not_ready(),
            (Creating, "ResourceControlledBySbsButNotReady"),
        );
    }

    #[test]
    fn pool_member_with_empty_phase() {
        check(
            Sandbox::test().pooled("pool").ready(),
            (Available, "ResourceControlledBySbsAndReady"),
        );
    }

    #[test]
    fn ready_condition_must_be_exactly_true() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running).condition("Ready", "Unknown"),
            (Creating, "ResourceControlledBySbsButNotReady"),
        );
        check(
            Sandbox::test().pooled("pool").phase(P::Running).condition("Ready", "true"),
            (Creating, "ResourceControlledBySbsButNotReady"),
        );
    }

    #[test]
    fn other_true_conditions_are_not_ready() {
        check(
            Sandbox::test().pooled("pool").phase(P::Running).condition("SandboxResumed", "True"),
            (Creating, "ResourceControlledBySbsButNotReady"),
        );
    }

    // What counts as "controlled by a SandboxSet".
    #[test]
    fn non_controller_sandboxset_owner_is_claimed() {
        check(
            Sandbox::test().owner(sandboxset_owner("pool", None)).phase(P::Running).ready(),
            (Running, "RunningResourceClaimedAndReady"),
        );
        check(
            Sandbox::test().owner(sandboxset_owner("pool", Some(false))).phase(P::Running).ready(),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    #[test]
    fn controller_of_another_kind_is_claimed() {
        let mut owner = sandboxset_owner("pool", Some(true));
        owner.kind = "SandboxClaim".into();
        check(
            Sandbox::test().owner(owner).phase(P::Running).ready(),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    #[test]
    fn controller_of_another_api_version_is_claimed() {
        let mut owner = sandboxset_owner("pool", Some(true));
        owner.api_version = "agents.kruise.io/v1beta1".into();
        check(
            Sandbox::test().owner(owner).phase(P::Running).ready(),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    #[test]
    fn first_controller_reference_decides() {
        let mut other = sandboxset_owner("x", Some(true));
        other.kind = "Other".into();
        check(
            Sandbox::test()
                .owner(sandboxset_owner("plain-owner", None))
                .owner(other)
                .owner(sandboxset_owner("pool", Some(true)))
                .phase(P::Running)
                .ready(),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    // Rules 7 to 9.
    #[test]
    fn claimed_running_paused_is_paused() {
        check(
            Sandbox::test().claimed().phase(P::Running).ready().paused(),
            (Paused, "RunningResourceClaimedAndPaused"),
        );
        check(
            Sandbox::test().claimed().phase(P::Running).not_ready().paused(),
            (Paused, "RunningResourceClaimedAndPaused"),
        );
    }

    #[test]
    fn claimed_running_ready_is_running() {
        check(
            Sandbox::test().claimed().phase(P::Running).ready(),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    #[test]
    fn explicit_unpaused_is_not_paused() {
        check(
            Sandbox::test().claimed().phase(P::Running).ready().paused_flag(false),
            (Running, "RunningResourceClaimedAndReady"),
        );
    }

    #[test]
    fn claimed_running_not_ready_is_dead() {
        check(
            Sandbox::test().claimed().phase(P::Running).not_ready(),
            (Dead, "RunningResourceClaimedButNotReady"),
        );
        check(
            Sandbox::test().claimed().phase(P::Running),
            (Dead, "RunningResourceClaimedButNotReady"),
        );
    }

    // Rule 10.
    #[test]
    fn claimed_in_other_phases_is_paused() {
        for phase in [P::Paused, P::Resuming, P::Upgrading, P::Recycling] {
            check(
                Sandbox::test().claimed().phase(phase.clone()),
                (Paused, "NotRunningResourceClaimed"),
            );
            check(
                Sandbox::test().claimed().phase(phase).ready(),
                (Paused, "NotRunningResourceClaimed"),
            );
        }
    }

    #[test]
    fn claimed_with_empty_or_unknown_phase_is_paused() {
        check(Sandbox::test().claimed(), (Paused, "NotRunningResourceClaimed"));
        check(Sandbox::test().claimed().no_status(), (Paused, "NotRunningResourceClaimed"));
        check(
            Sandbox::test().claimed().phase(P::Other("Pausing".into())).ready(),
            (Paused, "NotRunningResourceClaimed"),
        );
    }

    #[test]
    fn strings_match_the_reference() {
        let names: Vec<_> = SandboxState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["creating", "available", "running", "paused", "dead"]);
        assert_eq!(serde_json::to_string(&SandboxState::Available).unwrap(), "\"available\"");
    }

    fn sandboxset_owner(name: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "agents.kruise.io/v1alpha1".into(),
            kind: "SandboxSet".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            block_owner_deletion: controller,
        }
    }
}
