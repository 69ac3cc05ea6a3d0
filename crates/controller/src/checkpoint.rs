//! The Checkpoint controller: a Checkpoint naming a Sandbox becomes a snapshot in the runtime
//! ([`Runtime::snapshot`]), from which new sandboxes are created (a Sandbox annotated
//! `agents.kruise.io/restore-from: <checkpointId>`, see [`crate::sandbox::resolve`]). The
//! reference leaves this controller to an external component; this is the one-machine one.
//!
//! # Expected flow
//!
//! [`reconcile_checkpoint`] reads the Sandbox `spec.sandboxName` (else `spec.podName`) names in
//! the Checkpoint's namespace and calls the pure [`plan_checkpoint`], whose rules are, in order:
//!
//! 1. **Deleting** (`deletionTimestamp` set): delete the runtime's snapshot
//!    ([`Runtime::delete_snapshot`]), then remove the finalizer `agents.kruise.io/checkpoint`.
//! 2. The finalizer is added first, before a snapshot can exist.
//! 3. **Succeeded / Failed** are terminal; `ttlAfterFinished` (`30s`, `30m`, `30d`, or any Go
//!    duration) after `completionTime` the Checkpoint is deleted (and with it, by owner
//!    reference, the SandboxTemplate the manager made for it).
//! 4. Otherwise: no sandbox named, or the Sandbox does not exist or is being deleted ⇒ `Failed`
//!    with why. Else phase `Creating`, then the snapshot of the sandbox's instance under the
//!    name [`snapshot_name`] (the Checkpoint's uid); its result is the status
//!    ([`status_after_snapshot`]): `Succeeded` with `checkpointId` (the snapshot's name),
//!    `completionTime` and a message saying where the images are, or `Failed` with the
//!    runtime's error.
//!
//! # Guarantees
//!
//! - The planner is pure; [`execute`] is the only code that writes or calls the runtime.
//! - No snapshot exists without the finalizer on its Checkpoint, and the finalizer goes only
//!   after the snapshot is deleted.
//! - A snapshot is taken under a name fixed by the Checkpoint, so a retry after a crash or a
//!   stale cache takes no second snapshot (the runtime's snapshot is idempotent by name).
//!
//! # Where this differs from the reference
//!
//! - `keepRunning: false` is not honoured: the sandbox always goes on running (stop it through
//!   its own `spec.paused` if wanted).
//! - `persistentContents` is not consulted: a snapshot always holds memory and filesystem.
//! - `podTemplateDelta` is never written.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::checkpoint::{Checkpoint, CheckpointPhase, CheckpointStatus};
use oka_api::{Sandbox, finalizers};
use oka_runtime_api::{Operation, Runtime, RuntimeError, SandboxId, SnapshotInfo, SnapshotName};
use oka_store::{Preconditions, Store, StoreError};
use std::sync::Arc;
use tracing::{debug, info, warn};

use crate::Config;
use crate::plan::{Clock, Plan, until};
use crate::sandbox::runtime_id;
use crate::versions::WrittenVersions;
use oka_cache::{Action, Controller, Informers};

/// One step the checkpoint executor takes.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckpointAction {
    /// Add the finalizer `agents.kruise.io/checkpoint`.
    AddFinalizer,
    /// Remove the finalizer (the snapshot is gone); this completes a pending deletion.
    RemoveFinalizer,
    /// Replace the status with this one.
    UpdateStatus(Box<CheckpointStatus>),
    /// [`Runtime::snapshot`] of `sandbox` under `name`, then the status its result gives.
    Snapshot {
        /// The sandbox's runtime instance.
        sandbox: SandboxId,
        /// The snapshot's name.
        name: SnapshotName,
    },
    /// [`Runtime::delete_snapshot`].
    DeleteSnapshot(SnapshotName),
    /// `ttlAfterFinished` passed: delete the Checkpoint.
    Delete,
}

