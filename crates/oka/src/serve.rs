//! `oka serve`: the whole platform in one process on the embedded store.
//!
//! # Expected flow
//!
//! 1. Take the state directory's instance lock, or refuse to start and name the holder.
//! 2. Open the embedded store (`<state dir>/store.redb`); this loads every object into memory.
//! 3. Open the local runtime (`<state dir>/runtime`; needs root), which re-adopts the sandboxes
//!    that outlived the last run and removes what belongs to dead ones. Without root, or with
//!    `runtime.enabled: false`, only the controllers that need no runtime run.
//! 4. Create the default pool (`base`) when it is missing.
//! 5. Start the controllers; each lists and watches the store and converges what it finds, so
//!    a restart after a crash picks up where the last run stopped.
//! 6. Serve the E2B-compatible API (`api.listen`, default 127.0.0.1:8080) with the admin key
//!    from the config or `<state dir>/admin-key` (generated once); with a runtime, a claimed
//!    sandbox's envd gets its env vars and access token (`/init`) before the create answers.
//! 7. Serve the gateway (`gateway.listen`, default 127.0.0.1:8081): traffic to ports inside
//!    sandboxes, routed by host, headers or path, waking paused sandboxes on request.
//! 8. Serve `/metrics` on the API listener and `/healthz`, `/readyz` on every listener
//!    ([`crate::observe`]); ready once the store is open and the controllers' caches and the
//!    gateway's route table are filled.
//! 9. Print what is served and where, then wait for SIGTERM or SIGINT.
//! 10. On a signal: controllers stop taking work and finish what is in flight (bounded by
//!     [`SHUTDOWN_GRACE`]), the store commits what is queued and closes, the lock is released.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context as _;
use std::sync::Arc;

use oka_controller::revision::fnv1_32;
use oka_controller::sandbox::run_sandbox_controller;
use oka_controller::sandboxclaim::run_sandbox_claim_controller;
use oka_controller::sandboxset::{
    SANDBOX_EVENT_DEBOUNCE, SANDBOX_EVENT_DEBOUNCE_SCALE, run_sandbox_set_controller,
};
use oka_controller::{Clock, Config as ControllerConfig};
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::Runtime;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
use crate::lock::InstanceLock;

/// How long in-flight work may take to finish after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs `oka serve` until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    // Handlers are installed before anything starts, so a signal that arrives while starting
    // up still shuts down cleanly instead of killing the process.
    let signals = shutdown_signal()?;
    serve_until(config, signals).await
}

