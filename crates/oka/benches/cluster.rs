//! oka's cluster components against a real Kubernetes API server and etcd on this machine:
//! E2B creates at the client (p50, p99), claims per second with 32 clients, the API server
//! writes a claim costs, and the time a standby controller takes to lead after the leader is
//! killed.
//!
//! The server is the tests' CRD-only `apiextensions-apiserver` (built by
//! `scripts/build-apiserver.sh`), with a stand-in CRD for the Lease (see `tests/cluster.rs`).
//! Two node agents, two controllers, two managers and a gateway run as processes, as in
//! `tests/cluster.rs`; the default pool holds `OKA_BENCH_POOL` sandboxes (default 96).
//!
//! - **create**: `OKA_BENCH_CREATES` (default 40) sequential creates through one manager, each
//!   killed before the next, the pool refilling behind them.
//! - **claims/s**: 32 clients create at once, alternating between the two managers, until the
//!   pool is taken (`create-on-no-stock: false`); the figure is claims over wall time.
//! - **writes per claim**: the API server's own `apiserver_request_total` for writes (POST,
//!   PUT, PATCH, DELETE), read before and after. The hot path is measured with the controllers
//!   stopped (SIGSTOP), so only the managers write; then the controllers go on (SIGCONT) and
//!   the writes until the pool is full again are the refill's, per claimed sandbox.
//! - **takeover**: `OKA_BENCH_TAKEOVERS` (default 3) times, kill -9 the leader and time until
//!   the standby reports `leader_election_master_status 1` (lease 10 s, retry 1 s).
//!
//! - **baseline**: then `oka serve` on this machine with the same pool, the same creates and the
//!   same 32-client burst, so the two are compared within one run.
//!
//! Run with `cargo bench -p oka --bench cluster` as root; otherwise it prints SKIPPED.
//! `oka-envd` must be built beside `oka` (`cargo build --release -p oka-envd`).

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

#[path = "../../store/tests/support/apiserver.rs"]
mod apiserver;
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::support::cluster::{ADMIN_KEY, Component, config, logs_of};
use common::{CREATE_BODY, Client, env_usize, fmt, percentile};
use oka_store::Store;
use oka_store::kubernetes::KubeStore;

/// Writes the API server has done (answered 2xx), by its own counter: by resource, verb and
/// subresource.
async fn writes(client: &kube::Client) -> BTreeMap<String, u64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let label = |line: &str, name: &str| {
        let start = line.find(&format!("{name}=\"")).map(|i| i + name.len() + 2)?;
        let end = line[start..].find('"')? + start;
        Some(line[start..end].to_owned())
    };
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let verb = label(line, "verb").unwrap_or_default();
        let code = label(line, "code").unwrap_or_default();
        if !["POST", "PUT", "PATCH", "DELETE"].contains(&verb.as_str()) || !code.starts_with("20") {
            continue;
        }
        let what = format!(
            "{verb} {}{}",
            label(line, "resource").unwrap_or_default(),
            label(line, "subresource")
                .filter(|s| !s.is_empty())
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        let n = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64;
        *counts.entry(what).or_insert(0) += n;
    }
    counts
}

/// What `after` counts beyond `before`, and its total.
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, String) {
    let mut total = 0;
    let mut parts = Vec::new();
    for (what, n) in after {
        let d = n - before.get(what).copied().unwrap_or(0);
        if d > 0 {
            total += d;
            parts.push(format!("{what} {d}"));
        }
    }
    (total, parts.join(", "))
}

async fn available(store: &KubeStore) -> usize {
    let selector = oka_store::Selector::from_labels([(oka_api::labels::SANDBOX_POOL, "base")]);
    let listed = store.list::<oka_api::Sandbox>(Some("default"), &selector).await.unwrap();
    let now = jiff::Timestamp::now();
    listed
        .items
        .iter()
        .filter(|s| oka_api::sandbox_state(s, now).state == oka_api::SandboxState::Available)
        .count()
}

