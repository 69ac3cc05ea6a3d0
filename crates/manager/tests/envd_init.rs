//! `EnvdInitializer` against a real `oka-envd` server on loopback.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_manager::{EnvdConnector, EnvdInitConfig, EnvdInitializer, SandboxInitializer};
use oka_store::Store as _;

/// Dials `addr` for every sandbox, after refusing the first `refuse` attempts.
struct Loopback {
    addr: SocketAddr,
    refuse: u32,
    calls: Arc<AtomicU32>,
}

impl Loopback {
    /// A connector that refuses every connect, counting them in `calls`.
    fn refusing(calls: Arc<AtomicU32>) -> Self {
        Loopback { addr: "127.0.0.1:9".parse().unwrap(), refuse: u32::MAX, calls }
    }
}

impl EnvdConnector for Loopback {
    fn connect<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        assert_eq!(port, 49983);
        Box::pin(async move {
            if self.calls.fetch_add(1, Ordering::SeqCst) < self.refuse {
                return Err(std::io::ErrorKind::ConnectionRefused.into());
            }
            tokio::net::TcpStream::connect(self.addr).await
        })
    }
}

async fn envd() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = oka_envd::AppState::new(oka_envd::Config::default());
    tokio::spawn(oka_envd::serve(listener, state, std::future::pending()));
    addr
}

