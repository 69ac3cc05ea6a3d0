//! Behaviour of the embedded store: the shared `Store` suite (`suite/`), run on it, plus what
//! only this backend promises (a dense global resourceVersion counter, shared allocations,
//! the history ring, durability across restarts, close).

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod suite;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use kube::Resource;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Deleted, Preconditions, Selector, Store, StoreError};

fn options() -> EmbeddedOptions {
    EmbeddedOptions::default()
}

/// The watch history the suite's stores keep: small, so `expire_history` is quick.
const SUITE_HISTORY: usize = 100;

/// The embedded store in a fresh directory, as the suite's backend.
struct Embedded {
    _dir: tempfile::TempDir,
    store: EmbeddedStore,
}

impl Embedded {
    async fn start() -> Option<Embedded> {
        let (dir, store) = open_temp(EmbeddedOptions { history_size: SUITE_HISTORY, ..options() });
        Some(Embedded { _dir: dir, store })
    }
}

impl suite::Backend for Embedded {
    type Store = EmbeddedStore;

    fn store(&self) -> &EmbeddedStore {
        &self.store
    }

    fn settle(&self) -> Duration {
        // Writes publish to watchers before they return.
        Duration::ZERO
    }

    fn cascades(&self) -> bool {
        true
    }

    async fn expire_history(&self) {
        let fillers: Vec<_> = (0..=SUITE_HISTORY).map(|i| gadget(&format!("filler-{i}"))).collect();
        let writes = fillers.iter().map(|g| self.store.create(NS, g));
        for result in futures::future::join_all(writes).await {
            result.unwrap();
        }
    }

    async fn short_watch_sessions(&self) -> (EmbeddedStore, Duration) {
        // The embedded store never ends a watch on its own.
        (self.store.clone(), Duration::ZERO)
    }
}

store_suite!(Embedded::start());

#[tokio::test]
async fn create_numbers_versions_densely_and_makes_v4_uids() {
    let (_dir, store) = open_temp(options());
    let mut w = widget("a");
    w.meta_mut().uid = Some("chosen-by-client".into());
    let created = store.create(NS, &w).await.unwrap();
    let meta = created.meta();
    assert_eq!(meta.namespace.as_deref(), Some(NS));
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.resource_version.as_deref(), Some("1"));
    let uid = meta.uid.as_deref().unwrap();
    assert_ne!(uid, "chosen-by-client");
    assert_eq!(uuid::Uuid::parse_str(uid).unwrap().get_version_num(), 4);
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(created.spec, w.spec);
    let read: Widget = store.get(NS, "a").await.unwrap();
    assert_eq!(read, created);
    // apiVersion and kind are stored with the object.
    let json = serde_json::to_value(&read).unwrap();
    assert_eq!(json["apiVersion"], "test.oka.dev/v1");
    assert_eq!(json["kind"], "Widget");
}

#[tokio::test]
async fn lists_share_the_stored_objects_and_read_at_the_current_version() {
    let (_dir, store) = open_temp(options());
    for (ns, name, color) in [
        ("b", "z", "red"),
        ("a", "y", "blue"),
        ("a", "x", "red"),
        ("b", "w", "blue"),
        ("a", "v", "red"),
    ] {
        store.create(ns, &widget(name).labeled("color", color)).await.unwrap();
    }
    store.create("a", &gadget("u").labeled("color", "red")).await.unwrap();
    let names = |list: &oka_store::ObjectList<Widget>| -> Vec<String> {
        list.items
            .iter()
            .map(|w| {
                format!(
                    "{}/{}",
                    w.meta().namespace.as_deref().unwrap(),
                    w.meta().name.as_deref().unwrap()
                )
            })
            .collect()
    };
    let all = store.list::<Widget>(None, &Selector::everything()).await.unwrap();
    assert_eq!(names(&all), ["a/v", "a/x", "a/y", "b/w", "b/z"]);
    assert_eq!(all.resource_version, "6");
    let red_in_a = store.list::<Widget>(Some("a"), &"color=red".parse().unwrap()).await.unwrap();
    assert_eq!(names(&red_in_a), ["a/v", "a/x"]);
    let not_red = store.list::<Widget>(None, &"color!=red".parse().unwrap()).await.unwrap();
    assert_eq!(names(&not_red), ["a/y", "b/w"]);
    let none = store.list::<Widget>(Some("c"), &Selector::everything()).await.unwrap();
    assert!(none.items.is_empty());
    // Lists share the stored object: two lists return the same allocation.
    let again = store.list::<Widget>(None, &Selector::everything()).await.unwrap();
    assert!(Arc::ptr_eq(&all.items[0], &again.items[0]));
}