/// Runs `oka serve` until `shutdown` resolves.
pub async fn serve_until(
    config: Config,
    shutdown: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let _lock = InstanceLock::acquire(&config.state_dir)?;
    let tracing = oka_telemetry::export::install(&config.tracing.settings()?)
        .context("cannot set up tracing")?;
    if tracing.is_some() {
        info!(mode = %config.tracing.mode, endpoint = %config.tracing.endpoint, "tracing on");
    }
    let store_path = config.state_dir.join("store.redb");
    let options =
        EmbeddedOptions { history_size: config.store.watch_history, ..EmbeddedOptions::default() };
    let store = EmbeddedStore::open(&store_path, options)
        .with_context(|| format!("cannot open the store in {}", config.state_dir.display()))?;

    // Every component registers its series here; `/metrics` serves them. Readiness checks
    // join `health` as the parts they check start.
    let mut registry = oka_metrics::Registry::default();
    let shared_metrics = oka_metrics::Shared::default();
    shared_metrics.register(&mut registry);
    store.register_metrics(&mut registry);
    let health = oka_metrics::health::Health::default();
    health.add_check("store", {
        let store = store.clone();
        move || store.is_open()
    });
    let controller_metrics = Arc::new(oka_controller::metrics::ControllerMetrics::new(
        shared_metrics.clone(),
        config.metrics.sandbox_labels.clone(),
    ));
    controller_metrics.register(&mut registry);
    let runtime_metrics = Arc::new(oka_runtime_api::metrics::RuntimeMetrics::default());
    runtime_metrics.register(&mut registry);

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            // An error means the sender is gone, which also means stop.
            let _ = rx.wait_for(|stop| *stop).await;
        })
    };

    let runtime = open_runtime(&config, &runtime_metrics).await?;
    if config.default_pool.enabled {
        let agent_runtime = runtime.as_ref().is_none_or(|r| r.agent_runtime);
        crate::pool::ensure_default_pool(&store, &config.default_pool, agent_runtime)
            .await
            .context("cannot create the default pool")?;
    }
    if config.code_interpreter_pool.enabled && runtime.as_ref().is_some_and(|r| r.interpreter) {
        let command = oka_runtime::local::tool_path(INTERPRETER_TOOL).display().to_string();
        crate::pool::ensure_pool(&store, &config.code_interpreter_pool.pool(), &[&command])
            .await
            .context("cannot create the code interpreter pool")?;
    }
    let runtime = runtime.map(|r| r.runtime);

    // The gateway is started before the manager and the controllers, which hand it envd connections.
    let gateway = runtime.as_ref().map(|runtime| {
        let mut gateway_config =
            oka_gateway::GatewayConfig::new(config.gateway.domain.clone().unwrap_or_default());
        gateway_config.idle_timeout = config.gateway.idle_timeout;
        gateway_config.wake_timeout = config.gateway.wake_timeout;
        let dialer = Arc::new(oka_gateway::dial::RuntimeDialer::new(Arc::clone(runtime)));
        let gateway = oka_gateway::Gateway::start(store.clone(), gateway_config, dialer);
        gateway.register_metrics(&mut registry);
        gateway.serve_health(health.clone());
        health.add_check("gateway-routes", {
            let gateway = gateway.clone();
            move || gateway.is_ready()
        });
        gateway
    });
    // One agent-runtime client for the manager's claims and resumes and the sandbox
    // controller's re-inits.
    let initializer: Option<Arc<dyn oka_manager::SandboxInitializer>> =
        runtime.as_ref().map(|runtime| {
            let connector =
                RuntimeConnector { runtime: Arc::clone(runtime), gateway: gateway.clone() };
            let initializer: Arc<dyn oka_manager::SandboxInitializer> =
                Arc::new(oka_manager::init::EnvdInitializer::new(
                    connector,
                    oka_manager::init::EnvdInitConfig::default(),
                ));
            initializer
        });

    let workers = |n: usize| {
        ControllerConfig::default().workers(n.max(1)).metrics(Arc::clone(&controller_metrics))
    };
    health.add_check("controller-caches", {
        let metrics = Arc::clone(&controller_metrics);
        let with_sandboxes = runtime.is_some();
        move || metrics.caches_synced(with_sandboxes)
    });
    // The controllers' writes mark their reconcile spans (a reconcile that wrote nothing is
    // not exported).
    let controller_store = oka_controller::trace::MarkWrites(store.clone());
    let mut names = vec!["sandboxclaim", "sandboxset", "sandboxupdateops"];
    let mut controllers = tokio::task::JoinSet::new();
    controllers.spawn(run_sandbox_set_controller(
        controller_store.clone(),
        workers(config.controllers.sandbox_set_workers)
            .debounce(SANDBOX_EVENT_DEBOUNCE)
            .debounce_scale(SANDBOX_EVENT_DEBOUNCE_SCALE),
        Clock::system(),
        stopped(stop_rx.clone()),
    ));
    controllers.spawn(oka_controller::sandboxupdateops::run_update_ops_controller(
        controller_store.clone(),
        workers(1),
        Clock::system(),
        stopped(stop_rx.clone()),
    ));
    names.push("poolautoscaler");
    controllers.spawn(oka_controller::poolautoscaler::run_pool_autoscaler_controller(
        controller_store.clone(),
        workers(config.controllers.pool_autoscaler_workers),
        Clock::system(),
        config.controllers.pool_autoscaler.settings(),
        stopped(stop_rx.clone()),
    ));
    // Events expire an hour after they were last seen, as the API server's --event-ttl.
    let sweeper = tokio::spawn(oka_controller::events::sweep_expired_events(
        store.clone(),
        oka_controller::events::EVENT_TTL,
        std::time::Duration::from_secs(60),
    ));
    if let Some(runtime) = &runtime {
        names.push("sandbox");
        let options =
            oka_controller::sandbox::SandboxOptions {
                initializer: initializer.clone().map(|i| {
                    oka_controller::sandbox::Shared(Arc::new(ReplayInit(i))
                        as Arc<dyn oka_controller::sandbox::RuntimeInitializer>)
                }),
                // Upgrade hooks run through each sandbox's envd process API.
                hooks: Some(oka_controller::sandbox::Shared(Arc::new(EnvdHooks(
                    RuntimeConnector { runtime: Arc::clone(runtime), gateway: None },
                )))),
                auto_pause_max_actions_per_hour: config.controllers.auto_pause_max_actions_per_hour,
                ..oka_controller::sandbox::SandboxOptions::default()
            };
        controllers.spawn(run_sandbox_controller(
            controller_store.clone(),
            Arc::clone(runtime),
            workers(config.controllers.sandbox_workers),
            Clock::system(),
            options,
            stopped(stop_rx.clone()),
        ));
        names.push("checkpoint");
        controllers.spawn(oka_controller::checkpoint::run_checkpoint_controller(
            controller_store.clone(),
            Arc::clone(runtime),
            workers(2),
            Clock::system(),
            stopped(stop_rx.clone()),
        ));
        // The probe runner: one task for every sandbox's probes; activity probes read the
        // gateway's traffic registry.
        names.push("probes");
        let activity = gateway.as_ref().map(|g| {
            Arc::new(GatewayActivity(g.activity()))
                as Arc<dyn oka_controller::probe::ActivitySource>
        });
        let exec_probes =
            Arc::new(EnvdHooks(RuntimeConnector { runtime: Arc::clone(runtime), gateway: None }))
                as Arc<dyn oka_controller::sandbox::HookRunner>;
        controllers.spawn(oka_controller::probe::run_probe_runner(
            controller_store.clone(),
            Arc::clone(runtime),
            Some(exec_probes),
            activity,
            Clock::system(),
            oka_controller::probe::ProbeRunnerOptions {
                metrics: Some(oka_controller::sandbox::Shared(Arc::clone(&controller_metrics))),
                ..oka_controller::probe::ProbeRunnerOptions::default()
            },
            stopped(stop_rx.clone()),
        ));
    }

    let admin_key = admin_key(&config)?;
    let index = oka_manager::index::Index::spawn(store.clone());
    let mut manager_config = oka_manager::api::ManagerConfig::new(admin_key.0);
    manager_config.domain.clone_from(&config.gateway.domain);
    manager_config.min_timeout_secs =
        i64::try_from(config.api.min_timeout.as_secs()).unwrap_or(i64::MAX);
    // The checkpoint controller above takes snapshots wherever a runtime runs.
    manager_config.snapshots.enabled = runtime.is_some();
    let system_namespace = manager_config.system_namespace.clone();
    let team_keys: Arc<dyn oka_kubeapi::auth::Authenticator> =
        Arc::new(TeamKeys(oka_manager::api::keys::KeyStore::new(
            store.clone(),
            manager_config.system_namespace.clone(),
            manager_config.admin_key.clone(),
        )));
    let manager_metrics = Arc::new(oka_manager::metrics::ManagerMetrics::new(shared_metrics));
    manager_metrics.register(&mut registry);
    let quota_metrics = Arc::new(oka_manager::quota::QuotaMetrics::register(&mut registry));
    let mut api_state =
        oka_manager::api::AppState::new(store.clone(), Arc::clone(&index), manager_config)
            .with_metrics(manager_metrics);
    if let Some(initializer) = initializer {
        // Each pool sandbox's envd connection is opened while the pool fills, not by its claim.
        tokio::spawn(oka_manager::init::keep_pools_prepared(
            Arc::downgrade(&index),
            Arc::clone(&initializer),
        ));
        api_state = api_state.with_initializer(initializer);
    }
    if let Some(gateway) = &gateway {
        api_state = api_state.with_routes(Arc::new(GatewayRoutes(gateway.clone())));
    }
    let (_quota, quota_task) = start_quota(&config.quota, &api_state, quota_metrics)?;
    // SandboxClaims claim through the E2B API's own engine and initializer: one claim path.
    let claimer = crate::claimer::EngineClaimer {
        engine: Arc::clone(&api_state.engine),
        initializer: Arc::clone(&api_state.initializer),
        create: api_state.config.create.clone(),
    };
    controllers.spawn(run_sandbox_claim_controller(
        controller_store.clone(),
        workers(config.controllers.sandbox_claim_workers),
        Clock::system(),
        Arc::new(claimer),
        stopped(stop_rx.clone()),
    ));
    let listener = tokio::net::TcpListener::bind(config.api.listen)
        .await
        .with_context(|| format!("cannot listen on {} for the API", config.api.listen))?;
    let api_addr = listener.local_addr().context("the API listener has no address")?;
    let registry = Arc::new(registry);
    let observe = crate::observe::routes(Arc::clone(&registry), health.clone());
    let api = tokio::spawn({
        let stop = stopped(stop_rx.clone());
        async move {
            axum::serve(listener, oka_manager::api::app(api_state).merge(observe))
                .with_graceful_shutdown(stop)
                .await
        }
    });

    let kube_api = match config.kube_api.enabled {
        true => Some(
            start_kube_api(
                &config,
                store.clone(),
                &admin_key.1,
                team_keys,
                system_namespace,
                health.clone(),
                stopped(stop_rx.clone()),
            )
            .await?,
        ),
        false => None,
    };

    let gateway = match gateway {
        Some(gateway) => {
            let listener =
                tokio::net::TcpListener::bind(config.gateway.listen).await.with_context(|| {
                    format!("cannot listen on {} for the gateway", config.gateway.listen)
                })?;
            let addr = listener.local_addr().context("the gateway listener has no address")?;
            let stop = stopped(stop_rx.clone());
            Some((addr, tokio::spawn(oka_gateway::serve(listener, gateway, stop))))
        }
        None => None,
    };

    info!(
        state_dir = %config.state_dir.display(),
        store = %store_path.display(),
        resource_version = %store.resource_version(),
        runtime = if runtime.is_some() { "local" } else { "none" },
        controllers = %names.join(","),
        api = %api_addr,
        kube_api = %kube_api.as_ref().map_or_else(|| "off".to_owned(), |k| k.0.to_string()),
        gateway = %gateway.as_ref().map_or_else(|| "off (no runtime)".to_owned(), |g| g.0.to_string()),
        "oka serve is running; stop it with SIGTERM or Ctrl-C"
    );
    let sandbox_url =
        gateway.as_ref().map_or_else(String::new, |g| format!(" E2B_SANDBOX_URL=http://{}", g.0));
    info!(
        "E2B SDK settings: E2B_API_URL=http://{api_addr}{sandbox_url} E2B_API_KEY={} (key from {})",
        admin_key.1, admin_key.2
    );
    if let Some((_, kubeconfig, _)) = &kube_api {
        info!("kubectl settings: KUBECONFIG={}", kubeconfig.display());
    }
    let result = shutdown.await;
    info!("shutting down: finishing in-flight work");
    let _ = stop_tx.send(true);
    sweeper.abort();
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while controllers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(grace = ?SHUTDOWN_GRACE, "controllers did not finish in time; aborting them");
        controllers.shutdown().await;
    }
    if let Some((_, gateway)) = gateway {
        match tokio::time::timeout(SHUTDOWN_GRACE, gateway).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "the gateway failed"),
            Ok(Err(e)) => warn!(error = %e, "the gateway task failed"),
            Err(_) => warn!("the gateway did not stop in time"),
        }
    }
    if let Some((_, _, kube_api)) = kube_api {
        match tokio::time::timeout(SHUTDOWN_GRACE, kube_api).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "the Kubernetes API server failed"),
            Ok(Err(e)) => warn!(error = %e, "the Kubernetes API server task failed"),
            Err(_) => warn!("the Kubernetes API server did not stop in time"),
        }
    }
    match tokio::time::timeout(SHUTDOWN_GRACE, api).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "the API server failed"),
        Ok(Err(e)) => warn!(error = %e, "the API server task failed"),
        Err(_) => warn!("the API server did not stop in time"),
    }
    quota_task.abort();
    index.shutdown();
    if let Some(tracing) = tracing {
        tracing.shutdown();
    }
    store.close().context("the store did not close cleanly")?;
    info!("stopped");
    result
}

