//! Condition types and reasons, per kind, and small helpers over `[]metav1.Condition`.
//!
//! Each kind has a module with its condition types as constants and, per type, a `*_reason`
//! module with that type's reasons. Strings are exactly the reference's (oka extensions are
//! marked).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition status `True`.
pub const TRUE: &str = "True";
/// Condition status `False`.
pub const FALSE: &str = "False";
/// Condition status `Unknown`.
pub const UNKNOWN: &str = "Unknown";

/// The reference's default limit on condition messages (`MAX_CONDITION_MESSAGE_LEN`).
pub const DEFAULT_MAX_MESSAGE_LEN: usize = 1024;

/// Sandbox condition types and reasons.
pub mod sandbox {
    /// The sandbox serves requests.
    pub const READY: &str = "Ready";
    /// Pausing / paused.
    pub const PAUSED: &str = "SandboxPaused";
    /// Resuming / resumed.
    pub const RESUMED: &str = "SandboxResumed";
    /// An in-place update of the pod.
    pub const INPLACE_UPDATE: &str = "InplaceUpdate";
    /// The upgrade state machine.
    pub const UPGRADING: &str = "Upgrading";
    /// The agent runtime was (re-)initialised after the pod was recreated.
    pub const RUNTIME_INITIALIZED: &str = "RuntimeInitialized";
    /// Return to the pool (reuse).
    pub const RECYCLING: &str = "Recycling";
    /// oka extension: decisions of the auto-pause policy.
    pub const AUTO_PAUSED: &str = "AutoPaused";

    /// Reasons of [`READY`].
    pub mod ready_reason {
        /// Mirrors the pod's Ready condition.
        pub const POD_READY: &str = "PodReady";
        /// An in-place update is in progress.
        pub const INPLACE_UPDATING: &str = "InplaceUpdating";
        /// An upgrade is in progress.
        pub const UPGRADING: &str = "Upgrading";
        /// A container is waiting (message from the container status).
        pub const START_CONTAINER_FAILED: &str = "StartContainerFailed";
        /// Creating the pod failed.
        pub const POD_CREATE_FAILED: &str = "PodCreateFailed";
    }

    /// Reasons of [`PAUSED`].
    pub mod paused_reason {
        /// Pause requested, not done yet.
        pub const PENDING: &str = "Pending";
        /// The image changed.
        pub const IMAGE_CHANGED: &str = "ImageChanged";
        /// Creating a checkpoint.
        pub const CHECKPOINT_CREATING: &str = "CheckpointCreating";
        /// The checkpoint was created.
        pub const CHECKPOINT_SUCCEEDED: &str = "CheckpointSucceeded";
        /// The checkpoint failed.
        pub const CHECKPOINT_FAILED: &str = "CheckpointFailed";
        /// Paused by snapshot.
        pub const SNAPSHOT_PAUSE_SUCCEED: &str = "SnapshotPauseSucceed";
        /// Paused by stopping (the pod is gone).
        pub const STOP_PAUSE_SUCCEED: &str = "StopPauseSucceed";
    }

    /// Reasons of [`RESUMED`].
    pub mod resumed_reason {
        /// The pod is being created.
        pub const CREATE_POD: &str = "CreatePod";
        /// The pod runs again.
        pub const RESUME_POD: &str = "ResumePod";
    }

    /// Reasons of [`INPLACE_UPDATE`].
    pub mod inplace_update_reason {
        /// In progress.
        pub const INPLACE_UPDATING: &str = "InplaceUpdating";
        /// Done.
        pub const SUCCEEDED: &str = "Succeeded";
        /// Failed.
        pub const FAILED: &str = "Failed";
    }

    /// Reasons of [`UPGRADING`] (the steps of the upgrade state machine).
    pub mod upgrading_reason {
        /// Resuming a paused sandbox before upgrading it.
        pub const RESUMING: &str = "Resuming";
        /// Resumed; waiting for the template patch.
        pub const RESUME_SUCCEED: &str = "ResumeSucceed";
        /// Running the pre-upgrade hook.
        pub const PRE_UPGRADE: &str = "PreUpgrade";
        /// The pre-upgrade hook failed.
        pub const PRE_UPGRADE_FAILED: &str = "PreUpgradeFailed";
        /// Checkpointing (CheckpointRestore).
        pub const CHECKPOINTING: &str = "Checkpointing";
        /// The checkpoint failed.
        pub const CHECKPOINT_FAILED: &str = "CheckpointFailed";
        /// Replacing the pod.
        pub const UPGRADE_POD: &str = "UpgradePod";
        /// The new pod failed.
        pub const UPGRADE_POD_FAILED: &str = "UpgradePodFailed";
        /// Running the post-upgrade hook.
        pub const POST_UPGRADE: &str = "PostUpgrade";
        /// The post-upgrade hook failed.
        pub const POST_UPGRADE_FAILED: &str = "PostUpgradeFailed";
        /// Done.
        pub const SUCCEEDED: &str = "Succeeded";
    }

