//! The claim engine against the real embedded store.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oka_api::{Sandbox, SandboxState, annotations, labels, sandbox_state};
use oka_manager::{ClaimConfig, ClaimEngine, ClaimError, ClaimOptions, Index, PoolRef};
use oka_store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_never_share_a_sandbox_and_the_rest_fail_fast() {
    let (store, _dir) = common::store();
    let set = common::create_pool(&store, "team-a", "base").await;
    common::stock(&store, &set, 20).await;
    let index = Index::spawn(store.clone());
    index.wait_ready().await;
    common::wait_members(&index, "team-a", "base", 20).await;
    let engine = Arc::new(ClaimEngine::new(store.clone(), index, ClaimConfig::default()));

    let started = Instant::now();
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let engine = Arc::clone(&engine);
            tokio::spawn(async move {
                let pool = PoolRef::new("team-a", "base");
                engine.claim(&pool, &format!("user-{i}"), &ClaimOptions::default()).await
            })
        })
        .collect();
    let mut claimed = Vec::new();
    let mut exhausted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(sandbox) => claimed.push(sandbox),
            Err(ClaimError::PoolExhausted { pool }) => {
                assert_eq!(pool, PoolRef::new("team-a", "base"));
                exhausted += 1;
            }
            Err(other) => panic!("unexpected claim error: {other}"),
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(claimed.len(), 20);
    assert_eq!(exhausted, 12);
    assert!(elapsed < Duration::from_secs(5), "32 claims took {elapsed:?}");
    let names: HashSet<_> = claimed.iter().map(|c| c.sandbox.metadata.name.clone()).collect();
    let ids: HashSet<_> = claimed.iter().map(|c| c.sandbox_id.clone()).collect();
    assert_eq!((names.len(), ids.len()), (20, 20), "a sandbox was handed out twice");

    // The store agrees: every member is claimed, once, by the owner the claim returned.
    let now = jiff::Timestamp::now();
    let all =
        store.list::<Sandbox>(Some("team-a"), &oka_store::Selector::everything()).await.unwrap();
    assert_eq!(all.items.len(), 20);
    for claim in &claimed {
        let stored = store
            .get::<Sandbox>("team-a", claim.sandbox.metadata.name.as_deref().unwrap())
            .await
            .unwrap();
        let notes = stored.metadata.annotations.as_ref().unwrap();
        assert_eq!(notes[annotations::LOCK], claim.lock);
        assert_eq!(
            notes[annotations::OWNER],
            claim.sandbox.metadata.annotations.as_ref().unwrap()[annotations::OWNER]
        );
        assert_eq!(stored.metadata.labels.as_ref().unwrap()[labels::SANDBOX_CLAIMED], "true");
        assert!(stored.metadata.owner_references.is_none());
        assert_eq!(sandbox_state(&stored, now).state, SandboxState::Running);
    }
}

#[tokio::test]
async fn claim_from_an_empty_pool_is_pool_exhausted_and_retryable() {
    let (store, _dir) = common::store();
    common::create_pool(&store, "default", "empty").await;
    let index = Index::spawn(store.clone());
    index.wait_ready().await;
    let engine = ClaimEngine::new(store, index, ClaimConfig::default());
    let started = Instant::now();
    let error = engine
        .claim(&PoolRef::new("default", "empty"), "me", &ClaimOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, ClaimError::PoolExhausted { .. }), "{error}");
    assert!(error.is_retryable());
    assert!(started.elapsed() < Duration::from_millis(100));
}

#[tokio::test]
async fn a_sandbox_claimed_behind_the_index_costs_one_conflict_then_another_is_claimed() {
    let (store, _dir) = common::store();
    let set = common::create_pool(&store, "default", "base").await;
    let members = common::stock(&store, &set, 2).await;
    let index = Index::spawn(store.clone());
    index.wait_ready().await;
    common::wait_members(&index, "default", "base", 2).await;
    // Stop the watch so the index keeps the stale versions, then lock both... one of them.
    index.shutdown();
    let mut stolen = members[0].clone();
    stolen
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::LOCK.into(), "other".into());
    store.update("default", &stolen).await.unwrap();

    let engine = ClaimEngine::new(store.clone(), Arc::clone(&index), ClaimConfig::default());
    let mut attempts = Vec::new();
    let mut got = Vec::new();
    for _ in 0..2 {
        match engine.claim(&PoolRef::new("default", "base"), "me", &ClaimOptions::default()).await {
            Ok(c) => {
                attempts.push(c.attempts);
                got.push(c.sandbox.metadata.name.clone().unwrap());
            }
            Err(ClaimError::PoolExhausted { .. }) => attempts.push(0),
            Err(e) => panic!("{e}"),
        }
    }
    // Exactly one claim succeeds, on the member nobody else locked.
    assert_eq!(got, vec![members[1].metadata.name.clone().unwrap()]);
    let stored = store
        .get::<Sandbox>("default", members[0].metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(stored.metadata.annotations.as_ref().unwrap()[annotations::LOCK], "other");
}

