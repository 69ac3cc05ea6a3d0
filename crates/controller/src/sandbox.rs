//! The Sandbox controller (reference: `pkg/controller/sandbox`), first cut: one Sandbox, one
//! runtime instance, driven through a [`Runtime`].
//!
//! # Expected flow
//!
//! [`reconcile_sandbox`] inspects the sandbox's instance ([`Runtime::inspect`]), looks up its
//! pod template (inline, or the SandboxTemplate `spec.templateRef` names), and calls the pure
//! [`plan_sandbox`], whose rules are, in order:
//!
//! 1. **Deleting** (`deletionTimestamp` set): delete the instance ([`Runtime::delete`]), then
//!    remove the finalizer `agents.kruise.io/sandbox`.
//! 2. Neither `template` nor `templateRef`: ignored, as the reference does.
//! 3. The finalizer is added first, before anything can create an instance.
//! 4. **Timers** (reference §2.1.7): `shutdownTime` reached ⇒ delete the Sandbox object (unless
//!    the paused-retention annotation is set and `pauseTime` is reached too: then pause first,
//!    which moves the deadline). `pauseTime` reached and not paused ⇒ set `spec.paused: true`
//!    (with the retention annotation and a `shutdownTime`: both times become now + retention).
//!    Otherwise look again at the nearest of the two.
//! 5. **Succeeded / Failed** are terminal: nothing but the shutdown timer and deletion act.
//! 6. **Pending** (an empty phase is Pending): ensure the instance ([`Runtime::ensure`] with
//!    [`resolve_runtime_spec`]); once the runtime reports it Running ⇒ phase `Running`,
//!    `Ready=True` (`PodReady`), `nodeName`, `podInfo`. A template the local runtime cannot run
//!    ⇒ `Ready=False` (`PodCreateFailed`) with what to fix. An instance whose command already
//!    exited ⇒ `Succeeded` (code 0) or `Failed`, as a pod's phase would. A template naming an
//!    OCI image is created only once the image is pulled ([`image`]): until then `Ready=False`
//!    with the kubelet's reason (`ContainerCreating`, `ErrImagePull`, `ImagePullBackOff`,
//!    `ErrImageNeverPull`) and [`SandboxAction::PullImage`]; never on another root.
//! 7. **Running**: instance gone ⇒ `Failed`, "Pod Not Found"; command exited ⇒ `Succeeded` /
//!    `Failed`; `spec.paused` ⇒ phase `Paused` (`SandboxPaused=False/Pending`, `Ready=False`,
//!    `SandboxResumed` removed) and the pause verb of the [`PauseMode`]; a restart asked for
//!    ([`restart_requested`]: the annotation `agents.kruise.io/restart-requested-at` differs
//!    from `agents.kruise.io/restarted-at`) ⇒ record it in `restarted-at`, then stop the
//!    processes and start the command again on the same files; otherwise keep the instance
//!    running (thaw, restore or start it again) and `Ready` in line with it.
//! 8. **Paused**: until `SandboxPaused=True` the pause verb is repeated; once the runtime
//!    reports the instance frozen (freeze), hibernated or stopped ⇒ `SandboxPaused=True` with
//!    `FreezePauseSucceed` (oka), `SnapshotPauseSucceed` or `StopPauseSucceed`. Paused and
//!    `spec.paused: false` ⇒ phase `Resuming`, `SandboxResumed=False/CreatePod`.
//! 9. **Resuming**: the verb that undoes what the runtime reports (frozen ⇒
//!    [`Runtime::resume`], hibernated ⇒ [`Runtime::restore`], stopped ⇒ [`Runtime::ensure`]);
//!    Running ⇒ phase `Running`, `SandboxResumed=True/ResumePod`, `SandboxPaused` removed,
//!    `Ready=True`.
//! 10. **Upgrading** (a template change under an `upgradePolicy`, reference §2.1.6): the steps
//!     `PreUpgrade` → `Checkpointing` → `UpgradePod` (delete the instance, make it from the new
//!     template) → `PostUpgrade` → `Succeeded`, recorded in the `Upgrading` condition. A
//!     `spec.lifecycle.preUpgrade` / `postUpgrade` hook with a command is run by the executor
//!     ([`SandboxAction::RunHook`], through the [`HookRunner`] of [`SandboxOptions::hooks`]: the
//!     sandbox's envd process API, as root, within `timeoutSeconds` (≤ 0 ⇒ 60 s)); exit code 0
//!     moves on, anything else is `PreUpgradeFailed` / `PostUpgradeFailed` with the exit code and
//!     the end of stdout/stderr, and a Warning Event of that reason. The post hook runs after
//!     the `/init` replay. A failed step waits until the spec changes again (the reference's
//!     resume-from-failed-step table); without a hook runner a step with a hook fails, saying why.
//!
//! 10. **In place** (a Running sandbox whose template changed without an `upgradePolicy`,
//!     reference §2.1.4): [`SandboxAction::UpdateInPlace`] asks [`Runtime::update`]; limits
//!     change live (`InplaceUpdate=True/Succeeded` when anything changed, nothing for a
//!     metadata-only change); a new root (the first container's `image`, an absolute directory)
//!     answers `RestartRequired`, which the executor records as `InplaceUpdate=False/
//!     InplaceUpdating` and `Ready=False/InplaceUpdating`; the planner then deletes the instance
//!     and ensures it from the new spec (same Sandbox, same runtime id, fresh writable layer,
//!     Kubernetes' container restart on a new image), and once it runs: `Succeeded`, the new
//!     revision, `Ready=True` and the recorded `/init` replayed. `status.observedGeneration` of
//!     such a change is written with the executor's outcome, not before, so a claim waiting on
//!     it never takes the old state for the new. Other changes (command, env, network) cannot
//!     be made in place: `InplaceUpdate=False/Failed` with the runtime's reason.
//!
//! 11. **AutoPausePolicy** (oka extension, [`autopause`]): after the phase rules, the policy's
//!     decision on the drafted status: pause with the timers' write plus the `paused-by`
//!     marker, resume, or look again when a hold ends; `AutoPaused` records it. Only when no
//!     runtime verb is due.
//!
//! Every status carries `observedGeneration` and `updateRevision` ([`sandbox_revision`]; kept
//! while a pause is incomplete, as the reference does, so a template change made meanwhile is
//! still seen). [`execute`] applies a plan in order: metadata and spec writes, the status, then
//! the runtime verb. A runtime verb that fails writes its error into a condition (`Ready`
//! `PodCreateFailed`, `SandboxPaused` `CheckpointFailed` for hibernation, ...) and is retried
//! with backoff: a hibernation the runtime does not support yet shows its reason and succeeds
//! once it does. After a verb the reconcile inspects again and re-plans at once (up to
//! [`MAX_PASSES`] times), so create-to-Running is one reconcile.
//!
//! The runtime does not announce changes, so [`sandbox_controller`] polls [`Runtime::list`]
//! every [`SandboxOptions::runtime_poll`] and wakes the sandboxes whose instance changed (a
//! command that exited, an instance that vanished).
//!
//! # Guarantees
//!
//! - The planner is pure and reads the runtime only through the observation it is given.
//! - No instance exists without the finalizer on its Sandbox: the finalizer write precedes the
//!   first `ensure`, and the finalizer goes only after [`Runtime::delete`] succeeded.
//! - Re-planning a status the planner wrote, with the same observation and time, writes nothing.
//! - A planned requeue is exactly the next timer deadline.
//!
//! # Where this differs from the reference, and why
//!
//! - The finalizer is added on the first reconcile, not on the first pause: a local instance
//!   exists from the start and must be removed with its Sandbox. It is kept across resumes.
//! - The pause strategy is honoured (the reference always stops): none ⇒ freeze, `Hibernate`
//!   ⇒ checkpoint, `Stop` ⇒ end the processes and keep the writable layer. A freeze reports
//!   `SandboxPaused=True` with reason `FreezePauseSucceed`, which the reference does not have.
//! - `shutdownTime` also deletes Succeeded and Failed sandboxes (the reference stops at the
//!   terminal phase first, so a failed sandbox outlives its deadline).
//! - A timer is due when its time is reached (`<=`), also for `shutdownTime` (the reference:
//!   strictly after), so a requeue at the deadline acts.
//! - `sandboxIp` and `podInfo.podIP` are the sandbox's own address when it has one (outbound
//!   networking); a loopback-only sandbox has none. `podInfo.podUID` holds the runtime instance
//!   id.
//! - A failed upgrade step is tried again when the sandbox's `generation` moved past the one
//!   the failure recorded (the condition's `observedGeneration`), not when the template
//!   revision did: oka keeps the old revision in the status until the upgrade succeeds.
//!   `PostUpgradeFailed` resumes at `UpgradePod` (oka cannot tell the new instance's revision).
//! - CheckpointRestore upgrades are refused at `Checkpointing` (`CheckpointFailed`).
//! - A hook runs at least once: should its outcome not be written (a conflict, a crash), it
//!   runs again.
//! - A restart (`okactl restart sandbox`) is asked for with an annotation, not an OpenKruise
//!   ContainerRecreateRequest, and restarts the one process tree a local sandbox has. It is
//!   recorded before it is made, so a crash in between loses it rather than repeating it.
//! - "Pod" in the reference's messages ("Pod Not Found") means the runtime instance here.

pub mod autopause;
pub mod image;
pub mod imageconfig;
pub mod inputs;
pub mod recycle;
pub mod resolve;
pub mod startup;

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, Stream};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use oka_api::common::PauseStrategyType;
use oka_api::conditions::sandbox::{
    AUTO_PAUSED, INPLACE_UPDATE, PAUSED, READY, RECYCLING, RESUMED, RUNTIME_INITIALIZED, UPGRADING,
    auto_paused_reason, inplace_update_reason, paused_reason, ready_reason, recycling_reason,
    resumed_reason, runtime_initialized_reason, upgrading_reason,
};
use oka_api::conditions::{self, DEFAULT_MAX_MESSAGE_LEN, FALSE, TRUE, truncate_message};
use oka_api::sandbox::PodInfo;
use oka_api::{
    Sandbox, SandboxPhase, SandboxSet, SandboxStatus, SandboxTemplate, annotations, finalizers,
};
use oka_runtime_api::{
    ExitInfo, Operation, Runtime, RuntimeError, SandboxId, SandboxState,
    SandboxStatus as InstanceStatus, UpdateOutcome,
};
use oka_store::{Preconditions, Store, StoreError};
use tracing::{debug, info, warn};

use crate::Config;
use crate::events::{EventRecorder, EventType};
use crate::plan::{Clock, Plan, until, whole_seconds};
use crate::revision::sandbox_revision;
use crate::versions::WrittenVersions;
use image::{ImageState, TemplateImage};
use oka_cache::{Action, Controller};
use oka_cache::{Cache, Informers, ObjectKey};

pub use resolve::{
    DEFAULT_PIDS_LIMIT, ResolveError, hostname, resolve_runtime_spec, resolve_runtime_spec_with,
    runtime_id,
};

/// `SandboxPaused=True` reason of a frozen sandbox (oka extension: the reference never freezes).
pub const FREEZE_PAUSE_SUCCEED: &str = "FreezePauseSucceed";
/// How long a `Stop` pause lets the command handle SIGTERM before SIGKILL (the reference
/// deletes the pod with this grace period).
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The message of `Failed` when the instance disappeared (the reference's, about its pod).
pub const POD_NOT_FOUND: &str = "Pod Not Found";
/// How many plan-and-act passes one reconcile makes while each pass calls the runtime.
pub const MAX_PASSES: usize = 4;
/// When a reconcile has used its [`MAX_PASSES`] and the runtime still needs a verb: look again
/// after this long (a command that exits as soon as it is started is not restarted in a loop).
pub const RETRY_AFTER_ACTING: Duration = Duration::from_secs(1);

/// How a sandbox is paused: `spec.pauseStrategy.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseMode {
    /// No strategy given: freeze the processes ([`Runtime::pause`]); memory stays resident and
    /// resume is instant.
    Freeze,
    /// `Hibernate`: checkpoint the processes to disk and free the memory
    /// ([`Runtime::hibernate`]); resume restores them.
    Hibernate,
    /// `Stop`: end the processes and keep the writable layer ([`Runtime::stop`]); resume starts
    /// the command again on the same files.
    Stop,
}

impl PauseMode {
    /// The mode `sandbox.spec.pauseStrategy` asks for.
    pub fn of(sandbox: &Sandbox) -> Self {
        match sandbox.spec.pause_strategy.as_ref().and_then(|s| s.type_.as_ref()) {
            None => Self::Freeze,
            Some(PauseStrategyType::Hibernate) => Self::Hibernate,
            Some(PauseStrategyType::Stop) => Self::Stop,
        }
    }

    /// Whether an instance in `state` is paused well enough for this mode: frozen for a
    /// freeze, and hibernated or stopped for any mode (deeper than asked is paused too).
    pub fn is_reached_by(self, state: SandboxState) -> bool {
        match state {
            SandboxState::Hibernated | SandboxState::Stopped => true,
            SandboxState::Paused => self == Self::Freeze,
            SandboxState::Running | SandboxState::Gone => false,
        }
    }
}

/// One call into the runtime.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeAction {
    /// [`Runtime::ensure`]: create the instance, or start it again.
    Ensure(Box<oka_runtime_api::SandboxSpec>),
    /// [`Runtime::pause`] (freeze).
    Pause(SandboxId),
    /// [`Runtime::resume`] (thaw).
    Resume(SandboxId),
    /// [`Runtime::hibernate`].
    Hibernate(SandboxId),
    /// [`Runtime::restore`].
    Restore(SandboxId),
    /// [`Runtime::stop`] with this grace period.
    Stop {
        /// The instance.
        id: SandboxId,
        /// How long SIGTERM may take before SIGKILL.
        grace: Duration,
    },
    /// [`Runtime::delete`].
    Delete(SandboxId),
    /// A restart: [`Runtime::stop`] with this grace period, then [`Runtime::ensure`] of the
    /// same spec, so the command starts again on the same files.
    Restart {
        /// The instance's spec.
        spec: Box<oka_runtime_api::SandboxSpec>,
        /// How long SIGTERM may take before SIGKILL.
        grace: Duration,
    },
}

impl RuntimeAction {
    /// The runtime operation, for errors and logs.
    pub fn operation(&self) -> Operation {
        match self {
            Self::Ensure(_) => Operation::Ensure,
            Self::Pause(_) => Operation::Pause,
            Self::Resume(_) => Operation::Resume,
            Self::Hibernate(_) => Operation::Hibernate,
            Self::Restore(_) => Operation::Restore,
            Self::Stop { .. } => Operation::Stop,
            Self::Delete(_) => Operation::Delete,
            Self::Restart { .. } => Operation::Ensure,
        }
    }