    /// Reasons of [`RUNTIME_INITIALIZED`].
    pub mod runtime_initialized_reason {
        /// Waiting for the pod to be ready.
        pub const PENDING: &str = "Pending";
        /// Initialised.
        pub const SUCCEEDED: &str = "Succeeded";
        /// Initialisation failed.
        pub const FAILED: &str = "Failed";
    }

    /// Reasons of [`RECYCLING`].
    pub mod recycling_reason {
        /// Reuse started.
        pub const STARTED: &str = "RecyclingStarted";
        /// The sandbox was cleaned; waiting for the grace period.
        pub const COMPLETED: &str = "RecyclingCompleted";
        /// Back in the pool.
        pub const SUCCEEDED: &str = "RecyclingSucceeded";
        /// Reuse failed.
        pub const FAILED: &str = "RecyclingFailed";
        /// Reuse timed out.
        pub const TIMEOUT: &str = "RecyclingTimeout";
        /// Reuse is not possible (PVCs, paused).
        pub const REJECTED: &str = "RecyclingRejected";
    }

    /// Reasons of [`AUTO_PAUSED`] (oka extension).
    pub mod auto_paused_reason {
        /// `True`: the policy paused the sandbox.
        pub const PROBE_DRIVEN: &str = "ProbeDriven";
        /// `False`: the policy resumed the sandbox.
        pub const AUTO_RESUMED: &str = "AutoResumed";
        /// `False`: a user resumed the sandbox.
        pub const MANUAL_OVERRIDE: &str = "ManualOverride";
        /// `False`: the policy is invalid.
        pub const INVALID_POLICY: &str = "InvalidPolicy";
        /// `False`: the per-sandbox action budget is exhausted.
        pub const RATE_LIMITED: &str = "RateLimited";
    }

    /// Reasons of probe conditions (`probe.agents.kruise.io/<name>`, oka extension).
    pub mod probe_reason {
        /// `True`: enough consecutive successes.
        pub const SUCCEEDED: &str = "ProbeSucceeded";
        /// `False`: enough consecutive failures.
        pub const FAILED: &str = "ProbeFailed";
        /// `False`: the last failure was a timeout.
        pub const TIMEOUT: &str = "ProbeTimeout";
        /// `Unknown`: the probe could not be run.
        pub const ERROR: &str = "ProbeError";
        /// `Unknown`: probing just started.
        pub const INITIALIZING: &str = "ProbeInitializing";
        /// `Unknown`: the probe cannot run in the current phase.
        pub const NOT_PROBING: &str = "NotProbing";
    }
}

/// SandboxClaim condition types and reasons.
pub mod sandbox_claim {
    /// The claim is done.
    pub const COMPLETED: &str = "Completed";
    /// The claim timed out.
    pub const TIMED_OUT: &str = "TimedOut";

    /// Reasons of [`COMPLETED`].
    pub mod completed_reason {
        /// Every replica was claimed.
        pub const ALL_REPLICAS_CLAIMED: &str = "AllReplicasClaimed";
        /// `claimTimeout` elapsed.
        pub const TIMEOUT_REACHED: &str = "TimeoutReached";
        /// The SandboxSet does not exist.
        pub const SANDBOX_SET_NOT_FOUND: &str = "SandboxSetNotFound";
        /// A CPU resize was requested while its feature gate is off.
        pub const FEATURE_GATE_DISABLED: &str = "FeatureGateDisabled";
        /// oka: the claim asks for something the runtime cannot do (a field the message
        /// names); nothing was claimed, so nothing the user wrote is silently ignored.
        pub const UNSUPPORTED_FIELD: &str = "UnsupportedField";
    }

    /// Reasons of [`TIMED_OUT`].
    pub mod timed_out_reason {
        /// `claimTimeout` elapsed.
        pub const CLAIM_TIMEOUT_REACHED: &str = "ClaimTimeoutReached";
    }
}

/// PoolAutoscaler condition types and reasons (oka extension).
pub mod pool_autoscaler {
    /// Whether the target can be read and scaled.
    pub const ABLE_TO_SCALE: &str = "AbleToScale";
    /// Whether a policy is driving the target.
    pub const SCALING_ACTIVE: &str = "ScalingActive";
    /// Whether the result was clamped to the bounds.
    pub const SCALING_LIMITED: &str = "ScalingLimited";

    /// Reasons of [`ABLE_TO_SCALE`].
    pub mod able_to_scale_reason {
        /// `True`: the scale subresource was read.
        pub const SUCCEEDED_GET_SCALE: &str = "SucceededGetScale";
        /// `True`: the target was rescaled.
        pub const SUCCEEDED_RESCALE: &str = "SucceededRescale";
        /// `True`: the scale-up stabilization window held the value.
        pub const SCALE_UP_STABILIZED: &str = "ScaleUpStabilized";
        /// `True`: the scale-down stabilization window held the value.
        pub const SCALE_DOWN_STABILIZED: &str = "ScaleDownStabilized";
        /// `False`: the SandboxSet does not exist.
        pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
        /// `False`: the target is not a SandboxSet of `agents.kruise.io`.
        pub const INVALID_TARGET: &str = "InvalidTarget";
        /// `False`: reading the scale subresource failed.
        pub const FAILED_GET_SCALE: &str = "FailedGetScale";
        /// `False`: writing the scale subresource failed.
        pub const FAILED_UPDATE_SCALE: &str = "FailedUpdateScale";
        /// `False`: an older autoscaler targets the same SandboxSet.
        pub const AMBIGUOUS_TARGET: &str = "AmbiguousTarget";
    }

