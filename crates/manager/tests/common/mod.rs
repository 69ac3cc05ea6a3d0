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
    let (store, dir) = store();
    let set = create_pool(&store, "default", "base").await;
    stock(&store, &set, members).await;
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    wait_members(&index, "default", "base", members).await;
    let config =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(KEY).unwrap());
    let state = oka_manager::api::AppState::new(store.clone(), Arc::clone(&index), config);
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