/// API-key quotas: the Redis backend when `quota.redisAddr` is set (credentials from
/// `QUOTA_REDIS_USERNAME` and `QUOTA_REDIS_PASSWORD`), else the embedded ledger, rebuilt from
/// the store's sandboxes before the first admission; kept true by the anti-drift driver.
fn start_quota(
    config: &crate::config::QuotaConfig,
    api_state: &oka_manager::api::AppState<EmbeddedStore>,
    metrics: Arc<oka_manager::quota::QuotaMetrics>,
) -> anyhow::Result<(Arc<oka_manager::quota::Quota>, tokio::task::JoinHandle<()>)> {
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
    let quota = Arc::new(quota);
    let drift = AntiDriftConfig {
        interval: config.anti_drift_interval,
        grace: config.anti_drift_grace,
        ..AntiDriftConfig::default()
    };
    let (_, task) = api_state.start_quota(Arc::clone(&quota), drift);
    Ok((quota, task))
}

/// A running Kubernetes-compatible API: its address, the kubeconfig written for it, its task.
type KubeApiServer =
    (std::net::SocketAddr, std::path::PathBuf, tokio::task::JoinHandle<std::io::Result<()>>);

/// Serves the Kubernetes-compatible API (`kubeApi.listen`, TLS with the state directory's CA)
/// until `stop`, with the admin key as its bearer token, and writes `<state dir>/kubeconfig`
/// (mode 0600: it holds the key) for it.
async fn start_kube_api(
    config: &Config,
    store: EmbeddedStore,
    admin_key: &str,
    team_keys: Arc<dyn oka_kubeapi::auth::Authenticator>,
    system_namespace: String,
    health: oka_metrics::health::Health,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> anyhow::Result<KubeApiServer> {
    let listen = config.kube_api.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} for the Kubernetes API"))?;
    let addr = listener.local_addr().context("the Kubernetes API listener has no address")?;
    // The certificate names the address kubectl dials: loopback when listening on all.
    let host =
        if addr.ip().is_unspecified() { "127.0.0.1".to_owned() } else { addr.ip().to_string() };
    let tls = oka_kubeapi::tls::Tls::load_or_create(
        &config.state_dir,
        &[host.clone(), "localhost".to_owned()],
    )
    .context("cannot make the Kubernetes API's TLS certificate")?;
    let server = format!("https://{}", std::net::SocketAddr::new(host.parse()?, addr.port()));
    let kubeconfig = config.state_dir.join("kubeconfig");
    write_private(&kubeconfig, &oka_kubeapi::kubeconfig(&server, &tls.ca_pem, admin_key))
        .with_context(|| format!("cannot write {}", kubeconfig.display()))?;
    let kube_config = oka_kubeapi::KubeApiConfig {
        admin_token: admin_key.to_owned(),
        server_address: addr.to_string(),
        team_keys: Some(team_keys),
        namespaces: vec![system_namespace],
    };
    let app = oka_kubeapi::router(store, kube_config).merge(crate::observe::health_routes(health));
    let listener = listener.into_std().context("the Kubernetes API listener cannot be moved")?;
    // On its own threads below normal priority: the management plane yields to the data plane.
    let task = oka_kubeapi::runtime::serve_tls(listener, &tls, app, stop);
    Ok((addr, kubeconfig, task))
}

