//! The SandboxClaim reconcile function and executor at their edges: a cache that lags the
//! store, stale writes, and the error policy. A fault-injecting in-memory store stands in for
//! the backend so each edge can be set up exactly; the controller against the real embedded
//! store is in `sandboxclaim_embedded.rs`.

#![allow(clippy::unwrap_used)]

// The fault-injecting store of the controller runner's tests.
#[path = "../../cache/tests/support/mod.rs"]
mod support;

use std::sync::Arc;

use jiff::Timestamp;
use oka_api::{
    ApiError, SandboxClaim, SandboxClaimPhase, SandboxClaimSpec, SandboxSet, SandboxSetSpec,
};
use oka_cache::Cache;
use oka_controller::sandboxclaim::{
    ClaimAction, ClaimContext, ClaimError, ClaimFailure, ClaimRequest, InvalidClaim, NoClaimer,
    SandboxClaimer, claim_error_policy, execute, reconcile_claim,
};
use oka_controller::{Clock, Plan};
use oka_store::{Store, StoreError};

use support::FaultyStore;

const NS: &str = "default";

fn now() -> Timestamp {
    Timestamp::from_second(1_772_366_400).unwrap()
}

fn context(store: &FaultyStore) -> Arc<ClaimContext<FaultyStore>> {
    // An empty cache that never listed: everything is a cache miss.
    Arc::new(ClaimContext::new(
        store.clone(),
        Cache::default(),
        Clock::from_fn(now),
        Arc::new(NoClaimer),
    ))
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
    let error = execute(&context(&store), &old, &plan).await.unwrap_err();

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
    assert!(execute(&context(&store), &claim, &update).await.unwrap().is_await_change());
    let delete = Plan::nothing().with(ClaimAction::Delete);
    assert!(execute(&context(&store), &claim, &delete).await.unwrap().is_await_change());
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

/// A claimer over a model pool of `stock` sandboxes: each claim takes the next one and
/// remembers its owner, as the manager's engine does in its index.
struct ModelClaimer {
    stock: std::sync::Mutex<usize>,
    owned: std::sync::Mutex<Vec<Arc<oka_api::Sandbox>>>,
    requests: std::sync::Mutex<Vec<ClaimRequest>>,
}

impl ModelClaimer {
    fn new(stock: usize) -> Arc<Self> {
        Arc::new(Self {
            stock: std::sync::Mutex::new(stock),
            owned: Default::default(),
            requests: Default::default(),
        })
    }
}

impl SandboxClaimer for ModelClaimer {
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> futures::future::BoxFuture<'a, Result<String, ClaimFailure>> {
        Box::pin(async move {
            self.requests.lock().unwrap().push(request.clone());
            let mut stock = self.stock.lock().unwrap();
            if *stock == 0 {
                return Err(ClaimFailure::NoStock("empty".into()));
            }
            *stock -= 1;
            let mut owned = self.owned.lock().unwrap();
            let name = format!("sbx-{}", owned.len());
            let sandbox = oka_api::Sandbox::test()
                .name(&name)
                .phase(oka_api::SandboxPhase::Running)
                .ready()
                .claimed()
                .annotation(oka_api::annotations::OWNER, &request.owner)
                .build();
            owned.push(Arc::new(sandbox));
            Ok(name)
        })
    }

    fn owned(&self, _namespace: &str, owner: &str) -> Vec<Arc<oka_api::Sandbox>> {
        let owned = self.owned.lock().unwrap();
        owned
            .iter()
            .filter(|s| {
                s.metadata.annotations.as_ref().unwrap()[oka_api::annotations::OWNER] == owner
            })
            .cloned()
            .collect()
    }
}

