//! The traffic gateway: a streaming reverse proxy from E2B's sandbox addresses to ports inside
//! sandboxes, that wakes a paused sandbox when a request arrives for it.
//!
//! # Expected flow
//!
//! 1. [`Gateway::start`] starts the route table ([`table`]): a list+watch of Sandbox objects
//!    through the [`Store`], keyed by public sandbox ID.
//! 2. [`serve`] accepts connections (HTTP/1.1, and h2c by its preface) and hands each request
//!    to the proxy ([`proxy`] has the per-request flow): route by path, headers or host
//!    ([`route`]), authenticate by the configured mode ([`auth`]: none, the agent runtime's
//!    access token, or traffic JWTs verified against an OIDC provider's keys, [`jwt`] and
//!    [`oidc`]), wake when paused ([`wake`]), dial through the
//!    [`Dialer`], relay both bodies unbuffered, and WebSocket/`Upgrade` byte streams.
//! 3. On shutdown, [`serve`] stops accepting, asks open connections to finish their requests,
//!    and returns once they have or after [`GatewayConfig::drain_timeout`].
//!
//! # Guarantees
//!
//! - Bodies are relayed frame by frame as they arrive, in both directions: a Connect
//!   server-streaming response reaches the client message by message, and a chunked request
//!   body reaches the sandbox as it is sent.
//! - A connection (downstream, upstream, or upgraded) is closed only after
//!   [`GatewayConfig::idle_timeout`] without a byte in either direction.
//! - Concurrent requests to one paused sandbox cause at most one resume write from a gateway;
//!   the write is a compare-and-swap, so several gateways also write once between them.
//! - The route table is rebuilt from the store on start: a restarted gateway routes every
//!   claimed sandbox again.
//!
//! # Answers of its own
//!
//! See [`error`]: E2B's 502 JSON bodies for unknown sandboxes and closed ports, 400 for
//! malformed routing, 401/403/503 of the auth modes, 504 when a wake times out.

#![forbid(unsafe_code)]

pub mod activity;
pub mod auth;
pub mod dial;
pub mod error;
mod fast;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gone;
pub mod idle;
pub mod jwt;
pub mod metrics;
pub mod oidc;
pub mod proxy;
pub mod route;
pub mod table;
pub mod wake;

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use oka_api::Sandbox;
use oka_store::Store;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

pub use auth::AuthMode;
pub use dial::{DialError, Dialer};
pub use error::Reject;
pub use route::{RouteError, Target};
pub use table::RouteTable;

/// The gateway's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// The sandbox domain: `{port}-{id}.{domain}` hosts, and `sandbox.{domain}` routed by
    /// headers. Empty: any `sandbox.*` host is routed by headers.
    pub domain: String,
    /// A connection with no traffic in either direction for this long is closed. E2B keeps
    /// streams open at least 640 s.
    pub idle_timeout: Duration,
    /// How long a request waits for a paused sandbox to run again.
    pub wake_timeout: Duration,
    /// The new timeout of a sandbox woken by a request (moves its `pauseTime`).
    pub resume_timeout: Duration,
    /// How long a dial to a sandbox port may take.
    pub connect_timeout: Duration,
    /// How long a request waits for the route table's first list before a 503.
    pub ready_timeout: Duration,
    /// How long [`serve`] waits for open connections after shutdown.
    pub drain_timeout: Duration,
    /// Idle upstream connections kept per sandbox port.
    pub max_idle_per_target: usize,
    /// How long a request for an ID the route table does not know waits for it to appear: the
    /// watch's lag behind a create another process made. Zero (the default) where the manager
    /// waits for the route before it answers a create (`oka serve`); the cluster's gateway,
    /// whose managers are other processes, waits a little.
    pub unknown_wait: Duration,
    /// How traffic is authenticated ([`auth`]).
    pub auth: AuthMode,
}

impl GatewayConfig {
    /// The defaults for `domain`: idle 900 s, wake 60 s, resume timeout 300 s, connect 10 s,
    /// ready 10 s, drain 10 s, 32 idle upstream connections per sandbox port, no wait for
    /// unknown IDs, auth mode `none`.
    pub fn new(domain: impl Into<String>) -> Self {
        Self {
            domain: domain.into(),
            idle_timeout: Duration::from_secs(900),
            wake_timeout: Duration::from_secs(60),
            resume_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            ready_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
            max_idle_per_target: 32,
            unknown_wait: Duration::ZERO,
            auth: AuthMode::None,
        }
    }
}

impl Default for GatewayConfig {
    /// [`GatewayConfig::new`] with an empty domain.
    fn default() -> Self {
        Self::new("")
    }
}

