//! Test support: a store wrapper that records when a candidate's writes started and fails
//! them on demand, a lead function that reports when it starts and stops, and timing helpers.

// Test support panics on failure: in a test, a panic is the failure report.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use oka_election::{ElectionConfig, ElectionError, Elector, Leadership, Outcome};
use oka_store::{
    Deleted, Object, ObjectList, Preconditions, Result, Selector, Store, StoreError, WatchStream,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The namespace and name of the tests' Lease.
pub const NS: &str = "oka-system";
pub const LEASE: &str = "oka-controllers";

/// What one candidate's store saw: its write attempts, and when its last write that may have
/// landed started.
#[derive(Debug, Default)]
pub struct Probe {
    fail_writes: AtomicBool,
    write_attempts: AtomicUsize,
    last_write_started: Mutex<Option<Instant>>,
}

impl Probe {
    /// Makes every write fail with `Unavailable` (as a partitioned replica sees), or not.
    pub fn fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }

    /// How many writes were attempted, failed ones included.
    pub fn write_attempts(&self) -> usize {
        self.write_attempts.load(Ordering::SeqCst)
    }

    /// When the last write that succeeded, or was dropped in flight (and so may have landed),
    /// started.
    pub fn last_write_started(&self) -> Option<Instant> {
        *self.last_write_started.lock().unwrap()
    }

    fn landed(&self, started: Instant) {
        let mut last = self.last_write_started.lock().unwrap();
        if last.is_none_or(|l| l < started) {
            *last = Some(started);
        }
    }
}

/// Counts a write as possibly landed unless it returned an error.
struct InFlight<'a> {
    probe: &'a Probe,
    started: Instant,
    failed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.failed {
            self.probe.landed(self.started);
        }
    }
}

/// One candidate's view of a shared store.
#[derive(Debug, Clone)]
pub struct Probed<S> {
    inner: S,
    pub probe: Arc<Probe>,
}

impl<S: Store> Probed<S> {
    pub fn new(inner: S) -> Self {
        Probed { inner, probe: Arc::default() }
    }

    async fn write<T>(&self, write: impl Future<Output = Result<T>>) -> Result<T> {
        self.probe.write_attempts.fetch_add(1, Ordering::SeqCst);
        if self.probe.fail_writes.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("injected write failure".to_owned()));
        }
        let mut flight = InFlight { probe: &self.probe, started: Instant::now(), failed: false };
        let result = write.await;
        flight.failed = result.is_err();
        result
    }
}

impl<S: Store> Store for Probed<S> {
    async fn create<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.write(self.inner.create(namespace, obj)).await
    }

    async fn get<K: Object>(&self, namespace: &str, name: &str) -> Result<K> {
        self.inner.get(namespace, name).await
    }

    async fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Result<ObjectList<K>> {
        self.inner.list(namespace, selector).await
    }

    async fn update<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.write(self.inner.update(namespace, obj)).await
    }

    async fn update_status<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.write(self.inner.update_status(namespace, obj)).await
    }

    async fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted<K>> {
        self.write(self.inner.delete(namespace, name, preconditions)).await
    }

    async fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<WatchStream<K>> {
        self.inner.watch(namespace, selector, resource_version).await
    }
}

/// What a candidate's `lead` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `lead` was called.
    Leading(usize, Instant),
    /// [`Leadership::lost`] resolved.
    Stopping(usize, Instant),
}

/// A `lead` for candidate `who`: reports when it starts, waits for [`Leadership::lost`],
/// reports that, lingers for `linger` (leader work taking time to stop), and returns `who`.
pub fn lead(
    who: usize,
    events: mpsc::UnboundedSender<Event>,
    linger: Duration,
) -> impl FnOnce(Leadership) -> std::pin::Pin<Box<dyn Future<Output = usize> + Send>> {
    move |leadership: Leadership| {
        Box::pin(async move {
            let _ = events.send(Event::Leading(who, Instant::now()));
            leadership.lost().await;
            let _ = events.send(Event::Stopping(who, Instant::now()));
            tokio::time::sleep(linger).await;
            who
        })
    }
}

/// The next event, or a panic after `within`.
pub async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>, within: Duration) -> Event {
    tokio::time::timeout(within, events.recv())
        .await
        .unwrap_or_else(|_| panic!("no election event within {within:?}"))
        .expect("every candidate is gone")
}

/// A config for candidate `who` with the given timing.
pub fn config(who: usize, lease: Duration, renew: Duration, retry: Duration) -> ElectionConfig {
    ElectionConfig {
        lease_duration: lease,
        renew_deadline: renew,
        retry_period: retry,
        ..ElectionConfig::new(NS, LEASE, format!("candidate-{who}"))
    }
}

/// The Lease's record now.
pub async fn record(store: &impl Store) -> LeaseSpec {
    let lease: Lease = store.get(NS, LEASE).await.unwrap();
    lease.spec.unwrap_or_default()
}

/// The Lease's holder now ("" when free).
pub async fn holder(store: &impl Store) -> String {
    record(store).await.holder_identity.unwrap_or_default()
}

/// One replica: its election task, what its store saw, and its controls.
pub struct Candidate {
    pub task: JoinHandle<Result<Outcome<usize>, ElectionError>>,
    pub probe: Arc<Probe>,
    pub is_leader: watch::Receiver<bool>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Candidate {
    /// Starts candidate `who` on its own view of `store`; its `lead` lingers `linger` after it
    /// is told to stop.
    pub fn start<S: Store>(
        store: S,
        config: ElectionConfig,
        who: usize,
        events: &mpsc::UnboundedSender<Event>,
        linger: Duration,
    ) -> Candidate {
        // The election's logs in the test's output (RUST_LOG=oka_election=debug for more).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "oka_election=info".into()),
            )
            .with_test_writer()
            .try_init();
        let store = Probed::new(store);
        let probe = store.probe.clone();
        let elector = Elector::new(store, config).unwrap();
        let is_leader = elector.is_leader();
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(
            async move {
                let _ = stop.await;
            },
            lead(who, events.clone(), linger),
        ));
        Candidate { task, probe, is_leader, shutdown: Some(shutdown) }
    }

    /// Starts a graceful shutdown and waits for the election's outcome.
    pub async fn shut_down(mut self) -> Outcome<usize> {
        let _ = self.shutdown.take().unwrap().send(());
        self.task.await.unwrap().unwrap()
    }

    /// Whether it leads now.
    pub fn leads(&self) -> bool {
        *self.is_leader.borrow()
    }
}

/// The candidate and instant of a `Leading` event.
pub fn leading(event: Event) -> (usize, Instant) {
    match event {
        Event::Leading(who, at) => (who, at),
        other => panic!("expected a candidate to start leading, got {other:?}"),
    }
}
