//! The cluster components: the platform on a Kubernetes API server, one part per process.
//!
//! | command | what runs | replicas |
//! |---|---|---|
//! | `oka controller` | SandboxSets, SandboxClaims, SandboxUpdateOps, PoolAutoscalers, placement, the Pod runtime (leader only) | 2+, one leads (a `coordination.k8s.io` Lease) |
//! | `oka manager` | the E2B API, claims by compare-and-swap | any |
//! | `oka gateway` | traffic to ports inside sandboxes | any |
//! | `oka node` | the sandboxes of its machine (local runtime), their relay, their Sandbox, Checkpoint and probe controllers | one per machine |
//!
//! All of them read the same configuration file as `oka serve` (its `cluster` section says
//! where the API server is and what is specific to a cluster) and serve `/metrics`, `/healthz`
//! and `/readyz` on `api.listen`; the manager serves the E2B API there too.
//!
//! # How the parts reach sandboxes
//!
//! A sandbox runs either as an ordinary Pod (the Pod runtime, in the leading controller) or on
//! an oka node agent, by the rule of [`oka_api::runtime_choice`] (`cluster.defaultRuntime`
//! when nothing else says). A Pod-runtime sandbox is dialed at its Pod IP
//! (`status.podInfo.podIP`, else `status.sandboxIp`) directly. A node-runtime sandbox runs on
//! the node its label `agents.kruise.io/node-name` names (the placement controller writes it).
//! The node agent writes a SandboxNode about itself (its relay address, capacity, labels) and
//! renews its heartbeat; the manager and the gateway dial a sandbox's port through that node's
//! relay ([`RelayPorts`], `oka-relay`), authenticated by a token all the components share
//! (`cluster.relayTokenFile`; without it only Pod-runtime sandboxes are reachable). The choice
//! is per sandbox ([`Reach::of`]): the node label means the relay, its absence the Pod IP.
//!
//! # Expected flow of `oka controller`
//!
//! 1. Connect to the API server (the kubeconfig of `cluster.kubeconfig`, else `$KUBECONFIG`,
//!    `~/.kube/config` or the Pod's service account).
//! 2. Serve health and metrics; start the claim engine's index (warm while standing by);
//!    serve the admission webhooks on `cluster.webhook.listen` (every replica, leading or
//!    not; `oka-webhook`), ready once their certificate is served and its CA injected.
//! 3. Stand by until this replica holds the Lease `cluster.leaderElection.leaseName`, then
//!    start the controllers. If leadership is lost (the Lease could not be renewed in time),
//!    stop them and exit non-zero, so a supervisor restarts the process as a candidate: a
//!    replica that lost the Lease never acts again. On SIGTERM, finish the work in flight and
//!    release the Lease, so a standby takes over at once.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use oka_api::sandboxnode::{SandboxNode, SandboxNodeSpec, SandboxNodeStatus};
use oka_api::{Sandbox, labels};
use oka_cache::{Cache, ObjectKey, WatchConfig};
use oka_gateway::dial::DialError;
use oka_relay::{RelayClient, RelayError, RelayToken};
use oka_store::Store;
use oka_store::kubernetes::KubeStore;
use tracing::{info, warn};

use crate::config::Config;
use crate::platform::{NodeScope, Platform, SandboxPorts};

/// How long the cluster's gateway waits for the route of a sandbox ID it does not know.
const UNKNOWN_ROUTE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Which cluster component to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// `oka controller`.
    Controller,
    /// `oka manager`.
    Manager,
    /// `oka gateway`.
    Gateway,
    /// `oka node`.
    Node,
}

/// Runs `component` until SIGTERM or SIGINT.
pub async fn run(component: Component, config: Config) -> anyhow::Result<()> {
    let signals = crate::serve::shutdown_signal()?;
    run_until(component, config, signals).await
}

