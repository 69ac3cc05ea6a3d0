//! The Pod runtime's decisions, pure: from a Sandbox, its resolved template, its Pod as last
//! seen and `now`, what to write (the reference's Sandbox controller, §2.1, on the Stop pause
//! strategy).
//!
//! Rules, in order:
//!
//! 1. **Deleting**: the Pod (if any, not already deleting) is deleted; once it is gone the
//!    finalizer `agents.kruise.io/sandbox` is removed.
//! 2. Neither `template` nor `templateRef`: ignored. A `templateRef` whose SandboxTemplate is
//!    not seen yet: wait for it.
//! 3. The finalizer is added before anything else, so no Pod outlives its Sandbox unnoticed,
//!    with the annotation `sandbox.agents.kruise.io/hash-immutable-part` when it is missing
//!    (written once, the reference's).
//! 4. **Reuse on kill** (`agents.kruise.io/cleanup` or `agents.kruise.io/reuse` `"true"`):
//!    the Pod runtime does not recycle, so the Sandbox is deleted (its pool makes a fresh one).
//! 5. **Timers** ([`timer_step`], the same rule as the node agents'): delete, pause, or look
//!    again at the nearest deadline.
//! 6. **Succeeded / Failed** are terminal.
//! 7. **Pending**: no Pod ⇒ create it ([`build_pod`] at the status's `updateRevision`); a Pod
//!    of the same name owned by another object ⇒ wait (`PodOwnerMismatch`); the Pod's phase
//!    `Succeeded`/`Failed` ⇒ the same phase, "Pod status phase is …"; the Pod `Running` ⇒
//!    phase `Running`. The status follows the Pod meanwhile ([`sync_from_pod`]).
//! 8. **Running**: the Pod gone or deleting ⇒ `Failed`, "Pod Not Found"; ended ⇒ its phase;
//!    `spec.paused` ⇒ phase `Paused` (`SandboxPaused=False/Pending`, `Ready=False`,
//!    `SandboxResumed` removed) and the Pod deleted; otherwise the status follows the Pod, and
//!    a `RuntimeInitialized` condition that is not `True` asks for the recorded `/init` to be
//!    replayed once the Pod is Ready ([`PodAction::Initialize`]).
//!    - **Restart** ([`restart_requested`], the node runtime's rule: the annotation
//!      `agents.kruise.io/restart-requested-at` differs from `agents.kruise.io/restarted-at`)
//!      of a Ready sandbox ⇒ `restarted-at` written first (one request, one restart),
//!      `Ready=False/`[`RESTARTING`], the Normal Event `SandboxRestarted`, the Pod deleted; while
//!      `Ready` says [`RESTARTING`] the old Pod (the status's `podInfo.podUID`) is deleted and
//!      waited for, then a Pod is created from the current template (the `/init` replayed once
//!      it is Ready), and the new Pod's status ends the restart.
//!    - **Upgrade** ([`upgrade_due`]: an `upgradePolicy` and a template revision other than
//!      `status.updateRevision`, as a SandboxUpdateOps writes them) ⇒ phase `Upgrading`,
//!      `Upgrading=False/UpgradePod`, the Pod deleted (wins over a pause, as in the reference).
//! 9. **Upgrading** (the reference's UpgradePod step; every policy recreates on Pods, and
//!    the `preUpgrade`/`postUpgrade` hooks are not run): the old Pod is deleted and waited
//!    for, the new one created at the new revision; once it runs ⇒ `Upgrading=True/Succeeded`,
//!    the new `updateRevision`, phase `Running` (the SandboxUpdateOps counts it updated); a
//!    new Pod that ends ⇒ `UpgradePodFailed` (at the sandbox's generation), which waits for
//!    the spec to change again, then replaces that Pod from the template. A paused sandbox with the
//!    annotation `agents.kruise.io/upgrade-resume-trigger: "true"` (a SandboxUpdateOps of
//!    paused sandboxes) goes `Upgrading` at `Resuming` (a Pod made again), `ResumeSucceed` once
//!    it runs (the SandboxUpdateOps then patches the template, and the upgrade goes on as
//!    above), back to `Running` if the trigger goes before the template changed.
//! 10. **Paused**: until `SandboxPaused=True` the Pod is deleted; once it is gone,
//!     `SandboxPaused=True/StopPauseSucceed`. Paused and `spec.paused: false` ⇒ phase
//!     `Resuming`, `SandboxResumed=False/CreatePod`.
//! 11. **Resuming**: a Pod still terminating ⇒ look again in a second; none ⇒ create it from
//!     the current template; Running ⇒ `SandboxResumed=True/ResumePod`, `SandboxPaused`
//!     removed, `RuntimeInitialized=False/Pending` for a claimed sandbox (its `/init` is
//!     replayed once Ready), phase `Running`.
//!
//! What a pause keeps: the PVCs of `volumeClaimTemplates` and any volume the template names
//! that outlives a Pod; not memory, processes, the container's writable layer or the Pod IP.
//!
//! Not supported on Pods yet, each named by [`unhonoured`] (the controller tells it once per
//! sandbox in a Warning Event [`UNSUPPORTED_ON_POD`]): in-place updates (a template change
//! without an `upgradePolicy` takes effect at the next Pod: a resume, a restart), reuse on kill
//! (`agents.kruise.io/cleanup: "true"` deletes the sandbox, rule 4), probes, the auto-pause
//! policy, pause strategies other than Stop, upgrade hooks, `CheckpointRestore`.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::conditions::sandbox::{
    PAUSED, READY, RESUMED, RUNTIME_INITIALIZED, UPGRADING, paused_reason, ready_reason,
    resumed_reason, runtime_initialized_reason, upgrading_reason,
};
use oka_api::conditions::{self, FALSE, TRUE};
use oka_api::sandbox::PodInfo;
use oka_api::{Sandbox, SandboxPhase, SandboxStatus, annotations, finalizers};

use super::pod::{PodBuildError, PodOptions, build_pod};
use crate::events::EventType;
use crate::plan::{Plan, whole_seconds};
use crate::revision::{sandbox_immutable_revision, sandbox_revision};
use crate::sandbox::{
    POD_NOT_FOUND, TimerStep, has_init_request, remove_condition, restart_requested, set_condition,
    timer_step,
};

/// How long to wait before looking again at a Pod that is still terminating, or one of the
/// same name that another object owns.
pub const POD_RECHECK: Duration = Duration::from_secs(1);