/// `GET path` on envd with an optional token: (status, body).
async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let token = token.map(|t| format!("X-Access-Token: {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{token}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

fn config() -> EnvdInitConfig {
    EnvdInitConfig {
        attempt_timeout: Duration::from_secs(2),
        attempts: 5,
        first_backoff: Duration::from_millis(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_sets_env_vars_and_the_token_then_a_replay_is_accepted() {
    let addr = envd().await;
    let calls = Arc::new(AtomicU32::new(0));
    let connector = Loopback { addr, refuse: 2, calls: Arc::clone(&calls) };
    let initializer = EnvdInitializer::new(connector, config());
    let sandbox = Sandbox::test().name("s").build();
    let env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
    initializer.init(&sandbox, &env, "token-1").await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "two refused connects were retried");

    let (status, body) = get(addr, "/envs", Some("token-1")).await;
    assert_eq!(status, 200);
    let envs: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(envs["FOO"], "bar", "{body}");
    assert_eq!(get(addr, "/envs", None).await.0, 401, "requests without the token are rejected");
    assert_eq!(get(addr, "/envs", Some("wrong")).await.0, 401);

    // The replay after a resume: same token, accepted; new env vars replace the old.
    let env = BTreeMap::from([("BAZ".to_owned(), "1".to_owned())]);
    initializer.init(&sandbox, &env, "token-1").await.unwrap();
    let envs: serde_json::Value =
        serde_json::from_str(&get(addr, "/envs", Some("token-1")).await.1).unwrap();
    assert_eq!((envs.get("FOO"), &envs["BAZ"]), (None, &serde_json::json!("1")));

    // Another token: envd refuses (401), and the initializer fails at once, not after retries.
    let before = calls.load(Ordering::SeqCst);
    let error = initializer.init(&sandbox, &env, "token-2").await.unwrap_err();
    assert!(error.to_string().contains("401"), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), before + 1);
}

#[tokio::test]
async fn init_gives_up_after_its_attempts() {
    let calls = Arc::new(AtomicU32::new(0));
    let connector = Loopback::refusing(Arc::clone(&calls));
    let initializer = EnvdInitializer::new(connector, config());
    let sandbox = Sandbox::test().name("s").build();
    let error = initializer.init(&sandbox, &BTreeMap::new(), "t").await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert!(error.to_string().contains("failed 5 times"), "{error}");
}

#[path = "common/mod.rs"]
mod common;

/// A store with the pool `default/base` stocked with `members` sandboxes, and an index that
/// shows them all.
async fn stocked_pool(
    members: usize,
) -> (oka_store::embedded::EmbeddedStore, Arc<oka_manager::Index>, tempfile::TempDir) {
    let (store, dir) = common::store();
    let set = common::create_pool(&store, "default", "base").await;
    common::stock(&store, &set, members).await;
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    common::wait_members(&index, "default", "base", members).await;
    (store, index, dir)
}

/// Waits (at most 2.5 s) until `initializer` holds `count` parked connections.
async fn wait_parked<C: EnvdConnector>(initializer: &EnvdInitializer<C>, count: usize) {
    for _ in 0..500 {
        if initializer.parked_connections() == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Serves the API over `index` with `initializer`, creates a sandbox from `base` with
/// `GREETING=hi`, and checks that envd at `addr` got the variable with the sandbox's token.
/// Returns the router and the create's answer.
async fn create_greeting(
    store: &oka_store::embedded::EmbeddedStore,
    index: Arc<oka_manager::Index>,
    initializer: Arc<dyn SandboxInitializer>,
    addr: SocketAddr,
) -> (axum::Router, serde_json::Value) {
    let settings =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(common::KEY).unwrap());
    let state = oka_manager::api::AppState::new(store.clone(), index, settings)
        .with_initializer(initializer);
    let router = oka_manager::api::app(state);
    let created = common::create(
        &router,
        serde_json::json!({"templateID": "base", "envVars": {"GREETING": "hi"}}),
    )
    .await;
    let token = created["envdAccessToken"].as_str().unwrap();
    let (status, body) = get(addr, "/envs", Some(token)).await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["GREETING"], "hi");
    (router, created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_answers_201_only_after_envd_got_the_env_vars_and_token() {
    let addr = envd().await;
    let (store, index, _dir) = stocked_pool(1).await;
    let connector = Loopback { addr, refuse: 0, calls: Arc::new(AtomicU32::new(0)) };
    let initializer = Arc::new(EnvdInitializer::new(connector, config()));
    let (router, created) = create_greeting(&store, index, initializer, addr).await;
    assert_eq!(get(addr, "/envs", None).await.0, 401);

    // Metrics come from the same envd, asked with the sandbox's token.
    let id = created["sandboxID"].as_str().unwrap();
    let reply =
        common::call(&router, "GET", &format!("/sandboxes/{id}/metrics?start=0&end=1"), None).await;
    assert_eq!(reply.status, http::StatusCode::OK, "{}", reply.json);
    let samples = reply.json.as_array().unwrap();
    assert_eq!(samples.len(), 1);
    let sample = &samples[0];
    for key in [
        "timestamp",
        "timestampUnix",
        "cpuCount",
        "cpuUsedPct",
        "memUsed",
        "memTotal",
        "memCache",
        "diskUsed",
        "diskTotal",
    ] {
        assert!(sample.get(key).is_some(), "{key} in {sample}");
    }
    assert!(sample["memTotal"].as_i64().unwrap() > 0 && sample["cpuCount"].as_i64().unwrap() > 0);
}

/// Dials, per connect, the next address of `plan` (the last one once the plan is used up).
struct Planned {
    plan: std::sync::Mutex<Vec<SocketAddr>>,
    calls: Arc<AtomicU32>,
}

impl EnvdConnector for Planned {
    fn connect<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _port: u16,
    ) -> BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let addr = {
            let mut plan = self.plan.lock().unwrap();
            if plan.len() > 1 { plan.remove(0) } else { plan[0] }
        };
        Box::pin(tokio::net::TcpStream::connect(addr))
    }
}

/// A peer that accepts connections and, per `close_at_once`, closes each at once or when the
/// first bytes of a request arrive (never answering).
async fn bad_peer(close_at_once: bool) -> SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            if close_at_once {
                drop(stream);
                continue;
            }
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                let _ = stream.read(&mut byte).await;
            });
        }
    });
    addr
}

