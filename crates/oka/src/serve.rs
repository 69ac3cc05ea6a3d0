//! `oka serve`: the whole platform in one process on the embedded store.
//!
//! # Expected flow
//!
//! 1. Take the state directory's instance lock, or refuse to start and name the holder.
//! 2. Open the embedded store (`<state dir>/store.redb`); this loads every object into memory.
//! 3. Open the local runtime (`<state dir>/runtime`; needs root), which re-adopts the sandboxes
//!    that outlived the last run and removes what belongs to dead ones. Without root, or with
//!    `runtime.enabled: false`, only the controllers that need no runtime run.
//!    Then probe the optional features once (CRIU for hibernation, snapshots and forks; `ip`
//!    and `nft` for outbound networking; `oka-interpreter` and a Jupyter kernel for the code
//!    interpreter) and log one line per feature: available, or off with why and the command
//!    that turns it on ([`crate::features`]); a request that needs one that is off is refused
//!    at once, naming it.
//! 4. Create the default pools (`base`, and `code-interpreter-v1` with `oka-interpreter`) on
//!    their template roots when missing, or on the images `templates.images` names (pulled like
//!    any template's, nothing built); roots not built yet are built in the background first,
//!    while everything else is served ([`crate::templates`]).
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
//!     [`crate::platform::SHUTDOWN_GRACE`]), the store commits what is queued and closes, the lock is released.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context as _;
use oka_controller::revision::fnv1_32;
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::Runtime;
use oka_runtime_api::features::Feature;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use tracing::{info, warn};