pub(crate) struct Inner<S: Store> {
    pub(crate) store: S,
    pub(crate) config: GatewayConfig,
    pub(crate) dialer: Arc<dyn Dialer>,
    pub(crate) table: Arc<RouteTable>,
    /// Idle upstream connections of the hyper path.
    pub(crate) pool: proxy::Pool<proxy::Upstream>,
    /// Idle upstream connections of the HTTP/1.1 relay ([`fast`]).
    pub(crate) raw_pool: proxy::Pool<fast::RawUpstream>,
    /// Sandbox IDs this gateway is writing a resume for.
    pub(crate) resuming: Mutex<HashSet<String>>,
    /// The last request time per sandbox and port.
    pub(crate) activity: Arc<activity::Activity>,
    /// The gateway's series.
    pub(crate) metrics: Arc<metrics::GatewayMetrics>,
    /// Who answers `/healthz` and `/readyz` (requests that name no sandbox), once set.
    pub(crate) health: std::sync::OnceLock<oka_metrics::health::Health>,
    /// The traffic JWT verifier, published by [`oidc`]'s loader (mode `jwt`).
    pub(crate) jwt: Arc<oidc::JwtAuth>,
}

/// A running gateway: its route table and settings. Cheap to clone; the route table's watch
/// stops when the last clone is dropped.
pub struct Gateway<S: Store> {
    inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for Gateway<S> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<S: Store> std::fmt::Debug for Gateway<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("config", &self.inner.config)
            .field("table", &self.inner.table)
            .finish()
    }
}

impl<S: Store> Gateway<S> {
    /// Starts the route table's list+watch on the store (needs a tokio runtime; given
    /// [`oka_cache::Informers`], the process's shared Sandbox informer) and returns the gateway;
    /// serve it with [`serve`].
    pub fn start(
        informers: impl Into<oka_cache::Informers<S>>,
        config: GatewayConfig,
        dialer: Arc<dyn Dialer>,
    ) -> Self {
        let informers: oka_cache::Informers<S> = informers.into();
        let store = informers.store().clone();
        let table = RouteTable::spawn(informers);
        let metrics = Arc::new(metrics::GatewayMetrics::default());
        let dialer: Arc<dyn Dialer> =
            Arc::new(metrics::MeteredDialer { inner: dialer, metrics: Arc::clone(&metrics) });
        let inner = Arc::new(Inner {
            store,
            config,
            dialer,
            metrics,
            health: std::sync::OnceLock::new(),
            table,
            pool: proxy::Pool::default(),
            raw_pool: proxy::Pool::default(),
            resuming: Mutex::new(HashSet::new()),
            activity: Arc::new(activity::Activity::new()),
            jwt: Arc::new(oidc::JwtAuth::default()),
        });
        tokio::spawn(sweep_idle_upstreams(Arc::downgrade(&inner)));
        Self { inner }
    }

    /// Resolves once the route table holds the store's sandboxes (its first list).
    pub async fn wait_ready(&self) {
        self.inner.table.wait_ready().await;
    }

    /// The last request time per sandbox ID and port, for activity probes.
    pub fn activity(&self) -> Arc<activity::Activity> {
        Arc::clone(&self.inner.activity)
    }

    /// The sandbox routed under a public ID.
    pub fn lookup(&self, sandbox_id: &str) -> Option<Arc<Sandbox>> {
        self.inner.table.get(sandbox_id)
    }

    /// Waits until a sandbox is routed under `sandbox_id`, for at most `timeout`; whether it is.
    /// The manager waits so before it answers a create, so that the client's first request
    /// through the gateway finds the sandbox (the table follows the store's watch, a moment
    /// behind the claim's write).
    pub async fn wait_routed(&self, sandbox_id: &str, timeout: Duration) -> bool {
        self.inner.table.wait_routed(sandbox_id, timeout).await
    }

    /// Waits until the route of `sandbox_id` is at `resource_version` or newer, for at most
    /// `timeout`; whether it is ([`RouteTable::wait_version`]).
    pub async fn wait_version(
        &self,
        sandbox_id: &str,
        resource_version: &str,
        timeout: Duration,
    ) -> bool {
        self.inner.table.wait_version(sandbox_id, resource_version, timeout).await
    }

    /// How many sandboxes are routed.
    pub fn routes(&self) -> usize {
        self.inner.table.len()
    }

    /// Registers the gateway's series (and `sandbox_routes`) into `registry`.
    pub fn register_metrics(&self, registry: &mut oka_metrics::Registry) {
        let table = Arc::downgrade(&self.inner.table);
        self.inner.metrics.register(registry, move || table.upgrade().map_or(0, |t| t.len()));
    }

    /// Answers `/healthz` and `/readyz` with `health` (only requests that name no sandbox:
    /// a sandbox's own paths are its own).
    pub fn serve_health(&self, health: oka_metrics::health::Health) {
        let _ = self.inner.health.set(health);
    }

