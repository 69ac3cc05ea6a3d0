//! A pool member whose template has a `startupProbe` (E2B's ready command) is not available to
//! be claimed until the probe passed: the Sandbox controller driving the real local runtime
//! (as root, as CI runs) on the embedded store; and a probe that never passes leaves the
//! member not Ready, with the probe's output in its condition and an `Unhealthy` Event.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, ExecAction, PodSpec, PodTemplateSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use oka_api::Sandbox;
use oka_api::conditions::sandbox::{READY, ready_reason};
use oka_api::sandboxset::{SandboxSet, SandboxSetSpec};
use oka_api::state::{SandboxState as PoolState, sandbox_state};
use oka_controller::sandbox::{
    SandboxOptions, reconcile_sandbox, runtime_id, sandbox_controller, sandbox_error_policy,
};
use oka_controller::sandboxset::new_pool_sandbox;
use oka_controller::{Clock, Config};
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::Runtime;
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
    let init = exe.parent().unwrap().parent().unwrap().join("oka-init");
    assert!(
        init.is_file(),
        "{} is missing: build it with `cargo build -p oka-runtime --bin oka-init`",
        init.display()
    );
    init
}

/// A pool member of set `set` whose command starts its server after a while and whose
/// startup probe waits for the server's marker file.
fn member(set: &str, command: &str, probe: &str, failure_threshold: i32) -> Sandbox {
    let template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                command: Some(vec!["/bin/sh".into(), "-c".into(), command.into()]),
                working_dir: Some("/tmp".into()),
                startup_probe: Some(Probe {
                    exec: Some(ExecAction {
                        command: Some(vec!["/bin/sh".into(), "-c".into(), probe.into()]),
                    }),
                    period_seconds: Some(1),
                    failure_threshold: Some(failure_threshold),
                    ..Probe::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    };
    let mut set = SandboxSet::new(
        set,
        SandboxSetSpec { replicas: 1, template: Some(template), ..Default::default() },
    );
    set.metadata.namespace = Some(NS.into());
    set.metadata.uid = Some(format!("uid-{}", set.metadata.name.clone().unwrap_or_default()));
    let mut sandbox = new_pool_sandbox(&set, None, "rev1");
    sandbox.metadata = ObjectMeta {
        name: Some(format!("{}-0", set.metadata.name.as_deref().unwrap_or_default())),
        generate_name: None,
        ..sandbox.metadata
    };
    sandbox
}

async fn first_line(runtime: &LocalRuntime, sandbox: &Sandbox) -> Option<String> {
    let id = runtime_id(sandbox).ok()?;
    let mut stream = runtime.connect(&id, PORT).await.ok()?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n").await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    String::from_utf8_lossy(&answer).lines().next().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_member_is_available_only_once_its_startup_probe_passed() {
    if !is_root() {
        eprintln!("skipped: the local runtime needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let mut config = LocalConfig::new(dir.path().join("runtime"), init_binary());
    config.cgroup_name = format!("oka-startup-test-{}", std::process::id());
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

    // The server comes up two seconds after the command started; the probe waits for it.
    let serve = format!("sleep 2; exec python3 -m http.server --bind 127.0.0.1 {PORT}");
    let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{PORT}");
    let probe = format!("bash -c '{probe}'");
    store.create(NS, &member("web", &serve, &probe, 30)).await.unwrap();
    let created = Instant::now();
    let mut seen_creating = false;
    let available = loop {
        let sandbox: Sandbox = store.get(NS, "web-0").await.unwrap();
        match sandbox_state(&sandbox, Timestamp::now()).state {
            PoolState::Available => break sandbox,
            PoolState::Creating => seen_creating = true,
            other => panic!("unexpected pool state {other:?}: {:?}", sandbox.status),
        }
        assert!(
            created.elapsed() < Duration::from_secs(30),
            "never available: {:?}",
            sandbox.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(seen_creating);
    assert!(created.elapsed() >= Duration::from_millis(1500), "available before its server ran");
    // Available means serving: the first request is answered, without a retry.
    let answer = first_line(&runtime, &available).await.unwrap_or_default();
    assert!(answer.contains("200"), "{answer:?}");

    // A probe that never passes: the member stays not Ready (never available), with what the
    // probe said in its condition.
    store
        .create(NS, &member("broken", "exec sleep 1000", "echo no server >&2; exit 7", 3))
        .await
        .unwrap();
    let condition = loop {
        let sandbox: Sandbox = store.get(NS, "broken-0").await.unwrap();
        assert_ne!(sandbox_state(&sandbox, Timestamp::now()).state, PoolState::Available);
        let ready = sandbox
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().flatten().find(|c| c.type_ == READY).cloned());
        if let Some(c) = ready.filter(|c| c.reason == ready_reason::POD_CREATE_FAILED) {
            break c;
        }
        assert!(created.elapsed() < Duration::from_secs(60), "the failure was never reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(condition.status, "False");
    for part in ["Startup probe failed", "exited with code 7", "no server", "failure 3 of 3"] {
        assert!(condition.message.contains(part), "{part:?} missing from {:?}", condition.message);
    }

    // The kubelet's Event for a failed probe, with the same words.
    let unhealthy = loop {
        let events = store
            .list::<k8s_openapi::api::core::v1::Event>(Some(NS), &oka_store::Selector::everything())
            .await
            .unwrap();
        let found = events.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("broken-0")
                && e.reason.as_deref() == Some("Unhealthy")
        });
        if let Some(event) = found {
            break event;
        }
        assert!(created.elapsed() < Duration::from_secs(60), "no Unhealthy event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(unhealthy.type_.as_deref(), Some("Warning"));
    assert!(unhealthy.message.as_deref().unwrap_or_default().contains("Startup probe failed"));

    for name in ["web-0", "broken-0"] {
        let sandbox: Sandbox = store.get(NS, name).await.unwrap();
        store.delete::<Sandbox>(NS, name, &Preconditions::default()).await.unwrap();
        let id = runtime_id(&sandbox).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while runtime.inspect(&id).await.unwrap().state != oka_runtime_api::SandboxState::Gone {
            assert!(Instant::now() < deadline, "{name} was not removed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = stop.send(());
    running.await.unwrap();
}
