//! The Sandbox and SandboxSet controllers, runner and workers included, against the real
//! embedded store on a temporary directory and a small recording [`Runtime`] double (the real
//! local runtime is tested in its own crate, as root). Real time is used, with short
//! durations; every wait is a poll bounded by a deadline, never a fixed sleep.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::common::{PauseStrategy, PauseStrategyType};
use oka_api::conditions::sandbox::{PAUSED, READY, RESUMED};
use oka_api::{Sandbox, SandboxPhase, SandboxSet, SandboxSetSpec, SandboxSpec, finalizers, labels};
use oka_controller::sandbox::image::{ImagePullError, ImageSource, PulledImage};
use oka_controller::sandbox::imageconfig::{ImageAccounts, ImageConfig};
use oka_controller::sandbox::{
    SandboxOptions, reconcile_sandbox, runtime_id, sandbox_controller, sandbox_error_policy,
};
use oka_controller::sandboxset::{run_sandbox_set_controller, scale_down_rank};
use oka_controller::{Clock, Config};
use oka_runtime_api::{
    ExitInfo, Operation, Runtime, RuntimeError, SandboxId, SandboxSpec as InstanceSpec,
    SandboxState, SandboxStatus,
};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Preconditions, Selector, Store};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "default";
const NODE: &str = "test-node";
/// The most any step below may take; they normally take milliseconds.
const DEADLINE: Duration = Duration::from_secs(20);

// === A recording runtime double ===

#[derive(Debug)]
struct Instance {
    spec: InstanceSpec,
    state: SandboxState,
    last_exit: Option<ExitInfo>,
}

#[derive(Debug, Default)]
struct FakeState {
    instances: BTreeMap<SandboxId, Instance>,
    calls: Vec<(Operation, SandboxId)>,
    hibernate_unsupported: bool,
}

/// Keeps instances in a map with the local runtime's state rules, and records every call.
#[derive(Debug, Default)]
struct FakeRuntime {
    state: Mutex<FakeState>,
}

impl FakeRuntime {
    fn with<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }
    fn calls_of(&self, id: &SandboxId) -> Vec<Operation> {
        self.with(|s| s.calls.iter().filter(|(_, i)| i == id).map(|(op, _)| *op).collect())
    }
    fn state_of(&self, id: &SandboxId) -> SandboxState {
        self.with(|s| s.instances.get(id).map_or(SandboxState::Gone, |i| i.state))
    }
    fn live(&self) -> usize {
        self.with(|s| s.instances.len())
    }
    fn vanish(&self, id: &SandboxId) {
        self.with(|s| s.instances.remove(id));
    }
    fn record(&self, op: Operation, id: &SandboxId) {
        self.with(|s| s.calls.push((op, id.clone())));
    }
    fn transition(
        &self,
        op: Operation,
        id: &SandboxId,
        f: impl FnOnce(&mut Instance, &mut bool) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        self.record(op, id);
        self.with(|s| {
            let mut unsupported = s.hibernate_unsupported;
            let instance =
                s.instances.get_mut(id).ok_or_else(|| RuntimeError::NotFound(id.clone()))?;
            f(instance, &mut unsupported)
        })
    }
}

fn invalid(id: &SandboxId, state: SandboxState, operation: Operation) -> RuntimeError {
    RuntimeError::InvalidState { id: id.clone(), state, operation }
}

