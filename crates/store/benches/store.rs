//! Figures for the embedded store: durable write throughput and latency (1 and 16 writers),
//! get and list latency at 10,000 objects, and watch delivery latency (commit → subscriber).
//!
//! Run with `cargo bench -p oka-store --bench store`. The database lives in a temporary
//! directory under `OKA_BENCH_DIR` (default: the system temp dir), which must be on a real
//! disk for the write figures to mean anything: the bench prints its filesystem type.

// A bench binary reports by printing and fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use hdrhistogram::Histogram;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Selector, Store};

const WRITERS: usize = 16;
const OBJECTS: usize = 10_000;

fn histogram() -> Histogram<u64> {
    Histogram::new(3).unwrap()
}

fn fmt_ns(ns: u64) -> String {
    if ns < 10_000 {
        format!("{:.2} µs", ns as f64 / 1e3)
    } else {
        format!("{:.3} ms", ns as f64 / 1e6)
    }
}

fn report(what: &str, h: &Histogram<u64>) {
    println!(
        "{what:<48} n={:<6} p50 {:>10}  p99 {:>10}  max {:>10}",
        h.len(),
        fmt_ns(h.value_at_quantile(0.5)),
        fmt_ns(h.value_at_quantile(0.99)),
        fmt_ns(h.max())
    );
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// The filesystem type of the mount holding `path`, from /proc/mounts.
fn filesystem_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, mnt, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mnt).then(|| (mnt.len(), format!("{fs} ({dev} on {mnt})")))
        })
        .max()
        .map(|(_, fs)| fs)
        .unwrap_or_else(|| "unknown".into())
}

/// `writers` tasks create `per_writer` objects each; returns the per-write latency histogram
/// and the wall time.
async fn durable_writes(
    store: &EmbeddedStore,
    prefix: &str,
    writers: usize,
    per_writer: usize,
) -> (Histogram<u64>, Duration) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..writers {
        let store = store.clone();
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            for i in 0..per_writer {
                let w =
                    widget(&format!("{prefix}-{t}-{i}")).labeled("pool", &format!("p{}", i % 10));
                let began = Instant::now();
                store.create(NS, &w).await.unwrap();
                h.record(nanos(began.elapsed())).unwrap();
            }
            h
        }));
    }
    let mut all = histogram();
    for task in tasks {
        all.add(task.await.unwrap()).unwrap();
    }
    (all, start.elapsed())
}

async fn bench_writes(dir: &Path) {
    let store = EmbeddedStore::open(&dir.join("writes.redb"), EmbeddedOptions::default()).unwrap();
    // Warm up: file growth, allocator, caches.
    durable_writes(&store, "warm", WRITERS, 50).await;
    for (writers, per_writer) in [(1, 2_000), (WRITERS, 1_000)] {
        let (h, wall) = durable_writes(&store, &format!("w{writers}"), writers, per_writer).await;
        let n = (writers * per_writer) as f64;
        report(&format!("durable create, {writers} writer(s): latency"), &h);
        println!(
            "{:<48} {:.0} writes/s ({} writes in {:.2} s)",
            format!("durable create, {writers} writer(s): throughput"),
            n / wall.as_secs_f64(),
            n,
            wall.as_secs_f64()
        );
    }
    store.close().unwrap();
}

async fn bench_reads(dir: &Path) {
    let store = EmbeddedStore::open(&dir.join("reads.redb"), EmbeddedOptions::default()).unwrap();
    durable_writes(&store, "obj", WRITERS, OBJECTS / WRITERS).await;
    let names: Vec<String> =
        (0..OBJECTS).map(|i| format!("obj-{}-{}", i % WRITERS, i / WRITERS)).collect();

    let mut get = histogram();
    for i in 0..OBJECTS {
        let name = &names[(i * 7919) % OBJECTS];
        let began = Instant::now();
        let w: Widget = store.get(NS, name).await.unwrap();
        get.record(nanos(began.elapsed())).unwrap();
        std::hint::black_box(w);
    }
    report(&format!("get, {OBJECTS} objects"), &get);

    let everything = Selector::everything();
    let mut list = histogram();
    for _ in 0..200 {
        let began = Instant::now();
        let l = store.list::<Widget>(Some(NS), &everything).await.unwrap();
        list.record(nanos(began.elapsed())).unwrap();
        assert_eq!(l.items.len(), OBJECTS);
    }
    report(&format!("list {OBJECTS} of {OBJECTS}"), &list);

    let pool: Selector = "pool=p3".parse().unwrap();
    let mut selected = histogram();
    for _ in 0..200 {
        let began = Instant::now();
        let l = store.list::<Widget>(Some(NS), &pool).await.unwrap();
        selected.record(nanos(began.elapsed())).unwrap();
        assert_eq!(l.items.len(), 1_008, "625 objects per writer, 63 of them in pool p3");
    }
    report(&format!("list by selector, {} of {OBJECTS}", OBJECTS / 10), &selected);
    store.close().unwrap();

    // After a restart the typed cache is empty: the first list deserializes every object.
    let began = Instant::now();
    let store = EmbeddedStore::open(&dir.join("reads.redb"), EmbeddedOptions::default()).unwrap();
    println!(
        "{:<48} {}",
        format!("reopen with {OBJECTS} objects (load + index)"),
        fmt_ns(nanos(began.elapsed()))
    );
    let began = Instant::now();
    let cold = store.list::<Widget>(Some(NS), &everything).await.unwrap();
    println!(
        "{:<48} {}",
        format!("list {OBJECTS} after reopen (typed cache cold)"),
        fmt_ns(nanos(began.elapsed()))
    );
    assert_eq!(cold.items.len(), OBJECTS);
    store.close().unwrap();
}

async fn bench_watch(dir: &Path) {
    const SUBSCRIBERS: usize = 4;
    let store = EmbeddedStore::open(&dir.join("watch.redb"), EmbeddedOptions::default()).unwrap();
    for (writers, per_writer) in [(1, 2_000), (WRITERS, 250)] {
        let expected = writers * per_writer;
        let mut subscribers = Vec::new();
        for _ in 0..SUBSCRIBERS {
            let mut stream =
                store.watch_timed::<Widget>(Some(NS), &Selector::everything(), "").unwrap();
            subscribers.push(tokio::spawn(async move {
                let mut h = histogram();
                while h.len() < expected as u64 {
                    let (_, committed_at) = stream.next().await.unwrap().unwrap();
                    h.record(nanos(committed_at.elapsed())).unwrap();
                }
                h
            }));
        }
        durable_writes(&store, &format!("watch{writers}"), writers, per_writer).await;
        let mut all = histogram();
        for s in subscribers {
            all.add(s.await.unwrap()).unwrap();
        }
        report(&format!("watch commit→subscriber, {writers} writer(s), {SUBSCRIBERS} subs"), &all);
    }
    store.close().unwrap();
}

fn main() {
    let base = std::env::var_os("OKA_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(&base).unwrap();
    let fs = filesystem_of(dir.path());
    println!("oka-store embedded bench: data in {} on {fs}", dir.path().display());
    if fs.starts_with("tmpfs") {
        println!("WARNING: tmpfs is not a disk; set OKA_BENCH_DIR to a directory on a real disk");
    }
    println!("cores: {}", std::thread::available_parallelism().map_or(0, usize::from));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let total = Instant::now();
    runtime.block_on(async {
        bench_writes(dir.path()).await;
        bench_reads(dir.path()).await;
        bench_watch(dir.path()).await;
    });
    println!("total {:.1} s", total.elapsed().as_secs_f64());
}
