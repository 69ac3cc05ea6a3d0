//! The Sandbox controller driving the real local runtime (as root, as CI runs): a sandbox
//! serving HTTP is created, frozen through `spec.paused` (it stops answering), resumed (it
//! answers, including the request that waited), stopped and started again with the `Stop`
//! strategy, hibernated with CRIU and restored with the `Hibernate` strategy, and deleted.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use oka_api::common::{PauseStrategy, PauseStrategyType};
use oka_api::{Sandbox, SandboxPhase, SandboxSpec};
use oka_controller::sandbox::{
    SandboxOptions, reconcile_sandbox, runtime_id, sandbox_controller, sandbox_error_policy,
};
use oka_controller::{Clock, Config};
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::{Runtime, SandboxId, SandboxState};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Preconditions, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

const NS: &str = "default";
const PORT: u16 = 8000;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            .is_some_and(|euid| euid == "0")
    })
}

/// `oka-init`, built beside this test binary's directory by `cargo build --workspace`.
fn init_binary() -> PathBuf {
    if let Some(path) = LocalConfig::find_init_binary() {
        return path;
    }
    let exe = std::env::current_exe().unwrap();
    let debug_dir = exe.parent().unwrap().parent().unwrap();
    let init = debug_dir.join("oka-init");
    assert!(
        init.is_file(),
        "{} is missing: build it with `cargo build -p oka-runtime --bin oka-init`",
        init.display()
    );
    init
}

fn http_sandbox(name: &str, strategy: Option<PauseStrategyType>) -> Sandbox {
    let template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                command: Some(vec![
                    "python3".into(),
                    "-m".into(),
                    "http.server".into(),
                    "--bind".into(),
                    "127.0.0.1".into(),
                    PORT.to_string(),
                ]),
                working_dir: Some("/tmp".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    };
    Sandbox::new(
        name,
        SandboxSpec {
            template: Some(template),
            pause_strategy: strategy
                .map(|t| PauseStrategy { type_: Some(t), ..Default::default() }),
            ..Default::default()
        },
    )
}

/// One HTTP GET to the sandbox's port; the status line, or `None` after `timeout`.
async fn get(runtime: &LocalRuntime, id: &SandboxId, timeout: Duration) -> Option<String> {
    let request = async {
        let mut stream = runtime.connect(id, PORT).await.ok()?;
        stream.write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n").await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        String::from_utf8_lossy(&answer).lines().next().map(str::to_owned)
    };
    tokio::time::timeout(timeout, request).await.ok().flatten()
}

async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_phase(store: &EmbeddedStore, name: &str, phase: SandboxPhase) -> Sandbox {
    eventually(&format!("{name} to be {phase:?}"), async || {
        let sandbox: Sandbox = store.get(NS, name).await.ok()?;
        let ready_if_running = phase != SandboxPhase::Running || sandbox.is_ready();
        (sandbox.phase() == Some(&phase) && ready_if_running).then_some(sandbox)
    })
    .await
}

