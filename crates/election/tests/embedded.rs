//! The election on the embedded store, with short real timing (a 2 s lease): one of several
//! candidates leads, a killed leader's lease is taken only once it has expired by the
//! standby's observation, a released one at once, a leader that cannot renew gives up within
//! its renew deadline and writes no more.
//!
//! Real time, not `tokio::time::pause()`: the embedded store writes on its own thread, and a
//! paused clock jumps ahead whenever the runtime waits on it, which would expire leases that a
//! real clock would not.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use oka_election::{ConfigError, ElectionError, Outcome, run_leader_elected};
use oka_store::Store;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use support::{Candidate, Event, config, holder, leading, next_event, record};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

const LEASE_DURATION: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_millis(1_200);
const RETRY_PERIOD: Duration = Duration::from_millis(250);
/// Room for scheduling on a loaded machine.
const SLACK: Duration = Duration::from_millis(500);

/// Starts candidate `who` on `store` with this file's timing.
fn start(
    store: &EmbeddedStore,
    who: usize,
    events: &mpsc::UnboundedSender<Event>,
    linger: Duration,
) -> Candidate {
    let config = config(who, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD);
    Candidate::start(store.clone(), config, who, events, linger)
}

fn open() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default()).unwrap();
    (dir, store)
}

#[tokio::test]
async fn one_of_two_candidates_leads_and_the_other_stands_by() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    let candidates = [start(&store, 0, &tx, Duration::ZERO), start(&store, 1, &tx, Duration::ZERO)];

    let (leader, _) = leading(next_event(&mut events, 3 * RETRY_PERIOD + SLACK).await);
    sleep(4 * RETRY_PERIOD).await;
    assert!(events.try_recv().is_err(), "a second candidate started leading");
    assert!(candidates[leader].leads());
    assert!(!candidates[1 - leader].leads());
    let lease = record(&store).await;
    assert_eq!(lease.holder_identity.as_deref(), Some(format!("candidate-{leader}").as_str()));
    assert_eq!(lease.lease_duration_seconds, Some(2));
    assert_eq!(lease.lease_transitions, Some(0));
    assert!(lease.acquire_time.is_some() && lease.renew_time.is_some());
}

#[tokio::test]
async fn a_killed_leaders_lease_is_taken_only_lease_duration_after_its_last_renewal() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    let first = start(&store, 0, &tx, Duration::ZERO);
    assert_eq!(leading(next_event(&mut events, RETRY_PERIOD + SLACK).await).0, 0);
    let standby = start(&store, 1, &tx, Duration::ZERO);
    sleep(3 * RETRY_PERIOD).await;
    assert!(!standby.leads());
    assert_eq!(holder(&store).await, "candidate-0");

    // Like kill -9: the task is gone without releasing the lease.
    first.task.abort();
    let killed_at = Instant::now();
    let (who, took_over_at) =
        leading(next_event(&mut events, LEASE_DURATION + 4 * RETRY_PERIOD + SLACK).await);
    assert_eq!(who, 1);

    let last_renewal = first.probe.last_write_started().expect("the leader wrote the lease");
    assert!(
        took_over_at >= last_renewal + LEASE_DURATION,
        "taken over {:?} after the old leader's last renewal started, before the lease duration",
        took_over_at - last_renewal
    );
    let takeover = took_over_at - killed_at;
    assert!(
        takeover <= LEASE_DURATION + 3 * RETRY_PERIOD + SLACK,
        "takeover took {takeover:?} after the kill"
    );
    println!(
        "embedded store: takeover {takeover:?} after the kill, {:?} after the last renewal \
         (lease duration {LEASE_DURATION:?})",
        took_over_at - last_renewal
    );
    assert!(standby.leads());
    let lease = record(&store).await;
    assert_eq!(lease.holder_identity.as_deref(), Some("candidate-1"));
    assert_eq!(lease.lease_transitions, Some(1));
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once_and_transitions_are_counted() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    let mut current = start(&store, 0, &tx, Duration::ZERO);
    assert_eq!(leading(next_event(&mut events, RETRY_PERIOD + SLACK).await).0, 0);

    for next in 1..=2 {
        let standby = start(&store, next, &tx, Duration::ZERO);
        sleep(2 * RETRY_PERIOD).await;
        assert!(!standby.leads());

        let outcome = current.shut_down().await;
        let released_at = Instant::now();
        assert_eq!(outcome, Outcome::Released(next - 1));
        // The old leader's Stopping came before its release.
        assert!(matches!(events.try_recv(), Ok(Event::Stopping(..))));
        let (who, took_over_at) = leading(next_event(&mut events, 2 * RETRY_PERIOD + SLACK).await);
        assert_eq!(who, next);
        let takeover = took_over_at.saturating_duration_since(released_at);
        assert!(
            takeover < RETRY_PERIOD * 6 / 5 + SLACK && takeover < LEASE_DURATION,
            "takeover after a release took {takeover:?}"
        );
        println!("embedded store: takeover {takeover:?} after a release");

        let lease = record(&store).await;
        assert_eq!(lease.holder_identity, Some(format!("candidate-{next}")));
        assert_eq!(lease.lease_transitions, Some(i32::try_from(next).unwrap()));
        assert_eq!(lease.lease_duration_seconds, Some(2));
        current = standby;
    }
}

