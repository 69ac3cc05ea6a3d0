//! The Kubernetes-compatible API under load: lists of many Sandboxes (JSON and Table, directly
//! and through kubectl), watchers during a burst of claims, and `kubectl apply`.
//!
//! `cargo bench -p oka --bench kubeapi` (env `SANDBOXES`, default 10000; `CLAIMS`, default
//! 1000; `WATCHERS`, default 100; `CLIENTS`, default 32). The API is served in process over the
//! embedded store, on plain HTTP for the raw client and on TLS for kubectl (`KUBECTL` names
//! another binary); pools are stocked by writing Sandbox objects straight into the store, and
//! claims go through the manager's claim engine, as E2B creates do. The watchers' client
//! threads run at the lowest priority: they stand for clients on other machines.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{env_usize, fmt, percentile};
use oka_api::{Sandbox, SandboxPhase, SandboxSet, SandboxSetSpec, SandboxSetStatus};
use oka_manager::{ClaimConfig, ClaimEngine, ClaimOptions, Index, PoolRef};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};

const TOKEN: &str = "bench-admin-token";
const SANDBOXES: &str = "/apis/agents.kruise.io/v1alpha1/namespaces/default/sandboxes";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run());
}

async fn run() {
    let sandboxes = env_usize("SANDBOXES", 10_000);
    let claims = env_usize("CLAIMS", 1000);
    let watchers = env_usize("WATCHERS", 100);
    let clients = env_usize("CLIENTS", 32);
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let index = Index::spawn(store.clone());
    let (plain, kubeconfig) = serve(store.clone(), dir.path()).await;

    println!("## Lists ({sandboxes} Sandboxes)\n");
    stock(&store, "listed", sandboxes).await;
    println!("| request | n | p50 | p99 | bytes |\n|---|---|---|---|---|");
    for (name, accept) in [("list as JSON", "application/json"), ("list as Table", TABLE)] {
        let (samples, bytes) = timed_gets(plain, SANDBOXES, accept, 20);
        println!(
            "| {name} | {} | {} | {} | {bytes} |",
            samples.len(),
            fmt(percentile(&samples, 50.0)),
            fmt(percentile(&samples, 99.0))
        );
    }
    for (name, args) in [
        ("kubectl get sbx -o json", &["get", "sbx", "-o", "json"][..]),
        ("kubectl get sbx (table, pages of 500)", &["get", "sbx"][..]),
    ] {
        let (samples, bytes) = timed_kubectl(&kubeconfig, args, 5);
        println!(
            "| {name} | {} | {} | {} | {bytes} (stdout) |",
            samples.len(),
            fmt(percentile(&samples, 50.0)),
            fmt(percentile(&samples, 99.0))
        );
    }

    println!("\n## Watchers during a burst of {claims} claims ({clients} clients)\n");
    println!("| round | watchers | claims/s | every watcher saw every claim, in order |");
    println!("|---|---|---|---|");
    let engine =
        Arc::new(ClaimEngine::new(store.clone(), Arc::clone(&index), ClaimConfig::default()));
    for round in 0..2 {
        for with in [0, watchers] {
            let pool = format!("burst-{round}-{with}");
            stock(&store, &pool, claims).await;
            wait_members(&index, &pool, claims).await;
            let rv = store
                .list::<Sandbox>(Some("default"), &oka_store::Selector::everything())
                .await
                .unwrap()
                .resource_version;
            let selector = format!("agents.kruise.io/sandbox-pool={pool}");
            let streams: Vec<_> =
                (0..with).map(|_| Watcher::start(plain, &rv, &selector, claims)).collect();
            let started = Instant::now();
            burst(&engine, &pool, claims, clients).await;
            let rate = claims as f64 / started.elapsed().as_secs_f64();
            let complete = streams.into_iter().all(Watcher::finish);
            let verdict = if with == 0 { "-".to_owned() } else { complete.to_string() };
            println!("| {} | {with} | {rate:.0} | {verdict} |", round + 1);
        }
    }

    println!("\n## kubectl apply of a SandboxSet\n");
    let samples = timed_applies(&kubeconfig, 20);
    println!("| request | n | p50 | p99 |\n|---|---|---|---|");
    println!(
        "| PATCH as kubectl apply sends it (server side, from kubectl's -v=6 timing) | {} | {} | {} |",
        samples.len(),
        fmt(percentile(&samples, 50.0)),
        fmt(percentile(&samples, 99.0))
    );
}

