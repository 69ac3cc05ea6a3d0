//! Fork, end to end: `POST /sandboxes/{id}/fork` (one fork at a time) of a running sandbox of a
//! real `oka serve`, whose process holds 20 MB and then 500 MB of touched memory, against the fork
//! of an idle sandbox (the agent runtime alone) in the same run. Each fork is killed once
//! answered; the source runs on.
//!
//! The table gives the latency at the client and the server's split from the answer's
//! `Server-Timing`: the snapshot of the source (CRIU dump with the source left running, and a
//! copy of its writable layer) and the restore of the fork (its layer, CRIU restore, the fork's
//! `/init`).
//!
//! Knobs (environment): `OKA_BENCH_FORKS` (forks per size; default 20, and half that for 500
//! MB), `OKA_BENCH_SIZES` (comma-separated MB; default `0,20,500`), `OKA_BENCH_OKA` (the `oka`
//! binary to run, `oka-envd` beside it).
//! Run with `cargo bench -p oka --bench fork` as root (real sandboxes, CRIU); otherwise it prints
//! SKIPPED. `oka-envd` must be built beside `oka` (`cargo build --release -p oka-envd`).

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Client, ENVD_PORT, Serve, env_usize, envelope, oka, row};

/// `Authorization` of envd's process API for `root` (`root:` in base64): CRIU dumps a sandbox
/// whose processes run as another user only with `CAP_SYS_RESOURCE`, which some hosts withhold.
const ROOT: &str = "Basic cm9vdDo=";

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us without it: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED fork bench: real sandboxes need root");
        return;
    }
    let envd = Path::new(&oka()).with_file_name("oka-envd");
    if !envd.exists() {
        eprintln!("{} is missing: `cargo build --release -p oka-envd`", envd.display());
        std::process::exit(1);
    }
    let forks = env_usize("OKA_BENCH_FORKS", 20);
    let sizes: Vec<usize> = std::env::var("OKA_BENCH_SIZES")
        .unwrap_or_else(|_| "0,20,500".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let serve = Serve::start(2, &envd);
    serve.wait_stocked(2, Duration::from_secs(120));
    println!("\n| fork (count 1) | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    for mb in sizes {
        let n = if mb >= 500 { forks.div_ceil(2) } else { forks };
        let samples = bench_fork(&serve, mb, n);
        let what = if mb == 0 { "idle sandbox".to_owned() } else { format!("{mb} MB resident") };
        row(&format!("{what}: at the client"), &samples.client);
        row(&format!("{what}: snapshot (server)"), &samples.snapshot);
        row(&format!("{what}: restore and init (server)"), &samples.restore);
    }
}

/// The samples of one size.
struct Samples {
    client: Vec<Duration>,
    snapshot: Vec<Duration>,
    restore: Vec<Duration>,
}

/// `n` forks of a sandbox whose process holds `mb` MB (none: the agent runtime alone).
fn bench_fork(serve: &Serve, mb: usize, n: usize) -> Samples {
    let mut api = serve.api_client();
    let created = serve.create(&mut api).expect("the pool is stocked");
    let id = created.id.clone();
    let mut api_key = vec![("X-API-Key", serve.key.as_str())];
    let timeout = api.request(
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &[("X-API-Key", &serve.key), ("Content-Type", "application/json")],
        br#"{"timeout":3600}"#,
    );
    assert_eq!(timeout.status, 204);
    // The memory holder's stream stays open until the end (its process lives on meanwhile).
    let _holder = (mb > 0).then(|| hold_memory(serve, &id, &created.token, mb));
    let mut samples = Samples { client: Vec::new(), snapshot: Vec::new(), restore: Vec::new() };
    api_key.push(("Content-Type", "application/json"));
    for _ in 0..n {
        let started = Instant::now();
        let answer = api.request(
            "POST",
            &format!("/sandboxes/{id}/fork"),
            &api_key,
            br#"{"count":1,"timeout":120}"#,
        );
        let took = started.elapsed();
        assert_eq!(
            answer.status,
            201,
            "fork: {}\n{}",
            String::from_utf8_lossy(&answer.body),
            serve.log()
        );
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        let fork = body[0]["sandbox"]["sandboxID"]
            .as_str()
            .unwrap_or_else(|| panic!("the fork failed: {body}"))
            .to_owned();
        let timing = answer.header("server-timing").unwrap_or_default().to_owned();
        let metric = |name: &str| {
            timing
                .split(',')
                .find_map(|part| part.trim().strip_prefix(name)?.strip_prefix(";dur="))
                .and_then(|ms| ms.parse::<f64>().ok())
                .map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1e3))
        };
        samples.client.push(took);
        samples.snapshot.push(metric("snapshot"));
        samples.restore.push(metric("restore"));
        serve.kill(&mut api, &fork);
    }
    serve.kill(&mut api, &id);
    samples
}

/// Starts, as root, a process in sandbox `id` that allocates and touches `mb` MB and then
/// sleeps, and waits until it says so; the returned connection holds its stream open.
fn hold_memory(serve: &Serve, id: &str, token: &str, mb: usize) -> Client {
    let program = format!(
        "import time\nb = bytearray({mb} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n\
         print('ready', flush=True)\ntime.sleep(1e6)\n"
    );
    let request = serde_json::json!({
        "process": {"cmd": "/usr/bin/python3", "args": ["-c", program], "envs": {}},
        "stdin": false,
    });
    let mut gateway = Client::connect(serve.gateway);
    let headers = [
        ("E2b-Sandbox-Id", id),
        ("E2b-Sandbox-Port", ENVD_PORT),
        ("X-Access-Token", token),
        ("Authorization", ROOT),
        ("Content-Type", "application/connect+json"),
        ("Connect-Protocol-Version", "1"),
    ];
    gateway.send(
        "POST",
        "/process.Process/Start",
        &headers,
        &envelope(request.to_string().as_bytes()),
    );
    let (status, _) = gateway.read_head();
    assert_eq!(status, 200, "Process/Start of the memory holder");
    let mut buffer = Vec::new();
    while let Some(chunk) = gateway.read_chunk() {
        buffer.extend_from_slice(&chunk);
        while buffer.len() >= 5 {
            let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if buffer.len() < 5 + len {
                break;
            }
            let message: serde_json::Value =
                serde_json::from_slice(&buffer[5..5 + len]).unwrap_or_default();
            buffer.drain(..5 + len);
            // "ready\n" in base64.
            if message["event"]["data"]["stdout"].as_str() == Some("cmVhZHkK") {
                return gateway;
            }
        }
    }
    panic!("the memory holder ended before it was ready:\n{}", serve.log());
}
