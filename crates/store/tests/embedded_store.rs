//! Behaviour of the embedded store, one test per rule of the `Store` semantics.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use futures::StreamExt;
use kube::Resource;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Deleted, Preconditions, Selector, Store, StoreError, WatchEvent};

fn options() -> EmbeddedOptions {
    EmbeddedOptions::default()
}

#[tokio::test]
async fn create_sets_server_owned_fields() {
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
async fn create_with_generate_name_picks_a_fresh_name() {
    let (_dir, store) = open_temp(options());
    let mut names = BTreeSet::new();
    for _ in 0..20 {
        let mut w = widget("");
        w.meta_mut().name = None;
        w.meta_mut().generate_name = Some("pool-".into());
        let created = store.create(NS, &w).await.unwrap();
        let name = created.meta().name.clone().unwrap();
        assert!(name.starts_with("pool-") && name.len() == "pool-".len() + 5, "{name}");
        names.insert(name);
    }
    assert_eq!(names.len(), 20);
    let mut nameless = widget("");
    nameless.meta_mut().name = None;
    assert!(matches!(store.create(NS, &nameless).await, Err(StoreError::Invalid(_))));
}

#[tokio::test]
async fn create_of_a_taken_name_already_exists() {
    let (_dir, store) = open_temp(options());
    store.create(NS, &widget("a")).await.unwrap();
    let err = store.create(NS, &widget("a")).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { ref name, .. } if name == "a"), "{err}");
    // Same name in another namespace or another kind is another object.
    store.create("other", &widget("a")).await.unwrap();
    store.create(NS, &gadget("a")).await.unwrap();
}

#[tokio::test]
async fn create_cannot_set_status_or_resource_version() {
    let (_dir, store) = open_temp(options());
    let mut w = widget("a");
    w.status = Some(WidgetStatus { phase: "Running".into() });
    let created = store.create(NS, &w).await.unwrap();
    assert_eq!(created.status, None);
    let mut again = widget("b");
    again.meta_mut().resource_version = Some("7".into());
    assert!(matches!(store.create(NS, &again).await, Err(StoreError::Invalid(_))));
}

#[tokio::test]
async fn namespace_mismatch_is_invalid() {
    let (_dir, store) = open_temp(options());
    let mut w = widget("a");
    w.meta_mut().namespace = Some("elsewhere".into());
    let err = store.create(NS, &w).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("elsewhere")), "{err}");
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut moved = created.clone();
    moved.meta_mut().namespace = Some("elsewhere".into());
    assert!(matches!(store.update(NS, &moved).await, Err(StoreError::Invalid(_))));
    assert!(matches!(store.update_status(NS, &moved).await, Err(StoreError::Invalid(_))));
    assert!(matches!(store.create("Bad_NS", &widget("b")).await, Err(StoreError::Invalid(_))));
    assert!(matches!(store.create(NS, &widget("Bad_Name")).await, Err(StoreError::Invalid(_))));
}

