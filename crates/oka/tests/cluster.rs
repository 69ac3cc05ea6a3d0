//! oka's cluster components on a real Kubernetes API server, driven by the official E2B SDK.
//!
//! The server is the store tests' CRD-only `apiextensions-apiserver` on etcd
//! (`crates/store/tests/support/apiserver.rs`, built once per machine by
//! `scripts/build-apiserver.sh`), with `oka crds` installed. It has no core API and no
//! `coordination.k8s.io`: **the controllers' Lease is a stand-in CRD of the same shape**
//! (`apiserver::lease_stand_in`), and the kinds of the core group (Events, Secrets) cannot be
//! stood in for, since a CRD cannot join the core group: Events are not recorded (the
//! recorder logs and drops them) and API keys other than the configured admin key are not
//! available. No kubelet runs here, and none is needed: sandboxes run on oka's node agents.
//!
//! On this machine: two node agents (`oka node`, each with its own state directory, relay
//! port and cgroup), two controller replicas (`oka controller`, one leading), two manager
//! replicas (`oka manager`) and a gateway (`oka gateway`), each its own process with its own
//! config file in `oka serve`'s format. The test checks, in order:
//!
//! 1. the default pool fills, spread over both nodes, each sandbox labelled with its node;
//! 2. the Python SDK's flow through a manager and the gateway: create, commands, files, pause,
//!    resume, snapshot, a clone (placed on the snapshot's node), kill;
//! 3. concurrent creates through both managers never hand out a sandbox twice;
//! 4. kill -9 of the leading controller during a burst of creates: the standby leads within
//!    15 s, and the pool is refilled to exactly its replicas (no create taken twice);
//! 5. a node agent killed (-9) and restarted under load re-adopts its sandboxes: a sandbox on
//!    it keeps its files and answers commands afterwards;
//! 6. a node agent gone for good is lost after `nodeLostAfter` (15 s here): its sandboxes fail
//!    and the pool is refilled on the other node.
//!
//! Needs root (real sandboxes) and the API server binaries; skipped otherwise, with a reason.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../store/tests/support/apiserver.rs"]
mod apiserver;
mod support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use oka_api::sandboxnode::SandboxNode;
use oka_api::{Sandbox, SandboxSet, labels};
use oka_controller::placement::node_of;
use oka_store::kubernetes::KubeStore;
use oka_store::{Selector, Store};
use support::cluster::{ADMIN_KEY, Component, NAMESPACE, config, logs_of};

const OKA: &str = env!("CARGO_BIN_EXE_oka");
const POOL_REPLICAS: usize = 4;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn venv_python() -> PathBuf {
    let root = std::env::var_os("OKA_SDK_VENVS")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"), PathBuf::from);
    let python = root.join("e2b-latest/bin/python");
    assert!(
        python.exists(),
        "no SDK environment at {}: run scripts/setup-e2b-sdk.sh",
        python.display()
    );
    python
}

async fn sandboxes(store: &KubeStore) -> Vec<Sandbox> {
    store
        .list::<Sandbox>(None, &Selector::everything())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (*s).clone())
        .collect()
}

/// The pool's members that are not claimed.
async fn pool_members(store: &KubeStore) -> Vec<Sandbox> {
    sandboxes(store)
        .await
        .into_iter()
        .filter(|s| {
            let l = s.metadata.labels.clone().unwrap_or_default();
            l.get(labels::SANDBOX_POOL).is_some_and(|p| p == "base")
                && l.get(labels::SANDBOX_CLAIMED).is_none_or(|c| c != "true")
                && s.metadata.deletion_timestamp.is_none()
        })
        .collect()
}

