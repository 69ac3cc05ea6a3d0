//! The cost of one scrape of `/metrics` with 10,000 sandboxes: encoding time (p50, p99) and
//! size, in OpenMetrics and in the Prometheus text format. Per-object series are computed at
//! scrape time from the controllers' caches, so this is what a Prometheus scraping every 15 s
//! costs `oka serve`.
//!
//! No sandbox runs. An embedded store holds `SANDBOXES` (default 10,000) Sandbox objects as the
//! controllers leave them (labels, ownerReferences, status with phase, node and conditions):
//! 60 % pooled and Ready, 25 % claimed and Ready after a pause and a resume, 10 % Paused, 5 %
//! still starting, in 4 namespaces and 20 pools. An informer fills the sandbox cache the way the
//! sandbox controller's does, and feeds [`ControllerMetrics::observe_sandbox`] (so the
//! remembered `sandbox_status_paused_time` and `_resumed_time` are there); the registry holds
//! what `oka serve`'s holds of the controllers and the store (the shared families, the
//! controllers' families, [`ObjectCollector`] over the cache, the store's series). The manager's,
//! gateway's and runtime's families are a fixed few kilobytes and are not included. After
//! `WARMUP` (default 3) scrapes, `ROUNDS` (default 100) scrapes per format are timed; the
//! encoding is what `/metrics` runs (`oka_metrics::scrape::encode`), HTTP aside.
//!
//! `cargo bench -p oka-controller --bench metrics`
//!
//! [`ObjectCollector`]: oka_controller::metrics::ObjectCollector
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use oka_api::conditions::{self, sandbox as cond};
use oka_api::{Sandbox, SandboxPhase, labels};
use oka_cache::reflector::Informer;
use oka_controller::metrics::ControllerMetrics;
use oka_metrics::scrape::{Format, encode};
use oka_metrics::{Registry, Shared};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn condition(type_: &str, status: &str, reason: &str, at: Timestamp) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(at),
    }
}

/// The `i`th sandbox, as the controllers leave it.
fn sandbox(i: usize) -> (String, Sandbox) {
    let namespace = format!("team-{}", i % 4);
    let pool = format!("pool-{}", i % 20);
    let name = format!("{pool}-{i:05}");
    let created = Timestamp::now() - jiff::SignedDuration::from_secs(3_600 + (i as i64 % 600));
    let ready_at = created + jiff::SignedDuration::from_secs(2);
    let kind = i % 20;
    let builder = Sandbox::test()
        .name(&name)
        .namespace(&namespace)
        .pooled(&pool)
        .label(labels::SANDBOX_TEMPLATE, &pool)
        .label(labels::TEMPLATE_HASH, "7c9f5d6b8")
        .label(labels::SANDBOX_ID, &format!("i{i:019}"))
        .annotation("agents.kruise.io/runtime", "local");
    let mut sandbox = match kind {
        // 60 %: pool stock, Running and Ready.
        0..12 => builder.phase(SandboxPhase::Running).build(),
        // 25 %: claimed, Ready again after a pause and a resume.
        12..17 => builder.claimed().phase(SandboxPhase::Running).build(),
        // 10 %: claimed and paused.
        17 | 18 => builder.claimed().paused().phase(SandboxPhase::Paused).build(),
        // 5 %: starting.
        _ => builder.phase(SandboxPhase::Pending).build(),
    };
    sandbox.metadata.creation_timestamp = Some(Time(created));
    let status = sandbox.status.get_or_insert_with(Default::default);
    status.node_name = Some("oka-dev".into());
    status.sandbox_ip = Some(format!("10.88.{}.{}", i / 250, i % 250 + 2));
    let paused_at = ready_at + jiff::SignedDuration::from_secs(600);
    let resumed_at = paused_at + jiff::SignedDuration::from_secs(300);
    let conditions = match kind {
        0..12 => vec![condition(cond::READY, conditions::TRUE, "PodReady", ready_at)],
        12..17 => vec![
            condition(cond::READY, conditions::TRUE, "PodReady", resumed_at),
            condition(cond::RESUMED, conditions::TRUE, "ResumePod", resumed_at),
        ],
        17 | 18 => vec![
            condition(cond::READY, conditions::FALSE, "PodReady", paused_at),
            condition(cond::PAUSED, conditions::TRUE, "FreezePauseSucceed", paused_at),
        ],
        _ => vec![condition(cond::READY, conditions::FALSE, "PodReady", created)],
    };
    status.conditions = Some(conditions);
    (namespace, sandbox)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() {
    let count = env("SANDBOXES", 10_000);
    let (warmup, rounds) = (env("WARMUP", 3), env("ROUNDS", 100));
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (registry, _informer) = runtime.block_on(async {
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default())
            .unwrap();
        let started = Instant::now();
        let writers: Vec<_> = (0..32)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in (w..count).step_by(32) {
                        let (namespace, sandbox) = sandbox(i);
                        let status = sandbox.status.clone();
                        let mut created = store.create(&namespace, &sandbox).await.unwrap();
                        created.status = status;
                        store.update_status(&namespace, &created).await.unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        eprintln!("{count} sandboxes stored in {:.1} s", started.elapsed().as_secs_f64());

        let shared = Shared::default();
        let mut registry = Registry::default();
        shared.register(&mut registry);
        store.register_metrics(&mut registry);
        let metrics = Arc::new(ControllerMetrics::new(shared, Vec::new()));
        metrics.register(&mut registry);
        let mut informer = Informer::<Sandbox, _>::new(store.clone());
        let cache = informer.cache();
        let observer = Arc::clone(&metrics);
        informer.on_change(move |change| observer.observe_sandbox(change));
        metrics.watch_sandboxes(cache.clone());
        let task = tokio::spawn(informer.run(std::future::pending()));
        cache.wait_ready().await;
        assert_eq!(cache.len(), count);
        (registry, task)
    });

    println!("metrics scrape, {count} sandboxes ({warmup} warm-up, {rounds} timed scrapes):");
    for format in [Format::OpenMetrics, Format::PrometheusText] {
        let mut text = String::new();
        for _ in 0..warmup {
            text = encode(&registry, format).unwrap();
        }
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            let scraped = encode(&registry, format).unwrap();
            times.push(started.elapsed());
            text = scraped;
        }
        times.sort();
        let samples = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
        println!(
            "  {:<15} p50 {:>6.1} ms  p99 {:>6.1} ms  {:>10} bytes ({:.0} per sandbox)  {} samples",
            match format {
                Format::OpenMetrics => "OpenMetrics",
                Format::PrometheusText => "Prometheus text",
            },
            percentile(&times, 0.5).as_secs_f64() * 1e3,
            percentile(&times, 0.99).as_secs_f64() * 1e3,
            text.len(),
            text.len() as f64 / count as f64,
            samples,
        );
    }
    runtime.shutdown_background();
}