    /// Reasons of [`SCALING_ACTIVE`].
    pub mod scaling_active_reason {
        /// `True`: a cron policy is in effect.
        pub const CRON_POLICY_ACTIVE: &str = "CronPolicyActive";
        /// `True`: the capacity policy is in effect.
        pub const CAPACITY_POLICY_ACTIVE: &str = "CapacityPolicyActive";
        /// `True`: no policy; only bounds are enforced.
        pub const BOUNDS_ONLY: &str = "BoundsOnly";
        /// `False`: `spec.suspend` is set.
        pub const SUSPENDED: &str = "Suspended";
        /// `False`: a policy names a time zone that cannot be loaded.
        pub const UNKNOWN_TIME_ZONE: &str = "UnknownTimeZone";
        /// `False`: a schedule cannot be parsed.
        pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
        /// `False`: both cron and capacity policies are set.
        pub const INVALID_POLICY_COMBINATION: &str = "InvalidPolicyCombination";
        /// `False`: the SandboxSet's status lags its spec.
        pub const STALE_TARGET_STATUS: &str = "StaleTargetStatus";
    }

    /// Reasons of [`SCALING_LIMITED`].
    pub mod scaling_limited_reason {
        /// `True`: clamped up to `minReplicas`.
        pub const TOO_FEW_REPLICAS: &str = "TooFewReplicas";
        /// `True`: clamped down to `maxReplicas`.
        pub const TOO_MANY_REPLICAS: &str = "TooManyReplicas";
        /// `False`: within the bounds.
        pub const DESIRED_WITHIN_RANGE: &str = "DesiredWithinRange";
    }
}

/// The condition of this type in `conditions`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition's status is `True`.
pub fn is_true(condition: &Condition) -> bool {
    condition.status == TRUE
}

/// Sets a condition with the reference's semantics and reports whether anything changed.
///
/// - A condition of the same type with identical status, reason and message: no change.
/// - A new type: appended.
/// - Otherwise replaced; `lastTransitionTime` is taken from `new` only when the status flips,
///   else the existing one is kept.
pub fn set(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => {
            conditions.push(new);
            true
        }
        Some(old) => {
            if old.status == new.status && old.reason == new.reason && old.message == new.message {
                return false;
            }
            let last_transition_time: Time = if old.status == new.status {
                old.last_transition_time.clone()
            } else {
                new.last_transition_time.clone()
            };
            *old = Condition { last_transition_time, ..new };
            true
        }
    }
}

/// Removes the condition of this type; reports whether one was present.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// Truncates a condition message to `max` bytes (on a character boundary), appending `...` when
/// it was cut, as the reference does with `MAX_CONDITION_MESSAGE_LEN`.
pub fn truncate_message(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_owned();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;

    fn cond(type_: &str, status: &str, reason: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::from_second(at).unwrap()),
        }
    }

    #[test]
    fn set_appends_new_types() {
        let mut list = vec![];
        assert!(set(&mut list, cond("Ready", TRUE, "PodReady", 1)));
        assert!(set(&mut list, cond("SandboxPaused", FALSE, "Pending", 2)));
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn set_is_a_no_op_for_identical_status_reason_message() {
        let mut list = vec![cond("Ready", TRUE, "PodReady", 1)];
        assert!(!set(&mut list, cond("Ready", TRUE, "PodReady", 5)));
        assert_eq!(
            list[0].last_transition_time,
            cond("Ready", TRUE, "PodReady", 1).last_transition_time
        );
    }

    #[test]
    fn set_keeps_transition_time_unless_status_flips() {
        let mut list = vec![cond("Ready", FALSE, "PodReady", 1)];
        assert!(set(&mut list, cond("Ready", FALSE, "InplaceUpdating", 5)));
        assert_eq!(list[0].reason, "InplaceUpdating");
        assert_eq!(list[0].last_transition_time.0.as_second(), 1);
        assert!(set(&mut list, cond("Ready", TRUE, "PodReady", 9)));
        assert_eq!(list[0].last_transition_time.0.as_second(), 9);
    }

    #[test]
    fn remove_and_find() {
        let mut list = vec![cond("Ready", TRUE, "PodReady", 1), cond("Recycling", FALSE, "x", 1)];
        assert!(find(&list, "Ready").is_some_and(is_true));
        assert!(remove(&mut list, "Ready"));
        assert!(!remove(&mut list, "Ready"));
        assert!(find(&list, "Ready").is_none());
    }

    #[test]
    fn truncation_appends_ellipsis_on_char_boundary() {
        assert_eq!(truncate_message("short", 10), "short");
        assert_eq!(truncate_message("abcdef", 3), "abc...");
        assert_eq!(truncate_message("héllo", 2), "h...");
    }
}
