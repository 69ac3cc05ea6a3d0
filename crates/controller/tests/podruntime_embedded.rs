//! The Pod runtime's controller, runner, informers and executor included, on the real embedded
//! store (which keeps Pods as it keeps any kind): the test plays the kubelet (it writes the
//! Pod's status) and checks what a user sees of the Sandbox through create, Ready, pause,
//! resume, restart, upgrade (by hand and by a SandboxUpdateOps, which completes) and
//! deletion, and that node-runtime sandboxes are left alone. The exact requests are asserted
//! in `podruntime_kube.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec,
};
use oka_api::conditions::sandbox::{PAUSED, READY};
use oka_api::runtime_choice::SandboxRuntime;
use oka_api::{Sandbox, SandboxPhase, SandboxSpec, annotations};
use oka_controller::podruntime::{PodOptions, PodRuntimeOptions, run_pod_runtime_controller};
use oka_controller::{Clock, Config};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Preconditions, Store};

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(20);

fn sandbox(name: &str, runtime: Option<&str>) -> Sandbox {
    let mut s = Sandbox::new(
        name,
        SandboxSpec {
            template: Some(PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "main".into(),
                        image: Some("busybox".into()),
                        command: Some(vec!["sleep".into(), "infinity".into()]),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            }),
            ..SandboxSpec::default()
        },
    );
    if let Some(runtime) = runtime {
        s.metadata.annotations =
            Some([(annotations::RUNTIME.to_owned(), runtime.to_owned())].into());
    }
    s
}

/// Polls `read` every 20 ms until `check` accepts it, for at most [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut read: F, check: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let value = read().await;
        if check(&value) {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The kubelet: the Pod scheduled on `worker-1`, Running and Ready at `ip`.
async fn run_pod(store: &EmbeddedStore, name: &str, ip: &str) {
    let mut pod: Pod = store.get(NS, name).await.unwrap();
    pod.spec.as_mut().unwrap().node_name = Some("worker-1".into());
    store.update(NS, &pod).await.unwrap();
    let mut pod: Pod = store.get(NS, name).await.unwrap();
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    store.update_status(NS, &pod).await.unwrap();
}

#[tokio::test]
async fn a_sandbox_runs_pauses_resumes_and_goes_as_a_pod() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = PodRuntimeOptions {
        pods: PodOptions { envd_image: "oka-envd:test".into() },
        default_runtime: SandboxRuntime::Pod,
        initializer: None,
    };
    let controller = tokio::spawn(run_pod_runtime_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        options,
        async move {
            let _ = stopped.await;
        },
    ));

    store.create(NS, &sandbox("s1", None)).await.unwrap();
    store.create(NS, &sandbox("on-node", Some("node"))).await.unwrap();
    let get_sandbox = |name: &'static str| {
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.get::<Sandbox>(NS, name).await.unwrap() }
        }
    };
    let get_pod = |name: &'static str| {
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.get::<Pod>(NS, name).await.ok() }
        }
    };

    // Create: the Pod appears; the sandbox is Pending until it runs, then Running and Ready.
    let pod = eventually("the pod", get_pod("s1"), Option::is_some).await.unwrap();
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["agents.kruise.io/created-by"], "sandbox");
    let s = get_sandbox("s1")().await;
    assert_eq!(s.phase(), Some(&SandboxPhase::Pending));
    run_pod(&store, "s1", "10.244.0.9").await;
    let s = eventually("Running", get_sandbox("s1"), |s: &Sandbox| {
        s.phase() == Some(&SandboxPhase::Running) && s.is_ready()
    })
    .await;
    let status = s.status.unwrap();
    assert_eq!(status.sandbox_ip.as_deref(), Some("10.244.0.9"));
    assert_eq!(status.node_name.as_deref(), Some("worker-1"));
    assert_eq!(status.pod_info.unwrap().pod_uid, pod.metadata.uid);

    // Pause: the Pod goes, then SandboxPaused=True.
    let mut s = get_sandbox("s1")().await;
    s.spec.paused = Some(true);
    store.update(NS, &s).await.unwrap();
    eventually("the pod gone", get_pod("s1"), Option::is_none).await;
    let s = eventually("paused", get_sandbox("s1"), |s: &Sandbox| {
        s.condition(PAUSED).is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(s.phase(), Some(&SandboxPhase::Paused));
    assert_eq!(s.condition(PAUSED).unwrap().reason, "StopPauseSucceed");
    assert_eq!(s.condition(READY).unwrap().status, "False");

    // Resume: a new Pod, Running again when it runs.
    let mut s = get_sandbox("s1")().await;
    s.spec.paused = Some(false);
    store.update(NS, &s).await.unwrap();
    let again = eventually("a new pod", get_pod("s1"), Option::is_some).await.unwrap();
    assert_ne!(again.metadata.uid, pod.metadata.uid);
    run_pod(&store, "s1", "10.244.0.10").await;
    let s = eventually("Running again", get_sandbox("s1"), |s: &Sandbox| {
        s.phase() == Some(&SandboxPhase::Running) && s.is_ready()
    })
    .await;
    assert_eq!(s.status.as_ref().unwrap().sandbox_ip.as_deref(), Some("10.244.0.10"));
    assert!(s.condition(PAUSED).is_none());

    // The node-runtime sandbox was never touched.
    let on_node = get_sandbox("on-node")().await;
    assert!(on_node.status.is_none() && on_node.metadata.finalizers.is_none());
    assert!(get_pod("on-node")().await.is_none());

    // Deletion: the Pod goes, then the Sandbox.
    store.delete::<Sandbox>(NS, "s1", &Preconditions::default()).await.unwrap();
    eventually("the pod gone", get_pod("s1"), Option::is_none).await;
    let gone = {
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.get::<Sandbox>(NS, "s1").await.is_err() }
        }
    };
    eventually("the sandbox gone", gone, |g: &bool| *g).await;

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, controller).await.unwrap().unwrap();
}