    /// The instance it acts on.
    pub fn id(&self) -> &SandboxId {
        match self {
            Self::Ensure(spec) | Self::Restart { spec, .. } => &spec.id,
            Self::Pause(id)
            | Self::Resume(id)
            | Self::Hibernate(id)
            | Self::Restore(id)
            | Self::Stop { id, .. }
            | Self::Delete(id) => id,
        }
    }
}

/// One step the sandbox executor takes.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxAction {
    /// Add the finalizer `agents.kruise.io/sandbox`.
    AddFinalizer,
    /// Remove the finalizer (the instance is gone); this completes a pending deletion.
    RemoveFinalizer,
    /// `pauseTime` reached: set `spec.paused: true`, and when `until` is given also
    /// `shutdownTime` and `pauseTime` to it (paused retention).
    SetPaused {
        /// The new `shutdownTime` and `pauseTime`.
        until: Option<Time>,
        /// The auto-pause policy decided it: also the marker `agents.kruise.io/paused-by:
        /// auto-pause-policy` (see [`autopause`]).
        by_policy: bool,
    },
    /// The auto-pause policy's resume: `spec.paused: false`, the `paused-by` marker removed,
    /// a reached `pauseTime` cleared.
    AutoResume,
    /// Remove the `paused-by` marker (a user resumed a sandbox the policy paused).
    ClearPausedBy,
    /// Delete the Sandbox object (its finalizer then deletes the instance): `shutdownTime`
    /// reached, or its return to the pool cannot complete.
    Delete,
    /// Set `spec.shutdownTime` (a failed recycle kept by `cleanup-retain-on-failure`).
    SetShutdown(Time),
    /// Give the sandbox back to its pool: the metadata of a pool member again (see
    /// [`recycle::returned_to_pool`]); deletes it when its SandboxSet is gone.
    ReturnToPool,
    /// Record, in the annotation `agents.kruise.io/restarted-at`, the restart request acted on
    /// (written before the restart itself, so one request restarts at most once).
    MarkRestarted(String),
    /// Replace the status with this one.
    UpdateStatus(Box<SandboxStatus>),
    /// Replay the recorded `/init` to the agent runtime (its processes were started anew) and
    /// record the outcome in `RuntimeInitialized`.
    Initialize,
    /// A CheckpointRestore upgrade: move the processes, memory included, onto this spec
    /// ([`Runtime::checkpoint_restore`]), then record `Upgrading` `PostUpgrade`, or
    /// `CheckpointFailed` with the reason.
    CheckpointRestore(Box<oka_runtime_api::SandboxSpec>),
    /// Run an upgrade hook (`spec.lifecycle.preUpgrade` when `pre`, else `postUpgrade`) through
    /// the sandbox's agent runtime ([`HookRunner`]) and record the outcome in `Upgrading`: exit
    /// code 0 moves to the next step (`Checkpointing`, or `Succeeded` after the post hook);
    /// anything else is `PreUpgradeFailed` / `PostUpgradeFailed` with the exit code and output.
    RunHook {
        /// The preUpgrade hook (else the postUpgrade one).
        pre: bool,
    },
    /// The template changed without an `upgradePolicy`: change the instance in place
    /// ([`Runtime::update`]: resource limits), then record the new revision, with
    /// `InplaceUpdate` saying what happened when something had to change.
    UpdateInPlace {
        /// The instance's new spec.
        spec: Box<oka_runtime_api::SandboxSpec>,
        /// The revision it implements.
        revision: String,
    },
    /// Call the runtime.
    Runtime(RuntimeAction),
    /// Start pulling the template's OCI image (the executor's [`image::ImagePulls`]: one pull
    /// per reference at a time, on a task of its own; the sandbox is reconciled again when it
    /// ends). Applied by the reconcile after the plan's writes.
    PullImage {
        /// The image reference.
        reference: String,
    },
}

/// The pod template a sandbox runs, as its reconcile found it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TemplateSource<'a> {
    /// `spec.template`.
    Inline(&'a PodTemplateSpec),
    /// The `spec.template` of the SandboxTemplate `spec.templateRef` names.
    Referenced(&'a PodTemplateSpec),
    /// `spec.templateRef` names a SandboxTemplate that does not exist or has no template.
    Missing(&'a str),
    /// Neither `spec.template` nor `spec.templateRef`.
    Absent,
}

impl<'a> TemplateSource<'a> {
    /// The template of `sandbox`: its own, else the one of `referenced`, which must be the
    /// SandboxTemplate its `spec.templateRef` names (or `None` when that does not exist).
    pub fn of(sandbox: &'a Sandbox, referenced: Option<&'a SandboxTemplate>) -> Self {
        if let Some(template) = &sandbox.spec.template {
            return Self::Inline(template);
        }
        match &sandbox.spec.template_ref {
            None => Self::Absent,
            Some(reference) => match referenced.and_then(|t| t.spec.template.as_ref()) {
                Some(template) => Self::Referenced(template),
                None => Self::Missing(&reference.name),
            },
        }
    }

    /// The runtime spec of `sandbox` with this template.
    ///
    /// # Errors
    ///
    /// [`ResolveError`] when there is no template or it cannot run locally.
    pub fn resolve(&self, sandbox: &Sandbox) -> Result<oka_runtime_api::SandboxSpec, ResolveError> {
        self.resolve_with(sandbox, None, &inputs::PodInputs::default())
    }

    /// [`resolve`](Self::resolve) with the pulled image the template names, if any.
    ///
    /// # Errors
    ///
    /// [`ResolveError`] when there is no template, it cannot run locally, or its image is not
    /// pulled.
    pub fn resolve_with(
        &self,
        sandbox: &Sandbox,
        image: Option<&image::PulledImage>,
        inputs: &inputs::PodInputs,
    ) -> Result<oka_runtime_api::SandboxSpec, ResolveError> {
        match self {
            Self::Inline(template) | Self::Referenced(template) => {
                resolve::resolve_runtime_spec_from(sandbox, template, image, inputs)
            }
            Self::Missing(name) => Err(ResolveError::TemplateNotFound((*name).to_owned())),
            Self::Absent => Err(ResolveError::NoTemplate),
        }
    }
}

/// Everything [`plan_sandbox`] observes besides the Sandbox and the time.
#[derive(Debug, Clone, Copy)]
pub struct SandboxObservation<'a> {
    /// What the runtime reported for the sandbox's instance; `None` when it was not asked
    /// (then no rule that depends on the instance acts).
    pub runtime: Option<&'a InstanceStatus>,
    /// The sandbox's pod template.
    pub template: TemplateSource<'a>,
    /// The state of the OCI image the template names ([`ImageState::NotNeeded`] for a
    /// directory root or none).
    pub image: &'a ImageState,
    /// The name of this node, for `status.nodeName`.
    pub node_name: &'a str,
    /// The sandbox's `autoPausePolicy` (its own, else its SandboxTemplate's).
    pub auto_pause: Option<&'a oka_api::probes::AutoPausePolicy>,
    /// The sandbox's probes (its own, else its SandboxTemplate's).
    pub probes: &'a [oka_api::probes::SandboxProbe],
    /// The auto-pause policy's action budget for this sandbox.
    pub auto_pause_budget: autopause::Budget<'a>,
    /// The ConfigMaps and Secrets the template names, as read from the store.
    pub inputs: &'a inputs::PodInputs,
}

/// Why a Sandbox cannot be planned at all. Retrying does not help; changing it does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid sandbox: {0}")]
pub struct InvalidSandbox(#[from] pub ResolveError);

/// Why a sandbox reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The sandbox cannot be acted on.
    #[error(transparent)]
    Invalid(#[from] InvalidSandbox),
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Replaying `/init` to the agent runtime failed (also in `RuntimeInitialized`).
    #[error("agent runtime initialisation: {0}")]
    Initialize(String),
    /// A runtime call failed (its error is also in the sandbox's conditions).
    #[error("runtime {operation} of {id}: {source}")]
    Runtime {
        /// What was asked.
        operation: Operation,
        /// Of which instance.
        id: SandboxId,
        /// Why it failed.
        #[source]
        source: RuntimeError,
    },
}

/// Plans the next steps of `sandbox`; see the [module documentation](self) for the rules.
///
/// # Errors
///
/// [`InvalidSandbox`] when the object lacks a name, namespace or uid.
pub fn plan_sandbox(
    sandbox: &Sandbox,
    observed: &SandboxObservation<'_>,
    now: Timestamp,
) -> Result<Plan<SandboxAction>, InvalidSandbox> {
    let id = runtime_id(sandbox)?;
    let has_finalizer = has_finalizer(sandbox);
    if sandbox.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Plan::nothing());
        }
        return Ok(Plan::nothing()
            .with(SandboxAction::Runtime(RuntimeAction::Delete(id)))
            .with(SandboxAction::RemoveFinalizer));
    }
    if observed.template == TemplateSource::Absent {
        return Ok(Plan::nothing());
    }
    let mut plan = Plan::nothing();
    if !has_finalizer {
        plan = plan.with(SandboxAction::AddFinalizer);
    }

    // Timers.
    let phase = sandbox.phase().cloned().unwrap_or(SandboxPhase::Pending);
    let terminal = matches!(phase, SandboxPhase::Succeeded | SandboxPhase::Failed);
    match timer_step(sandbox, now) {
        TimerStep::Delete => return Ok(plan.with(SandboxAction::Delete)),
        TimerStep::Pause { until } => {
            return Ok(plan.with(SandboxAction::SetPaused { until, by_policy: false }));
        }
        TimerStep::Wait(Some(after)) => plan = plan.requeue_after(after),
        TimerStep::Wait(None) => {}
    }
    if terminal {
        return Ok(plan);
    }

    let before = sandbox.status.clone().unwrap_or_default();
    let mut draft = Draft::new(before.clone(), now);
    draft.status.observed_generation = sandbox.metadata.generation;
    let pulled = match observed.image {
        ImageState::Ready(image) => Some(image.as_ref()),
        _ => None,
    };
    let reference = match observed.template {
        TemplateSource::Inline(t) | TemplateSource::Referenced(t) => match TemplateImage::of(t) {
            TemplateImage::Reference(reference) => Some(reference),
            TemplateImage::None | TemplateImage::Directory(_) => None,
        },
        TemplateSource::Missing(_) | TemplateSource::Absent => None,
    };
    let ctx = PhaseContext {
        sandbox,
        id: &id,
        node_name: observed.node_name,
        spec: observed.template.resolve_with(sandbox, pulled, observed.inputs),
        image: reference.map(|r| (r, observed.image)),
        revision: sandbox_revision(&sandbox.spec),
        mode: PauseMode::of(sandbox),
    };
    if !matches!(
        phase,
        SandboxPhase::Pending
            | SandboxPhase::Running
            | SandboxPhase::Paused
            | SandboxPhase::Resuming
            | SandboxPhase::Recycling
            | SandboxPhase::Upgrading
    ) {
        // Terminating and unknown phases belong to another writer: left alone.
        return Ok(plan);
    }
    draft.status.phase = Some(phase.clone());
    // Return to the pool (see the `recycle` module): starts from Running, and gives up (the
    // sandbox is deleted) without a pool or after the timeout.
    let rejected = draft
        .condition(RECYCLING)
        .is_some_and(|c| c.reason == recycling_reason::REJECTED && c.status == FALSE);
    if recycle::recycle_requested(sandbox) && !rejected {
        let why = match phase {
            SandboxPhase::Paused => Some("recycling is not supported in Paused state"),
            SandboxPhase::Running if recycle::has_volume_claims(sandbox) => {
                Some("a sandbox with persistent volume claims cannot be recycled")
            }
            _ => None,
        };
        if let Some(why) = why {
            draft.set(RECYCLING, FALSE, recycling_reason::REJECTED, why);
        } else if phase == SandboxPhase::Running && !sandbox.is_paused() {
            if recycle::pool_of(sandbox).is_none() {
                let why = "the sandbox has no agents.kruise.io/sandbox-pool label";
                return Ok(recycle_failed(
                    plan,
                    sandbox,
                    draft,
                    recycling_reason::FAILED,
                    why,
                    now,
                ));
            }
            draft.status.phase = Some(SandboxPhase::Recycling);
            draft.set(RECYCLING, FALSE, recycling_reason::STARTED, "");
            let message = "Sandbox is being returned to its pool";
            draft.set(READY, FALSE, ready_reason::POD_READY, message);
        }
    }
    let failed = draft.condition(RECYCLING).is_some_and(|c| {
        c.reason == recycling_reason::FAILED || c.reason == recycling_reason::TIMEOUT
    });
    if draft.status.phase == Some(SandboxPhase::Recycling) && failed {
        // Kept by `cleanup-retain-on-failure` until its shutdown time: nothing more to do.
        if draft.status != before {
            plan = plan.with(SandboxAction::UpdateStatus(Box::new(draft.status)));
        }
        return Ok(plan);
    }
    if draft.status.phase == Some(SandboxPhase::Recycling) {
        let started = draft.condition(RECYCLING).map(|c| c.last_transition_time.0);
        if started.is_some_and(|t| now.duration_since(t) > recycle::RECYCLE_TIMEOUT) {
            let why = format!(
                "the sandbox did not return to its pool within {}s",
                recycle::RECYCLE_TIMEOUT.as_secs()
            );
            return Ok(recycle_failed(plan, sandbox, draft, recycling_reason::TIMEOUT, &why, now));
        }
        plan = plan.requeue_after(Duration::from_secs(5));
    }
    // A phase change falls through to the rules of the new phase in the same pass (Pending →
    // Running → Paused, Paused → Resuming → Running), so the planner reaches its fixed point in
    // one step; at most one runtime verb is planned.
    let mut runtime_action = None;
    let mut in_place: Option<oka_runtime_api::SandboxSpec> = None;
    if let Some(rt) = observed.runtime {
        for _ in 0..4 {
            let Some(phase) = draft.status.phase.clone() else { break };
            runtime_action = match phase {
                SandboxPhase::Pending => {
                    draft.status.update_revision = Some(ctx.revision.clone());
                    pending(&mut draft, &ctx, rt)
                }
                SandboxPhase::Running if restarting_in_place(&draft) => {
                    restart_in_place(&mut draft, &ctx, rt)
                }
                SandboxPhase::Running if upgrade_due(sandbox, &draft, &ctx) => {
                    // Upgrade wins over pause (the reference's order).
                    draft.status.phase = Some(SandboxPhase::Upgrading);
                    draft.remove(UPGRADING);
                    draft.remove(PAUSED);
                    None
                }
                SandboxPhase::Running if in_place_due(&draft, &ctx, rt) => {
                    in_place = ctx.spec.as_ref().ok().cloned();
                    running(&mut draft, &ctx, rt)
                }
                SandboxPhase::Running => {
                    draft.status.update_revision = Some(ctx.revision.clone());
                    running(&mut draft, &ctx, rt)
                }
                SandboxPhase::Paused if upgrade_resume_triggered(sandbox, &draft) => {
                    draft.status.phase = Some(SandboxPhase::Upgrading);
                    draft.remove(UPGRADING);
                    None
                }
                SandboxPhase::Paused => paused(&mut draft, &ctx, rt),
                SandboxPhase::Upgrading => upgrading(&mut draft, &ctx, rt),
                SandboxPhase::Resuming => resuming(&mut draft, &ctx, rt),
                SandboxPhase::Recycling => recycling(&mut draft, &ctx, rt),
                _ => None,
            };
            if runtime_action.is_some() || draft.status.phase.as_ref() == Some(&phase) {
                break;
            }
        }
    } else if phase == SandboxPhase::Pending {
        draft.status.update_revision = Some(ctx.revision.clone());
    }
    if draft.return_to_pool {
        plan = plan.with(SandboxAction::ReturnToPool);
    }
    if let Some(wait) = draft.pull_requeue {
        plan = plan.requeue_after(wait);
    }
    // The sandbox's own address, where it has one (outbound networking), as a pod's IP.
    if let Some(rt) = observed.runtime
        && draft.status.phase == Some(SandboxPhase::Running)
        && rt.state == SandboxState::Running
    {
        let ip = rt.address.map(|a| a.to_string());
        if draft.status.sandbox_ip != ip {
            draft.status.sandbox_ip.clone_from(&ip);
            draft.status.pod_info.get_or_insert_with(PodInfo::default).pod_ip = ip;
        }
    }
    // New processes of a sandbox that was initialised know nothing of its `/init`: mark it to
    // be replayed once they run (after a resume that started the command again, a restart).
    let renews = match &runtime_action {
        Some(RuntimeAction::Restart { .. }) => true,
        Some(RuntimeAction::Ensure(_)) => matches!(
            draft.status.phase,
            Some(SandboxPhase::Running | SandboxPhase::Resuming | SandboxPhase::Upgrading)
        ),
        _ => false,
    };
    if renews && has_init_request(sandbox) {
        let waiting = "Waiting for pod ready before initialization";
        draft.set(RUNTIME_INITIALIZED, FALSE, runtime_initialized_reason::PENDING, waiting);
    }
    // A hook runs after the replay, as the reference initialises before its hooks.
    let hook = draft.hook.filter(|_| runtime_action.is_none());
    // The auto-pause policy (see `autopause`): after the phase rules, so it reads the drafted
    // Ready and SandboxPaused; it acts only when no runtime verb is due.
    let step = autopause::decide(
        sandbox,
        observed.auto_pause,
        observed.probes,
        &draft.status,
        &observed.auto_pause_budget,
        now,
    );
    if let Some((status, reason, message)) = &step.condition {
        draft.set(AUTO_PAUSED, status, reason, message);
    }
    let mut policy_action = None;
    if runtime_action.is_none() && !step.clear_marker {
        match step.decision {
            autopause::Decision::Pause => {
                let until = match (oka_api::retention::of(sandbox), &sandbox.spec.shutdown_time) {
                    (Some(retention), Some(_)) => {
                        Some(whole_seconds(now.checked_add(retention).unwrap_or(Timestamp::MAX)))
                    }
                    _ => None,
                };
                policy_action = Some(SandboxAction::SetPaused { until, by_policy: true });
            }
            autopause::Decision::Resume => policy_action = Some(SandboxAction::AutoResume),
            autopause::Decision::Wait(wait) => plan = plan.requeue_after(wait),
            autopause::Decision::Nothing => {}
        }
    }
    let initialize = runtime_action.is_none()
        && (draft.status.phase == Some(SandboxPhase::Running) || hook.is_some())
        && observed.runtime.is_some_and(|rt| rt.state == SandboxState::Running)
        && draft.condition(RUNTIME_INITIALIZED).is_some_and(|c| c.status != TRUE);
    let checkpointing = draft.status.phase == Some(SandboxPhase::Upgrading)
        && draft.condition(UPGRADING).is_some_and(|c| c.reason == upgrading_reason::CHECKPOINTING)
        && sandbox.spec.upgrade_policy.as_ref().and_then(|p| p.type_)
            == Some(oka_api::common::UpgradePolicyType::CheckpointRestore)
        && observed
            .runtime
            .is_some_and(|rt| matches!(rt.state, SandboxState::Running | SandboxState::Paused));
    if in_place.is_some() {
        // The generation is observed once the change is made (or its restart started): the
        // executor's write records it, so a claim waiting for its in-place update does not
        // take the status written before it for the outcome.
        draft.status.observed_generation = before.observed_generation;
    }
    if draft.status != before {
        plan = plan.with(SandboxAction::UpdateStatus(Box::new(draft.status)));
    }
    if matches!(runtime_action, Some(RuntimeAction::Restart { .. }))
        && let Some(requested) = restart_requested(sandbox)
    {
        plan = plan.with(SandboxAction::MarkRestarted(requested.to_owned()));
    }
    if step.clear_marker {
        // A metadata write, before any runtime verb (the resume a user asked for goes on).
        plan = plan.with(SandboxAction::ClearPausedBy);
    }
    if let Some(action) = runtime_action {
        plan = plan.with(SandboxAction::Runtime(action));
    }
    if draft.pull_start
        && let Some(reference) = reference
    {
        plan = plan.with(SandboxAction::PullImage { reference: reference.to_owned() });
    }
    if initialize {
        plan = plan.with(SandboxAction::Initialize);
    }
    if checkpointing
        && !plan.actions.iter().any(is_runtime_verb)
        && let Ok(spec) = &ctx.spec
    {
        plan = plan.with(SandboxAction::CheckpointRestore(Box::new(spec.clone())));
    }
    if let Some(pre) = hook {
        plan = plan.with(SandboxAction::RunHook { pre });
    }
    if let Some(spec) = in_place.filter(|_| !plan.actions.iter().any(is_runtime_verb)) {
        let revision = ctx.revision.clone();
        plan = plan.with(SandboxAction::UpdateInPlace { spec: Box::new(spec), revision });
    }
    if let Some(action) = policy_action.filter(|_| !plan.actions.iter().any(is_runtime_verb)) {
        plan = plan.with(action);
    }
    Ok(plan)
}

