//! `oka serve`: the whole platform in one process on the embedded store.
//!
//! # Expected flow
//!
//! 1. Take the state directory's instance lock, or refuse to start and name the holder.
//! 2. Open the embedded store (`<state dir>/store.redb`); this loads every object into memory.
//! 3. Start the controllers; each lists and watches the store and converges what it finds, so
//!    a restart after a crash picks up where the last run stopped.
//! 4. Print what is served and where, then wait for SIGTERM or SIGINT.
//! 5. On a signal: controllers stop taking work and finish what is in flight (bounded by
//!    [`SHUTDOWN_GRACE`]), the store commits what is queued and closes, the lock is released.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context as _;
use oka_controller::sandboxclaim::run_sandbox_claim_controller;
use oka_controller::{Clock, Config as ControllerConfig};
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
    let store_path = config.state_dir.join("store.redb");
    let options =
        EmbeddedOptions { history_size: config.store.watch_history, ..EmbeddedOptions::default() };
    let store = EmbeddedStore::open(&store_path, options)
        .with_context(|| format!("cannot open the store in {}", config.state_dir.display()))?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            // An error means the sender is gone, which also means stop.
            let _ = rx.wait_for(|stop| *stop).await;
        })
    };

    let mut controllers = tokio::task::JoinSet::new();
    controllers.spawn(run_sandbox_claim_controller(
        store.clone(),
        ControllerConfig::default().workers(config.controllers.sandbox_claim_workers.max(1)),
        Clock::system(),
        stopped(stop_rx.clone()),
    ));

    info!(
        state_dir = %config.state_dir.display(),
        store = %store_path.display(),
        resource_version = %store.resource_version(),
        controllers = "sandboxclaim",
        "oka serve is running; stop it with SIGTERM or Ctrl-C"
    );
    let result = shutdown.await;
    info!("shutting down: finishing in-flight work");
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while controllers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(grace = ?SHUTDOWN_GRACE, "controllers did not finish in time; aborting them");
        controllers.shutdown().await;
    }
    store.close().context("the store did not close cleanly")?;
    info!("stopped");
    result
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
