//! E2B template builds, end to end against a real `oka serve` on the default template `base`
//! (its root from `oka templates build`, found as the tests find it): templates are built through
//! the E2B template API as the SDKs drive it (`POST /v3/templates`, `POST
//! /v2/templates/{id}/builds/{build}` with `fromTemplate: base` and `RUN` steps, then the status
//! polled with `logsOffset` paging until `ready`), so each built template's pool runs on its
//! `oka.local/...` image: one layer of the build stacked on the base root.
//!
//! 1. Create from a built template's pool against the `base` pool, the baseline: both pools are
//!    scaled to `OKA_BENCH_POOL` with kubectl, then `OKA_BENCH_CREATES` creates from each
//!    (`POST /v2/sandboxes` with `create-on-no-stock: false`, each killed once answered),
//!    alternating between the two pools and paced below the slower pool's refill, p50/p99 at the
//!    client and the server's own total from `Server-Timing`. Before that, each pool's refill:
//!    the time from scaling it from 1 to `OKA_BENCH_POOL` until the SandboxSet reports that many
//!    available (sandbox start → ready), `OKA_BENCH_FILLS` times, alternating between the pools
//!    (kubectl is polled, so the figures include a poll interval of its own).
//! 2. Disk of `OKA_BENCH_TEMPLATES` templates sharing the base: each built from `base` with a
//!    different `RUN` writing `OKA_BENCH_DELTA_MB` MB of random bytes; the image store's layer
//!    directories each template's image names (its `images/<digest>.json`), walked counting each
//!    inode once (allocated blocks, as `du`), against the cost of as many full copies: the base
//!    root's size (the same walk) plus each delta, per template; computed, not made.
//! 3. Build time of such a template: each build's time from the request to `ready` at the client
//!    (the pool's first sandbox of the new template included) and the builder's own figure from
//!    its last log line, uncached; then each template built again with the same steps, which the
//!    build cache answers (`CACHED`).
//!
//! Knobs (environment): `OKA_BENCH_CREATES` (creates per pool; default 200), `OKA_BENCH_POOL`
//! (each pool's size while creating; 16), `OKA_BENCH_FILLS` (refills per pool; 3),
//! `OKA_BENCH_TEMPLATES` (templates sharing the base; 10), `OKA_BENCH_DELTA_MB` (MB each writes;
//! 4), `OKA_BENCH_RATE` (creates per second; default 80% of the slower pool's refill rate),
//! `OKA_BENCH_OKA` (the `oka` binary to run, `oka-envd` beside it).
//!
//! Run with `cargo bench -p oka --bench templates` as root (real sandboxes) with kubectl
//! installed, after `cargo build --release --bins` and with the default templates built in
//! `/var/cache/oka/templates` (`$OKA_TEMPLATES_DIR`; `scripts/test.sh` builds them); otherwise it
//! prints SKIPPED or names what is missing.

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, Serve, env_usize, fmt, oka, row};
use serde_json::{Value, json};