/// Runs `component` until `shutdown` resolves.
pub async fn run_until(
    component: Component,
    config: Config,
    shutdown: impl Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    let tracing = oka_telemetry::export::install(&config.tracing.settings()?)
        .context("cannot set up tracing")?;
    let store = kube_store(&config).await?;
    let result = match component {
        Component::Controller => controller(store, config, shutdown).await,
        Component::Manager => manager(store, config, shutdown).await,
        Component::Gateway => gateway(store, config, shutdown).await,
        Component::Node => node(store, config, shutdown).await,
    };
    if let Some(tracing) = tracing {
        tracing.shutdown();
    }
    result
}

/// The API server, as `cluster.kubeconfig` or the environment says.
async fn kube_store(config: &Config) -> anyhow::Result<KubeStore> {
    let client_config = match &config.cluster.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("bad kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no API server: set cluster.kubeconfig, $KUBECONFIG, or run in a Pod with a service account",
        )?,
    };
    info!(server = %client_config.cluster_url, "connecting to the API server");
    let client = kube::Client::try_from(client_config).context("cannot make a client")?;
    Ok(KubeStore::new(client))
}

/// The relay token every component shares.
fn relay_token(config: &Config) -> anyhow::Result<RelayToken> {
    let path = config
        .cluster
        .relay_token_file
        .as_ref()
        .context("cluster.relayTokenFile is required: the node relay's shared token")?;
    oka_relay::load_token(path).with_context(|| format!("bad relay token in {}", path.display()))
}

/// How long a dial of a Pod IP may take.
const POD_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How one sandbox is reached on a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach<'a> {
    /// Through the relay of this node agent (the label `agents.kruise.io/node-name`).
    Node(&'a str),
    /// At this Pod IP, directly (a Pod-runtime sandbox: no node label, a Pod IP in its status).
    Pod(std::net::IpAddr),
    /// Not reachable yet: neither placed nor with a Pod IP.
    Nowhere,
}

impl<'a> Reach<'a> {
    /// How `sandbox` is reached: its node label wins; else its Pod IP (`status.podInfo.podIP`,
    /// else `status.sandboxIp`).
    pub fn of(sandbox: &'a Sandbox) -> Self {
        if let Some(node) = sandbox.metadata.labels.as_ref().and_then(|l| l.get(labels::NODE_NAME))
        {
            return Reach::Node(node);
        }
        let status = sandbox.status.as_ref();
        let ip = status
            .and_then(|s| s.pod_info.as_ref())
            .and_then(|i| i.pod_ip.as_deref())
            .or_else(|| status.and_then(|s| s.sandbox_ip.as_deref()))
            .and_then(|ip| ip.parse().ok());
        ip.map_or(Reach::Nowhere, Reach::Pod)
    }
}

/// Reaches sandboxes' ports: Pod-runtime sandboxes at their Pod IP, node-runtime ones through
/// the relays of the node agents that run them.
pub struct RelayPorts {
    /// `None` without `cluster.relayTokenFile`: only Pods are reachable.
    client: Option<RelayClient>,
    nodes: Cache<SandboxNode>,
    namespace: String,
}

impl RelayPorts {
    /// Connects to `port` of `sandbox`: at its Pod IP, or through its node's relay.
    pub async fn connect(
        &self,
        sandbox: &Sandbox,
        port: u16,
    ) -> Result<tokio::net::TcpStream, DialError> {
        let node = match Reach::of(sandbox) {
            Reach::Node(node) => node,
            Reach::Pod(ip) => return connect_pod(ip, port).await,
            Reach::Nowhere => {
                return Err(DialError::SandboxGone(
                    "the sandbox has no pod IP and is not placed on a node".into(),
                ));
            }
        };
        let client = self.client.as_ref().ok_or_else(|| {
            DialError::Io(std::io::Error::other(
                "the sandbox runs on a node agent and cluster.relayTokenFile is not set",
            ))
        })?;
        let address = self
            .nodes
            .get(&ObjectKey::new(&self.namespace, node))
            .map(|n| n.spec.relay_address.clone())
            .ok_or_else(|| DialError::SandboxGone(format!("node {node} is not known")))?;
        let id = oka_api::runtime_id::runtime_id(sandbox)
            .map_err(|e| e.to_string())
            .and_then(|id| oka_runtime_api::SandboxId::new(id).map_err(|e| e.to_string()))
            .map_err(DialError::SandboxGone)?;
        client.connect(address.as_str(), &id, port).await.map_err(|e| match e {
            RelayError::PortClosed { port } => DialError::PortClosed { port },
            RelayError::SandboxGone(why) => DialError::SandboxGone(why),
            RelayError::Io(e) => DialError::Io(e),
            other => DialError::Io(std::io::Error::other(other.to_string())),
        })
    }
}

