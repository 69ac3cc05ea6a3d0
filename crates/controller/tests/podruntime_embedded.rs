//! The Pod runtime's controller, runner, informers and executor included, on the real embedded
//! store (which keeps Pods as it keeps any kind): the test plays the kubelet (it writes the
//! Pod's status) and checks what a user sees of the Sandbox through create, Ready, pause,
//! resume and deletion, and that node-runtime sandboxes are left alone. The exact requests are
//! asserted in `podruntime_kube.rs`.
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
