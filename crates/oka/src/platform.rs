//! The platform's assembly: one builder that starts the controllers, the manager and the
//! gateway over any [`Store`], with sandboxes reached through a [`SandboxPorts`].
//!
//! `oka serve` is one assembly of it (the embedded store, the local runtime, every part in one
//! process); each cluster component (`oka controller`, `oka manager`, `oka gateway`, `oka node`)
//! is another, over the Kubernetes API server. A part is started by one method, in the order
//! its dependencies ask (the gateway before the manager, which hands it connections; the
//! manager before the SandboxClaim controller, which claims through the manager's engine), and
//! [`Platform::run_until`] stops everything that was started, in the reverse order of the
//! data flow: controllers finish their reconciles, servers their requests.
//!
//! What the builder owns, so no assembly repeats it: the metrics registry every part registers
//! into, the health checks, the stop signal, and the tasks to drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use oka_controller::{Clock, Config as ControllerConfig};
use oka_metrics::health::Health;
use oka_runtime_api::Runtime;
use oka_store::Store;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

use crate::config::Config;

/// How long in-flight work may take to finish after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A future that resolves when the platform stops.
pub type Stopped = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How the manager and the gateway reach ports inside sandboxes.
#[derive(Clone)]
pub enum SandboxPorts {
    /// Through the runtime that runs them in this process (`oka serve`, `oka node`).
    Runtime(Arc<dyn Runtime>),
    /// On a cluster, chosen per sandbox ([`crate::cluster::Reach`]): at its Pod IP (the Pod
    /// runtime), or through the relay of the node agent it runs on.
    Relay(Arc<crate::cluster::RelayPorts>),
}

impl SandboxPorts {
    /// Connects to `port` inside `sandbox`.
    pub async fn connect(
        &self,
        sandbox: &oka_api::Sandbox,
        port: u16,
    ) -> Result<tokio::net::TcpStream, oka_gateway::dial::DialError> {
        use oka_gateway::dial::Dialer as _;
        match self {
            SandboxPorts::Runtime(runtime) => {
                oka_gateway::dial::RuntimeDialer::new(Arc::clone(runtime)).dial(sandbox, port).await
            }
            SandboxPorts::Relay(relay) => relay.connect(sandbox, port).await,
        }
    }
}

/// Where the sandbox controllers of this process run sandboxes: a runtime, and which
/// sandboxes are this node's.
pub struct NodeScope {
    /// The runtime that runs them.
    pub runtime: Arc<dyn Runtime>,
    /// The node's name (`status.nodeName`).
    pub name: String,
    /// The sandboxes this node runs: everything on one machine, its own on a cluster.
    pub selector: oka_store::Selector,
    /// Where activity probes read the sandboxes' last traffic: the node's relay on a cluster;
    /// `None` reads this process's gateway.
    pub activity: Option<Arc<dyn oka_controller::probe::ActivitySource>>,
    /// Where templates' OCI images are pulled from; `None`: a template naming an image
    /// reference fails with `ErrImagePull` saying this node has no image store.
    pub images: Option<oka_controller::sandbox::image::Images>,
}

/// The manager's parts another part needs: the E2B API's state (engine, index, initializer).
pub struct Manager<S: Store> {
    /// The E2B API's state.
    pub state: oka_manager::api::AppState<S>,
    /// The E2B API keys, as bearer tokens of the Kubernetes API.
    pub team_keys: Arc<dyn oka_kubeapi::auth::Authenticator>,
}

