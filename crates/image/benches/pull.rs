//! Pull benchmark: an image of about 200 MB (four layers of incompressible data and one of
//! many small files) pushed to a loopback `docker-registry`, pulled and unpacked into a fresh
//! store each round, against two baselines in the same run, interleaved: the same blobs read
//! over the same loopback HTTP (the same number at once) and written to files as they arrive
//! (no decompression, no unpacking, no verification), and `cp -a` of the unpacked layers (the
//! same files created, no network). The aim is a pull at 80 % or more of a baseline's
//! throughput. Throughput is the compressed bytes over the wall time.
//!
//! `cargo bench -p oka-image --bench pull` (env `ROUNDS`, default 7; `BENCH_DIR`, where the
//! stores and copies go, default the system's temporary directory).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oka_image::{ImageStore, ImageStoreConfig};
use support::{Entry, Registry, TestImage, TestLayer, host_arch};

const BIG_LAYERS: usize = 4;
const BIG_LAYER_BYTES: usize = 45 * 1024 * 1024;
const SMALL_FILES: usize = 5000;
const SMALL_FILE_BYTES: usize = 4096;

fn rounds() -> usize {
    std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(7)
}

/// Incompressible bytes (xorshift), different per seed.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn image() -> TestImage {
    let mut layers = Vec::new();
    for i in 0..BIG_LAYERS {
        let entries = vec![Entry::File(
            format!("big/{i}.bin"),
            noise(i as u64 + 1, BIG_LAYER_BYTES),
            0o644,
            0,
        )];
        layers.push(TestLayer::build_with(&entries, flate2::Compression::fast()));
    }
    let small: Vec<Entry> = (0..SMALL_FILES)
        .map(|i| {
            let text = format!("file {i}: ").repeat(SMALL_FILE_BYTES / 12);
            Entry::File(format!("small/{:03}/{i}.txt", i / 100), text.into_bytes(), 0o644, 0)
        })
        .collect();
    layers.push(TestLayer::build_with(&small, flate2::Compression::default()));
    TestImage::new(layers, host_arch())
}

/// The baseline: every layer blob fetched over HTTP, `concurrent` at once, written to a file.
async fn copy_blobs(
    registry: &Registry,
    repository: &str,
    digests: &[String],
    dir: &std::path::Path,
    concurrent: usize,
) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let jobs = digests.iter().map(|digest| {
        let client = client.clone();
        let url = format!("http://{}/v2/{repository}/blobs/{digest}", registry.host);
        let path = dir.join(digest.trim_start_matches("sha256:"));
        async move {
            let response = client.get(url.parse().unwrap()).await.unwrap();
            assert!(response.status().is_success());
            let mut file = std::fs::File::create(path).unwrap();
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.unwrap().into_data() {
                    file.write_all(&data).unwrap();
                }
            }
        }
    });
    futures::StreamExt::collect::<Vec<()>>(futures::StreamExt::buffer_unordered(
        futures::stream::iter(jobs),
        concurrent,
    ))
    .await;
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(rounds()));
}

async fn run(rounds: usize) {
    let registry = Registry::start(None);
    let build = Instant::now();
    let image = image();
    let uncompressed: usize = image.layers.iter().map(|l| l.tar.len()).sum();
    let compressed: usize = image.layers.iter().map(|l| l.gz.len()).sum();
    registry.push_image("bench/app", "1", &image).await;
    eprintln!(
        "image: {} layers, {:.0} MB uncompressed, {:.0} MB compressed, {SMALL_FILES} small files (built and pushed in {:.1} s)",
        image.layers.len(),
        uncompressed as f64 / 1e6,
        compressed as f64 / 1e6,
        build.elapsed().as_secs_f64()
    );
    let digests: Vec<String> = image.layers.iter().map(|l| support::sha256(&l.gz)).collect();
    let reference = format!("{}/bench/app:1", registry.host);
    let concurrent = ImageStoreConfig::default().concurrent_layers;
    // `BENCH_DIR` chooses the filesystem (default: the system's temporary directory).
    let scratch = match std::env::var_os("BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    eprintln!("stores under {}", scratch.path().display());
    let (mut pulls, mut copies, mut trees) = (Vec::new(), Vec::new(), Vec::new());
    // The unpacked tree `cp -a` copies: a pull's layers.
    let source = scratch.path().join("source");
    ImageStore::open(&source, ImageStoreConfig::default())
        .unwrap()
        .pull(&reference, &[], &|_| {})
        .await
        .unwrap();
    // One warm-up round, not counted.
    for round in 0..=rounds {
        let dir = scratch.path().join(format!("copy-{round}"));
        std::fs::create_dir(&dir).unwrap();
        let start = Instant::now();
        copy_blobs(&registry, "bench/app", &digests, &dir, concurrent).await;
        let copy = start.elapsed();
        std::fs::remove_dir_all(&dir).unwrap();

        let dir = scratch.path().join(format!("tree-{round}"));
        let start = Instant::now();
        let status = tokio::process::Command::new("cp")
            .arg("-a")
            .arg(source.join("layers"))
            .arg(&dir)
            .status()
            .await
            .unwrap();
        let tree = start.elapsed();
        assert!(status.success());
        std::fs::remove_dir_all(&dir).unwrap();

        let dir = scratch.path().join(format!("store-{round}"));
        let store = ImageStore::open(&dir, ImageStoreConfig::default()).unwrap();
        let start = Instant::now();
        let pulled = store.pull(&reference, &[], &|_| {}).await.unwrap();
        let pull = start.elapsed();
        assert_eq!(pulled.layers.len(), image.layers.len());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
        if round > 0 {
            pulls.push(pull);
            copies.push(copy);
            trees.push(tree);
        }
    }
    pulls.sort();
    copies.sort();
    trees.sort();
    let mb = compressed as f64 / 1e6;
    let line = |what: &str, sorted: &[Duration]| {
        let (p50, p99) = (quantile(sorted, 0.5), quantile(sorted, 0.99));
        println!(
            "{what:<58} n={:<3} p50 {:>7.0} ms ({:>5.0} MB/s)  p99 {:>7.0} ms",
            sorted.len(),
            p50.as_secs_f64() * 1e3,
            mb / p50.as_secs_f64(),
            p99.as_secs_f64() * 1e3
        );
    };
    println!(
        "Pull of a {:.0} MB image ({:.0} MB compressed, {} layers) from docker-registry on loopback:",
        uncompressed as f64 / 1e6,
        mb,
        image.layers.len()
    );
    line("baseline: the blobs over HTTP to files (no unpack)", &copies);
    line("baseline: cp -a of the unpacked layers (same files)", &trees);
    line("oka-image pull: verify, gunzip, unpack into a fresh store", &pulls);
    let ratio = |baseline: &[Duration]| {
        quantile(baseline, 0.5).as_secs_f64() / quantile(&pulls, 0.5).as_secs_f64() * 100.0
    };
    println!(
        "pull throughput / baseline throughput (p50): {:.0} % of the HTTP copy, {:.0} % of cp -a",
        ratio(&copies),
        ratio(&trees)
    );
}