fn status_of(id: &SandboxId, instance: Option<&Instance>) -> SandboxStatus {
    match instance {
        None => SandboxStatus::gone(id.clone()),
        Some(i) => SandboxStatus {
            id: id.clone(),
            state: i.state,
            pid: Some(1),
            started_at: Some(SystemTime::now()),
            last_exit: i.last_exit,
            usage: None,
            address: None,
        },
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn ensure(&self, spec: &InstanceSpec) -> Result<SandboxStatus, RuntimeError> {
        self.record(Operation::Ensure, &spec.id);
        spec.validate()?;
        self.with(|s| {
            let instance = s.instances.entry(spec.id.clone()).or_insert_with(|| Instance {
                spec: spec.clone(),
                state: SandboxState::Stopped,
                last_exit: None,
            });
            if instance.spec != *spec {
                return Err(RuntimeError::SpecMismatch(spec.id.clone()));
            }
            match instance.state {
                SandboxState::Stopped => {
                    instance.state = SandboxState::Running;
                    instance.last_exit = None;
                }
                SandboxState::Hibernated => {
                    return Err(invalid(&spec.id, SandboxState::Hibernated, Operation::Ensure));
                }
                _ => {}
            }
            Ok(status_of(&spec.id, Some(instance)))
        })
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Ok(self.with(|s| status_of(id, s.instances.get(id))))
    }

    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.transition(Operation::Pause, id, |i, _| match i.state {
            SandboxState::Running | SandboxState::Paused => {
                i.state = SandboxState::Paused;
                Ok(())
            }
            state => Err(invalid(id, state, Operation::Pause)),
        })
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.transition(Operation::Resume, id, |i, _| match i.state {
            SandboxState::Running | SandboxState::Paused => {
                i.state = SandboxState::Running;
                Ok(())
            }
            state => Err(invalid(id, state, Operation::Resume)),
        })
    }

    async fn hibernate(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.transition(Operation::Hibernate, id, |i, unsupported| match i.state {
            SandboxState::Hibernated => Ok(()),
            SandboxState::Running | SandboxState::Paused if *unsupported => {
                Err(RuntimeError::Unsupported {
                    operation: Operation::Hibernate,
                    reason: "CRIU is not integrated yet".into(),
                })
            }
            SandboxState::Running | SandboxState::Paused => {
                i.state = SandboxState::Hibernated;
                Ok(())
            }
            state => Err(invalid(id, state, Operation::Hibernate)),
        })
    }

    async fn restore(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        self.transition(Operation::Restore, id, |i, _| match i.state {
            SandboxState::Hibernated => {
                i.state = SandboxState::Running;
                Ok(())
            }
            state => Err(invalid(id, state, Operation::Restore)),
        })?;
        self.inspect(id).await
    }

    async fn stop(&self, id: &SandboxId, _grace: Duration) -> Result<(), RuntimeError> {
        self.transition(Operation::Stop, id, |i, _| {
            if matches!(i.state, SandboxState::Running | SandboxState::Paused) {
                i.state = SandboxState::Stopped;
                i.last_exit = Some(ExitInfo::Signal(15));
            }
            Ok(())
        })
    }

    async fn delete(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.record(Operation::Delete, id);
        self.with(|s| s.instances.remove(id));
        Ok(())
    }

    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError> {
        Ok(self.with(|s| s.instances.iter().map(|(id, i)| status_of(id, Some(i))).collect()))
    }

    async fn connect(&self, _id: &SandboxId, _port: u16) -> Result<TcpStream, RuntimeError> {
        Err(RuntimeError::Unsupported {
            operation: Operation::Connect,
            reason: "test double".into(),
        })
    }
}

// === Harness ===

struct Running {
    stop: oneshot::Sender<()>,
    tasks: Vec<JoinHandle<()>>,
    store: EmbeddedStore,
    runtime: Arc<FakeRuntime>,
    _dir: tempfile::TempDir,
}

// === An image source double ===

/// Images by reference: a reference listed pulls after `pull_time`, any other fails as a
/// registry's "manifest unknown"; every pull is counted.
#[derive(Debug, Default)]
struct FakeImages {
    images: BTreeMap<String, PulledImage>,
    pulls: Mutex<Vec<String>>,
    /// The pull secrets each pull was given.
    secrets: Mutex<Vec<Vec<Vec<u8>>>>,
    pull_time: Duration,
    /// Where the layers of `images` are.
    layers: Option<tempfile::TempDir>,
}

impl FakeImages {
    fn with(reference: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let layers = vec![dir.path().join("base"), dir.path().join("app")];
        for layer in &layers {
            std::fs::create_dir(layer).unwrap();
        }
        let image = PulledImage {
            reference: reference.into(),
            digest: "sha256:feed".into(),
            layers,
            config: ImageConfig {
                cmd: vec!["/app/serve".into()],
                env: vec!["GREETING=hello".into()],
                working_dir: Some("/app".into()),
                ..ImageConfig::default()
            },
            accounts: ImageAccounts::default(),
            size: 4096,
        };
        Self {
            images: [(reference.to_owned(), image)].into(),
            pull_time: Duration::from_millis(300),
            layers: Some(dir),
            ..Self::default()
        }
    }