/// The platform being assembled, then run: see the module documentation.
pub struct Platform<S: Store> {
    store: S,
    /// The one list+watch per kind and scope of this process, shared by every controller, the
    /// manager's index and the gateway's route table.
    informers: oka_cache::Informers<S>,
    config: Config,
    registry: oka_metrics::Registry,
    /// The registry once served: every part registers before the first listener serves.
    served_registry: Option<Arc<oka_metrics::Registry>>,
    shared_metrics: oka_metrics::Shared,
    health: Health,
    controller_metrics: Arc<oka_controller::metrics::ControllerMetrics>,
    stop: watch::Sender<bool>,
    controllers: JoinSet<()>,
    controller_names: Vec<&'static str>,
    servers: Vec<(&'static str, JoinHandle<std::io::Result<()>>)>,
    background: Vec<JoinHandle<()>>,
    ports: Option<SandboxPorts>,
    /// Asked before each snapshot and fork (the machine's CRIU); `None`: always possible.
    snapshot_gate: Option<oka_manager::api::templates::SnapshotGate>,
    /// Asked when a create names no pool (templates being built); `None`: never.
    pending_templates: Option<oka_manager::api::templates::PendingTemplates>,
    /// Where the manager has egress policies enforced; `None`: network rules are refused.
    egress: Option<Arc<dyn oka_manager::egress::EgressApplier>>,
    /// The egress policy each sandbox was last given, shared by the TrafficPolicy controller
    /// and the manager's direct application.
    applied_egress: Arc<oka_controller::trafficpolicy::AppliedEgress>,
    gateway: Option<oka_gateway::Gateway<S>>,
    index: Option<Arc<oka_manager::index::Index>>,
    running: oka_controller::metrics::RunningControllers,
    unknown_route_wait: Duration,
    /// How the manager serves E2B template builds; `None`: their routes answer 501.
    template_builds: Option<oka_manager::TemplateBuildConfig>,
}

impl<S: Store> Platform<S> {
    /// A platform over `store`, configured by `config`, with nothing started yet.
    pub fn new(store: S, config: Config) -> Self {
        let mut registry = oka_metrics::Registry::default();
        let shared_metrics = oka_metrics::Shared::default();
        shared_metrics.register(&mut registry);
        let controller_metrics = Arc::new(oka_controller::metrics::ControllerMetrics::new(
            shared_metrics.clone(),
            config.metrics.sandbox_labels.clone(),
        ));
        controller_metrics.register(&mut registry);
        let (stop, _) = watch::channel(false);
        Self {
            informers: oka_cache::Informers::new(store.clone()),
            store,
            config,
            registry,
            served_registry: None,
            shared_metrics,
            health: Health::default(),
            controller_metrics,
            stop,
            controllers: JoinSet::new(),
            controller_names: Vec::new(),
            servers: Vec::new(),
            background: Vec::new(),
            ports: None,
            snapshot_gate: None,
            pending_templates: None,
            egress: None,
            applied_egress: Arc::default(),
            gateway: None,
            index: None,
            running: oka_controller::metrics::RunningControllers::default(),
            unknown_route_wait: Duration::ZERO,
            template_builds: None,
        }
    }

