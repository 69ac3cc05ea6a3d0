//! Shared fixtures: an embedded store, sandboxes in it, real upstream servers on loopback, a
//! dialer that maps sandbox ports to them, a running gateway, and a small HTTP/1.1 client.
#![allow(dead_code, clippy::unwrap_used)]

pub mod idp;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use oka_api::{Sandbox, SandboxPhase, labels};
use oka_gateway::{DialError, Dialer, Gateway, GatewayConfig};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};

/// The sandbox domain of the tests.
pub const DOMAIN: &str = "oka.test";

/// A store on a temp dir (the dir lives as long as the returned guard).
pub fn store() -> (EmbeddedStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    (store, dir)
}

/// A claimed sandbox `default/{name}` with public ID `id`, phase Running and Ready.
pub fn running(name: &str, id: &str) -> Sandbox {
    Sandbox::test()
        .name(name)
        .claimed()
        .label(labels::SANDBOX_ID, id)
        .phase(SandboxPhase::Running)
        .ready()
        .build()
}

/// Creates `sandbox` (with its status) in the store.
pub async fn create(store: &EmbeddedStore, sandbox: &Sandbox) -> Sandbox {
    let mut fresh = sandbox.clone();
    fresh.metadata.uid = None;
    let created = store.create("default", &fresh).await.unwrap();
    set_status(store, created, sandbox.status.clone().unwrap_or_default()).await
}

/// Replaces the status of `sandbox`.
pub async fn set_status(
    store: &EmbeddedStore,
    mut sandbox: Sandbox,
    status: oka_api::SandboxStatus,
) -> Sandbox {
    sandbox.status = Some(status);
    sandbox.metadata.resource_version = None;
    store.update_status("default", &sandbox).await.unwrap()
}

/// A status: phase Running, Ready=True since now.
pub fn running_status() -> oka_api::SandboxStatus {
    oka_api::SandboxStatus {
        phase: Some(SandboxPhase::Running),
        conditions: Some(vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Resumed".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::now()),
        }]),
        ..Default::default()
    }
}

/// Maps (sandbox name, port) to a loopback address; unmapped sandboxes have no instance.
#[derive(Default, Clone)]
pub struct MapDialer {
    routes: Arc<Mutex<HashMap<(String, u16), SocketAddr>>>,
    /// Dials made, for tests that check none happened.
    pub dials: Arc<std::sync::atomic::AtomicUsize>,
}

impl MapDialer {
    pub fn map(&self, sandbox: &str, port: u16, addr: SocketAddr) {
        self.routes.lock().unwrap().insert((sandbox.to_owned(), port), addr);
    }
}

impl Dialer for MapDialer {
    fn dial<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, Result<TcpStream, DialError>> {
        Box::pin(async move {
            self.dials.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let name = sandbox.metadata.name.clone().unwrap_or_default();
            let addr = {
                let routes = self.routes.lock().unwrap();
                if !routes.keys().any(|(n, _)| *n == name) {
                    return Err(DialError::SandboxGone(name));
                }
                routes.get(&(name, port)).copied()
            };
            // An unmapped port of a known sandbox: a real refused connect on a closed port.
            let addr = match addr {
                Some(addr) => addr,
                None => closed_port().await,
            };
            TcpStream::connect(addr).await.map_err(|e| DialError::from_connect(port, e))
        })
    }
}

