//! `oka-interpreter`: the code-interpreter server for port 49999 of a sandbox.

use clap::Parser;
use oka_interpreter::kernel::lookup_user;
use oka_interpreter::server::{self, AppState, Config, KernelUser};
use std::path::PathBuf;
use std::time::Duration;

/// An e2b-code-interpreter-compatible server backed by Jupyter kernels.
#[derive(Parser, Debug)]
#[command(name = "oka-interpreter", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:49999", env = "OKA_INTERPRETER_LISTEN")]
    listen: std::net::SocketAddr,
    /// envd's base URL (for `GET /envs`: global env vars and the access-token check).
    #[arg(long, default_value = "http://127.0.0.1:49983", env = "OKA_INTERPRETER_ENVD_URL")]
    envd_url: String,
    /// The account kernels run as (default: `user` if /etc/passwd has it, else the current user).
    #[arg(long, env = "OKA_INTERPRETER_KERNEL_USER")]
    kernel_user: Option<String>,
    /// The working directory of contexts that name none (default: the kernel user's home).
    #[arg(long, env = "OKA_INTERPRETER_CWD")]
    cwd: Option<PathBuf>,
    /// Seconds a kernel may take to start.
    #[arg(long, default_value_t = 60)]
    start_timeout: u64,
    /// Do not start the default python kernel at start-up.
    #[arg(long)]
    lazy: bool,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot build the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn kernel_user(name: Option<&str>) -> Result<Option<KernelUser>, String> {
    let passwd = std::path::Path::new("/etc/passwd");
    let name = match name {
        Some(n) => n,
        None if lookup_user(passwd, "user").is_some() => "user",
        None => return Ok(None),
    };
    let (uid, gid, home) =
        lookup_user(passwd, name).ok_or_else(|| format!("no user {name:?} in /etc/passwd"))?;
    Ok(Some(KernelUser { name: name.to_owned(), uid, gid, home }))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let user = kernel_user(args.kernel_user.as_deref())?;
    let default_cwd = match (&args.cwd, &user) {
        (Some(c), _) => c.clone(),
        (None, Some(u)) if u.home.is_dir() => u.home.clone(),
        _ => std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from),
    };
    let config = Config {
        envd_url: args.envd_url,
        kernel_user: user,
        default_cwd,
        start_timeout: Duration::from_secs(args.start_timeout),
        eager_python: !args.lazy,
    };
    tracing::info!(
        listen = %args.listen,
        envd = %config.envd_url,
        user = ?config.kernel_user.as_ref().map(|u| &u.name),
        cwd = %config.default_cwd.display(),
        "oka-interpreter starting"
    );
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let state = AppState::new(config.clone());
    if config.eager_python {
        state.warm_up();
    }
    let shutdown = async {
        let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        tracing::info!("shutting down");
    };
    server::serve(listener, state, shutdown).await?;
    Ok(())
}