    /// The informers every part of this platform shares (started by their first user,
    /// stopped with the platform).
    pub fn informers(&self) -> &oka_cache::Informers<S> {
        &self.informers
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The registry every part registers its series into; `/metrics` serves it. Parts
    /// register before the first [`Platform::serve_http`], which takes the registry as it is.
    pub fn registry(&mut self) -> &mut oka_metrics::Registry {
        &mut self.registry
    }

    /// The health checks `/healthz` and `/readyz` answer with.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The names of the controllers started so far.
    pub fn controller_names(&self) -> &[&'static str] {
        &self.controller_names
    }

    /// A future that resolves when the platform stops.
    pub fn stopped(&self) -> Stopped {
        let mut rx = self.stop.subscribe();
        Box::pin(async move {
            // An error means the sender is gone, which also means stop.
            let _ = rx.wait_for(|stop| *stop).await;
        })
    }

    /// Lets the gateway's requests for an unknown sandbox ID wait up to `wait` for its route:
    /// for a gateway whose managers run in other processes and do not wait for its routes.
    pub fn with_unknown_route_wait(mut self, wait: Duration) -> Self {
        self.unknown_route_wait = wait;
        self
    }

    /// Sets how the manager and the gateway reach sandboxes' ports.
    pub fn with_ports(mut self, ports: SandboxPorts) -> Self {
        self.ports = Some(ports);
        self
    }

    /// Makes the manager ask `gate` before each snapshot and fork, and answer 501 with its
    /// reason when it refuses (a machine without CRIU).
    pub fn with_snapshot_gate(mut self, gate: oka_manager::api::templates::SnapshotGate) -> Self {
        self.snapshot_gate = Some(gate);
        self
    }

    /// Tells the manager which templates are still being built (`oka serve`'s default
    /// templates on their first start), so a create of one is answered with how far it is.
    pub fn with_pending_templates(
        mut self,
        pending: oka_manager::api::templates::PendingTemplates,
    ) -> Self {
        self.pending_templates = Some(pending);
        self
    }

    /// Makes the manager serve E2B template builds through `builds`.
    pub fn with_template_builds(mut self, builds: oka_manager::TemplateBuildConfig) -> Self {
        self.template_builds = Some(builds);
        self
    }

    /// The egress policy each sandbox of this process was last given.
    pub fn applied_egress(&self) -> Arc<oka_controller::trafficpolicy::AppliedEgress> {
        Arc::clone(&self.applied_egress)
    }

    /// Makes the manager enforce E2B's network options through `egress`.
    pub fn with_egress(mut self, egress: Arc<dyn oka_manager::egress::EgressApplier>) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Starts the gateway's route table (it follows the store) and returns it; traffic is
    /// served by [`Platform::serve_gateway`]. Needs [`Platform::with_ports`].
    pub fn start_gateway(&mut self) -> anyhow::Result<oka_gateway::Gateway<S>> {
        let ports = self.ports.clone().context("the gateway needs a way to sandboxes' ports")?;
        let config = &self.config.gateway;
        let mut gateway_config =
            oka_gateway::GatewayConfig::new(config.domain.clone().unwrap_or_default());
        gateway_config.idle_timeout = config.idle_timeout;
        gateway_config.wake_timeout = config.wake_timeout;
        gateway_config.unknown_wait = self.unknown_route_wait;
        gateway_config.auth = config.auth.mode.into();
        let gateway = oka_gateway::Gateway::start(
            self.informers.clone(),
            gateway_config,
            Arc::new(PortsDialer(ports)),
        );
        if let Some(options) = (config.auth.mode == crate::config::GatewayAuthMode::Jwt)
            .then(|| config.auth.jwt.oidc_options())
            .flatten()
        {
            gateway.start_jwt_verifier(options);
            // Not ready until the identity provider's keys are loaded (retried 1 s to 30 s).
            self.health.add_check("gateway-jwt-verifier", {
                let gateway = gateway.clone();
                move || gateway.jwt_ready()
            });
        }
        gateway.register_metrics(&mut self.registry);
        gateway.serve_health(self.health.clone());
        self.health.add_check("gateway-routes", {
            let gateway = gateway.clone();
            move || gateway.is_ready()
        });
        self.gateway = Some(gateway.clone());
        Ok(gateway)
    }

    /// The agent-runtime client of the manager's claims and resumes and the sandbox
    /// controller's re-inits: envd's `/init` over [`Platform::with_ports`]; connections it is
    /// done with go to this process's gateway when there is one.
    fn initializer(&self) -> Option<Arc<dyn oka_manager::SandboxInitializer>> {
        let ports = self.ports.clone()?;
        let connector = PortsConnector { ports, gateway: self.gateway.clone() };
        Some(Arc::new(oka_manager::init::EnvdInitializer::new(
            connector,
            oka_manager::init::EnvdInitConfig::default(),
        )))
    }

    /// The controllers' settings with `workers` workers (at least one).
    fn workers(&self, n: usize) -> ControllerConfig {
        ControllerConfig::default().workers(n.max(1)).metrics(Arc::clone(&self.controller_metrics))
    }

    /// The store the controllers write through: their writes mark their reconcile spans (a
    /// reconcile that wrote nothing is not exported).
    fn controller_store(&self) -> oka_controller::trace::MarkWrites<S> {
        oka_controller::trace::MarkWrites(self.store.clone())
    }

    /// The shared informers, with the store the controllers write through.
    fn controller_informers(&self) -> oka_cache::Informers<oka_controller::trace::MarkWrites<S>> {
        self.informers.with_store(self.controller_store())
    }

    /// Starts the controllers that need no runtime and no manager: SandboxSets,
    /// SandboxUpdateOps, PoolAutoscalers, and the expiry of Events.
    pub fn start_pool_controllers(&mut self) {
        use oka_controller::sandboxset::{
            SANDBOX_EVENT_DEBOUNCE, SANDBOX_EVENT_DEBOUNCE_SCALE, run_sandbox_set_controller,
        };
        let store = self.controller_informers();
        let controllers = &self.config.controllers;
        let sets = self
            .workers(controllers.sandbox_set_workers)
            .debounce(SANDBOX_EVENT_DEBOUNCE)
            .debounce_scale(SANDBOX_EVENT_DEBOUNCE_SCALE);
        self.controllers.spawn(run_sandbox_set_controller(
            store.clone(),
            sets,
            Clock::system(),
            self.stopped(),
        ));
        self.controllers.spawn(oka_controller::sandboxupdateops::run_update_ops_controller(
            store.clone(),
            self.workers(1),
            Clock::system(),
            self.stopped(),
        ));
        self.controllers.spawn(oka_controller::poolautoscaler::run_pool_autoscaler_controller(
            store,
            self.workers(controllers.pool_autoscaler_workers),
            Clock::system(),
            controllers.pool_autoscaler.settings(),
            self.stopped(),
        ));
        self.controllers.spawn(oka_controller::trafficpolicy::run_status_controller(
            self.controller_informers(),
            self.workers(1),
            Clock::system(),
            self.stopped(),
        ));
        self.controllers.spawn(oka_controller::trafficpolicy::run_global_status_controller(
            self.controller_informers(),
            self.workers(1),
            Clock::system(),
            self.stopped(),
        ));
        self.controller_names.extend([
            "sandboxset",
            "sandboxupdateops",
            "poolautoscaler",
            "trafficpolicy",
            "globaltrafficpolicy",
        ]);
        // Events expire an hour after they were last seen, as the API server's --event-ttl.
        self.background.push(tokio::spawn(oka_controller::events::sweep_expired_events(
            self.store.clone(),
            oka_controller::events::EVENT_TTL,
            Duration::from_secs(60),
        )));
        self.running.sets = true;
    }

    /// Starts the placement controller: which node agent runs each new sandbox, and the
    /// sandboxes of lost nodes (a cluster of node agents).
    pub fn start_placement(&mut self, options: oka_controller::placement::PlacementOptions) {
        self.controllers.spawn(oka_controller::placement::run_placement_controller(
            self.controller_informers(),
            self.workers(2),
            options,
            self.stopped(),
        ));
        self.controller_names.push("placement");
    }

    /// Starts the Pod runtime: the sandboxes the runtime rule gives to Pods
    /// (`cluster.defaultRuntime`, the annotation `agents.kruise.io/runtime`, the runtime class
    /// `oka-node`) run as ordinary Pods with envd added (`cluster.pods`); a resumed one gets its
    /// recorded `/init` again through [`Platform::with_ports`].
    pub fn start_pod_runtime(&mut self) {
        use oka_controller::sandbox::{RuntimeInitializer, Shared};
        let cluster = &self.config.cluster;
        let options = oka_controller::podruntime::PodRuntimeOptions {
            pods: oka_controller::podruntime::PodOptions {
                envd_image: cluster.pods.envd_image.clone(),
            },
            default_runtime: cluster.default_runtime,
            initializer: self.initializer().map(|i| {
                let replay: Arc<dyn RuntimeInitializer> = Arc::new(ReplayInit(i));
                Shared(replay)
            }),
        };
        self.controllers.spawn(oka_controller::podruntime::run_pod_runtime_controller(
            self.controller_informers(),
            self.workers(self.config.controllers.sandbox_workers),
            Clock::system(),
            options,
            self.stopped(),
        ));
        self.controller_names.push("pod-runtime");
    }

    /// Adds a background task, aborted when the platform stops.
    pub fn add_background(&mut self, task: JoinHandle<()>) {
        self.background.push(task);
    }

    /// Starts the controllers that run sandboxes on `node`: Sandboxes, Checkpoints and the
    /// probe runner (activity probes read this process's gateway when there is one).
    pub fn start_node_controllers(&mut self, node: NodeScope) {
        use oka_controller::sandbox::{HookRunner, RuntimeInitializer, Shared};
        let store = self.controller_informers();
        let hooks = Arc::new(EnvdHooks(PortsConnector::<S> {
            ports: SandboxPorts::Runtime(Arc::clone(&node.runtime)),
            gateway: None,
        }));
        let initializer = self.initializer().map(|i| {
            let replay: Arc<dyn RuntimeInitializer> = Arc::new(ReplayInit(i));
            Shared(replay)
        });
        let options = oka_controller::sandbox::SandboxOptions {
            node_name: node.name.clone(),
            initializer,
            // Upgrade hooks run through each sandbox's envd process API.
            hooks: Some(Shared(Arc::clone(&hooks) as Arc<dyn HookRunner>)),
            auto_pause_max_actions_per_hour: self
                .config
                .controllers
                .auto_pause_max_actions_per_hour,
            images: node.images.clone(),
            ..oka_controller::sandbox::SandboxOptions::default()
        };
        let mut sandboxes = self.workers(self.config.controllers.sandbox_workers);
        sandboxes.runner.watch.selector = node.selector.clone();
        self.controllers.spawn(oka_controller::sandbox::run_sandbox_controller(
            store.clone(),
            Arc::clone(&node.runtime),
            sandboxes,
            Clock::system(),
            options,
            self.stopped(),
        ));
        let mut checkpoints = self.workers(2);
        checkpoints.runner.watch.selector = node.selector.clone();
        self.controllers.spawn(oka_controller::checkpoint::run_checkpoint_controller(
            store.clone(),
            Arc::clone(&node.runtime),
            checkpoints,
            Clock::system(),
            self.stopped(),
        ));
        // One task for every sandbox's probes; activity probes read the gateway's traffic.
        let activity = node.activity.clone().or_else(|| {
            self.gateway.as_ref().map(|g| {
                Arc::new(GatewayActivity(g.activity()))
                    as Arc<dyn oka_controller::probe::ActivitySource>
            })
        });
        self.controllers.spawn(oka_controller::probe::run_probe_runner(
            store,
            Arc::clone(&node.runtime),
            Some(hooks as Arc<dyn HookRunner>),
            activity,
            Clock::system(),
            oka_controller::probe::ProbeRunnerOptions {
                metrics: Some(Shared(Arc::clone(&self.controller_metrics))),
                selector: node.selector.clone(),
                ..oka_controller::probe::ProbeRunnerOptions::default()
            },
            self.stopped(),
        ));
        let mut egress = self.workers(2);
        egress.runner.watch.selector = node.selector.clone();
        self.controllers.spawn(oka_controller::trafficpolicy::run_egress_controller(
            self.controller_informers(),
            Arc::clone(&node.runtime),
            Arc::clone(&self.applied_egress),
            egress,
            self.stopped(),
        ));
        self.controller_names.extend(["sandbox", "checkpoint", "probes", "traffic-egress"]);
        self.running.sandboxes = true;
    }

    /// Starts the manager: its claim index (following the store), its claim engine, API keys
    /// and quotas. The E2B API is served by [`Platform::serve_api`].
    pub fn start_manager(
        &mut self,
        admin_key: oka_manager::api::ApiKey,
    ) -> anyhow::Result<Manager<S>> {
        let index = oka_manager::index::Index::spawn(self.informers.clone());
        self.index = Some(Arc::clone(&index));
        let mut manager_config = oka_manager::api::ManagerConfig::new(admin_key);
        manager_config.domain.clone_from(&self.config.gateway.domain);
        manager_config.min_timeout_secs =
            i64::try_from(self.config.api.min_timeout.as_secs()).unwrap_or(i64::MAX);
        manager_config.traffic_token_validity = self.config.api.traffic_access_token_validity;
        // Snapshots are taken by the checkpoint controller wherever sandboxes run.
        manager_config.snapshots.enabled = self.ports.is_some();
        manager_config.snapshots.gate.clone_from(&self.snapshot_gate);
        manager_config.pending_templates.clone_from(&self.pending_templates);
        // On a cluster some sandboxes run as Pods, which cannot be snapshotted.
        if matches!(self.ports, Some(SandboxPorts::Relay(_))) {
            manager_config.cluster_default_runtime = Some(self.config.cluster.default_runtime);
        }
        let team_keys: Arc<dyn oka_kubeapi::auth::Authenticator> =
            Arc::new(TeamKeys(oka_manager::api::keys::KeyStore::new(
                self.store.clone(),
                manager_config.system_namespace.clone(),
                manager_config.admin_key.clone(),
            )));
        let manager_metrics =
            Arc::new(oka_manager::metrics::ManagerMetrics::new(self.shared_metrics.clone()));
        manager_metrics.register(&mut self.registry);
        let quota_metrics =
            Arc::new(oka_manager::quota::QuotaMetrics::register(&mut self.registry));
        let mut state =
            oka_manager::api::AppState::new(self.store.clone(), Arc::clone(&index), manager_config)
                .with_metrics(manager_metrics);
        if let Some(initializer) = self.initializer() {
            // Each pool sandbox's envd connection is opened while the pool fills, not by its
            // claim.
            self.background.push(tokio::spawn(oka_manager::init::keep_pools_prepared(
                Arc::downgrade(&index),
                Arc::clone(&initializer),
            )));
            state = state.with_initializer(initializer);
        }
        if let Some(gateway) = &self.gateway {
            state = state.with_routes(Arc::new(GatewayRoutes(gateway.clone())));
        }
        if let Some(egress) = &self.egress {
            state = state.with_egress(Arc::clone(egress));
        }
        if let Some(builds) = self.template_builds.clone() {
            let dir = builds.dir.clone();
            state = state.with_template_builds(builds).with_context(|| {
                format!("cannot open the template builds' directory {}", dir.display())
            })?;
        }
        let quota = start_quota(&self.config.quota, &state, quota_metrics)?;
        self.background.push(quota);
        Ok(Manager { state, team_keys })
    }

    /// Starts the SandboxClaim controller, which claims through `manager`'s engine and
    /// initializer: one claim path for the E2B API and for SandboxClaims.
    pub fn start_claim_controller(&mut self, manager: &Manager<S>) {
        let claimer = crate::claimer::EngineClaimer {
            engine: Arc::clone(&manager.state.engine),
            initializer: Arc::clone(&manager.state.initializer),
            create: manager.state.config.create.clone(),
        };
        self.controllers.spawn(oka_controller::sandboxclaim::run_sandbox_claim_controller(
            self.controller_informers(),
            self.workers(self.config.controllers.sandbox_claim_workers),
            Clock::system(),
            Arc::new(claimer),
            self.stopped(),
        ));
        self.controller_names.push("sandboxclaim");
        self.running.claims = true;
    }

    /// Serves `router` with `/metrics` and the health routes on `listen`, until the platform
    /// stops; returns the address bound.
    pub async fn serve_http(
        &mut self,
        name: &'static str,
        listen: SocketAddr,
        router: axum::Router,
    ) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} for the {name}"))?;
        let addr = listener.local_addr().with_context(|| format!("the {name} has no address"))?;
        let registry = match &self.served_registry {
            Some(registry) => Arc::clone(registry),
            None => {
                // Every part is started by now: readiness waits for the controllers' caches.
                let running = self.running;
                if running != oka_controller::metrics::RunningControllers::default() {
                    let metrics = Arc::clone(&self.controller_metrics);
                    self.health
                        .add_check("controller-caches", move || metrics.caches_synced(running));
                }
                let registry = Arc::new(std::mem::take(&mut self.registry));
                self.served_registry = Some(Arc::clone(&registry));
                registry
            }
        };
        let observe = crate::observe::routes(registry, self.health.clone());
        let stop = self.stopped();
        let task = tokio::spawn(async move {
            axum::serve(listener, router.merge(observe)).with_graceful_shutdown(stop).await
        });
        self.servers.push((name, task));
        Ok(addr)
    }