/// A long first backoff: an init that waited for it would take seconds.
fn patient_config() -> EnvdInitConfig {
    EnvdInitConfig { first_backoff: Duration::from_secs(30), ..config() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_inits_over_the_connection_opened_while_the_pool_filled() {
    let addr = envd().await;
    let (store, index, _dir) = stocked_pool(3).await;
    let calls = Arc::new(AtomicU32::new(0));
    let connector = Loopback { addr, refuse: 0, calls: Arc::clone(&calls) };
    let initializer = Arc::new(EnvdInitializer::new(connector, patient_config()));
    let prepared = tokio::spawn(oka_manager::init::keep_pools_prepared(
        Arc::downgrade(&index),
        Arc::clone(&initializer) as Arc<dyn SandboxInitializer>,
    ));
    wait_parked(&initializer, 3).await;
    assert_eq!(initializer.parked_connections(), 3, "one connection per pool member");
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let _ = create_greeting(&store, Arc::clone(&index), Arc::clone(&initializer) as _, addr).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3, "the claim's /init made no new connection");
    assert_eq!(initializer.parked_connections(), 2, "the claimed sandbox's connection was used");

    // A member that leaves the pool (deleted) has its connection closed by the next prepare.
    let member = index.pool_members("default", "base").remove(0);
    store
        .delete::<Sandbox>("default", member.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    wait_parked(&initializer, 1).await;
    assert_eq!(initializer.parked_connections(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "nothing was reopened");
    prepared.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_parked_connection_is_replaced_at_once_without_the_backoff() {
    let addr = envd().await;
    let env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
    // First: the peer closed the parked connection before the claim (seen on the socket).
    // Second: the parked connection looks open but fails under the request.
    for close_at_once in [true, false] {
        let calls = Arc::new(AtomicU32::new(0));
        let peer = bad_peer(close_at_once).await;
        let connector =
            Planned { plan: std::sync::Mutex::new(vec![peer, addr]), calls: Arc::clone(&calls) };
        let initializer = EnvdInitializer::new(connector, patient_config());
        let sandbox = Arc::new(Sandbox::test().name("s").build());
        initializer.prepare(std::slice::from_ref(&sandbox)).await;
        assert_eq!(initializer.parked_connections(), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;

        let started = std::time::Instant::now();
        initializer.init(&sandbox, &env, "token").await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no backoff was waited ({close_at_once}): {:?}",
            started.elapsed()
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one parked, one fresh connection");
        assert_eq!(initializer.parked_connections(), 0);
        assert_eq!(get(addr, "/envs", Some("token")).await.0, 200);
    }
}

/// Dials `addr` and keeps the connections given back after their exchange.
struct Keeping {
    addr: SocketAddr,
    released: Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>>,
}

impl EnvdConnector for Keeping {
    fn connect<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _port: u16,
    ) -> BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(tokio::net::TcpStream::connect(self.addr))
    }

    fn release(&self, _sandbox: &Sandbox, port: u16, stream: tokio::net::TcpStream) {
        assert_eq!(port, 49983);
        self.released.lock().unwrap().push(stream);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_init_connection_is_given_back_fit_for_the_next_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = envd().await;
    let released = Arc::new(std::sync::Mutex::new(Vec::new()));
    let initializer =
        EnvdInitializer::new(Keeping { addr, released: Arc::clone(&released) }, config());
    let sandbox = Sandbox::test().name("s").build();
    let env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
    initializer.init(&sandbox, &env, "token").await.unwrap();
    let mut stream = released.lock().unwrap().pop().expect("the connection was given back");

    // The next request on it is answered, and nothing of the first answer is left over.
    stream
        .write_all(
            b"GET /envs HTTP/1.1\r\nHost: x\r\nX-Access-Token: token\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 "), "{response}");
    assert!(response.contains(r#""FOO":"bar""#), "{response}");

    // A refused init gives nothing back (and fails).
    assert!(initializer.init(&sandbox, &env, "another").await.is_err());
    assert!(released.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_candidate_that_cannot_be_reached_is_left_alone_for_a_while() {
    let calls = Arc::new(AtomicU32::new(0));
    let connector = Loopback::refusing(Arc::clone(&calls));
    let initializer = EnvdInitializer::new(connector, config());
    let sandbox = Arc::new(Sandbox::test().name("s").build());
    let candidates = std::slice::from_ref(&sandbox);
    initializer.prepare(candidates).await;
    initializer.prepare(candidates).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the second pass did not try again");
    tokio::time::advance(oka_manager::init::PREPARE_RETRY_AFTER).await;
    initializer.prepare(candidates).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "tried again after the pause");
    assert_eq!(initializer.parked_connections(), 0);
}