/// Connects to `port` at a Pod's IP; a refusal is a closed port.
async fn connect_pod(ip: std::net::IpAddr, port: u16) -> Result<tokio::net::TcpStream, DialError> {
    let address = std::net::SocketAddr::new(ip, port);
    match tokio::time::timeout(POD_CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(DialError::PortClosed { port })
        }
        Ok(Err(e)) => Err(DialError::Io(e)),
        Err(_) => Err(DialError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer from {address} in {POD_CONNECT_TIMEOUT:?}"),
        ))),
    }
}

/// The relay client (when `cluster.relayTokenFile` is set) and a cache of the SandboxNodes:
/// the platform's shared informer of them (placement follows the same one in the leading
/// controller), and readiness waits for it.
fn relay_ports<S: Store>(
    platform: &mut Platform<S>,
    config: &Config,
) -> anyhow::Result<Arc<RelayPorts>> {
    let token = match &config.cluster.relay_token_file {
        Some(_) => Some(relay_token(config)?),
        None => {
            info!("no cluster.relayTokenFile: only Pod-runtime sandboxes are reachable");
            None
        }
    };
    let watch =
        WatchConfig { namespace: Some(config.cluster.namespace.clone()), ..WatchConfig::default() };
    let informer = platform.informers().informer::<SandboxNode>(watch);
    informer.start();
    let nodes = informer.cache();
    platform.health().add_check("sandbox-nodes", {
        let nodes = nodes.clone();
        move || nodes.is_ready()
    });
    Ok(Arc::new(RelayPorts {
        client: token.map(|t| RelayClient::new(t, oka_relay::ClientConfig::default())),
        nodes,
        namespace: config.cluster.namespace.clone(),
    }))
}

