//! Per-API-key quota through the E2B API: the embedded ledger (limits, 403 without locking the
//! picked sandbox, release at kill, pause and resume through the event path, rebuilt after a
//! restart) and a real `redis-server` (the Lua scripts against the pure rules, two managers
//! sharing one Redis, `kill -9` of Redis during a burst: fail open, then anti-drift repairs).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use oka_api::Sandbox;
use oka_manager::quota::redis::{RedisBackend, RedisConfig};
use oka_manager::quota::{
    AcquireParams, AntiDriftConfig, BreakerSettings, Entry, Quota, QuotaBackend, QuotaMetrics,
    QuotaSpec, local::LocalBackend,
};
use oka_store::Store;
use oka_store::embedded::EmbeddedStore;
use redis::AsyncCommands as _;
use serde_json::{Value, json};

use common::{KEY, redis::RedisServer, send};

/// One manager (its own index and quota) over a shared store with pool `default/base`.
struct Manager {
    router: axum::Router,
    index: Arc<oka_manager::Index>,
    quota: Arc<Quota>,
    _drift: tokio::task::JoinHandle<()>,
}

impl Drop for Manager {
    fn drop(&mut self) {
        self._drift.abort();
        self.index.shutdown();
    }
}

fn fast_drift() -> AntiDriftConfig {
    AntiDriftConfig {
        interval: Duration::from_millis(300),
        grace: Duration::from_millis(600),
        ..AntiDriftConfig::default()
    }
}

async fn manager(store: &EmbeddedStore, quota: Quota, drift: AntiDriftConfig) -> Manager {
    let index = oka_manager::Index::spawn(store.clone());
    index.wait_ready().await;
    let mut config =
        oka_manager::api::ManagerConfig::new(oka_manager::api::ApiKey::parse(KEY).unwrap());
    config.create.enabled = false;
    let state = oka_manager::api::AppState::new(store.clone(), Arc::clone(&index), config);
    let quota = Arc::new(quota);
    let (_, drift) = state.start_quota(Arc::clone(&quota), drift);
    Manager { router: oka_manager::api::app(state), index, quota, _drift: drift }
}

async fn stocked(members: usize) -> (EmbeddedStore, tempfile::TempDir) {
    let (store, dir) = common::store();
    let set = common::create_pool(&store, "default", "base").await;
    common::stock(&store, &set, members).await;
    (store, dir)
}

/// A key with `limits`: (key, key ID).
async fn limited_key(router: &axum::Router, limits: Value) -> (String, String) {
    let reply = send(
        router,
        "POST",
        "/api-keys",
        Some(KEY),
        &[],
        Some(json!({"name": "q", "quota": {"limits": limits}})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    assert_eq!(reply.json["quota"]["limits"], limits, "the quota is echoed");
    (reply.json["key"].as_str().unwrap().into(), reply.json["id"].as_str().unwrap().into())
}

async fn create(router: &axum::Router, key: &str) -> (StatusCode, Value) {
    let reply =
        send(router, "POST", "/v2/sandboxes", Some(key), &[], Some(json!({"templateID": "base"})))
            .await;
    (reply.status, reply.json)
}

async fn kill(router: &axum::Router, key: &str, id: &str) {
    let reply = send(router, "DELETE", &format!("/sandboxes/{id}"), Some(key), &[], None).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.json);
}

#[track_caller]
fn assert_refused(status: StatusCode, body: &Value) {
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], 403);
    assert_eq!(body["message"], "QuotaExceeded: api-key quota exceeded");
}

