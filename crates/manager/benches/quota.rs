//! Quota admission benchmark: latency (p50, p99) of one quota check (an enforcing acquire of a
//! new entry, then its release, as a create and a kill do) against the embedded ledger and
//! against a real `redis-server` on loopback (started here when installed; skipped otherwise),
//! one at a time and with 32 concurrent callers.
//!
//! `cargo bench -p oka-manager --bench quota` (env `CHECKS`, default 5000).
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use oka_manager::quota::redis::RedisConfig;
use oka_manager::quota::{BreakerSettings, Entry, Quota, QuotaMetrics, QuotaSpec};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn spec() -> QuotaSpec {
    QuotaSpec::from_json(Some(&serde_json::json!({"limits": [
        {"dimension": "sandbox.count", "scope": "all", "limit": 1_000_000},
        {"dimension": "limits.cpu", "scope": "running", "limit": 1_000_000_000},
    ]})))
    .unwrap()
    .unwrap()
}

fn report(what: &str, h: &Histogram<u64>, n: usize, elapsed: Duration) {
    // Recorded in nanoseconds, shown in microseconds.
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{what:<44} n={n:<6} p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>8.1} µs  {:>9.0} checks/s",
        us(0.5),
        us(0.99),
        h.max() as f64 / 1000.0,
        n as f64 / elapsed.as_secs_f64()
    );
}

/// `checks` acquires (each of a new lock, then released), `callers` at a time; latency of the
/// acquire alone, in nanoseconds.
async fn run(what: &str, quota: Arc<Quota>, checks: usize, callers: usize) {
    let spec = Arc::new(spec());
    let entry = Entry { cpu_milli: 1000, memory_mib: 512, running: true };
    // Warm up (connection, script load).
    for i in 0..100 {
        let lock = format!("warm-{i}");
        quota.acquire("bench", Some(&spec), &lock, entry).await.unwrap();
        quota.release("bench", &lock).await;
    }
    let started = Instant::now();
    let per = checks / callers;
    let tasks = (0..callers).map(|c| {
        let (quota, spec) = (Arc::clone(&quota), Arc::clone(&spec));
        tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            for i in 0..per {
                let lock = format!("{c}-{i}");
                let t = Instant::now();
                quota.acquire("bench", Some(&spec), &lock, entry).await.unwrap();
                h.record(t.elapsed().as_nanos() as u64).unwrap();
                quota.release("bench", &lock).await;
            }
            h
        })
    });
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    for task in futures::future::join_all(tasks).await {
        h.add(task.unwrap()).unwrap();
    }
    report(what, &h, per * callers, started.elapsed());
}

fn main() {
    let checks = env("CHECKS", 5000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let local = || {
            let quota = Quota::local(Arc::new(QuotaMetrics::default()));
            quota.mark_ready();
            Arc::new(quota)
        };
        run("embedded ledger, one at a time", local(), checks, 1).await;
        run("embedded ledger, 32 callers", local(), checks, 32).await;
        let Some(server) = common::redis::RedisServer::start() else { return };
        let redis = || {
            let config = RedisConfig::new(server.addr());
            let quota = Quota::redis(
                config,
                &BreakerSettings::default(),
                Arc::new(QuotaMetrics::default()),
            );
            Arc::new(quota.unwrap())
        };
        run("redis (loopback), one at a time", redis(), checks, 1).await;
        run("redis (loopback), 32 callers", redis(), checks, 32).await;
    });
}