    /// Serves the E2B API of `manager` (and `/metrics`, health) on `api.listen`.
    pub async fn serve_api(&mut self, manager: Manager<S>) -> anyhow::Result<SocketAddr> {
        let listen = self.config.api.listen;
        self.serve_http("API", listen, oka_manager::api::app(manager.state)).await
    }

    /// Serves the gateway's traffic on `gateway.listen` until the platform stops; returns the
    /// address bound.
    pub async fn serve_gateway(&mut self) -> anyhow::Result<SocketAddr> {
        let gateway = self.gateway.clone().context("the gateway was not started")?;
        let listen = self.config.gateway.listen;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} for the gateway"))?;
        let addr = listener.local_addr().context("the gateway listener has no address")?;
        let stop = self.stopped();
        self.servers.push(("gateway", tokio::spawn(oka_gateway::serve(listener, gateway, stop))));
        Ok(addr)
    }

    /// Adds a server task the platform waits for on shutdown (it stops on
    /// [`Platform::stopped`]).
    pub fn add_server(&mut self, name: &'static str, task: JoinHandle<std::io::Result<()>>) {
        self.servers.push((name, task));
    }

    /// Runs until `shutdown` resolves, then stops: the controllers take no new work and
    /// finish what is in flight, the servers finish their requests (each bounded by
    /// [`SHUTDOWN_GRACE`]), background tasks end. Returns what `shutdown` returned.
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = anyhow::Result<()>>,
    ) -> anyhow::Result<()> {
        let result = shutdown.await;
        info!("shutting down: finishing in-flight work");
        let _ = self.stop.send(true);
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while self.controllers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(grace = ?SHUTDOWN_GRACE, "controllers did not finish in time; aborting them");
            self.controllers.shutdown().await;
        }
        // The data plane stops first: the gateway, then the management APIs.
        self.servers.sort_by_key(|(name, _)| *name != "gateway");
        for (name, task) in self.servers {
            match tokio::time::timeout(SHUTDOWN_GRACE, task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => warn!(error = %e, "the {name} failed"),
                Ok(Err(e)) => warn!(error = %e, "the {name} task failed"),
                Err(_) => warn!("the {name} did not stop in time"),
            }
        }
        for task in self.background {
            task.abort();
        }
        if let Some(index) = self.index {
            index.shutdown();
        }
        self.informers.shutdown();
        result
    }
}