async fn set_paused(store: &EmbeddedStore, name: &str, paused: bool) {
    loop {
        let mut sandbox: Sandbox = store.get(NS, name).await.unwrap();
        sandbox.spec.paused = Some(paused);
        match store.update(NS, &sandbox).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_paused_freezes_and_stops_real_sandboxes_and_delete_removes_them() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let mut config = LocalConfig::new(dir.path().join("runtime"), init_binary());
    config.cgroup_name = format!("oka-ctl-test-{}", std::process::id());
    let runtime = LocalRuntime::open(config).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let options = SandboxOptions {
        node_name: "test-node".into(),
        runtime_poll: Duration::from_millis(100),
        initializer: None,
        hooks: None,
        ..SandboxOptions::default()
    };
    let (controller, ctx) = sandbox_controller(
        store.clone(),
        Arc::new(runtime.clone()) as Arc<dyn Runtime>,
        Config::default().workers(2),
        Clock::system(),
        options,
    );
    let running = tokio::spawn(
        controller
            .shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(reconcile_sandbox, sandbox_error_policy, ctx),
    );

    // Freeze: memory stays, the server stops answering, and answers again after resume.
    store.create(NS, &http_sandbox("frozen", None)).await.unwrap();
    let sandbox = wait_phase(&store, "frozen", SandboxPhase::Running).await;
    let id = runtime_id(&sandbox).unwrap();
    let ok = eventually("the server to answer", async || {
        get(&runtime, &id, Duration::from_secs(2)).await
    })
    .await;
    assert!(ok.contains("200"), "{ok}");

    set_paused(&store, "frozen", true).await;
    wait_phase(&store, "frozen", SandboxPhase::Paused).await;
    assert_eq!(runtime.inspect(&id).await.unwrap().state, SandboxState::Paused);
    let waiting = {
        let runtime = runtime.clone();
        let id = id.clone();
        tokio::spawn(async move { get(&runtime, &id, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a frozen sandbox answered");

    set_paused(&store, "frozen", false).await;
    wait_phase(&store, "frozen", SandboxPhase::Running).await;
    let answer = waiting.await.unwrap().expect("the request that waited is answered after resume");
    assert!(answer.contains("200"), "{answer}");

    // Stop: the processes end, the writable layer stays, resume starts the command again.
    store.create(NS, &http_sandbox("stopped", Some(PauseStrategyType::Stop))).await.unwrap();
    let sandbox = wait_phase(&store, "stopped", SandboxPhase::Running).await;
    let stop_id = runtime_id(&sandbox).unwrap();
    eventually("the second server to answer", async || {
        get(&runtime, &stop_id, Duration::from_secs(2)).await
    })
    .await;
    set_paused(&store, "stopped", true).await;
    wait_phase(&store, "stopped", SandboxPhase::Paused).await;
    let status = runtime.inspect(&stop_id).await.unwrap();
    assert_eq!(status.state, SandboxState::Stopped);
    assert_eq!(status.pid, None);
    set_paused(&store, "stopped", false).await;
    wait_phase(&store, "stopped", SandboxPhase::Running).await;
    let ok = eventually("the restarted server to answer", async || {
        get(&runtime, &stop_id, Duration::from_secs(2)).await
    })
    .await;
    assert!(ok.contains("200"), "{ok}");

    // Hibernate: CRIU checkpoints the tree and frees its memory; resume restores it.
    store
        .create(NS, &http_sandbox("hibernated", Some(PauseStrategyType::Hibernate)))
        .await
        .unwrap();
    let sandbox = wait_phase(&store, "hibernated", SandboxPhase::Running).await;
    let hib_id = runtime_id(&sandbox).unwrap();
    eventually("the third server to answer", async || {
        get(&runtime, &hib_id, Duration::from_secs(2)).await
    })
    .await;
    set_paused(&store, "hibernated", true).await;
    wait_phase(&store, "hibernated", SandboxPhase::Paused).await;
    let status = runtime.inspect(&hib_id).await.unwrap();
    assert_eq!(status.state, SandboxState::Hibernated);
    assert_eq!(status.pid, None);
    set_paused(&store, "hibernated", false).await;
    wait_phase(&store, "hibernated", SandboxPhase::Running).await;
    let ok = eventually("the restored server to answer", async || {
        get(&runtime, &hib_id, Duration::from_secs(2)).await
    })
    .await;
    assert!(ok.contains("200"), "{ok}");

    // Delete: the object goes once the runtime instance is gone.
    for (name, id) in [("frozen", &id), ("stopped", &stop_id), ("hibernated", &hib_id)] {
        store.delete::<Sandbox>(NS, name, &Preconditions::default()).await.unwrap();
        eventually(&format!("{name} to be removed"), async || {
            store.get::<Sandbox>(NS, name).await.err().filter(|e| e.is_not_found())
        })
        .await;
        assert_eq!(runtime.inspect(id).await.unwrap().state, SandboxState::Gone);
    }

    let _ = stop.send(());
    running.await.unwrap();
    store.close().unwrap();
    assert!(runtime.remove_cgroups(), "no sandbox is left in the runtime's cgroups");
}

/// `(reason, message)` of the Events recorded about sandbox `name`.
async fn events_of(store: &EmbeddedStore, name: &str) -> Vec<(String, String)> {
    let selector = oka_store::Selector::everything();
    let events =
        store.list::<k8s_openapi::api::core::v1::Event>(Some(NS), &selector).await.unwrap();
    events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_waits_for_its_config_map_and_secret_and_runs_with_them() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let mut config = LocalConfig::new(dir.path().join("runtime"), init_binary());
    config.cgroup_name = format!("oka-ctl-vol-{}", std::process::id());
    let runtime = LocalRuntime::open(config).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let options = SandboxOptions {
        node_name: "test-node".into(),
        runtime_poll: Duration::from_millis(100),
        ..SandboxOptions::default()
    };
    let (controller, ctx) = sandbox_controller(
        store.clone(),
        Arc::new(runtime.clone()) as Arc<dyn Runtime>,
        Config::default().workers(2),
        Clock::system(),
        options,
    );
    let running = tokio::spawn(
        controller
            .shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(reconcile_sandbox, sandbox_error_policy, ctx),
    );

    let template: PodTemplateSpec = serde_json::from_value(serde_json::json!({"spec": {
        "volumes": [
            {"name": "cfg", "configMap": {"name": "app", "items": [{"key": "conf", "path": "app.conf", "mode": 0o640}]}},
            {"name": "out", "emptyDir": {}},
        ],
        "containers": [{
            "name": "main",
            "command": ["/bin/sh", "-c",
                "{ cat /etc/app/app.conf; echo; stat -c %a /etc/app/app.conf; echo \"$TOKEN $POD\"; echo END; } > /out/seen; exec sleep 1000"],
            "env": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/app", "readOnly": true},
                {"name": "out", "mountPath": "/out"},
            ],
        }],
    }}))
    .unwrap();
    let sandbox =
        Sandbox::new("configured", SandboxSpec { template: Some(template), ..Default::default() });
    store.create(NS, &sandbox).await.unwrap();

    let ready = |reason: &'static str| {
        let store = store.clone();
        async move {
            eventually(&format!("Ready reason {reason}"), async || {
                let sandbox: Sandbox = store.get(NS, "configured").await.ok()?;
                let condition = sandbox.status?.condition("Ready")?.clone();
                (condition.reason == reason).then_some(condition.message)
            })
            .await
        }
    };
    let message = ready("FailedMount").await;
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found"
    );
    eventually("the FailedMount Event", async || {
        events_of(&store, "configured")
            .await
            .contains(&("FailedMount".to_owned(), message.clone()))
            .then_some(())
    })
    .await;

    let config_map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "app"}, "data": {"conf": "level=debug"}}),
    )
    .unwrap();
    store.create(NS, &config_map).await.unwrap();
    let message = ready("CreateContainerConfigError").await;
    assert_eq!(message, "secret \"creds\" not found");
    eventually("the Failed Event", async || {
        events_of(&store, "configured")
            .await
            .contains(&("Failed".to_owned(), format!("Error: {message}")))
            .then_some(())
    })
    .await;

    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "creds"}, "data": {"token": "czNjcjN0"}}),
    )
    .unwrap();
    store.create(NS, &secret).await.unwrap();
    let sandbox = wait_phase(&store, "configured", SandboxPhase::Running).await;
    let id = runtime_id(&sandbox).unwrap();
    let sandbox_dir = runtime.paths(&id).await.unwrap().dir;
    let seen = eventually("the sandbox's report", async || {
        std::fs::read_to_string(sandbox_dir.join("volumes/out/seen"))
            .ok()
            .filter(|s| s.ends_with("END\n"))
    })
    .await;
    assert_eq!(seen, "level=debug\n640\ns3cr3t configured\nEND\n");

    // A restart takes the ConfigMap's new content.
    let mut config_map: k8s_openapi::api::core::v1::ConfigMap = store.get(NS, "app").await.unwrap();
    config_map.data = Some([("conf".to_owned(), "level=info".to_owned())].into());
    store.update(NS, &config_map).await.unwrap();
    loop {
        let mut sandbox: Sandbox = store.get(NS, "configured").await.unwrap();
        sandbox.metadata.annotations.get_or_insert_with(Default::default).insert(
            oka_api::annotations::RESTART_REQUESTED_AT.to_owned(),
            "2026-12-06T01:00:00Z".to_owned(),
        );
        match store.update(NS, &sandbox).await {
            Ok(_) => break,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("{e}"),
        }
    }
    let seen = eventually("the restarted sandbox's report", async || {
        std::fs::read_to_string(sandbox_dir.join("volumes/out/seen"))
            .ok()
            .filter(|s| s.starts_with("level=info") && s.ends_with("END\n"))
    })
    .await;
    assert_eq!(seen, "level=info\n640\ns3cr3t configured\nEND\n");

    store.delete::<Sandbox>(NS, "configured", &Preconditions::default()).await.unwrap();
    eventually("the instance to be gone", async || {
        (runtime.inspect(&id).await.ok()?.state == SandboxState::Gone).then_some(())
    })
    .await;
    let _ = stop.send(());
    running.await.unwrap();
}
