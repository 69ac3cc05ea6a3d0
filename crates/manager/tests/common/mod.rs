//! Shared fixtures: an embedded store on a temp dir, stocked with a warm pool.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use oka_api::{Sandbox, SandboxPhase, SandboxSet, SandboxSetSpec, SandboxSetStatus};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};

/// A store on a temp dir (the dir lives as long as the returned guard).
pub fn store() -> (EmbeddedStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    (store, dir)
}

/// Creates the SandboxSet `namespace/name` (status `updateRevision: rev-1`).
pub async fn create_pool(store: &EmbeddedStore, namespace: &str, name: &str) -> SandboxSet {
    let mut set = SandboxSet::new(name, SandboxSetSpec { replicas: 0, ..Default::default() });
    set.metadata.namespace = Some(namespace.into());
    let mut set = store.create(namespace, &set).await.unwrap();
    set.status =
        Some(SandboxSetStatus { update_revision: Some("rev-1".into()), ..Default::default() });
    store.update_status(namespace, &set).await.unwrap()
}

/// Creates `count` available members of `set` directly in the store: pool labels, controller
/// ownerReference, phase Running and Ready (no runtime involved).
pub async fn stock(store: &EmbeddedStore, set: &SandboxSet, count: usize) -> Vec<Sandbox> {
    stock_range(store, set, 0..count).await
}

/// Like [`stock`], for members numbered `range` (so several tasks can stock one pool).
pub async fn stock_range(
    store: &EmbeddedStore,
    set: &SandboxSet,
    range: std::ops::Range<usize>,
) -> Vec<Sandbox> {
    let namespace = set.metadata.namespace.clone().unwrap();
    let pool = set.metadata.name.clone().unwrap();
    let mut made = Vec::new();
    for i in range {
        let mut sandbox = Sandbox::test()
            .name(&format!("{pool}-{i:04}"))
            .namespace(&namespace)
            .pooled(&pool)
            .label(oka_api::labels::TEMPLATE_HASH, "rev-1")
            .phase(SandboxPhase::Running)
            .ready()
            .build();
        sandbox.metadata.uid = None;
        if let Some(owner) = sandbox.metadata.owner_references.as_mut().and_then(|o| o.first_mut())
        {
            owner.uid = set.metadata.uid.clone().unwrap();
        }
        let status = sandbox.status.clone();
        let mut created = store.create(&namespace, &sandbox).await.unwrap();
        created.status = status;
        made.push(store.update_status(&namespace, &created).await.unwrap());
    }
    made
}

/// Waits until the index shows `count` members of the pool.
pub async fn wait_members(
    index: &Arc<oka_manager::Index>,
    namespace: &str,
    pool: &str,
    count: usize,
) {
    for _ in 0..500 {
        if index.pool_members(namespace, pool).len() == count {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the index never showed {count} members of {namespace}/{pool}");
}

/// The admin key the API tests configure.
pub const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

/// A running API over a stocked pool `default/base` of `members` sandboxes.
pub struct Api {
    pub store: EmbeddedStore,
    pub index: Arc<oka_manager::Index>,
    pub router: axum::Router,
    _dir: tempfile::TempDir,
}

pub async fn api(members: usize) -> Api {
    api_with(members, |_| {}).await
}

/// [`api`] with the configuration changed by `configure`.
pub async fn api_with(
    members: usize,
    configure: impl FnOnce(&mut oka_manager::api::ManagerConfig),
) -> Api {
    api_with_state(members, configure, |state| state).await
}

/// [`api_with`], with the state changed by `state` (an initializer, routes) too.
pub async fn api_with_state(
    members: usize,
    configure: impl FnOnce(&mut oka_manager::api::ManagerConfig),
    with: impl FnOnce(
        oka_manager::api::AppState<EmbeddedStore>,
    ) -> oka_manager::api::AppState<EmbeddedStore>,
) -> Api {
    let (store, dir) = store();
    let set = create_pool(&store, "default", "base").await;
    stock(&store, &set, members).await;
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    wait_members(&index, "default", "base", members).await;
    let mut config =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(KEY).unwrap());
    configure(&mut config);
    let state = with(oka_manager::api::AppState::new(store.clone(), Arc::clone(&index), config));
    Api { store, index, router: oka_manager::api::app(state), _dir: dir }
}

/// A minimal HTTP/1.1 keep-alive client over one connection (hyper's client handshake).
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<axum::body::Bytes>>,
    pub authority: String,
}

impl Client {
    pub async fn connect(addr: std::net::SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        Self { sender, authority: addr.to_string() }
    }

