//! The election over `KubeStore` against a real Kubernetes API server: a killed leader's
//! lease is taken once it has expired, a released one at once.
//!
//! The server is the store tests' CRD-only `apiextensions-apiserver` on etcd
//! (`crates/store/tests/support/apiserver.rs`, built once per machine by
//! `scripts/build-apiserver.sh`). It has no `coordination.k8s.io` API, so **these tests install
//! a stand-in CRD for the built-in Lease**: `leases.coordination.k8s.io`, version `v1`, kind
//! `Lease`, namespaced, its `spec` kept as sent. The requests and the server's
//! resourceVersion preconditions are those of a real cluster; what differs is the server-side
//! schema validation and defaulting of the built-in type. Groups under `k8s.io` are protected,
//! so the CRD carries the annotation
//! `api-approved.kubernetes.io: "unapproved, test stand-in for the built-in Lease"`.
//!
//! Each candidate has its own client (its own connections), as separate replicas would.
//! Without the binaries and not as root, the tests are skipped with a message saying how to
//! build them.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../store/tests/support/apiserver.rs"]
mod apiserver;
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use oka_election::Outcome;
use oka_store::kubernetes::KubeStore;
use oka_store::{Selector, Store, WatchEvent};
use support::{Candidate, Event, NS, config, holder, leading, next_event, record};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

/// Shorter than the defaults (15 s, 10 s, 2 s), so a takeover after a kill fits in 15 s.
const LEASE_DURATION: Duration = Duration::from_secs(5);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// How long the first leader may take: the first write of a kind a CRD has just made
/// served takes the server about 2 s.
const FIRST_WRITE: Duration = Duration::from_secs(10);
/// Room for scheduling and a loaded API server.
const SLACK: Duration = Duration::from_secs(1);

/// A server with the stand-in Lease CRD, or `None` when the test is skipped.
async fn server() -> Option<ApiServer> {
    ApiServer::start(&[apiserver::lease_stand_in()]).await
}

/// Starts candidate `who` with a client of its own.
async fn start(server: &ApiServer, who: usize, events: &mpsc::UnboundedSender<Event>) -> Candidate {
    let store = KubeStore::new(server.client().await);
    let config = config(who, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD);
    Candidate::start(store, config, who, events, Duration::ZERO)
}

/// Every record the Lease had, in order, as a watch on the server saw them: which writes
/// landed, where a write dropped in flight by a kill may or may not have.
#[derive(Clone, Default)]
struct LeaseHistory(Arc<Mutex<Vec<LeaseSpec>>>);

impl LeaseHistory {
    /// Starts recording from now (before any candidate writes).
    async fn record(store: &KubeStore) -> LeaseHistory {
        let history = LeaseHistory::default();
        let listed = store.list::<Lease>(Some(NS), &Selector::everything()).await.unwrap();
        let mut watch = store
            .watch::<Lease>(Some(NS), &Selector::everything(), &listed.resource_version)
            .await
            .unwrap();
        let records = history.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = watch.next().await {
                if let WatchEvent::Added(lease) | WatchEvent::Modified(lease) = event {
                    records.lock().unwrap().push(lease.spec.clone().unwrap_or_default());
                }
            }
        });
        history
    }

    /// The last record `identity` wrote as holder, once the watch has seen one.
    async fn wait_for(&self, identity: &str) -> LeaseSpec {
        for _ in 0..100 {
            if let Some(record) = self.last_by(identity) {
                return record;
            }
            sleep(Duration::from_millis(50)).await;
        }
        panic!("the watch saw no record of {identity} within 5 s")
    }

    /// The last record `identity` wrote as holder.
    fn last_by(&self, identity: &str) -> Option<LeaseSpec> {
        let records = self.0.lock().unwrap();
        records.iter().rev().find(|r| r.holder_identity.as_deref() == Some(identity)).cloned()
    }
}

/// `later - earlier` of two record times; negative when `later` is not.
fn elapsed(earlier: Option<&MicroTime>, later: Option<&MicroTime>) -> Duration {
    let micros = |t: Option<&MicroTime>| t.expect("a record time").0.as_microsecond();
    let delta = micros(later) - micros(earlier);
    u64::try_from(delta).map_or(Duration::ZERO, Duration::from_micros)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_lease_is_taken_once_expired_on_a_real_api_server() {
    let Some(server) = server().await else { return };
    let observer = KubeStore::new(server.client().await);
    let history = LeaseHistory::record(&observer).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let first = start(&server, 0, &tx).await;
    assert_eq!(leading(next_event(&mut events, FIRST_WRITE).await).0, 0);
    let standby = start(&server, 1, &tx).await;
    sleep(3 * RETRY_PERIOD).await;
    assert!(!standby.leads());
    assert_eq!(holder(&observer).await, "candidate-0");

    // Like kill -9: the task is gone without releasing the lease.
    first.task.abort();
    let killed_at = Instant::now();
    let (who, took_over_at) = leading(next_event(&mut events, Duration::from_secs(15)).await);
    assert_eq!(who, 1);
    let takeover = took_over_at - killed_at;
    // The killed leader's last renewal that landed, and the standby's decision to take over
    // (its record's acquireTime, set before its write): both as the server stored them, since
    // the renewal the kill dropped in flight may or may not have reached the server.
    let taken = history.wait_for("candidate-1").await;
    let last_renewal = history.last_by("candidate-0").expect("the leader wrote the lease");
    let expired_for = elapsed(last_renewal.renew_time.as_ref(), taken.acquire_time.as_ref());
    println!(
        "real API server: takeover {takeover:?} after the kill, decided {expired_for:?} after \
         the last renewal that landed (lease duration {LEASE_DURATION:?})"
    );
    assert!(
        expired_for >= LEASE_DURATION,
        "taken over {expired_for:?} after the old leader's last renewal, before the lease duration"
    );
    assert!(takeover <= Duration::from_secs(15), "takeover took {takeover:?}");

    let lease = record(&observer).await;
    assert_eq!(lease.holder_identity.as_deref(), Some("candidate-1"));
    assert_eq!(lease.lease_transitions, Some(1));
    assert_eq!(lease.lease_duration_seconds, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_at_once_on_a_real_api_server() {
    let Some(server) = server().await else { return };
    let observer = KubeStore::new(server.client().await);
    let (tx, mut events) = mpsc::unbounded_channel();
    let leader = start(&server, 0, &tx).await;
    assert_eq!(leading(next_event(&mut events, FIRST_WRITE).await).0, 0);
    let standby = start(&server, 1, &tx).await;
    sleep(3 * RETRY_PERIOD).await;
    assert!(!standby.leads());

    assert_eq!(leader.shut_down().await, Outcome::Released(0));
    let released_at = Instant::now();
    assert!(matches!(events.try_recv(), Ok(Event::Stopping(0, _))));
    let (who, took_over_at) = leading(next_event(&mut events, 2 * RETRY_PERIOD + SLACK).await);
    assert_eq!(who, 1);
    let takeover = took_over_at.saturating_duration_since(released_at);
    println!("real API server: takeover {takeover:?} after a release");
    assert!(takeover < RETRY_PERIOD * 6 / 5 + SLACK, "takeover after a release took {takeover:?}");

    let lease = record(&observer).await;
    assert_eq!(lease.holder_identity.as_deref(), Some("candidate-1"));
    assert_eq!(lease.lease_transitions, Some(1));
    assert!(standby.leads());
}