/// `oka controller`: health and metrics at once; the controllers while this replica leads.
async fn controller(
    store: KubeStore,
    config: Config,
    shutdown: impl Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    let election = &config.cluster.leader_election;
    let mut election_config = oka_election::ElectionConfig::new(
        config.cluster.namespace.clone(),
        election.lease_name.clone(),
        oka_election::unique_identity(),
    );
    election_config.lease_duration = election.lease_duration;
    election_config.renew_deadline = election.renew_deadline;
    election_config.retry_period = election.retry_period;
    let identity = election_config.identity.clone();
    let elector = oka_election::Elector::new(store.clone(), election_config)
        .context("bad cluster.leaderElection")?;

    let mut platform = Platform::new(store.clone(), config.clone());
    let ports = relay_ports(&mut platform, &config)?;
    platform = platform.with_ports(SandboxPorts::Relay(ports));
    register_leader_gauge(&mut platform, elector.is_leader());
    // The claim engine SandboxClaims claim through; it needs no E2B API key of its own.
    let manager = platform.start_manager(oka_manager::api::ApiKey::generate().0)?;
    if config.cluster.webhook.enabled {
        let webhooks = start_webhooks(&mut platform, &store, &config).await?;
        info!(addr = %webhooks, "serving the admission webhooks");
    }
    let addr = platform.serve_http("controller", config.api.listen, axum::Router::new()).await?;
    info!(%addr, %identity, "oka controller is standing by for the lease");

    // SIGTERM while standing by, or while leading, ends the election the same way.
    let (signal_tx, signal_rx) = tokio::sync::watch::channel(false);
    let signal = tokio::spawn(async move {
        let result = shutdown.await;
        let _ = signal_tx.send(true);
        result
    });
    let stop = {
        let mut rx = signal_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let node_lost_after = config.cluster.node_lost_after;
    let default_runtime = config.cluster.default_runtime;
    let node_namespace = config.cluster.namespace.clone();
    let default_pool = config.default_pool.clone();
    let outcome = elector
        .run(stop, move |leadership| async move {
            info!("leading: starting the controllers");
            if default_pool.enabled
                && default_runtime == oka_api::runtime_choice::SandboxRuntime::Pod
            {
                // Its template names no image: only node agents (their default root) run it.
                info!("no default pool: it runs on node agents, and cluster.defaultRuntime is pod");
            } else if default_pool.enabled {
                // Node agents run the agent runtime in every sandbox.
                if let Err(error) = crate::pool::ensure_default_pool(
                    platform.store(),
                    &default_pool,
                    true,
                    crate::pool::PoolRoot::Default,
                )
                .await
                {
                    warn!(error = %format!("{error:#}"), "cannot create the default pool");
                }
            }
            platform.start_pool_controllers();
            platform.start_placement(oka_controller::placement::PlacementOptions {
                node_namespace,
                node_lost_after,
                default_runtime,
            });
            platform.start_pod_runtime();
            platform.start_claim_controller(&manager);
            let lost = leadership.clone();
            platform
                .run_until(async move {
                    lost.lost().await;
                    Ok(())
                })
                .await
        })
        .await
        .context("leader election failed")?;
    signal.abort();
    if outcome.is_lost() {
        anyhow::bail!("lost the leader lease: exiting so that no action is taken twice");
    }
    info!("stopped");
    match outcome.into_value() {
        Some(result) => result,
        None => Ok(()),
    }
}

/// The admission webhooks over HTTPS on `cluster.webhook.listen` (every replica), and the
/// certificate controller that keeps their Secret, serves its certificate and writes its CA
/// into the webhook configurations; ready once the certificate is served and injected.
async fn start_webhooks(
    platform: &mut Platform<KubeStore>,
    store: &KubeStore,
    config: &Config,
) -> anyhow::Result<std::net::SocketAddr> {
    let webhook = &config.cluster.webhook;
    let namespace = &config.cluster.namespace;
    let cert = Arc::new(oka_kubeapi::tls::ReloadableCert::default());
    let provisioner = oka_webhook::provision::Provisioner::new(
        store.clone(),
        store.client().clone(),
        oka_webhook::provision::ProvisionOptions {
            namespace: namespace.clone(),
            secret_name: webhook.secret_name.clone(),
            service_name: webhook.service_name.clone(),
            mutating_configuration: webhook.mutating_configuration.clone(),
            validating_configuration: webhook.validating_configuration.clone(),
            resync: webhook.resync_period,
        },
        Arc::clone(&cert),
    );
    let ready = provisioner.ready();
    platform
        .health()
        .add_check("webhook-certificates", move || ready.load(std::sync::atomic::Ordering::SeqCst));
    platform.add_background(tokio::spawn(provisioner.run(platform.stopped())));
    let listener = tokio::net::TcpListener::bind(webhook.listen)
        .await
        .with_context(|| format!("cannot listen on {} for the webhooks", webhook.listen))?;
    let addr = listener.local_addr().context("the webhook listener has no address")?;
    let settings = oka_webhook::review::Settings {
        allowed_pod_deleters: webhook.pod_deleters(namespace).into_iter().collect(),
    };
    let metrics = oka_webhook::metrics::AdmissionMetrics::default();
    metrics.register(platform.registry());
    let router = oka_webhook::server::router(store.clone(), settings, metrics);
    let stop = platform.stopped();
    let task = tokio::spawn(async move {
        oka_webhook::server::serve(listener, cert, router, stop)
            .await
            .map_err(std::io::Error::other)
    });
    platform.add_server("webhooks", task);
    Ok(addr)
}

/// `leader_election_master_status{name="oka-controller"}`: 1 while this replica leads
/// (controller-runtime's series).
fn register_leader_gauge<S: Store>(
    platform: &mut Platform<S>,
    leader: tokio::sync::watch::Receiver<bool>,
) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let family = Family::<Vec<(String, String)>, Gauge>::default();
    let gauge =
        family.get_or_create(&vec![("name".to_owned(), "oka-controller".to_owned())]).clone();
    platform.registry().register(
        "leader_election_master_status",
        "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master.",
        family,
    );
    let mut leader = leader;
    tokio::spawn(async move {
        loop {
            gauge.set(i64::from(*leader.borrow_and_update()));
            if leader.changed().await.is_err() {
                break;
            }
        }
    });
}