/// Waits until the pool holds `pool` available sandboxes, as listed (not as the SandboxSet's
/// status says, which lags while its controller catches up).
async fn wait_available(store: &KubeStore, pool: usize, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while available(store).await < pool {
        assert!(Instant::now() < deadline, "the pool did not fill:\n{}", logs_of(dir));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn create(api: &mut Client, key: &str) -> Option<String> {
    let response = api.request(
        "POST",
        "/v2/sandboxes",
        &[("X-API-Key", key), ("Content-Type", "application/json")],
        CREATE_BODY.as_bytes(),
    );
    if response.status == 503 {
        return None;
    }
    assert_eq!(response.status, 201, "create: {}", String::from_utf8_lossy(&response.body));
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    Some(body["sandboxID"].as_str().unwrap().to_owned())
}

fn kill(api: &mut Client, id: &str) {
    let response =
        api.request("DELETE", &format!("/sandboxes/{id}"), &[("X-API-Key", ADMIN_KEY)], b"");
    assert_eq!(response.status, 204, "kill {id}");
}

/// 32 clients create at once, alternating between `ports`, until the pool is empty; returns
/// what they got and how long it took.
fn burst(ports: &[u16], key: &str) -> (Vec<String>, Duration) {
    let begun = Instant::now();
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let port = ports[i % ports.len()];
            let key = key.to_owned();
            std::thread::spawn(move || {
                let mut api = Client::connect(port);
                let mut claimed = Vec::new();
                while let Some(id) = create(&mut api, &key) {
                    claimed.push(id);
                }
                claimed
            })
        })
        .collect();
    let claimed: Vec<String> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let unique: std::collections::HashSet<&String> = claimed.iter().collect();
    assert_eq!(unique.len(), claimed.len(), "a sandbox was handed out twice");
    (claimed, begun.elapsed())
}

/// `oka serve` with the same pool, in the same run: the one-machine figures beside the
/// cluster's.
fn serve_baseline(pool: usize, creates: usize) {
    let envd = Path::new(&common::oka()).with_file_name("oka-envd");
    let serve = common::Serve::start(pool, &envd);
    serve.wait_stocked(pool, Duration::from_secs(600));
    let mut api = serve.api_client();
    let mut samples = Vec::new();
    for _ in 0..creates {
        let begun = Instant::now();
        let created = serve.create(&mut api).expect("the pool is stocked");
        samples.push(begun.elapsed());
        serve.kill(&mut api, &created.id);
        std::thread::sleep(Duration::from_millis(50));
    }
    serve.wait_stocked(pool, Duration::from_secs(600));
    println!(
        "| baseline: create at the client, `oka serve` | {creates} | {} | {} |",
        fmt(percentile(&samples, 50.0)),
        fmt(percentile(&samples, 99.0))
    );
    let (claimed, elapsed) = burst(&[serve.api], &serve.key);
    println!(
        "| baseline: claims/s, 32 clients, `oka serve` | {} | {:.0} claims/s | |",
        claimed.len(),
        claimed.len() as f64 / elapsed.as_secs_f64()
    );
}