/// What the phase rules read besides the draft and the runtime.
struct PhaseContext<'a> {
    sandbox: &'a Sandbox,
    id: &'a SandboxId,
    node_name: &'a str,
    spec: Result<oka_runtime_api::SandboxSpec, ResolveError>,
    /// The OCI image reference the template names, with its state.
    image: Option<(&'a str, &'a ImageState)>,
    revision: String,
    mode: PauseMode,
}

impl PhaseContext<'_> {
    /// Ensure the instance, or report in `Ready` why its spec cannot be run.
    fn ensure(&self, draft: &mut Draft) -> Option<RuntimeAction> {
        if let Some((reference, state)) = self.image {
            let step = image::pull_step(reference, state, draft.now.0);
            if let Some((reason, message)) = step.waiting {
                draft.set(READY, FALSE, reason, &message);
                draft.pull_start |= step.start;
                if let Some(wait) = step.requeue_after {
                    draft.pull_requeue = Some(draft.pull_requeue.map_or(wait, |w| w.min(wait)));
                }
                return None;
            }
        }
        match &self.spec {
            Ok(spec) => Some(RuntimeAction::Ensure(Box::new(spec.clone()))),
            Err(
                error @ (ResolveError::ImageUser { .. }
                | ResolveError::ContainerConfig { .. }
                | ResolveError::RunAsRoot { .. }),
            ) => {
                let reason = image::reason::CREATE_CONTAINER_CONFIG_ERROR;
                draft.set(READY, FALSE, reason, &error.to_string());
                // A missing object may be created; an image's or a template's content may not.
                if matches!(error, ResolveError::ContainerConfig { .. }) {
                    draft.pull_requeue = Some(INPUTS_RETRY);
                }
                None
            }
            Err(error @ ResolveError::FailedMount { .. }) => {
                draft.set(READY, FALSE, FAILED_MOUNT, &error.to_string());
                draft.pull_requeue = Some(INPUTS_RETRY);
                None
            }
            Err(error @ ResolveError::Unsupported(_)) => {
                draft.set(READY, FALSE, UNSUPPORTED_BY_RUNTIME, &error.to_string());
                None
            }
            Err(error) => {
                draft.set(READY, FALSE, ready_reason::POD_CREATE_FAILED, &error.to_string());
                None
            }
        }
    }

    /// The verb of this sandbox's pause mode.
    fn pause_verb(&self) -> RuntimeAction {
        let id = self.id.clone();
        match self.mode {
            PauseMode::Freeze => RuntimeAction::Pause(id),
            PauseMode::Hibernate => RuntimeAction::Hibernate(id),
            PauseMode::Stop => RuntimeAction::Stop { id, grace: STOP_GRACE },
        }
    }

    /// The instance runs: phase Running, Ready, where it runs.
    fn to_running(&self, draft: &mut Draft) {
        draft.status.phase = Some(SandboxPhase::Running);
        draft.set(READY, TRUE, ready_reason::POD_READY, "");
        draft.status.node_name = Some(self.node_name.to_owned());
        let info = draft.status.pod_info.get_or_insert_with(PodInfo::default);
        info.node_name = Some(self.node_name.to_owned());
        info.pod_uid = Some(self.id.to_string());
        if let Some((_, ImageState::Ready(image))) = self.image {
            let id = image.image_id();
            let annotations = info.annotations.get_or_insert_with(Default::default);
            if annotations.get(image::IMAGE_ID) != Some(&id) {
                annotations.insert(image::IMAGE_ID.to_owned(), id);
            }
        }
    }
}

fn pending(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    match (rt.state, rt.last_exit) {
        (SandboxState::Running, _) => {
            ctx.to_running(draft);
            None
        }
        (SandboxState::Paused, _) => Some(RuntimeAction::Resume(ctx.id.clone())),
        (SandboxState::Hibernated, _) => Some(RuntimeAction::Restore(ctx.id.clone())),
        (SandboxState::Stopped, Some(exit)) => {
            draft.finish(exit);
            None
        }
        (SandboxState::Stopped | SandboxState::Gone, _) => ctx.ensure(draft),
    }
}

fn running(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    match (rt.state, rt.last_exit) {
        (SandboxState::Gone, _) => {
            draft.fail(&format!("{POD_NOT_FOUND}: the runtime has no instance {}", ctx.id));
            None
        }
        (SandboxState::Stopped, Some(exit)) => {
            draft.finish(exit);
            None
        }
        _ if ctx.sandbox.is_paused() => {
            draft.status.phase = Some(SandboxPhase::Paused);
            draft.remove(RESUMED);
            // A pause starts Pending (an earlier failure of this pause is kept).
            if draft.condition(PAUSED).is_none_or(|c| c.status != FALSE) {
                draft.set(PAUSED, FALSE, paused_reason::PENDING, "");
            }
            draft.set(READY, FALSE, ready_reason::POD_READY, "Sandbox is paused");
            pause_step(draft, ctx, rt)
        }
        (SandboxState::Running, _) => {
            ctx.to_running(draft);
            match (&ctx.spec, restart_requested(ctx.sandbox)) {
                (Ok(spec), Some(_)) => {
                    Some(RuntimeAction::Restart { spec: Box::new(spec.clone()), grace: STOP_GRACE })
                }
                _ => None,
            }
        }
        (state, _) => {
            let message = format!("the sandbox instance is {state}");
            draft.set(READY, FALSE, ready_reason::POD_READY, &message);
            undo_pause(draft, ctx, state)
        }
    }
}

/// The restart request of `sandbox` not acted on yet: its `restart-requested-at` annotation when
/// it differs from its `restarted-at`.
pub fn restart_requested(sandbox: &Sandbox) -> Option<&str> {
    let annotations = sandbox.metadata.annotations.as_ref()?;
    let requested = annotations.get(annotations::RESTART_REQUESTED_AT)?;
    (annotations.get(annotations::RESTARTED_AT) != Some(requested)).then_some(requested.as_str())
}

/// Whether a Running sandbox starts an upgrade: its template changed (the revision differs from
/// the one its status reports) and its `upgradePolicy` asks for Recreate or CheckpointRestore.
fn upgrade_due(sandbox: &Sandbox, draft: &Draft, ctx: &PhaseContext<'_>) -> bool {
    let policy = sandbox.spec.upgrade_policy.as_ref().and_then(|p| p.type_);
    policy.is_some() && draft.status.update_revision.as_deref() != Some(ctx.revision.as_str())
}

/// The `InplaceUpdate` message of an in-place restart once the old instance is gone: the
/// instance from then on runs the new spec.
const RESTARTED_ON_NEW_ROOT: &str =
    "the old instance is gone; the sandbox restarts on its new root";

/// Whether a Running sandbox is restarting in place on a new root (`InplaceUpdate` is
/// `InplaceUpdating`: the runtime answered that its new spec needs a restart).
fn restarting_in_place(draft: &Draft) -> bool {
    draft
        .condition(INPLACE_UPDATE)
        .is_some_and(|c| c.reason == inplace_update_reason::INPLACE_UPDATING)
}

/// The restart of an in-place update whose root changed (Kubernetes restarts a container whose
/// image changed in place; here the sandbox's one process tree restarts on the new root, same
/// Sandbox, same runtime id, a fresh writable layer, like a Recreate upgrade): the old instance
/// is deleted, then the new one ensured from the new spec; once it runs, `InplaceUpdate=True`
/// (`Succeeded`), the revision moves, `Ready=True` and a recorded `/init` is replayed. Until
/// then `Ready=False` (`InplaceUpdating`). The condition's message records that the old
/// instance is gone, so the restart continues after a crash at any step.
fn restart_in_place(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    let replaced =
        draft.condition(INPLACE_UPDATE).is_some_and(|c| c.message == RESTARTED_ON_NEW_ROOT);
    let updating = inplace_update_reason::INPLACE_UPDATING;
    match (replaced, rt.state, rt.last_exit) {
        (true, SandboxState::Running, _) => {
            draft.set(INPLACE_UPDATE, TRUE, inplace_update_reason::SUCCEEDED, "");
            draft.status.update_revision = Some(ctx.revision.clone());
            ctx.to_running(draft);
            if has_init_request(ctx.sandbox) {
                let waiting = "Waiting for pod ready before initialization";
                draft.set(RUNTIME_INITIALIZED, FALSE, runtime_initialized_reason::PENDING, waiting);
            }
            None
        }
        (true, SandboxState::Stopped, Some(exit)) => {
            draft.set(INPLACE_UPDATE, TRUE, inplace_update_reason::SUCCEEDED, "");
            draft.status.update_revision = Some(ctx.revision.clone());
            draft.finish(exit);
            None
        }
        (_, SandboxState::Gone, _) => {
            draft.set(INPLACE_UPDATE, FALSE, updating, RESTARTED_ON_NEW_ROOT);
            draft.set(
                READY,
                FALSE,
                ready_reason::INPLACE_UPDATING,
                "inplace update is incompleted",
            );
            ctx.ensure(draft)
        }
        (true, state, _) => {
            draft.set(
                READY,
                FALSE,
                ready_reason::INPLACE_UPDATING,
                "inplace update is incompleted",
            );
            undo_pause(draft, ctx, state)
        }
        (false, _, _) => {
            draft.set(
                READY,
                FALSE,
                ready_reason::INPLACE_UPDATING,
                "inplace update is incompleted",
            );
            Some(RuntimeAction::Delete(ctx.id.clone()))
        }
    }
}