#[tokio::test]
async fn a_leader_whose_renewals_fail_loses_within_the_renew_deadline_and_stops_writing() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    // Its leader work takes a while to stop: the elector must not renew meanwhile.
    let linger = 4 * RETRY_PERIOD;
    let leader = start(&store, 0, &tx, linger);
    assert_eq!(leading(next_event(&mut events, RETRY_PERIOD + SLACK).await).0, 0);
    sleep(2 * RETRY_PERIOD).await;

    leader.probe.fail_writes(true);
    let Event::Stopping(0, lost_at) =
        next_event(&mut events, RENEW_DEADLINE + RETRY_PERIOD + SLACK).await
    else {
        panic!("expected the leader to stop");
    };
    // Read now: a renewal in flight when the failures began may have landed after.
    let last_renewal = leader.probe.last_write_started().unwrap();
    let lost_after = lost_at - last_renewal;
    assert!(
        lost_after <= RENEW_DEADLINE + RETRY_PERIOD,
        "lost {lost_after:?} after the last renewal"
    );
    // The deadline counts from the start of the renewal (its read), just before its write.
    assert!(
        lost_after + Duration::from_millis(100) >= RENEW_DEADLINE,
        "lost only {lost_after:?} after the last renewal"
    );
    assert!(!leader.leads());

    // The store works again, but a leader that lost never renews.
    leader.probe.fail_writes(false);
    let attempts = leader.probe.write_attempts();
    sleep(3 * RETRY_PERIOD).await;
    assert_eq!(leader.probe.write_attempts(), attempts, "the lost leader wrote the lease again");
    let outcome = leader.task.await.unwrap().unwrap();
    assert!(outcome.is_lost(), "{outcome:?}");
    assert_eq!(outcome, Outcome::Lost(0));
    assert_eq!(holder(&store).await, "candidate-0", "a lost lease is not released");
}

#[tokio::test]
async fn renewals_keep_the_acquire_time_and_count_no_transition() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    let leader = start(&store, 0, &tx, Duration::ZERO);
    next_event(&mut events, RETRY_PERIOD + SLACK).await;
    let before = record(&store).await;
    sleep(3 * RETRY_PERIOD).await;
    let after = record(&store).await;
    assert!(after.renew_time.as_ref().unwrap().0 > before.renew_time.as_ref().unwrap().0);
    assert_eq!(after.acquire_time, before.acquire_time);
    assert_eq!(after.lease_transitions, Some(0));
    assert!(leader.leads());
}

#[tokio::test]
async fn a_release_frees_the_lease_keeping_its_transitions() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    let leader = start(&store, 0, &tx, Duration::ZERO);
    next_event(&mut events, RETRY_PERIOD + SLACK).await;
    let mut is_leader = leader.is_leader.clone();
    assert_eq!(leader.shut_down().await, Outcome::Released(0));
    assert!(!*is_leader.borrow_and_update());

    let lease = record(&store).await;
    assert_eq!(lease.holder_identity.as_deref(), Some(""));
    assert_eq!(lease.lease_duration_seconds, Some(1));
    assert_eq!(lease.lease_transitions, Some(0));
}

#[tokio::test]
async fn leader_work_that_ends_by_itself_releases_the_lease() {
    let (_dir, store) = open();
    let config = support::config(0, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD);
    let outcome =
        run_leader_elected(store.clone(), config, std::future::pending(), |_| async { 7 })
            .await
            .unwrap();
    assert_eq!(outcome, Outcome::Finished(7));
    assert_eq!(holder(&store).await, "");
}

#[tokio::test]
async fn shutdown_while_standing_by_never_calls_lead() {
    let (_dir, store) = open();
    let (tx, mut events) = mpsc::unbounded_channel();
    let leader = start(&store, 0, &tx, Duration::ZERO);
    next_event(&mut events, RETRY_PERIOD + SLACK).await;
    let standby = start(&store, 1, &tx, Duration::ZERO);
    sleep(2 * RETRY_PERIOD).await;
    assert_eq!(standby.shut_down().await, Outcome::NeverLed);
    assert!(events.try_recv().is_err());
    assert!(leader.leads());
}

#[tokio::test]
async fn an_unsafe_timing_is_refused_before_anything_is_written() {
    let (_dir, store) = open();
    let config = support::config(0, LEASE_DURATION, LEASE_DURATION, RETRY_PERIOD);
    let result =
        run_leader_elected(store.clone(), config, std::future::pending(), |_| async {}).await;
    assert!(
        matches!(
            result,
            Err(ElectionError::Config(ConfigError::RenewDeadlineNotBelowLeaseDuration { .. }))
        ),
        "{result:?}"
    );
    let lease = store.get::<Lease>(support::NS, support::LEASE).await;
    assert!(lease.is_err_and(|e| e.is_not_found()));
}