/// API-key quotas: the Redis backend when `quota.redisAddr` is set (credentials from
/// `QUOTA_REDIS_USERNAME` and `QUOTA_REDIS_PASSWORD`), else the embedded ledger, rebuilt from
/// the store's sandboxes before the first admission; kept true by the anti-drift driver.
fn start_quota<S: Store>(
    config: &crate::config::QuotaConfig,
    api_state: &oka_manager::api::AppState<S>,
    metrics: Arc<oka_manager::quota::QuotaMetrics>,
) -> anyhow::Result<JoinHandle<()>> {
    use oka_manager::quota::{AntiDriftConfig, BreakerSettings, Quota};
    let quota = match &config.redis_addr {
        Some(addr) => {
            let mut redis = oka_manager::quota::redis::RedisConfig::new(addr.clone());
            redis.db = config.redis_db;
            redis.username = std::env::var("QUOTA_REDIS_USERNAME").ok().filter(|v| !v.is_empty());
            redis.password = std::env::var("QUOTA_REDIS_PASSWORD").ok().filter(|v| !v.is_empty());
            redis.operation_timeout = config.redis_operation_timeout;
            let breaker = BreakerSettings {
                max_failures: config.redis_breaker_max_failures,
                open_for: config.redis_breaker_open_duration,
            };
            info!(%addr, db = config.redis_db, "API-key quotas in redis (fail open while it is away)");
            Quota::redis(redis, &breaker, metrics).context("bad quota.redisAddr")?
        }
        None => Quota::local(metrics),
    };
    let drift = AntiDriftConfig {
        interval: config.anti_drift_interval,
        grace: config.anti_drift_grace,
        ..AntiDriftConfig::default()
    };
    let (_, task) = api_state.start_quota(Arc::new(quota), drift);
    Ok(task)
}