#[tokio::test]
async fn resource_versions_are_global_and_increasing() {
    let (_dir, store) = open_temp(options());
    let a = store.create(NS, &widget("a")).await.unwrap();
    let g = store.create(NS, &gadget("g")).await.unwrap();
    let mut a2 = a.clone();
    a2.spec.size = 2;
    let a2 = store.update(NS, &a2).await.unwrap();
    assert_eq!([a.rv(), g.rv(), a2.rv()], [1, 2, 3]);
    assert_eq!(store.resource_version(), "3");
}

#[tokio::test]
async fn a_no_op_update_does_not_advance_the_version() {
    let (_dir, store) = open_temp(options());
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "1").await.unwrap();
    assert_eq!(store.update(NS, &created).await.unwrap(), created);
    assert_eq!(store.update_status(NS, &created).await.unwrap(), created);
    assert_eq!(store.resource_version(), "1");
    assert!(ready(&mut watch).is_empty());
}

#[tokio::test]
async fn a_removal_has_its_own_version() {
    let (_dir, store) = open_temp(options());
    let created = store.create(NS, &widget("a")).await.unwrap();
    let Deleted::Gone(last) =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap()
    else {
        panic!("expected Gone")
    };
    assert_eq!(last.meta().uid, created.meta().uid);
    assert_eq!(last.rv(), 2, "the removal has its own resourceVersion");
    assert!(store.get::<Widget>(NS, "a").await.unwrap_err().is_not_found());
    // The name is free again, for a new object with a new uid.
    let again = store.create(NS, &widget("a")).await.unwrap();
    assert_ne!(again.meta().uid, created.meta().uid);
}

#[tokio::test]
async fn owner_cascade_is_one_version_per_change_breadth_first() {
    let (_dir, store) = open_temp(options());
    let owner = store.create(NS, &widget("owner")).await.unwrap();
    let other = store.create(NS, &widget("other-owner")).await.unwrap();
    // owner → child (Gadget) → grandchild (Widget): removed in turn.
    let child = store.create(NS, &gadget("child").owned_by(&owner)).await.unwrap();
    store.create(NS, &widget("grandchild").owned_by(&child)).await.unwrap();
    // A dependent with finalizers only starts its deletion.
    store.create(NS, &gadget("guarded").owned_by(&owner).finalizer("x/keep")).await.unwrap();
    // A dependent with another live owner only loses the reference.
    store.create(NS, &widget("shared").owned_by(&owner).owned_by(&other)).await.unwrap();
    // An object in another namespace naming the owner's uid is a dependent too.
    store.create("elsewhere", &widget("far").owned_by(&owner)).await.unwrap();
    let unrelated = store.create(NS, &widget("unrelated")).await.unwrap();
    let before = store.resource_version();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), &before).await.unwrap();
    let mut gwatch = store.watch::<Gadget>(None, &Selector::everything(), &before).await.unwrap();

    let deleted = store.delete::<Widget>(NS, "owner", &Preconditions::default()).await.unwrap();
    assert!(matches!(deleted, Deleted::Gone(_)));

    assert!(store.get::<Gadget>(NS, "child").await.unwrap_err().is_not_found());
    assert!(store.get::<Widget>(NS, "grandchild").await.unwrap_err().is_not_found());
    assert!(store.get::<Widget>("elsewhere", "far").await.unwrap_err().is_not_found());
    let guarded: Gadget = store.get(NS, "guarded").await.unwrap();
    assert!(guarded.meta().deletion_timestamp.is_some());
    let shared: Widget = store.get(NS, "shared").await.unwrap();
    let owners: Vec<_> =
        shared.meta().owner_references.iter().flatten().map(|r| r.uid.clone()).collect();
    assert_eq!(owners, [other.meta().uid.clone().unwrap()]);
    assert_eq!(store.get::<Widget>(NS, "unrelated").await.unwrap(), unrelated);

    // One rv per change, breadth first, dependents in (kind, namespace, name) order:
    // the owner; its dependents (gadgets child and guarded, then widgets default/shared and
    // elsewhere/far); then the grandchild.
    let base: u64 = before.parse().unwrap();
    let widgets: Vec<_> = ready(&mut watch).iter().map(summary).collect();
    let gadgets: Vec<_> = ready(&mut gwatch).iter().map(summary).collect();
    assert_eq!(
        gadgets,
        [("Deleted", "child".to_string(), base + 2), ("Modified", "guarded".to_string(), base + 3)]
    );
    assert_eq!(
        widgets,
        [
            ("Deleted", "owner".to_string(), base + 1),
            ("Modified", "shared".to_string(), base + 4),
            ("Deleted", "far".to_string(), base + 5),
            ("Deleted", "grandchild".to_string(), base + 6),
        ]
    );

    // Removing the guarded dependent's finalizer removes it.
    let mut g = guarded.clone();
    g.meta_mut().finalizers = None;
    store.update(NS, &g).await.unwrap();
    assert!(store.get::<Gadget>(NS, "guarded").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn watch_from_compacted_version_is_gone() {
    let (_dir, store) = open_temp(EmbeddedOptions { history_size: 3, ..options() });
    for i in 0..5 {
        store.create(NS, &widget(&format!("w{i}"))).await.unwrap();
    }
    // History holds rv 3, 4, 5: a watch can start from 2 or later.
    let err = store.watch::<Widget>(None, &Selector::everything(), "1").await.err().unwrap();
    assert_eq!(err, StoreError::Gone { requested: "1".into(), oldest: "2".into() });
    assert_eq!(err.http_status(), 410);
    let mut from_2 = store.watch::<Widget>(None, &Selector::everything(), "2").await.unwrap();
    assert_eq!(ready(&mut from_2).len(), 3);
    // A version the store never reached, or not a number, is invalid.
    assert!(matches!(
        store.watch::<Widget>(None, &Selector::everything(), "6").await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.watch::<Widget>(None, &Selector::everything(), "x").await,
        Err(StoreError::Invalid(_))
    ));
}

#[tokio::test]
async fn slow_watcher_gets_gone_without_blocking_writers() {
    let (_dir, store) = open_temp(EmbeddedOptions { history_size: 4, ..options() });
    let mut slow = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let mut fast = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let mut seen_fast = 0;
    for i in 0..10 {
        store.create(NS, &widget(&format!("w{i}"))).await.unwrap();
        seen_fast += ready(&mut fast).len();
    }
    assert_eq!(seen_fast, 10, "a watcher that keeps up sees everything");
    let err = slow.next().await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::Gone { .. }), "{err}");
    assert!(slow.next().await.is_none(), "the stream ends after Gone");
}