async fn wait_pool_available(store: &KubeStore, within: Duration, logs: impl Fn() -> String) {
    let deadline = Instant::now() + within;
    loop {
        let set = store.get::<SandboxSet>("default", "base").await.ok();
        let available = set.and_then(|s| s.status).map_or(0, |s| s.available_replicas);
        if usize::try_from(available).unwrap_or(0) >= POOL_REPLICAS {
            return;
        }
        assert!(Instant::now() < deadline, "the pool did not fill ({available}):\n{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `script` of `tests/sdk` with `args` and `envs` (and the admin key); its stdout.
fn python(script: &str, envs: &[(&str, String)], args: &[String]) -> String {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    python_file(&sdk.join(script), envs, args)
}

#[test]
fn the_platform_runs_on_a_real_api_server_with_node_agents() {
    if !is_root() {
        eprintln!(
            "SKIPPED the_platform_runs_on_a_real_api_server_with_node_agents: real sandboxes need root"
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut crds = oka_api::cluster_crds();
    crds.push(apiserver::lease_stand_in());
    let Some(server) = rt.block_on(apiserver::ApiServer::start(&crds)) else { return };
    let store = rt.block_on(async { KubeStore::new(server.client().await) });
    let dir = tempfile::Builder::new().prefix("oka-cluster-").tempdir().unwrap();
    let dir = dir.path().to_owned();
    std::fs::write(dir.join("relay-token"), format!("{}\n", "t0ken-".repeat(8))).unwrap();
    let kubeconfig = server.kubeconfig().to_owned();
    let port = support::free_port;
    let gateway_port = port();

    // Two node agents.
    let mut nodes = Vec::new();
    for name in ["node-a", "node-b"] {
        let api = port();
        let path =
            config(&dir, &kubeconfig, POOL_REPLICAS, api, gateway_port, Some((name, port())));
        let state = dir.join(name);
        std::fs::create_dir_all(&state).unwrap();
        let args = vec![
            "node".to_owned(),
            "--config".to_owned(),
            path.display().to_string(),
            "--state-dir".to_owned(),
            state.display().to_string(),
        ];
        nodes.push((Component::start(name, &args, &dir, api), state));
    }
    let start = |kind: &str, n: usize| -> Vec<Component> {
        (0..n)
            .map(|i| {
                let api = port();
                let path = config(&dir, &kubeconfig, POOL_REPLICAS, api, gateway_port, None);
                let args = vec![kind.to_owned(), "--config".to_owned(), path.display().to_string()];
                Component::start(&format!("{kind}-{i}"), &args, &dir, api)
            })
            .collect()
    };
    // Both nodes register before the controllers place anything, so the spread is checkable.
    for (node, _) in &nodes {
        node.wait_ready(Duration::from_secs(60));
    }
    let mut controllers = start("controller", 2);
    let managers = start("manager", 2);
    let gateway = start("gateway", 1);
    let logs = || logs_of(&dir);
    for c in managers.iter().chain(&gateway).chain(nodes.iter().map(|n| &n.0)) {
        c.wait_ready(Duration::from_secs(60));
    }

    // 1. The pool fills, spread over both nodes.
    rt.block_on(wait_pool_available(&store, Duration::from_secs(120), &logs));
    let registered =
        rt.block_on(store.list::<SandboxNode>(Some(NAMESPACE), &Selector::everything())).unwrap();
    assert_eq!(registered.items.len(), 2, "both node agents registered");
    let members = rt.block_on(pool_members(&store));
    let per_node: BTreeMap<String, usize> = members.iter().fold(BTreeMap::new(), |mut m, s| {
        let node = node_of(s).map(str::to_owned);
        *m.entry(node.unwrap_or_else(|| "unplaced".into())).or_default() += 1;
        m
    });
    assert_eq!(per_node.get("node-a"), Some(&(POOL_REPLICAS / 2)), "spread: {per_node:?}");
    assert_eq!(per_node.get("node-b"), Some(&(POOL_REPLICAS / 2)), "spread: {per_node:?}");

    // 2. The SDK through a manager and the gateway.
    let envs = [
        ("E2B_API_URL", format!("http://127.0.0.1:{}", managers[0].port)),
        ("E2B_SANDBOX_URL", format!("http://127.0.0.1:{gateway_port}")),
        ("OKA_RUN_ID", "cluster".to_owned()),
    ];
    let out = python("cluster.py", &envs, &[]);
    assert!(out.contains("all checks passed"), "{out}");

    // 3. Concurrent creates through both managers.
    let urls: Vec<String> =
        managers.iter().map(|m| format!("http://127.0.0.1:{}", m.port)).collect();
    let mut args = vec!["4".to_owned()];
    args.extend(urls.clone());
    let out = python("claims.py", &[], &args);
    let mut ids = HashSet::new();
    for line in out.lines() {
        let (status, id) = line.split_once(' ').unwrap();
        assert_eq!(status, "201", "create failed: {line}\n{}", logs());
        assert!(ids.insert(id.to_owned()), "sandbox {id} handed out twice:\n{out}");
    }
    assert_eq!(ids.len(), 8);

    // 4. Kill -9 the leader during a burst of creates.
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        if let Some(i) = controllers.iter().position(Component::leading) {
            break i;
        }
        assert!(Instant::now() < deadline, "no controller leads:\n{}", logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    let burst = {
        let args: Vec<String> = std::iter::once("3".to_owned()).chain(urls.clone()).collect();
        std::thread::spawn(move || python("claims.py", &[], &args))
    };
    std::thread::sleep(Duration::from_millis(300));
    controllers[leader].kill9();
    let killed = Instant::now();
    let standby = 1 - leader;
    while !controllers[standby].leading() {
        assert!(killed.elapsed() < Duration::from_secs(15), "no takeover within 15 s:\n{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let takeover = killed.elapsed();
    eprintln!("takeover after kill -9 of the leader: {takeover:?}");
    let out = burst.join().unwrap();
    for line in out.lines() {
        let (status, id) = line.split_once(' ').unwrap();
        assert_eq!(status, "201", "create failed during the takeover: {line}");
        assert!(ids.insert(id.to_owned()), "sandbox {id} handed out twice");
    }
    // The new leader refills the pool to exactly its replicas.
    rt.block_on(wait_pool_available(&store, Duration::from_secs(120), &logs));
    std::thread::sleep(Duration::from_secs(3));
    let members = rt.block_on(pool_members(&store));
    assert_eq!(
        members.len(),
        POOL_REPLICAS,
        "the pool holds exactly its replicas: {:?}",
        members.iter().map(|m| m.metadata.name.clone()).collect::<Vec<_>>()
    );

    // 5. A node agent killed and restarted re-adopts its sandboxes.
    let claimed: Vec<Sandbox> = rt
        .block_on(sandboxes(&store))
        .into_iter()
        .filter(|s| {
            s.metadata.labels.as_ref().is_some_and(|l| {
                l.get(labels::SANDBOX_CLAIMED).is_some_and(|c| c == "true")
                    && l.get(labels::NODE_NAME).is_some_and(|n| n == "node-a")
            })
        })
        .collect();
    assert!(!claimed.is_empty(), "some claimed sandbox runs on node-a");
    let id = oka_api::public_id::of(&claimed[0]);
    let envs = [
        ("E2B_API_URL", urls[1].clone()),
        ("E2B_SANDBOX_URL", format!("http://127.0.0.1:{gateway_port}")),
    ];
    let code = format!(
        "from e2b import Sandbox\ns = Sandbox.connect('{id}')\ns.files.write('/home/user/kept.txt', 'kept')\nprint('written')"
    );
    std::fs::write(dir.join("write.py"), code).unwrap();
    python_file(&dir.join("write.py"), &envs, &[]);
    // Under load: creates through both managers go on while the node agent is down and back.
    let burst = {
        let args: Vec<String> = std::iter::once("3".to_owned()).chain(urls.clone()).collect();
        std::thread::spawn(move || python("claims.py", &[], &args))
    };
    std::thread::sleep(Duration::from_millis(200));
    nodes[0].0.kill9();
    std::thread::sleep(Duration::from_secs(1));
    nodes[0].0.spawn();
    nodes[0].0.wait_ready(Duration::from_secs(60));
    for line in burst.join().unwrap().lines() {
        let (status, id) = line.split_once(' ').unwrap();
        assert_eq!(status, "201", "create failed while a node agent restarted: {line}\n{}", logs());
        assert!(ids.insert(id.to_owned()), "sandbox {id} handed out twice");
    }
    let code = format!(
        "from e2b import Sandbox\ns = Sandbox.connect('{id}')\nassert s.files.read('/home/user/kept.txt') == 'kept'\nassert s.commands.run('echo alive').stdout.strip() == 'alive'\nprint('re-adopted')"
    );
    std::fs::write(dir.join("read.py"), code).unwrap();
    let out = python_file(&dir.join("read.py"), &envs, &[]);
    assert!(out.contains("re-adopted"), "{out}");

    // 6. A node that is gone for good is lost: its sandboxes fail, and the pool is refilled on
    //    the other node.
    nodes[1].0.kill9();
    let lost_at = Instant::now();
    let deadline = lost_at + Duration::from_secs(90);
    loop {
        let members = rt.block_on(pool_members(&store));
        let on_a = members.iter().filter(|s| node_of(s) == Some("node-a")).count();
        let all = rt.block_on(sandboxes(&store));
        let failed_on_b = all.iter().filter(|s| node_of(s) == Some("node-b")).all(|s| {
            s.status.as_ref().and_then(|st| st.phase.clone()) == Some(oka_api::SandboxPhase::Failed)
        });
        if on_a == POOL_REPLICAS && members.len() == POOL_REPLICAS && failed_on_b {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lost node's pool sandboxes were not replaced ({on_a} on node-a):\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "pool refilled on the surviving node {:?} after the other was killed",
        lost_at.elapsed()
    );

    // Done: stop everything, then remove what the node agents left.
    drop(gateway);
    drop(managers);
    controllers.clear();
    for (mut node, state) in nodes {
        node.stop();
        support::remove_sandboxes(&state, OKA);
    }
}

/// Runs the Python file `path` with `args` and `envs` (and the admin key) in the SDK's
/// environment; fails the test with its output when it fails; its stdout.
fn python_file(path: &Path, envs: &[(&str, String)], args: &[String]) -> String {
    let output = Command::new(venv_python())
        .arg(path)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .env("E2B_API_KEY", ADMIN_KEY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} failed:\n{stdout}\n{}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
