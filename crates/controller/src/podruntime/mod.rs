//! The Pod runtime: sandboxes as ordinary Pods (the reference's model), for the sandboxes the
//! runtime rule ([`oka_api::runtime_choice`]) gives to Pods. It runs in the leading
//! `oka controller`.
//!
//! - [`pod`]: the Pod (and PVCs) of a sandbox, pure, in the reference's shape, with envd added
//!   to any image;
//! - [`plan`]: the phase rules, pure ([`plan::plan_pod_sandbox`]);
//! - this module: the controller and its thin executor ([`execute`]).
//!
//! Why a controller of its own rather than a [`oka_runtime_api::Runtime`] over Pods under the
//! node agents' Sandbox controller: that trait takes a derived `SandboxSpec` without the pod
//! template (volumes, init containers, scheduling fields), and a Pod's life is observed from
//! what the kubelet reports rather than driven verb by verb, which is the reference's
//! controller shape. The timers' rule is shared ([`crate::sandbox::timer_step`]).
//!
//! # Expected flow
//!
//! Sandboxes are the primary kind (the process's shared informer); Pods are followed through a
//! shared informer with the label selector `agents.kruise.io/created-by=sandbox`, each change
//! waking the sandbox of the Pod's name; a SandboxTemplate change wakes the sandboxes that
//! refer to it. A reconcile resolves the template (inline, else the cached SandboxTemplate),
//! leaves node-runtime sandboxes alone, plans, tells once per sandbox in a Warning Event
//! each field it does not honour ([`plan::unhonoured`]), and executes: finalizer and spec writes, the
//! status (one compare-and-swap on the status subresource, then the phase's Event), then the
//! Pod create or delete, then a `/init` replay.
//!
//! # Guarantees
//!
//! - A Pod is created only after the finalizer is on its Sandbox; the finalizer goes only once
//!   the Pod is gone.
//! - A Pod that another object owns is never deleted or adopted.
//! - A Pod's create and delete are idempotent (`AlreadyExists` and `NotFound` are success), so
//!   a reconcile repeated from a lagging cache is harmless.
//!
//! # Pause and resume
//!
//! On Pods a pause is the Stop strategy whatever `pauseStrategy` says: the Pod is deleted
//! (`SandboxPaused=True/StopPauseSucceed` once it is gone), and a resume creates it again from
//! the current template. What is kept: the PersistentVolumeClaims of `volumeClaimTemplates`
//! (and any volume that outlives a Pod); not memory, processes, the container's writable layer
//! or the Pod IP.

pub mod plan;
pub mod pod;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use oka_api::conditions::sandbox::{RUNTIME_INITIALIZED, runtime_initialized_reason};
use oka_api::conditions::{FALSE, TRUE};
use oka_api::runtime_choice::{SandboxRuntime, sandbox_runtime};
use oka_api::{Sandbox, SandboxTemplate, finalizers, labels};
use oka_cache::{Action, Cache, Controller, Informers, ObjectKey, WatchConfig};
use oka_store::{Preconditions, Store, StoreError};
use tracing::{info, warn};

use crate::Config;
use crate::events::{EventRecorder, EventType};
use crate::plan::{Clock, Plan};
use crate::sandbox::{Initializer, condition_events, phase_event};
use crate::versions::WrittenVersions;
pub use plan::{PodAction, PodObservation, plan_pod_sandbox};
pub use pod::{PodBuildError, PodOptions, build_claims, build_pod};

/// How the Pod runtime runs besides its [`Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRuntimeOptions {
    /// How Pods are built.
    pub pods: PodOptions,
    /// The runtime of sandboxes neither annotated nor of the `oka-node` runtime class
    /// (`cluster.defaultRuntime`).
    pub default_runtime: SandboxRuntime,
    /// Who replays `/init` to a resumed sandbox's envd.
    pub initializer: Option<Initializer>,
}

/// A failed reconcile.
#[derive(Debug, thiserror::Error)]
pub enum PodRuntimeError {
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The Pod could not be created (also in the `Ready` condition and a Warning Event).
    #[error("cannot create the pod: {0}")]
    CreatePod(StoreError),
    /// Replaying `/init` failed (also in `RuntimeInitialized`).
    #[error("agent runtime initialisation: {0}")]
    Initialize(String),
}