#[tokio::test]
async fn missing_objects_are_not_found() {
    let (_dir, store) = open_temp(options());
    let err = store.get::<Widget>(NS, "nope").await.unwrap_err();
    assert!(err.is_not_found() && err.http_status() == 404, "{err}");
    assert!(store.update(NS, &widget("nope")).await.unwrap_err().is_not_found());
    assert!(store.update_status(NS, &widget("nope")).await.unwrap_err().is_not_found());
    let del = store.delete::<Widget>(NS, "nope", &Preconditions::default()).await;
    assert!(del.unwrap_err().is_not_found());
    // Kinds are apart: a Widget named "g" is not a Gadget.
    store.create(NS, &widget("g")).await.unwrap();
    assert!(store.get::<Gadget>(NS, "g").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn list_filters_by_namespace_and_selector_in_name_order() {
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
async fn update_with_stale_resource_version_conflicts() {
    let (_dir, store) = open_temp(options());
    let v1 = store.create(NS, &widget("a")).await.unwrap();
    let mut v2 = v1.clone();
    v2.spec.size = 2;
    let v2 = store.update(NS, &v2).await.unwrap();
    let mut stale = v1.clone();
    stale.spec.size = 3;
    let err = store.update(NS, &stale).await.unwrap_err();
    assert!(err.is_conflict() && err.is_retryable() && err.http_status() == 409, "{err}");
    let mut stale_status = v1.clone();
    stale_status.status = Some(WidgetStatus { phase: "x".into() });
    assert!(store.update_status(NS, &stale_status).await.unwrap_err().is_conflict());
    // Nothing changed.
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), v2);
    // Without a resourceVersion the update is unconditional.
    let mut blind = v1.clone();
    blind.meta_mut().resource_version = None;
    blind.spec.size = 4;
    assert_eq!(store.update(NS, &blind).await.unwrap().spec.size, 4);
    // A wrong uid is a conflict too.
    let mut other_uid = store.get::<Widget>(NS, "a").await.unwrap();
    other_uid.meta_mut().uid = Some("someone-else".into());
    assert!(store.update(NS, &other_uid).await.unwrap_err().is_conflict());
}

#[tokio::test]
async fn update_cannot_change_status() {
    let (_dir, store) = open_temp(options());
    let mut w = store.create(NS, &widget("a")).await.unwrap();
    w.status = Some(WidgetStatus { phase: "Running".into() });
    let w = store.update_status(NS, &w).await.unwrap();
    let mut changed = w.clone();
    changed.status = Some(WidgetStatus { phase: "Hacked".into() });
    changed.spec.size = 5;
    let updated = store.update(NS, &changed).await.unwrap();
    assert_eq!(updated.spec.size, 5);
    assert_eq!(updated.status, Some(WidgetStatus { phase: "Running".into() }));
    let mut cleared = updated.clone();
    cleared.status = None;
    cleared.spec.size = 6;
    assert_eq!(store.update(NS, &cleared).await.unwrap().status, updated.status);
}

#[tokio::test]
async fn status_update_cannot_change_spec() {
    let (_dir, store) = open_temp(options());
    let created = store.create(NS, &widget("a").labeled("k", "v")).await.unwrap();
    let mut w = created.clone();
    w.spec.size = 99;
    w.meta_mut().labels = None;
    w.meta_mut().finalizers = Some(vec!["sneaky".into()]);
    w.status = Some(WidgetStatus { phase: "Ready".into() });
    let updated = store.update_status(NS, &w).await.unwrap();
    assert_eq!(updated.status, w.status);
    assert_eq!(updated.spec, created.spec);
    assert_eq!(updated.meta().labels, created.meta().labels);
    assert_eq!(updated.meta().finalizers, None);
    assert_eq!(updated.meta().generation, Some(1));
    assert!(updated.rv() > created.rv());
}

#[tokio::test]
async fn generation_bumps_on_spec_change_only() {
    let (_dir, store) = open_temp(options());
    let v1 = store.create(NS, &widget("a")).await.unwrap();
    assert_eq!(v1.meta().generation, Some(1));
    let labeled = store.update(NS, &v1.clone().labeled("k", "v")).await.unwrap();
    assert_eq!(labeled.meta().generation, Some(1), "a label is not spec");
    let mut with_status = labeled.clone();
    with_status.status = Some(WidgetStatus { phase: "Ready".into() });
    let with_status = store.update_status(NS, &with_status).await.unwrap();
    assert_eq!(with_status.meta().generation, Some(1), "status is not spec");
    let mut resized = with_status.clone();
    resized.spec.size = 10;
    let resized = store.update(NS, &resized).await.unwrap();
    assert_eq!(resized.meta().generation, Some(2));
    let mut recolored = resized.clone();
    recolored.spec.color = "red".into();
    assert_eq!(store.update(NS, &recolored).await.unwrap().meta().generation, Some(3));
}

#[tokio::test]
async fn update_keeps_server_owned_metadata() {
    let (_dir, store) = open_temp(options());
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut w = created.clone();
    w.meta_mut().creation_timestamp = None;
    w.meta_mut().generation = Some(42);
    w.meta_mut().deletion_timestamp = created.meta().creation_timestamp.clone();
    w.meta_mut().uid = None;
    w.spec.size = 2;
    let updated = store.update(NS, &w).await.unwrap();
    assert_eq!(updated.meta().uid, created.meta().uid);
    assert_eq!(updated.meta().creation_timestamp, created.meta().creation_timestamp);
    assert_eq!(updated.meta().generation, Some(2));
    assert_eq!(updated.meta().deletion_timestamp, None);
}

#[tokio::test]
async fn update_that_changes_nothing_is_not_a_write() {
    let (_dir, store) = open_temp(options());
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "1").await.unwrap();
    assert_eq!(store.update(NS, &created).await.unwrap(), created);
    assert_eq!(store.update_status(NS, &created).await.unwrap(), created);
    assert_eq!(store.resource_version(), "1");
    assert!(ready(&mut watch).is_empty());
}