/// Why a Checkpoint cannot be planned at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCheckpoint {
    /// The object lacks a field the store always sets.
    #[error("the checkpoint has no metadata.{0}")]
    MissingMetadata(&'static str),
}

/// Why a checkpoint reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The checkpoint cannot be acted on.
    #[error(transparent)]
    Invalid(#[from] InvalidCheckpoint),
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A runtime call failed.
    #[error("runtime {operation}: {source}")]
    Runtime {
        /// What was asked.
        operation: Operation,
        /// Why it failed.
        #[source]
        source: RuntimeError,
    },
}

/// The Sandbox a Checkpoint names, as its reconcile found it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SandboxLookup<'a> {
    /// Neither `spec.sandboxName` nor `spec.podName`.
    Unnamed,
    /// No Sandbox of that name in the Checkpoint's namespace.
    Missing(&'a str),
    /// The Sandbox.
    Found(&'a Sandbox),
}

/// The name of a Checkpoint's snapshot in the runtime, which is also its `checkpointId` (the
/// E2B snapshot ID): its uid.
///
/// # Errors
///
/// [`InvalidCheckpoint`] without a usable uid.
pub fn snapshot_name(checkpoint: &Checkpoint) -> Result<SnapshotName, InvalidCheckpoint> {
    let uid = checkpoint.metadata.uid.as_deref().unwrap_or_default();
    SandboxId::new(uid).map_err(|_| InvalidCheckpoint::MissingMetadata("uid"))
}

/// The name of the Sandbox a Checkpoint is of: `spec.sandboxName`, else `spec.podName`.
pub fn sandbox_name(checkpoint: &Checkpoint) -> Option<&str> {
    let spec = &checkpoint.spec;
    spec.sandbox_name.as_deref().or(spec.pod_name.as_deref()).filter(|n| !n.is_empty())
}

fn has_finalizer(checkpoint: &Checkpoint) -> bool {
    checkpoint.metadata.finalizers.iter().flatten().any(|f| f == finalizers::CHECKPOINT)
}

/// `ttlAfterFinished`: a Go duration, or a whole number of days (`30d`).
fn ttl(checkpoint: &Checkpoint) -> Option<SignedDuration> {
    let text = checkpoint.spec.ttl_after_finished.as_deref()?.trim();
    if let Some(days) = text.strip_suffix('d').and_then(|d| d.parse::<i64>().ok()) {
        return Some(SignedDuration::from_hours(days.saturating_mul(24)));
    }
    let duration = oka_api::parse_go_duration(text).ok()?;
    SignedDuration::try_from(duration).ok()
}

fn status_with(
    checkpoint: &Checkpoint,
    phase: CheckpointPhase,
    message: Option<String>,
) -> CheckpointStatus {
    CheckpointStatus {
        observed_generation: checkpoint.metadata.generation,
        phase: Some(phase),
        message,
        ..checkpoint.status.clone().unwrap_or_default()
    }
}

/// Plans the next steps of `checkpoint`; see the [module documentation](self) for the rules.
///
/// # Errors
///
/// [`InvalidCheckpoint`] when the object lacks a uid.
pub fn plan_checkpoint(
    checkpoint: &Checkpoint,
    sandbox: SandboxLookup<'_>,
    now: Timestamp,
) -> Result<Plan<CheckpointAction>, InvalidCheckpoint> {
    let name = snapshot_name(checkpoint)?;
    let has_finalizer = has_finalizer(checkpoint);
    if checkpoint.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Plan::nothing());
        }
        return Ok(Plan::nothing()
            .with(CheckpointAction::DeleteSnapshot(name))
            .with(CheckpointAction::RemoveFinalizer));
    }
    let mut plan = Plan::nothing();
    if !has_finalizer {
        plan = plan.with(CheckpointAction::AddFinalizer);
    }
    let status = checkpoint.status.clone().unwrap_or_default();
    if matches!(status.phase, Some(CheckpointPhase::Succeeded | CheckpointPhase::Failed)) {
        let finished = status.completion_time.as_ref().map(|t| t.0);
        if let (Some(ttl), Some(finished)) = (ttl(checkpoint), finished) {
            let expires = finished.saturating_add(ttl).unwrap_or(Timestamp::MAX);
            if expires <= now {
                return Ok(plan.with(CheckpointAction::Delete));
            }
            return Ok(plan.requeue_after(until(now, expires)));
        }
        return Ok(plan);
    }
    let fail = |message: String| {
        let mut failed = status_with(checkpoint, CheckpointPhase::Failed, Some(message));
        failed.completion_time = Some(Time(now));
        CheckpointAction::UpdateStatus(Box::new(failed))
    };
    let sandbox = match sandbox {
        SandboxLookup::Unnamed => {
            return Ok(plan.with(fail("the checkpoint names no sandbox (spec.sandboxName)".into())));
        }
        SandboxLookup::Missing(missing) => {
            return Ok(plan.with(fail(format!("sandbox {missing} not found"))));
        }
        SandboxLookup::Found(sandbox) => sandbox,
    };
    if sandbox.metadata.deletion_timestamp.is_some() {
        let named = sandbox.metadata.name.as_deref().unwrap_or_default();
        return Ok(plan.with(fail(format!("sandbox {named} is being deleted"))));
    }
    let id = match runtime_id(sandbox) {
        Ok(id) => id,
        Err(e) => return Ok(plan.with(fail(e.to_string()))),
    };
    if status.phase != Some(CheckpointPhase::Creating)
        || status.observed_generation != checkpoint.metadata.generation
    {
        let creating = status_with(checkpoint, CheckpointPhase::Creating, None);
        plan = plan.with(CheckpointAction::UpdateStatus(Box::new(creating)));
    }
    Ok(plan.with(CheckpointAction::Snapshot { sandbox: id, name }))
}