/// `oka manager`: the E2B API over the cluster's store.
async fn manager(
    store: KubeStore,
    config: Config,
    shutdown: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let text = match (&config.api.admin_key, &config.api.admin_key_file) {
        (Some(key), _) => key.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read api.adminKeyFile {}", path.display()))?
            .trim()
            .to_owned(),
        (None, None) => anyhow::bail!(
            "api.adminKey or api.adminKeyFile is required: the admin API key of the E2B API"
        ),
    };
    let admin_key = oka_manager::api::ApiKey::parse(&text).map_err(|_| {
        anyhow::anyhow!("api.adminKey must be `e2b_` followed by 40 lowercase hex digits")
    })?;
    let mut platform = Platform::new(store, config.clone());
    let ports = relay_ports(&mut platform, &config)?;
    platform = platform.with_ports(SandboxPorts::Relay(ports));
    let manager = platform.start_manager(admin_key)?;
    let addr = platform.serve_api(manager).await?;
    info!(%addr, "oka manager is serving the E2B API");
    platform.run_until(shutdown).await?;
    info!("stopped");
    Ok(())
}

/// `oka gateway`: traffic to ports inside sandboxes, routed from the watch.
async fn gateway(
    store: KubeStore,
    config: Config,
    shutdown: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut platform = Platform::new(store, config.clone());
    let ports = relay_ports(&mut platform, &config)?;
    // The managers, in other processes, answer a create before this gateway's watch may
    // have brought the sandbox: a request for an unknown ID waits a moment for it.
    platform =
        platform.with_ports(SandboxPorts::Relay(ports)).with_unknown_route_wait(UNKNOWN_ROUTE_WAIT);
    platform.start_gateway()?;
    let traffic = platform.serve_gateway().await?;
    let addr = platform.serve_http("gateway", config.api.listen, axum::Router::new()).await?;
    info!(%traffic, metrics = %addr, "oka gateway is serving");
    platform.run_until(shutdown).await?;
    info!("stopped");
    Ok(())
}