/// The E2B API keys as bearer tokens of the Kubernetes API: a team's key is confined to the
/// team's namespace, as it is on the E2B API; the admin team's keys see everything.
struct TeamKeys(oka_manager::api::keys::KeyStore<EmbeddedStore>);

impl oka_kubeapi::auth::Authenticator for TeamKeys {
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

/// Writes `text` to `path`, readable by its owner only, replacing what was there at once (a
/// reader sees the old file or the new one, never half of one).
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = std::path::PathBuf::from(temp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temp, path)
}

/// Reaches a sandbox's envd for the manager through the local runtime, and hands the
/// connections it is done with to the gateway.
struct RuntimeConnector {
    runtime: Arc<dyn Runtime>,
    gateway: Option<oka_gateway::Gateway<EmbeddedStore>>,
}

impl oka_manager::init::EnvdConnector for RuntimeConnector {
    fn connect<'a>(
        &'a self,
        sandbox: &'a oka_api::Sandbox,
        port: u16,
    ) -> futures::future::BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(async move {
            let id = oka_controller::sandbox::resolve::runtime_id(sandbox)
                .map_err(std::io::Error::other)?;
            self.runtime.connect(&id, port).await.map_err(std::io::Error::other)
        })
    }

    /// A claim's `/init` connection carries the sandbox's first request through the gateway.
    fn release(&self, sandbox: &oka_api::Sandbox, port: u16, stream: tokio::net::TcpStream) {
        if let Some(gateway) = &self.gateway {
            gateway.adopt_upstream(sandbox, port, stream);
        }
    }
}