/// Whether a Running sandbox's template changed without an `upgradePolicy` while its instance
/// runs: the change is made in place.
fn in_place_due(draft: &Draft, ctx: &PhaseContext<'_>, rt: &InstanceStatus) -> bool {
    ctx.sandbox.spec.upgrade_policy.as_ref().and_then(|p| p.type_).is_none()
        && ctx.spec.is_ok()
        && rt.state == SandboxState::Running
        && !ctx.sandbox.is_paused()
        && draft.status.update_revision.as_deref().is_some_and(|r| r != ctx.revision)
}

fn is_runtime_verb(action: &SandboxAction) -> bool {
    matches!(action, SandboxAction::Runtime(_))
}

/// Whether a paused sandbox is asked to resume for an upgrade (the SandboxUpdateOps's first
/// phase): annotation `agents.kruise.io/upgrade-resume-trigger=true` once its pause completed.
fn upgrade_resume_triggered(sandbox: &Sandbox, draft: &Draft) -> bool {
    let triggered =
        sandbox.metadata.annotations.as_ref().is_some_and(|a| {
            a.get(annotations::UPGRADE_RESUME_TRIGGER).is_some_and(|v| v == "true")
        });
    triggered && draft.condition(PAUSED).is_some_and(conditions::is_true)
}

/// The upgrade state machine (reference §2.1.6), one step per call; a step that completes
/// falls through to the next in the same pass.
///
/// - `PreUpgrade` / `PostUpgrade` with a hook that has a command plan [`SandboxAction::RunHook`]
///   (in [`Draft::hook`]) and stop: the executor writes the outcome into `Upgrading`.
/// - A failed step (`PreUpgradeFailed`, `CheckpointFailed`, `UpgradePodFailed`,
///   `PostUpgradeFailed`) waits. It is tried again only once the spec changed after the failure
///   (the condition's `observedGeneration` records the generation it failed at), as the
///   reference's resume-from-failed-step table says: `PreUpgradeFailed` → `PreUpgrade`,
///   `UpgradePodFailed` and `PostUpgradeFailed` → `UpgradePod` (oka cannot tell whether the new
///   instance already runs the newest template, so it makes it again), anything else →
///   `PreUpgrade`.
fn upgrading(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    use upgrading_reason as step;
    draft.set(READY, FALSE, ready_reason::UPGRADING, "sandbox is upgrading");
    if draft.condition(UPGRADING).is_none() {
        let first =
            if draft.condition(PAUSED).is_some() { step::RESUMING } else { step::PRE_UPGRADE };
        draft.set(UPGRADING, FALSE, first, "");
    }
    if let Some(failed) = draft.condition(UPGRADING).filter(|c| {
        c.observed_generation.is_some() && c.observed_generation != ctx.sandbox.metadata.generation
    }) {
        let again = match failed.reason.as_str() {
            step::PRE_UPGRADE_FAILED | step::CHECKPOINT_FAILED => Some(step::PRE_UPGRADE),
            step::UPGRADE_POD_FAILED | step::POST_UPGRADE_FAILED => Some(step::UPGRADE_POD),
            _ => None,
        };
        if let Some(again) = again {
            draft.set(UPGRADING, FALSE, again, "");
        }
    }
    let changed = draft.status.update_revision.as_deref() != Some(ctx.revision.as_str());
    for _ in 0..6 {
        let reason = draft.condition(UPGRADING).map(|c| c.reason.clone()).unwrap_or_default();
        match reason.as_str() {
            step::RESUMING => match rt.state {
                SandboxState::Running => {
                    draft.remove(PAUSED);
                    draft.set(UPGRADING, FALSE, step::RESUME_SUCCEED, "");
                }
                SandboxState::Gone => {
                    draft.fail(&format!("{POD_NOT_FOUND}: the runtime has no instance {}", ctx.id));
                    return None;
                }
                state => return undo_pause(draft, ctx, state),
            },
            step::RESUME_SUCCEED => {
                if changed {
                    draft.set(UPGRADING, FALSE, step::PRE_UPGRADE, "");
                } else if !upgrade_resume_requested(ctx.sandbox) {
                    // Abandoned before the template changed: back to Running.
                    draft.remove(UPGRADING);
                    ctx.to_running(draft);
                    return None;
                } else {
                    return None;
                }
            }
            step::PRE_UPGRADE => {
                if hook_of(ctx.sandbox, true).is_some() {
                    return match rt.state {
                        SandboxState::Running => {
                            draft.hook = Some(true);
                            None
                        }
                        SandboxState::Gone => {
                            let id = ctx.id;
                            draft.fail(&format!(
                                "{POD_NOT_FOUND}: the runtime has no instance {id}"
                            ));
                            None
                        }
                        // The hook runs in the instance: bring it back first.
                        state => undo_pause(draft, ctx, state),
                    };
                }
                draft.set(UPGRADING, FALSE, step::CHECKPOINTING, "");
            }
            step::CHECKPOINTING => {
                let policy = ctx.sandbox.spec.upgrade_policy.as_ref().and_then(|p| p.type_);
                if policy == Some(oka_api::common::UpgradePolicyType::CheckpointRestore) {
                    // The processes move with their memory onto the new spec (the executor
                    // records the outcome: PostUpgrade, or CheckpointFailed).
                    return None;
                }
                draft.set(UPGRADING, FALSE, step::UPGRADE_POD, "");
            }
            step::UPGRADE_POD | step::UPGRADE_POD_FAILED => {
                // The old instance goes first (Recreate: its files with it); once it is gone the
                // condition's message records that the instance there now is the new one.
                let replaced =
                    draft.condition(UPGRADING).is_some_and(|c| c.message == NEW_INSTANCE);
                match (replaced, rt.state) {
                    (true, SandboxState::Running) => {
                        if has_init_request(ctx.sandbox) {
                            let waiting = "Waiting for pod ready before initialization";
                            draft.set(
                                RUNTIME_INITIALIZED,
                                FALSE,
                                runtime_initialized_reason::PENDING,
                                waiting,
                            );
                        }
                        draft.set(UPGRADING, FALSE, step::POST_UPGRADE, "");
                    }
                    (_, SandboxState::Gone) => {
                        draft.set(UPGRADING, FALSE, step::UPGRADE_POD, NEW_INSTANCE);
                        return ctx.ensure(draft);
                    }
                    (true, state) => return undo_pause(draft, ctx, state),
                    (false, _) => return Some(RuntimeAction::Delete(ctx.id.clone())),
                }
            }
            step::POST_UPGRADE => {
                if hook_of(ctx.sandbox, false).is_some() {
                    if rt.state == SandboxState::Running {
                        draft.hook = Some(false);
                        return None;
                    }
                    return undo_pause(draft, ctx, rt.state);
                }
                draft.set(UPGRADING, TRUE, step::SUCCEEDED, "");
            }
            step::SUCCEEDED => {
                draft.status.update_revision = Some(ctx.revision.clone());
                ctx.to_running(draft);
                return None;
            }
            // Failed steps wait for the spec to change (above).
            step::PRE_UPGRADE_FAILED | step::CHECKPOINT_FAILED | step::POST_UPGRADE_FAILED => {
                return None;
            }
            _ => {
                draft.set(UPGRADING, FALSE, step::PRE_UPGRADE, "");
            }
        }
    }
    None
}

/// The `Upgrading` message of step `UpgradePod` once the old instance is gone: the instance
/// from then on is the new one.
const NEW_INSTANCE: &str = "the old instance is gone; the new one is starting";

/// Whether a SandboxUpdateOps still asks this sandbox to resume for its upgrade.
fn upgrade_resume_requested(sandbox: &Sandbox) -> bool {
    sandbox
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(annotations::UPGRADE_RESUME_TRIGGER).is_some_and(|v| v == "true"))
}

/// How long a hook may run when its `timeoutSeconds` is zero or negative (the reference's).
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of a hook's stdout and of its stderr a failure message quotes (each is cut to
/// its last bytes: the end of the output says most about the failure).
pub const HOOK_OUTPUT_QUOTE: usize = 256;

/// The upgrade hook of `sandbox` (`spec.lifecycle.preUpgrade` when `pre`, else `postUpgrade`)
/// when it has a non-empty `exec.command`: the command and its timeout (`timeoutSeconds`;
/// zero or negative ⇒ [`DEFAULT_HOOK_TIMEOUT`]). A hook without a command is no hook.
pub fn hook_of(sandbox: &Sandbox, pre: bool) -> Option<(&[String], Duration)> {
    let lifecycle = sandbox.spec.lifecycle.as_ref()?;
    let hook = if pre { lifecycle.pre_upgrade.as_ref() } else { lifecycle.post_upgrade.as_ref() }?;
    let command = hook.exec.as_ref()?.command.as_deref().filter(|c| !c.is_empty())?;
    let timeout = u64::try_from(hook.timeout_seconds)
        .ok()
        .filter(|s| *s > 0)
        .map_or(DEFAULT_HOOK_TIMEOUT, Duration::from_secs);
    Some((command, timeout))
}

/// The field name of a hook: `preUpgrade` or `postUpgrade`.
fn hook_name(pre: bool) -> &'static str {
    if pre { "preUpgrade" } else { "postUpgrade" }
}

/// What an upgrade hook's command ended with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HookOutcome {
    /// Its exit code (-1 when it was killed by a signal, as envd reports it).
    pub exit_code: i32,
    /// What it wrote to stdout (possibly only the end of it: runners bound what they keep).
    pub stdout: String,
    /// What it wrote to stderr (bounded as `stdout`).
    pub stderr: String,
}

/// The `Upgrading` message of a hook that ended with a non-zero exit code: the code, then the
/// last [`HOOK_OUTPUT_QUOTE`] bytes of stdout and of stderr (when not empty).
pub fn hook_failure_message(pre: bool, outcome: &HookOutcome) -> String {
    let mut message =
        format!("lifecycle.{} hook exited with code {}", hook_name(pre), outcome.exit_code);
    for (name, text) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        let text = text.trim();
        if !text.is_empty() {
            message.push_str(&format!("; {name}: {}", tail(text, HOOK_OUTPUT_QUOTE)));
        }
    }
    message
}

/// The last `max` bytes of `text` (on a character boundary), after `...` when cut.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// Runs a sandbox's upgrade hooks inside it: what the sandbox controller calls for
/// [`SandboxAction::RunHook`]. `oka serve` implements it over the manager's envd process
/// client (`process.Process/Start` as root, with the sandbox's access token).
pub trait HookRunner: Send + Sync + 'static {
    /// Runs `command[0]` with `command[1..]` as its arguments in `sandbox` as root, and returns
    /// its exit code and (bounded) output once it ended; `timeout` bounds the whole call (the
    /// command is killed when it runs longer). `Err` when it could not be run or did not end
    /// in time.
    fn run_hook<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        command: &'a [String],
        timeout: Duration,
    ) -> futures::future::BoxFuture<'a, Result<HookOutcome, String>>;
}

/// A shared [`HookRunner`].
pub type Hooks = Shared<dyn HookRunner>;

/// Whether `sandbox` was initialised with a recorded `/init` request (a claimed sandbox).
pub fn has_init_request(sandbox: &Sandbox) -> bool {
    sandbox
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(annotations::INIT_RUNTIME_REQUEST).is_some_and(|r| !r.is_empty()))
}

/// Replays a sandbox's recorded `/init` (annotation `agents.kruise.io/init-runtime-request`)
/// to its agent runtime: what the sandbox controller calls once new processes of an
/// initialised sandbox run. `oka serve` implements it over the manager's agent-runtime client.
pub trait RuntimeInitializer: Send + Sync + 'static {
    /// Sends the recorded request; idempotent (an agent runtime that holds the token already
    /// accepts it again).
    fn initialize<'a>(
        &'a self,
        sandbox: &'a Sandbox,
    ) -> futures::future::BoxFuture<'a, Result<(), String>>;
}

/// The verb that brings an instance in `state` back to Running.
fn undo_pause(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    state: SandboxState,
) -> Option<RuntimeAction> {
    match state {
        SandboxState::Paused => Some(RuntimeAction::Resume(ctx.id.clone())),
        SandboxState::Hibernated => Some(RuntimeAction::Restore(ctx.id.clone())),
        SandboxState::Stopped | SandboxState::Gone => ctx.ensure(draft),
        SandboxState::Running => None,
    }
}

/// A pause in progress: done when the runtime reports it, else the verb again.
fn pause_step(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    if rt.state == SandboxState::Gone {
        draft.fail(&format!("{POD_NOT_FOUND}: the runtime has no instance {}", ctx.id));
        return None;
    }
    if ctx.mode.is_reached_by(rt.state) {
        let reason = match rt.state {
            SandboxState::Hibernated => paused_reason::SNAPSHOT_PAUSE_SUCCEED,
            SandboxState::Stopped => paused_reason::STOP_PAUSE_SUCCEED,
            _ => FREEZE_PAUSE_SUCCEED,
        };
        draft.set(PAUSED, TRUE, reason, "");
        // The revision a completed pause reports is the current one.
        draft.status.update_revision = Some(ctx.revision.clone());
        return None;
    }
    Some(ctx.pause_verb())
}

