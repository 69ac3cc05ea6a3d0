//! Benchmarks of the local runtime: create → ready, pause, resume, delete; hibernate and restore
//! against resident memory; the cost of a pool of idle sandboxes.
//!
//! `cargo bench -p oka-runtime --bench runtime` (as root; hibernate and restore need
//! `criu` ≥ 4.2, `scripts/install-criu.sh`). Prints p50 / p99 / max of each operation:
//! - create → ready: `ensure` of a new sandbox running `sleep`, until the init reports the command
//!   executed (namespaces, overlay root, cgroups, pivot, exec); n = 100;
//! - pause / resume: freezer round trips on a sandbox running a shell loop; n = 100;
//! - delete: kill, reap, remove cgroups and the writable layer; n = 100;
//! - connect to a port inside a sandbox (a Python listener), n = 1,000 one at a time, then 4,000
//!   by 32 tasks at once (`OKA_BENCH_ONLY=connect` stops after this);
//! - create → ready of loopback-only against outbound sandboxes (veth pair and NAT), interleaved,
//!   n = 50 each (`OKA_BENCH_ONLY=outbound` stops after this);
//! - checkpoint-restore: the same Python process of 20 MB, then 500 MB, moved onto a new spec with
//!   its processes (`OKA_BENCH_ONLY=checkpoint-restore` runs only this part after the creates);
//! - hibernate / restore: a Python process holding a touched `bytearray` of 20 MB, then 200 MB
//!   (and listening on a port, checked after the last restore); n = 10 each, with the sandbox's
//!   memory before the dump and the image size;
//! - 200 idle sandboxes (`exec sleep infinity`) created 8 at a time:
//!   total time to all ready, per-sandbox `ensure` latency, and host memory per sandbox measured
//!   two ways (the sum of their memory cgroups' usage / 200, and the drop of the host's
//!   `MemAvailable` / 200); then deleted 8 at a time.
//!
//! Aims: create → ready under 20 ms p50, pause and resume under 5 ms, restore of a
//! 20 MB sandbox under 200 ms.
//!
//! Current figures: `docs/benchmarks.md` (Local runtime).
//!
//! Of a restore, `criu restore` itself is all but about 3 ms. On this VM CRIU cannot cache its
//! kernel probe (`/run` is not a tmpfs), which costs 25–40 ms per `criu` run: a host with a
//! tmpfs `/run` saves that on every dump and every restore.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::{Runtime, SandboxId, SandboxSpec};

const N: usize = 100;

/// Connects one at a time; then tasks at once, each connecting this many times.
const CONNECTS: usize = 1000;
const CONNECT_TASKS: usize = 32;
const CONNECTS_PER_TASK: usize = 125;

/// Hibernate/restore cycles per memory size.
const CYCLES: usize = 10;

