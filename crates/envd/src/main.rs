//! The `oka-envd` binary: the envd-compatible daemon as a plain process (or a sidecar).

use clap::Parser;
use std::net::{IpAddr, SocketAddr};

/// An envd-compatible in-sandbox daemon (the E2B SDKs' process and filesystem API).
#[derive(Parser, Debug)]
#[command(name = "oka-envd", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0", env = "OKA_ENVD_ADDR")]
    addr: IpAddr,
    /// Port to listen on.
    #[arg(long, default_value_t = oka_envd::DEFAULT_PORT, env = "OKA_ENVD_PORT")]
    port: u16,
    /// Default user of processes and file operations (falls back to root if it does not exist).
    #[arg(long, default_value = "user")]
    user: String,
    /// Sandbox id, exported to processes as E2B_SANDBOX_ID.
    #[arg(long, env = "E2B_SANDBOX_ID")]
    sandbox_id: Option<String>,
    /// Template id, exported to processes as E2B_TEMPLATE_ID.
    #[arg(long, env = "E2B_TEMPLATE_ID")]
    template_id: Option<String>,
    /// passwd file to look users up in.
    #[arg(long, default_value = "/etc/passwd", hide = true)]
    passwd: std::path::PathBuf,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OKA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oka-envd: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let config = oka_envd::Config {
        default_user: args.user,
        passwd: args.passwd,
        sandbox_id: args.sandbox_id,
        template_id: args.template_id,
        ..Default::default()
    };
    let addr = SocketAddr::new(args.addr, args.port);
    let result = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, version = oka_envd::ENVD_VERSION, "oka-envd listening");
        let shutdown = async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return std::future::pending().await,
                };
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        };
        oka_envd::serve(listener, oka_envd::AppState::new(config), shutdown).await
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oka-envd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