/// One write the executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum PodAction {
    /// Bring the Sandbox's metadata up to date in one write: add the finalizer
    /// `agents.kruise.io/sandbox`, and write the annotation
    /// `sandbox.agents.kruise.io/hash-immutable-part` (once, as the reference does).
    EnsureMetadata {
        /// Add the finalizer.
        finalizer: bool,
        /// Write this immutable-part hash.
        immutable_hash: Option<String>,
    },
    /// Remove it (the Pod is gone).
    RemoveFinalizer,
    /// Record the restart request acted on in the annotation `agents.kruise.io/restarted-at`
    /// (written before the Pod is deleted, so one request restarts at most once).
    MarkRestarted(String),
    /// Delete the Sandbox (`shutdownTime`).
    DeleteSandbox,
    /// Set `spec.paused: true` (`pauseTime`), moving both times to `until` when given.
    SetPaused {
        /// The new `pauseTime` and `shutdownTime`.
        until: Option<Time>,
    },
    /// Write this status (compare-and-swap on the Sandbox's resourceVersion).
    UpdateStatus(Box<SandboxStatus>),
    /// Create the sandbox's PersistentVolumeClaims (an existing one is fine), then this Pod.
    CreatePod(Box<Pod>),
    /// Delete the Pod with this uid.
    DeletePod {
        /// The uid the delete is conditioned on.
        uid: String,
    },
    /// Replay the recorded `/init` to the sandbox's envd, and record the outcome in
    /// `RuntimeInitialized`.
    Initialize,
    /// Record an Event on the Sandbox.
    Event {
        /// Normal or Warning.
        type_: EventType,
        /// The Event's reason.
        reason: &'static str,
        /// Its message.
        message: String,
    },
}

/// What the planner sees besides the Sandbox.
#[derive(Debug, Clone, Copy)]
pub struct PodObservation<'a> {
    /// The resolved pod template: inline, or the SandboxTemplate's. `None` with a
    /// `templateRef` means the SandboxTemplate is not seen yet.
    pub template: Option<&'a PodTemplateSpec>,
    /// The Pod of the sandbox's name, as last seen.
    pub pod: Option<&'a Pod>,
    /// How Pods are built.
    pub options: &'a PodOptions,
}

/// The Pod's phase.
fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

fn is_deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether `pod` is this sandbox's: its controller ownerReference is the sandbox's uid.
pub fn owned_by(pod: &Pod, sandbox: &Sandbox) -> bool {
    let uid = sandbox.metadata.uid.as_deref();
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

/// The Pod's `Ready` as the sandbox's: its status and transition time; when not ready and a
/// container waits for a reason other than starting (`ImagePullBackOff`, `ErrImagePull`,
/// `CrashLoopBackOff`, ...), `StartContainerFailed` with that reason and message.
pub fn ready_of(pod: &Pod) -> (bool, &'static str, String) {
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    if ready.is_some_and(|c| c.status == TRUE) {
        return (true, ready_reason::POD_READY, String::new());
    }
    let containers = status.into_iter().flat_map(|s| {
        s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten())
    });
    for container in containers {
        let Some(waiting) = container.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = waiting.reason.as_deref().unwrap_or_default();
        if reason.is_empty() || reason == "ContainerCreating" || reason == "PodInitializing" {
            continue;
        }
        let detail = waiting.message.as_deref().unwrap_or_default();
        let message = if detail.is_empty() {
            format!("container {:?}: {reason}", container.name)
        } else {
            format!("container {:?}: {reason}: {detail}", container.name)
        };
        return (false, ready_reason::START_CONTAINER_FAILED, message);
    }
    let message = ready.and_then(|c| c.message.clone()).unwrap_or_default();
    (false, ready_reason::POD_READY, message)
}

/// A status being planned.
struct Draft {
    status: SandboxStatus,
    now: Time,
}

impl Draft {
    fn set(&mut self, type_: &str, status: &str, reason: &str, message: &str) {
        set_condition(&mut self.status, type_, status, reason, message, &self.now, None);
    }

    fn remove(&mut self, type_: &str) {
        remove_condition(&mut self.status, type_);
    }

    fn is_true(&self, type_: &str) -> bool {
        self.status.condition(type_).is_some_and(conditions::is_true)
    }

    fn end(&mut self, phase: SandboxPhase, message: String) {
        self.set(READY, FALSE, ready_reason::POD_READY, &message);
        self.status.phase = Some(phase);
        self.status.message = Some(message);
    }
}

/// Copies what the sandbox's status says about its Pod: `nodeName`, `sandboxIp`, `podInfo`
/// (podIP, nodeName, podUID) and, with `ready`, the `Ready` condition.
pub fn sync_from_pod(status: &mut SandboxStatus, pod: &Pod, ready: bool, now: Timestamp) {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
    status.node_name.clone_from(&node);
    status.sandbox_ip.clone_from(&ip);
    let info = status.pod_info.get_or_insert_with(PodInfo::default);
    info.node_name = node;
    info.pod_ip = ip;
    info.pod_uid.clone_from(&pod.metadata.uid);
    if ready {
        let (is_ready, reason, message) = ready_of(pod);
        let mut draft = Draft { status: std::mem::take(status), now: whole_seconds(now) };
        draft.set(READY, if is_ready { TRUE } else { FALSE }, reason, &message);
        *status = draft.status;
    }
}