use crate::config::Config;
use crate::lock::InstanceLock;
use crate::platform::{NodeScope, Platform, SandboxPorts};

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
    // The store's errors name the file, so an operator knows what to restore from a backup.
    let store = EmbeddedStore::open(&store_path, options)?;

    let mut platform = Platform::new(store.clone(), config.clone());
    store.register_metrics(platform.registry());
    platform.health().add_check("store", {
        let store = store.clone();
        move || store.is_open()
    });
    let runtime_metrics = Arc::new(oka_runtime_api::metrics::RuntimeMetrics::default());
    runtime_metrics.register(platform.registry());

    let runtime = open_runtime(&config, &runtime_metrics).await?;
    let probes = probe_features(&config, runtime.as_ref()).await?;
    let features = crate::features::FeatureBoard::announce(&probes, platform.registry());
    if config.runtime.auto_install
        && crate::features::should_install_criu(
            &features.current(),
            runtime.is_some(),
            std::env::var_os(oka_runtime::local::criu::CRIU_ENV).is_some_and(|v| !v.is_empty()),
            std::path::Path::new("/usr/bin/apt-get").exists(),
        )
    {
        let interpreter = runtime.as_ref().and_then(|r| r.interpreter.clone());
        crate::features::install_criu_in_background(Arc::clone(&features), move || {
            oka_runtime::local::features::probe(Ok(()), None, interpreter.as_deref())
        });
    }
    if config.runtime.auto_install
        && crate::features::should_install_network_tools(
            &features.current(),
            runtime.is_some(),
            std::path::Path::new("/usr/bin/apt-get").exists(),
        )
    {
        let interpreter = runtime.as_ref().and_then(|r| r.interpreter.clone());
        crate::features::install_network_tools_in_background(Arc::clone(&features), move || {
            oka_runtime::local::features::probe(Ok(()), None, interpreter.as_deref())
        });
    }
    let template_builds = Arc::new(crate::templates::status::TemplateBuilds::default());
    match &runtime {
        // Sandboxes run here: each default pool on its template's root, built when missing.
        Some(opened) => {
            let outbound = features.current().is_available(Feature::OutboundNetwork);
            if !outbound && (config.default_pool.outbound || config.code_interpreter_pool.outbound)
            {
                warn!(
                    "the default pools' sandboxes are loopback-only: outbound networking is off \
                     on this machine (see the feature outbound-network line for how to turn it \
                     on; defaultPool.outbound and codeInterpreterPool.outbound: false say so \
                     on purpose)"
                );
            }
            let pools = default_pools(&config, opened, outbound);
            let dir = config.templates.dir(&config.state_dir);
            let settings = crate::templates::build::BuildSettings {
                mirror: config.templates.mirror.clone(),
                install_debootstrap: config.runtime.auto_install,
            };
            crate::templates::start_default_pools(&store, pools, &dir, settings, &template_builds)
                .await
                .context("cannot create the default pools")?;
        }
        // Nothing runs here, nothing to build: the pool's objects alone (on its image, when
        // templates.images names one).
        None if config.default_pool.enabled => {
            let root = match config.templates.image(crate::templates::definition::BASE.name) {
                Some(reference) => crate::pool::PoolRoot::Image {
                    reference,
                    pull_secrets: &config.templates.image_pull_secrets,
                },
                None => crate::pool::PoolRoot::Default,
            };
            crate::pool::ensure_default_pool(&store, &config.default_pool, true, root)
                .await
                .context("cannot create the default pool")?;
        }
        None => {}
    }
    let agent_runtime = runtime.as_ref().is_some_and(|r| r.agent_runtime);
    let runtime = runtime.map(|r| r.runtime);

    // Every part in this process: the gateway first (the manager hands it envd connections),
    // then the controllers, the manager, and the SandboxClaim controller on the manager's
    // engine.
    if let Some(runtime) = &runtime {
        platform = platform.with_ports(SandboxPorts::Runtime(Arc::clone(runtime)));
        let egress = crate::egress::RuntimeEgress {
            runtime: Arc::clone(runtime),
            features: Arc::clone(&features),
            policies: platform.informers().all::<oka_api::TrafficPolicy>(),
            globals: platform.informers().all(),
            applied: platform.applied_egress(),
        };
        platform = platform.with_egress(Arc::new(egress));
        platform.start_gateway()?;
    }
    platform = platform.with_snapshot_gate({
        let features = Arc::clone(&features);
        oka_manager::api::templates::SnapshotGate::new(move || {
            features.current().require(Feature::Hibernate).map_err(|off| off.to_string())
        })
    });
    platform = platform
        .with_pending_templates(crate::templates::pending_templates(Arc::clone(&template_builds)));
    platform.start_pool_controllers();
    if let Some(runtime) = &runtime {
        let stopped = platform.stopped();
        let mut collector = None;
        let everything = oka_store::Selector::everything();
        let (images, image_store) =
            crate::images::start_with_store(&config, store.clone(), everything, stopped, |task| {
                collector = Some(task);
            })?;
        let outbound = features.current().is_available(Feature::OutboundNetwork);
        let builder = crate::builds::SandboxBuilder::new(
            Arc::clone(runtime),
            image_store,
            crate::builds::BuildSettings::for_serve(&config, outbound, agent_runtime),
        );
        let builder = Arc::new(builder);
        platform.add_background(tokio::spawn({
            let builder = Arc::clone(&builder);
            async move { builder.remove_leftovers().await }
        }));
        platform = platform.with_template_builds(oka_manager::TemplateBuildConfig::new(
            builder,
            config.state_dir.join("template-builds"),
        ));
        if let Some(task) = collector {
            platform.add_background(task);
        }
        platform.start_node_controllers(NodeScope {
            runtime: Arc::clone(runtime),
            name: oka_controller::sandbox::host_name(),
            selector: oka_store::Selector::everything(),
            activity: None,
            images: Some(images),
        });
    }
    if runtime.is_none() {
        platform = platform.with_template_builds(oka_manager::TemplateBuildConfig::new(
            Arc::new(crate::builds::Unavailable(
                "template builds run in sandboxes, and this oka serve runs none (not root, or \
                 runtime.enabled is false)"
                    .into(),
            )),
            config.state_dir.join("template-builds"),
        ));
    }
    let admin_key = admin_key(&config)?;
    let manager = platform.start_manager(admin_key.0)?;
    platform.start_claim_controller(&manager);
    let team_keys = Arc::clone(&manager.team_keys);
    let system_namespace = manager.state.config.system_namespace.clone();
    // The E2B API listens first: the Kubernetes API's first start makes its TLS keys, and the
    // pool's sandboxes may be ready before that.
    let api = oka_manager::api::app(manager.state);
    let api_addr = platform.serve_http("API", config.api.listen, api).await?;
    let kube_api = match config.kube_api.enabled {
        true => Some(
            start_kube_api(
                &config,
                store.clone(),
                &admin_key.1,
                team_keys,
                system_namespace,
                platform.health().clone(),
                platform.stopped(),
            )
            .await?,
        ),
        false => None,
    };
    let gateway_addr = match runtime {
        Some(_) => Some(platform.serve_gateway().await?),
        None => None,
    };
    let kube_api = kube_api.map(|(addr, kubeconfig, task)| {
        platform.add_server("Kubernetes API server", task);
        (addr, kubeconfig)
    });

    info!(
        state_dir = %config.state_dir.display(),
        store = %store_path.display(),
        resource_version = %store.resource_version(),
        runtime = if runtime.is_some() { "local" } else { "none" },
        controllers = %platform.controller_names().join(","),
        api = %api_addr,
        kube_api = %kube_api.as_ref().map_or_else(|| "off".to_owned(), |k| k.0.to_string()),
        gateway = %gateway_addr.map_or_else(|| "off (no runtime)".to_owned(), |g| g.to_string()),
        templates_building = %template_builds.building().join(","),
        "oka serve is running; stop it with SIGTERM or Ctrl-C"
    );
    let sandbox_url =
        gateway_addr.map_or_else(String::new, |g| format!(" E2B_SANDBOX_URL=http://{g}"));
    info!(
        "E2B SDK settings: E2B_API_URL=http://{api_addr}{sandbox_url} E2B_API_KEY={} (key from {})",
        admin_key.1, admin_key.2
    );
    if let Some((_, kubeconfig)) = &kube_api {
        info!("kubectl settings: KUBECONFIG={}", kubeconfig.display());
    }
    let result = platform.run_until(shutdown).await;
    if let Some(tracing) = tracing {
        tracing.shutdown();
    }
    store.close().context("the store did not close cleanly")?;
    info!("stopped");
    result
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

