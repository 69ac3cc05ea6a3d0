//! The Checkpoint and Sandbox controllers driving the real local runtime (as root, as CI runs):
//! a Checkpoint of a running counter server becomes a snapshot, a Sandbox annotated
//! `agents.kruise.io/restore-from` starts from it with the snapshot's count, and deleting the
//! Checkpoint removes the snapshot.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use oka_api::checkpoint::{Checkpoint, CheckpointPhase, CheckpointSpec};
use oka_api::{Sandbox, SandboxPhase, SandboxSpec, annotations};
use oka_controller::checkpoint::checkpoint_controller;
use oka_controller::sandbox::{SandboxOptions, runtime_id, sandbox_controller};
use oka_controller::{Clock, Config, checkpoint, sandbox};
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::{Runtime, SandboxId};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Preconditions, Selector, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "default";
const PORT: u16 = 8000;

const SERVER: &str = r#"
import http.server
count = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"count={count}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"#;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            .is_some_and(|euid| euid == "0")
    })
}

fn init_binary() -> PathBuf {
    if let Some(path) = LocalConfig::find_init_binary() {
        return path;
    }
    let exe = std::env::current_exe().unwrap();
    let init = exe.parent().unwrap().parent().unwrap().join("oka-init");
    assert!(init.is_file(), "build it with `cargo build -p oka-runtime --bin oka-init`");
    init
}

fn counter(name: &str, restore_from: Option<&str>) -> Sandbox {
    let template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                command: Some(vec!["python3".into(), "-c".into(), SERVER.into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    };
    let mut sandbox =
        Sandbox::new(name, SandboxSpec { template: Some(template), ..Default::default() });
    if let Some(id) = restore_from {
        sandbox.metadata.annotations =
            Some([(annotations::RESTORE_FROM.to_owned(), id.to_owned())].into());
    }
    sandbox
}

/// One `GET /`; the body, or `None` when the server does not answer.
async fn count(runtime: &LocalRuntime, id: &SandboxId) -> Option<String> {
    let request = async {
        let mut stream = runtime.connect(id, PORT).await.ok()?;
        stream.write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n").await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        text.split_once("\r\n\r\n").map(|(_, body)| body.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), request).await.ok().flatten()
}

async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn running(store: &EmbeddedStore, name: &str) -> Sandbox {
    eventually(&format!("{name} to run"), async || {
        let sandbox: Sandbox = store.get(NS, name).await.ok()?;
        (sandbox.phase() == Some(&SandboxPhase::Running) && sandbox.is_ready()).then_some(sandbox)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_snapshots_a_sandbox_and_a_restore_from_sandbox_starts_from_it() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let state_dir = dir.path().join("runtime");
    let mut config = LocalConfig::new(&state_dir, init_binary());
    config.cgroup_name = format!("oka-ctl-cp-test-{}", std::process::id());
    let runtime = LocalRuntime::open(config).await.unwrap();
    let shared = Arc::new(runtime.clone()) as Arc<dyn Runtime>;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let options = SandboxOptions {
        node_name: "test-node".into(),
        runtime_poll: Duration::from_millis(100),
        initializer: None,
        hooks: None,
        ..SandboxOptions::default()
    };
    let (sandboxes, sandbox_ctx) = sandbox_controller(
        store.clone(),
        Arc::clone(&shared),
        Config::default().workers(2),
        Clock::system(),
        options,
    );
    let (checkpoints, checkpoint_ctx) =
        checkpoint_controller(store.clone(), shared, Config::default().workers(2), Clock::system());
    let sandbox_task = tokio::spawn(sandboxes.shutdown_on(shutdown()).run(
        sandbox::reconcile_sandbox,
        sandbox::sandbox_error_policy,
        sandbox_ctx,
    ));
    let checkpoint_task = tokio::spawn(checkpoints.shutdown_on(shutdown()).run(
        checkpoint::reconcile_checkpoint,
        checkpoint::checkpoint_error_policy,
        checkpoint_ctx,
    ));

    store.create(NS, &counter("origin", None)).await.unwrap();
    let origin = runtime_id(&running(&store, "origin").await).unwrap();
    eventually("the server to answer", async || count(&runtime, &origin).await).await;
    assert_eq!(count(&runtime, &origin).await.as_deref(), Some("count=2"));

    // A Checkpoint naming a missing sandbox fails; one naming the origin succeeds.
    let spec = |name: &str| CheckpointSpec {
        sandbox_name: Some(name.into()),
        ..CheckpointSpec::default()
    };
    store.create(NS, &Checkpoint::new("nobody", spec("nobody"))).await.unwrap();
    store.create(NS, &Checkpoint::new("cp", spec("origin"))).await.unwrap();
    let phase_of = async |name: &str, phase: CheckpointPhase| {
        eventually(&format!("checkpoint {name} {phase:?}"), async || {
            let c: Checkpoint = store.get(NS, name).await.ok()?;
            (c.status.as_ref()?.phase.as_ref() == Some(&phase)).then_some(c)
        })
        .await
    };
    let failed = phase_of("nobody", CheckpointPhase::Failed).await;
    assert!(failed.status.unwrap().message.unwrap().contains("not found"));
    let done = phase_of("cp", CheckpointPhase::Succeeded).await;
    let status = done.status.clone().unwrap();
    let snapshot_id = status.checkpoint_id.clone().unwrap();
    assert!(status.completion_time.is_some());
    assert!(status.message.unwrap().contains(&state_dir.display().to_string()));
    assert_eq!(done.metadata.finalizers, Some(vec!["agents.kruise.io/checkpoint".to_owned()]));

    // The origin goes on counting; a Sandbox restored from the snapshot starts at its count.
    assert_eq!(count(&runtime, &origin).await.as_deref(), Some("count=3"));
    store.create(NS, &counter("clone", Some(&snapshot_id))).await.unwrap();
    let clone = runtime_id(&running(&store, "clone").await).unwrap();
    assert_eq!(count(&runtime, &clone).await.as_deref(), Some("count=3"));
    assert_eq!(count(&runtime, &clone).await.as_deref(), Some("count=4"));
    assert_eq!(count(&runtime, &origin).await.as_deref(), Some("count=4"));

    // Deleting the Checkpoint removes the snapshot; the clone runs on.
    let none = Preconditions::default();
    for name in ["cp", "nobody"] {
        store.delete::<Checkpoint>(NS, name, &none).await.unwrap();
    }
    eventually("the checkpoints to go", async || {
        let list = store.list::<Checkpoint>(Some(NS), &Selector::everything()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    let snapshots = std::fs::read_dir(state_dir.join("snapshots")).unwrap().count();
    assert_eq!(snapshots, 0);
    assert_eq!(count(&runtime, &clone).await.as_deref(), Some("count=5"));

    for name in ["origin", "clone"] {
        store.delete::<Sandbox>(NS, name, &none).await.unwrap();
    }
    eventually("the sandboxes to go", async || runtime.list().await.ok()?.is_empty().then_some(()))
        .await;
    stop.send(true).unwrap();
    sandbox_task.await.unwrap();
    checkpoint_task.await.unwrap();
    assert!(runtime.remove_cgroups(), "no sandbox is left in the runtime's cgroups");
}