/// The status after the snapshot of `checkpoint` ended with `result` at `now`.
pub fn status_after_snapshot(
    checkpoint: &Checkpoint,
    result: Result<&SnapshotInfo, &RuntimeError>,
    now: Timestamp,
) -> CheckpointStatus {
    let mut status = match result {
        Ok(info) => {
            let message = format!(
                "snapshot {} of {} at {} ({} bytes of memory images)",
                info.name, info.source, info.location, info.image_bytes
            );
            let mut status = status_with(checkpoint, CheckpointPhase::Succeeded, Some(message));
            status.checkpoint_id = Some(info.name.to_string());
            status
        }
        Err(error) => status_with(checkpoint, CheckpointPhase::Failed, Some(error.to_string())),
    };
    status.completion_time = Some(Time(now));
    status
}

/// Applies `plan` to `checkpoint` through `store` and `runtime`, in order. Writes carry the
/// observed `resourceVersion`; a checkpoint that disappeared meanwhile is not an error. Returns
/// the next step and the checkpoint as the writes left it (`None` when gone).
///
/// # Errors
///
/// [`CheckpointError::Store`], and [`CheckpointError::Runtime`] when deleting a snapshot
/// failed (a failed snapshot is a `Failed` status, not an error).
pub async fn execute<S: Store>(
    store: &S,
    runtime: &dyn Runtime,
    checkpoint: &Checkpoint,
    plan: &Plan<CheckpointAction>,
    now: Timestamp,
) -> Result<(Action, Option<Checkpoint>), CheckpointError> {
    let namespace = checkpoint.metadata.namespace.clone().unwrap_or_default();
    let gone = || Ok((Action::await_change(), None));
    let mut current = checkpoint.clone();
    for action in &plan.actions {
        let written = match action {
            CheckpointAction::AddFinalizer => {
                let mut update = current.clone();
                update
                    .metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(finalizers::CHECKPOINT.to_owned());
                store.update(&namespace, &update).await
            }
            CheckpointAction::RemoveFinalizer => {
                let mut update = current.clone();
                if let Some(list) = update.metadata.finalizers.as_mut() {
                    list.retain(|f| f != finalizers::CHECKPOINT);
                }
                return match store.update(&namespace, &update).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => gone(),
                    Err(error) => Err(error.into()),
                };
            }
            CheckpointAction::UpdateStatus(status) => {
                let mut update = current.clone();
                update.status = Some((**status).clone());
                store.update_status(&namespace, &update).await
            }
            CheckpointAction::Snapshot { sandbox, name } => {
                let result = runtime.snapshot(sandbox, name).await;
                match &result {
                    Ok(info) => {
                        info!(%sandbox, snapshot = %name, bytes = info.image_bytes, "snapshot taken")
                    }
                    Err(error) => warn!(%sandbox, snapshot = %name, %error, "snapshot failed"),
                }
                let mut update = current.clone();
                update.status = Some(status_after_snapshot(&current, result.as_ref(), now));
                store.update_status(&namespace, &update).await
            }
            CheckpointAction::DeleteSnapshot(name) => {
                runtime.delete_snapshot(name).await.map_err(|source| CheckpointError::Runtime {
                    operation: Operation::Snapshot,
                    source,
                })?;
                debug!(snapshot = %name, "snapshot deleted");
                continue;
            }
            CheckpointAction::Delete => {
                let name = current.metadata.name.clone().unwrap_or_default();
                let preconditions =
                    Preconditions { uid: current.metadata.uid.clone(), resource_version: None };
                return match store.delete::<Checkpoint>(&namespace, &name, &preconditions).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {
                        info!(checkpoint = %name, "ttlAfterFinished passed: checkpoint deleted");
                        gone()
                    }
                    Err(error) => Err(error.into()),
                };
            }
        };
        match written {
            Ok(written) => current = written,
            Err(StoreError::NotFound { .. }) => return gone(),
            Err(error) => return Err(error.into()),
        }
    }
    Ok((plan.next_action(), Some(current)))
}

