//! `oka`: the sandbox platform for AI agents, in one binary.
//!
//! `oka serve` runs the whole platform on one machine on the embedded store; `oka reset` ends
//! the sandboxes of a state directory and removes its state; `oka crds` prints the
//! CustomResourceDefinitions for a Kubernetes cluster.

mod builds;
mod claimer;
mod cluster;
mod config;
mod egress;
mod features;
mod images;
mod lock;
mod observe;
mod platform;
mod pool;
mod reset;
mod rootfs;
mod serve;
mod templates;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{Config, LogFormat};

/// mimalloc rather than glibc's allocator: `oka serve` allocates and frees many small objects
/// per claim (JSON trees, store entries, HTTP buffers) across threads (`docs/benchmarks.md`,
/// "oka serve, end to end").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The oka sandbox platform.
#[derive(Debug, Parser)]
#[command(name = "oka", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole platform on this machine: the embedded store and the controllers.
    ///
    /// Sandboxes outlive `oka serve`: when it stops (even by `kill -9`) they keep running, and
    /// the next `oka serve` on the same state directory takes them over. `oka reset` ends them.
    Serve(ServeArgs),
    /// Stop every sandbox of a state directory and remove its state (store, API keys, templates,
    /// snapshots), while `oka serve` is down. Asks first, unless --yes.
    Reset(reset::ResetArgs),
    /// Print the CustomResourceDefinitions of agents.kruise.io/v1alpha1 as YAML.
    Crds,
    /// On a cluster: the controllers, one replica leading (a coordination.k8s.io Lease).
    Controller(ClusterArgs),
    /// On a cluster: the E2B API (any number of replicas).
    Manager(ClusterArgs),
    /// On a cluster: the gateway to ports inside sandboxes (any number of replicas).
    Gateway(ClusterArgs),
    /// On a cluster: the node agent, which runs this machine's sandboxes (one per machine).
    Node(ClusterArgs),
    /// Root filesystems for sandbox templates.
    #[command(subcommand)]
    Rootfs(RootfsCommand),
    /// The default templates' roots (`base`, `code-interpreter-v1`): Debian, built once.
    #[command(subcommand)]
    Templates(templates::TemplatesCommand),
}

#[derive(Debug, Subcommand)]
enum RootfsCommand {
    /// Build a Debian minbase root filesystem with debootstrap (needs root and debootstrap).
    Build(rootfs::BuildArgs),
}

/// Flags of `oka serve`; each overrides the config file.
#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// A YAML config file; without one every setting has its default.
    #[arg(long, short = 'c', env = "OKA_CONFIG")]
    config: Option<PathBuf>,
    /// Where the store and the instance lock live [default: /var/lib/oka as root, else
    /// ~/.local/state/oka].
    #[arg(long, env = "OKA_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, env = "OKA_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    /// Where traces go: none, otel (OTLP/gRPC), otel-http (OTLP/HTTP), std or file.
    #[arg(long)]
    tracing_mode: Option<String>,
    /// The OTLP collector's address (no scheme: https://, or http:// with --tracing-insecure).
    #[arg(long)]
    tracing_endpoint: Option<String>,
    /// The share of requests traced, from 0 to 1.
    #[arg(long)]
    tracing_sampling_ratio: Option<f64>,
    /// Plain text to the collector.
    #[arg(long)]
    tracing_insecure: bool,
    /// The file mode `file` appends spans to.
    #[arg(long)]
    tracing_file: Option<PathBuf>,
    /// API-key quotas in a Redis shared by several managers (`host:port`; credentials from
    /// QUOTA_REDIS_USERNAME and QUOTA_REDIS_PASSWORD) [default: the embedded ledger].
    #[arg(long)]
    quota_redis_addr: Option<String>,
    /// The Redis database [default: 0].
    #[arg(long)]
    quota_redis_db: Option<i64>,
    /// The bound of an admission's Redis call; over it the create fails open [default: 50ms].
    #[arg(long, value_parser = go_duration)]
    quota_redis_operation_timeout: Option<std::time::Duration>,
    /// Consecutive Redis failures that open the circuit breaker [default: 3].
    #[arg(long)]
    quota_redis_breaker_max_failures: Option<u32>,
    /// How long the circuit breaker stays open [default: 30s].
    #[arg(long, value_parser = go_duration)]
    quota_redis_breaker_open_duration: Option<std::time::Duration>,
    /// How often the quota counters are checked against the store [default: 5m].
    #[arg(long, value_parser = go_duration)]
    quota_anti_drift_interval: Option<std::time::Duration>,
    /// How long a count no sandbox holds is kept before it is released [default: 10m].
    #[arg(long, value_parser = go_duration)]
    quota_anti_drift_grace: Option<std::time::Duration>,
}