/// The Pod runtime's plan for `sandbox`; see the module documentation.
pub fn plan_pod_sandbox(
    sandbox: &Sandbox,
    observed: &PodObservation<'_>,
    now: Timestamp,
) -> Plan<PodAction> {
    let has_finalizer =
        sandbox.metadata.finalizers.iter().flatten().any(|f| f == finalizers::SANDBOX);
    let pod = observed.pod.filter(|p| owned_by(p, sandbox));
    if sandbox.metadata.deletion_timestamp.is_some() {
        return match observed.pod {
            Some(p) if owned_by(p, sandbox) && !is_deleting(p) => Plan::nothing()
                .with(PodAction::Event {
                    type_: EventType::Normal,
                    reason: "SandboxTerminating",
                    message: "Terminate sandbox".to_owned(),
                })
                .with(PodAction::DeletePod { uid: uid_of(p) }),
            Some(p) if owned_by(p, sandbox) => Plan::nothing(),
            _ if has_finalizer => Plan::nothing().with(PodAction::RemoveFinalizer),
            _ => Plan::nothing(),
        };
    }
    if sandbox.spec.template.is_none() && sandbox.spec.template_ref.is_none() {
        return Plan::nothing();
    }
    let Some(template) = observed.template else {
        // The SandboxTemplate is not seen yet: its arrival wakes the sandbox.
        return Plan::nothing();
    };
    let mut plan = Plan::nothing();
    let has_hash = sandbox
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::HASH_IMMUTABLE_PART));
    let immutable_hash = if has_hash { None } else { sandbox_immutable_revision(&sandbox.spec) };
    if !has_finalizer || immutable_hash.is_some() {
        plan = plan.with(PodAction::EnsureMetadata { finalizer: !has_finalizer, immutable_hash });
    }
    if cleanup_requested(sandbox) {
        // A kill that asks for reuse: the Pod runtime does not recycle, so it deletes (the pool
        // makes a fresh one).
        return plan.with(PodAction::DeleteSandbox);
    }
    match timer_step(sandbox, now) {
        TimerStep::Delete => return plan.with(PodAction::DeleteSandbox),
        TimerStep::Pause { until } => return plan.with(PodAction::SetPaused { until }),
        TimerStep::Wait(Some(after)) => plan = plan.requeue_after(after),
        TimerStep::Wait(None) => {}
    }
    let phase = sandbox.phase().cloned().unwrap_or(SandboxPhase::Pending);
    if !matches!(
        phase,
        SandboxPhase::Pending
            | SandboxPhase::Running
            | SandboxPhase::Paused
            | SandboxPhase::Resuming
            | SandboxPhase::Upgrading
    ) {
        // Terminal, or a phase the Pod runtime does not drive (recycling).
        return plan;
    }

    let before = sandbox.status.clone().unwrap_or_default();
    let mut draft = Draft { status: before.clone(), now: whole_seconds(now) };
    draft.status.observed_generation = sandbox.metadata.generation;
    draft.status.phase = Some(phase.clone());
    // The revision stays while a pause is incomplete, so a template change made meanwhile is
    // still seen (the reference's rule).
    let pause_incomplete = phase == SandboxPhase::Paused && !draft.is_true(PAUSED);
    let target_revision = sandbox_revision(&sandbox.spec);
    // An upgrade due or under way keeps the old revision until its new Pod runs.
    let upgrading = phase == SandboxPhase::Upgrading
        || (phase == SandboxPhase::Running && upgrade_due(sandbox, &draft.status));
    if !pause_incomplete && !upgrading {
        draft.status.update_revision = Some(target_revision.clone());
    }
    let revision = if upgrading {
        target_revision.clone()
    } else {
        draft.status.update_revision.clone().unwrap_or_default()
    };
    let mut pod_action = None;
    let mut after_status = Vec::new();
    let create = |draft: &mut Draft| match build_pod(sandbox, template, &revision, observed.options)
    {
        Ok(pod) => Some(PodAction::CreatePod(Box::new(pod))),
        Err(error) => {
            let message = error_message(&error);
            draft.set(READY, FALSE, ready_reason::POD_CREATE_FAILED, &message);
            None
        }
    };

    match phase {
        SandboxPhase::Pending => match observed.pod {
            None => pod_action = create(&mut draft),
            Some(other) if !owned_by(other, sandbox) => {
                plan = plan.requeue_after(POD_RECHECK);
                if before.condition(READY).is_none_or(|c| c.reason != "PodOwnerMismatch") {
                    let message =
                        "a pod of this name belongs to another object; waiting for it to go";
                    draft.set(READY, FALSE, "PodOwnerMismatch", message);
                    pod_action = Some(PodAction::Event {
                        type_: EventType::Warning,
                        reason: "PodOwnerMismatch",
                        message: message.to_owned(),
                    });
                }
            }
            Some(pod) => match pod_phase(pod) {
                ended @ ("Succeeded" | "Failed") => {
                    sync_from_pod(&mut draft.status, pod, false, now);
                    let phase = SandboxPhase::from(ended);
                    draft.end(phase, format!("Pod status phase is {ended}"));
                }
                "Running" => {
                    draft.status.phase = Some(SandboxPhase::Running);
                    sync_from_pod(&mut draft.status, pod, true, now);
                }
                _ => sync_from_pod(&mut draft.status, pod, true, now),
            },
        },
        SandboxPhase::Running if replacing(&draft.status, RESTARTING) => {
            match replaced_pod(pod, &draft.status) {
                Replaced::Old(p) if is_deleting(p) => plan = plan.requeue_after(POD_RECHECK),
                Replaced::Old(p) => pod_action = Some(PodAction::DeletePod { uid: uid_of(p) }),
                Replaced::Gone => {
                    if has_init_request(sandbox) {
                        draft.set(
                            RUNTIME_INITIALIZED,
                            FALSE,
                            runtime_initialized_reason::PENDING,
                            "Waiting for pod ready before initialization",
                        );
                    }
                    pod_action = create(&mut draft);
                }
                Replaced::New(p) => sync_from_pod(&mut draft.status, p, true, now),
            }
        }
        SandboxPhase::Upgrading if upgrading_step(&draft.status) == upgrading_reason::RESUMING => {
            match pod {
                None => pod_action = create(&mut draft),
                Some(p) if is_deleting(p) => plan = plan.requeue_after(POD_RECHECK),
                Some(p) if pod_phase(p) == "Running" => {
                    sync_from_pod(&mut draft.status, p, true, now);
                    draft.remove(PAUSED);
                    draft.remove(RESUMED);
                    draft.set(UPGRADING, FALSE, upgrading_reason::RESUME_SUCCEED, "");
                    draft.set(READY, FALSE, ready_reason::UPGRADING, "sandbox is upgrading");
                }
                Some(_) => {}
            }
        }
        SandboxPhase::Upgrading
            if upgrading_step(&draft.status) == upgrading_reason::RESUME_SUCCEED
                && !upgrade_due(sandbox, &draft.status)
                && !upgrade_resume_requested(sandbox) =>
        {
            // Abandoned before the template changed: back to Running.
            draft.remove(UPGRADING);
            draft.status.phase = Some(SandboxPhase::Running);
            if let Some(p) = pod {
                sync_from_pod(&mut draft.status, p, true, now);
            }
        }
        SandboxPhase::Upgrading
            if upgrading_step(&draft.status) == upgrading_reason::RESUME_SUCCEED
                && !upgrade_due(sandbox, &draft.status) =>
        {
            // Resumed: waiting for the SandboxUpdateOps to patch the template.
        }
        SandboxPhase::Upgrading
            if draft.status.condition(UPGRADING).is_some_and(|c| {
                c.reason == upgrading_reason::UPGRADE_POD_FAILED
                    && c.observed_generation == sandbox.metadata.generation
            }) =>
        {
            // A failed upgrade waits for the spec to change again (the reference's rule); the
            // SandboxUpdateOps counts it failed meanwhile.
        }
        SandboxPhase::Upgrading => {
            // `podInfo.podUID` names the old Pod until the new one runs (after a failure: the
            // failed one, replaced again).
            if matches!(
                upgrading_step(&draft.status),
                upgrading_reason::RESUME_SUCCEED | upgrading_reason::UPGRADE_POD_FAILED
            ) {
                draft.set(UPGRADING, FALSE, upgrading_reason::UPGRADE_POD, "");
            }
            match replaced_pod(pod, &draft.status) {
                Replaced::Old(p) if is_deleting(p) => plan = plan.requeue_after(POD_RECHECK),
                Replaced::Old(p) => pod_action = Some(PodAction::DeletePod { uid: uid_of(p) }),
                // A create repeated from a lagging cache is harmless (AlreadyExists).
                Replaced::Gone => {
                    draft.set(UPGRADING, FALSE, upgrading_reason::UPGRADE_POD, NEW_POD);
                    if has_init_request(sandbox) {
                        draft.set(
                            RUNTIME_INITIALIZED,
                            FALSE,
                            runtime_initialized_reason::PENDING,
                            "Waiting for pod ready before initialization",
                        );
                    }
                    pod_action = create(&mut draft);
                }
                Replaced::New(p) if matches!(pod_phase(p), "Succeeded" | "Failed") => {
                    let ended = pod_phase(p).to_owned();
                    let message = format!("the new pod ended: phase {ended}");
                    // At the spec's generation: tried again once the spec moves on.
                    set_condition(
                        &mut draft.status,
                        UPGRADING,
                        FALSE,
                        upgrading_reason::UPGRADE_POD_FAILED,
                        &message,
                        &draft.now,
                        sandbox.metadata.generation,
                    );
                    sync_from_pod(&mut draft.status, p, false, now);
                }
                Replaced::New(p) => {
                    if pod_phase(p) == "Running" {
                        sync_from_pod(&mut draft.status, p, true, now);
                        draft.set(UPGRADING, TRUE, upgrading_reason::SUCCEEDED, "");
                        draft.status.update_revision = Some(target_revision.clone());
                        draft.status.phase = Some(SandboxPhase::Running);
                    }
                }
            }
        }
        SandboxPhase::Running => match pod {
            None => draft.end(SandboxPhase::Failed, POD_NOT_FOUND.to_owned()),
            Some(p) if is_deleting(p) => draft.end(SandboxPhase::Failed, POD_NOT_FOUND.to_owned()),
            Some(p) if matches!(pod_phase(p), "Succeeded" | "Failed") => {
                let ended = pod_phase(p).to_owned();
                draft.end(
                    SandboxPhase::from(ended.as_str()),
                    format!("Pod status phase is {ended}"),
                );
            }
            Some(p) if upgrade_due(sandbox, &draft.status) => {
                // The reference's UpgradePod step (Recreate): the old Pod goes, a new one is
                // made from the new template, then Running.
                draft.status.phase = Some(SandboxPhase::Upgrading);
                draft.remove(PAUSED);
                draft.set(UPGRADING, FALSE, upgrading_reason::UPGRADE_POD, "");
                draft.set(READY, FALSE, ready_reason::UPGRADING, "sandbox is upgrading");
                pod_action = Some(PodAction::DeletePod { uid: uid_of(p) });
            }
            Some(p) if sandbox.is_paused() => {
                draft.status.phase = Some(SandboxPhase::Paused);
                draft.remove(RESUMED);
                draft.set(PAUSED, FALSE, paused_reason::PENDING, "");
                draft.set(READY, FALSE, ready_reason::POD_READY, "the sandbox is paused");
                pod_action = Some(PodAction::DeletePod { uid: uid_of(p) });
            }
            Some(p) if restart_requested(sandbox).is_some() && draft.is_true(READY) => {
                let requested = restart_requested(sandbox).unwrap_or_default().to_owned();
                draft.set(READY, FALSE, RESTARTING, "the sandbox's pod is being recreated");
                plan = plan.with(PodAction::MarkRestarted(requested));
                after_status.push(PodAction::Event {
                    type_: EventType::Normal,
                    reason: "SandboxRestarted",
                    message: "Sandbox processes restarted".to_owned(),
                });
                pod_action = Some(PodAction::DeletePod { uid: uid_of(p) });
            }
            Some(p) => {
                sync_from_pod(&mut draft.status, p, true, now);
                let initialized = draft.status.condition(RUNTIME_INITIALIZED);
                if initialized.is_some_and(|c| c.status != TRUE)
                    && draft.is_true(READY)
                    && has_init_request(sandbox)
                {
                    pod_action = Some(PodAction::Initialize);
                }
            }
        },
        SandboxPhase::Paused if draft.is_true(PAUSED) && upgrade_resume_requested(sandbox) => {
            // A SandboxUpdateOps resumes a paused sandbox before it patches its template.
            draft.status.phase = Some(SandboxPhase::Upgrading);
            draft.set(UPGRADING, FALSE, upgrading_reason::RESUMING, "");
            draft.set(READY, FALSE, ready_reason::UPGRADING, "sandbox is upgrading");
            pod_action = match pod {
                None => create(&mut draft),
                Some(_) => {
                    plan = plan.requeue_after(POD_RECHECK);
                    None
                }
            };
        }
        SandboxPhase::Paused => {
            if draft.is_true(PAUSED) {
                if !sandbox.is_paused() {
                    draft.status.phase = Some(SandboxPhase::Resuming);
                    draft.set(RESUMED, FALSE, resumed_reason::CREATE_POD, "");
                    pod_action = match pod {
                        None => create(&mut draft),
                        Some(_) => None,
                    };
                    if pod.is_some() {
                        plan = plan.requeue_after(POD_RECHECK);
                    }
                }
            } else {
                draft.set(READY, FALSE, ready_reason::POD_READY, "the sandbox is paused");
                match pod {
                    None => draft.set(PAUSED, TRUE, paused_reason::STOP_PAUSE_SUCCEED, ""),
                    Some(p) if is_deleting(p) => {}
                    Some(p) => pod_action = Some(PodAction::DeletePod { uid: uid_of(p) }),
                }
            }
        }
        SandboxPhase::Resuming => match pod {
            None => pod_action = create(&mut draft),
            Some(p) if is_deleting(p) => plan = plan.requeue_after(POD_RECHECK),
            Some(p) if pod_phase(p) == "Running" => {
                draft.set(RESUMED, TRUE, resumed_reason::RESUME_POD, "");
                draft.remove(PAUSED);
                if has_init_request(sandbox) {
                    draft.set(
                        RUNTIME_INITIALIZED,
                        FALSE,
                        runtime_initialized_reason::PENDING,
                        "Waiting for pod ready before initialization",
                    );
                }
                draft.status.phase = Some(SandboxPhase::Running);
                sync_from_pod(&mut draft.status, p, true, now);
            }
            Some(p) => sync_from_pod(&mut draft.status, p, true, now),
        },
        _ => {}
    }
    if draft.status != before {
        plan = plan.with(PodAction::UpdateStatus(Box::new(draft.status)));
    }
    for action in after_status {
        plan = plan.with(action);
    }
    if let Some(action) = pod_action {
        plan = plan.with(action);
    }
    plan
}