/// Idle sandboxes in the pool benchmark, and how many are created at once.
const POOL: usize = 200;
const POOL_CONCURRENCY: usize = 8;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED runtime bench: the local runtime needs root");
        return;
    }
    let rt =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("tokio runtime: {e}");
                std::process::exit(1);
            }
        };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), BoxError> {
    let dir = tempfile::Builder::new().prefix("oka-bench-").tempdir()?;
    let mut config = LocalConfig::new(dir.path().join("state"), env!("CARGO_BIN_EXE_oka-init"));
    config.cgroup_name = "oka-bench".into();
    let runtime = LocalRuntime::open(config).await?;

    // Warm-up: page cache, blocking-pool threads.
    for i in 0..5 {
        let spec = spec(&format!("warm-{i}"), "exec sleep 1000")?;
        runtime.ensure(&spec).await?;
        runtime.delete(&spec.id).await?;
    }

    let mut create = Vec::with_capacity(N);
    let mut delete = Vec::with_capacity(N);
    for i in 0..N {
        let spec = spec(&format!("bench-{i}"), "exec sleep 1000")?;
        let t = Instant::now();
        runtime.ensure(&spec).await?;
        create.push(t.elapsed());
        let t = Instant::now();
        runtime.delete(&spec.id).await?;
        delete.push(t.elapsed());
    }

    let spec = spec("pauser", "while :; do i=$((i+1)); sleep 0.001; done")?;
    runtime.ensure(&spec).await?;
    let mut pause = Vec::with_capacity(N);
    let mut resume = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        runtime.pause(&spec.id).await?;
        pause.push(t.elapsed());
        let t = Instant::now();
        runtime.resume(&spec.id).await?;
        resume.push(t.elapsed());
    }
    runtime.delete(&spec.id).await?;

    println!("local runtime, n = {N} each (p50 / p99 / max)");
    report("create -> ready", &mut create);
    report("pause", &mut pause);
    report("resume", &mut resume);
    report("delete", &mut delete);

    println!();
    connects(&runtime).await?;
    if std::env::var("OKA_BENCH_ONLY").as_deref() == Ok("connect") {
        return Ok(());
    }

    println!();
    outbound_create(&runtime).await?;
    if std::env::var("OKA_BENCH_ONLY").as_deref() == Ok("outbound") {
        return Ok(());
    }

    match oka_runtime::local::criu::check() {
        Ok(version) => {
            println!();
            println!("hibernate / restore (criu {version}), n = {CYCLES} each (p50 / p99 / max)");
            if std::env::var("OKA_BENCH_ONLY").as_deref() != Ok("checkpoint-restore") {
                for mb in [20, 200] {
                    hibernate_restore(&runtime, mb).await?;
                }
            }
            println!();
            println!("checkpoint-restore upgrade (processes kept), n = {CYCLES} each");
            for mb in [20, 500] {
                checkpoint_restore(&runtime, mb).await?;
            }
            if std::env::var("OKA_BENCH_ONLY").as_deref() == Ok("checkpoint-restore") {
                return Ok(());
            }
        }
        Err(e) => println!("SKIPPED hibernate / restore: {e}"),
    }

    println!();
    idle_pool(&runtime).await?;
    Ok(())
}

/// Create → ready of loopback-only and outbound sandboxes, interleaved so that machine noise hits
/// both alike; the difference is the veth pair, its addresses and route (two `ip` runs).
async fn outbound_create(runtime: &LocalRuntime) -> Result<(), BoxError> {
    const M: usize = 50;
    let mut loopback = Vec::with_capacity(M);
    let mut outbound = Vec::with_capacity(M);
    for i in 0..M {
        for (mode, samples) in [
            (oka_runtime_api::NetworkMode::Loopback, &mut loopback),
            (oka_runtime_api::NetworkMode::Outbound, &mut outbound),
        ] {
            let mut spec = spec(&format!("net-{i}-{mode:?}"), "exec sleep 1000")?;
            spec.network = mode;
            let t = Instant::now();
            runtime.ensure(&spec).await?;
            samples.push(t.elapsed());
            runtime.delete(&spec.id).await?;
        }
    }
    oka_runtime::local::network::remove_nat(&runtime.config().state_dir)?;
    println!("create -> ready by network, n = {M} each, interleaved (p50 / p99 / max)");
    report("loopback", &mut loopback);
    report("outbound", &mut outbound);
    Ok(())
}

/// Python holding `mb` MiB of touched memory, listening on 127.0.0.1:8000.
fn python_holding(id: &str, mb: u32) -> Result<SandboxSpec, oka_runtime_api::SpecError> {
    let code = format!(
        "import socket, time\n\
         blob = bytearray({mb} << 20)\n\
         blob[::4096] = b'\\x01' * len(range(0, len(blob), 4096))\n\
         s = socket.socket(); s.bind(('127.0.0.1', 8000)); s.listen()\n\
         open('/root/ready', 'w').write('ready')\n\
         time.sleep(1e9)\n"
    );
    Ok(SandboxSpec::new(SandboxId::new(id)?, vec!["python3".into(), "-c".into(), code]))
}