/// `oka node`: this machine's sandboxes.
async fn node(
    store: KubeStore,
    config: Config,
    shutdown: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let _lock = crate::lock::InstanceLock::acquire(&config.state_dir)?;
    let token = relay_token(&config)?;
    let name = config.cluster.node.name.clone().unwrap_or_else(oka_controller::sandbox::host_name);
    let mut platform = Platform::new(store.clone(), config.clone());
    let runtime_metrics = Arc::new(oka_runtime_api::metrics::RuntimeMetrics::default());
    runtime_metrics.register(platform.registry());
    let opened = crate::serve::open_runtime(&config, &runtime_metrics)
        .await?
        .context("oka node runs sandboxes: it needs root and runtime.enabled")?;
    // Said and exported as by `oka serve`; a node's image carries what it needs (no install).
    let probes = crate::serve::probe_features(&config, Some(&opened)).await?;
    crate::features::FeatureBoard::announce(&probes, platform.registry());
    let runtime = opened.runtime;

    let listener =
        tokio::net::TcpListener::bind(config.cluster.node.relay_listen).await.with_context(
            || format!("cannot listen on {} for the relay", config.cluster.node.relay_listen),
        )?;
    let relay_addr = listener.local_addr().context("the relay has no address")?;
    let advertised = match &config.cluster.node.relay_address {
        Some(address) => address.clone(),
        None => format!("{}:{}", oka_controller::sandbox::host_name(), relay_addr.port()),
    };
    let relay = Arc::new(oka_relay::RelayServer::new(
        Arc::clone(&runtime),
        token,
        oka_relay::ServerConfig::default(),
    ));
    relay.metrics().register(platform.registry());
    let stopped = platform.stopped();
    let relay_task = tokio::spawn({
        let relay = Arc::clone(&relay);
        async move {
            relay.serve(listener, stopped).await;
            Ok(())
        }
    });
    platform.add_server("relay", relay_task);

    let namespace = config.cluster.namespace.clone();
    register_node(&store, &namespace, &name, &advertised, &config).await?;
    let heartbeat = tokio::spawn(heartbeat(
        store.clone(),
        namespace.clone(),
        name.clone(),
        Arc::clone(&runtime),
        relay.activity(),
    ));
    platform.add_background(heartbeat);

    platform = platform.with_ports(SandboxPorts::Runtime(Arc::clone(&runtime)));
    let mut collector = None;
    let own = oka_store::Selector::from_labels([(labels::NODE_NAME, name.as_str())]);
    let images = crate::images::start(&config, store.clone(), own, platform.stopped(), |task| {
        collector = Some(task);
    })?;
    if let Some(task) = collector {
        platform.add_background(task);
    }
    platform.start_node_controllers(NodeScope {
        runtime,
        name: name.clone(),
        selector: oka_store::Selector::from_labels([(labels::NODE_NAME, name.as_str())]),
        // Every byte between the gateway and a sandbox passes through this node's relay.
        activity: Some(Arc::new(RelayActivity(relay.activity()))),
        images: Some(images),
    });
    let addr = platform.serve_http("node agent", config.api.listen, axum::Router::new()).await?;
    info!(node = %name, relay = %relay_addr, advertised = %advertised, metrics = %addr, "oka node is running");
    platform.run_until(shutdown).await?;
    info!("stopped");
    Ok(())
}

/// The relay's traffic as the probe runner's activity source, by the sandbox's runtime ID.
struct RelayActivity(Arc<oka_relay::Activity>);

impl oka_controller::probe::ActivitySource for RelayActivity {
    fn last_activity(&self, sandbox: &Sandbox, ports: &[i32]) -> Option<i64> {
        let id = oka_api::runtime_id::runtime_id(sandbox).ok()?;
        self.0.last(&id, ports)
    }
}

/// Writes this node's SandboxNode: created, or its spec and labels brought up to date.
async fn register_node(
    store: &KubeStore,
    namespace: &str,
    name: &str,
    relay_address: &str,
    config: &Config,
) -> anyhow::Result<()> {
    let mut capacity = std::collections::BTreeMap::new();
    for (key, value) in &config.cluster.node.capacity {
        oka_api::quantity::parse(value).map_err(|e| {
            anyhow::anyhow!("cluster.node.capacity.{key}: {value:?} is not a quantity: {e}")
        })?;
        capacity.insert(
            key.clone(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.clone()),
        );
    }
    let spec =
        SandboxNodeSpec { relay_address: relay_address.to_owned(), capacity, unschedulable: false };
    let mut node = SandboxNode::new(name, spec.clone());
    node.metadata.namespace = Some(namespace.to_owned());
    node.metadata.labels = Some(config.cluster.node.labels.clone());
    for _ in 0..5 {
        match store.get::<SandboxNode>(namespace, name).await {
            Ok(mut existing) => {
                existing.spec = spec.clone();
                existing.metadata.labels = Some(config.cluster.node.labels.clone());
                match store.update(namespace, &existing).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.is_conflict() => continue,
                    Err(e) => return Err(e).context("cannot update this node's SandboxNode"),
                }
            }
            Err(e) if e.is_not_found() => match store.create(namespace, &node).await {
                Ok(_) => return Ok(()),
                Err(oka_store::StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e).context("cannot create this node's SandboxNode"),
            },
            Err(e) => return Err(e).context("cannot read this node's SandboxNode"),
        }
    }
    anyhow::bail!("cannot register node {name}: its SandboxNode keeps changing")
}