/// The `Ready` reason of a Running sandbox whose Pod is being recreated for a restart: the Pod
/// that was there (`podInfo.podUID`) goes, a new one is made from the current template.
pub const RESTARTING: &str = "SandboxRestarting";

/// The `Upgrading` message of step `UpgradePod` once the new Pod was created.
const NEW_POD: &str = "the old pod is gone; the new one is starting";

/// Whether a Running sandbox starts an upgrade: an `upgradePolicy` is set and its template's
/// revision differs from the one its status reports (a SandboxUpdateOps patched it). On Pods
/// every policy upgrades by recreating the Pod (`CheckpointRestore` has no checkpoint to move).
pub fn upgrade_due(sandbox: &Sandbox, status: &SandboxStatus) -> bool {
    sandbox.spec.upgrade_policy.as_ref().and_then(|p| p.type_).is_some()
        && status.update_revision.as_deref() != Some(sandbox_revision(&sandbox.spec).as_str())
}

/// The step `Upgrading` records (its reason), empty without one.
fn upgrading_step(status: &SandboxStatus) -> &str {
    status.condition(UPGRADING).map(|c| c.reason.as_str()).unwrap_or_default()
}

/// Whether a SandboxUpdateOps asks a paused sandbox to resume for its upgrade (the annotation
/// `agents.kruise.io/upgrade-resume-trigger: "true"`).
fn upgrade_resume_requested(sandbox: &Sandbox) -> bool {
    let notes = sandbox.metadata.annotations.as_ref();
    notes.and_then(|a| a.get(annotations::UPGRADE_RESUME_TRIGGER)).is_some_and(|v| v == "true")
}