/// What the reconciler reads and writes through.
pub struct PodRuntimeContext<S: Store> {
    store: S,
    pods: Cache<Pod>,
    templates: Cache<SandboxTemplate>,
    clock: Clock,
    options: PodRuntimeOptions,
    events: EventRecorder,
    written: WrittenVersions,
    /// (sandbox uid, field) of the [`plan::unhonoured`] fields already told, once each.
    warned: std::sync::Mutex<std::collections::HashSet<(String, &'static str)>>,
}

impl<S: Store> PodRuntimeContext<S> {
    /// A context over `store` reading these caches (the controller's are the shared
    /// informers'; a test fills its own), recording Events with `events`.
    pub fn new(
        store: S,
        pods: Cache<Pod>,
        templates: Cache<SandboxTemplate>,
        clock: Clock,
        options: PodRuntimeOptions,
        events: EventRecorder,
    ) -> Self {
        Self {
            store,
            pods,
            templates,
            clock,
            options,
            events,
            written: WrittenVersions::default(),
            warned: std::sync::Mutex::default(),
        }
    }
}

/// The label selector of the Pods the sandbox controller creates.
pub fn pod_selector() -> oka_store::Selector {
    oka_store::Selector::from_labels([(labels::CREATED_BY, labels::CREATED_BY_SANDBOX)])
}

/// The resolved pod template of `sandbox`: inline, else the cached SandboxTemplate's.
fn template_of(templates: &Cache<SandboxTemplate>, sandbox: &Sandbox) -> Option<PodTemplateSpec> {
    if let Some(template) = &sandbox.spec.template {
        return Some(template.clone());
    }
    let reference = sandbox.spec.template_ref.as_ref()?;
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    templates.get(&ObjectKey::new(namespace, &reference.name))?.spec.template.clone()
}

/// Reconciles one sandbox if it runs on a Pod.
pub async fn reconcile_pod_sandbox<S: Store>(
    sandbox: Arc<Sandbox>,
    ctx: Arc<PodRuntimeContext<S>>,
) -> Result<Action, PodRuntimeError> {
    if ctx.written.is_stale(sandbox.as_ref()) {
        return Ok(Action::await_change());
    }
    let template = template_of(&ctx.templates, &sandbox);
    if template.is_none() && sandbox.spec.template_ref.is_some() {
        // Which runtime it is may depend on the SandboxTemplate; its arrival wakes it.
        return Ok(Action::await_change());
    }
    if sandbox_runtime(&sandbox, template.as_ref(), ctx.options.default_runtime)
        != SandboxRuntime::Pod
    {
        return Ok(Action::await_change());
    }
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let name = sandbox.metadata.name.as_deref().unwrap_or_default();
    let pod = ctx.pods.get(&ObjectKey::new(namespace, name));
    let observed = PodObservation {
        template: template.as_ref(),
        pod: pod.as_deref(),
        options: &ctx.options.pods,
    };
    let plan = plan_pod_sandbox(&sandbox, &observed, ctx.clock.now());
    warn_unhonoured(&ctx, &sandbox, pod.as_deref());
    execute(&ctx, &sandbox, &plan).await
}

/// A Warning Event [`plan::UNSUPPORTED_ON_POD`] for each field of `sandbox` the Pod runtime
/// does not honour ([`plan::unhonoured`]), once per sandbox and field in this process.
fn warn_unhonoured<S: Store>(ctx: &PodRuntimeContext<S>, sandbox: &Sandbox, pod: Option<&Pod>) {
    if sandbox.metadata.deletion_timestamp.is_some() {
        return;
    }
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    for item in plan::unhonoured(sandbox, pod) {
        let first = ctx
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((uid.clone(), item.field));
        if first {
            warn!(sandbox = ?sandbox.metadata.name, field = item.field, "not honoured on a Pod");
            ctx.events.record(sandbox, EventType::Warning, plan::UNSUPPORTED_ON_POD, &item.message);
        }
    }
}

/// Applies `plan` in order; see the module documentation.
pub async fn execute<S: Store>(
    ctx: &PodRuntimeContext<S>,
    sandbox: &Sandbox,
    plan: &Plan<PodAction>,
) -> Result<Action, PodRuntimeError> {
    let store = &ctx.store;
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let mut current = sandbox.clone();
    for action in &plan.actions {
        match action {
            PodAction::EnsureMetadata { .. }
            | PodAction::RemoveFinalizer
            | PodAction::MarkRestarted(_)
            | PodAction::SetPaused { .. } => {
                let mut update = current.clone();
                let list = update.metadata.finalizers.get_or_insert_with(Vec::new);
                match action {
                    PodAction::EnsureMetadata { finalizer, immutable_hash } => {
                        if *finalizer {
                            list.push(finalizers::SANDBOX.to_owned());
                        }
                        if let Some(hash) = immutable_hash {
                            update.metadata.annotations.get_or_insert_default().insert(
                                oka_api::annotations::HASH_IMMUTABLE_PART.to_owned(),
                                hash.clone(),
                            );
                        }
                    }
                    PodAction::RemoveFinalizer => list.retain(|f| f != finalizers::SANDBOX),
                    PodAction::MarkRestarted(requested) => {
                        update.metadata.annotations.get_or_insert_default().insert(
                            oka_api::annotations::RESTARTED_AT.to_owned(),
                            requested.clone(),
                        );
                        info!(sandbox = %name, %requested, "restarting: recreating the pod");
                    }
                    _ => {}
                }
                if let PodAction::SetPaused { until } = action {
                    update.spec.paused = Some(true);
                    if let Some(until) = until {
                        update.spec.shutdown_time = Some(until.clone());
                        update.spec.pause_time = Some(until.clone());
                    }
                    info!(sandbox = %name, "pauseTime reached: pausing the sandbox");
                }
                match store.update(&namespace, &update).await {
                    Ok(written) => {
                        ctx.written.record(&written);
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(Action::await_change()),
                    Err(StoreError::Conflict { .. }) => return Ok(Action::await_change()),
                    Err(error) => return Err(error.into()),
                }
                if *action == PodAction::RemoveFinalizer {
                    return Ok(Action::await_change());
                }
            }
            PodAction::DeleteSandbox => {
                let preconditions =
                    Preconditions { uid: current.metadata.uid.clone(), resource_version: None };
                match store.delete::<Sandbox>(&namespace, &name, &preconditions).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {
                        info!(sandbox = %name, "shutdownTime reached: sandbox deleted");
                        return Ok(Action::await_change());
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            PodAction::UpdateStatus(status) => {
                let mut update = current.clone();
                update.status = Some((**status).clone());
                match store.update_status(&namespace, &update).await {
                    Ok(written) => {
                        ctx.written.record(&written);
                        if let Some((type_, reason, message)) = phase_event(&current, &written) {
                            ctx.events.record(&written, type_, &reason, &message);
                        }
                        for (type_, reason, message) in condition_events(&current, &written) {
                            ctx.events.record(&written, type_, &reason, &message);
                        }
                        current = written;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(Action::await_change()),
                    // Our cache was behind: the newer object is on its way and wakes us.
                    Err(StoreError::Conflict { .. }) => return Ok(Action::await_change()),
                    Err(error) => return Err(error.into()),
                }
            }
            PodAction::CreatePod(pod) => {
                for claim in build_claims(&current) {
                    match store.create::<PersistentVolumeClaim>(&namespace, &claim).await {
                        Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
                        Err(error) => return Err(create_failed(ctx, &current, error).await),
                    }
                }
                match store.create::<Pod>(&namespace, pod).await {
                    Ok(created) => {
                        info!(sandbox = %name, %namespace, "pod created");
                        ctx.pods.apply(Arc::new(created));
                    }
                    Err(StoreError::AlreadyExists { .. }) => {}
                    Err(error) => return Err(create_failed(ctx, &current, error).await),
                }
            }
            PodAction::DeletePod { uid } => {
                let preconditions =
                    Preconditions { uid: Some(uid.clone()), resource_version: None };
                match store.delete::<Pod>(&namespace, &name, &preconditions).await {
                    Ok(_) => info!(sandbox = %name, %namespace, "pod deleted"),
                    Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            PodAction::Initialize => {
                let Some(initializer) = &ctx.options.initializer else { continue };
                let outcome = initializer.0.initialize(&current).await;
                let (status, reason, message) = match &outcome {
                    Ok(()) => (TRUE, runtime_initialized_reason::SUCCEEDED, String::new()),
                    Err(why) => (FALSE, runtime_initialized_reason::FAILED, why.clone()),
                };
                let mut update = current.clone();
                let conditions =
                    update.status.get_or_insert_default().conditions.get_or_insert_default();
                oka_api::conditions::set(
                    conditions,
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                        type_: RUNTIME_INITIALIZED.to_owned(),
                        status: status.to_owned(),
                        reason: reason.to_owned(),
                        message: message.clone(),
                        last_transition_time: crate::plan::whole_seconds(ctx.clock.now()),
                        observed_generation: None,
                    },
                );
                match store.update_status(&namespace, &update).await {
                    Ok(written) => {
                        ctx.written.record(&written);
                        current = written;
                    }
                    Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
                let type_ = if outcome.is_ok() { EventType::Normal } else { EventType::Warning };
                ctx.events.record(&current, type_, "RuntimeInitialized", &message);
                if let Err(why) = outcome {
                    return Err(PodRuntimeError::Initialize(why));
                }
            }
            PodAction::Event { type_, reason, message } => {
                ctx.events.record(&current, *type_, reason, message);
            }
        }
    }
    Ok(plan.next_action())
}

/// A Pod (or PVC) create failed: `Ready=False/PodCreateFailed` with the error, and a Warning.
async fn create_failed<S: Store>(
    ctx: &PodRuntimeContext<S>,
    sandbox: &Sandbox,
    error: StoreError,
) -> PodRuntimeError {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let message = format!("Failed to create pod: {error}");
    warn!(sandbox = ?sandbox.metadata.name, %error, "cannot create the pod");
    ctx.events.record(sandbox, EventType::Warning, "PodCreateFailed", &message);
    let mut update = sandbox.clone();
    let conditions = update.status.get_or_insert_default().conditions.get_or_insert_default();
    oka_api::conditions::set(
        conditions,
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: oka_api::conditions::sandbox::READY.to_owned(),
            status: FALSE.to_owned(),
            reason: oka_api::conditions::sandbox::ready_reason::POD_CREATE_FAILED.to_owned(),
            message: oka_api::conditions::truncate_message(
                &message,
                oka_api::conditions::DEFAULT_MAX_MESSAGE_LEN,
            ),
            last_transition_time: crate::plan::whole_seconds(ctx.clock.now()),
            observed_generation: None,
        },
    );
    if update.status != sandbox.status
        && let Ok(written) = ctx.store.update_status(&namespace, &update).await
    {
        ctx.written.record(&written);
    }
    PodRuntimeError::CreatePod(error)
}

/// Backoff on every failure.
pub fn pod_runtime_error_policy<S: Store>(
    _sandbox: &Sandbox,
    _error: &PodRuntimeError,
    _ctx: &PodRuntimeContext<S>,
) -> Action {
    Action::backoff()
}

/// Builds the Pod runtime's controller over `informers`: Sandboxes (primary), Pods of
/// `agents.kruise.io/created-by=sandbox` (a change wakes the sandbox of the Pod's name), and
/// SandboxTemplates (a change wakes the sandboxes that refer to it).
pub fn pod_runtime_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    options: PodRuntimeOptions,
) -> (Controller<Sandbox, S>, Arc<PodRuntimeContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller = Controller::<Sandbox, S>::shared("pod-runtime", &informers, config.runner);
    let sandboxes = controller.cache();
    let pods = informers
        .informer::<Pod>(WatchConfig { selector: pod_selector(), ..WatchConfig::default() });
    let templates = informers.all::<SandboxTemplate>();
    let events = EventRecorder::spawn(store.clone(), "sandbox-controller");
    let ctx = Arc::new(PodRuntimeContext::new(
        store,
        pods.cache(),
        templates.cache(),
        clock,
        options,
        events,
    ));
    let forget = Arc::clone(&ctx);
    let controller = controller
        .watches_shared(pods, |pod: &Pod| vec![ObjectKey::of(pod)])
        .watches_shared(templates, move |template: &SandboxTemplate| {
            crate::sandbox::sandboxes_referring_to(&sandboxes, template)
        })
        .on_delete(move |sandbox: &Sandbox| {
            forget.written.forget(&ObjectKey::of(sandbox));
            let uid = sandbox.metadata.uid.as_deref().unwrap_or_default();
            let mut warned =
                forget.warned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            warned.retain(|(of, _)| of != uid);
        });
    (controller, ctx)
}

/// Runs the Pod runtime's controller until `shutdown` resolves.
pub async fn run_pod_runtime_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    options: PodRuntimeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = pod_runtime_controller(informers, config, clock, options);
    controller
        .shutdown_on(shutdown)
        .run(reconcile_pod_sandbox, pod_runtime_error_policy, ctx)
        .await;
}