fn paused(draft: &mut Draft, ctx: &PhaseContext<'_>, rt: &InstanceStatus) -> Option<RuntimeAction> {
    if !draft.condition(PAUSED).is_some_and(conditions::is_true) {
        // The revision stays what it was until the pause completes.
        if draft.condition(PAUSED).is_none() {
            draft.set(PAUSED, FALSE, paused_reason::PENDING, "");
        }
        draft.set(READY, FALSE, ready_reason::POD_READY, "Sandbox is paused");
        let verb = pause_step(draft, ctx, rt);
        if verb.is_some() || draft.status.phase != Some(SandboxPhase::Paused) {
            return verb;
        }
        // Paused now: go on with the rules of a completed pause.
    }
    draft.status.update_revision = Some(ctx.revision.clone());
    if !ctx.sandbox.is_paused() {
        draft.status.phase = Some(SandboxPhase::Resuming);
        draft.set(RESUMED, FALSE, resumed_reason::CREATE_POD, "");
        return None;
    }
    if rt.state == SandboxState::Gone {
        draft.fail(&format!("{POD_NOT_FOUND}: the runtime has no instance {}", ctx.id));
        return None;
    }
    if !ctx.mode.is_reached_by(rt.state) {
        // Running again behind our back, or the strategy asks for a deeper pause now.
        let message = format!("the sandbox instance is {}; pausing it again", rt.state);
        draft.set(PAUSED, FALSE, paused_reason::PENDING, &message);
        draft.set(READY, FALSE, ready_reason::POD_READY, "Sandbox is paused");
        return Some(ctx.pause_verb());
    }
    None
}

fn resuming(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    draft.status.update_revision = Some(ctx.revision.clone());
    match rt.state {
        SandboxState::Running => {
            draft.set(RESUMED, TRUE, resumed_reason::RESUME_POD, "");
            draft.remove(PAUSED);
            ctx.to_running(draft);
            None
        }
        SandboxState::Gone => {
            draft.fail(&format!("{POD_NOT_FOUND}: the runtime has no instance {}", ctx.id));
            None
        }
        state => undo_pause(draft, ctx, state),
    }
}

/// A sandbox on its way back to its pool: delete the instance, start a fresh one, then give
/// the sandbox back (see the `recycle` module's flow).
fn recycling(
    draft: &mut Draft,
    ctx: &PhaseContext<'_>,
    rt: &InstanceStatus,
) -> Option<RuntimeAction> {
    let completed =
        draft.condition(RECYCLING).is_some_and(|c| c.reason == recycling_reason::COMPLETED);
    match (completed, rt.state) {
        (true, SandboxState::Running) => {
            draft.return_to_pool = true;
            ctx.to_running(draft);
            draft.set(RECYCLING, TRUE, recycling_reason::SUCCEEDED, "");
            let count = draft.status.reuse_count().saturating_add(1);
            draft.status.set_reuse_count(count);
            None
        }
        (true, _) => ctx.ensure(draft),
        (false, SandboxState::Gone) => {
            draft.set(
                RECYCLING,
                FALSE,
                recycling_reason::COMPLETED,
                "a fresh instance is starting",
            );
            ctx.ensure(draft)
        }
        (false, _) => Some(RuntimeAction::Delete(ctx.id.clone())),
    }
}

/// A recycle that failed: `Recycling=False` with `reason`, then the sandbox is deleted, or, with
/// a valid `agents.kruise.io/cleanup-retain-on-failure` duration, kept until now + that long.
fn recycle_failed(
    mut plan: Plan<SandboxAction>,
    sandbox: &Sandbox,
    mut draft: Draft,
    reason: &str,
    why: &str,
    now: Timestamp,
) -> Plan<SandboxAction> {
    match recycle::retain_on_failure(sandbox) {
        Some(keep) => {
            draft.set(RECYCLING, FALSE, reason, why);
            let until = whole_seconds(now.checked_add(keep).unwrap_or(Timestamp::MAX));
            plan = plan.with(SandboxAction::UpdateStatus(Box::new(draft.status)));
            plan.with(SandboxAction::SetShutdown(until)).requeue_after(until_duration(keep))
        }
        None => plan.with(SandboxAction::Delete),
    }
}

fn until_duration(d: SignedDuration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// What a sandbox's timers ask for now (reference §2.1.7; every runtime's controller applies
/// the same rule).
#[derive(Debug, Clone, PartialEq)]
pub enum TimerStep {
    /// `shutdownTime` is reached: delete the Sandbox object.
    Delete,
    /// `pauseTime` is reached and the sandbox is not paused: set `spec.paused: true`, and both
    /// times to `until` when the paused-retention annotation and a `shutdownTime` are set.
    Pause {
        /// The new `pauseTime` and `shutdownTime`, if they move.
        until: Option<Time>,
    },
    /// Nothing due; look again after this long (the nearest deadline), if any.
    Wait(Option<Duration>),
}

/// The timers' rule: `shutdownTime` reached deletes (unless the retention annotation is set
/// and `pauseTime` is reached too: then pause first, which moves the deadline); `pauseTime`
/// reached on a sandbox that is neither paused nor ended pauses it.
pub fn timer_step(sandbox: &Sandbox, now: Timestamp) -> TimerStep {
    let phase = sandbox.phase().cloned().unwrap_or(SandboxPhase::Pending);
    let terminal = matches!(phase, SandboxPhase::Succeeded | SandboxPhase::Failed);
    let shutdown = sandbox.spec.shutdown_time.as_ref().map(|t| t.0);
    let pause_at =
        sandbox.spec.pause_time.as_ref().map(|t| t.0).filter(|_| !sandbox.is_paused() && !terminal);
    let retention = oka_api::retention::of(sandbox);
    let pause_due = pause_at.is_some_and(|t| t <= now);
    if shutdown.is_some_and(|t| t <= now) && !(retention.is_some() && pause_due) {
        return TimerStep::Delete;
    }
    if pause_due {
        let until = match (retention, shutdown) {
            (Some(retention), Some(_)) => {
                Some(whole_seconds(now.checked_add(retention).unwrap_or(Timestamp::MAX)))
            }
            _ => None,
        };
        return TimerStep::Pause { until };
    }
    TimerStep::Wait([shutdown, pause_at].into_iter().flatten().map(|d| until(now, d)).min())
}

/// Sets a condition of `status` ([`oka_api::conditions::set`]: identical ⇒ no change; the
/// transition time, `now`, moves only when the status flips), the message cut as the reference
/// cuts it. The one way every sandbox planner (node agents', the Pod runtime's) writes one.
pub(crate) fn set_condition(
    status: &mut SandboxStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: &Time,
    generation: Option<i64>,
) {
    conditions::set(
        status.conditions.get_or_insert_with(Vec::new),
        Condition {
            type_: type_.to_owned(),
            status: value.to_owned(),
            reason: reason.to_owned(),
            message: truncate_message(message, DEFAULT_MAX_MESSAGE_LEN),
            last_transition_time: now.clone(),
            observed_generation: generation,
        },
    );
}

/// Removes a condition of `status`; no conditions left is `None`, as the reference stores it.
pub(crate) fn remove_condition(status: &mut SandboxStatus, type_: &str) {
    if let Some(list) = status.conditions.as_mut() {
        conditions::remove(list, type_);
        if list.is_empty() {
            status.conditions = None;
        }
    }
}

/// A status being planned, with the condition helpers of the reference's semantics.
struct Draft {
    status: SandboxStatus,
    now: Time,
    /// The metadata goes back to a pool member's (the last step of a return to the pool).
    return_to_pool: bool,
    /// An upgrade hook to run ([`SandboxAction::RunHook`]): `Some(true)` the preUpgrade one.
    hook: Option<bool>,
    /// Start a pull of the template's image ([`SandboxAction::PullImage`]).
    pull_start: bool,
    /// Look again after this long for the image step.
    pull_requeue: Option<Duration>,
}

impl Draft {
    fn new(status: SandboxStatus, now: Timestamp) -> Self {
        Self {
            status,
            now: whole_seconds(now),
            return_to_pool: false,
            hook: None,
            pull_start: false,
            pull_requeue: None,
        }
    }

    fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.condition(type_)
    }

    /// Sets a condition ([`oka_api::conditions::set`]: identical ⇒ no change; the transition
    /// time moves only when the status flips). Messages are cut as the reference cuts them.
    fn set(&mut self, type_: &str, status: &str, reason: &str, message: &str) {
        self.set_at(type_, status, reason, message, None);
    }

    /// [`set`](Self::set), recording the `generation` of the spec it was decided at (a failed
    /// upgrade step: tried again once the spec moved on).
    fn set_at(
        &mut self,
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
        generation: Option<i64>,
    ) {
        set_condition(&mut self.status, type_, status, reason, message, &self.now, generation);
    }

    fn remove(&mut self, type_: &str) {
        remove_condition(&mut self.status, type_);
    }

    /// Terminal failure with `message`.
    fn fail(&mut self, message: &str) {
        self.status.phase = Some(SandboxPhase::Failed);
        self.status.message = Some(message.to_owned());
        self.set(READY, FALSE, ready_reason::POD_READY, message);
    }

    /// The command ended: Succeeded on code 0, else Failed, as a pod's phase.
    fn finish(&mut self, exit: ExitInfo) {
        let (phase, detail) = match exit {
            ExitInfo::Code(0) => {
                (SandboxPhase::Succeeded, "the command exited with code 0".to_owned())
            }
            ExitInfo::Code(code) => {
                (SandboxPhase::Failed, format!("the command exited with code {code}"))
            }
            ExitInfo::Signal(signal) => {
                (SandboxPhase::Failed, format!("the command was killed by signal {signal}"))
            }
            ExitInfo::Unknown => {
                (SandboxPhase::Failed, "the command ended; its exit status is unknown".to_owned())
            }
        };
        let message = format!("Pod status phase is {}: {detail}", phase.as_str());
        self.status.phase = Some(phase);
        self.status.message = Some(message.clone());
        self.set(READY, FALSE, ready_reason::POD_READY, &message);
    }
}

/// The sandbox's status after `action` failed with `message`: the error goes into the
/// condition that action drives (the reference's `PodCreateFailed` for a create; `SandboxPaused`
/// `CheckpointFailed` for a hibernation; ...). `None` when no condition carries it.
pub fn status_after_runtime_error(
    status: &SandboxStatus,
    action: &RuntimeAction,
    message: &str,
    now: Timestamp,
) -> Option<SandboxStatus> {
    let mut draft = Draft::new(status.clone(), now);
    let resuming = status.phase == Some(SandboxPhase::Resuming);
    match action {
        RuntimeAction::Ensure(_) if resuming => {
            draft.set(RESUMED, FALSE, resumed_reason::CREATE_POD, message);
        }
        RuntimeAction::Ensure(_) => {
            draft.set(READY, FALSE, ready_reason::POD_CREATE_FAILED, message)
        }
        RuntimeAction::Hibernate(_) => {
            draft.set(PAUSED, FALSE, paused_reason::CHECKPOINT_FAILED, message);
        }
        RuntimeAction::Pause(_) | RuntimeAction::Stop { .. } => {
            draft.set(PAUSED, FALSE, paused_reason::PENDING, message);
        }
        RuntimeAction::Resume(_) | RuntimeAction::Restore(_) if resuming => {
            draft.set(RESUMED, FALSE, resumed_reason::RESUME_POD, message);
        }
        RuntimeAction::Resume(_) | RuntimeAction::Restore(_) => {
            draft.set(READY, FALSE, ready_reason::POD_READY, message);
        }
        RuntimeAction::Restart { .. } => {
            let message = format!("restart failed: {message}");
            draft.set(READY, FALSE, ready_reason::POD_CREATE_FAILED, &message);
        }
        RuntimeAction::Delete(_) => return None,
    }
    (draft.status != *status).then_some(draft.status)
}

fn has_finalizer(sandbox: &Sandbox) -> bool {
    sandbox.metadata.finalizers.iter().flatten().any(|f| f == finalizers::SANDBOX)
}

/// What [`execute`] left behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    /// The runtime's next step.
    pub next: Action,
    /// The sandbox as the writes left it; `None` when it is gone or going.
    pub sandbox: Option<Sandbox>,
}