fn signal(component: &Component, signal: &str) {
    let pid = component.pid().unwrap();
    std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED: the cluster bench runs real sandboxes and needs root");
        return;
    }
    let pool = env_usize("OKA_BENCH_POOL", 96);
    let creates = env_usize("OKA_BENCH_CREATES", 40);
    let takeovers = env_usize("OKA_BENCH_TAKEOVERS", 3);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut crds = oka_api::cluster_crds();
    crds.push(apiserver::lease_stand_in());
    let Some(server) = rt.block_on(apiserver::ApiServer::start(&crds)) else {
        println!("SKIPPED: no API server binaries");
        return;
    };
    let client = rt.block_on(server.client());
    let store = KubeStore::new(client.clone());
    let dir = tempfile::Builder::new().prefix("oka-cluster-bench-").tempdir().unwrap();
    let dir = dir.path().to_owned();
    std::fs::write(dir.join("relay-token"), "bench-relay-token-".repeat(3)).unwrap();
    let kubeconfig = server.kubeconfig().to_owned();
    let port = common::support::free_port;
    let gateway_port = port();
    let mut nodes = Vec::new();
    for name in ["node-a", "node-b"] {
        let api = port();
        let path = config(&dir, &kubeconfig, pool, api, gateway_port, Some((name, port())));
        let state = dir.join(name);
        std::fs::create_dir_all(&state).unwrap();
        let args = [
            "node",
            "--config",
            &path.display().to_string(),
            "--state-dir",
            &state.display().to_string(),
        ]
        .map(str::to_owned);
        let node = Component::start(name, &args, &dir, api);
        node.wait_ready(Duration::from_secs(60));
        nodes.push((node, state));
    }
    let start = |kind: &str, i: usize| {
        let api = port();
        let path = config(&dir, &kubeconfig, pool, api, gateway_port, None);
        let args = [kind, "--config", &path.display().to_string()].map(str::to_owned);
        Component::start(&format!("{kind}-{i}"), &args, &dir, api)
    };
    let mut controllers = vec![start("controller", 0), start("controller", 1)];
    let managers = [start("manager", 0), start("manager", 1)];
    let gateway = start("gateway", 0);
    for c in managers.iter().chain([&gateway]) {
        c.wait_ready(Duration::from_secs(60));
    }
    let started = Instant::now();
    rt.block_on(wait_available(&store, pool, &dir));
    println!("pool of {pool} filled in {:.1} s", started.elapsed().as_secs_f64());

    // The watches the components hold open, by resource (each write is sent to every watch
    // of its kind).
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = rt.block_on(client.request_text(request)).unwrap();
    let watches: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
        })
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    eprintln!("open watches:\n{}", watches.join("\n"));

    // Creates at the client.
    let mut api = Client::connect(managers[0].port);
    let mut samples = Vec::new();
    for _ in 0..creates {
        let begun = Instant::now();
        let id = create(&mut api, ADMIN_KEY).expect("the pool is stocked");
        samples.push(begun.elapsed());
        kill(&mut api, &id);
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.block_on(wait_available(&store, pool, &dir));
    println!("| measure | n | p50 | p99 |");
    println!("|---|---|---|---|");
    println!(
        "| create at the client (one manager) | {creates} | {} | {} |",
        fmt(percentile(&samples, 50.0)),
        fmt(percentile(&samples, 99.0))
    );

    // Claims per second with 32 clients; the controllers stopped, so only the managers write.
    for c in &controllers {
        signal(c, "STOP");
    }
    let before = rt.block_on(writes(&client));
    let manager_ports: Vec<u16> = managers.iter().map(|m| m.port).collect();
    let (claimed, elapsed) = burst(&manager_ports, ADMIN_KEY);
    let (hot, hot_parts) = delta(&before, &rt.block_on(writes(&client)));
    let n = claimed.len();
    println!(
        "| claims/s, 32 clients over 2 managers | {n} | {:.0} claims/s | |",
        n as f64 / elapsed.as_secs_f64()
    );
    println!(
        "| API writes per claim while the controllers are stopped | {n} | {:.2} | |",
        hot as f64 / n as f64
    );
    eprintln!("writes during the claims: {hot_parts}");
    for c in &controllers {
        signal(c, "CONT");
    }
    let before = rt.block_on(writes(&client));
    rt.block_on(wait_available(&store, pool, &dir));
    std::thread::sleep(Duration::from_secs(2));
    let (refill, refill_parts) = delta(&before, &rt.block_on(writes(&client)));
    eprintln!("refill writes: {refill_parts}");
    println!(
        "| API writes per claimed sandbox, pool refill (controllers, nodes) | {n} | {:.2} | |",
        refill as f64 / n as f64
    );
    let mut api = Client::connect(managers[1].port);
    for id in &claimed {
        kill(&mut api, id);
    }

    // Takeover after kill -9 of the leader.
    let mut takes = Vec::new();
    for round in 0..takeovers {
        let deadline = Instant::now() + Duration::from_secs(30);
        let leader = loop {
            if let Some(i) = controllers.iter().position(Component::leading) {
                break i;
            }
            assert!(Instant::now() < deadline, "no leader:\n{}", logs_of(&dir));
            std::thread::sleep(Duration::from_millis(50));
        };
        controllers[leader].kill9();
        let killed = Instant::now();
        while !controllers[1 - leader].leading() {
            assert!(killed.elapsed() < Duration::from_secs(30), "no takeover:\n{}", logs_of(&dir));
            std::thread::sleep(Duration::from_millis(20));
        }
        takes.push(killed.elapsed());
        controllers[leader] = start("controller", 2 + round);
        controllers[leader].wait_ready(Duration::from_secs(60));
    }
    println!(
        "| standby leads after kill -9 of the leader | {takeovers} | {} | {} |",
        fmt(percentile(&takes, 50.0)),
        fmt(percentile(&takes, 99.0))
    );

    drop(gateway);
    drop(managers);
    controllers.clear();
    for (mut node, state) in nodes {
        node.stop();
        common::support::remove_sandboxes(&state, common::OKA);
    }
    drop(server);
    serve_baseline(pool, creates);
}