#[tokio::test]
async fn delete_without_finalizers_removes_the_object() {
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
async fn delete_preconditions_must_match() {
    let (_dir, store) = open_temp(options());
    let created = store.create(NS, &widget("a")).await.unwrap();
    let wrong_uid = Preconditions { uid: Some("x".into()), resource_version: None };
    assert!(store.delete::<Widget>(NS, "a", &wrong_uid).await.unwrap_err().is_conflict());
    let stale = Preconditions { uid: None, resource_version: Some("0".into()) };
    assert!(store.delete::<Widget>(NS, "a", &stale).await.unwrap_err().is_conflict());
    let right = Preconditions {
        uid: created.meta().uid.clone(),
        resource_version: created.meta().resource_version.clone(),
    };
    assert!(matches!(store.delete::<Widget>(NS, "a", &right).await.unwrap(), Deleted::Gone(_)));
}

#[tokio::test]
async fn delete_with_finalizers_waits_for_them() {
    let (_dir, store) = open_temp(options());
    let created =
        store.create(NS, &widget("a").finalizer("x/one").finalizer("x/two")).await.unwrap();
    let mut watch = store
        .watch::<Widget>(None, &Selector::everything(), &created.rv().to_string())
        .await
        .unwrap();

    let Deleted::Finalizing(deleting) =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap()
    else {
        panic!("expected Finalizing")
    };
    assert!(deleting.meta().deletion_timestamp.is_some());
    assert_eq!(deleting.meta().deletion_grace_period_seconds, Some(0));
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), deleting);

    // A second delete is a no-op.
    let Deleted::Finalizing(again) =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap()
    else {
        panic!("expected Finalizing")
    };
    assert_eq!(again, deleting);

    // Status can still be written while finalizing.
    let mut with_status = deleting.clone();
    with_status.status = Some(WidgetStatus { phase: "Terminating".into() });
    let with_status = store.update_status(NS, &with_status).await.unwrap();

    // Removing one finalizer keeps the object; removing the last one removes it.
    let mut one_left = with_status.clone();
    one_left.meta_mut().finalizers = Some(vec!["x/two".into()]);
    let one_left = store.update(NS, &one_left).await.unwrap();
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), one_left);
    let mut none_left = one_left.clone();
    none_left.meta_mut().finalizers = None;
    let last = store.update(NS, &none_left).await.unwrap();
    assert_eq!(last.meta().finalizers, None);
    assert!(store.get::<Widget>(NS, "a").await.unwrap_err().is_not_found());

    let events: Vec<_> = ready(&mut watch).iter().map(summary).map(|(t, _, rv)| (t, rv)).collect();
    assert_eq!(
        events,
        [
            ("Modified", deleting.rv()),
            ("Modified", with_status.rv()),
            ("Modified", one_left.rv()),
            ("Deleted", last.rv())
        ]
    );
}