/// The reasons of the Events recorded for sandbox `name`.
async fn event_reasons(store: &EmbeddedStore, name: &str) -> Vec<String> {
    let events = store
        .list::<k8s_openapi::api::core::v1::Event>(Some(NS), &oka_store::Selector::everything())
        .await
        .unwrap();
    events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter_map(|e| e.reason.clone())
        .collect()
}

#[tokio::test]
async fn a_restart_and_an_upgrade_recreate_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = PodRuntimeOptions {
        pods: PodOptions { envd_image: "oka-envd:test".into() },
        default_runtime: SandboxRuntime::Pod,
        initializer: None,
    };
    let controller = tokio::spawn(run_pod_runtime_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    store.create(NS, &sandbox("s2", None)).await.unwrap();
    let get_sandbox = || {
        let store = store.clone();
        async move { store.get::<Sandbox>(NS, "s2").await.unwrap() }
    };
    let get_pod = || {
        let store = store.clone();
        async move { store.get::<Pod>(NS, "s2").await.ok() }
    };
    let first = eventually("the pod", get_pod, Option::is_some).await.unwrap();
    run_pod(&store, "s2", "10.244.1.1").await;
    eventually("Running", get_sandbox, |s: &Sandbox| {
        s.phase() == Some(&SandboxPhase::Running) && s.is_ready()
    })
    .await;

    // Restart (`okactl restart`'s annotation): a new Pod, restarted-at written, an Event.
    let mut s = get_sandbox().await;
    s.metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::RESTART_REQUESTED_AT.into(), "2026-01-01T00:00:00Z".into());
    store.update(NS, &s).await.unwrap();
    let second = eventually("a new pod", get_pod, |p: &Option<Pod>| {
        p.as_ref().is_some_and(|p| p.metadata.uid != first.metadata.uid)
    })
    .await
    .unwrap();
    let s = get_sandbox().await;
    let notes = s.metadata.annotations.clone().unwrap();
    assert_eq!(notes[annotations::RESTARTED_AT], "2026-01-01T00:00:00Z");
    assert_eq!(s.phase(), Some(&SandboxPhase::Running), "a restart is not a failure");
    run_pod(&store, "s2", "10.244.1.2").await;
    let s = eventually("Running after the restart", get_sandbox, |s: &Sandbox| {
        s.is_ready() && s.status.as_ref().unwrap().sandbox_ip.as_deref() == Some("10.244.1.2")
    })
    .await;
    assert_eq!(s.status.unwrap().pod_info.unwrap().pod_uid, second.metadata.uid);
    eventually(
        "the SandboxRestarted Event",
        || event_reasons(&store, "s2"),
        |r: &Vec<String>| r.iter().any(|r| r == "SandboxRestarted"),
    )
    .await;

    // Upgrade (what a SandboxUpdateOps writes): the policy and a new image.
    let mut s = get_sandbox().await;
    let old_revision = s.status.as_ref().unwrap().update_revision.clone().unwrap();
    s.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
        type_: Some(oka_api::common::UpgradePolicyType::Recreate),
    });
    let spec = s.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
    spec.containers[0].image = Some("busybox:2".into());
    store.update(NS, &s).await.unwrap();
    let third = eventually("the upgraded pod", get_pod, |p: &Option<Pod>| {
        p.as_ref().is_some_and(|p| p.metadata.uid != second.metadata.uid)
    })
    .await
    .unwrap();
    assert_eq!(third.spec.as_ref().unwrap().containers[0].image.as_deref(), Some("busybox:2"));
    let s = get_sandbox().await;
    assert_eq!(s.phase(), Some(&SandboxPhase::Upgrading));
    run_pod(&store, "s2", "10.244.1.3").await;
    let s = eventually("upgraded", get_sandbox, |s: &Sandbox| {
        s.phase() == Some(&SandboxPhase::Running)
            && s.condition(oka_api::conditions::sandbox::UPGRADING)
                .is_some_and(|c| c.status == "True" && c.reason == "Succeeded")
    })
    .await;
    let status = s.status.unwrap();
    let revision = status.update_revision.unwrap();
    assert_ne!(revision, old_revision);
    assert_eq!(third.metadata.labels.as_ref().unwrap()["pod-template-hash"], revision);
    assert_eq!(status.observed_generation, s.metadata.generation);
    eventually(
        "the upgrade's Events",
        || event_reasons(&store, "s2"),
        |r: &Vec<String>| {
            ["SandboxUpgrading", "SandboxRunning"].iter().all(|w| r.iter().any(|r| r == w))
        },
    )
    .await;

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, controller).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_sandbox_update_ops_completes_over_pod_sandboxes() {
    use oka_api::SandboxUpdateOps;
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = futures::FutureExt::shared(async move {
        let _ = stopped.await;
    });
    let options = PodRuntimeOptions {
        pods: PodOptions { envd_image: "oka-envd:test".into() },
        default_runtime: SandboxRuntime::Pod,
        initializer: None,
    };
    let pods = tokio::spawn(run_pod_runtime_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        options,
        stopped.clone(),
    ));
    let ops = tokio::spawn(oka_controller::sandboxupdateops::run_update_ops_controller(
        store.clone(),
        Config::default(),
        Clock::system(),
        stopped,
    ));
    let mut s = sandbox("s4", None);
    s.metadata.labels = Some([("app".to_owned(), "agent".to_owned())].into());
    store.create(NS, &s).await.unwrap();
    let get_pod = || {
        let store = store.clone();
        async move { store.get::<Pod>(NS, "s4").await.ok() }
    };
    let first = eventually("the pod", get_pod, Option::is_some).await.unwrap();
    run_pod(&store, "s4", "10.244.2.1").await;
    eventually(
        "Running",
        || {
            let store = store.clone();
            async move { store.get::<Sandbox>(NS, "s4").await.unwrap() }
        },
        |s: &Sandbox| s.phase() == Some(&SandboxPhase::Running) && s.is_ready(),
    )
    .await;

    let suo: SandboxUpdateOps = serde_json::from_value(serde_json::json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxUpdateOps",
        "metadata": {"name": "up", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "patch": {"spec": {"containers": [{"name": "main", "image": "busybox:3"}]}},
            "updateStrategy": {"type": "Recreate"},
        },
    }))
    .unwrap();
    store.create(NS, &suo).await.unwrap();
    let upgraded = eventually("the upgraded pod", get_pod, |p: &Option<Pod>| {
        p.as_ref().is_some_and(|p| p.metadata.uid != first.metadata.uid)
    })
    .await
    .unwrap();
    let image = upgraded.spec.as_ref().unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("busybox:3"));
    run_pod(&store, "s4", "10.244.2.2").await;
    let done = eventually(
        "the SandboxUpdateOps Completed",
        || {
            let store = store.clone();
            async move { store.get::<SandboxUpdateOps>(NS, "up").await.unwrap() }
        },
        |o: &SandboxUpdateOps| {
            o.status.as_ref().and_then(|s| s.phase.as_ref()).map(|p| p.as_str())
                == Some("Completed")
        },
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!((status.replicas, status.updated_replicas, status.failed_replicas), (1, 1, 0));

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, pods).await.unwrap().unwrap();
    tokio::time::timeout(DEADLINE, ops).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_field_pods_do_not_honour_is_told_once_in_a_warning_event() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = PodRuntimeOptions {
        pods: PodOptions { envd_image: "oka-envd:test".into() },
        default_runtime: SandboxRuntime::Pod,
        initializer: None,
    };
    let controller = tokio::spawn(run_pod_runtime_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut s = sandbox("s5", None);
    s.spec.auto_pause_policy =
        Some(oka_api::probes::AutoPausePolicy::new(oka_api::probes::PauseRule::new("idle")));
    store.create(NS, &s).await.unwrap();
    let get_pod = || {
        let store = store.clone();
        async move { store.get::<Pod>(NS, "s5").await.ok() }
    };
    eventually("the pod", get_pod, Option::is_some).await;
    // Several reconciles: the Pod scheduled, then running, then ready.
    run_pod(&store, "s5", "10.244.3.1").await;
    eventually(
        "Running",
        || {
            let store = store.clone();
            async move { store.get::<Sandbox>(NS, "s5").await.unwrap() }
        },
        |s: &Sandbox| s.phase() == Some(&SandboxPhase::Running) && s.is_ready(),
    )
    .await;
    let warnings = || {
        let store = store.clone();
        async move {
            let events = store
                .list::<k8s_openapi::api::core::v1::Event>(
                    Some(NS),
                    &oka_store::Selector::everything(),
                )
                .await
                .unwrap();
            events
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("UnsupportedOnPod"))
                .collect::<Vec<_>>()
        }
    };
    let told = eventually("the warning", warnings, |w: &Vec<_>| !w.is_empty()).await;
    assert_eq!(told.len(), 1);
    let event = &told[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.count, Some(1), "told once, not at every reconcile");
    let message = event.message.clone().unwrap();
    assert!(message.starts_with("spec.autoPausePolicy: not applied on a Pod"), "{message}");

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, controller).await.unwrap().unwrap();
}