/// Polls `check` every 20 ms for at most `within`.
async fn eventually(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn set_paused(store: &EmbeddedStore, index: &oka_manager::Index, id: &str, paused: bool) {
    for _ in 0..10 {
        let current = index.by_id(id).unwrap();
        let mut sandbox: Sandbox = (*current).clone();
        sandbox.spec.paused = Some(paused);
        if store.update("default", &sandbox).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("cannot set paused={paused} on {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_quota_refuses_over_the_limit_without_locking_and_frees_at_kill() {
    let (store, _dir) = stocked(6).await;
    let m = manager(&store, Quota::local(Arc::default()), AntiDriftConfig::default()).await;
    common::wait_members(&m.index, "default", "base", 6).await;
    let (key, _) =
        limited_key(&m.router, json!([{"dimension": "sandbox.count", "scope": "all", "limit": 2}]))
            .await;
    let (s1, first) = create(&m.router, &key).await;
    assert_eq!(s1, StatusCode::CREATED, "{first}");
    assert_eq!(create(&m.router, &key).await.0, StatusCode::CREATED);
    let (status, body) = create(&m.router, &key).await;
    assert_refused(status, &body);
    // The refused create locked nothing: four members are still claimable.
    assert_eq!(m.index.pool_members("default", "base").len(), 4);
    // The admin key (no quota) is not limited.
    assert_eq!(create(&m.router, KEY).await.0, StatusCode::CREATED);
    // A paused sandbox still counts in `all`.
    let id = first["sandboxID"].as_str().unwrap();
    set_paused(&store, &m.index, id, true).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, body) = create(&m.router, &key).await;
    assert_refused(status, &body);
    // A kill frees its slot at once.
    kill(&m.router, &key, id).await;
    assert_eq!(create(&m.router, &key).await.0, StatusCode::CREATED);
    assert_eq!(m.quota.metrics().acquire_count("rejected"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_scope_follows_pause_and_resume_is_never_gated() {
    let (store, _dir) = stocked(6).await;
    let m = manager(&store, Quota::local(Arc::default()), AntiDriftConfig::default()).await;
    common::wait_members(&m.index, "default", "base", 6).await;
    let (key, _) = limited_key(
        &m.router,
        json!([{"dimension": "sandbox.count", "scope": "running", "limit": 1}]),
    )
    .await;
    let (_, a) = create(&m.router, &key).await;
    let a = a["sandboxID"].as_str().unwrap().to_owned();
    let (status, body) = create(&m.router, &key).await;
    assert_refused(status, &body);
    // Pausing A frees `running` (the event path), so B fits.
    set_paused(&store, &m.index, &a, true).await;
    let mut b = None;
    eventually("the pause to free running", Duration::from_secs(5), async || {
        let (status, body) = create(&m.router, &key).await;
        if status == StatusCode::CREATED {
            b = Some(body);
        }
        status == StatusCode::CREATED
    })
    .await;
    // Resuming A is not refused (running goes to 2 of 1); creates are then refused.
    set_paused(&store, &m.index, &a, false).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!m.index.by_id(&a).unwrap().is_paused());
    let (status, body) = create(&m.router, &key).await;
    assert_refused(status, &body);
    assert!(b.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_manager_rebuilds_the_ledger_before_admitting() {
    let (store, _dir) = stocked(6).await;
    let key = {
        let m = manager(&store, Quota::local(Arc::default()), AntiDriftConfig::default()).await;
        common::wait_members(&m.index, "default", "base", 6).await;
        let (key, _) = limited_key(
            &m.router,
            json!([{"dimension": "sandbox.count", "scope": "all", "limit": 2}]),
        )
        .await;
        assert_eq!(create(&m.router, &key).await.0, StatusCode::CREATED);
        assert_eq!(create(&m.router, &key).await.0, StatusCode::CREATED);
        key
    };
    // A new manager (a restart: its ledger starts empty) on the same store.
    let m = manager(&store, Quota::local(Arc::default()), AntiDriftConfig::default()).await;
    let (status, body) = create(&m.router, &key).await;
    assert_refused(status, &body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_quotas_are_refused_at_key_create() {
    let (store, _dir) = stocked(0).await;
    let m = manager(&store, Quota::local(Arc::default()), AntiDriftConfig::default()).await;
    for (quota, word) in [
        (json!({"limits": [{"dimension": "gpu", "scope": "all", "limit": 1}]}), "dimension"),
        (json!({"limits": [{"dimension": "sandbox.count", "scope": "x", "limit": 1}]}), "scope"),
        (json!({"limits": [{"dimension": "sandbox.count", "scope": "all", "limit": -1}]}), "limit"),
        (json!({"limits": [], "other": 1}), "unknown"),
    ] {
        let reply = send(
            &m.router,
            "POST",
            "/api-keys",
            Some(KEY),
            &[],
            Some(json!({"name": "q", "quota": quota})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.json);
        assert!(reply.json["message"].as_str().unwrap().contains(word), "{}", reply.json);
    }
    let reply = send(
        &m.router,
        "POST",
        "/api-keys",
        Some(KEY),
        &[],
        Some(json!({"name": "q", "quota": {}})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(reply.json.get("quota").is_none(), "an empty quota is no quota: {}", reply.json);
}

fn redis_quota(server: &RedisServer, metrics: Arc<QuotaMetrics>) -> Quota {
    let config = RedisConfig::new(server.addr());
    let breaker = BreakerSettings { max_failures: 3, open_for: Duration::from_millis(500) };
    Quota::redis(config, &breaker, metrics).unwrap()
}

/// A small deterministic random sequence.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_scripts_do_what_the_pure_rules_do() {
    let Some(server) = RedisServer::start() else { return };
    let redis = RedisBackend::new(RedisConfig::new(server.addr()), Arc::default()).unwrap();
    let local = LocalBackend::new();
    let spec = QuotaSpec::from_json(Some(&json!({"limits": [
        {"dimension": "sandbox.count", "scope": "all", "limit": 4},
        {"dimension": "sandbox.count", "scope": "running", "limit": 2},
        {"dimension": "limits.cpu", "scope": "all", "limit": 3000},
        {"dimension": "limits.memory", "scope": "running", "limit": 2048},
    ]})))
    .unwrap();
    let mut rng = Lcg(7);
    for step in 0..400 {
        let lock = format!("lock-{}", rng.next(8));
        if rng.next(4) == 0 {
            redis.release("u1", &lock).await.unwrap();
            local.release("u1", &lock).await.unwrap();
            continue;
        }
        let params = AcquireParams {
            user: "u1".into(),
            lock,
            entry: Entry {
                cpu_milli: [0, 250, 1000][rng.next(3) as usize],
                memory_mib: [0, 512, 1024][rng.next(3) as usize],
                running: rng.next(2) == 0,
            },
            enforce: rng.next(3) != 0,
            limits: spec.clone(),
        };
        let (a, b) = (redis.acquire(&params).await, local.acquire(&params).await);
        assert_eq!(a, b, "step {step}: {params:?}");
        assert_eq!(
            redis.list_entries("u1").await.unwrap(),
            local.list_entries("u1").await.unwrap(),
            "step {step}"
        );
    }
    // The sums in Redis are the ledger's, and the entries are the reference's bytes.
    let mut c = server.connection().await;
    for (dimension, key) in [
        (oka_manager::quota::Dimension::SandboxCount, "q:sum:{u1}:sandbox.count"),
        (oka_manager::quota::Dimension::LimitsCpu, "q:sum:{u1}:limits.cpu"),
        (oka_manager::quota::Dimension::LimitsMemory, "q:sum:{u1}:limits.memory"),
    ] {
        for scope in oka_manager::quota::Scope::ALL {
            let held: Option<i64> = c.hget(key, scope.as_str()).await.unwrap();
            assert_eq!(held.unwrap_or(0), local.sum("u1", dimension, scope), "{key} {scope:?}");
        }
    }
    let params = AcquireParams {
        user: "u2".into(),
        lock: "l".into(),
        entry: Entry { cpu_milli: 500, memory_mib: 0, running: true },
        enforce: false,
        limits: None,
    };
    redis.acquire(&params).await.unwrap();
    let raw: String = c.hget("q:live:{u2}", "l").await.unwrap();
    assert_eq!(raw, r#"{"d":{"limits.cpu":500},"s":["running"]}"#);
    redis.cleanup("u2").await.unwrap();
    let exists: bool = c.exists("q:live:{u2}").await.unwrap();
    assert!(!exists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_sharing_redis_enforce_one_limit() {
    let Some(server) = RedisServer::start() else { return };
    let (store, _dir) = stocked(12).await;
    let a = manager(&store, redis_quota(&server, Arc::default()), AntiDriftConfig::default()).await;
    let b = manager(&store, redis_quota(&server, Arc::default()), AntiDriftConfig::default()).await;
    common::wait_members(&a.index, "default", "base", 12).await;
    common::wait_members(&b.index, "default", "base", 12).await;
    let (key, id) =
        limited_key(&a.router, json!([{"dimension": "sandbox.count", "scope": "all", "limit": 3}]))
            .await;
    // B knows the key once its key store reloads (at most once a second on a miss).
    eventually("manager B to know the key", Duration::from_secs(5), async || {
        send(&b.router, "GET", "/v2/sandboxes", Some(&key), &[], None).await.status
            == StatusCode::OK
    })
    .await;
    let creates = (0..10).map(|i| {
        let router = if i % 2 == 0 { a.router.clone() } else { b.router.clone() };
        let key = key.clone();
        async move { create(&router, &key).await }
    });
    let results = futures::future::join_all(creates).await;
    let ok = results.iter().filter(|(s, _)| *s == StatusCode::CREATED).count();
    let refused = results.iter().filter(|(s, _)| *s == StatusCode::FORBIDDEN).count();
    assert_eq!((ok, refused), (3, 7), "{results:?}");
    let mut c = server.connection().await;
    let count: i64 = c.hget(format!("q:sum:{{{id}}}:sandbox.count"), "all").await.unwrap();
    assert_eq!(count, 3);
    let live: usize = c.hlen(format!("q:live:{{{id}}}")).await.unwrap();
    assert_eq!(live, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_redis_fails_open_and_anti_drift_repairs_the_counts() {
    let Some(mut server) = RedisServer::start() else { return };
    let (store, _dir) = stocked(12).await;
    let metrics = Arc::new(QuotaMetrics::default());
    let m = manager(&store, redis_quota(&server, Arc::clone(&metrics)), fast_drift()).await;
    common::wait_members(&m.index, "default", "base", 12).await;
    let (key, id) =
        limited_key(&m.router, json!([{"dimension": "sandbox.count", "scope": "all", "limit": 2}]))
            .await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, body) = create(&m.router, &key).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["sandboxID"].as_str().unwrap().to_owned());
    }
    let (status, body) = create(&m.router, &key).await;
    assert_refused(status, &body);

    // Redis dies: a burst of creates goes on (fail open), each fast.
    server.kill_9();
    for _ in 0..4 {
        let started = Instant::now();
        let (status, body) = create(&m.router, &key).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        ids.push(body["sandboxID"].as_str().unwrap().to_owned());
    }
    assert!(metrics.acquire_count("fail_open") >= 4);
    assert!(metrics.breaker_count("open") >= 1, "the breaker opened");

    // Redis comes back empty; anti-drift rebuilds the counts from the store's six sandboxes.
    server.restart();
    let mut c = server.connection().await;
    let sum_key = format!("q:sum:{{{id}}}:sandbox.count");
    eventually("anti-drift to rebuild the counts", Duration::from_secs(10), async || {
        let count: Option<i64> = c.hget(&sum_key, "all").await.unwrap_or(None);
        count == Some(6)
    })
    .await;
    // Enforced again (6 > 2) once the breaker has closed.
    eventually("enforcement to resume", Duration::from_secs(5), async || {
        create(&m.router, &key).await.0 == StatusCode::FORBIDDEN
    })
    .await;

    // Kills release; a sandbox deleted behind the manager's back is released by the event path.
    for id in &ids[..4] {
        kill(&m.router, &key, id).await;
    }
    let gone = m.index.by_id(&ids[4]).unwrap();
    store
        .delete::<Sandbox>("default", gone.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    eventually("the counts to follow", Duration::from_secs(5), async || {
        let count: Option<i64> = c.hget(&sum_key, "all").await.unwrap_or(None);
        count == Some(1)
    })
    .await;
    assert_eq!(create(&m.router, &key).await.0, StatusCode::CREATED);
}