#[tokio::test]
async fn adding_finalizers_to_a_deleting_object_is_invalid() {
    let (_dir, store) = open_temp(options());
    store.create(NS, &widget("a").finalizer("x/one")).await.unwrap();
    let deleting =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap().object().clone();
    let more = deleting.clone().finalizer("x/new");
    let err = store.update(NS, &more).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("x/new")), "{err}");
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), deleting);
}

#[tokio::test]
async fn deleting_owner_cascades_to_dependents() {
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
async fn watch_delivers_changes_in_order() {
    let (_dir, store) = open_temp(options());
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let a = store.create(NS, &widget("a")).await.unwrap();
    let b = store.create("other", &widget("b")).await.unwrap();
    store.create(NS, &gadget("not-a-widget")).await.unwrap();
    let mut a2 = a.clone();
    a2.spec.size = 3;
    let a2 = store.update(NS, &a2).await.unwrap();
    store.delete::<Widget>("other", "b", &Preconditions::default()).await.unwrap();

    assert_eq!(next(&mut watch).await, WatchEvent::Added(Arc::new(a.clone())));
    assert_eq!(next(&mut watch).await, WatchEvent::Added(Arc::new(b.clone())));
    assert_eq!(next(&mut watch).await, WatchEvent::Modified(Arc::new(a2.clone())));
    let WatchEvent::Deleted(gone) = next(&mut watch).await else { panic!("expected Deleted") };
    assert_eq!((gone.meta().name.as_deref(), gone.rv()), (Some("b"), 5));

    // A watch from an earlier version replays from there; a namespaced one sees its namespace.
    let mut replay = store.watch::<Widget>(Some(NS), &Selector::everything(), "1").await.unwrap();
    assert_eq!(next(&mut replay).await, WatchEvent::Modified(Arc::new(a2)));
    assert!(ready(&mut replay).is_empty());
}

#[tokio::test]
async fn watch_from_empty_version_starts_now() {
    let (_dir, store) = open_temp(options());
    store.create(NS, &widget("old")).await.unwrap();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    assert!(ready(&mut watch).is_empty());
    store.create(NS, &widget("new")).await.unwrap();
    let names: Vec<_> = ready(&mut watch).iter().map(summary).map(|s| s.1).collect();
    assert_eq!(names, ["new"]);
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
async fn selector_watch_sees_objects_leave_and_enter() {
    let (_dir, store) = open_temp(options());
    let red: Selector = "color=red".parse().unwrap();
    let mut watch = store.watch::<Widget>(Some(NS), &red, "").await.unwrap();
    let blue = store.create(NS, &widget("a").labeled("color", "blue")).await.unwrap();
    let now_red = store.update(NS, &blue.clone().labeled("color", "red")).await.unwrap();
    let mut resized = now_red.clone();
    resized.spec.size = 7;
    let resized = store.update(NS, &resized).await.unwrap();
    let green = store.update(NS, &resized.clone().labeled("color", "green")).await.unwrap();
    store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap();

    let events = ready(&mut watch);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0], WatchEvent::Added(Arc::new(now_red)));
    assert_eq!(events[1], WatchEvent::Modified(Arc::new(resized.clone())));
    // Leaving the selector is a deletion for this watcher: the last state it could see, with
    // the resourceVersion of the change.
    let WatchEvent::Deleted(left) = &events[2] else { panic!("expected Deleted") };
    assert_eq!(left.rv(), green.rv());
    assert_eq!(left.meta().labels, resized.meta().labels);
    assert_eq!(left.spec, resized.spec);
}

#[tokio::test]
async fn a_raw_watch_sees_what_a_typed_one_sees_as_json() {
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
