//! The SandboxClaim controller, runtime and workers included, against the real embedded store
//! on a temporary directory. Real time is used here, with short durations; every wait is a
//! watch or a poll bounded by a deadline, never a fixed sleep.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use oka_api::conditions::sandbox_claim::{COMPLETED, TIMED_OUT};
use oka_api::{SandboxClaim, SandboxClaimPhase, SandboxClaimSpec, SandboxSet, SandboxSetSpec};
use oka_controller::sandboxclaim::{NoClaimer, run_sandbox_claim_controller};
use oka_controller::{Clock, Config};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Selector, Store, WatchEvent};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "default";
/// The most any step below may take; they normally take milliseconds (or the 1–2 s the test
/// configures).
const DEADLINE: Duration = Duration::from_secs(20);

fn open(dir: &Path) -> EmbeddedStore {
    EmbeddedStore::open(&dir.join("store.redb"), EmbeddedOptions::default()).expect("open store")
}

/// Opens the store again once the stopped controller's last holders let go of it: its Event
/// writer task ends a moment after the controller, when the recorder's queue closes.
async fn reopen(dir: &Path) -> EmbeddedStore {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match EmbeddedStore::open(&dir.join("store.redb"), EmbeddedOptions::default()) {
            Ok(store) => return store,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => panic!("reopen store: {error}"),
        }
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

fn start(store: &EmbeddedStore) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(run_sandbox_claim_controller(
        store.clone(),
        Config::default().workers(2),
        Clock::system(),
        std::sync::Arc::new(NoClaimer),
        shutdown,
    ));
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(DEADLINE, self.task).await.expect("controller stops").unwrap();
    }
}

fn claim(name: &str, template: &str, edit: impl FnOnce(&mut SandboxClaimSpec)) -> SandboxClaim {
    let mut spec = SandboxClaimSpec::new(template);
    edit(&mut spec);
    SandboxClaim::new(name, spec)
}

async fn sandbox_set(store: &EmbeddedStore, name: &str) {
    let set = SandboxSet::new(name, SandboxSetSpec { replicas: 1, ..Default::default() });
    store.create(NS, &set).await.expect("create sandbox set");
}

/// Polls `get` every 20 ms until `check` accepts the claim, for at most [`DEADLINE`].
async fn eventually<T>(
    what: &str,
    mut check: impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = Option<T>> + Send>>,
) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn completed_claim(store: &EmbeddedStore, name: &str) -> SandboxClaim {
    let (store, name) = (store.clone(), name.to_owned());
    eventually(&format!("{name} to complete"), move || {
        let (store, name) = (store.clone(), name.clone());
        Box::pin(async move {
            let claim: SandboxClaim = store.get(NS, &name).await.ok()?;
            let done = claim.status.as_ref()?.phase == Some(SandboxClaimPhase::Completed);
            done.then_some(claim)
        })
    })
    .await
}

fn completed_reason(claim: &SandboxClaim) -> Option<String> {
    let conditions = claim.status.as_ref()?.conditions.as_deref()?;
    oka_api::conditions::find(conditions, COMPLETED).map(|c| c.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_its_sandbox_set_completes_with_sandbox_set_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let running = start(&store);

    store.create(NS, &claim("orphan", "missing-pool", |_| {})).await.unwrap();
    let done = completed_claim(&store, "orphan").await;

    let status = done.status.as_ref().unwrap();
    assert_eq!(completed_reason(&done).as_deref(), Some("SandboxSetNotFound"));
    assert_eq!(status.message.as_deref(), Some("SandboxSet missing-pool not found"));
    assert!(status.completion_time.is_some());
    assert_eq!(status.observed_generation, done.metadata.generation);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_claim_is_deleted_when_its_ttl_elapses() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // Watch every claim change from the start, to see the order of what happens.
    let listed = store.list::<SandboxClaim>(Some(NS), &Selector::everything()).await.unwrap();
    let mut events = store
        .watch::<SandboxClaim>(Some(NS), &Selector::everything(), &listed.resource_version)
        .await
        .unwrap();
    let running = start(&store);

    store
        .create(NS, &claim("short", "missing-pool", |spec| spec.ttl_after_completed = "1s".into()))
        .await
        .unwrap();

    let mut completed_seen = false;
    let (deleted, deleted_at) = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = events.next().await {
            match event.expect("watch") {
                WatchEvent::Modified(claim)
                    if claim.status.as_ref().and_then(|s| s.phase.as_ref())
                        == Some(&SandboxClaimPhase::Completed) =>
                {
                    completed_seen = true;
                }
                WatchEvent::Deleted(claim) => return (claim, jiff::Timestamp::now()),
                _ => {}
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("the claim is deleted within the deadline");

    assert!(completed_seen, "the claim completed before it was deleted");
    assert_eq!(completed_reason(&deleted).as_deref(), Some("SandboxSetNotFound"));
    // Not before the TTL ends (counted from the stored completion time), and promptly after.
    let completed = deleted.status.as_ref().unwrap().completion_time.clone().unwrap().0;
    let waited = deleted_at.duration_since(completed);
    assert!(waited >= jiff::SignedDuration::from_secs(1), "deleted {waited:?} after completion");
    assert!(waited <= jiff::SignedDuration::from_secs(6), "deleted {waited:?} after completion");
    assert!(store.get::<SandboxClaim>(NS, "short").await.unwrap_err().is_not_found());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_an_empty_pool_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    sandbox_set(&store, "pool").await;
    let running = start(&store);

    store
        .create(NS, &claim("waiting", "pool", |spec| spec.claim_timeout = "1s".into()))
        .await
        .unwrap();
    let claiming = {
        let store = store.clone();
        eventually("the claim to start claiming", move || {
            let store = store.clone();
            Box::pin(async move {
                let claim: SandboxClaim = store.get(NS, "waiting").await.ok()?;
                claim.status?.claim_start_time
            })
        })
        .await
    };
    let done = completed_claim(&store, "waiting").await;

    let status = done.status.as_ref().unwrap();
    assert_eq!(status.claim_start_time.as_ref(), Some(&claiming));
    assert_eq!(completed_reason(&done).as_deref(), Some("TimeoutReached"));
    let conditions = status.conditions.as_deref().unwrap();
    let timed_out = oka_api::conditions::find(conditions, TIMED_OUT).expect("TimedOut condition");
    assert_eq!(timed_out.reason, "ClaimTimeoutReached");
    let message = status.message.as_deref().unwrap();
    assert!(message.starts_with("Timeout reached after "), "{message}");
    assert!(message.ends_with(", claimed 0/1 sandboxes"), "{message}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_deletion_survives_a_restart_of_controller_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let running = start(&store);
    store
        .create(
            NS,
            &claim("durable", "missing-pool", |spec| spec.ttl_after_completed = "2s".into()),
        )
        .await
        .unwrap();
    completed_claim(&store, "durable").await;
    running.stop().await;
    drop(store);

    // A new process: the store reopened from disk, a fresh controller that never saw the
    // claim complete. It finds the Completed claim by listing and deletes it on time.
    let store = reopen(dir.path()).await;
    let running = start(&store);
    let store2 = store.clone();
    eventually("the claim to be deleted after the restart", move || {
        let store = store2.clone();
        Box::pin(async move {
            let gone =
                store.get::<SandboxClaim>(NS, "durable").await.is_err_and(|e| e.is_not_found());
            gone.then_some(())
        })
    })
    .await;
    running.stop().await;
}