/// Serves the API on plain HTTP and on TLS; the plain address and a kubeconfig for the TLS one.
async fn serve(store: EmbeddedStore, dir: &std::path::Path) -> (SocketAddr, std::path::PathBuf) {
    let config = oka_kubeapi::KubeApiConfig {
        admin_token: TOKEN.into(),
        server_address: "127.0.0.1".into(),
        team_keys: None,
        namespaces: Vec::new(),
    };
    let app = oka_kubeapi::router(store, config);
    // As `oka serve` serves it: on the API's own threads, below normal priority.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap();
    oka_kubeapi::runtime::serve_plain(plain, app.clone(), std::future::pending());
    let tls = oka_kubeapi::tls::Tls::load_or_create(dir, &["127.0.0.1".to_owned()]).unwrap();
    let secure = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let secure_addr = secure.local_addr().unwrap();
    oka_kubeapi::runtime::serve_tls(secure, &tls, app, std::future::pending());
    let kubeconfig = dir.join("kubeconfig");
    let text = oka_kubeapi::kubeconfig(&format!("https://{secure_addr}"), &tls.ca_pem, TOKEN);
    std::fs::write(&kubeconfig, text).unwrap();
    (plain_addr, kubeconfig)
}

/// Creates pool `name` with `count` available members, written straight into the store.
async fn stock(store: &EmbeddedStore, name: &str, count: usize) {
    let mut set = SandboxSet::new(name, SandboxSetSpec { replicas: 0, ..Default::default() });
    set.metadata.namespace = Some("default".into());
    let mut set = store.create("default", &set).await.unwrap();
    set.status =
        Some(SandboxSetStatus { update_revision: Some("rev-1".into()), ..Default::default() });
    let set = store.update_status("default", &set).await.unwrap();
    let tasks = 16;
    let per = count.div_ceil(tasks);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (store, set) = (store.clone(), set.clone());
        let range = (t * per).min(count)..((t + 1) * per).min(count);
        handles.push(tokio::spawn(async move {
            for i in range {
                let pool = set.metadata.name.clone().unwrap();
                let mut sandbox = Sandbox::test()
                    .name(&format!("{pool}-{i:05}"))
                    .namespace("default")
                    .pooled(&pool)
                    .label(oka_api::labels::TEMPLATE_HASH, "rev-1")
                    .phase(SandboxPhase::Running)
                    .ready()
                    .build();
                sandbox.metadata.uid = None;
                if let Some(owner) =
                    sandbox.metadata.owner_references.as_mut().and_then(|o| o.first_mut())
                {
                    owner.uid = set.metadata.uid.clone().unwrap();
                }
                let status = sandbox.status.clone();
                let mut created = store.create("default", &sandbox).await.unwrap();
                created.status = status;
                store.update_status("default", &created).await.unwrap();
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
}

/// Waits until the claim engine's index shows `count` members of the pool.
async fn wait_members(index: &Arc<Index>, pool: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while index.pool_members("default", pool).len() < count {
        assert!(Instant::now() < deadline, "the index did not see the pool");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `claims` claims from `pool` by `clients` concurrent clients.
async fn burst(
    engine: &Arc<ClaimEngine<EmbeddedStore>>,
    pool: &str,
    claims: usize,
    clients: usize,
) {
    let per = claims / clients;
    let extra = claims % clients;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let engine = Arc::clone(engine);
            let pool = PoolRef::new("default", pool);
            let n = per + usize::from(c < extra);
            tokio::spawn(async move {
                for _ in 0..n {
                    engine.claim(&pool, "bench", &ClaimOptions::default()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// One GET over HTTP/1.0 (the answer ends with the connection): its body.
fn get(addr: SocketAddr, path: &str, accept: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let head = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(answer.starts_with(b"HTTP/1.0 200"), "{}", String::from_utf8_lossy(&answer[..head]));
    answer.split_off(head)
}

fn timed_gets(addr: SocketAddr, path: &str, accept: &str, n: usize) -> (Vec<Duration>, usize) {
    let mut bytes = 0;
    let samples = (0..n)
        .map(|_| {
            let started = Instant::now();
            bytes = get(addr, path, accept).len();
            started.elapsed()
        })
        .collect();
    (samples, bytes)
}

fn kubectl() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned())
}

fn timed_kubectl(kubeconfig: &std::path::Path, args: &[&str], n: usize) -> (Vec<Duration>, usize) {
    let mut bytes = 0;
    let samples = (0..n)
        .map(|_| {
            let started = Instant::now();
            let out = Command::new(kubectl())
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            bytes = out.stdout.len();
            started.elapsed()
        })
        .collect();
    (samples, bytes)
}

/// `kubectl apply` of one SandboxSet `n` times with a new replica count each time: the time the
/// server took for each PATCH, as kubectl's `-v=6` log reports it.
fn timed_applies(kubeconfig: &std::path::Path, n: usize) -> Vec<Duration> {
    let mut samples = Vec::new();
    for i in 0..=n {
        let yaml = format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: applied\nspec:\n  replicas: {i}\n  template:\n    spec:\n      containers:\n      - name: main\n        image: busybox\n"
        );
        let mut child = Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["apply", "-v=6", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let log = String::from_utf8_lossy(&out.stderr);
        for line in log.lines().filter(|l| l.contains("PATCH https://")) {
            let ms = line
                .split(" in ")
                .last()
                .and_then(|t| t.split(' ').next())
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(ms) = ms {
                samples.push(Duration::from_millis(ms));
            }
        }
    }
    samples
}

/// The `metadata.resourceVersion` of an event line.
fn resource_version(line: &str) -> Option<u64> {
    let at = line.find("\"resourceVersion\":\"")? + "\"resourceVersion\":\"".len();
    let end = line[at..].find('"')?;
    line[at..at + end].parse().ok()
}

/// A watch of the pool's Sandboxes from a resourceVersion, read on its own thread.
struct Watcher {
    thread: std::thread::JoinHandle<bool>,
}

impl Watcher {
    fn start(addr: SocketAddr, rv: &str, selector: &str, expected: usize) -> Self {
        let mut stream = TcpStream::connect(addr).unwrap();
        let path = format!(
            "{SANDBOXES}?watch=1&resourceVersion={rv}&labelSelector={selector}&timeoutSeconds=120"
        );
        write!(stream, "GET {path} HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").unwrap();
        let thread = std::thread::spawn(move || {
            // The watchers stand for clients on other machines: on these two cores they yield
            // to the server, so the run measures what serving them costs the claims.
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            // The head.
            loop {
                line.clear();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" {
                    break;
                }
            }
            let (mut seen, mut last) = (0, 0u64);
            while seen < expected {
                line.clear();
                if reader.read_line(&mut line).unwrap() == 0 {
                    return false;
                }
                // Read without parsing the whole event, as a client that filters would.
                let rv = resource_version(&line).unwrap();
                if rv <= last {
                    return false;
                }
                last = rv;
                // A claim changes the sandbox's labels: it is modified in place, or leaves the
                // pool's selector (a deletion for this watcher).
                if line.starts_with("{\"type\":\"MODIFIED\"")
                    || line.starts_with("{\"type\":\"DELETED\"")
                {
                    seen += 1;
                }
            }
            true
        });
        Watcher { thread }
    }

    fn finish(self) -> bool {
        self.thread.join().unwrap_or(false)
    }
}
