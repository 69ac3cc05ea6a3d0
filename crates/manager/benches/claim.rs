//! Claim benchmark: latency (p50, p99) of claims from a stocked warm pool, one at a time, and
//! throughput with 32 concurrent clients; at the engine level and through `app()` over real
//! HTTP/1.1 on loopback. Every claim is one durable (fsync'd) write to the embedded store.
//!
//! `cargo bench -p oka-manager --bench claim` (env `CLAIMS`, default 1000; `CLIENTS`, default
//! 32). Pools are stocked by writing Sandbox objects straight into the store (no runtime).
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use oka_manager::api::{ApiKey, AppState, ManagerConfig, app};
use oka_manager::{ClaimConfig, ClaimEngine, ClaimOptions, Index, PoolRef};
use oka_store::embedded::EmbeddedStore;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Creates pool `name` with `count` available members (16 stocking tasks).
async fn stocked_pool(store: &EmbeddedStore, index: &Arc<Index>, name: &str, count: usize) {
    let set = common::create_pool(store, "default", name).await;
    let tasks = 16;
    let per = count.div_ceil(tasks);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (store, set) = (store.clone(), set.clone());
        let range = (t * per).min(count)..((t + 1) * per).min(count);
        handles.push(tokio::spawn(async move { common::stock_range(&store, &set, range).await }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    common::wait_members(index, "default", name, count).await;
}

fn report(what: &str, histogram: &Histogram<u64>, count: usize, elapsed: Duration) {
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{what:<44} n={count:<5} p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  {:>8.0} claims/s",
        us(0.5),
        us(0.99),
        histogram.max() as f64 / 1000.0,
        count as f64 / elapsed.as_secs_f64()
    );
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

async fn engine_sequential(engine: &ClaimEngine<EmbeddedStore>, pool: &str, claims: usize) {
    let pool = PoolRef::new("default", pool);
    let options = ClaimOptions::default();
    let mut h = histogram();
    let started = Instant::now();
    for _ in 0..claims {
        let t = Instant::now();
        engine.claim(&pool, "bench", &options).await.unwrap();
        h.record(t.elapsed().as_micros() as u64).unwrap();
    }
    report("engine, sequential", &h, claims, started.elapsed());
}

async fn engine_concurrent(
    engine: Arc<ClaimEngine<EmbeddedStore>>,
    pool: &str,
    claims: usize,
    clients: usize,
) {
    let started = Instant::now();
    let per = claims / clients;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let engine = Arc::clone(&engine);
            let pool = PoolRef::new("default", pool);
            tokio::spawn(async move {
                let mut h = histogram();
                for _ in 0..per {
                    let t = Instant::now();
                    engine.claim(&pool, "bench", &ClaimOptions::default()).await.unwrap();
                    h.record(t.elapsed().as_micros() as u64).unwrap();
                }
                h
            })
        })
        .collect();
    let mut h = histogram();
    for task in tasks {
        h.add(task.await.unwrap()).unwrap();
    }
    report(&format!("engine, {clients} concurrent"), &h, per * clients, started.elapsed());
}

const CREATE: &str =
    r#"{"templateID":"POOL","timeout":300,"metadata":{"bench":"1"},"envVars":{"A":"b"}}"#;

async fn http_sequential(addr: std::net::SocketAddr, pool: &str, claims: usize) {
    let mut client = common::Client::connect(addr).await;
    let body = CREATE.replace("POOL", pool);
    let mut h = histogram();
    let started = Instant::now();
    for _ in 0..claims {
        let t = Instant::now();
        let (status, _, _) = client.send("POST", "/sandboxes", Some(&body)).await;
        h.record(t.elapsed().as_micros() as u64).unwrap();
        assert_eq!(status, 201);
    }
    report("HTTP POST /sandboxes, sequential", &h, claims, started.elapsed());
}

async fn http_concurrent(addr: std::net::SocketAddr, pool: &str, claims: usize, clients: usize) {
    let per = claims / clients;
    let body = CREATE.replace("POOL", pool);
    let mut connected = Vec::new();
    for _ in 0..clients {
        connected.push(common::Client::connect(addr).await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|mut client| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut h = histogram();
                for _ in 0..per {
                    let t = Instant::now();
                    let (status, _, _) = client.send("POST", "/sandboxes", Some(&body)).await;
                    h.record(t.elapsed().as_micros() as u64).unwrap();
                    assert_eq!(status, 201);
                }
                h
            })
        })
        .collect();
    let mut h = histogram();
    for task in tasks {
        h.add(task.await.unwrap()).unwrap();
    }
    report(
        &format!("HTTP POST /sandboxes, {clients} concurrent"),
        &h,
        per * clients,
        started.elapsed(),
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let claims = env("CLAIMS", 1000);
        let clients = env("CLIENTS", 32);
        let (store, _dir) = common::store();
        let index = Index::spawn(store.clone());
        index.wait_ready().await;
        let started = Instant::now();
        for (pool, count) in [
            ("engine-seq", claims),
            ("engine-par", claims),
            ("http-seq", claims),
            ("http-par", claims),
        ] {
            stocked_pool(&store, &index, pool, count).await;
        }
        println!("stocked 4 pools of {claims} in {:.1?}", started.elapsed());

        // The pure part of a claim on a 1000-member pool: copy a window of candidates out of
        // the index and choose one (derived state, revision, in-flight set). Against the same
        // window checked whole (every member's derived state, then ordered by revision), as
        // claims did before `choose_claim` stopped at the first fit.
        let rounds = 1000u32;
        let mut lazy = Duration::ZERO;
        let mut whole = Duration::ZERO;
        let mut chosen = 0;
        for seed in 0..rounds {
            let now = jiff::Timestamp::now();
            let t = Instant::now();
            let members = index.pool_window("default", "engine-seq", u64::from(seed), 64);
            chosen += usize::from(
                oka_manager::claim::choose_claim(&members, Some("rev-1"), now, |_| false).is_some(),
            );
            lazy += t.elapsed();
            let t = Instant::now();
            let members = index.pool_window("default", "engine-seq", u64::from(seed), 64);
            let (mut current, old): (Vec<_>, Vec<_>) = members
                .iter()
                .filter(|s| oka_manager::claim::is_claimable(s, now))
                .partition(|s| {
                    s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(oka_api::labels::TEMPLATE_HASH))
                        .map(String::as_str)
                        == Some("rev-1")
                });
            current.extend(old);
            chosen += usize::from(!current.is_empty());
            whole += t.elapsed();
        }
        assert_eq!(chosen, 2 * rounds as usize, "every round found a candidate both ways");
        println!(
            "index window (64) + choose_claim: {:.1?} per claim; checking the whole window: {:.1?}",
            lazy / rounds,
            whole / rounds
        );

        let engine =
            Arc::new(ClaimEngine::new(store.clone(), Arc::clone(&index), ClaimConfig::default()));
        engine_sequential(&engine, "engine-seq", claims).await;
        engine_concurrent(Arc::clone(&engine), "engine-par", claims, clients).await;

        let config = ManagerConfig::new(ApiKey::parse(common::KEY).unwrap());
        let router = app(AppState::new(store.clone(), Arc::clone(&index), config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        http_sequential(addr, "http-seq", claims).await;
        http_concurrent(addr, "http-par", claims, clients).await;
        server.abort();
    });
}