/// Two managers (two engines, two indexes) on one store race for one pool: conflicts are
/// resolved by the store's compare-and-swap, never by handing a sandbox out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_racing_for_one_pool_never_share_a_sandbox() {
    let (store, _dir) = common::store();
    let set = common::create_pool(&store, "default", "base").await;
    common::stock(&store, &set, 20).await;
    let mut engines = Vec::new();
    for _ in 0..2 {
        let index = Index::spawn(store.clone());
        index.wait_ready().await;
        common::wait_members(&index, "default", "base", 20).await;
        engines.push(Arc::new(ClaimEngine::new(store.clone(), index, ClaimConfig::default())));
    }
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let engine = Arc::clone(&engines[i % 2]);
            tokio::spawn(async move {
                let pool = PoolRef::new("default", "base");
                engine.claim(&pool, &format!("user-{i}"), &ClaimOptions::default()).await
            })
        })
        .collect();
    let mut names = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(claimed) => names.push(claimed.sandbox.metadata.name.clone().unwrap()),
            Err(error) => assert!(error.is_retryable(), "{error}"),
        }
    }
    let distinct: HashSet<_> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "a sandbox was handed out twice: {names:?}");
    assert!(names.len() <= 20);
    // What the store says matches what the callers were told.
    let claimed = store
        .list::<Sandbox>(Some("default"), &oka_store::Selector::everything())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.metadata.labels.as_ref().unwrap()[labels::SANDBOX_CLAIMED] == "true")
        .count();
    assert_eq!(claimed, names.len());
}

/// An initializer whose agent runtime always refuses `/init`.
struct RefusingInit;

impl oka_manager::SandboxInitializer for RefusingInit {
    fn init<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _env_vars: &'a std::collections::BTreeMap<String, String>,
        _access_token: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), oka_manager::InitError>> {
        Box::pin(async { Err(oka_manager::InitError("refused".into())) })
    }
}

/// `acquire` (the SandboxClaim controller's path): a sandbox whose `/init` fails is deleted, or
/// kept and labelled `reserved-failed-sandbox` when the caller reserves failed sandboxes; the
/// claim's sandboxes are found again by owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_discards_or_reserves_a_sandbox_whose_init_failed() {
    use oka_manager::{AcquireError, AcquireOptions, acquire};
    let (store, _dir) = common::store();
    let set = common::create_pool(&store, "default", "base").await;
    common::stock(&store, &set, 3).await;
    let index = Index::spawn(store.clone());
    index.wait_ready().await;
    common::wait_members(&index, "default", "base", 3).await;
    let engine = ClaimEngine::new(store.clone(), Arc::clone(&index), ClaimConfig::default());
    let pool = PoolRef::new("default", "base");
    let options = ClaimOptions {
        access_token: Some("token".into()),
        claim_name: Some("c".into()),
        ..ClaimOptions::default()
    };

    // Without an access token there is no /init: the claim stands.
    let plain = ClaimOptions { access_token: None, ..options.clone() };
    let how = AcquireOptions::default();
    let kept = acquire(&engine, &RefusingInit, &pool, "uid-1", &plain, &how).await.unwrap();
    assert_eq!(index.owned_by("default", "uid-1").len(), 1);
    let labels = kept.sandbox.metadata.labels.clone().unwrap();
    assert_eq!(labels[labels::CLAIM_NAME], "c");

    // Init refused: deleted.
    let error = acquire(&engine, &RefusingInit, &pool, "uid-1", &options, &how).await;
    let Err(AcquireError::Init { sandbox, .. }) = error else { panic!("{error:?}") };
    assert!(store.get::<Sandbox>("default", &sandbox).await.unwrap_err().is_not_found());

    // Init refused with reserveFailedSandbox: kept, labelled, and no longer counted live.
    let how = AcquireOptions { reserve_failed: true, ..AcquireOptions::default() };
    let error = acquire(&engine, &RefusingInit, &pool, "uid-1", &options, &how).await;
    let Err(AcquireError::Init { sandbox, .. }) = error else { panic!("{error:?}") };
    let reserved = store.get::<Sandbox>("default", &sandbox).await.unwrap();
    let labels = reserved.metadata.labels.unwrap();
    assert_eq!(labels[labels::RESERVED_FAILED_SANDBOX], "true");
    assert_eq!(index.owned_by("default", "uid-1").len(), 2, "kept, and still the claim's");
    assert!(index.owned_by("default", "someone-else").is_empty());

    // The pool is empty now: without create-on-no-stock, no stock.
    let error = acquire(&engine, &RefusingInit, &pool, "uid-1", &plain, &how).await;
    assert!(matches!(error, Err(AcquireError::Claim(ClaimError::PoolExhausted { .. }))));
}