/// What the checkpoint reconciler reads and writes through.
pub struct CheckpointContext<S: Store> {
    /// Where Checkpoints are written and Sandboxes read.
    pub store: S,
    /// Where snapshots are taken.
    pub runtime: Arc<dyn Runtime>,
    /// Where `now` comes from.
    pub clock: Clock,
    /// The versions this controller wrote, to skip reconciles of a cache that lags them.
    pub written: WrittenVersions,
}

impl<S: Store> std::fmt::Debug for CheckpointContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointContext").finish_non_exhaustive()
    }
}

/// Reconciles one Checkpoint: read the Sandbox it names, [`plan_checkpoint`], [`execute`].
///
/// # Errors
///
/// [`CheckpointError`] from planning, the store or the runtime.
pub async fn reconcile_checkpoint<S: Store>(
    checkpoint: Arc<Checkpoint>,
    ctx: Arc<CheckpointContext<S>>,
) -> Result<Action, CheckpointError> {
    if ctx.written.is_stale(checkpoint.as_ref()) {
        return Ok(Action::await_change());
    }
    let namespace = checkpoint.metadata.namespace.clone().unwrap_or_default();
    let named = sandbox_name(&checkpoint);
    let terminal = checkpoint.metadata.deletion_timestamp.is_some()
        || matches!(
            checkpoint.status.as_ref().and_then(|s| s.phase.as_ref()),
            Some(CheckpointPhase::Succeeded | CheckpointPhase::Failed)
        );
    let sandbox = match named {
        Some(name) if !terminal => match ctx.store.get::<Sandbox>(&namespace, name).await {
            Ok(sandbox) => Some(sandbox),
            Err(StoreError::NotFound { .. }) => None,
            Err(error) => return Err(error.into()),
        },
        _ => None,
    };
    let lookup = match (named, &sandbox) {
        (None, _) => SandboxLookup::Unnamed,
        (Some(_), Some(sandbox)) => SandboxLookup::Found(sandbox),
        (Some(name), None) => SandboxLookup::Missing(name),
    };
    let now = ctx.clock.now();
    let plan = plan_checkpoint(&checkpoint, lookup, now)?;
    let (next, written) =
        execute(&ctx.store, ctx.runtime.as_ref(), &checkpoint, &plan, now).await?;
    if let Some(written) = written {
        ctx.written.record(&written);
    }
    Ok(next)
}