/// The sandbox controller's re-init: the manager's replay of the recorded `/init`.
/// The gateway's traffic registry as the probe runner's activity source: a sandbox's requests
/// are recorded under its public route ID.
struct GatewayActivity(Arc<oka_gateway::activity::Activity>);

impl oka_controller::probe::ActivitySource for GatewayActivity {
    fn last_activity(&self, sandbox: &oka_api::Sandbox, ports: &[i32]) -> Option<i64> {
        let id = oka_gateway::table::route_id(sandbox)?;
        self.0.last(&id, ports)
    }
}

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

/// The sandbox controller's upgrade hooks: the manager's envd process client
/// ([`oka_manager::exec::run_command`], as root) over the runtime's connections.
struct EnvdHooks(RuntimeConnector);

impl oka_controller::sandbox::HookRunner for EnvdHooks {
    fn run_hook<'a>(
        &'a self,
        sandbox: &'a oka_api::Sandbox,
        command: &'a [String],
        timeout: std::time::Duration,
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
struct GatewayRoutes(oka_gateway::Gateway<EmbeddedStore>);

impl oka_manager::api::RouteWaiter for GatewayRoutes {
    fn wait_routed<'a>(
        &'a self,
        sandbox_id: &'a str,
        timeout: std::time::Duration,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(self.0.wait_routed(sandbox_id, timeout))
    }
}

