//! What operating oka costs the E2B API: create latency and claims per second of a real
//! `oka serve` with tracing on (an OTLP/gRPC collector that answers, and one that is gone), with
//! an API key under a quota (the embedded ledger), and with both, against both off, in one run,
//! A/B: the variants take turns, round after round, so the machine's drift hits each alike.
//! Metrics are always recorded (atomic counters; there is no switch), so every variant pays
//! for them; the scrape's own cost is the metrics bench's.
//!
//! Each variant is a fresh `oka serve` with a stocked pool of `OKA_BENCH_POOL` (default 128)
//! real sandboxes. Per round it measures `OKA_BENCH_CREATES` (default 200) sequential creates,
//! each killed after, paced below the pool's refill rate, then a burst of creates by
//! `OKA_BENCH_CLIENTS` (default 16) concurrent clients from the restocked pool (claims per
//! second). `OKA_BENCH_ROUNDS` (default 2) rounds.
//!
//! Run with `cargo bench -p oka --bench operations` as root; otherwise it prints SKIPPED.
//! `oka-envd` must be built beside `oka` (`cargo build --release -p oka-envd`).

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::support::otlp;
use common::{Serve, env_usize, fmt, oka, percentile};

/// One configuration measured.
struct Variant {
    name: &'static str,
    config: String,
    /// Creates with a key under a (never reached) quota instead of the unlimited admin key.
    quota: bool,
    creates: Vec<Duration>,
    claims_per_second: Vec<f64>,
    empty: usize,
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED operations bench: real sandboxes need root");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    if !envd.exists() {
        eprintln!(
            "{} is missing: build it with `cargo build --release -p oka-envd`",
            envd.display()
        );
        std::process::exit(1);
    }
    let pool = env_usize("OKA_BENCH_POOL", 128);
    let creates = env_usize("OKA_BENCH_CREATES", 200);
    let clients = env_usize("OKA_BENCH_CLIENTS", 16);
    let rounds = env_usize("OKA_BENCH_ROUNDS", 2).max(1);

    let collector = otlp::Receiver::start();
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // Nothing listens there once the listener above is dropped.
    let tracing_to =
        |addr: std::net::SocketAddr| format!("tracing:\n  mode: otel\n  endpoint: http://{addr}\n");
    let variant = |name, config: String, quota| Variant {
        name,
        config,
        quota,
        creates: vec![],
        claims_per_second: vec![],
        empty: 0,
    };
    let mut variants = vec![
        variant("all off", String::new(), false),
        variant("tracing, collector up", tracing_to(collector.addr), false),
        variant("tracing, collector gone", tracing_to(gone), false),
        variant("quota", String::new(), true),
        variant("tracing (collector up) and quota", tracing_to(collector.addr), true),
    ];
    for round in 1..=rounds {
        for variant in &mut variants {
            eprintln!("round {round}: {}", variant.name);
            measure(variant, pool, creates, clients, &envd);
        }
    }
    println!();
    println!(
        "Operating costs, A/B in one run ({rounds} rounds; pool {pool}; {clients} clients in bursts; release build)"
    );
    println!("| variant | creates | create p50 | create p99 | claims/s (median) | Δ p50 vs off |");
    println!("|---|---|---|---|---|---|");
    let base = percentile(&variants[0].creates, 50.0);
    for variant in &variants {
        let p50 = percentile(&variant.creates, 50.0);
        let mut rates = variant.claims_per_second.clone();
        rates.sort_by(f64::total_cmp);
        let median = rates.get(rates.len() / 2).copied().unwrap_or_default();
        println!(
            "| {} | {} | {} | {} | {median:.0} | {:+.3} ms |",
            variant.name,
            variant.creates.len(),
            fmt(p50),
            fmt(percentile(&variant.creates, 99.0)),
            (p50.as_secs_f64() - base.as_secs_f64()) * 1e3
        );
    }
    println!("spans received by the collector: {}", collector.spans().len());
}

fn measure(variant: &mut Variant, pool: usize, creates: usize, clients: usize, envd: &Path) {
    let mut serve = Serve::start_with(pool, envd, &variant.config);
    if variant.quota {
        serve.key = quota_key(&serve);
    }
    let fill = serve.wait_stocked(pool, Duration::from_secs(300));
    // Sequential creates paced at 80% of the refill rate, so the pool never runs dry.
    let gap = fill.div_f64(pool as f64 * 0.8);
    let mut api = serve.api_client();
    let mut done = 0;
    while done < creates {
        let t = Instant::now();
        match serve.create(&mut api) {
            Some(created) => {
                variant.creates.push(t.elapsed());
                serve.kill(&mut api, &created.id);
                done += 1;
            }
            None => variant.empty += 1,
        }
        std::thread::sleep(gap.saturating_sub(t.elapsed()));
    }
    serve.wait_stocked(pool, Duration::from_secs(300));
    let total = pool.saturating_sub(4).max(1);
    let next = AtomicUsize::new(0);
    let ids = Mutex::new(Vec::new());
    let barrier = Barrier::new(clients + 1);
    let started = std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                let mut api = serve.api_client();
                barrier.wait();
                let mut mine = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    if let Some(created) = serve.create(&mut api) {
                        mine.push(created.id);
                    }
                }
                ids.lock().unwrap().extend(mine);
            });
        }
        barrier.wait();
        Instant::now()
    });
    let wall = started.elapsed();
    let ids = ids.into_inner().unwrap();
    variant.claims_per_second.push(ids.len() as f64 / wall.as_secs_f64());
    let mut api = serve.api_client();
    for id in &ids {
        serve.kill(&mut api, id);
    }
}

/// A new API key whose quota (a million sandboxes) is checked on every create and never reached.
fn quota_key(serve: &Serve) -> String {
    let mut api = serve.api_client();
    let body = r#"{"name":"bench","quota":{"limits":[{"dimension":"sandbox.count","scope":"all","limit":1000000}]}}"#;
    let response = api.request(
        "POST",
        "/api-keys",
        &[("X-API-Key", &serve.key), ("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(response.status, 201, "{}", String::from_utf8_lossy(&response.body));
    let created: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    created["key"].as_str().unwrap().to_owned()
}