/// Whether `Ready` says the Pod is being replaced for `reason`.
fn replacing(status: &SandboxStatus, reason: &str) -> bool {
    status.condition(READY).is_some_and(|c| c.reason == reason)
}

/// The Pod of a sandbox whose Pod is being replaced.
enum Replaced<'a> {
    /// The one being replaced (its uid is the status's `podInfo.podUID`).
    Old(&'a Pod),
    /// None yet.
    Gone,
    /// The replacement.
    New(&'a Pod),
}

fn replaced_pod<'a>(pod: Option<&'a Pod>, status: &SandboxStatus) -> Replaced<'a> {
    let old_uid = status.pod_info.as_ref().and_then(|i| i.pod_uid.as_deref());
    match pod {
        None => Replaced::Gone,
        Some(p) if p.metadata.uid.is_some() && p.metadata.uid.as_deref() == old_uid => {
            Replaced::Old(p)
        }
        Some(p) => Replaced::New(p),
    }
}

/// The Event reason of a field the Pod runtime does not honour.
pub const UNSUPPORTED_ON_POD: &str = "UnsupportedOnPod";

/// One thing a user wrote that the Pod runtime does not do, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhonoured {
    /// The field or annotation, as the user wrote it.
    pub field: &'static str,
    /// The Warning Event's message: the field, what happens instead, and the way out.
    pub message: String,
}

/// What `sandbox` asks for that the Pod runtime does not do (each told once per sandbox as a
/// Warning Event [`UNSUPPORTED_ON_POD`] by the controller): `spec.probes`,
/// `spec.autoPausePolicy`, a `pauseStrategy` other than Stop, `spec.lifecycle`'s upgrade hooks,
/// the `CheckpointRestore` upgrade policy, a template change without an `upgradePolicy` on a
/// running Pod (an in-place update), and reuse on kill (`agents.kruise.io/cleanup`: the sandbox
/// is deleted instead).
pub fn unhonoured(sandbox: &Sandbox, pod: Option<&Pod>) -> Vec<Unhonoured> {
    const NODE: &str = "use the node runtime (annotation agents.kruise.io/runtime: node)";
    let spec = &sandbox.spec;
    let mut found = Vec::new();
    let mut add = |field: &'static str, why: &str| {
        found.push(Unhonoured { field, message: format!("{field}: {why} on a Pod; {NODE}") });
    };
    if spec.probes.as_ref().is_some_and(|p| !p.is_empty()) {
        add("spec.probes", "not run (the pod template's readinessProbe is)");
    }
    if spec.auto_pause_policy.is_some() {
        add("spec.autoPausePolicy", "not applied");
    }
    let strategy = spec.pause_strategy.as_ref().and_then(|p| p.type_);
    if strategy.is_some_and(|t| t != oka_api::common::PauseStrategyType::Stop) {
        add("spec.pauseStrategy", "a pause deletes the Pod (Stop) whatever the strategy");
    }
    let hooks = spec.lifecycle.as_ref();
    if hooks.is_some_and(|l| l.pre_upgrade.is_some() || l.post_upgrade.is_some()) {
        add("spec.lifecycle", "the preUpgrade/postUpgrade hooks are not run");
    }
    let policy = spec.upgrade_policy.as_ref().and_then(|p| p.type_);
    if policy == Some(oka_api::common::UpgradePolicyType::CheckpointRestore) {
        add("spec.upgradePolicy", "CheckpointRestore recreates the Pod without a checkpoint");
    }
    let running_revision = pod
        .and_then(|p| p.metadata.labels.as_ref())
        .and_then(|l| l.get(oka_api::labels::POD_TEMPLATE_HASH));
    if policy.is_none()
        && sandbox.phase() == Some(&SandboxPhase::Running)
        && running_revision.is_some_and(|r| *r != sandbox_revision(spec))
    {
        add(
            "spec.template",
            "a change is not applied in place; the next Pod (a restart, a resume, an upgradePolicy) takes it",
        );
    }
    if cleanup_requested(sandbox) {
        add(annotations::CLEANUP, "the sandbox is not reused: it is deleted");
    }
    found
}