/// The admin API key, its text and where it came from: the config, or `<state dir>/admin-key`,
/// generated (mode 0600) on the first start.
fn admin_key(config: &Config) -> anyhow::Result<(oka_manager::api::ApiKey, String, String)> {
    use oka_manager::api::ApiKey;
    if let Some(text) = &config.api.admin_key {
        let key = ApiKey::parse(text).map_err(|_| {
            anyhow::anyhow!("api.adminKey must be `e2b_` followed by 40 lowercase hex digits")
        })?;
        return Ok((key, text.clone(), "the config file".to_owned()));
    }
    let path = config.state_dir.join("admin-key");
    let origin = path.display().to_string();
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let text = text.trim().to_owned();
            let key = ApiKey::parse(&text).map_err(|_| {
                anyhow::anyhow!(
                    "{origin} does not hold a valid API key; remove it to generate a new one"
                )
            })?;
            Ok((key, text, origin))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let (key, text) = ApiKey::generate();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot create {origin}"))?;
            writeln!(file, "{text}")
                .and_then(|()| file.sync_all())
                .with_context(|| format!("cannot write {origin}"))?;
            Ok((key, text, origin))
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {origin}")),
    }
}

/// Opens the local runtime when enabled and possible; `None` (with a warning saying why) when
/// sandboxes cannot run here. A runtime that is possible but fails to open is an error.
/// The name of the code interpreter server among the runtime's tools (`/.oka/interpreter`).
const INTERPRETER_TOOL: &str = "interpreter";

