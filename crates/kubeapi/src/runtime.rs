//! Where the Kubernetes-compatible API runs: two threads below normal priority (nice 10), apart
//! from the data plane (the E2B API, the gateway, the controllers). The management plane yields
//! to it: a burst of claims keeps the CPU while the watchers it wakes are fed, and they catch up
//! as soon as it ends; kubectl answers a little later under load, never the other way round.

use std::future::Future;
use std::sync::OnceLock;

use axum::Router;

use crate::tls::{Tls, TlsListener};

/// The niceness of the API's threads.
const NICE: i32 = 10;

/// The API's runtime; the caller's when its threads cannot be started.
pub fn background() -> tokio::runtime::Handle {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-api")
            .on_thread_start(|| {
                // Best effort: at normal priority the API only competes more.
                let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), NICE);
            })
            .enable_all()
            .build()
            .ok()
    });
    match runtime {
        Some(runtime) => runtime.handle().clone(),
        None => tokio::runtime::Handle::current(),
    }
}

/// Serves `app` over TLS on `listener` on the API's runtime until `stop` resolves.
pub fn serve_tls(
    listener: std::net::TcpListener,
    tls: &Tls,
    app: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let tls = tls.clone();
    background().spawn(async move {
        listener.set_nonblocking(true)?;
        let listener = TlsListener::new(tokio::net::TcpListener::from_std(listener)?, &tls)?;
        axum::serve(listener, app).with_graceful_shutdown(stop).await
    })
}

/// Serves `app` over plain HTTP on `listener` on the API's runtime until `stop` resolves (for
/// loopback: kubectl sends no token over plain HTTP).
pub fn serve_plain(
    listener: std::net::TcpListener,
    app: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    background().spawn(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        axum::serve(listener, app).with_graceful_shutdown(stop).await
    })
}