#[tokio::test]
async fn a_claim_claims_in_batches_until_every_replica_is_claimed() {
    let store = FaultyStore::new();
    store.create(NS, &SandboxSet::new("pool", SandboxSetSpec::default())).await.unwrap();
    let mut spec = SandboxClaimSpec::new("pool");
    spec.replicas = 60;
    spec.env_vars = Some([("FOO".to_owned(), "bar".to_owned())].into());
    let claim = store.create(NS, &SandboxClaim::new("c", spec)).await.unwrap();
    let claimer = ModelClaimer::new(100);
    let ctx = Arc::new(ClaimContext::new(
        store.clone(),
        Cache::default(),
        Clock::from_fn(now),
        claimer.clone(),
    ));

    // First pass: Claiming, then a batch of 50 (5, 10, 20, 15 at a time).
    let action = reconcile_claim(Arc::new(claim), Arc::clone(&ctx)).await.unwrap();
    assert_eq!(action.requeue_duration(), Some(std::time::Duration::ZERO));
    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    let status = claim.status.clone().unwrap();
    assert_eq!(status.phase, Some(SandboxClaimPhase::Claiming));
    assert_eq!(status.claimed_replicas, Some(50));
    assert_eq!(status.message.as_deref(), Some("Claiming sandboxes: 50/60 claimed"));
    let requests = claimer.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 50);
    assert_eq!(requests[0].owner, claim.metadata.uid.clone().unwrap());
    assert_eq!(requests[0].claim_name, "c");
    assert_eq!(requests[0].env_vars["FOO"], "bar");

    // Second pass: the last 10; third: Completed.
    reconcile_claim(Arc::new(claim), Arc::clone(&ctx)).await.unwrap();
    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    assert_eq!(claim.status.as_ref().unwrap().claimed_replicas, Some(60));
    reconcile_claim(Arc::new(claim), Arc::clone(&ctx)).await.unwrap();
    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    let status = claim.status.unwrap();
    assert_eq!(status.phase, Some(SandboxClaimPhase::Completed));
    assert_eq!(status.message.as_deref(), Some("Successfully claimed 60/60 sandboxes"));
    assert_eq!(claimer.requests.lock().unwrap().len(), 60, "no claim beyond the replicas");
}

#[tokio::test]
async fn an_empty_pool_is_tried_again_after_two_seconds() {
    let store = FaultyStore::new();
    store.create(NS, &SandboxSet::new("pool", SandboxSetSpec::default())).await.unwrap();
    let mut spec = SandboxClaimSpec::new("pool");
    spec.replicas = 3;
    let claim = store.create(NS, &SandboxClaim::new("c", spec)).await.unwrap();
    let claimer = ModelClaimer::new(1);
    let ctx = Arc::new(ClaimContext::new(
        store.clone(),
        Cache::default(),
        Clock::from_fn(now),
        claimer.clone(),
    ));

    let action = reconcile_claim(Arc::new(claim), Arc::clone(&ctx)).await.unwrap();
    assert_eq!(action.requeue_duration(), Some(std::time::Duration::ZERO));
    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    assert_eq!(claim.status.as_ref().unwrap().claimed_replicas, Some(1));
    // The batch's first round asked for all 3; two found no stock.
    assert_eq!(claimer.requests.lock().unwrap().len(), 3);

    let action = reconcile_claim(Arc::new(claim), Arc::clone(&ctx)).await.unwrap();
    assert_eq!(action.requeue_duration(), Some(std::time::Duration::from_secs(2)));
    let claim: SandboxClaim = store.get(NS, "c").await.unwrap();
    let status = claim.status.unwrap();
    assert_eq!(status.claimed_replicas, Some(1));
    assert_eq!(status.message.as_deref(), Some("Claiming sandboxes: 1/3 claimed"));
}

#[tokio::test]
async fn a_reconcile_from_a_claim_older_than_our_own_write_waits() {
    let store = FaultyStore::new();
    store.create(NS, &SandboxSet::new("pool", SandboxSetSpec::default())).await.unwrap();
    let mut spec = SandboxClaimSpec::new("pool");
    spec.replicas = 3;
    let stale = store.create(NS, &SandboxClaim::new("c", spec)).await.unwrap();
    let claimer = ModelClaimer::new(1);
    let ctx = Arc::new(ClaimContext::new(
        store.clone(),
        Cache::default(),
        Clock::from_fn(now),
        claimer.clone(),
    ));
    reconcile_claim(Arc::new(stale.clone()), Arc::clone(&ctx)).await.unwrap();
    let asked = claimer.requests.lock().unwrap().len();

    let action = reconcile_claim(Arc::new(stale), Arc::clone(&ctx)).await.unwrap();
    assert!(action.is_await_change());
    assert_eq!(claimer.requests.lock().unwrap().len(), asked, "no claim from a stale claim");
}