#[tokio::test]
async fn raw_watchers_share_one_serialization() {
    use oka_store::{RawObject, RawWatchEvent};
    let (_dir, store) = open_temp(options());
    let red: Selector = "color=red".parse().unwrap();
    let mut typed = store.watch::<Widget>(Some(NS), &red, "").await.unwrap();
    let mut raw = store.watch_raw::<Widget>(Some(NS), &red, "").await.unwrap();
    let mut again = store.watch_raw::<Widget>(Some(NS), &red, "").await.unwrap();
    let a = store.create(NS, &widget("a").labeled("color", "red")).await.unwrap();
    let mut resized = a.clone();
    resized.spec.size = 3;
    let resized = store.update(NS, &resized).await.unwrap();
    store.update(NS, &resized.clone().labeled("color", "green")).await.unwrap();
    let typed: Vec<_> =
        ready(&mut typed).into_iter().map(|e| RawWatchEvent::of(e).unwrap()).collect();
    let mut raws = Vec::new();
    while let Some(Some(event)) = futures::FutureExt::now_or_never(raw.next()) {
        raws.push(event.unwrap());
    }
    assert_eq!(raws.len(), 3);
    for (raw, typed) in raws.iter().zip(&typed) {
        let json = |e: &RawWatchEvent| -> serde_json::Value {
            match e {
                RawWatchEvent::Added(o)
                | RawWatchEvent::Modified(o)
                | RawWatchEvent::Deleted(o) => serde_json::from_slice(&o.json).unwrap(),
                RawWatchEvent::Bookmark(rv) => serde_json::json!(rv),
            }
        };
        assert_eq!(std::mem::discriminant(raw), std::mem::discriminant(typed));
        assert_eq!(json(raw), json(typed));
    }
    let RawWatchEvent::Modified(modified) = &raws[1] else { panic!("expected Modified") };
    assert_eq!((modified.name.as_str(), modified.namespace.as_str()), ("a", NS));
    // Every watcher shares the one serialization of a version.
    let RawWatchEvent::Added(first) = &raws[0] else { panic!("expected Added") };
    let RawWatchEvent::Added(shared) = again.next().await.unwrap().unwrap() else { panic!() };
    assert!(Arc::ptr_eq(first, &shared));
    let _: &RawObject = &shared;
}

#[tokio::test]
async fn concurrent_writes_get_distinct_versions_and_failures_stay_apart() {
    let (_dir, store) = open_temp(options());
    let mut tasks = Vec::new();
    for t in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for i in 0..25 {
                // Every task also tries to create the shared names: exactly one wins each.
                let own = store.create(NS, &widget(&format!("t{t}-{i}"))).await.map(|w| w.rv());
                let shared =
                    store.create(NS, &widget(&format!("shared-{i}"))).await.map(|w| w.rv());
                results.push((own, shared));
            }
            results
        }));
    }
    let mut rvs = BTreeSet::new();
    let mut shared_wins = 0;
    for task in tasks {
        for (own, shared) in task.await.unwrap() {
            assert!(rvs.insert(own.unwrap()), "resourceVersions are unique");
            match shared {
                Ok(rv) => {
                    shared_wins += 1;
                    assert!(rvs.insert(rv));
                }
                Err(e) => assert!(matches!(e, StoreError::AlreadyExists { .. }), "{e}"),
            }
        }
    }
    assert_eq!(shared_wins, 25);
    assert_eq!(rvs.len(), 16 * 25 + 25);
    assert_eq!(*rvs.last().unwrap(), rvs.len() as u64, "no gaps");
}

