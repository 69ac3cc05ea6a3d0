//! `oka-envd`: an envd-compatible in-sandbox daemon.
//!
//! It serves, on one port (49983 by default), exactly what the official E2B SDKs expect from E2B's
//! own Go `envd` (e2b-protocol.md §3):
//!
//! - the Connect-RPC services `process.Process` ([`process`], [`pty`]) and `filesystem.Filesystem`
//!   ([`fs`], [`watch`]), routed in [`rpc`] and framed in [`connect`]: JSON and binary protobuf,
//!   unary, server-streaming and client-streaming calls, end-of-stream errors, `Connect-Timeout-Ms`
//!   and keepalive pings, over HTTP/1.1 (chunked) and HTTP/2 (h2c, prior knowledge);
//! - the plain endpoints `/files`, `/health`, `/init`, `/envs`, `/metrics` ([`http`]), with large
//!   `/files` transfers spliced between socket and file ([`fast`]);
//! - the access token set by `/init`, `v1_` signed file URLs and the operation user from Basic auth
//!   or `username` ([`http`], [`users`]);
//! - with `--init`, the duties of a local sandbox's PID 1 besides serving: supervising the command
//!   the sandbox init handed over, reaping orphans, forwarding SIGTERM ([`pid1`]).
//!
//! # Why hand-written messages
//!
//! The messages ([`proto`]) are plain structs deriving both `prost::Message` (binary protobuf) and
//! serde (ProtoJSON). Generating them would need `protoc` (connectrpc-build, prost-build, tonic-build)
//! or a pure-Rust proto compiler such as `protox` in a build script: both cost more build time and
//! dependencies than ~40 small messages written once, and ProtoJSON via serde keeps the wire format
//! (camelCase, omitted defaults, int64 strings, base64 bytes, enum names) visible and tested here.
//! The Connect framing is ~400 lines over axum ([`connect`]), which keeps the daemon small: one
//! current-thread tokio runtime, axum with only `http1`/`http2`/`tokio`/`query`.
//!
//! # Invariants
//!
//! - A stream's client going away never kills its process; only `SendSignal` or a Start deadline do.
//! - Every streaming response ends with exactly one end-of-stream envelope, unless the client left.
//! - Every failure becomes a protocol answer (Connect error or `{"code","message"}`), once, at the
//!   edge; handlers never panic on input.

pub mod cli;
pub mod connect;
pub mod fast;
pub mod fs;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod meta;
pub mod pid1;
pub mod pjson;
pub mod process;
pub mod proto;
pub mod pty;
pub mod rpc;
pub mod state;
pub mod users;
pub mod watch;

pub use state::{AppState, Config, ENVD_VERSION};

use axum::Router;
use axum::routing::{get, post};

/// The default port.
pub const DEFAULT_PORT: u16 = 49983;

/// The whole daemon as a router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/process.Process/{method}", post(rpc::process))
        .route("/filesystem.Filesystem/{method}", post(rpc::filesystem))
        .route("/health", get(http::health))
        .route("/init", post(http::init))
        .route("/envs", get(http::envs))
        .route("/metrics", get(http::metrics))
        .route("/files", get(http::get_file).post(http::post_file))
        .layer(axum::middleware::from_fn_with_state(state.clone(), http::require_token))
        .with_state(state)
}

/// Serves `app(state)` on `listener` (HTTP/1.1 and h2c) until `shutdown` resolves, with the
/// zero-copy path of large `/files` transfers in front of hyper ([`fast`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signal = tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let router = app(state.clone());
    let served = fast::serve(listener, state, router, stop_rx).await;
    signal.abort();
    served
}