/// Flags of the cluster components; each overrides the config file.
#[derive(Debug, clap::Args)]
struct ClusterArgs {
    /// A YAML config file (the format of `oka serve`'s, with its `cluster` section).
    #[arg(long, short = 'c', env = "OKA_CONFIG")]
    config: Option<PathBuf>,
    /// The kubeconfig of the API server [default: $KUBECONFIG, ~/.kube/config, or the Pod's
    /// service account].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where the node agent keeps its sandboxes' state.
    #[arg(long, env = "OKA_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// `oka node`: this node's name (`cluster.node.name`; a DaemonSet passes the Kubernetes
    /// node's name).
    #[arg(long, env = "OKA_NODE_NAME")]
    node_name: Option<String>,
    /// `oka node`: the relay address the others dial (`cluster.node.relayAddress`; a DaemonSet
    /// passes its Pod's IP and the relay port).
    #[arg(long, env = "OKA_NODE_RELAY_ADDRESS")]
    relay_address: Option<String>,
    /// Log format.
    #[arg(long, value_enum, env = "OKA_LOG_FORMAT")]
    log_format: Option<LogFormat>,
}

/// A Go duration flag (`50ms`, `5m`).
fn go_duration(text: &str) -> Result<std::time::Duration, String> {
    oka_api::parse_go_duration(text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    // Multi-call: the runtime starts this same binary as `oka-init`, PID 1 of each sandbox.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name().is_some_and(|n| n == "oka-init") {
        std::process::exit(oka_runtime::init::main());
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crds => print_stdout(&oka_api::crds_yaml()),
        Command::Serve(args) => run_serve(args),
        Command::Controller(args) => run_cluster(cluster::Component::Controller, args),
        Command::Manager(args) => run_cluster(cluster::Component::Manager, args),
        Command::Gateway(args) => run_cluster(cluster::Component::Gateway, args),
        Command::Node(args) => run_cluster(cluster::Component::Node, args),
        Command::Reset(args) => reset::reset(&args),
        Command::Rootfs(RootfsCommand::Build(args)) => rootfs::build(&args),
        Command::Templates(command) => run_templates(&command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes `text` to stdout; a closed pipe (`oka crds | head`) is not an error.
fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn run_serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = Config::load(args.config.as_deref())?;
    if let Some(dir) = args.state_dir {
        config.state_dir = dir;
    }
    if let Some(format) = args.log_format {
        config.log.format = format;
    }
    if let Some(mode) = args.tracing_mode {
        config.tracing.mode = mode;
    }
    if let Some(endpoint) = args.tracing_endpoint {
        config.tracing.endpoint = endpoint;
    }
    if let Some(ratio) = args.tracing_sampling_ratio {
        config.tracing.sampling_ratio = ratio;
    }
    if args.tracing_insecure {
        config.tracing.insecure = true;
    }
    if let Some(file) = args.tracing_file {
        config.tracing.file = Some(file);
    }
    let quota = &mut config.quota;
    if let Some(addr) = args.quota_redis_addr.filter(|a| !a.is_empty()) {
        quota.redis_addr = Some(addr);
    }
    quota.redis_db = args.quota_redis_db.unwrap_or(quota.redis_db);
    let keep = |flag: Option<std::time::Duration>, value: &mut std::time::Duration| {
        if let Some(flag) = flag {
            *value = flag;
        }
    };
    keep(args.quota_redis_operation_timeout, &mut quota.redis_operation_timeout);
    keep(args.quota_redis_breaker_open_duration, &mut quota.redis_breaker_open_duration);
    keep(args.quota_anti_drift_interval, &mut quota.anti_drift_interval);
    keep(args.quota_anti_drift_grace, &mut quota.anti_drift_grace);
    quota.redis_breaker_max_failures =
        args.quota_redis_breaker_max_failures.unwrap_or(quota.redis_breaker_max_failures);
    anyhow::ensure!(
        !quota.redis_operation_timeout.is_zero(),
        "--quota-redis-operation-timeout must be more than 0"
    );
    init_logging(&config)?;
    if config.cluster != config::ClusterConfig::default() {
        tracing::warn!(
            "the configuration's cluster section is for oka controller, manager, gateway and \
             node; oka serve does not use it"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve::serve(config))
}

/// `oka templates`, logging its progress to stderr.
fn run_templates(command: &templates::TemplatesCommand) -> anyhow::Result<()> {
    if matches!(command, templates::TemplatesCommand::Build(_)) {
        init_logging(&Config::default())?;
    }
    templates::run(command)
}

fn run_cluster(component: cluster::Component, args: ClusterArgs) -> anyhow::Result<()> {
    let mut config = Config::load(args.config.as_deref())?;
    if let Some(path) = args.kubeconfig {
        config.cluster.kubeconfig = Some(path);
    }
    if let Some(dir) = args.state_dir {
        config.state_dir = dir;
    }
    if let Some(name) = args.node_name.filter(|n| !n.is_empty()) {
        config.cluster.node.name = Some(name);
    }
    if let Some(address) = args.relay_address.filter(|a| !a.is_empty()) {
        config.cluster.node.relay_address = Some(address);
    }
    if let Some(format) = args.log_format {
        config.log.format = format;
    }
    init_logging(&config)?;
    // The API server's client futures are deep; the default 2 MiB worker stacks are not
    // enough for them in unoptimised builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()?;
    runtime.block_on(cluster::run(component, config))
}

/// Logs to stderr, as text or JSON; `RUST_LOG` overrides the configured filter.
fn init_logging(config: &Config) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::try_new(&config.log.filter)?,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match config.log.format {
        // Colour only for a person at a terminal: a log file or journal gets plain text.
        LogFormat::Text => {
            use std::io::IsTerminal as _;
            let colour = std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal();
            builder.with_ansi(colour).try_init()
        }
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}