/// The local runtime `oka serve` runs sandboxes with.
struct OpenedRuntime {
    runtime: Arc<dyn Runtime>,
    /// Sandboxes can run the code interpreter server (`oka-interpreter` was found).
    interpreter: bool,
    /// Sandboxes run the agent runtime (`oka-envd` was found).
    agent_runtime: bool,
}

async fn open_runtime(
    config: &Config,
    metrics: &Arc<oka_runtime_api::metrics::RuntimeMetrics>,
) -> anyhow::Result<Option<OpenedRuntime>> {
    if !config.runtime.enabled {
        info!("local runtime disabled by the config: sandboxes will not run on this machine");
        return Ok(None);
    }
    if !rustix::process::geteuid().is_root() {
        warn!("not running as root: the local runtime is off, sandboxes will stay Pending");
        return Ok(None);
    }
    // Sandbox inits are our children; reap them at once (PID 1 here may not).
    oka_runtime::local::become_subreaper().context("cannot become a child subreaper")?;
    let init = match LocalConfig::find_init_binary() {
        Some(path) => path,
        // This binary is multi-call: started as `oka-init` it is the sandbox init.
        None => {
            let exe = std::env::current_exe().context("cannot find this executable")?;
            info!(
                init = %exe.display(),
                "no oka-init beside this executable: sandboxes start with this one as their init \
                 (a little slower; `cargo build --release --bins` builds oka-init)"
            );
            exe
        }
    };
    let mut local_config = LocalConfig::new(config.state_dir.join("runtime"), init);
    local_config.cgroup_name = cgroup_name(&config.state_dir);
    // The agent runtime daemon becomes PID 1 of every sandbox and serves the E2B SDKs.
    local_config.envd_binary = LocalConfig::find_envd_binary();
    match &local_config.envd_binary {
        Some(path) => info!(envd = %path.display(), "sandboxes serve envd as their PID 1"),
        None => warn!(
            "oka-envd not found beside this executable nor in ${}: sandboxes run without the agent runtime",
            LocalConfig::ENVD_ENV
        ),
    }
    // E2B's code interpreter API (port 49999), for templates that run it as their command.
    let interpreter = LocalConfig::find_binary("OKA_INTERPRETER", "oka-interpreter");
    match &interpreter {
        Some(path) => {
            info!(interpreter = %path.display(), "sandboxes can run the code interpreter");
            local_config.tools.insert(INTERPRETER_TOOL.to_owned(), path.clone());
        }
        None => info!(
            "oka-interpreter not found beside this executable nor in $OKA_INTERPRETER: no code interpreter pool"
        ),
    }
    let agent_runtime = local_config.envd_binary.is_some();
    let local = LocalRuntime::open(local_config).await.context("cannot open the local runtime")?;
    Ok(Some(OpenedRuntime {
        runtime: Arc::new(oka_runtime_api::metrics::Metered::new(local, Arc::clone(metrics))),
        interpreter: interpreter.is_some(),
        agent_runtime,
    }))
}

/// The runtime's cgroup name: one per state directory, so two `oka serve` on different state
/// directories never take each other's sandbox cgroups for leftovers.
pub(crate) fn cgroup_name(state_dir: &std::path::Path) -> String {
    let path = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_owned());
    // FNV is stable across runs and builds (unlike std's hasher).
    format!("oka-{:08x}", fnv1_32(path.as_os_str().as_encoded_bytes()))
}

/// Installs SIGTERM and SIGINT handlers now; the returned future resolves on the first signal.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = anyhow::Result<()>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => info!("received SIGTERM"),
            _ = int.recv() => info!("received SIGINT"),
        }
        Ok(())
    })
}