/// An address nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// What the upstream HTTP server saw of a request, echoed as JSON by `/echo…`.
pub fn seen(request: &Request<Incoming>) -> serde_json::Value {
    let header = |name: &str| request.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
    serde_json::json!({
        "path": request.uri().to_string(),
        "host": header("host"),
        "accessToken": header("x-access-token"),
        "trafficToken": header("e2b-traffic-access-token"),
        "sandboxIdHeader": header("e2b-sandbox-id"),
    })
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(body: impl Into<Bytes>) -> UpBody {
    Full::new(body.into()).boxed()
}

/// A real HTTP/1.1 upstream ("inside the sandbox"):
/// - `/stream`: sends `first`, waits until `release` is notified, then sends `second`;
/// - `/echo-stream`: echoes each request body frame as a response frame as it arrives;
/// - `/big?n=BYTES`: `n` bytes in 64 KiB frames;
/// - `/small`: a fixed 12-byte JSON body (the benchmark's small response);
/// - anything else: [`seen`] as JSON.
pub struct Upstream {
    pub addr: SocketAddr,
    pub release: Arc<Notify>,
    pub requests: Arc<std::sync::atomic::AtomicUsize>,
}

pub async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let release = Arc::new(Notify::new());
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (release2, requests2) = (Arc::clone(&release), Arc::clone(&requests));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            stream.set_nodelay(true).unwrap();
            let (release, requests) = (Arc::clone(&release2), Arc::clone(&requests2));
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let release = Arc::clone(&release);
                    requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move { Ok::<_, Infallible>(answer(request, release).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream { addr, release, requests }
}

async fn answer(request: Request<Incoming>, release: Arc<Notify>) -> Response<UpBody> {
    let path = request.uri().path().to_owned();
    match path.as_str() {
        "/stream" => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            tokio::spawn(async move {
                tx.send(Ok(Frame::data(Bytes::from_static(b"first")))).await.unwrap();
                release.notified().await;
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"second")))).await;
            });
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            Response::new(StreamBody::new(stream).boxed())
        }
        "/echo-stream" => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            let mut body = request.into_body();
            tokio::spawn(async move {
                while let Some(Ok(frame)) = body.frame().await {
                    if let Ok(data) = frame.into_data()
                        && tx.send(Ok(Frame::data(data))).await.is_err()
                    {
                        return;
                    }
                }
            });
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            Response::new(StreamBody::new(stream).boxed())
        }
        "/small" => {
            let mut response = Response::new(full(Bytes::from_static(b"{\"ok\":true}\n")));
            response.headers_mut().insert("content-type", "application/json".parse().unwrap());
            response
        }
        "/big" => {
            let n: usize = request
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("n="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let chunk = Bytes::from(vec![7u8; 64 * 1024]);
            let stream = futures::stream::unfold(n, move |left| {
                let chunk = chunk.clone();
                async move {
                    (left > 0).then(|| {
                        let take = left.min(chunk.len());
                        (Ok::<_, Infallible>(Frame::data(chunk.slice(..take))), left - take)
                    })
                }
            });
            Response::new(StreamBody::new(stream).boxed())
        }
        _ => {
            let mut response = Response::new(full(seen(&request).to_string()));
            response.headers_mut().insert("content-type", "application/json".parse().unwrap());
            response
        }
    }
}

/// A WebSocket echo server ("inside the sandbox").
pub async fn ws_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                use futures::{SinkExt, StreamExt};
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                while let Some(Ok(message)) = ws.next().await {
                    if message.is_close() {
                        break;
                    }
                    if ws.send(message).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A gateway served on a loopback port; stops when dropped.
pub struct Running {
    pub gateway: Gateway<EmbeddedStore>,
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops serving and waits for the server to return.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub fn config() -> GatewayConfig {
    let mut config = GatewayConfig::new(DOMAIN);
    config.wake_timeout = Duration::from_secs(20);
    config.drain_timeout = Duration::from_secs(2);
    config
}

pub async fn gateway(store: &EmbeddedStore, dialer: &MapDialer, config: GatewayConfig) -> Running {
    let gateway = Gateway::start(store.clone(), config, Arc::new(dialer.clone()));
    gateway.wait_ready().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = gateway.clone();
    let task = tokio::spawn(async move {
        oka_gateway::serve(listener, served, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running { gateway, addr, stop: Some(stop), task: Some(task) }
}

/// A response: status, headers, body.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends one HTTP/1.1 request on a new connection to `addr`.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut request = Request::builder().method(method).uri(path).header("host", host);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes().to_vec();
    Answer { status: parts.status.as_u16(), headers: parts.headers, body }
}

/// `GET path` with `host`.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Answer {
    send(addr, "GET", host, path, &[], "").await
}

/// Polls `check` every 10 ms until it holds, failing after 10 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