/// Renews the node's heartbeat every [`oka_api::sandboxnode::HEARTBEAT_INTERVAL_SECONDS`],
/// with the number of sandboxes its runtime holds (and forgets the relay's oldest activity).
async fn heartbeat(
    store: KubeStore,
    namespace: String,
    name: String,
    runtime: Arc<dyn oka_runtime_api::Runtime>,
    activity: Arc<oka_relay::Activity>,
) {
    let every = std::time::Duration::from_secs(oka_api::sandboxnode::HEARTBEAT_INTERVAL_SECONDS);
    loop {
        activity.prune();
        let sandboxes = runtime.list().await.map(|l| l.len()).unwrap_or_default();
        let status = SandboxNodeStatus {
            heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::now(),
            )),
            sandboxes: i32::try_from(sandboxes).unwrap_or(i32::MAX),
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        };
        match store.get::<SandboxNode>(&namespace, &name).await {
            Ok(mut node) => {
                node.status = Some(status);
                if let Err(error) = store.update_status(&namespace, &node).await {
                    warn!(%error, "cannot renew the node's heartbeat");
                }
            }
            Err(error) => warn!(%error, "cannot read the node's SandboxNode"),
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oka_api::sandbox::PodInfo;

    fn sandbox(node: Option<&str>, pod_ip: Option<&str>, sandbox_ip: Option<&str>) -> Sandbox {
        let mut s = Sandbox::new("s", oka_api::SandboxSpec::default());
        s.metadata.labels = node.map(|n| [(labels::NODE_NAME.to_owned(), n.to_owned())].into());
        s.status = Some(oka_api::SandboxStatus {
            pod_info: Some(PodInfo { pod_ip: pod_ip.map(str::to_owned), ..PodInfo::default() }),
            sandbox_ip: sandbox_ip.map(str::to_owned),
            ..oka_api::SandboxStatus::default()
        });
        s
    }

    #[test]
    fn the_node_label_means_the_relay_and_else_the_pod_ip() {
        let placed = sandbox(Some("n1"), Some("10.0.0.1"), None);
        assert_eq!(Reach::of(&placed), Reach::Node("n1"));
        let pod = sandbox(None, Some("10.0.0.1"), Some("10.9.9.9"));
        assert_eq!(Reach::of(&pod), Reach::Pod("10.0.0.1".parse().unwrap()));
        let legacy = sandbox(None, None, Some("fd00::7"));
        assert_eq!(Reach::of(&legacy), Reach::Pod("fd00::7".parse().unwrap()));
        assert_eq!(Reach::of(&sandbox(None, None, None)), Reach::Nowhere);
    }

    #[tokio::test]
    async fn a_pod_ip_is_dialed_directly_and_a_refusal_is_a_closed_port() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ports = RelayPorts { client: None, nodes: Cache::default(), namespace: "x".into() };
        let pod = sandbox(None, Some("127.0.0.1"), None);
        let stream = ports.connect(&pod, port).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert_eq!(stream.local_addr().unwrap(), accepted.peer_addr().unwrap());
        drop(listener);
        assert!(matches!(
            ports.connect(&pod, port).await,
            Err(DialError::PortClosed { port: p }) if p == port
        ));
        let placed = sandbox(Some("n1"), None, None);
        assert!(matches!(ports.connect(&placed, port).await, Err(DialError::Io(_))));
    }
}
