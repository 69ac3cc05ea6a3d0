//! The SandboxClaim reconcile function and executor at their edges: a cache that lags the
//! store, stale writes, and the error policy. A fault-injecting in-memory store stands in for
//! the backend so each edge can be set up exactly; the controller against the real embedded
//! store is in `sandboxclaim_embedded.rs`.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use jiff::Timestamp;
use oka_api::{
    ApiError, SandboxClaim, SandboxClaimPhase, SandboxClaimSpec, SandboxSet, SandboxSetSpec,
};
use oka_controller::sandboxclaim::{
    ClaimAction, ClaimContext, ClaimError, InvalidClaim, claim_error_policy, execute,
    reconcile_claim,
};
use oka_controller::{Cache, Clock, Plan};
use oka_store::{Store, StoreError};

use support::FaultyStore;

const NS: &str = "default";

fn now() -> Timestamp {
    Timestamp::from_second(1_772_366_400).unwrap()
}

fn context(store: &FaultyStore) -> Arc<ClaimContext<FaultyStore>> {
    // An empty cache that never listed: everything is a cache miss.
    Arc::new(ClaimContext {
        store: store.clone(),
        sandbox_sets: Cache::default(),
        clock: Clock::from_fn(now),
    })
}

async fn create_claim(store: &FaultyStore, name: &str, template: &str) -> SandboxClaim {
    store.create(NS, &SandboxClaim::new(name, SandboxClaimSpec::new(template))).await.unwrap()
}

#[tokio::test]
async fn a_sandbox_set_missing_from_the_cache_is_confirmed_with_the_store() {
    let store = FaultyStore::new();
    let set = SandboxSet::new("pool", SandboxSetSpec { replicas: 1, ..Default::default() });
    store.create(NS, &set).await.unwrap();
    let claim = create_claim(&store, "c", "pool").await;

    reconcile_claim(Arc::new(claim), context(&store)).await.unwrap();

    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    assert_eq!(
        claim.status.unwrap().phase,
        Some(SandboxClaimPhase::Claiming),
        "a cache miss alone must not complete the claim with SandboxSetNotFound"
    );
}

#[tokio::test]
async fn a_sandbox_set_missing_from_cache_and_store_completes_the_claim() {
    let store = FaultyStore::new();
    let claim = create_claim(&store, "c", "pool").await;

    let action = reconcile_claim(Arc::new(claim), context(&store)).await.unwrap();

    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    let status = claim.status.unwrap();
    assert_eq!(status.phase, Some(SandboxClaimPhase::Completed));
    assert_eq!(status.completion_time.unwrap().0, now());
    // Look again when the default TTL (60m) ends.
    assert_eq!(action.requeue_duration(), Some(std::time::Duration::from_secs(3600)));
}

#[tokio::test]
async fn a_plan_from_a_stale_claim_fails_with_a_conflict() {
    let store = FaultyStore::new();
    let stale = create_claim(&store, "c", "pool").await;
    // Someone else writes the claim after we read it.
    let mut newer = stale.clone();
    newer.spec.replicas = 2;
    store.update(NS, &newer).await.unwrap();

    let error = reconcile_claim(Arc::new(stale.clone()), context(&store)).await.unwrap_err();
    assert!(matches!(&error, ClaimError::Store(e) if e.is_conflict()), "{error}");
    assert!(claim_error_policy(&stale, &error, &context(&store)).is_backoff());
}

#[tokio::test]
async fn a_stale_delete_does_not_remove_a_recreated_claim() {
    let store = FaultyStore::new();
    let old = create_claim(&store, "c", "pool").await;
    store.delete::<SandboxClaim>(NS, "c", &Default::default()).await.unwrap();
    let recreated = create_claim(&store, "c", "pool").await;

    let plan = Plan::nothing().with(ClaimAction::Delete);
    let error = execute(&store, &old, &plan).await.unwrap_err();

    assert!(matches!(&error, ClaimError::Store(e) if e.is_conflict()), "{error}");
    let still: SandboxClaim = store.get(NS, "c").await.unwrap();
    assert_eq!(still.metadata.uid, recreated.metadata.uid);
}

#[tokio::test]
async fn writes_to_a_claim_that_is_gone_are_not_errors() {
    let store = FaultyStore::new();
    let claim = create_claim(&store, "c", "pool").await;
    store.delete::<SandboxClaim>(NS, "c", &Default::default()).await.unwrap();

    let update = Plan::nothing().with(ClaimAction::UpdateStatus(Default::default()));
    assert!(execute(&store, &claim, &update).await.unwrap().is_await_change());
    let delete = Plan::nothing().with(ClaimAction::Delete);
    assert!(execute(&store, &claim, &delete).await.unwrap().is_await_change());
}

#[tokio::test]
async fn an_invalid_spec_waits_for_the_claim_to_change() {
    let store = FaultyStore::new();
    let mut claim = SandboxClaim::new("c", SandboxClaimSpec::new("pool"));
    claim.spec.claim_timeout = "1d".into();
    let claim = store.create(NS, &claim).await.unwrap();
    let set = SandboxSet::new("pool", SandboxSetSpec { replicas: 1, ..Default::default() });
    store.create(NS, &set).await.unwrap();

    let error = reconcile_claim(Arc::new(claim.clone()), context(&store)).await.unwrap_err();
    assert!(
        matches!(
            &error,
            ClaimError::Invalid(InvalidClaim {
                field: "claimTimeout",
                source: ApiError::InvalidDuration { .. }
            })
        ),
        "{error:?}"
    );
    assert!(claim_error_policy(&claim, &error, &context(&store)).is_await_change());
    let store_error = ClaimError::Store(StoreError::Unavailable("down".into()));
    assert!(claim_error_policy(&claim, &store_error, &context(&store)).is_backoff());
}