#[tokio::test]
async fn second_open_of_same_file_fails_clearly() {
    let (dir, store) = open_temp(options());
    let path = dir.path().join("store.redb");
    let err = EmbeddedStore::open(&path, options()).unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(ref m) if m.contains("already open")), "{err}");
    store.close().unwrap();
    EmbeddedStore::open(&path, options()).unwrap();
}

#[tokio::test]
async fn restart_keeps_objects_and_resource_version_monotonic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = open_at(&path);
    let owner = store.create(NS, &widget("a").labeled("k", "v")).await.unwrap();
    store.create(NS, &gadget("g").owned_by(&owner)).await.unwrap();
    let mut a = store.get::<Widget>(NS, "a").await.unwrap();
    a.status = Some(WidgetStatus { phase: "Ready".into() });
    let a = store.update_status(NS, &a).await.unwrap();
    store.create(NS, &widget("gone")).await.unwrap();
    store.delete::<Widget>(NS, "gone", &Preconditions::default()).await.unwrap();
    let rv_before = store.resource_version();
    drop(store);

    let store = open_at(&path);
    assert_eq!(store.resource_version(), rv_before);
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), a);
    assert!(store.get::<Widget>(NS, "gone").await.unwrap_err().is_not_found());
    let next = store.create(NS, &widget("b")).await.unwrap();
    assert_eq!(next.rv(), rv_before.parse::<u64>().unwrap() + 1);
    // The owner index is rebuilt: the cascade still works after a restart.
    store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap();
    assert!(store.get::<Gadget>(NS, "g").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn restart_starts_watch_history_at_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = open_at(&path);
    for i in 0..3 {
        store.create(NS, &widget(&format!("w{i}"))).await.unwrap();
    }
    store.close().unwrap();
    let store = open_at(&path);
    let err = store.watch::<Widget>(None, &Selector::everything(), "2").await.err().unwrap();
    assert_eq!(err, StoreError::Gone { requested: "2".into(), oldest: "3".into() });
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "3").await.unwrap();
    store.create(NS, &widget("w3")).await.unwrap();
    assert_eq!(summary(&next(&mut watch).await), ("Added", "w3".into(), 4));
}

#[tokio::test]
async fn closed_store_refuses_calls_and_ends_watches() {
    let (_dir, store) = open_temp(options());
    let clone = store.clone();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    store.create(NS, &widget("a")).await.unwrap();
    store.close().unwrap();
    // Events committed before the close are still delivered, then the stream ends.
    assert_eq!(summary(&next(&mut watch).await).1, "a");
    assert!(watch.next().await.is_none());
    let err = clone.create(NS, &widget("b")).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)) && err.is_retryable(), "{err}");
    assert!(matches!(clone.get::<Widget>(NS, "a").await, Err(StoreError::Unavailable(_))));
    store.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_every_concurrent_write_once_in_order() {
    let (_dir, store) = open_temp(options());
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let writers: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    store.create(NS, &widget(&format!("t{t}-{i}"))).await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let rvs: Vec<u64> = ready(&mut watch).iter().map(|e| summary(e).2).collect();
    assert_eq!(rvs, (1..=320).collect::<Vec<u64>>());
}

#[tokio::test]
async fn watch_deliveries_are_timed_in_the_lag_histogram() {
    let (_dir, store) = open_temp(options());
    let mut registry = prometheus_client::registry::Registry::default();
    store.register_metrics(&mut registry);
    let lag_count = |registry: &prometheus_client::registry::Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        let line = text.lines().find(|l| l.starts_with("oka_store_watch_lag_seconds_count "));
        line.and_then(|l| l.split(' ').nth(1)).and_then(|n| n.parse::<u64>().ok()).unwrap()
    };
    assert_eq!(lag_count(&registry), 0);
    let mut typed = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let mut raw = store.watch_raw::<Widget>(None, &Selector::everything(), "").await.unwrap();
    for name in ["a", "b", "c"] {
        store.create(NS, &widget(name)).await.unwrap();
    }
    // A change of another kind is not delivered to these watchers, so not timed.
    store.create(NS, &gadget("g")).await.unwrap();
    for _ in 0..3 {
        next(&mut typed).await;
        raw.next().await.unwrap().unwrap();
    }
    assert_eq!(lag_count(&registry), 6, "three events, two watchers");
}