/// Whether the sandbox is asked to be reused (`agents.kruise.io/cleanup`, or the alias
/// `agents.kruise.io/reuse`, is `"true"`).
fn cleanup_requested(sandbox: &Sandbox) -> bool {
    let notes = sandbox.metadata.annotations.as_ref();
    [annotations::CLEANUP, annotations::REUSE]
        .iter()
        .any(|key| notes.and_then(|a| a.get(*key)).is_some_and(|v| v == "true"))
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn error_message(error: &PodBuildError) -> String {
    format!("cannot build the pod: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodSpec,
        PodStatus,
    };
    use oka_api::conditions::sandbox::PAUSED;

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn options() -> PodOptions {
        PodOptions { envd_image: "oka-envd:test".into() }
    }

    fn template() -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    image: Some("busybox".into()),
                    command: Some(vec!["sleep".into(), "infinity".into()]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
        }
    }

    fn sandbox(phase: Option<SandboxPhase>) -> Sandbox {
        let mut s = Sandbox::new(
            "sbx",
            oka_api::SandboxSpec { template: Some(template()), ..oka_api::SandboxSpec::default() },
        );
        s.metadata.namespace = Some("default".into());
        s.metadata.uid = Some("uid-1".into());
        s.metadata.generation = Some(1);
        s.metadata.finalizers = Some(vec![finalizers::SANDBOX.into()]);
        s.metadata.annotations =
            Some([(annotations::HASH_IMMUTABLE_PART.to_owned(), "h".to_owned())].into());
        s.status = phase.map(|p| SandboxStatus { phase: Some(p), ..SandboxStatus::default() });
        s
    }

    fn pod(phase: &str, ready: bool) -> Pod {
        let s = sandbox(None);
        let mut pod = build_pod(&s, &template(), "r", &options()).unwrap();
        pod.metadata.uid = Some("pod-uid".into());
        pod.spec.as_mut().unwrap().node_name = Some("worker-1".into());
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            pod_ip: Some("10.0.0.7".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    fn plan(s: &Sandbox, pod: Option<&Pod>) -> Plan<PodAction> {
        let t = template();
        let o = options();
        plan_pod_sandbox(s, &PodObservation { template: Some(&t), pod, options: &o }, now())
    }

    fn status_of(plan: &Plan<PodAction>) -> SandboxStatus {
        plan.actions
            .iter()
            .find_map(|a| match a {
                PodAction::UpdateStatus(s) => Some((**s).clone()),
                _ => None,
            })
            .expect("a status write")
    }

    fn applied(mut s: Sandbox, plan: &Plan<PodAction>) -> Sandbox {
        s.status = Some(status_of(plan));
        s
    }

    #[test]
    fn a_new_sandbox_gets_its_finalizer_then_its_pod() {
        let mut s = sandbox(None);
        s.metadata.finalizers = None;
        s.metadata.annotations = None;
        let p = plan(&s, None);
        let PodAction::EnsureMetadata { finalizer: true, immutable_hash: Some(hash) } =
            &p.actions[0]
        else {
            panic!("{p:?}")
        };
        assert_eq!(hash.len(), 9);
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Pending));
        let revision = status.update_revision.clone().unwrap();
        let Some(PodAction::CreatePod(pod)) = p.actions.last() else { panic!("{p:?}") };
        assert_eq!(pod.metadata.labels.as_ref().unwrap()["pod-template-hash"], revision);
    }

    #[test]
    fn a_running_ready_pod_makes_the_sandbox_running_with_its_address() {
        let s = sandbox(Some(SandboxPhase::Pending));
        let p = plan(&s, Some(&pod("Running", true)));
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Running));
        assert_eq!(status.sandbox_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(status.node_name.as_deref(), Some("worker-1"));
        let info = status.pod_info.clone().unwrap();
        assert_eq!(info.pod_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(info.node_name.as_deref(), Some("worker-1"));
        assert_eq!(info.pod_uid.as_deref(), Some("pod-uid"));
        assert!(status.condition(READY).is_some_and(conditions::is_true));
        // Planning again from what was written writes nothing.
        let again = plan(&applied(s, &p), Some(&pod("Running", true)));
        assert!(again.actions.is_empty(), "{again:?}");
    }

    #[test]
    fn an_image_pull_failure_surfaces_in_ready() {
        let s = sandbox(Some(SandboxPhase::Pending));
        let mut p = pod("Pending", false);
        p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "main".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("Back-off pulling image \"nope\"".into()),
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]);
        let status = status_of(&plan(&s, Some(&p)));
        assert_eq!(status.phase, Some(SandboxPhase::Pending));
        let ready = status.condition(READY).unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "StartContainerFailed");
        assert!(ready.message.contains("ImagePullBackOff"), "{}", ready.message);
    }

    #[test]
    fn a_failed_pod_fails_the_sandbox_and_a_vanished_one_too() {
        let s = sandbox(Some(SandboxPhase::Pending));
        let status = status_of(&plan(&s, Some(&pod("Failed", false))));
        assert_eq!(status.phase, Some(SandboxPhase::Failed));
        assert_eq!(status.message.as_deref(), Some("Pod status phase is Failed"));
        let running = sandbox(Some(SandboxPhase::Running));
        let status = status_of(&plan(&running, None));
        assert_eq!(status.phase, Some(SandboxPhase::Failed));
        assert_eq!(status.message.as_deref(), Some("Pod Not Found"));
    }

    #[test]
    fn pause_deletes_the_pod_and_resume_creates_it_again() {
        let mut s = sandbox(Some(SandboxPhase::Running));
        s.spec.paused = Some(true);
        let running = pod("Running", true);
        let p = plan(&s, Some(&running));
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Paused));
        assert_eq!(status.condition(PAUSED).unwrap().reason, "Pending");
        assert_eq!(p.actions.last(), Some(&PodAction::DeletePod { uid: "pod-uid".into() }));
        // Gone ⇒ paused.
        let s = applied(s, &p);
        let p = plan(&s, None);
        let status = status_of(&p);
        assert_eq!(status.condition(PAUSED).unwrap().reason, "StopPauseSucceed");
        assert!(status.condition(PAUSED).is_some_and(conditions::is_true));
        // Resume ⇒ Resuming and a new Pod.
        let mut s = applied(s, &p);
        s.spec.paused = Some(false);
        let p = plan(&s, None);
        assert_eq!(status_of(&p).phase, Some(SandboxPhase::Resuming));
        assert!(matches!(p.actions.last(), Some(PodAction::CreatePod(_))));
        // Running ⇒ Running, SandboxResumed=True, SandboxPaused removed.
        let s = applied(s, &p);
        let status = status_of(&plan(&s, Some(&running)));
        assert_eq!(status.phase, Some(SandboxPhase::Running));
        assert_eq!(status.condition(RESUMED).unwrap().reason, "ResumePod");
        assert!(status.condition(PAUSED).is_none());
    }

    #[test]
    fn deletion_deletes_the_pod_then_releases_the_finalizer() {
        let mut s = sandbox(Some(SandboxPhase::Running));
        s.metadata.deletion_timestamp = Some(Time(now()));
        let running = pod("Running", true);
        assert_eq!(
            plan(&s, Some(&running)).actions.last(),
            Some(&PodAction::DeletePod { uid: "pod-uid".into() })
        );
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        assert!(plan(&s, Some(&deleting)).actions.is_empty());
        assert_eq!(plan(&s, None).actions, vec![PodAction::RemoveFinalizer]);
    }

    #[test]
    fn a_pod_of_another_owner_is_never_touched() {
        let s = sandbox(Some(SandboxPhase::Pending));
        let mut other = pod("Running", true);
        other.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        let p = plan(&s, Some(&other));
        assert!(
            p.actions
                .iter()
                .all(|a| !matches!(a, PodAction::CreatePod(_) | PodAction::DeletePod { .. }))
        );
        assert_eq!(status_of(&p).condition(READY).unwrap().reason, "PodOwnerMismatch");
        assert_eq!(p.requeue_after, Some(POD_RECHECK));
    }

    #[test]
    fn a_reference_sandbox_with_its_running_pod_is_adopted_as_it_is() {
        // The reference wrote the status and the Pod; nothing but the status sync happens.
        let mut s = sandbox(Some(SandboxPhase::Running));
        s.metadata.finalizers = None;
        let p = plan(&s, Some(&pod("Running", true)));
        assert!(
            p.actions.iter().all(|a| matches!(
                a,
                PodAction::EnsureMetadata { finalizer: true, immutable_hash: None }
                    | PodAction::UpdateStatus(_)
            )),
            "{p:?}"
        );
    }

    fn plan_own(s: &Sandbox, pod: Option<&Pod>) -> Plan<PodAction> {
        let o = options();
        let observed = PodObservation { template: s.spec.template.as_ref(), pod, options: &o };
        plan_pod_sandbox(s, &observed, now())
    }

    fn with_uid(mut pod: Pod, uid: &str) -> Pod {
        pod.metadata.uid = Some(uid.into());
        pod
    }

    fn has_pod_write(p: &Plan<PodAction>) -> bool {
        p.actions.iter().any(|a| matches!(a, PodAction::CreatePod(_) | PodAction::DeletePod { .. }))
    }

    #[test]
    fn a_restart_marks_the_request_then_recreates_the_pod() {
        let running = pod("Running", true);
        let s = sandbox(Some(SandboxPhase::Pending));
        let mut s = applied(s.clone(), &plan(&s, Some(&running)));
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::RESTART_REQUESTED_AT.into(), "t1".into());
        let p = plan(&s, Some(&running));
        assert_eq!(p.actions[0], PodAction::MarkRestarted("t1".into()), "{p:?}");
        assert_eq!(status_of(&p).condition(READY).unwrap().reason, RESTARTING);
        assert!(p.actions.contains(&PodAction::Event {
            type_: EventType::Normal,
            reason: "SandboxRestarted",
            message: "Sandbox processes restarted".into(),
        }));
        assert_eq!(p.actions.last(), Some(&PodAction::DeletePod { uid: "pod-uid".into() }));
        // Acted on: the old Pod is deleted (again, from a lagging cache), waited for, replaced.
        let mut s = applied(s, &p);
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::RESTARTED_AT.into(), "t1".into());
        assert_eq!(
            plan(&s, Some(&running)).actions,
            vec![PodAction::DeletePod { uid: "pod-uid".into() }]
        );
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        let p = plan(&s, Some(&deleting));
        assert!(p.actions.is_empty() && p.requeue_after == Some(POD_RECHECK), "{p:?}");
        let p = plan(&s, None);
        assert!(matches!(p.actions.last(), Some(PodAction::CreatePod(_))), "{p:?}");
        assert!(p.actions.iter().all(|a| !matches!(a, PodAction::UpdateStatus(_))));
        // The new Pod runs: Running and Ready, its uid recorded, nothing more to do.
        let fresh = with_uid(pod("Running", true), "pod-2");
        let p = plan(&s, Some(&fresh));
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Running));
        assert!(status.condition(READY).is_some_and(conditions::is_true));
        assert_eq!(status.pod_info.unwrap().pod_uid.as_deref(), Some("pod-2"));
        assert!(!has_pod_write(&p), "{p:?}");
        assert!(plan(&applied(s, &p), Some(&fresh)).actions.is_empty());
    }

    #[test]
    fn an_upgrade_recreates_the_pod_from_the_new_template_then_succeeds() {
        let running = pod("Running", true);
        let s = sandbox(Some(SandboxPhase::Pending));
        let mut s = applied(s.clone(), &plan_own(&s, Some(&running)));
        let old_revision = s.status.as_ref().unwrap().update_revision.clone().unwrap();
        // A SandboxUpdateOps sets the policy and patches the template.
        s.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
            type_: Some(oka_api::common::UpgradePolicyType::Recreate),
        });
        let spec = s.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        spec.containers[0].image = Some("busybox:2".into());
        let new_revision = sandbox_revision(&s.spec);
        assert_ne!(new_revision, old_revision);
        let p = plan_own(&s, Some(&running));
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Upgrading));
        assert_eq!(status.condition(UPGRADING).unwrap().reason, "UpgradePod");
        assert_eq!(status.update_revision.as_deref(), Some(old_revision.as_str()));
        assert_eq!(p.actions.last(), Some(&PodAction::DeletePod { uid: "pod-uid".into() }));
        // The old Pod gone: the new one at the new revision, with the new image.
        let s = applied(s, &p);
        let p = plan_own(&s, None);
        let Some(PodAction::CreatePod(new_pod)) = p.actions.last() else { panic!("{p:?}") };
        assert_eq!(new_pod.metadata.labels.as_ref().unwrap()["pod-template-hash"], new_revision);
        let image = new_pod.spec.as_ref().unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("busybox:2"));
        let s = applied(s, &p);
        // Starting: left alone, still Upgrading (however often the Pod changes meanwhile).
        let starting = with_uid(pod("Pending", false), "pod-2");
        let p = plan_own(&s, Some(&starting));
        assert!(!has_pod_write(&p), "{p:?}");
        let s = if p.actions.is_empty() { s } else { applied(s, &p) };
        assert!(!has_pod_write(&plan_own(&s, Some(&starting))));
        assert_eq!(s.phase(), Some(&SandboxPhase::Upgrading));
        // It runs: Running, Upgrading=True/Succeeded, the new revision.
        let fresh = with_uid(pod("Running", true), "pod-2");
        let p = plan_own(&s, Some(&fresh));
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Running));
        let upgrading = status.condition(UPGRADING).unwrap();
        assert_eq!((upgrading.status.as_str(), upgrading.reason.as_str()), ("True", "Succeeded"));
        assert_eq!(status.update_revision.as_deref(), Some(new_revision.as_str()));
        assert!(plan_own(&applied(s, &p), Some(&fresh)).actions.is_empty());
    }

    #[test]
    fn what_pods_do_not_honour_is_named_and_a_reuse_kill_deletes() {
        let mut s = sandbox(Some(SandboxPhase::Running));
        let mut current = pod("Running", true);
        current
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("pod-template-hash".into(), sandbox_revision(&s.spec));
        assert!(unhonoured(&s, Some(&current)).is_empty());
        s.spec.auto_pause_policy =
            Some(oka_api::probes::AutoPausePolicy::new(oka_api::probes::PauseRule::new("idle")));
        s.spec.lifecycle = Some(oka_api::common::SandboxLifecycle {
            pre_upgrade: Some(Default::default()),
            ..Default::default()
        });
        let fields: Vec<_> = unhonoured(&s, Some(&current)).iter().map(|u| u.field).collect();
        assert_eq!(fields, ["spec.autoPausePolicy", "spec.lifecycle"]);
        let message = &unhonoured(&s, None)[0].message;
        assert!(message.starts_with("spec.autoPausePolicy: not applied on a Pod"), "{message}");
        assert!(message.contains("agents.kruise.io/runtime: node"), "{message}");
        // A template change without an upgradePolicy on a running Pod is not applied in place.
        let mut changed = sandbox(Some(SandboxPhase::Running));
        let spec = changed.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        spec.containers[0].image = Some("busybox:2".into());
        let mut running = pod("Running", true);
        running
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("pod-template-hash".into(), sandbox_revision(&sandbox(None).spec));
        let fields: Vec<_> = unhonoured(&changed, Some(&running)).iter().map(|u| u.field).collect();
        assert_eq!(fields, ["spec.template"]);
        // Reuse on kill: named, and the sandbox is deleted.
        let mut killed = sandbox(Some(SandboxPhase::Running));
        killed
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::CLEANUP.into(), "true".into());
        let fields: Vec<_> = unhonoured(&killed, None).iter().map(|u| u.field).collect();
        assert_eq!(fields, [annotations::CLEANUP]);
        assert_eq!(plan(&killed, Some(&current)).actions, vec![PodAction::DeleteSandbox]);
    }

    #[test]
    fn a_paused_sandbox_resumes_for_its_upgrade_then_upgrades() {
        // Paused (the Pod gone), with the policy and the trigger a SandboxUpdateOps writes.
        let mut s = sandbox(Some(SandboxPhase::Running));
        s.spec.paused = Some(true);
        let running = pod("Running", true);
        let s = applied(s.clone(), &plan_own(&s, Some(&running)));
        let mut s = applied(s.clone(), &plan_own(&s, None));
        assert!(s.condition(PAUSED).is_some_and(conditions::is_true));
        s.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
            type_: Some(oka_api::common::UpgradePolicyType::Recreate),
        });
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::UPGRADE_RESUME_TRIGGER.into(), "true".into());
        let p = plan_own(&s, None);
        let status = status_of(&p);
        assert_eq!(status.phase, Some(SandboxPhase::Upgrading));
        assert_eq!(status.condition(UPGRADING).unwrap().reason, "Resuming");
        assert!(matches!(p.actions.last(), Some(PodAction::CreatePod(_))), "{p:?}");
        // Its Pod runs: ResumeSucceed, and it waits for the template.
        let s = applied(s, &p);
        let resumed = with_uid(pod("Running", true), "pod-2");
        let p = plan_own(&s, Some(&resumed));
        let status = status_of(&p);
        assert_eq!(status.condition(UPGRADING).unwrap().reason, "ResumeSucceed");
        assert!(status.condition(PAUSED).is_none());
        let mut s = applied(s, &p);
        assert!(plan_own(&s, Some(&resumed)).actions.is_empty());
        // The template is patched: the resumed Pod is replaced.
        let spec = s.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        spec.containers[0].image = Some("busybox:2".into());
        let p = plan_own(&s, Some(&resumed));
        assert_eq!(status_of(&p).condition(UPGRADING).unwrap().reason, "UpgradePod");
        assert_eq!(p.actions.last(), Some(&PodAction::DeletePod { uid: "pod-2".into() }));
    }

    #[test]
    fn a_failed_upgrade_waits_for_the_spec_to_change_again() {
        let mut s = sandbox(Some(SandboxPhase::Pending));
        let running = pod("Running", true);
        s = applied(s.clone(), &plan_own(&s, Some(&running)));
        s.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
            type_: Some(oka_api::common::UpgradePolicyType::Recreate),
        });
        let spec = s.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        spec.containers[0].image = Some("broken".into());
        s.metadata.generation = Some(2);
        let s = applied(s.clone(), &plan_own(&s, Some(&running)));
        let s = applied(s.clone(), &plan_own(&s, None));
        let crashed = with_uid(pod("Failed", false), "pod-2");
        let p = plan_own(&s, Some(&crashed));
        let failed = status_of(&p).condition(UPGRADING).cloned().unwrap();
        assert_eq!(
            (failed.reason.as_str(), failed.observed_generation),
            ("UpgradePodFailed", Some(2))
        );
        let mut s = applied(s, &p);
        assert!(plan_own(&s, Some(&crashed)).actions.is_empty(), "it waits");
        // A fixed template (a new generation): the failed Pod is replaced.
        let spec = s.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
        spec.containers[0].image = Some("busybox:2".into());
        s.metadata.generation = Some(3);
        let p = plan_own(&s, Some(&crashed));
        assert_eq!(status_of(&p).condition(UPGRADING).unwrap().reason, "UpgradePod");
        assert_eq!(p.actions.last(), Some(&PodAction::DeletePod { uid: "pod-2".into() }));
    }
}
