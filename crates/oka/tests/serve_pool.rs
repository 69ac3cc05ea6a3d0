//! `oka serve` keeps a default warm pool of real local sandboxes (as root, as CI runs), they
//! survive `kill -9` of `oka serve`, and deleting the pool removes them.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oka_api::{Sandbox, SandboxSet};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Preconditions, Selector, Store};
use support::free_port;

mod support;

const OKA: &str = env!("CARGO_BIN_EXE_oka");

/// Removes, when the test ends however it ends, the sandboxes `oka serve` left in a state
/// directory: they outlive it by design, and a test must not leave them running on the machine.
struct LeftSandboxes<'a>(&'a Path);

impl Drop for LeftSandboxes<'_> {
    fn drop(&mut self) {
        support::remove_sandboxes(self.0, OKA);
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

/// `oka serve` on `state_dir` with `config`; its log goes to `<state_dir>/serve.log`.
fn serve(state_dir: &Path, config: &str) -> Child {
    let config_path = state_dir.join("config.yaml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(state_dir.join("serve.log")).unwrap();
    Command::new(OKA)
        .arg("serve")
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--config")
        .arg(&config_path)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn stop(mut child: Child, signal: &str) {
    Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap();
    let status = child.wait().unwrap();
    if signal == "TERM" {
        assert!(status.success(), "oka serve exited with {status}");
    }
}

/// One HTTP/1.1 request to the API; the status code and the body.
fn http(port: u16, method: &str, path: &str, key: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Runtime sandboxes recorded under the state directory.
fn runtime_sandboxes(state_dir: &Path) -> usize {
    std::fs::read_dir(state_dir.join("runtime/sandboxes")).map(|d| d.count()).unwrap_or(0)
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads the store while no `oka serve` holds it.
fn read_store<T>(state_dir: &Path, f: impl AsyncFnOnce(&EmbeddedStore) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store =
            EmbeddedStore::open(&state_dir.join("store.redb"), EmbeddedOptions::default()).unwrap();
        let out = f(&store).await;
        store.close().unwrap();
        out
    })
}

#[test]
fn default_pool_fills_survives_kill_9_and_goes_away_with_its_set() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let _left = LeftSandboxes(state);
    let port = free_port();
    let config = format!(
        "{}defaultPool:\n  replicas: 2\ncodeInterpreterPool:\n  enabled: false\napi:\n  listen: 127.0.0.1:{port}\nkubeApi:\n  listen: 127.0.0.1:0\ngateway:\n  listen: 127.0.0.1:0\n",
        support::templates_config()
    );
    let config = config.as_str();

    // A fresh `oka serve` creates the pool and its sandboxes run.
    let first = serve(state, config);
    wait_until("two sandboxes in the runtime", || runtime_sandboxes(state) == 2);

    // The E2B API hands one out from the warm pool (201) and the pool refills behind it;
    // killing it through the API removes it.
    let key = std::fs::read_to_string(state.join("admin-key")).unwrap().trim().to_owned();
    let (status, body) =
        http(port, "POST", "/sandboxes", "e2b_0000000000000000000000000000000000000000", "{}");
    assert_eq!(status, 401, "{body}");
    let created = loop {
        let (status, body) = http(port, "POST", "/sandboxes", &key, r#"{"templateID":"base"}"#);
        if status == 201 {
            break body;
        }
        // 503 + Retry-After while the pool's sandboxes are still becoming ready.
        assert_eq!(status, 503, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(created["templateID"], "base", "{created}");
    wait_until("the pool to refill", || runtime_sandboxes(state) == 3);
    let (status, body) = http(port, "GET", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(port, "DELETE", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 204, "{body}");
    let (status, _) = http(port, "GET", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 404);
    wait_until("the killed sandbox to leave the runtime", || runtime_sandboxes(state) == 2);
    std::thread::sleep(Duration::from_millis(500));
    stop(first, "KILL");

    let running = read_store(state, async |store: &EmbeddedStore| {
        let list = store.list::<Sandbox>(Some("default"), &Selector::everything()).await.unwrap();
        list.items
            .iter()
            .filter(|s| s.status.as_ref().and_then(|s| s.phase.as_ref()).is_some())
            .map(|s| s.metadata.name.clone().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(running.len(), 2, "{running:?}");

    // After kill -9, a restart re-adopts the same sandboxes: none is created or lost.
    let second = serve(state, config);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(runtime_sandboxes(state), 2);
    stop(second, "TERM");
    let names = read_store(state, async |store: &EmbeddedStore| {
        let set = store.get::<SandboxSet>("default", "base").await.unwrap();
        assert_eq!(set.status.as_ref().map(|s| s.available_replicas), Some(2), "{set:?}");
        let list = store.list::<Sandbox>(Some("default"), &Selector::everything()).await.unwrap();
        list.items.iter().map(|s| s.metadata.name.clone().unwrap()).collect::<Vec<_>>()
    });
    let mut expected = running.clone();
    expected.sort();
    assert_eq!(names, expected);

    // Deleting the pool removes its sandboxes, runtime instances included.
    read_store(state, async |store: &EmbeddedStore| {
        store.delete::<SandboxSet>("default", "base", &Preconditions::default()).await.unwrap();
    });
    let third = serve(
        state,
        &format!(
            "defaultPool:\n  enabled: false\ncodeInterpreterPool:\n  enabled: false\napi:\n  listen: 127.0.0.1:{port}\nkubeApi:\n  listen: 127.0.0.1:0\ngateway:\n  listen: 127.0.0.1:0\n"
        ),
    );
    wait_until("the runtime to have no sandboxes", || runtime_sandboxes(state) == 0);
    stop(third, "TERM");
    let left = read_store(state, async |store: &EmbeddedStore| {
        store.list::<Sandbox>(None, &Selector::everything()).await.unwrap().items.len()
    });
    assert_eq!(left, 0);
}

/// A pool whose template allows reuse (`agents.kruise.io/cleanup-enabled`): killing a claimed
/// sandbox returns it to the pool with a fresh instance (nothing of its user left), and the
/// pool hands out sandboxes again, their agent runtime accepting the new claim's `/init`.
#[test]
fn a_killed_reusable_sandbox_returns_to_its_pool_with_nothing_of_its_user() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let _left = LeftSandboxes(state);
    read_store(state, async |store: &EmbeddedStore| {
        let template: oka_api::SandboxTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": oka_api::API_VERSION,
            "kind": "SandboxTemplate",
            "metadata": { "name": "reuse", "namespace": "default" },
            "spec": { "template": {
                "metadata": { "annotations": { "agents.kruise.io/cleanup-enabled": "true" } },
                "spec": { "containers": [{
                    "name": "sandbox",
                    "command": ["/bin/sh", "-c", "exec sleep infinity"],
                }] },
            } },
        }))
        .unwrap();
        store.create("default", &template).await.unwrap();
        let set: SandboxSet = serde_json::from_value(serde_json::json!({
            "apiVersion": oka_api::API_VERSION,
            "kind": "SandboxSet",
            "metadata": { "name": "reuse", "namespace": "default" },
            "spec": { "replicas": 1, "templateRef": { "name": "reuse" } },
        }))
        .unwrap();
        store.create("default", &set).await.unwrap();
    });
    let (port, gateway) = (free_port(), free_port());
    let config = format!(
        "defaultPool:\n  enabled: false\ncodeInterpreterPool:\n  enabled: false\n\
         api:\n  listen: 127.0.0.1:{port}\ngateway:\n  listen: 127.0.0.1:{gateway}\nkubeApi:\n  listen: 127.0.0.1:0\n"
    );
    let child = serve(state, &config);
    let log_path = state.join("serve.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until("the API", || TcpStream::connect(("127.0.0.1", port)).is_ok());
    let key = std::fs::read_to_string(state.join("admin-key")).unwrap().trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let create = || loop {
        assert!(Instant::now() < deadline, "no sandbox handed out in time:\n{}", log());
        let (status, body) = http(
            port,
            "POST",
            "/sandboxes",
            &key,
            r#"{"templateID":"reuse","metadata":{"e2b.agents.kruise.io/create-on-no-stock":"false"}}"#,
        );
        if status == 201 {
            let created: serde_json::Value = serde_json::from_str(&body).unwrap();
            break created["sandboxID"].as_str().unwrap().to_owned();
        }
        assert_eq!(status, 503, "{body}\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    };

    // The pool's one member is the sandbox the first claim gets.
    let sandboxes = state.join("runtime/sandboxes");
    wait_until("the pool's member", || runtime_sandboxes(state) == 1);
    let member = std::fs::read_dir(&sandboxes).unwrap().flatten().next().unwrap().path();
    let id = create();
    // What its user leaves behind, in its writable layer.
    std::fs::write(member.join("upper/left-by-the-user"), "secret").unwrap();
    let (status, body) = http(port, "DELETE", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 204, "{body}");
    let (status, _) = http(port, "GET", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 404, "a returned sandbox is nobody's");
    wait_until("the sandbox to return to its pool", || {
        log().contains("sandbox returned to its pool")
    });
    let left = std::fs::read_dir(&sandboxes)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("upper/left-by-the-user").exists())
        .count();
    assert_eq!(left, 0, "a returned sandbox keeps nothing of its last user");

    // The pool serves again; each claim's /init is accepted by a fresh agent runtime.
    for _ in 0..2 {
        let id = create();
        let (status, body) = http(port, "DELETE", &format!("/sandboxes/{id}"), &key, "");
        assert_eq!(status, 204, "{body}");
    }
    // Each kill answers before the sandbox controller has recycled the sandbox: wait for the
    // last one too.
    wait_until("every killed sandbox to return to its pool", || {
        log().matches("sandbox returned to its pool").count() >= 3
    });
    stop(child, "TERM");
    let log = log();
    assert!(log.contains("sandboxes serve envd as their PID 1"), "no envd, no /init: {log}");
}

/// Without CRIU (`OKA_CRIU` names no binary) `oka serve` still starts, says at start that
/// hibernation is off and how to turn it on, and exports it as `oka_feature_available`.
#[test]
fn without_criu_hibernation_is_off_and_said_at_start() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let missing = std::ffi::OsStr::new("/nonexistent/criu");
    let config = "defaultPool:\n  enabled: false\n";
    let serve = support::OkaServe::start(OKA, config, &[("OKA_CRIU", missing)]);
    let log = serve.log();
    let line = log
        .lines()
        .find(|l| l.contains("feature hibernate: off"))
        .unwrap_or_else(|| panic!("no start-up line says hibernation is off:\n{log}"));
    assert!(line.contains("/nonexistent/criu"), "{line}");
    assert!(line.contains("sudo scripts/install-criu.sh"), "{line}");
    assert!(line.contains("OKA_CRIU"), "{line}");
    assert!(log.contains("feature outbound-network:"), "{log}");
    assert!(log.contains("feature code-interpreter:"), "{log}");

    let key = serve.key();
    let (status, metrics) = http(serve.api, "GET", "/metrics", &key, "");
    assert_eq!(status, 200);
    assert!(metrics.contains("oka_feature_available{feature=\"hibernate\"} 0"), "{metrics}");
}

/// A configuration shared with the cluster components (one ConfigMap) starts `oka serve`, which
/// says that it does not use the `cluster` section rather than ignoring it silently.
#[test]
fn serve_says_it_does_not_use_the_cluster_section() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let config = "defaultPool:\n  enabled: false\ncluster:\n  namespace: agents\n";
    let serve = support::OkaServe::start(OKA, config, &[]);
    let log = serve.log();
    assert!(
        log.contains("the configuration's cluster section is for oka controller"),
        "no warning about the cluster section:\n{log}"
    );
}

/// A create that needs no agent runtime in the sandbox (this test does not build `oka-envd`).
const CREATE_WITHOUT_ENVD: &str =
    r#"{"templateID":"base","metadata":{"e2b.agents.kruise.io/skip-init-runtime":"true"}}"#;

/// Without CRIU, a snapshot or a fork answers 501 at once, and a pause of a sandbox whose pool
/// hibernates answers at once with the runtime's
/// refusal naming the feature and how to turn it on (the Sandbox's `SandboxPaused` condition
/// carries it), never a wait for a pause that cannot happen.
#[test]
fn without_criu_snapshots_forks_and_hibernating_pauses_answer_at_once() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned());
    if !Command::new(&kubectl)
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped: no kubectl (scripts/test.sh installs it)");
        return;
    }
    let missing = std::ffi::OsStr::new("/nonexistent/criu");
    let config = "defaultPool:\n  replicas: 1\ncodeInterpreterPool:\n  enabled: false\n";
    let serve = support::OkaServe::start(OKA, config, &[("OKA_CRIU", missing)]);
    let kubeconfig = serve.state.path().join("kubeconfig");
    let patched = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["patch", "sandboxset", "base", "-n", "default", "--type", "merge"])
        .args(["-p", r#"{"spec":{"pauseStrategy":{"type":"Hibernate"}}}"#])
        .output()
        .unwrap();
    assert!(patched.status.success(), "{}", String::from_utf8_lossy(&patched.stderr));
    serve.wait_sandboxes(1, Duration::from_secs(60));

    let key = serve.key();
    let deadline = Instant::now() + Duration::from_secs(60);
    let created = loop {
        let (status, body) = http(serve.api, "POST", "/sandboxes", &key, CREATE_WITHOUT_ENVD);
        if status == 201 {
            break body;
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "no sandbox became ready:\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let id = created["sandboxID"].as_str().unwrap();

    // A snapshot or a fork of it is refused at once with the feature's message (501).
    for path in [format!("/sandboxes/{id}/snapshots"), format!("/sandboxes/{id}/fork")] {
        let started = Instant::now();
        let (status, body) = http(serve.api, "POST", &path, &key, "{}");
        assert!(started.elapsed() < Duration::from_secs(2), "{path} took {:?}", started.elapsed());
        assert_eq!(status, 501, "{path}: {body}");
        assert!(
            body.contains("hibernate (hibernating pauses, snapshots and forks) is off"),
            "{body}"
        );
        assert!(body.contains("scripts/install-criu.sh"), "{body}");
    }

    // So is a pause that would hibernate, before anything is written: the sandbox runs on.
    let started = Instant::now();
    let (status, body) = http(serve.api, "POST", &format!("/sandboxes/{id}/pause"), &key, "");
    assert!(started.elapsed() < Duration::from_secs(2), "the pause took {:?}", started.elapsed());
    assert_eq!(status, 501, "{body}");
    assert!(body.contains("hibernate (hibernating pauses, snapshots and forks) is off"), "{body}");
    assert!(body.contains("scripts/install-criu.sh"), "{body}");
    let (status, body) = http(serve.api, "GET", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"state\":\"running\""), "{body}");

    // A pause written straight to the Sandbox (an operator's, or the timeout's) is refused by
    // the controller, which says so as a Warning Event.
    let named = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "sandboxes", "-n", "default", "-o", "name"])
        .arg(format!("-l=agents.kruise.io/sandbox-id={id}"))
        .output()
        .unwrap();
    let name = String::from_utf8_lossy(&named.stdout).trim().to_owned();
    assert!(name.starts_with("sandbox"), "no Sandbox has the ID {id}: {named:?}");
    let patched = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["patch", &name, "-n", "default", "--type", "merge"])
        .args(["-p", r#"{"spec":{"paused":true,"pauseStrategy":{"type":"Hibernate"}}}"#])
        .output()
        .unwrap();
    assert!(patched.status.success(), "{}", String::from_utf8_lossy(&patched.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "events", "-n", "default", "-o", "json"])
            .output()
            .unwrap();
        let events = format!(
            "{}{}",
            String::from_utf8_lossy(&events.stdout),
            String::from_utf8_lossy(&events.stderr)
        );
        if events.contains("\"hibernateFailed\"") && events.contains("is off on this machine") {
            break;
        }
        assert!(Instant::now() < deadline, "no hibernateFailed Event names the feature:\n{events}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