    /// Whether the route table has been listed (readiness).
    pub fn is_ready(&self) -> bool {
        self.inner.table.is_ready()
    }

    /// Starts loading the traffic JWT verifier from the identity provider of `options`
    /// (mode `jwt`; see [`oidc`]): until it is loaded, [`Gateway::jwt_ready`] is false and
    /// sandboxes requiring traffic auth are answered 503.
    pub fn start_jwt_verifier(&self, options: oidc::OidcOptions) {
        oidc::JwtAuth::spawn_loader(&self.inner.jwt, options);
    }

    /// The traffic JWT verifier's slot (to publish one directly, or read its state).
    pub fn jwt_auth(&self) -> Arc<oidc::JwtAuth> {
        Arc::clone(&self.inner.jwt)
    }

    /// Whether JWT authentication is usable: another mode, or a verifier is published
    /// (readiness, with [`Gateway::is_ready`]).
    pub fn jwt_ready(&self) -> bool {
        self.inner.config.auth != AuthMode::Jwt || self.inner.jwt.is_ready()
    }

    /// The settings.
    pub fn config(&self) -> &GatewayConfig {
        &self.inner.config
    }

    /// Keeps `stream`, an idle HTTP/1.1 connection to `port` of `sandbox` that another part of
    /// the platform opened and finished with (the manager's, after a claim's `/init`), for the
    /// next request the gateway relays to that port: that request then needs no dial. It goes
    /// where the relay's own idle connections go, under the same limits; a connection the
    /// sandbox closes meanwhile is dropped there.
    pub fn adopt_upstream(&self, sandbox: &Sandbox, port: u16, stream: tokio::net::TcpStream) {
        let meter = self.inner.metrics.upstream_bytes.clone();
        let idle = fast::RawUpstream::new(stream, self.inner.config.idle_timeout, meter);
        let key = proxy::PoolKey::of(sandbox, port);
        self.inner.raw_pool.checkin(key, idle, self.inner.config.max_idle_per_target);
    }
}

/// How often idle upstream connections the sandboxes closed are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Drops the closed idle upstream connections every [`SWEEP_EVERY`], until the gateway is gone.
async fn sweep_idle_upstreams<S: Store>(inner: std::sync::Weak<Inner<S>>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        inner.pool.sweep();
        inner.raw_pool.sweep();
        inner.activity.prune();
    }
}

/// Serves the gateway on `listener` until `shutdown` resolves, then drains open connections
/// (see [`GatewayConfig::drain_timeout`]). Errors of single connections are logged, not
/// returned.
///
/// Each connection starts on the HTTP/1.1 relay ([`fast`]); whatever it does not relay
/// (HTTP/2, WebSocket upgrades and the other cases listed there) is served by hyper for the
/// rest of the connection.
pub async fn serve<S: Store>(
    listener: TcpListener,
    gateway: Gateway<S>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    // Every connection holds a receiver: it closes when this turns true, and the drain ends
    // when all receivers are gone.
    let (stop, _) = tokio::sync::watch::channel(false);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, domain = %gateway.inner.config.domain, "gateway listening");
    }
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off a little.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        gateway.inner.metrics.connections.inc();
        let inner = Arc::clone(&gateway.inner);
        let builder = Arc::clone(&builder);
        let mut stop = stop.subscribe();
        tokio::spawn(async move {
            let io = idle::IdleIo::new(stream, inner.config.idle_timeout);
            if let fast::Outcome::Handoff(io, read) =
                fast::serve_connection(&inner, io, &mut stop).await
            {
                serve_hyper(&builder, inner, fast::Rewind::new(io, read), stop, peer).await;
            }
        });
    }
    let _ = stop.send(true);
    let drain = gateway.inner.config.drain_timeout;
    if tokio::time::timeout(drain, stop.closed()).await.is_err() {
        warn!(seconds = drain.as_secs(), "connections still open after the drain timeout");
    }
    Ok(())
}

/// Serves the rest of a connection with hyper (HTTP/1.1 with upgrades, or h2c), finishing
/// gracefully once `stop` turns true.
async fn serve_hyper<S: Store>(
    builder: &auto::Builder<TokioExecutor>,
    inner: Arc<Inner<S>>,
    io: fast::Rewind<fast::Downstream>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) {
    let service = service_fn(move |request| {
        let inner = Arc::clone(&inner);
        async move { Ok::<_, Infallible>(proxy::handle(inner, request).await) }
    });
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(connection);
    let stopping = async {
        // The guard it gives must not live across the drain below.
        let _ = stop.wait_for(|stopping| *stopping).await.map(|_| ());
    };
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stopping => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        debug!(%peer, %error, "client connection ended");
    }
}