/// The E2B API keys as bearer tokens of the Kubernetes API: a team's key is confined to the
/// team's namespace, as it is on the E2B API; the admin team's keys see everything.
struct TeamKeys<S: Store>(oka_manager::api::keys::KeyStore<S>);

impl<S: Store> oka_kubeapi::auth::Authenticator for TeamKeys<S> {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<oka_kubeapi::auth::Principal>> {
        Box::pin(async move {
            let user = self.0.authenticate_key(token).await.ok()?;
            Some(oka_kubeapi::auth::Principal { name: user.team, namespace: user.namespace })
        })
    }
}

/// The gateway's dialer over [`SandboxPorts`].
struct PortsDialer(SandboxPorts);

impl oka_gateway::dial::Dialer for PortsDialer {
    fn dial<'a>(
        &'a self,
        sandbox: &'a oka_api::Sandbox,
        port: u16,
    ) -> futures::future::BoxFuture<'a, Result<tokio::net::TcpStream, oka_gateway::dial::DialError>>
    {
        Box::pin(self.0.connect(sandbox, port))
    }
}

/// Reaches a sandbox's envd for the manager, and hands the connections it is done with to the
/// gateway of this process, if any.
struct PortsConnector<S: Store> {
    ports: SandboxPorts,
    gateway: Option<oka_gateway::Gateway<S>>,
}