    /// Sends one request; returns status, headers and body bytes.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (http::StatusCode, http::HeaderMap, Vec<u8>) {
        use http_body_util::BodyExt;
        self.sender.ready().await.unwrap();
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.authority)
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(axum::body::Bytes::from(
                body.unwrap_or_default().to_owned(),
            )))
            .unwrap();
        let response = self.sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes().to_vec();
        (parts.status, parts.headers, bytes)
    }
}

fn condition(
    type_: &str,
    status: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "StandIn".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ),
    }
}

/// A stand-in for the sandbox controller (the real one needs the node runtime): follows the
/// store's watch; a sandbox without a status starts (phase Running, `Ready=True`; or phase
/// Failed when `start_fails`); a sandbox with `spec.paused` goes to phase Paused with
/// `SandboxPaused=True` and `Ready=False`; a Paused one without it goes back to Running and
/// Ready, as `crates/controller/src/sandbox.rs` reports them. Aborted on drop.
pub struct StandInController(tokio::task::JoinHandle<()>);

impl Drop for StandInController {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn stand_in_controller(store: &EmbeddedStore) -> StandInController {
    stand_in_controller_with(store, false)
}

/// [`stand_in_controller`]; new sandboxes fail to start when `start_fails`.
pub fn stand_in_controller_with(store: &EmbeddedStore, start_fails: bool) -> StandInController {
    use futures::StreamExt;
    use oka_api::conditions::{
        self,
        sandbox::{PAUSED, READY},
    };
    let store = store.clone();
    StandInController(tokio::spawn(async move {
        let everything = oka_store::Selector::everything();
        let mut events = store.watch::<Sandbox>(None, &everything, "").await.unwrap();
        let list = store.list::<Sandbox>(None, &everything).await.unwrap();
        let mut pending: Vec<Arc<Sandbox>> = list.items;
        loop {
            for sandbox in pending.drain(..) {
                let mut next = (*sandbox).clone();
                let ns = next.metadata.namespace.clone().unwrap_or_default();
                if next.status.is_none() && next.metadata.deletion_timestamp.is_none() {
                    let status = next.status.get_or_insert_default();
                    if start_fails {
                        status.phase = Some(SandboxPhase::Failed);
                        status.message = Some("stand-in start failure".into());
                    } else {
                        status.phase = Some(SandboxPhase::Running);
                        status.conditions = Some(vec![condition(READY, conditions::TRUE)]);
                    }
                    let _ = store.update_status(&ns, &next).await;
                    continue;
                }
                let Some(status) = next.status.as_mut() else { continue };
                let list = status.conditions.get_or_insert_with(Vec::new);
                let phase = status.phase.clone();
                if sandbox.is_paused() && phase == Some(SandboxPhase::Running) {
                    status.phase = Some(SandboxPhase::Paused);
                    conditions::set(list, condition(PAUSED, conditions::TRUE));
                    conditions::set(list, condition(READY, conditions::FALSE));
                } else if !sandbox.is_paused() && phase == Some(SandboxPhase::Paused) {
                    status.phase = Some(SandboxPhase::Running);
                    conditions::remove(list, PAUSED);
                    conditions::set(list, condition(READY, conditions::TRUE));
                } else {
                    continue;
                }
                // A conflict means a newer version is on its way through the watch.
                let _ = store.update_status(&ns, &next).await;
            }
            match events.next().await {
                Some(Ok(
                    oka_store::WatchEvent::Added(obj) | oka_store::WatchEvent::Modified(obj),
                )) => pending.push(obj),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    }))
}

/// One answer of the API.
pub struct Reply {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub json: serde_json::Value,
}

/// Sends one request through `router` with `key` (if any), `headers` and a JSON `body`.
pub async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Reply {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut request =
        http::Request::builder().method(method).uri(uri).header("host", "localhost:3000");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map_or_else(axum::body::Body::empty, |b| axum::body::Body::from(b.to_string()));
    let response = router.clone().oneshot(request.body(body).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
        })
    };
    Reply { status, headers, json }
}

/// [`send`] with the admin key and no extra headers.
pub async fn call(
    router: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<serde_json::Value>,
) -> Reply {
    send(router, method, uri, Some(KEY), &[], body).await
}

/// The error body without its request ID.
#[track_caller]
pub fn error_of(reply: &Reply) -> serde_json::Value {
    let mut json = reply.json.clone();
    let id = json.as_object_mut().unwrap().remove("request_id").unwrap();
    assert_eq!(id.as_str().unwrap().len(), 32, "{id}");
    json
}

/// Creates a sandbox from `default/base` with the admin key; panics unless 201.
pub async fn create(router: &axum::Router, body: serde_json::Value) -> serde_json::Value {
    let reply = call(router, "POST", "/v2/sandboxes", Some(body)).await;
    assert_eq!(reply.status, http::StatusCode::CREATED, "{}", reply.json);
    reply.json
}

pub mod redis;