    fn pulls(&self) -> Vec<String> {
        self.pulls.lock().unwrap().clone()
    }
}

impl ImageSource for FakeImages {
    fn pull<'a>(
        &'a self,
        reference: &'a str,
        pull_secrets: &'a [Vec<u8>],
    ) -> futures::future::BoxFuture<'a, Result<PulledImage, ImagePullError>> {
        Box::pin(async move {
            self.pulls.lock().unwrap().push(reference.to_owned());
            self.secrets.lock().unwrap().push(pull_secrets.to_vec());
            tokio::time::sleep(self.pull_time).await;
            self.images.get(reference).cloned().ok_or_else(|| ImagePullError {
                message: format!("image {reference} not found in registry reg: manifest unknown"),
            })
        })
    }

    fn present(&self, _reference: &str) -> Option<PulledImage> {
        None
    }
}

fn open(dir: &Path) -> EmbeddedStore {
    EmbeddedStore::open(&dir.join("store.redb"), EmbeddedOptions::default()).unwrap()
}

/// Starts the Sandbox and SandboxSet controllers on a fresh store.
fn start(runtime: FakeRuntime) -> Running {
    start_with(runtime, None)
}

/// [`start`], pulling images from `images`.
fn start_with(runtime: FakeRuntime, images: Option<Arc<FakeImages>>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let runtime = Arc::new(runtime);
    let (stop, stopped) = oneshot::channel::<()>();
    let (stop_sets_tx, stop_sets) = oneshot::channel::<()>();
    let options = SandboxOptions {
        node_name: NODE.into(),
        runtime_poll: Duration::from_millis(50),
        initializer: None,
        hooks: None,
        images: images.map(|i| oka_controller::sandbox::Shared(i as Arc<dyn ImageSource>)),
        ..SandboxOptions::default()
    };
    let as_runtime: Arc<dyn Runtime> = Arc::clone(&runtime) as Arc<dyn Runtime>;
    let (controller, ctx) = sandbox_controller(
        store.clone(),
        as_runtime,
        Config::default().workers(4),
        Clock::system(),
        options,
    );
    let sandboxes = tokio::spawn(
        controller
            .shutdown_on(async move {
                let _ = stopped.await;
                let _ = stop_sets_tx.send(());
            })
            .run(reconcile_sandbox, sandbox_error_policy, ctx),
    );
    let sets = tokio::spawn(run_sandbox_set_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        async move {
            let _ = stop_sets.await;
        },
    ));
    Running { stop, tasks: vec![sandboxes, sets], store, runtime, _dir: dir }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        for task in self.tasks {
            tokio::time::timeout(DEADLINE, task).await.expect("controllers stop").unwrap();
        }
    }

    async fn sandboxes(&self) -> Vec<Sandbox> {
        let list = self.store.list::<Sandbox>(Some(NS), &Selector::everything()).await.unwrap();
        list.items.iter().map(|s| (**s).clone()).collect()
    }

    async fn get(&self, name: &str) -> Option<Sandbox> {
        self.store.get::<Sandbox>(NS, name).await.ok()
    }

    /// Polls every 20 ms until `check` accepts what it reads, for at most [`DEADLINE`].
    async fn eventually<T>(
        &self,
        what: &str,
        mut check: impl FnMut(&Running) -> Pin<Box<dyn Future<Output = Option<T>> + Send + '_>>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(found) = check(self).await {
                return found;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the sandbox `name` every 20 ms until `accept` takes it, for at most [`DEADLINE`].
    async fn sandbox_where(
        &self,
        name: &str,
        what: &str,
        accept: impl Fn(&Sandbox) -> bool,
    ) -> Sandbox {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let found = self.get(name).await;
            if let Some(sandbox) = found.filter(|s| accept(s)) {
                return sandbox;
            }
            let now = self.get(name).await;
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {name} {what}: {now:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn edit(&self, name: &str, edit: impl Fn(&mut Sandbox)) {
        for _ in 0..50 {
            let mut sandbox = self.get(name).await.unwrap();
            edit(&mut sandbox);
            if self.store.update(NS, &sandbox).await.is_ok() {
                return;
            }
        }
        panic!("could not update {name}");
    }
}

fn template() -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                command: Some(vec!["sleep".into(), "infinity".into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    }
}

fn sandbox(name: &str, strategy: Option<PauseStrategyType>) -> Sandbox {
    Sandbox::new(
        name,
        SandboxSpec {
            template: Some(template()),
            pause_strategy: strategy
                .map(|t| PauseStrategy { type_: Some(t), ..Default::default() }),
            ..Default::default()
        },
    )
}

fn condition(sandbox: &Sandbox, type_: &str) -> Option<(String, String, String)> {
    sandbox.condition(type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is_running_ready(sandbox: &Sandbox) -> bool {
    sandbox.phase() == Some(&SandboxPhase::Running) && sandbox.is_ready()
}

fn pool_members(sandboxes: &[Sandbox]) -> Vec<&Sandbox> {
    sandboxes
        .iter()
        .filter(|s| s.is_controlled_by_sandbox_set() && s.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn ready_pool(running: &Running, size: usize) -> Vec<Sandbox> {
    running
        .eventually(&format!("{size} ready pool members"), move |r| {
            Box::pin(async move {
                let all = r.sandboxes().await;
                let members: Vec<Sandbox> = pool_members(&all).into_iter().cloned().collect();
                (members.len() == size && members.iter().all(is_running_ready)).then_some(members)
            })
        })
        .await
}

async fn pool_status(running: &Running, replicas: i32, available: i32) -> SandboxSet {
    running
        .eventually(&format!("pool status {replicas}/{available}"), move |r| {
            Box::pin(async move {
                let set: SandboxSet = r.store.get(NS, "pool").await.ok()?;
                let status = set.status.as_ref()?;
                (status.replicas == replicas && status.available_replicas == available)
                    .then_some(set)
            })
        })
        .await
}

// === Tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_three_becomes_three_running_ready_sandboxes() {
    let running = start(FakeRuntime::default());
    let set = SandboxSet::new(
        "pool",
        SandboxSetSpec { replicas: 3, template: Some(template()), ..Default::default() },
    );
    running.store.create(NS, &set).await.unwrap();

    let members = ready_pool(&running, 3).await;
    for member in &members {
        let id = runtime_id(member).unwrap();
        assert_eq!(running.runtime.state_of(&id), SandboxState::Running);
        assert_eq!(
            member.metadata.finalizers.as_deref(),
            Some(&[finalizers::SANDBOX.to_owned()][..])
        );
        let status = member.status.as_ref().unwrap();
        assert_eq!(status.node_name.as_deref(), Some(NODE));
        assert_eq!(status.observed_generation, member.metadata.generation);
        assert_eq!(condition(member, READY).map(|c| c.1), Some("PodReady".into()));
        let labels = member.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(labels::SANDBOX_POOL).map(String::as_str), Some("pool"));
        assert!(member.metadata.name.as_deref().unwrap().starts_with("pool-"));
    }
    let set = pool_status(&running, 3, 3).await;
    let status = set.status.unwrap();
    assert_eq!(status.updated_replicas, Some(3));
    assert_eq!(status.updated_available_replicas, Some(3));
    assert_eq!(
        status.selector.as_deref(),
        Some("agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=pool")
    );
    assert_eq!(running.runtime.live(), 3);
    running.stop().await;
}

fn image_template(reference: &str) -> PodTemplateSpec {
    let mut template = template();
    let container = &mut template.spec.as_mut().unwrap().containers[0];
    container.image = Some(reference.into());
    container.command = None;
    template
}

/// `(reason, message)` of the Events recorded about `name`.
async fn events_of(running: &Running, name: &str) -> Vec<(String, String)> {
    let events = running.store.list::<Event>(Some(NS), &Selector::everything()).await.unwrap();
    events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_an_image_pulls_it_once_and_runs_its_members_on_its_layers() {
    let reference = "127.0.0.1:5000/test/app:1";
    let images = Arc::new(FakeImages::with(reference));
    let running = start_with(FakeRuntime::default(), Some(Arc::clone(&images)));
    let set = SandboxSet::new(
        "pool",
        SandboxSetSpec {
            replicas: 3,
            template: Some(image_template(reference)),
            ..Default::default()
        },
    );
    running.store.create(NS, &set).await.unwrap();
    // While the one pull runs, every member waits Pending, ContainerCreating.
    running
        .eventually("members waiting for the pull", |r| {
            Box::pin(async move {
                let all = r.sandboxes().await;
                let waiting = pool_members(&all)
                    .iter()
                    .filter(|s| {
                        condition(s, READY).is_some_and(|c| {
                            c.1 == "ContainerCreating"
                                && c.2 == format!("Pulling image \"{reference}\"")
                        })
                    })
                    .count();
                (waiting == 3).then_some(())
            })
        })
        .await;
    assert_eq!(running.runtime.live(), 0, "nothing created before the image is there");
    let members = ready_pool(&running, 3).await;
    assert_eq!(images.pulls(), [reference], "one pull for the whole pool");
    for member in &members {
        let id = runtime_id(member).unwrap();
        let spec = running.runtime.with(|s| s.instances[&id].spec.clone());
        let layers = images.layers.as_ref().unwrap().path();
        assert_eq!(
            spec.root,
            oka_runtime_api::RootFs::Layers(vec![layers.join("base"), layers.join("app")])
        );
        assert_eq!(spec.argv(), ["/app/serve"]);
        assert_eq!(spec.process.working_dir, Some("/app".into()));
        let info = member.status.as_ref().unwrap().pod_info.as_ref().unwrap();
        assert_eq!(
            info.annotations.as_ref().unwrap()[oka_controller::sandbox::image::IMAGE_ID],
            "127.0.0.1:5000/test/app@sha256:feed"
        );
    }
    let name = members[0].metadata.name.clone().unwrap();
    let events = running
        .eventually("the Pulled event", |r| {
            let name = name.clone();
            Box::pin(async move {
                let events = events_of(r, &name).await;
                events.iter().any(|(reason, _)| reason == "Pulled").then_some(events)
            })
        })
        .await;
    let pulled = events.iter().find(|(reason, _)| reason == "Pulled").unwrap();
    assert!(
        pulled.1.starts_with(&format!("Successfully pulled image \"{reference}\" in "))
            && pulled.1.ends_with("s. Image size: 4096 bytes."),
        "{pulled:?}"
    );
    // A member made later finds the image present (IfNotPresent): no pull, the kubelet's words.
    let mut scaled = false;
    for _ in 0..50 {
        let mut set: SandboxSet = running.store.get(NS, "pool").await.unwrap();
        set.spec.replicas = 4;
        if running.store.update(NS, &set).await.is_ok() {
            scaled = true;
            break;
        }
    }
    assert!(scaled, "could not scale the pool");
    let members = ready_pool(&running, 4).await;
    assert_eq!(images.pulls(), [reference], "still one pull");
    let present = format!("Container image \"{reference}\" already present on machine");
    running
        .eventually("an already-present Pulled event", |r| {
            let members = members.clone();
            let present = present.clone();
            Box::pin(async move {
                for member in &members {
                    let events = events_of(r, member.metadata.name.as_deref().unwrap()).await;
                    if events.contains(&("Pulled".to_owned(), present.clone())) {
                        return Some(());
                    }
                }
                None
            })
        })
        .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_secrets_of_the_docker_config_type_are_handed_to_the_pull() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{LocalObjectReference, Secret};
    let reference = "127.0.0.1:5000/private/app:1";
    let images = Arc::new(FakeImages::with(reference));
    let running = start_with(FakeRuntime::default(), Some(Arc::clone(&images)));
    let config = br#"{"auths":{"127.0.0.1:5000":{"auth":"dTpw"}}}"#.to_vec();
    let secret = |name: &str, type_: &str, key: &str| Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some([(key.to_owned(), ByteString(config.clone()))].into()),
        ..Default::default()
    };
    running
        .store
        .create(NS, &secret("regcred", "kubernetes.io/dockerconfigjson", ".dockerconfigjson"))
        .await
        .unwrap();
    running.store.create(NS, &secret("opaque", "Opaque", "password")).await.unwrap();
    let mut private = sandbox("private", None);
    let mut template = image_template(reference);
    template.spec.as_mut().unwrap().image_pull_secrets = Some(
        ["missing", "opaque", "regcred"]
            .iter()
            .map(|name| LocalObjectReference { name: (*name).into() })
            .collect(),
    );
    private.spec.template = Some(template);
    running.store.create(NS, &private).await.unwrap();
    running.sandbox_where("private", "Running", is_running_ready).await;
    // The missing and the opaque Secret are skipped, as the kubelet skips them.
    assert_eq!(images.secrets.lock().unwrap().clone(), [vec![config]]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_backs_off_and_the_sandbox_never_runs_on_another_root() {
    let images = Arc::new(FakeImages::default());
    let running = start_with(FakeRuntime::default(), Some(Arc::clone(&images)));
    let reference = "127.0.0.1:5000/test/missing:1";
    let mut missing = sandbox("missing", None);
    missing.spec.template = Some(image_template(reference));
    running.store.create(NS, &missing).await.unwrap();
    let failed = running
        .sandbox_where("missing", "ErrImagePull", |s| {
            condition(s, READY).is_some_and(|c| c.1 == "ErrImagePull")
        })
        .await;
    assert!(condition(&failed, READY).unwrap().2.contains("manifest unknown"));
    let backing_off = running
        .sandbox_where("missing", "ImagePullBackOff", |s| {
            condition(s, READY).is_some_and(|c| c.1 == "ImagePullBackOff")
        })
        .await;
    assert_eq!(backing_off.phase(), Some(&SandboxPhase::Pending));
    assert_eq!(
        condition(&backing_off, READY).unwrap().2,
        format!(
            "Back-off pulling image \"{reference}\": image {reference} not found in registry reg: \
             manifest unknown"
        )
    );
    assert_eq!(running.runtime.live(), 0, "never created on another root");
    let events = running
        .eventually("the Failed and BackOff events", |r| {
            Box::pin(async move {
                let events = events_of(r, "missing").await;
                let has = |reason: &str| events.iter().any(|(r, _)| r == reason);
                (has("Pulling") && has("Failed") && has("BackOff")).then_some(events)
            })
        })
        .await;
    assert!(events.contains(&(
        "Failed".into(),
        format!(
            "Failed to pull image \"{reference}\": image {reference} not found in registry reg: \
             manifest unknown"
        )
    )));
    assert!(
        events.contains(&("BackOff".into(), format!("Back-off pulling image \"{reference}\"")))
    );
    // The next attempt waits for the backoff (10 s): one pull so far.
    assert_eq!(images.pulls(), [reference]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_sandbox_is_replaced_and_kept() {
    let running = start(FakeRuntime::default());
    let set = SandboxSet::new(
        "pool",
        SandboxSetSpec { replicas: 2, template: Some(template()), ..Default::default() },
    );
    running.store.create(NS, &set).await.unwrap();
    let members = ready_pool(&running, 2).await;

    let claimed = members[0].metadata.name.clone().unwrap();
    running
        .edit(&claimed, |s| {
            s.metadata.owner_references = None;
            s.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(labels::SANDBOX_CLAIMED.into(), "true".into());
        })
        .await;

    let replaced = ready_pool(&running, 2).await;
    assert!(replaced.iter().all(|m| m.metadata.name.as_deref() != Some(&claimed)));
    let kept = running.get(&claimed).await.expect("the claimed sandbox is kept");
    assert!(is_running_ready(&kept));
    assert_eq!(running.runtime.state_of(&runtime_id(&kept).unwrap()), SandboxState::Running);
    pool_status(&running, 2, 2).await;
    assert_eq!(running.runtime.live(), 3);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_deletes_in_the_mission_order() {
    let running = start(FakeRuntime::default());
    let set = SandboxSet::new(
        "pool",
        SandboxSetSpec { replicas: 3, template: Some(template()), ..Default::default() },
    );
    running.store.create(NS, &set).await.unwrap();
    let members = ready_pool(&running, 3).await;

    // One member was reused twice: it goes first, whatever its age.
    let reused = members[0].metadata.name.clone().unwrap();
    // The controllers write these objects too: retry on a conflict, as any client must.
    loop {
        let mut update = running.get(&reused).await.unwrap();
        update.status.as_mut().unwrap().set_reuse_count(2);
        match running.store.update_status(NS, &update).await {
            Ok(_) => break,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("{e}"),
        }
    }
    let members: Vec<Sandbox> = {
        let all = running.sandboxes().await;
        pool_members(&all).into_iter().cloned().collect()
    };
    let revision = running
        .store
        .get::<SandboxSet>(NS, "pool")
        .await
        .unwrap()
        .status
        .unwrap()
        .update_revision
        .unwrap();
    let survivor = members
        .iter()
        .max_by_key(|m| scale_down_rank(m, &revision))
        .unwrap()
        .metadata
        .name
        .clone()
        .unwrap();
    assert_ne!(survivor, reused);

    loop {
        let mut set: SandboxSet = running.store.get(NS, "pool").await.unwrap();
        set.spec.replicas = 1;
        match running.store.update(NS, &set).await {
            Ok(_) => break,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("{e}"),
        }
    }

    let left = ready_pool(&running, 1).await;
    assert_eq!(left[0].metadata.name.as_deref(), Some(survivor.as_str()));
    // The finalizer path deleted the scaled-down instances too.
    running
        .eventually("scaled-down sandboxes and instances gone", |r| {
            Box::pin(async move {
                (r.sandboxes().await.len() == 1 && r.runtime.live() == 1).then_some(())
            })
        })
        .await;
    let reused_id =
        runtime_id(members.iter().find(|m| m.metadata.name.as_deref() == Some(&reused)).unwrap())
            .unwrap();
    assert!(running.runtime.calls_of(&reused_id).contains(&Operation::Delete));
    pool_status(&running, 1, 1).await;
    running.stop().await;
}

/// Pauses and resumes one sandbox through `spec.paused` with `strategy`; returns its id.
async fn pause_and_resume(
    running: &Running,
    name: &str,
    strategy: Option<PauseStrategyType>,
    paused_state: SandboxState,
    reason: &str,
    resume_verb: Operation,
) {
    running.store.create(NS, &sandbox(name, strategy)).await.unwrap();
    let ready = running.sandbox_where(name, "running and ready", is_running_ready).await;
    let id = runtime_id(&ready).unwrap();

    running.edit(name, |s| s.spec.paused = Some(true)).await;
    let paused = running
        .sandbox_where(name, "paused", |s| {
            s.phase() == Some(&SandboxPhase::Paused)
                && s.condition(PAUSED).is_some_and(|c| c.status == "True")
        })
        .await;
    assert_eq!(condition(&paused, PAUSED).map(|c| c.1), Some(reason.to_owned()), "{strategy:?}");
    assert_eq!(condition(&paused, READY).map(|c| c.0), Some("False".into()));
    assert_eq!(running.runtime.state_of(&id), paused_state);

    running.edit(name, |s| s.spec.paused = Some(false)).await;
    let resumed = running.sandbox_where(name, "resumed", is_running_ready).await;
    assert_eq!(
        condition(&resumed, RESUMED).map(|c| (c.0, c.1)),
        Some(("True".into(), "ResumePod".into()))
    );
    assert!(resumed.condition(PAUSED).is_none());
    assert_eq!(running.runtime.state_of(&id), SandboxState::Running);
    let calls = running.runtime.calls_of(&id);
    let pause_verb = match strategy {
        None => Operation::Pause,
        Some(PauseStrategyType::Hibernate) => Operation::Hibernate,
        Some(PauseStrategyType::Stop) => Operation::Stop,
    };
    let after_pause =
        calls.iter().position(|op| *op == pause_verb).expect("the pause verb was called");
    assert!(calls[after_pause..].contains(&resume_verb), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_use_the_verb_of_each_strategy() {
    let running = start(FakeRuntime::default());
    pause_and_resume(
        &running,
        "frozen",
        None,
        SandboxState::Paused,
        "FreezePauseSucceed",
        Operation::Resume,
    )
    .await;
    pause_and_resume(
        &running,
        "hibernated",
        Some(PauseStrategyType::Hibernate),
        SandboxState::Hibernated,
        "SnapshotPauseSucceed",
        Operation::Restore,
    )
    .await;
    pause_and_resume(
        &running,
        "stopped",
        Some(PauseStrategyType::Stop),
        SandboxState::Stopped,
        "StopPauseSucceed",
        Operation::Ensure,
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_hibernation_is_reported_then_retried() {
    let runtime = FakeRuntime::default();
    runtime.with(|s| s.hibernate_unsupported = true);
    let running = start(runtime);
    running.store.create(NS, &sandbox("sleepy", Some(PauseStrategyType::Hibernate))).await.unwrap();
    running.sandbox_where("sleepy", "running", is_running_ready).await;
    running.edit("sleepy", |s| s.spec.paused = Some(true)).await;

    let failed = running
        .sandbox_where("sleepy", "the hibernation error", |s| {
            s.condition(PAUSED).is_some_and(|c| c.reason == "CheckpointFailed")
        })
        .await;
    let (status, _, message) = condition(&failed, PAUSED).unwrap();
    assert_eq!(status, "False");
    assert_eq!(message, "hibernate is not supported: CRIU is not integrated yet");
    assert_eq!(failed.phase(), Some(&SandboxPhase::Paused));

    // Once the runtime can, the retry succeeds.
    running.runtime.with(|s| s.hibernate_unsupported = false);
    running
        .sandbox_where("sleepy", "hibernated", |s| {
            s.condition(PAUSED)
                .is_some_and(|c| c.status == "True" && c.reason == "SnapshotPauseSucceed")
        })
        .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_time_deletes_the_sandbox_and_its_instance() {
    let running = start(FakeRuntime::default());
    let mut doomed = sandbox("doomed", None);
    let soon = Timestamp::now().checked_add(SignedDuration::from_millis(1500)).unwrap();
    doomed.spec.shutdown_time = Some(Time(soon));
    running.store.create(NS, &doomed).await.unwrap();
    let ready = running.sandbox_where("doomed", "running", is_running_ready).await;
    let id = runtime_id(&ready).unwrap();

    running
        .eventually("the sandbox to be deleted", |r| {
            Box::pin(async move { r.get("doomed").await.is_none().then_some(()) })
        })
        .await;
    assert_eq!(running.runtime.state_of(&id), SandboxState::Gone);
    // The stored time has whole seconds; it is not deleted before that.
    assert!(Timestamp::now().as_second() >= soon.as_second());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_time_pauses_the_sandbox() {
    let running = start(FakeRuntime::default());
    let mut sleepy = sandbox("nap", None);
    sleepy.spec.pause_time =
        Some(Time(Timestamp::now().checked_add(SignedDuration::from_secs(1)).unwrap()));
    running.store.create(NS, &sleepy).await.unwrap();
    let paused = running
        .sandbox_where("nap", "paused by its pauseTime", |s| {
            s.is_paused() && s.condition(PAUSED).is_some_and(|c| c.status == "True")
        })
        .await;
    assert_eq!(running.runtime.state_of(&runtime_id(&paused).unwrap()), SandboxState::Paused);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_instance_fails_its_sandbox() {
    let running = start(FakeRuntime::default());
    running.store.create(NS, &sandbox("lost", None)).await.unwrap();
    let ready = running.sandbox_where("lost", "running", is_running_ready).await;
    running.runtime.vanish(&runtime_id(&ready).unwrap());
    let failed =
        running.sandbox_where("lost", "failed", |s| s.phase() == Some(&SandboxPhase::Failed)).await;
    let message = failed.status.unwrap().message.unwrap();
    assert!(message.starts_with("Pod Not Found"), "{message}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_sandbox_deletes_its_instance_first() {
    let running = start(FakeRuntime::default());
    running.store.create(NS, &sandbox("bye", None)).await.unwrap();
    let ready = running.sandbox_where("bye", "running", is_running_ready).await;
    let id = runtime_id(&ready).unwrap();
    let preconditions = Preconditions::default();
    running.store.delete::<Sandbox>(NS, "bye", &preconditions).await.unwrap();
    running
        .eventually("the sandbox to be gone", |r| {
            Box::pin(async move { r.get("bye").await.is_none().then_some(()) })
        })
        .await;
    assert_eq!(running.runtime.state_of(&id), SandboxState::Gone);
    assert_eq!(running.runtime.calls_of(&id).last(), Some(&Operation::Delete));
    running.stop().await;
}