impl<S: Store> oka_manager::init::EnvdConnector for PortsConnector<S> {
    fn connect<'a>(
        &'a self,
        sandbox: &'a oka_api::Sandbox,
        port: u16,
    ) -> futures::future::BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(async move {
            self.ports.connect(sandbox, port).await.map_err(|e| match e {
                oka_gateway::dial::DialError::Io(e) => e,
                oka_gateway::dial::DialError::PortClosed { .. } => {
                    std::io::Error::new(std::io::ErrorKind::ConnectionRefused, e.to_string())
                }
                other => std::io::Error::other(other),
            })
        })
    }

    /// A claim's `/init` connection carries the sandbox's first request through the gateway.
    fn release(&self, sandbox: &oka_api::Sandbox, port: u16, stream: tokio::net::TcpStream) {
        if let Some(gateway) = &self.gateway {
            gateway.adopt_upstream(sandbox, port, stream);
        }
    }
}

/// The gateway's traffic registry as the probe runner's activity source: a sandbox's requests
/// are recorded under its public route ID.
struct GatewayActivity(Arc<oka_gateway::activity::Activity>);

impl oka_controller::probe::ActivitySource for GatewayActivity {
    fn last_activity(&self, sandbox: &oka_api::Sandbox, ports: &[i32]) -> Option<i64> {
        let id = oka_gateway::table::route_id(sandbox)?;
        self.0.last(&id, ports)
    }
}