/// `connect` to a port inside a sandbox (what every claim's `/init` and every new gateway
/// connection does): [`CONNECTS`] one at a time, then [`CONNECT_TASKS`] tasks at once.
async fn connects(runtime: &LocalRuntime) -> Result<(), BoxError> {
    let code = "import socket\n\
                s = socket.socket(); s.bind(('127.0.0.1', 8000)); s.listen(4096)\n\
                open('/root/ready', 'w').write('ready')\n\
                while True: s.accept()[0].close()\n";
    let id = SandboxId::new("connect")?;
    let spec = SandboxSpec::new(id.clone(), vec!["python3".into(), "-c".into(), code.into()]);
    start_until_ready(runtime, &spec, "the listener").await?;
    let mut one = Vec::with_capacity(CONNECTS);
    for _ in 0..CONNECTS {
        let t = Instant::now();
        drop(runtime.connect(&id, 8000).await?);
        one.push(t.elapsed());
    }
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONNECT_TASKS {
        let (runtime, id) = (runtime.clone(), id.clone());
        tasks.spawn(async move {
            for _ in 0..CONNECTS_PER_TASK {
                drop(runtime.connect(&id, 8000).await?);
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let wall = t.elapsed();
    runtime.delete(&id).await?;
    let total = CONNECT_TASKS * CONNECTS_PER_TASK;
    println!("connect into a sandbox (p50 / p99 / max)");
    report(&format!("connect, one at a time, n = {CONNECTS}"), &mut one);
    println!(
        "  {CONNECT_TASKS} at a time: {total} connects in {:.0} ms = {:.0}/s",
        wall.as_secs_f64() * 1e3,
        total as f64 / wall.as_secs_f64()
    );
    Ok(())
}

/// Starts `spec`, a Python program that writes `/root/ready` once set up, and waits (at most a
/// minute) until it has; returns the sandbox's directory.
async fn start_until_ready(
    runtime: &LocalRuntime,
    spec: &SandboxSpec,
    what: &str,
) -> Result<std::path::PathBuf, BoxError> {
    runtime.ensure(spec).await?;
    let dir = runtime.paths(&spec.id).await.ok_or("sandbox vanished")?.dir;
    wait_for(what, Duration::from_secs(60), || dir.join("upper/root/ready").exists()).await?;
    Ok(dir)
}

async fn hibernate_restore(runtime: &LocalRuntime, mb: u32) -> Result<(), BoxError> {
    let spec = python_holding(&format!("hib-{mb}"), mb)?;
    let dir = start_until_ready(runtime, &spec, &format!("python to hold {mb} MB")).await?;
    let memory = runtime.inspect(&spec.id).await?.usage.and_then(|u| u.memory_bytes).unwrap_or(0);
    let mut hibernate = Vec::with_capacity(CYCLES);
    let mut restore = Vec::with_capacity(CYCLES);
    let mut images = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t = Instant::now();
        runtime.hibernate(&spec.id).await?;
        hibernate.push(t.elapsed());
        images.push(dir_bytes(&dir.join("checkpoint/images")));
        let t = Instant::now();
        runtime.restore(&spec.id).await?;
        restore.push(t.elapsed());
    }
    // It still listens after the last restore.
    drop(runtime.connect(&spec.id, 8000).await?);
    runtime.delete(&spec.id).await?;
    images.sort_unstable();
    println!(
        "  {mb:>3} MB in python: sandbox memory {:.1} MiB before the dump, images {:.1} MiB",
        mib(memory),
        mib(images[images.len() / 2])
    );
    report(&format!("hibernate {mb} MB"), &mut hibernate);
    report(&format!("restore {mb} MB"), &mut restore);
    Ok(())
}

/// A sandbox holding `mb` MiB moved onto a new spec (its memory limit raised each cycle) with
/// its processes, as a CheckpointRestore upgrade moves it: dump, new spec, restore.
async fn checkpoint_restore(runtime: &LocalRuntime, mb: u32) -> Result<(), BoxError> {
    let mut spec = python_holding(&format!("cr-{mb}"), mb)?;
    spec.resources.memory_bytes = Some(u64::from(mb + 256) << 20);
    start_until_ready(runtime, &spec, &format!("python to hold {mb} MB")).await?;
    let mut upgrade = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        spec.resources.memory_bytes = spec.resources.memory_bytes.map(|m| m + (16 << 20));
        let t = Instant::now();
        runtime.checkpoint_restore(&spec).await?;
        upgrade.push(t.elapsed());
    }
    // The same process still listens.
    drop(runtime.connect(&spec.id, 8000).await?);
    runtime.delete(&spec.id).await?;
    report(&format!("checkpoint-restore {mb} MB"), &mut upgrade);
    Ok(())
}

async fn idle_pool(runtime: &LocalRuntime) -> Result<(), BoxError> {
    let available_before = mem_available_bytes()?;
    let permits = Arc::new(tokio::sync::Semaphore::new(POOL_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    let t = Instant::now();
    for i in 0..POOL {
        let (runtime, permits) = (runtime.clone(), permits.clone());
        let spec = spec(&format!("idle-{i}"), "exec sleep infinity")?;
        tasks.spawn(async move {
            let _permit = permits.acquire().await?;
            let t = Instant::now();
            runtime.ensure(&spec).await?;
            Ok::<_, BoxError>((spec.id, t.elapsed()))
        });
    }
    let mut ids = Vec::with_capacity(POOL);
    let mut latency = Vec::with_capacity(POOL);
    while let Some(done) = tasks.join_next().await {
        let (id, elapsed) = done??;
        ids.push(id);
        latency.push(elapsed);
    }
    let total = t.elapsed();
    let mut cgroup_bytes = 0u64;
    for id in &ids {
        cgroup_bytes += runtime.inspect(id).await?.usage.and_then(|u| u.memory_bytes).unwrap_or(0);
    }
    let available_after = mem_available_bytes()?;
    let n = ids.len() as f64;
    println!(
        "{POOL} idle sandboxes (`exec sleep infinity`), {POOL_CONCURRENCY} created at a time: all ready in {:.2} s",
        total.as_secs_f64()
    );
    report("ensure each", &mut latency);
    println!(
        "  host memory per idle sandbox: {:.2} MiB (memory cgroups) / {:.2} MiB (MemAvailable drop)",
        mib(cgroup_bytes) / n,
        mib(available_before.saturating_sub(available_after)) / n
    );

    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let (runtime, permits) = (runtime.clone(), permits.clone());
        tasks.spawn(async move {
            let _permit = permits.acquire().await?;
            runtime.delete(&id).await?;
            Ok::<_, BoxError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    println!("  deleted all in {:.2} s", t.elapsed().as_secs_f64());
    if !runtime.list().await?.is_empty() {
        return Err("sandboxes left after the pool benchmark".into());
    }
    Ok(())
}

/// Polls `done` (1 ms doubling to 50 ms) until it holds or `timeout` passes.
async fn wait_for(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<(), BoxError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    while !done() {
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

fn mem_available_bytes() -> Result<u64, BoxError> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no MemAvailable in /proc/meminfo")?;
    Ok(kb * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn spec(id: &str, script: &str) -> Result<SandboxSpec, oka_runtime_api::SpecError> {
    Ok(SandboxSpec::new(SandboxId::new(id)?, vec!["/bin/sh".into(), "-c".into(), script.into()]))
}

fn report(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:>18}: {:8.3} ms / {:8.3} ms / {:8.3} ms",
        ms(at(0.50)),
        ms(at(0.99)),
        ms(samples[samples.len() - 1])
    );
}