/// Applies `plan` to `sandbox` through `store` and `runtime`, in order; `now` stamps the
/// condition a failed runtime verb writes. `initializer` replays `/init` and `hooks` runs the
/// upgrade hooks; without `hooks` a planned hook fails its step, saying why.
///
/// Writes carry the observed `resourceVersion`, so a plan made from a stale cache fails with
/// [`StoreError::Conflict`] before any runtime verb runs. A sandbox that disappeared meanwhile
/// is not an error. A failed runtime verb writes its error into the sandbox's conditions (best
/// effort) and fails the reconcile, so it is retried with backoff.
///
/// # Errors
///
/// [`SandboxError::Store`] and [`SandboxError::Runtime`].
pub async fn execute<S: Store>(
    store: &S,
    runtime: &dyn Runtime,
    initializer: Option<&dyn RuntimeInitializer>,
    hooks: Option<&dyn HookRunner>,
    sandbox: &Sandbox,
    plan: &Plan<SandboxAction>,
    now: Timestamp,
) -> Result<Executed, SandboxError> {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let gone = || Executed { next: Action::await_change(), sandbox: None };
    let mut current = sandbox.clone();
    for action in &plan.actions {
        match action {
            SandboxAction::AddFinalizer => {
                let mut update = current.clone();
                update
                    .metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(finalizers::SANDBOX.to_owned());
                match store.update(&namespace, &update).await {
                    Ok(written) => current = written,
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::RemoveFinalizer => {
                let mut update = current.clone();
                if let Some(list) = update.metadata.finalizers.as_mut() {
                    list.retain(|f| f != finalizers::SANDBOX);
                }
                match store.update(&namespace, &update).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {
                        debug!("sandbox finalized");
                        return Ok(gone());
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::SetPaused { until, by_policy } => {
                let mut update = current.clone();
                update.spec.paused = Some(true);
                if let Some(until) = until {
                    update.spec.shutdown_time = Some(until.clone());
                    update.spec.pause_time = Some(until.clone());
                }
                if *by_policy {
                    update.metadata.annotations.get_or_insert_with(Default::default).insert(
                        annotations::PAUSED_BY.to_owned(),
                        annotations::PAUSED_BY_AUTO_PAUSE_POLICY.to_owned(),
                    );
                }
                match store.update(&namespace, &update).await {
                    Ok(written) => {
                        if *by_policy {
                            info!("the auto-pause policy pauses the sandbox");
                        } else {
                            info!("pauseTime reached: pausing the sandbox");
                        }
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::AutoResume | SandboxAction::ClearPausedBy => {
                let mut update = current.clone();
                if let Some(notes) = update.metadata.annotations.as_mut() {
                    notes.remove(annotations::PAUSED_BY);
                }
                if *action == SandboxAction::AutoResume {
                    update.spec.paused = Some(false);
                    if update.spec.pause_time.as_ref().is_some_and(|t| t.0 <= now) {
                        update.spec.pause_time = None;
                    }
                }
                match store.update(&namespace, &update).await {
                    Ok(written) => current = written,
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::SetShutdown(until) => {
                let mut update = current.clone();
                update.spec.shutdown_time = Some(until.clone());
                match store.update(&namespace, &update).await {
                    Ok(written) => current = written,
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::Delete => {
                delete_object(store, &current).await?;
                info!("sandbox deleted (shutdownTime reached or its return to the pool failed)");
                return Ok(gone());
            }
            SandboxAction::ReturnToPool => {
                let set = match recycle::pool_of(&current) {
                    Some(pool) => match store.get::<SandboxSet>(&namespace, pool).await {
                        Ok(set) => Some(set),
                        Err(StoreError::NotFound { .. }) => None,
                        Err(error) => return Err(error.into()),
                    },
                    None => None,
                };
                let Some(set) = set else {
                    delete_object(store, &current).await?;
                    info!("its pool is gone: the recycled sandbox is deleted");
                    return Ok(gone());
                };
                if let Some(why) = recycle::stale_for(&current, &set) {
                    // Returning it would hand out an old revision: fail the recycle instead.
                    let Some(keep) = recycle::retain_on_failure(&current) else {
                        delete_object(store, &current).await?;
                        info!(%why, "the recycled sandbox is deleted");
                        return Ok(gone());
                    };
                    let mut draft = Draft::new(current.status.clone().unwrap_or_default(), now);
                    draft.set(RECYCLING, FALSE, recycling_reason::FAILED, &why);
                    let mut update = current.clone();
                    update.status = Some(draft.status);
                    current = store.update_status(&namespace, &update).await?;
                    let mut update = current.clone();
                    let until = now.checked_add(keep).unwrap_or(Timestamp::MAX);
                    update.spec.shutdown_time = Some(whole_seconds(until));
                    current = store.update(&namespace, &update).await?;
                    return Ok(Executed { next: Action::await_change(), sandbox: Some(current) });
                }
                match store.update(&namespace, &recycle::returned_to_pool(&current, &set)).await {
                    Ok(written) => {
                        info!("sandbox returned to its pool");
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::MarkRestarted(requested) => {
                let mut update = current.clone();
                update
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(annotations::RESTARTED_AT.to_owned(), requested.clone());
                match store.update(&namespace, &update).await {
                    Ok(written) => {
                        info!(requested = %requested, "restarting the sandbox's processes");
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            SandboxAction::Initialize => {
                let outcome = match initializer {
                    Some(initializer) => initializer.initialize(&current).await,
                    None => Ok(()),
                };
                let mut draft = Draft::new(current.status.clone().unwrap_or_default(), now);
                match &outcome {
                    Ok(()) => draft.set(
                        RUNTIME_INITIALIZED,
                        TRUE,
                        runtime_initialized_reason::SUCCEEDED,
                        "",
                    ),
                    Err(why) => draft.set(
                        RUNTIME_INITIALIZED,
                        FALSE,
                        runtime_initialized_reason::FAILED,
                        why,
                    ),
                }
                let Some(written) = write_status(store, &namespace, &current, draft.status).await?
                else {
                    return Ok(gone());
                };
                current = written;
                if let Err(why) = outcome {
                    return Err(SandboxError::Initialize(why));
                }
                info!("agent runtime initialised again");
            }
            SandboxAction::RunHook { pre } => {
                let outcome = run_hook(hooks, &current, *pre).await;
                let mut draft = Draft::new(current.status.clone().unwrap_or_default(), now);
                match &outcome {
                    Ok(()) if *pre => {
                        draft.set(UPGRADING, FALSE, upgrading_reason::CHECKPOINTING, "");
                    }
                    Ok(()) => draft.set(UPGRADING, TRUE, upgrading_reason::SUCCEEDED, ""),
                    Err(why) => {
                        let reason = if *pre {
                            upgrading_reason::PRE_UPGRADE_FAILED
                        } else {
                            upgrading_reason::POST_UPGRADE_FAILED
                        };
                        let generation = current.metadata.generation;
                        draft.set_at(UPGRADING, FALSE, reason, why, generation);
                    }
                }
                let Some(written) = write_status(store, &namespace, &current, draft.status).await?
                else {
                    return Ok(gone());
                };
                current = written;
                match outcome {
                    Ok(()) => info!(hook = hook_name(*pre), "upgrade hook succeeded"),
                    Err(why) => warn!(hook = hook_name(*pre), %why, "upgrade hook failed"),
                }
            }
            SandboxAction::CheckpointRestore(spec) => {
                let outcome = runtime.checkpoint_restore(spec).await;
                let mut draft = Draft::new(current.status.clone().unwrap_or_default(), now);
                match &outcome {
                    Ok(()) => draft.set(UPGRADING, FALSE, upgrading_reason::POST_UPGRADE, ""),
                    Err(error) => {
                        let generation = current.metadata.generation;
                        let why = format!("checkpoint-restore failed: {error}");
                        draft.set_at(
                            UPGRADING,
                            FALSE,
                            upgrading_reason::CHECKPOINT_FAILED,
                            &why,
                            generation,
                        );
                    }
                }
                let Some(written) = write_status(store, &namespace, &current, draft.status).await?
                else {
                    return Ok(gone());
                };
                current = written;
                match outcome {
                    Ok(()) => info!("sandbox moved onto its new template with its processes"),
                    Err(error) => warn!(%error, "checkpoint-restore upgrade failed"),
                }
            }
            SandboxAction::UpdateInPlace { spec, revision } => {
                let outcome = runtime.update(spec).await;
                let mut draft = Draft::new(current.status.clone().unwrap_or_default(), now);
                // A change that cannot be made in place is done with (the revision moves, as
                // the reference's does); one that failed is tried again; one that needs a
                // restart starts it (the planner's `restart_in_place` moves the revision once
                // the sandbox runs the new spec).
                let done = matches!(
                    outcome,
                    Ok(UpdateOutcome::Unchanged | UpdateOutcome::Updated)
                        | Err(RuntimeError::Unsupported { .. })
                );
                if done {
                    draft.status.update_revision = Some(revision.clone());
                }
                if outcome.is_ok() || done {
                    draft.status.observed_generation = current.metadata.generation;
                }
                match &outcome {
                    Ok(UpdateOutcome::Unchanged) => {}
                    Ok(UpdateOutcome::Updated) => {
                        draft.set(INPLACE_UPDATE, TRUE, inplace_update_reason::SUCCEEDED, "");
                    }
                    Ok(UpdateOutcome::RestartRequired { reason }) => {
                        let updating = inplace_update_reason::INPLACE_UPDATING;
                        draft.set(INPLACE_UPDATE, FALSE, updating, reason);
                        let message = "inplace update is incompleted";
                        draft.set(READY, FALSE, ready_reason::INPLACE_UPDATING, message);
                    }
                    Err(RuntimeError::Unsupported { reason, .. }) => {
                        draft.set(INPLACE_UPDATE, FALSE, inplace_update_reason::FAILED, reason);
                    }
                    Err(error) => {
                        let message = error.to_string();
                        draft.set(INPLACE_UPDATE, FALSE, inplace_update_reason::FAILED, &message);
                    }
                }
                let Some(written) = write_status(store, &namespace, &current, draft.status).await?
                else {
                    return Ok(gone());
                };
                current = written;
                match outcome {
                    Ok(UpdateOutcome::Updated) => info!("sandbox updated in place"),
                    Ok(UpdateOutcome::RestartRequired { reason }) => {
                        info!(%reason, "sandbox restarts in place on its new root");
                    }
                    Ok(UpdateOutcome::Unchanged) => {}
                    Err(error) if done => {
                        warn!(%error, "the template change cannot be made in place");
                    }
                    Err(source) => {
                        return Err(SandboxError::Runtime {
                            operation: Operation::Update,
                            id: spec.id.clone(),
                            source,
                        });
                    }
                }
            }
            SandboxAction::UpdateStatus(status) => {
                let mut update = current.clone();
                update.status = Some((**status).clone());
                match store.update_status(&namespace, &update).await {
                    Ok(written) => {
                        debug!(phase = ?status.phase, "sandbox status updated");
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(gone()),
                    Err(error) => return Err(error.into()),
                }
            }
            // Started by the reconcile, which owns the pulls (see `start_pull`).
            SandboxAction::PullImage { .. } => {}
            SandboxAction::Runtime(verb) => {
                if let Err(source) = call(runtime, verb).await {
                    warn!(operation = %verb.operation(), id = %verb.id(), error = %source, "runtime call failed");
                    let status = current.status.clone().unwrap_or_default();
                    if let Some(failed) =
                        status_after_runtime_error(&status, verb, &source.to_string(), now)
                    {
                        let mut update = current.clone();
                        update.status = Some(failed);
                        if let Err(error) = store.update_status(&namespace, &update).await {
                            debug!(%error, "could not record the runtime error in the status");
                        }
                    }
                    return Err(SandboxError::Runtime {
                        operation: verb.operation(),
                        id: verb.id().clone(),
                        source,
                    });
                }
                debug!(operation = %verb.operation(), id = %verb.id(), "runtime call done");
            }
        }
    }
    Ok(Executed { next: plan.next_action(), sandbox: Some(current) })
}

/// Runs `sandbox`'s preUpgrade (`pre`) or postUpgrade hook: `Ok` when it exited with code 0 (or
/// there is no hook to run); otherwise why not, as the `Upgrading` message says it.
async fn run_hook(
    hooks: Option<&dyn HookRunner>,
    sandbox: &Sandbox,
    pre: bool,
) -> Result<(), String> {
    let name = hook_name(pre);
    let Some((command, timeout)) = hook_of(sandbox, pre) else { return Ok(()) };
    let Some(hooks) = hooks else {
        return Err(format!(
            "lifecycle.{name} hooks are not run by this sandbox controller: it has no agent-runtime \
             client; remove the hook to upgrade without it"
        ));
    };
    match hooks.run_hook(sandbox, command, timeout).await {
        Ok(outcome) if outcome.exit_code == 0 => Ok(()),
        Ok(outcome) => Err(hook_failure_message(pre, &outcome)),
        Err(why) => Err(format!("lifecycle.{name} hook could not run: {why}")),
    }
}

/// Writes `status` as `sandbox`'s; `None` when the sandbox is gone.
async fn write_status<S: Store>(
    store: &S,
    namespace: &str,
    sandbox: &Sandbox,
    status: SandboxStatus,
) -> Result<Option<Sandbox>, StoreError> {
    let mut update = sandbox.clone();
    update.status = Some(status);
    match store.update_status(namespace, &update).await {
        Ok(written) => Ok(Some(written)),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Deletes this version's Sandbox object (by UID, so a new one of the same name is safe); one
/// already gone is fine.
async fn delete_object<S: Store>(store: &S, sandbox: &Sandbox) -> Result<(), StoreError> {
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let name = sandbox.metadata.name.as_deref().unwrap_or_default();
    let preconditions = Preconditions { uid: sandbox.metadata.uid.clone(), resource_version: None };
    match store.delete::<Sandbox>(namespace, name, &preconditions).await {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

async fn call(runtime: &dyn Runtime, action: &RuntimeAction) -> Result<(), RuntimeError> {
    match action {
        RuntimeAction::Ensure(spec) => runtime.ensure(spec).await.map(drop),
        RuntimeAction::Pause(id) => runtime.pause(id).await,
        RuntimeAction::Resume(id) => runtime.resume(id).await,
        RuntimeAction::Hibernate(id) => runtime.hibernate(id).await,
        RuntimeAction::Restore(id) => runtime.restore(id).await.map(drop),
        RuntimeAction::Stop { id, grace } => runtime.stop(id, *grace).await,
        RuntimeAction::Restart { spec, grace } => {
            runtime.stop(&spec.id, *grace).await?;
            runtime.ensure(spec).await.map(drop)
        }
        RuntimeAction::Delete(id) => match runtime.delete(id).await {
            Err(RuntimeError::NotFound(_)) => Ok(()),
            other => other,
        },
    }
}

/// What the sandbox reconciler reads and writes through.
pub struct SandboxContext<S: Store> {
    /// Where Sandboxes are written and SandboxTemplate absence is confirmed.
    pub store: S,
    /// Where instances run.
    pub runtime: Arc<dyn Runtime>,
    /// The SandboxTemplates, kept by an informer the controller runs.
    pub templates: Cache<SandboxTemplate>,
    /// Where `now` comes from.
    pub clock: Clock,
    /// This node's name, for `status.nodeName`.
    pub node_name: String,
    /// The versions this controller wrote, to skip reconciles of a cache that lags them.
    pub written: WrittenVersions,
    /// Where the sandbox's phase changes are told, as Events.
    pub events: EventRecorder,
    /// Who replays `/init` to new processes of an initialised sandbox (none: nothing to
    /// replay to, and `RuntimeInitialized` is set at once).
    pub initializer: Option<Initializer>,
    /// Who runs the upgrade hooks inside a sandbox (none: a step with a hook fails, saying so).
    pub hooks: Option<Hooks>,
    /// The auto-pause policy's pauses and resumes, per sandbox, for its action budget.
    pub auto_pause_actions: autopause::ActionLog,
    /// The most pauses and resumes the auto-pause policy makes of one sandbox in an hour (0:
    /// no limit).
    pub auto_pause_max_actions_per_hour: u32,
    /// Where the AutoPausePolicy's actions are counted (`sandbox_auto_pause_actions_total`).
    pub metrics: Option<Arc<crate::metrics::ControllerMetrics>>,
    /// The pulls of OCI images (none: a template naming an image reference cannot run here,
    /// and says so).
    pub image_pulls: Option<Arc<image::ImagePulls>>,
}

impl<S: Store> std::fmt::Debug for SandboxContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxContext")
            .field("templates", &self.templates)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// Reconciles one Sandbox: inspect, look up the template, [`plan_sandbox`], [`execute`]; again
/// with what was written and a fresh inspection while the plans call the runtime (at most
/// [`MAX_PASSES`] times).
///
/// # Errors
///
/// [`SandboxError`] from planning, the store or the runtime.
pub async fn reconcile_sandbox<S: Store>(
    sandbox: Arc<Sandbox>,
    ctx: Arc<SandboxContext<S>>,
) -> Result<Action, SandboxError> {
    if ctx.written.is_stale(sandbox.as_ref()) {
        debug!("cache older than our last write; waiting for it");
        return Ok(Action::await_change());
    }
    let id = runtime_id(&sandbox).map_err(InvalidSandbox)?;
    if let Some(phase) = sandbox.phase() {
        oka_telemetry::set_attribute(oka_telemetry::Attribute::new(
            "sandbox.phase",
            phase.to_string(),
        ));
    }
    let referenced = referenced_template(&ctx, &sandbox).await?;
    let mut current = (*sandbox).clone();
    for _ in 0..MAX_PASSES {
        let deleting = current.metadata.deletion_timestamp.is_some();
        let terminal =
            matches!(current.phase(), Some(SandboxPhase::Succeeded | SandboxPhase::Failed));
        let instance = if deleting || terminal {
            None
        } else {
            let status = ctx.runtime.inspect(&id).await;
            Some(status.map_err(|source| SandboxError::Runtime {
                operation: Operation::Inspect,
                id: id.clone(),
                source,
            })?)
        };
        let auto_pause = current
            .spec
            .auto_pause_policy
            .as_ref()
            .or_else(|| referenced.as_ref().and_then(|t| t.spec.auto_pause_policy.as_ref()));
        let now = ctx.clock.now();
        let uid = current.metadata.uid.clone().unwrap_or_default();
        let recent = ctx.auto_pause_actions.recent(&uid, now);
        let template = TemplateSource::of(&current, referenced.as_ref());
        let image_state = observe_image(&ctx, &current, template, deleting || terminal);
        // The objects are read only when a spec may be needed (to create, start, restart,
        // upgrade or update the instance), never for a steady running sandbox, which is looked
        // at every `runtime_poll`; and only templates that name some pay for the reads.
        let steady = instance.as_ref().is_some_and(|i| i.state == SandboxState::Running)
            && current.phase() == Some(&SandboxPhase::Running)
            && restart_requested(&current).is_none()
            && current.status.as_ref().and_then(|s| s.update_revision.as_deref())
                == Some(sandbox_revision(&current.spec).as_str());
        let pod_inputs = if !(deleting || terminal || steady) {
            let namespace = current.metadata.namespace.as_deref().unwrap_or_default();
            read_inputs(&ctx.store, namespace, template_of(template), &ctx.node_name).await?
        } else {
            inputs::PodInputs { node_name: Some(ctx.node_name.clone()), ..Default::default() }
        };
        let observation = SandboxObservation {
            runtime: instance.as_ref(),
            template,
            image: &image_state,
            node_name: &ctx.node_name,
            auto_pause,
            probes: crate::probe::probes_of(&current, referenced.as_ref()),
            auto_pause_budget: autopause::Budget {
                recent: &recent,
                max_per_hour: ctx.auto_pause_max_actions_per_hour,
            },
            inputs: &pod_inputs,
        };
        let plan = plan_sandbox(&current, &observation, now)?;
        let policy_acts = plan.actions.iter().any(|a| {
            matches!(
                a,
                SandboxAction::SetPaused { by_policy: true, .. } | SandboxAction::AutoResume
            )
        });
        // A hook's outcome moves the upgrade on: plan again at once, as after a runtime verb.
        let acted = plan
            .actions
            .iter()
            .any(|a| matches!(a, SandboxAction::Runtime(_) | SandboxAction::RunHook { .. }));
        let initializer = ctx.initializer.as_ref().map(|i| i.0.as_ref());
        let hooks = ctx.hooks.as_ref().map(|h| h.0.as_ref());
        let executed =
            execute(&ctx.store, ctx.runtime.as_ref(), initializer, hooks, &current, &plan, now)
                .await;
        match &executed {
            Err(SandboxError::Runtime { operation, source, .. }) => {
                // The kubelet's reason for a probe that failed.
                let reason = match source {
                    oka_runtime_api::RuntimeError::StartupCheckFailed { .. } => {
                        "Unhealthy".to_owned()
                    }
                    _ => format!("{operation}Failed"),
                };
                ctx.events.record(&current, EventType::Warning, &reason, &source.to_string());
            }
            Err(SandboxError::Initialize(why)) => {
                ctx.events.record(&current, EventType::Warning, "RuntimeInitialized", why);
            }
            Ok(Executed { sandbox: Some(written), .. })
                if plan.actions.contains(&SandboxAction::Initialize) =>
            {
                let message = "Agent runtime initialized";
                ctx.events.record(written, EventType::Normal, "RuntimeInitialized", message);
            }
            Ok(_) | Err(_) => {}
        }
        if policy_acts && let Some(metrics) = &ctx.metrics {
            let action =
                if plan.actions.contains(&SandboxAction::AutoResume) { "resume" } else { "pause" };
            let result = match &executed {
                Ok(_) => "success",
                Err(SandboxError::Store(StoreError::Conflict { .. })) => "conflict",
                Err(_) => "error",
            };
            let namespace = current.metadata.namespace.as_deref().unwrap_or_default();
            metrics.policy.auto_pause_acted(namespace, action, result);
        }
        let executed = executed?;
        if policy_acts {
            ctx.auto_pause_actions.record(&uid, now);
        }
        if executed.sandbox.is_none() {
            ctx.auto_pause_actions.forget(&uid);
        }
        let restarted = plan.actions.iter().any(|a| matches!(a, SandboxAction::MarkRestarted(_)));
        let Some(written) = executed.sandbox else { return Ok(executed.next) };
        image_events(&ctx, &current, &written);
        let created_on_image = plan.actions.iter().any(|a| {
            matches!(a, SandboxAction::Runtime(RuntimeAction::Ensure(spec))
                if matches!(spec.root, oka_runtime_api::RootFs::Layers(_)))
        });
        if created_on_image
            && let (Some(pulls), ImageState::Ready(image)) = (&ctx.image_pulls, &image_state)
        {
            // A sandbox that waited for a pull heard `Pulled` when it ended.
            let waited = current
                .status
                .as_ref()
                .and_then(|s| s.condition(READY))
                .is_some_and(|c| c.reason == image::reason::CONTAINER_CREATING);
            if !waited {
                pulls.record_present(&written, &image.reference);
            }
        }
        for action in &plan.actions {
            if let SandboxAction::PullImage { reference } = action {
                start_pull(&ctx, &written, template_of(template), reference).await;
            }
        }
        if restarted {
            let message = "Sandbox processes restarted";
            ctx.events.record(&written, EventType::Normal, "SandboxRestarted", message);
        }
        if plan.actions.iter().any(|a| matches!(a, SandboxAction::RunHook { .. }))
            && let Some(failed) = written.status.as_ref().and_then(|s| s.condition(UPGRADING))
            && matches!(
                failed.reason.as_str(),
                upgrading_reason::PRE_UPGRADE_FAILED | upgrading_reason::POST_UPGRADE_FAILED
            )
        {
            ctx.events.record(&written, EventType::Warning, &failed.reason, &failed.message);
        }
        if let Some((type_, reason, message)) = phase_event(&current, &written) {
            ctx.events.record(&written, type_, &reason, &message);
        }
        for (type_, reason, message) in condition_events(&current, &written)
            .into_iter()
            .chain(start_failure_events(&current, &written))
        {
            ctx.events.record(&written, type_, &reason, &message);
        }
        ctx.written.record(&written);
        if !acted {
            return Ok(executed.next);
        }
        current = written;
    }
    Ok(Action::requeue_after(RETRY_AFTER_ACTING))
}

/// The state of the image `sandbox`'s template names, as this node's pulls know it: nothing to
/// pull for a directory root (or none), and nothing asked while the sandbox is deleted or done.
fn observe_image<S: Store>(
    ctx: &SandboxContext<S>,
    sandbox: &Sandbox,
    template: TemplateSource<'_>,
    finished: bool,
) -> ImageState {
    let Some(template) = template_of(template).filter(|_| !finished) else {
        return ImageState::NotNeeded;
    };
    let TemplateImage::Reference(reference) = TemplateImage::of(template) else {
        return ImageState::NotNeeded;
    };
    let Some(pulls) = &ctx.image_pulls else { return ImageState::NoSource };
    let policy = template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .map_or(image::PullPolicy::IfNotPresent, image::PullPolicy::of);
    pulls.observe(reference, policy, sandbox)
}

fn template_of(template: TemplateSource<'_>) -> Option<&PodTemplateSpec> {
    match template {
        TemplateSource::Inline(t) | TemplateSource::Referenced(t) => Some(t),
        TemplateSource::Missing(_) | TemplateSource::Absent => None,
    }
}

/// Starts the pull of `reference` for `sandbox` with the credentials of the template's
/// `imagePullSecrets`: the `.dockerconfigjson` of each Secret of type
/// `kubernetes.io/dockerconfigjson` in the sandbox's namespace (a missing or other Secret is
/// skipped, as the kubelet does).
async fn start_pull<S: Store>(
    ctx: &SandboxContext<S>,
    sandbox: &Sandbox,
    template: Option<&PodTemplateSpec>,
    reference: &str,
) {
    let Some(pulls) = &ctx.image_pulls else { return };
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let names = template
        .and_then(|t| t.spec.as_ref())
        .and_then(|p| p.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.clone());
    let mut secrets = Vec::new();
    for name in names {
        match ctx.store.get::<k8s_openapi::api::core::v1::Secret>(namespace, &name).await {
            Ok(secret) => match docker_config_json(&secret) {
                Some(bytes) => secrets.push(bytes),
                None => {
                    warn!(secret = %name, "imagePullSecret is not of type kubernetes.io/dockerconfigjson: skipped")
                }
            },
            Err(error) => {
                warn!(secret = %name, %error, "imagePullSecret not readable: pulling without it");
            }
        }
    }
    pulls.start(reference, secrets, sandbox, ctx.clock.clone());
}

/// The `.dockerconfigjson` of a Secret of type `kubernetes.io/dockerconfigjson`.
pub fn docker_config_json(secret: &k8s_openapi::api::core::v1::Secret) -> Option<Vec<u8>> {
    if secret.type_.as_deref() != Some("kubernetes.io/dockerconfigjson") {
        return None;
    }
    secret.data.as_ref()?.get(".dockerconfigjson").map(|b| b.0.clone())
}

/// The kubelet's Events of a change of the image step: `BackOff` when a sandbox starts
/// waiting for its next pull, `ErrImageNeverPull` when its image may not be pulled.
fn image_events<S: Store>(ctx: &SandboxContext<S>, before: &Sandbox, after: &Sandbox) {
    let Some(pulls) = &ctx.image_pulls else { return };
    let reason_of = |s: &Sandbox| {
        s.status
            .as_ref()
            .and_then(|st| st.condition(READY))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let Some((reason, message)) = reason_of(after) else { return };
    if reason_of(before).is_some_and(|(r, _)| r == reason) {
        return;
    }
    if reason == image::reason::IMAGE_PULL_BACK_OFF {
        let reference = after
            .spec
            .template
            .as_ref()
            .map(TemplateImage::of)
            .and_then(|i| match i {
                TemplateImage::Reference(r) => Some(r.to_owned()),
                _ => None,
            })
            .or_else(|| {
                message
                    .strip_prefix("Back-off pulling image \"")
                    .and_then(|m| m.split_once('"'))
                    .map(|(r, _)| r.to_owned())
            })
            .unwrap_or_default();
        pulls.record_back_off(after, &reference);
    } else if reason == image::reason::ERR_IMAGE_NEVER_PULL {
        pulls.record_never_pull(after, &message);
    }
}

/// The Event a phase change makes, as the reference words it: reason `Sandbox<Phase>`,
/// `Warning` for `Failed` (with the status message), `Normal` otherwise.
pub fn phase_event(before: &Sandbox, after: &Sandbox) -> Option<(EventType, String, String)> {
    let (was, is) = (before.phase(), after.phase()?);
    if was == Some(is) {
        return None;
    }
    let message = match (was, is) {
        (_, SandboxPhase::Terminating) => "Terminate sandbox",
        (_, SandboxPhase::Other(_)) => return None,
        (_, SandboxPhase::Pending) => "Start sandbox",
        (Some(SandboxPhase::Resuming), SandboxPhase::Running) => "Sandbox resumed",
        (Some(SandboxPhase::Recycling), SandboxPhase::Running) => "Sandbox recycled",
        (Some(SandboxPhase::Upgrading), SandboxPhase::Running) => "Sandbox upgraded",
        (_, SandboxPhase::Running) => "Sandbox started",
        (_, SandboxPhase::Paused) => "Pause sandbox",
        (_, SandboxPhase::Resuming) => "Resume sandbox",
        (_, SandboxPhase::Recycling) => "Recycle sandbox",
        (_, SandboxPhase::Upgrading) => "Upgrade sandbox",
        (_, SandboxPhase::Succeeded) => "Sandbox succeeded",
        (_, SandboxPhase::Failed) => {
            let message = after.status.as_ref().and_then(|s| s.message.clone());
            let message = message.unwrap_or_else(|| "Sandbox failed".to_owned());
            return Some((EventType::Warning, "SandboxFailed".to_owned(), message));
        }
    };
    Some((EventType::Normal, format!("Sandbox{}", is.as_str()), message.to_owned()))
}

/// The Events of the steps an upgrade, a recycle and an in-place update take, as the reference
/// emits them: each time the condition's reason changes, `Warning` for a failure.
pub fn condition_events(before: &Sandbox, after: &Sandbox) -> Vec<(EventType, String, String)> {
    use upgrading_reason as up;
    let reason = |s: &Sandbox, type_: &str| {
        s.status
            .as_ref()
            .and_then(|st| st.condition(type_))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let mut events = Vec::new();
    for type_ in [UPGRADING, RECYCLING, INPLACE_UPDATE, AUTO_PAUSED] {
        let Some((now, message)) = reason(after, type_) else { continue };
        let was = reason(before, type_).map(|(was, _)| was);
        if was.as_deref() == Some(now.as_str()) {
            continue;
        }
        // Steps of one pass fall through: leaving UpgradePod for a later step replaced the pod.
        let replaced = type_ == UPGRADING
            && matches!(was.as_deref(), Some(up::UPGRADE_POD | up::UPGRADE_POD_FAILED))
            && [up::POST_UPGRADE_FAILED, up::SUCCEEDED].contains(&now.as_str());
        if replaced {
            let text = "Sandbox instance replaced from the new template".to_owned();
            events.push((EventType::Normal, "UpgradePodReplaced".to_owned(), text));
        }
        let (kind, name, text): (EventType, &str, String) = match (type_, now.as_str()) {
            (UPGRADING, up::RESUMING) => (
                EventType::Normal,
                "UpgradeResuming",
                "Resuming the paused sandbox to upgrade it".into(),
            ),
            (UPGRADING, up::RESUME_SUCCEED) => {
                (EventType::Normal, "UpgradeResumed", "Sandbox resumed for its upgrade".into())
            }
            (UPGRADING, up::POST_UPGRADE) => (
                EventType::Normal,
                "UpgradePodReplaced",
                "Sandbox instance replaced from the new template".into(),
            ),
            (UPGRADING, up::SUCCEEDED) => {
                (EventType::Normal, "UpgradeSucceeded", "Sandbox upgraded".into())
            }
            (UPGRADING, failed)
                if [
                    up::PRE_UPGRADE_FAILED,
                    up::POST_UPGRADE_FAILED,
                    up::UPGRADE_POD_FAILED,
                    up::CHECKPOINT_FAILED,
                ]
                .contains(&failed) =>
            {
                (EventType::Warning, failed, message)
            }
            (RECYCLING, recycling_reason::STARTED) => {
                (EventType::Normal, "RecyclingStarted", "Returning the sandbox to its pool".into())
            }
            (RECYCLING, recycling_reason::SUCCEEDED) => {
                (EventType::Normal, "RecyclingSucceeded", "Sandbox returned to its pool".into())
            }
            (
                RECYCLING,
                bad @ (recycling_reason::REJECTED
                | recycling_reason::FAILED
                | recycling_reason::TIMEOUT),
            ) => (EventType::Warning, bad, message),
            (INPLACE_UPDATE, inplace_update_reason::INPLACE_UPDATING) => {
                (EventType::Normal, "InplaceUpdating", message)
            }
            (INPLACE_UPDATE, inplace_update_reason::SUCCEEDED) => {
                (EventType::Normal, "InplaceUpdateSucceeded", "Sandbox updated in place".into())
            }
            (INPLACE_UPDATE, inplace_update_reason::FAILED) => {
                (EventType::Warning, "InplaceUpdateFailed", message)
            }
            (AUTO_PAUSED, auto_paused_reason::PROBE_DRIVEN) => {
                (EventType::Normal, "AutoPaused", "Paused by its auto-pause policy".into())
            }
            (AUTO_PAUSED, auto_paused_reason::AUTO_RESUMED) => {
                (EventType::Normal, "AutoResumed", "Resumed by its auto-pause policy".into())
            }
            (AUTO_PAUSED, auto_paused_reason::RATE_LIMITED) => {
                (EventType::Warning, "AutoPauseRateLimited", message)
            }
            _ => continue,
        };
        events.push((kind, name.to_owned(), text));
    }
    events
}

/// The Ready reason of a sandbox whose volume waits for a ConfigMap or Secret (the kubelet's
/// Event reason for it).
pub const FAILED_MOUNT: &str = "FailedMount";

/// The Ready reason of a sandbox whose template sets fields oka's runtime cannot honour.
pub const UNSUPPORTED_BY_RUNTIME: &str = "UnsupportedByRuntime";

/// How soon a sandbox waiting for a ConfigMap or Secret looks again (objects are not watched).
pub const INPUTS_RETRY: Duration = Duration::from_secs(2);

/// The kubelet's Events of a sandbox that cannot start for its template: `FailedMount` (a
/// volume's ConfigMap or Secret is missing), `Failed` with `Error: ...`
/// (`CreateContainerConfigError`: env from a missing object or key, `runAsNonRoot`), and oka's
/// `UnsupportedByRuntime`. Once per change of Ready's reason or message.
pub fn start_failure_events(before: &Sandbox, after: &Sandbox) -> Vec<(EventType, String, String)> {
    let ready = |s: &Sandbox| {
        s.status
            .as_ref()
            .and_then(|st| st.condition(READY))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let Some((reason, message)) = ready(after) else { return Vec::new() };
    if ready(before).as_ref() == Some(&(reason.clone(), message.clone())) {
        return Vec::new();
    }
    match reason.as_str() {
        FAILED_MOUNT | UNSUPPORTED_BY_RUNTIME => vec![(EventType::Warning, reason, message)],
        image::reason::CREATE_CONTAINER_CONFIG_ERROR => {
            vec![(EventType::Warning, "Failed".to_owned(), format!("Error: {message}"))]
        }
        _ => Vec::new(),
    }
}

/// The ConfigMaps and Secrets `template` names, read from the store (a missing one is `None`).
async fn read_inputs<S: Store>(
    store: &S,
    namespace: &str,
    template: Option<&PodTemplateSpec>,
    node_name: &str,
) -> Result<inputs::PodInputs, StoreError> {
    let mut read =
        inputs::PodInputs { node_name: Some(node_name.to_owned()), ..Default::default() };
    let Some(template) = template else { return Ok(read) };
    let (config_maps, secrets) = inputs::referenced(template);
    for name in config_maps {
        match store.get::<k8s_openapi::api::core::v1::ConfigMap>(namespace, &name).await {
            Ok(cm) => read.add_config_map(&name, Some(&cm)),
            Err(e) if e.is_not_found() => read.add_config_map(&name, None),
            Err(e) => return Err(e),
        }
    }
    for name in secrets {
        match store.get::<k8s_openapi::api::core::v1::Secret>(namespace, &name).await {
            Ok(secret) => read.add_secret(&name, Some(&secret)),
            Err(e) if e.is_not_found() => read.add_secret(&name, None),
            Err(e) => return Err(e),
        }
    }
    Ok(read)
}

/// The SandboxTemplate `spec.templateRef` names, when the sandbox has no inline template: from
/// the cache, confirmed with the store on a miss (the cache may lag a template just created).
async fn referenced_template<S: Store>(
    ctx: &SandboxContext<S>,
    sandbox: &Sandbox,
) -> Result<Option<SandboxTemplate>, SandboxError> {
    let (None, Some(reference)) = (&sandbox.spec.template, &sandbox.spec.template_ref) else {
        return Ok(None);
    };
    if sandbox.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(template) = ctx.templates.get_named(namespace, &reference.name) {
        return Ok(Some((*template).clone()));
    }
    match ctx.store.get::<SandboxTemplate>(namespace, &reference.name).await {
        Ok(template) => Ok(Some(template)),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// The sandbox controller's error policy: a sandbox that cannot be planned, or whose spec the
/// runtime refuses, waits for a change; everything else (store conflicts, runtime failures,
/// an unsupported hibernation) backs off per sandbox.
pub fn sandbox_error_policy<S: Store>(
    _sandbox: &Sandbox,
    error: &SandboxError,
    _ctx: &SandboxContext<S>,
) -> Action {
    match error {
        SandboxError::Invalid(_)
        | SandboxError::Runtime { source: RuntimeError::InvalidSpec(_), .. } => {
            Action::await_change()
        }
        SandboxError::Store(_) | SandboxError::Runtime { .. } | SandboxError::Initialize(_) => {
            Action::backoff()
        }
    }
}

/// How the sandbox controller runs besides its [`Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxOptions {
    /// This node's name, written to `status.nodeName`.
    pub node_name: String,
    /// How often the runtime's instances are listed to notice changes it does not announce.
    pub runtime_poll: Duration,
    /// Who replays `/init` after a sandbox's processes were started anew.
    pub initializer: Option<Initializer>,
    /// Who runs the upgrade hooks (`spec.lifecycle`) inside a sandbox.
    pub hooks: Option<Hooks>,
    /// The auto-pause policy's action budget: the most pauses and resumes it makes of one
    /// sandbox in an hour (0: no limit); see [`autopause`].
    pub auto_pause_max_actions_per_hour: u32,
    /// Where OCI images are pulled from (none: a template naming an image reference gets
    /// `Ready=False/ErrImagePull` saying this node has no image store).
    pub images: Option<image::Images>,
}

/// The proposal's `--auto-pause-max-actions-per-hour` default.
pub const DEFAULT_AUTO_PAUSE_MAX_ACTIONS_PER_HOUR: u32 = 20;

impl Default for SandboxOptions {
    /// The host's name ([`host_name`]), polling every 2 s, no initializer, no hook runner, 20
    /// policy actions an hour.
    fn default() -> Self {
        Self {
            node_name: host_name(),
            runtime_poll: Duration::from_secs(2),
            initializer: None,
            hooks: None,
            auto_pause_max_actions_per_hour: DEFAULT_AUTO_PAUSE_MAX_ACTIONS_PER_HOUR,
            images: None,
        }
    }
}

/// A shared [`RuntimeInitializer`].
pub type Initializer = Shared<dyn RuntimeInitializer>;

/// A collaborator the controller is given (an initializer, a hook runner): equal when it is
/// the same one, so the options that hold it stay comparable.
pub struct Shared<T: ?Sized>(pub Arc<T>);

impl<T: ?Sized> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T: ?Sized> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl<T: ?Sized> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: ?Sized> Eq for Shared<T> {}

/// The kernel's host name (`/proc/sys/kernel/hostname`), or `localhost` when it cannot be read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Builds the Sandbox controller over `informers` (shared, or a store for its own) and `runtime`:
/// Sandboxes are the primary kind; SandboxTemplates are cached for the reconciler, and a
/// SandboxTemplate change wakes the sandboxes that refer to it; the runtime is polled
/// ([`runtime_changes`]). Run it with [`run_sandbox_controller`] or by hand with
/// `controller.run(reconcile_sandbox, sandbox_error_policy, ctx)`.
pub fn sandbox_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    runtime: Arc<dyn Runtime>,
    config: Config,
    clock: Clock,
    options: SandboxOptions,
) -> (Controller<Sandbox, S>, Arc<SandboxContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller = Controller::<Sandbox, S>::shared("sandbox", &informers, config.runner);
    let sandboxes = controller.cache();
    let templates = informers.all::<SandboxTemplate>();
    let events = EventRecorder::spawn(store.clone(), "sandbox-controller");
    let (image_pulls, pulled) = match options.images {
        Some(source) => {
            let (pulls, woken) = image::ImagePulls::new(source.0, events.clone());
            (Some(pulls), Some(woken))
        }
        None => (None, None),
    };
    let ctx = Arc::new(SandboxContext {
        store: store.clone(),
        runtime: Arc::clone(&runtime),
        templates: templates.cache(),
        clock,
        node_name: options.node_name,
        written: WrittenVersions::default(),
        events,
        initializer: options.initializer,
        hooks: options.hooks,
        auto_pause_actions: autopause::ActionLog::default(),
        auto_pause_max_actions_per_hour: options.auto_pause_max_actions_per_hour,
        metrics: config.metrics.clone(),
        image_pulls,
    });
    let referring = sandboxes.clone();
    let forget = Arc::clone(&ctx);
    let controller = controller
        .watches_shared(templates, move |template: &SandboxTemplate| {
            sandboxes_referring_to(&referring, template)
        })
        .reconcile_on(runtime_changes(runtime, sandboxes, options.runtime_poll))
        .on_delete(move |sandbox: &Sandbox| forget.written.forget(&ObjectKey::of(sandbox)));
    let controller = match pulled {
        Some(woken) => controller.reconcile_on(woken),
        None => controller,
    };
    let controller = match config.metrics.clone() {
        Some(metrics) => {
            metrics.watch_sandboxes(controller.cache());
            controller.on_change(move |change| metrics.observe_sandbox(change))
        }
        None => controller,
    };
    (controller, ctx)
}

/// The sandboxes of `sandboxes` whose template is `template` by reference (`templateRef`, no
/// inline template): what a change of a SandboxTemplate wakes.
pub(crate) fn sandboxes_referring_to(
    sandboxes: &Cache<Sandbox>,
    template: &SandboxTemplate,
) -> Vec<ObjectKey> {
    let namespace = template.metadata.namespace.clone().unwrap_or_default();
    let name = template.metadata.name.as_deref().unwrap_or_default();
    sandboxes
        .list_namespace(&namespace)
        .iter()
        .filter(|s| s.spec.template.is_none())
        .filter(|s| s.spec.template_ref.as_ref().is_some_and(|r| r.name == name))
        .map(|s| ObjectKey::of(s.as_ref()))
        .collect()
}

/// Runs the Sandbox controller until `shutdown` resolves (then finishes in-flight
/// reconciles).
pub async fn run_sandbox_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    runtime: Arc<dyn Runtime>,
    config: Config,
    clock: Clock,
    options: SandboxOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = sandbox_controller(informers, runtime, config, clock, options);
    controller.shutdown_on(shutdown).run(reconcile_sandbox, sandbox_error_policy, ctx).await;
}

/// What one listing of the runtime showed: each instance's state and last exit.
pub type RuntimeSnapshot = std::collections::HashMap<SandboxId, (SandboxState, Option<ExitInfo>)>;

/// The keys of the sandboxes whose instance changed, found by listing the runtime every
/// `every` (see [`sandboxes_to_wake`]). A failed listing is logged and tried again next time.
pub fn runtime_changes(
    runtime: Arc<dyn Runtime>,
    sandboxes: Cache<Sandbox>,
    every: Duration,
) -> impl Stream<Item = ObjectKey> + Send + 'static {
    let state = (
        runtime,
        sandboxes,
        None::<RuntimeSnapshot>,
        std::collections::VecDeque::<ObjectKey>::new(),
    );
    stream::unfold(state, move |(runtime, sandboxes, mut seen, mut pending)| async move {
        loop {
            if let Some(key) = pending.pop_front() {
                return Some((key, (runtime, sandboxes, seen, pending)));
            }
            tokio::time::sleep(every).await;
            let listed = match runtime.list().await {
                Ok(listed) => listed,
                Err(error) => {
                    warn!(%error, "listing the runtime's sandboxes failed");
                    continue;
                }
            };
            let now: RuntimeSnapshot =
                listed.into_iter().map(|s| (s.id, (s.state, s.last_exit))).collect();
            pending.extend(sandboxes_to_wake(seen.as_ref(), &now, &sandboxes.list()));
            seen = Some(now);
        }
    })
}

/// The sandboxes to reconcile after a listing of the runtime (`now`, after `before`):
///
/// - every one at the first listing (a full resync: an instance may have ended between a
///   reconcile and that listing);
/// - those whose instance changed state or exit, appeared or disappeared since `before`;
/// - those whose status says Running while the listing has no instance for them: an instance
///   that came and went between two listings is never seen to disappear, and its sandbox must
///   still fail.
pub fn sandboxes_to_wake(
    before: Option<&RuntimeSnapshot>,
    now: &RuntimeSnapshot,
    sandboxes: &[Arc<Sandbox>],
) -> Vec<ObjectKey> {
    let Some(before) = before else {
        return sandboxes.iter().map(|s| ObjectKey::of(s.as_ref())).collect();
    };
    let changed = |id: &SandboxId| match (before.get(id), now.get(id)) {
        (None, None) => false,
        (was, is) => was != is,
    };
    sandboxes
        .iter()
        .filter(|sandbox| {
            runtime_id(sandbox).is_ok_and(|id| {
                changed(&id)
                    || (!now.contains_key(&id) && sandbox.phase() == Some(&SandboxPhase::Running))
            })
        })
        .map(|s| ObjectKey::of(s.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests;