/// The namespace of the admin key's templates and of the `base` pool.
const NAMESPACE: &str = "default";
/// The pool every build starts from, and the baseline of creates.
const BASE: &str = "base";
/// The built template of step 1.
const BUILT: &str = "bench-built";

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us without it: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED templates bench: template builds run in real sandboxes, which need root");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    if !envd.exists() {
        eprintln!(
            "{} is missing: build it first with `cargo build --release --bins`",
            envd.display()
        );
        std::process::exit(1);
    }
    check_templates_built();
    let creates = env_usize("OKA_BENCH_CREATES", 200);
    let pool = env_usize("OKA_BENCH_POOL", 16).max(2);
    let fills = env_usize("OKA_BENCH_FILLS", 3);
    let templates = env_usize("OKA_BENCH_TEMPLATES", 10);
    let delta_mb = env_usize("OKA_BENCH_DELTA_MB", 4);

    let serve = Serve::start(1, &envd);
    wait_available(&serve, BASE, 1, Duration::from_secs(300));
    let mut api = serve.api_client();

    // 1. A built template's pool against the base pool.
    let built = build(&serve, &mut api, BUILT, &[run_step("echo built > /opt/bench-built")]);
    let image = kubectl(
        &serve,
        &[
            "get",
            "sandboxtemplate",
            BUILT,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
    );
    assert!(image.starts_with("oka.local/"), "the built template runs on {image:?}");
    println!("built {BUILT} in {}: its pool runs on {image}", fmt(built.wall));
    wait_available(&serve, BUILT, 1, Duration::from_secs(300));

    let mut refill = [Vec::new(), Vec::new()];
    for _ in 0..fills {
        for (i, name) in [BASE, BUILT].into_iter().enumerate() {
            refill[i].push(fill(&serve, name, pool));
            scale(&serve, name, 1);
            wait_settled(&serve, name, 1);
        }
    }
    for name in [BASE, BUILT] {
        scale(&serve, name, pool);
    }
    for name in [BASE, BUILT] {
        wait_available(&serve, name, pool, Duration::from_secs(300));
    }
    let rate = std::env::var("OKA_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse::<f64>().ok())
        .filter(|r| *r > 0.0)
        .unwrap_or_else(|| {
            let slowest = refill.iter().flatten().max().copied().unwrap_or(Duration::from_secs(1));
            0.8 * (pool - 1) as f64 / slowest.as_secs_f64()
        });
    let latency = bench_creates(&serve, &mut api, creates, rate);
    for name in [BASE, BUILT] {
        scale(&serve, name, 1);
    }

    // 2 and 3. Templates sharing the base, built, then built again from the cache.
    let mut uncached = Vec::new();
    for i in 0..templates {
        let command = format!(
            "head -c {delta_mb}M /dev/urandom > /opt/bench-data-{i} && echo template {i} > /opt/bench-id"
        );
        uncached.push(build(&serve, &mut api, &format!("bench-disk-{i}"), &[run_step(&command)]));
    }
    let disk = measure_disk(&serve, &uncached);
    let mut cached = Vec::new();
    for (i, first) in uncached.iter().enumerate() {
        let command = format!(
            "head -c {delta_mb}M /dev/urandom > /opt/bench-data-{i} && echo template {i} > /opt/bench-id"
        );
        let again = build(&serve, &mut api, &first.name, &[run_step(&command)]);
        assert!(
            again.cached,
            "the same steps again were not answered from the cache:\n{}",
            again.log
        );
        cached.push(again);
    }

    println!(
        "\n| create (interleaved, pools of {pool}, {rate:.1} creates/s) | n | p50 | p99 | max |"
    );
    println!("|---|---|---|---|---|");
    row("base pool (baseline): at the client", &latency.client[0]);
    row(&format!("{BUILT} pool (built on base): at the client"), &latency.client[1]);
    row("base pool: server total", &latency.server[0]);
    row(&format!("{BUILT} pool: server total"), &latency.server[1]);
    println!(
        "answers 503 (pool empty, retried): base {}, {BUILT} {}",
        latency.empty[0], latency.empty[1]
    );

    println!("\n| refill 1 → {pool} (start → ready) | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    row("base pool (baseline)", &refill[0]);
    row(&format!("{BUILT} pool"), &refill[1]);

    let mb = |bytes: u64| format!("{:.1} MB", bytes as f64 / 1e6);
    let added: u64 = disk.deltas.iter().sum();
    let copies: u64 = disk.deltas.iter().map(|d| disk.base + d).sum();
    println!("\n| disk of {templates} templates on base (each writes {delta_mb} MB) | bytes |");
    println!("|---|---|");
    println!("| base root (shared; not added) | {} |", mb(disk.base));
    println!(
        "| the templates' own layers, added (each inode once) | {} ({} per template p50, max {}) |",
        mb(added),
        mb(median(&disk.deltas)),
        mb(disk.deltas.iter().max().copied().unwrap_or(0))
    );
    println!("| baseline: {templates} full copies, Σ (base root + delta) | {} |", mb(copies));
    println!(
        "| as built, base root + added, against full copies | {} ({:.1} %) |",
        mb(disk.base + added),
        100.0 * (disk.base + added) as f64 / copies.max(1) as f64
    );
    println!("layers per image: {:?} (store layers above the base root)", disk.layers);

    println!("\n| build of one template (RUN writing {delta_mb} MB) | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    let walls = |b: &[Built]| b.iter().map(|b| b.wall).collect::<Vec<_>>();
    let builders = |b: &[Built]| b.iter().filter_map(|b| b.builder).collect::<Vec<_>>();
    row("uncached: request → ready at the client", &walls(&uncached));
    row("uncached: the builder's own time", &builders(&uncached));
    row("cached (`CACHED`): request → ready at the client", &walls(&cached));
    row("cached: the builder's own time", &builders(&cached));
}

/// Exits naming the command when the default templates' roots are not built.
fn check_templates_built() {
    let dir = common::support::templates_dir();
    let out = Command::new(oka()).args(["templates", "list", "--dir"]).arg(&dir).output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || list.lines().any(|l| l.contains(BASE) && l.contains("not built")) {
        eprintln!(
            "the default template base is not built in {}:\n{list}\nrun `oka templates build --dir {0}`",
            dir.display()
        );
        std::process::exit(1);
    }
}

/// A `RUN` step as the SDKs send it, as root.
fn run_step(command: &str) -> Value {
    json!({"type": "RUN", "args": [command, "root"], "force": false, "forceUpload": null})
}

/// One finished build.
struct Built {
    name: String,
    build_id: String,
    /// From the template request to the first status saying `ready`, at the client.
    wall: Duration,
    /// The builder's own time, from its last log line.
    builder: Option<Duration>,
    /// The build cache answered it.
    cached: bool,
    /// Every log message.
    log: String,
}

/// Builds template `name` from `base` with `steps` through the E2B template API; fails the
/// bench with the build's log and `oka serve`'s unless it ends `ready`.
fn build(serve: &Serve, api: &mut Client, name: &str, steps: &[Value]) -> Built {
    let json_headers = [("X-API-Key", serve.key.as_str()), ("Content-Type", "application/json")];
    let started = Instant::now();
    let body = json!({"name": name, "cpuCount": 1, "memoryMB": 512}).to_string();
    let requested = api.request("POST", "/v3/templates", &json_headers, body.as_bytes());
    assert_eq!(
        requested.status,
        202,
        "POST /v3/templates: {}",
        String::from_utf8_lossy(&requested.body)
    );
    let requested: Value = serde_json::from_slice(&requested.body).unwrap();
    let template = requested["templateID"].as_str().unwrap().to_owned();
    let build_id = requested["buildID"].as_str().unwrap().to_owned();
    let body = json!({"fromTemplate": BASE, "force": false, "steps": steps}).to_string();
    let path = format!("/v2/templates/{template}/builds/{build_id}");
    let start = api.request("POST", &path, &json_headers, body.as_bytes());
    assert_eq!(start.status, 202, "POST {path}: {}", String::from_utf8_lossy(&start.body));
    let mut offset = 0;
    let mut messages: Vec<String> = Vec::new();
    let mut ended = None;
    let deadline = started + Duration::from_secs(1800);
    loop {
        let status_path =
            format!("/templates/{template}/builds/{build_id}/status?logsOffset={offset}");
        let reply = api.request("GET", &status_path, &[("X-API-Key", serve.key.as_str())], b"");
        assert_eq!(
            reply.status,
            200,
            "GET {status_path}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let reply: Value = serde_json::from_slice(&reply.body).unwrap();
        let status = reply["status"].as_str().unwrap_or_default().to_owned();
        if ended.is_none() && (status == "ready" || status == "error") {
            ended = Some((started.elapsed(), status.clone()));
        }
        let entries = reply["logEntries"].as_array().cloned().unwrap_or_default();
        offset += entries.len();
        messages.extend(entries.iter().filter_map(|e| e["message"].as_str().map(str::to_owned)));
        if ended.is_some() && entries.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "build {name} never ended:\n{}", messages.join("\n"));
        std::thread::sleep(Duration::from_millis(if ended.is_some() { 0 } else { 50 }));
    }
    let (wall, status) = ended.unwrap();
    let log = messages.join("\n");
    assert_eq!(status, "ready", "build {name} failed:\n{log}\n--- oka serve\n{}", serve.log());
    Built {
        name: name.to_owned(),
        build_id,
        wall,
        builder: messages.iter().find_map(|m| builder_time(m)),
        cached: messages.iter().any(|m| m.ends_with(" CACHED")),
        log,
    }
}

/// The builder's time from its line `[builder] Template <name> built in <secs> s: <image>`.
fn builder_time(message: &str) -> Option<Duration> {
    let rest = message.strip_prefix("[builder] Template ")?;
    let secs = rest.split_once(" built in ")?.1.split_once(" s")?.0;
    secs.parse::<f64>().ok().map(Duration::from_secs_f64)
}

/// kubectl `args` against `serve` in [`NAMESPACE`]; its trimmed stdout.
fn kubectl(serve: &Serve, args: &[&str]) -> String {
    let mut all = vec!["-n", NAMESPACE];
    all.extend_from_slice(args);
    common::support::kubectl(serve, &all, None).trim().to_owned()
}

/// Sets pool `name`'s replicas.
fn scale(serve: &Serve, name: &str, replicas: usize) {
    let patch = format!(r#"{{"spec":{{"replicas":{replicas}}}}}"#);
    kubectl(serve, &["patch", "sandboxset", name, "--type", "merge", "-p", &patch]);
}

/// Pool `name`'s `status.availableReplicas` and `status.replicas`.
fn pool_status(serve: &Serve, name: &str) -> (usize, usize) {
    let out = kubectl(
        serve,
        &[
            "get",
            "sandboxset",
            name,
            "-o",
            "jsonpath={.status.availableReplicas} {.status.replicas}",
        ],
    );
    let mut fields = out.split_whitespace().map(|f| f.parse().unwrap_or(0));
    (fields.next().unwrap_or(0), fields.next().unwrap_or(0))
}

/// Waits until pool `name` has at least `replicas` available.
fn wait_available(serve: &Serve, name: &str, replicas: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while pool_status(serve, name).0 < replicas {
        assert!(
            Instant::now() < deadline,
            "pool {name} never had {replicas} available:\n{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until pool `name` is exactly `replicas`, all available (the scaled-down ones gone).
fn wait_settled(serve: &Serve, name: &str, replicas: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while pool_status(serve, name) != (replicas, replicas) {
        assert!(
            Instant::now() < deadline,
            "pool {name} never settled at {replicas}:\n{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Scales pool `name` (at 1) to `replicas`; the time until that many are available.
fn fill(serve: &Serve, name: &str, replicas: usize) -> Duration {
    let started = Instant::now();
    scale(serve, name, replicas);
    wait_available(serve, name, replicas, Duration::from_secs(300));
    started.elapsed()
}

/// The creates of step 1; index 0 is the base pool, 1 the built one.
struct Creates {
    client: [Vec<Duration>; 2],
    server: [Vec<Duration>; 2],
    empty: [usize; 2],
}

/// `n` creates from each pool, alternating, each killed once answered, at most `rate` a second
/// (slower whenever a pool was found empty).
fn bench_creates(serve: &Serve, api: &mut Client, n: usize, rate: f64) -> Creates {
    let bodies = [BASE, BUILT].map(|name| {
        json!({"templateID": name, "metadata": {"e2b.agents.kruise.io/create-on-no-stock": "false"}})
            .to_string()
    });
    let mut out = Creates {
        client: [Vec::new(), Vec::new()],
        server: [Vec::new(), Vec::new()],
        empty: [0, 0],
    };
    let mut interval = Duration::from_secs_f64(1.0 / rate);
    let mut next = Instant::now();
    let mut turn = 0;
    while out.client[1].len() < n {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next = Instant::now().max(next) + interval;
        let t = Instant::now();
        let Some(created) = serve.create_with(api, &bodies[turn]) else {
            out.empty[turn] += 1;
            interval = interval.mul_f64(1.25);
            continue;
        };
        out.client[turn].push(t.elapsed());
        out.server[turn].push(server_total(&created.server_timing));
        serve.kill(api, &created.id);
        turn = 1 - turn;
    }
    out
}

/// The handler's `total` from a `Server-Timing` header.
fn server_total(header: &str) -> Duration {
    header
        .split(',')
        .filter_map(|metric| {
            let mut parts = metric.trim().split(';');
            (parts.next()? == "total").then_some(())?;
            parts.find_map(|p| p.trim().strip_prefix("dur=")?.parse::<f64>().ok())
        })
        .next()
        .map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1e3))
}

/// What the templates of step 2 take on disk.
struct Disk {
    /// The base root's allocated bytes.
    base: u64,
    /// Each template's own layers' allocated bytes, inodes shared with an earlier template or
    /// the base counted there.
    deltas: Vec<u64>,
    /// How many store layers each template's image has above the base root.
    layers: Vec<usize>,
}

/// Reads each build's image record from `oka serve`'s image store and walks its layers.
fn measure_disk(serve: &Serve, builds: &[Built]) -> Disk {
    let store = serve.state.path().join("images");
    let references: Value =
        serde_json::from_slice(&std::fs::read(store.join("references.json")).unwrap()).unwrap();
    let mut base_dirs: Option<Vec<PathBuf>> = None;
    let mut images = Vec::new();
    for build in builds {
        let suffix = format!("/{}:{}", build.name, build.build_id);
        let digest = references
            .as_object()
            .unwrap()
            .iter()
            .find(|(reference, _)| reference.ends_with(&suffix))
            .and_then(|(_, digest)| digest.as_str())
            .unwrap_or_else(|| panic!("no image of {suffix} in {references}"));
        let hex = digest.strip_prefix("sha256:").unwrap();
        let record: Value = serde_json::from_slice(
            &std::fs::read(store.join("images").join(format!("{hex}.json"))).unwrap(),
        )
        .unwrap();
        let dirs: Vec<PathBuf> = record["base_dirs"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| d.as_str().map(PathBuf::from)).collect())
            .unwrap_or_default();
        assert_eq!(dirs.len(), 1, "{} is not built on the base root alone: {record}", build.name);
        assert!(
            base_dirs.as_ref().is_none_or(|b| *b == dirs),
            "the templates are on different base roots: {base_dirs:?} and {dirs:?}"
        );
        base_dirs = Some(dirs);
        let layers: Vec<PathBuf> = record["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| store.join("layers").join(id.as_str().unwrap()))
            .collect();
        images.push(layers);
    }
    let mut seen = HashSet::new();
    let base = base_dirs.map_or(0, |dirs| allocated(&dirs, &mut seen));
    let deltas = images.iter().map(|layers| allocated(layers, &mut seen)).collect();
    Disk { base, deltas, layers: images.iter().map(Vec::len).collect() }
}

/// The blocks allocated to everything under `roots` (the roots included, symbolic links not
/// followed), each inode counted once across calls sharing `seen`: what `du` reports.
fn allocated(roots: &[PathBuf], seen: &mut HashSet<(u64, u64)>) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if seen.insert((meta.dev(), meta.ino())) {
            total += meta.blocks() * 512;
        }
        if meta.is_dir() {
            let Ok(entries) = std::fs::read_dir(&path) else { continue };
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    total
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}