/// The checkpoint controller's error policy: an invalid checkpoint waits for a change,
/// everything else backs off.
pub fn checkpoint_error_policy<S: Store>(
    _checkpoint: &Checkpoint,
    error: &CheckpointError,
    _ctx: &CheckpointContext<S>,
) -> Action {
    match error {
        CheckpointError::Invalid(_) => Action::await_change(),
        CheckpointError::Store(_) | CheckpointError::Runtime { .. } => Action::backoff(),
    }
}

/// Builds the Checkpoint controller over `informers` (the process's shared ones, or a store for its
/// own) and `runtime`. Run it with [`run_checkpoint_controller`] or
/// `controller.run(reconcile_checkpoint, checkpoint_error_policy, ctx)`.
pub fn checkpoint_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    runtime: Arc<dyn Runtime>,
    config: Config,
    clock: Clock,
) -> (Controller<Checkpoint, S>, Arc<CheckpointContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller = Controller::<Checkpoint, S>::shared("checkpoint", &informers, config.runner);
    let ctx =
        Arc::new(CheckpointContext { store, runtime, clock, written: WrittenVersions::default() });
    let forget = Arc::clone(&ctx);
    let controller = controller.on_delete(move |checkpoint: &Checkpoint| {
        forget.written.forget(&oka_cache::ObjectKey::of(checkpoint));
    });
    (controller, ctx)
}