/// The sandbox controller's re-init: the manager's replay of the recorded `/init`.
struct ReplayInit(Arc<dyn oka_manager::SandboxInitializer>);

impl oka_controller::sandbox::RuntimeInitializer for ReplayInit {
    fn initialize<'a>(
        &'a self,
        sandbox: &'a oka_api::Sandbox,
    ) -> futures::future::BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            oka_manager::init::replay_recorded(self.0.as_ref(), sandbox)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// The sandbox controller's upgrade hooks and exec probes: the manager's envd process client
/// ([`oka_manager::exec::run_command`], as root).
struct EnvdHooks<S: Store>(PortsConnector<S>);

impl<S: Store> oka_controller::sandbox::HookRunner for EnvdHooks<S> {
    fn run_hook<'a>(
        &'a self,
        sandbox: &'a oka_api::Sandbox,
        command: &'a [String],
        timeout: Duration,
    ) -> futures::future::BoxFuture<'a, Result<oka_controller::sandbox::HookOutcome, String>> {
        Box::pin(async move {
            let options = oka_manager::exec::ExecOptions::root(timeout);
            let outcome = oka_manager::exec::run_command(&self.0, sandbox, command, &options)
                .await
                .map_err(|e| e.to_string())?;
            Ok(oka_controller::sandbox::HookOutcome {
                exit_code: outcome.exit_code,
                stdout: String::from_utf8_lossy(&outcome.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&outcome.stderr).into_owned(),
            })
        })
    }
}

/// The gateway's routes, which the manager's creates wait for.
struct GatewayRoutes<S: Store>(oka_gateway::Gateway<S>);

impl<S: Store> oka_manager::api::RouteWaiter for GatewayRoutes<S> {
    fn wait_routed<'a>(
        &'a self,
        sandbox_id: &'a str,
        timeout: Duration,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(self.0.wait_routed(sandbox_id, timeout))
    }

    fn wait_version<'a>(
        &'a self,
        sandbox_id: &'a str,
        resource_version: &'a str,
        timeout: Duration,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(self.0.wait_version(sandbox_id, resource_version, timeout))
    }
}