/// The default pools of this configuration on a machine whose sandboxes run with `runtime`:
/// `defaultPool` on the template `base`, and `codeInterpreterPool` on `code-interpreter-v1`
/// when `oka-interpreter` is installed, each on its image when `templates.images` names one;
/// outbound only where `outbound_available`.
fn default_pools(
    config: &Config,
    runtime: &OpenedRuntime,
    outbound_available: bool,
) -> Vec<crate::templates::DefaultPool> {
    use crate::templates::{DefaultPool, definition};
    let mut pools = Vec::new();
    if config.default_pool.enabled {
        let command = if runtime.agent_runtime { &[][..] } else { crate::pool::IDLE_COMMAND };
        let mut pool = config.default_pool.clone();
        pool.outbound &= outbound_available;
        pools.push(DefaultPool {
            config: pool,
            command: command.iter().map(|c| (*c).to_owned()).collect(),
            definition: &definition::BASE,
            image: config.templates.image(definition::BASE.name).map(str::to_owned),
            pull_secrets: config.templates.image_pull_secrets.clone(),
        });
    }
    if config.code_interpreter_pool.enabled && runtime.interpreter.is_some() {
        let command = oka_runtime::local::tool_path(INTERPRETER_TOOL).display().to_string();
        let mut pool = config.code_interpreter_pool.pool();
        pool.outbound &= outbound_available;
        pools.push(DefaultPool {
            config: pool,
            command: vec![command],
            definition: &definition::CODE_INTERPRETER,
            image: config.templates.image(definition::CODE_INTERPRETER.name).map(str::to_owned),
            pull_secrets: config.templates.image_pull_secrets.clone(),
        });
    }
    pools
}

/// Opens the local runtime when enabled and possible; `None` (with a warning saying why) when
/// sandboxes cannot run here. A runtime that is possible but fails to open is an error.
/// The name of the code interpreter server among the runtime's tools (`/.oka/interpreter`).
const INTERPRETER_TOOL: &str = "interpreter";

/// The local runtime `oka serve` runs sandboxes with.
pub(crate) struct OpenedRuntime {
    pub(crate) runtime: Arc<dyn Runtime>,
    /// Sandboxes can run the code interpreter server: the `oka-interpreter` found.
    interpreter: Option<std::path::PathBuf>,
    /// Sandboxes run the agent runtime (`oka-envd` was found).
    agent_runtime: bool,
}

pub(crate) async fn open_runtime(
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
    // Every `oka serve` on this machine gets a subnet of its own for outbound sandboxes.
    local_config.outbound_subnet = oka_runtime::local::network::claim_subnet(
        &local_config.state_dir,
        std::path::Path::new(oka_runtime::local::network::SUBNET_REGISTRY),
    )
    .context("cannot choose a subnet for outbound sandboxes")?;
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
        interpreter,
        agent_runtime,
    }))
}

/// Probes the optional features once (blocking work on the blocking pool): what the runtime,
/// if open, can offer. Step 3½ of the flow: after the runtime opens, before anything serves.
pub(crate) async fn probe_features(
    config: &Config,
    runtime: Option<&OpenedRuntime>,
) -> anyhow::Result<oka_runtime_api::features::Probes> {
    let runtime_state = match runtime {
        Some(_) => Ok(()),
        None if !config.runtime.enabled => {
            Err("the local runtime is disabled by the config".to_owned())
        }
        None => Err("not running as root".to_owned()),
    };
    let interpreter = runtime.and_then(|r| r.interpreter.clone());
    tokio::task::spawn_blocking(move || {
        oka_runtime::local::features::probe(runtime_state, None, interpreter.as_deref())
    })
    .await
    .context("the feature probe panicked")
}

/// The runtime's cgroup name: one per state directory, so two `oka serve` on different state
/// directories never take each other's sandbox cgroups for leftovers.
pub(crate) fn cgroup_name(state_dir: &std::path::Path) -> String {
    let path = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_owned());
    // FNV is stable across runs and builds (unlike std's hasher).
    format!("oka-{:08x}", fnv1_32(path.as_os_str().as_encoded_bytes()))
}

/// Installs SIGTERM and SIGINT handlers now; the returned future resolves on the first signal.
pub(crate) fn shutdown_signal() -> anyhow::Result<impl Future<Output = anyhow::Result<()>>> {
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