/// Runs the Checkpoint controller until `shutdown` resolves (then finishes in-flight
/// reconciles).
pub async fn run_checkpoint_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    runtime: Arc<dyn Runtime>,
    config: Config,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = checkpoint_controller(informers, runtime, config, clock);
    controller.shutdown_on(shutdown).run(reconcile_checkpoint, checkpoint_error_policy, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use oka_api::checkpoint::CheckpointSpec;
    use std::time::Duration;

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn checkpoint(finalized: bool) -> Checkpoint {
        let mut c = Checkpoint::new(
            "cp",
            CheckpointSpec { sandbox_name: Some("sbx".into()), ..CheckpointSpec::default() },
        );
        c.metadata = ObjectMeta {
            name: Some("cp".into()),
            namespace: Some("default".into()),
            uid: Some("0b5e7e1c-0000-4000-8000-000000000001".into()),
            generation: Some(1),
            finalizers: finalized.then(|| vec![finalizers::CHECKPOINT.to_owned()]),
            ..ObjectMeta::default()
        };
        c
    }

    fn sandbox() -> Sandbox {
        let mut s = Sandbox::new("sbx", oka_api::SandboxSpec::default());
        s.metadata.namespace = Some("default".into());
        s.metadata.uid = Some("u1".into());
        s
    }

    #[test]
    fn a_new_checkpoint_gets_its_finalizer_then_is_snapshotted() {
        let sbx = sandbox();
        let plan = plan_checkpoint(&checkpoint(false), SandboxLookup::Found(&sbx), now()).unwrap();
        assert_eq!(plan.actions[0], CheckpointAction::AddFinalizer);
        assert!(
            matches!(plan.actions[1], CheckpointAction::UpdateStatus(ref s) if s.phase == Some(CheckpointPhase::Creating))
        );
        let CheckpointAction::Snapshot { sandbox, name } = &plan.actions[2] else { panic!() };
        assert_eq!(sandbox, &runtime_id(&sbx).unwrap());
        assert_eq!(name.as_str(), "0b5e7e1c-0000-4000-8000-000000000001");
    }

    #[test]
    fn a_creating_checkpoint_is_snapshotted_again_without_a_status_write() {
        let mut cp = checkpoint(true);
        cp.status = Some(status_with(&cp, CheckpointPhase::Creating, None));
        let sbx = sandbox();
        let plan = plan_checkpoint(&cp, SandboxLookup::Found(&sbx), now()).unwrap();
        assert_eq!(plan.actions.len(), 1);
        assert!(matches!(plan.actions[0], CheckpointAction::Snapshot { .. }));
    }

    #[test]
    fn a_missing_or_unnamed_sandbox_fails_the_checkpoint() {
        for lookup in [SandboxLookup::Missing("sbx"), SandboxLookup::Unnamed] {
            let plan = plan_checkpoint(&checkpoint(true), lookup, now()).unwrap();
            let [CheckpointAction::UpdateStatus(status)] = plan.actions.as_slice() else {
                panic!("{plan:?}")
            };
            assert_eq!(status.phase, Some(CheckpointPhase::Failed));
            assert_eq!(status.completion_time, Some(Time(now())));
        }
    }

    #[test]
    fn deletion_removes_the_snapshot_then_the_finalizer() {
        let mut cp = checkpoint(true);
        cp.metadata.deletion_timestamp = Some(Time(now()));
        let plan = plan_checkpoint(&cp, SandboxLookup::Unnamed, now()).unwrap();
        let name = snapshot_name(&cp).unwrap();
        assert_eq!(
            plan.actions,
            [CheckpointAction::DeleteSnapshot(name), CheckpointAction::RemoveFinalizer]
        );
        cp.metadata.finalizers = None;
        assert!(plan_checkpoint(&cp, SandboxLookup::Unnamed, now()).unwrap().actions.is_empty());
    }

    #[test]
    fn a_finished_checkpoint_is_deleted_after_its_ttl() {
        let mut cp = checkpoint(true);
        cp.spec.ttl_after_finished = Some("1d".into());
        let mut status = status_with(&cp, CheckpointPhase::Succeeded, None);
        status.completion_time = Some(Time(now()));
        cp.status = Some(status);
        let plan = plan_checkpoint(&cp, SandboxLookup::Unnamed, now()).unwrap();
        assert!(plan.actions.is_empty());
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(86_400)));
        let later = now().saturating_add(SignedDuration::from_hours(24)).unwrap();
        let plan = plan_checkpoint(&cp, SandboxLookup::Unnamed, later).unwrap();
        assert_eq!(plan.actions, [CheckpointAction::Delete]);
        cp.spec.ttl_after_finished = None;
        let plan = plan_checkpoint(&cp, SandboxLookup::Unnamed, later).unwrap();
        assert_eq!((plan.actions.len(), plan.requeue_after), (0, None));
    }

    #[test]
    fn the_status_after_a_snapshot_carries_its_id_or_the_error() {
        let cp = checkpoint(true);
        let info = SnapshotInfo {
            name: snapshot_name(&cp).unwrap(),
            source: SandboxId::new("sbx-u1").unwrap(),
            location: "/state/snapshots/x".into(),
            image_bytes: 42,
            created_at: std::time::SystemTime::UNIX_EPOCH,
        };
        let ok = status_after_snapshot(&cp, Ok(&info), now());
        assert_eq!(ok.phase, Some(CheckpointPhase::Succeeded));
        assert_eq!(ok.checkpoint_id.as_deref(), Some(info.name.as_str()));
        assert!(ok.message.unwrap().contains("/state/snapshots/x"));
        let error = RuntimeError::NotFound(info.source.clone());
        let failed = status_after_snapshot(&cp, Err(&error), now());
        assert_eq!(failed.phase, Some(CheckpointPhase::Failed));
        assert_eq!(failed.checkpoint_id, None);
        assert_eq!(failed.observed_generation, Some(1));
    }
}
