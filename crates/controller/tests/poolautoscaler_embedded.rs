//! The PoolAutoscaler controller, runtime and workers included, against the real embedded
//! store: it writes only `spec.replicas` of its SandboxSet, re-clamps a manual scale at once
//! (the SandboxSet's watch wakes it), writes its status, and a younger autoscaler of the same
//! target stands down. Every wait is a poll bounded by a deadline.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use oka_api::conditions::pool_autoscaler::{ABLE_TO_SCALE, able_to_scale_reason};
use oka_api::poolautoscaler::ScaleTargetRef;
use oka_api::{PoolAutoscaler, PoolAutoscalerSpec, SandboxSet, SandboxSetSpec};
use oka_controller::poolautoscaler::{Settings, run_pool_autoscaler_controller};
use oka_controller::{Clock, Config};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(20);

fn open(dir: &Path) -> EmbeddedStore {
    EmbeddedStore::open(&dir.join("store.redb"), EmbeddedOptions::default()).expect("open store")
}

fn autoscaler(name: &str, min: i32, max: i32) -> PoolAutoscaler {
    PoolAutoscaler::new(
        name,
        PoolAutoscalerSpec {
            scale_target_ref: ScaleTargetRef::sandbox_set("pool"),
            min_replicas: min,
            max_replicas: max,
            ..PoolAutoscalerSpec::default()
        },
    )
}

/// Polls the SandboxSet until `check` accepts it.
async fn eventually_set(store: &EmbeddedStore, what: &str, check: impl Fn(&SandboxSet) -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let set: SandboxSet = store.get(NS, "pool").await.unwrap();
        if check(&set) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}: {set:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn eventually_reason(store: &EmbeddedStore, name: &str, reason: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let pa: PoolAutoscaler = store.get(NS, name).await.unwrap();
        let conditions = pa.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        if oka_api::conditions::find(&conditions, ABLE_TO_SCALE).is_some_and(|c| c.reason == reason)
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {reason}: {pa:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_are_enforced_on_the_replicas_alone_and_a_younger_autoscaler_stands_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut set = SandboxSet::new("pool", SandboxSetSpec { replicas: 1, ..Default::default() });
    set.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "a".to_owned())]));
    let set = store.create(NS, &set).await.unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_pool_autoscaler_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        Settings::default(),
        async move {
            let _ = stopped.await;
        },
    ));

    store.create(NS, &autoscaler("guard", 3, 5)).await.unwrap();
    eventually_set(&store, "the minimum", |s| s.spec.replicas == 3).await;
    let scaled: SandboxSet = store.get(NS, "pool").await.unwrap();
    let mut expected = set.clone();
    expected.spec.replicas = 3;
    assert_eq!(scaled.spec, expected.spec, "only spec.replicas changed");
    assert_eq!(scaled.metadata.labels, set.metadata.labels);
    eventually_reason(&store, "guard", able_to_scale_reason::SUCCEEDED_RESCALE).await;

    // A manual scale above the maximum is corrected at once.
    let mut manual = scaled.clone();
    manual.spec.replicas = 9;
    store.update(NS, &manual).await.unwrap();
    eventually_set(&store, "the maximum", |s| s.spec.replicas == 5).await;

    // A second autoscaler of the same pool, created later, does nothing.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    store.create(NS, &autoscaler("late", 8, 10)).await.unwrap();
    eventually_reason(&store, "late", able_to_scale_reason::AMBIGUOUS_TARGET).await;
    let still: SandboxSet = store.get(NS, "pool").await.unwrap();
    assert_eq!(still.spec.replicas, 5);

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
}
