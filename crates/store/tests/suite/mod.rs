//! The `Store` trait's behaviour, written once and run against every backend, so the embedded
//! store and the Kubernetes backend cannot drift apart on a rule a controller relies on.
//!
//! Each test is a generic function over a [`Backend`] (a fresh, empty store plus what the test
//! needs to know about it); [`store_suite!`] turns them into `#[tokio::test]`s in a test file:
//! `embedded_store.rs` runs them on the embedded store, `kube_apiserver.rs` on `KubeStore`
//! against a real `apiextensions-apiserver`.
//!
//! The suite asserts only what the trait promises. ResourceVersions are compared for equality,
//! never as numbers (the embedded store's are a dense counter, the API server's are etcd
//! revisions); watch events arrive asynchronously on the API server, so the helpers wait for
//! them, and "nothing more" means nothing within [`Backend::settle`]; bookmarks may come at any
//! time and are skipped. Where the API server answers differently in a way the trait allows,
//! the test says so next to the assertion.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::Resource;
use oka_store::{
    Deleted, ObjectList, Preconditions, RawWatchEvent, Selector, Store, StoreError, WatchEvent,
    WatchStream,
};

use crate::common::{Fixture, Gadget, NS, Widget, WidgetStatus, gadget, widget};

/// A store under test, fresh and empty for each test.
pub trait Backend: Send + Sync + Sized + 'static {
    /// The store.
    type Store: Store;

    /// The store under test.
    fn store(&self) -> &Self::Store;

    /// How long a watch must stay silent before the test concludes it has nothing more to
    /// deliver. Zero means events are ready when the write returns (the embedded store
    /// publishes before it answers).
    fn settle(&self) -> Duration;

    /// Whether removing an object deletes its dependents (owner cascade). The embedded store
    /// does it within the delete; on Kubernetes the garbage collector of
    /// kube-controller-manager does it, in the background.
    fn cascades(&self) -> bool;

    /// Makes the store forget its watch history up to now, so an old resourceVersion is too
    /// old to watch from.
    fn expire_history(&self) -> impl Future<Output = ()> + Send;

    /// A store over the same data whose backend ends every watch request after a short
    /// session (as the API server does after `timeoutSeconds`), and that session's length.
    /// A backend that never ends watches returns its store and zero.
    fn short_watch_sessions(&self) -> impl Future<Output = (Self::Store, Duration)> + Send;
}

/// Defines one `#[tokio::test]` per suite test, each starting a backend with `$start`
/// (an expression of type `impl Future<Output = Option<B>>`; `None` skips the test).
macro_rules! store_suite {
    ($start:expr) => {
        store_suite!(@tests $start;
            create_sets_server_owned_fields,
            create_with_generate_name_picks_a_fresh_name,
            create_of_a_taken_name_already_exists,
            create_cannot_set_status_or_resource_version,
            namespace_mismatch_and_bad_names_are_invalid,
            missing_objects_are_not_found,
            list_filters_by_namespace_and_selector_in_name_order,
            update_with_stale_resource_version_conflicts,
            update_without_resource_version_is_last_writer_wins,
            update_cannot_change_status,
            status_update_cannot_change_spec_or_metadata,
            generation_bumps_on_spec_change_only,
            update_keeps_server_owned_metadata,
            update_that_changes_nothing_is_not_a_write,
            delete_without_finalizers_removes_the_object,
            delete_preconditions_must_match,
            delete_with_finalizers_waits_for_them,
            adding_finalizers_to_a_deleting_object_is_invalid,
            deleting_owner_cascades_to_dependents,
            watch_delivers_changes_in_order,
            watch_from_empty_version_starts_now,
            watch_from_an_expired_version_is_gone_and_a_relist_recovers,
            selector_watch_sees_objects_leave_and_enter,
            raw_watch_sees_what_a_typed_one_sees_as_json,
            concurrent_creates_of_one_name_have_one_winner,
            watch_sees_every_concurrent_write_once,
            watch_outlives_the_backends_watch_sessions,
        );
    };
    (@tests $start:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some(backend) = $start.await else { return };
                suite::$name(&backend).await;
            }
        )*
    };
}

// === helpers ===

/// How long to wait for an expected event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The next event that is not a bookmark, waiting at most [`EVENT_TIMEOUT`].
pub async fn next<K: Clone + Send + 'static>(stream: &mut WatchStream<K>) -> WatchEvent<K> {
    loop {
        let event = tokio::time::timeout(EVENT_TIMEOUT, stream.next())
            .await
            .expect("no watch event within the timeout")
            .expect("the watch stream ended")
            .expect("the watch stream failed");
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

/// The next `n` events that are not bookmarks.
pub async fn take<K: Clone + Send + 'static>(
    stream: &mut WatchStream<K>,
    n: usize,
) -> Vec<WatchEvent<K>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next(stream).await);
    }
    out
}

/// Asserts that `stream` delivers nothing but bookmarks within `settle`.
pub async fn assert_quiet<K: Clone + Send + std::fmt::Debug + 'static>(
    stream: &mut WatchStream<K>,
    settle: Duration,
) {
    let deadline = tokio::time::Instant::now() + settle;
    loop {
        let item = if settle.is_zero() {
            match stream.next().now_or_never() {
                Some(item) => item,
                None => return,
            }
        } else {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(item) => item,
                Err(_) => return,
            }
        };
        match item {
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            other => panic!("expected no more events, got {other:?}"),
        }
    }
}

/// An event as `(type, name)`.
fn kind_and_name<K: Resource>(event: &WatchEvent<K>) -> (&'static str, String) {
    let (ty, obj) = match event {
        WatchEvent::Added(o) => ("Added", o),
        WatchEvent::Modified(o) => ("Modified", o),
        WatchEvent::Deleted(o) => ("Deleted", o),
        WatchEvent::Bookmark(_) => return ("Bookmark", String::new()),
    };
    (ty, obj.meta().name.clone().unwrap_or_default())
}

/// The object of an event that is not a bookmark.
fn object<K>(event: &WatchEvent<K>) -> &Arc<K> {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
        WatchEvent::Bookmark(rv) => panic!("expected an object, got a bookmark at {rv}"),
    }
}

fn rv<K: Resource>(obj: &K) -> String {
    obj.meta().resource_version.clone().unwrap_or_default()
}

fn names<K: Resource>(list: &ObjectList<K>) -> Vec<String> {
    list.items
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o.meta().namespace.as_deref().unwrap_or_default(),
                o.meta().name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

fn sel(s: &str) -> Selector {
    s.parse().unwrap()
}

/// The error a watch from `resource_version` fails with: either `watch` itself fails or the
/// stream's first item is the error (the API server's watch cache answers an expired version
/// with an `ERROR` line; the trait allows both, and callers handle both).
async fn watch_error<S: Store>(store: &S, resource_version: &str) -> StoreError {
    let mut stream =
        match store.watch::<Widget>(None, &Selector::everything(), resource_version).await {
            Err(e) => return e,
            Ok(stream) => stream,
        };
    loop {
        match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
            Ok(Some(Err(e))) => {
                let rest = stream.next().now_or_never();
                assert!(matches!(rest, Some(None)), "the stream ends after an error: {rest:?}");
                return e;
            }
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            other => panic!("expected the watch to fail, got {other:?}"),
        }
    }
}

// === create, get, list ===

pub async fn create_sets_server_owned_fields<B: Backend>(b: &B) {
    let store = b.store();
    let mut w = widget("a");
    w.meta_mut().uid = Some("chosen-by-client".into());
    w.meta_mut().generation = Some(7);
    let created = store.create(NS, &w).await.unwrap();
    let meta = created.meta();
    assert_eq!(meta.namespace.as_deref(), Some(NS));
    assert_eq!(meta.generation, Some(1));
    assert!(!rv(&created).is_empty());
    let uid = meta.uid.as_deref().unwrap();
    assert!(!uid.is_empty() && uid != "chosen-by-client", "{uid}");
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(created.spec, w.spec);
    let read: Widget = store.get(NS, "a").await.unwrap();
    assert_eq!(read, created);
    // apiVersion and kind are stored with the object.
    let json = serde_json::to_value(&read).unwrap();
    assert_eq!(json["apiVersion"], "test.oka.dev/v1");
    assert_eq!(json["kind"], "Widget");
}

pub async fn create_with_generate_name_picks_a_fresh_name<B: Backend>(b: &B) {
    let store = b.store();
    let mut names = BTreeSet::new();
    for _ in 0..10 {
        let mut w = widget("");
        w.meta_mut().name = None;
        w.meta_mut().generate_name = Some("pool-".into());
        let created = store.create(NS, &w).await.unwrap();
        let name = created.meta().name.clone().unwrap();
        assert!(name.starts_with("pool-") && name.len() == "pool-".len() + 5, "{name}");
        names.insert(name);
    }
    assert_eq!(names.len(), 10);
    let mut nameless = widget("");
    nameless.meta_mut().name = None;
    let err = store.create(NS, &nameless).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

pub async fn create_of_a_taken_name_already_exists<B: Backend>(b: &B) {
    let store = b.store();
    store.create(NS, &widget("a")).await.unwrap();
    let err = store.create(NS, &widget("a")).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { ref name, .. } if name == "a"), "{err}");
    assert_eq!(err.http_status(), 409);
    assert!(!err.is_retryable());
    // Same name in another namespace or another kind is another object.
    store.create("other", &widget("a")).await.unwrap();
    store.create(NS, &gadget("a")).await.unwrap();
}

pub async fn create_cannot_set_status_or_resource_version<B: Backend>(b: &B) {
    let store = b.store();
    let mut w = widget("a");
    w.status = Some(WidgetStatus { phase: "Running".into() });
    let created = store.create(NS, &w).await.unwrap();
    assert_eq!(created.status, None);
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap().status, None);
    let mut again = widget("b");
    again.meta_mut().resource_version = Some("7".into());
    let err = store.create(NS, &again).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

pub async fn namespace_mismatch_and_bad_names_are_invalid<B: Backend>(b: &B) {
    let store = b.store();
    let mut w = widget("a");
    w.meta_mut().namespace = Some("elsewhere".into());
    let err = store.create(NS, &w).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("elsewhere")), "{err}");
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut moved = created.clone();
    moved.meta_mut().namespace = Some("elsewhere".into());
    assert!(matches!(store.update(NS, &moved).await, Err(StoreError::Invalid(_))));
    assert!(matches!(store.update_status(NS, &moved).await, Err(StoreError::Invalid(_))));
    let err = store.create("Bad_NS", &widget("b")).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let err = store.create(NS, &widget("Bad_Name")).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert_eq!(err.http_status(), 422);
}

pub async fn missing_objects_are_not_found<B: Backend>(b: &B) {
    let store = b.store();
    let err = store.get::<Widget>(NS, "nope").await.unwrap_err();
    assert!(err.is_not_found() && err.http_status() == 404, "{err}");
    assert!(
        matches!(err, StoreError::NotFound { ref kind, ref namespace, ref name }
            if kind == "Widget" && namespace == NS && name == "nope"),
        "{err:?}"
    );
    assert!(store.update(NS, &widget("nope")).await.unwrap_err().is_not_found());
    assert!(store.update_status(NS, &widget("nope")).await.unwrap_err().is_not_found());
    let del = store.delete::<Widget>(NS, "nope", &Preconditions::default()).await;
    assert!(del.unwrap_err().is_not_found());
    // Kinds are apart: a Widget named "g" is not a Gadget.
    store.create(NS, &widget("g")).await.unwrap();
    assert!(store.get::<Gadget>(NS, "g").await.unwrap_err().is_not_found());
}

pub async fn list_filters_by_namespace_and_selector_in_name_order<B: Backend>(b: &B) {
    let store = b.store();
    for (ns, name, color) in [
        ("b", "z", "red"),
        ("a", "y", "blue"),
        ("a", "x", "red"),
        ("b", "w", "blue"),
        ("a", "v", "red"),
    ] {
        store.create(ns, &widget(name).labeled("color", color)).await.unwrap();
    }
    store.create("a", &widget("t").labeled("size", "big")).await.unwrap();
    store.create("a", &gadget("u").labeled("color", "red")).await.unwrap();
    let all = store.list::<Widget>(None, &Selector::everything()).await.unwrap();
    assert_eq!(names(&all), ["a/t", "a/v", "a/x", "a/y", "b/w", "b/z"]);
    assert!(!all.resource_version.is_empty());
    let red_in_a = store.list::<Widget>(Some("a"), &sel("color=red")).await.unwrap();
    assert_eq!(names(&red_in_a), ["a/v", "a/x"]);
    // `!=` matches objects without the label too, as in Kubernetes.
    let not_red = store.list::<Widget>(None, &sel("color!=red")).await.unwrap();
    assert_eq!(names(&not_red), ["a/t", "a/y", "b/w"]);
    let set = store.list::<Widget>(None, &sel("color in (blue),size notin (big)")).await.unwrap();
    assert_eq!(names(&set), ["a/y", "b/w"]);
    let has = store.list::<Widget>(None, &sel("color")).await.unwrap();
    assert_eq!(has.items.len(), 5);
    let lacks = store.list::<Widget>(None, &sel("!color")).await.unwrap();
    assert_eq!(names(&lacks), ["a/t"]);
    let none = store.list::<Widget>(Some("c"), &Selector::everything()).await.unwrap();
    assert!(none.items.is_empty());
    // The list's version is a point to watch from: a watch from it sees the next change only.
    let mut watch =
        store.watch::<Widget>(None, &Selector::everything(), &all.resource_version).await.unwrap();
    store.create("c", &widget("s")).await.unwrap();
    assert_eq!(kind_and_name(&next(&mut watch).await), ("Added", "s".into()));
    assert_quiet(&mut watch, b.settle()).await;
}

// === update, update_status ===

pub async fn update_with_stale_resource_version_conflicts<B: Backend>(b: &B) {
    let store = b.store();
    let v1 = store.create(NS, &widget("a")).await.unwrap();
    let mut v2 = v1.clone();
    v2.spec.size = 2;
    let v2 = store.update(NS, &v2).await.unwrap();
    assert_ne!(rv(&v2), rv(&v1));
    let mut stale = v1.clone();
    stale.spec.size = 3;
    let err = store.update(NS, &stale).await.unwrap_err();
    assert!(err.is_conflict() && err.is_retryable() && err.http_status() == 409, "{err}");
    let mut stale_status = v1.clone();
    stale_status.status = Some(WidgetStatus { phase: "x".into() });
    assert!(store.update_status(NS, &stale_status).await.unwrap_err().is_conflict());
    // Nothing changed.
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), v2);
    // A wrong uid is a conflict too.
    let mut other_uid = v2.clone();
    other_uid.meta_mut().uid = Some("someone-else".into());
    other_uid.spec.size = 5;
    let err = store.update(NS, &other_uid).await.unwrap_err();
    // The API server reports a changed uid as a precondition failure (409) on update.
    assert!(err.is_conflict(), "{err}");
}

pub async fn update_without_resource_version_is_last_writer_wins<B: Backend>(b: &B) {
    let store = b.store();
    let v1 = store.create(NS, &widget("a")).await.unwrap();
    let mut v2 = v1.clone();
    v2.spec.size = 2;
    store.update(NS, &v2).await.unwrap();
    let mut blind = v1.clone();
    blind.meta_mut().resource_version = None;
    blind.spec.size = 4;
    let updated = store.update(NS, &blind).await.unwrap();
    assert_eq!(updated.spec.size, 4);
    let mut blind_status = v1.clone();
    blind_status.meta_mut().resource_version = None;
    blind_status.status = Some(WidgetStatus { phase: "Blind".into() });
    let updated = store.update_status(NS, &blind_status).await.unwrap();
    assert_eq!(updated.status, blind_status.status);
    assert_eq!(updated.spec.size, 4, "update_status keeps the spec");
}

pub async fn update_cannot_change_status<B: Backend>(b: &B) {
    let store = b.store();
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

pub async fn status_update_cannot_change_spec_or_metadata<B: Backend>(b: &B) {
    let store = b.store();
    let created = store.create(NS, &widget("a").labeled("k", "v")).await.unwrap();
    let mut w = created.clone();
    w.spec.size = 99;
    w.meta_mut().finalizers = Some(vec!["x/sneaky".into()]);
    w.status = Some(WidgetStatus { phase: "Ready".into() });
    let updated = store.update_status(NS, &w).await.unwrap();
    assert_eq!(updated.status, w.status);
    assert_eq!(updated.spec, created.spec);
    assert_eq!(updated.meta().labels, created.meta().labels);
    assert_eq!(updated.meta().finalizers, None);
    assert_eq!(updated.meta().generation, Some(1));
    assert_ne!(rv(&updated), rv(&created));
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), updated);
}

pub async fn generation_bumps_on_spec_change_only<B: Backend>(b: &B) {
    let store = b.store();
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

pub async fn update_keeps_server_owned_metadata<B: Backend>(b: &B) {
    let store = b.store();
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut w = created.clone();
    w.meta_mut().creation_timestamp = None;
    w.meta_mut().generation = Some(42);
    w.meta_mut().deletion_timestamp = created.meta().creation_timestamp.clone();
    w.meta_mut().deletion_grace_period_seconds = Some(30);
    w.meta_mut().uid = None;
    w.spec.size = 2;
    let updated = store.update(NS, &w).await.unwrap();
    assert_eq!(updated.meta().uid, created.meta().uid);
    assert_eq!(updated.meta().creation_timestamp, created.meta().creation_timestamp);
    assert_eq!(updated.meta().generation, Some(2));
    assert_eq!(updated.meta().deletion_timestamp, None, "only a delete starts a deletion");
    assert_eq!(updated.meta().deletion_grace_period_seconds, None);
}

pub async fn update_that_changes_nothing_is_not_a_write<B: Backend>(b: &B) {
    let store = b.store();
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut watch =
        store.watch::<Widget>(None, &Selector::everything(), &rv(&created)).await.unwrap();
    assert_eq!(store.update(NS, &created).await.unwrap(), created);
    assert_eq!(store.update_status(NS, &created).await.unwrap(), created);
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), created);
    assert_quiet(&mut watch, b.settle()).await;
}

// === delete ===

pub async fn delete_without_finalizers_removes_the_object<B: Backend>(b: &B) {
    let store = b.store();
    let created = store.create(NS, &widget("a")).await.unwrap();
    let mut watch =
        store.watch::<Widget>(None, &Selector::everything(), &rv(&created)).await.unwrap();
    let Deleted::Gone(last) =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap()
    else {
        panic!("expected Gone")
    };
    assert_eq!(last.meta().uid, created.meta().uid);
    assert_eq!(last.spec, created.spec);
    assert!(store.get::<Widget>(NS, "a").await.unwrap_err().is_not_found());
    let WatchEvent::Deleted(seen) = next(&mut watch).await else { panic!("expected Deleted") };
    assert_eq!(seen.meta().uid, created.meta().uid);
    // The removal is a change of its own: the Deleted event's version follows the object's
    // last one. (The embedded store's `Gone` carries that version too; the API server answers
    // a delete with a Status, so `KubeStore` returns the state it read just before.)
    assert_ne!(rv(seen.as_ref()), rv(&created));
    // The name is free again, for a new object with a new uid.
    let again = store.create(NS, &widget("a")).await.unwrap();
    assert_ne!(again.meta().uid, created.meta().uid);
}

pub async fn delete_preconditions_must_match<B: Backend>(b: &B) {
    let store = b.store();
    let created = store.create(NS, &widget("a")).await.unwrap();
    let wrong_uid = Preconditions { uid: Some("x".into()), resource_version: None };
    assert!(store.delete::<Widget>(NS, "a", &wrong_uid).await.unwrap_err().is_conflict());
    let mut v2 = created.clone();
    v2.spec.size = 2;
    store.update(NS, &v2).await.unwrap();
    let stale =
        Preconditions { uid: None, resource_version: created.meta().resource_version.clone() };
    assert!(store.delete::<Widget>(NS, "a", &stale).await.unwrap_err().is_conflict());
    let current = store.get::<Widget>(NS, "a").await.unwrap();
    let right = Preconditions {
        uid: current.meta().uid.clone(),
        resource_version: current.meta().resource_version.clone(),
    };
    assert!(matches!(store.delete::<Widget>(NS, "a", &right).await.unwrap(), Deleted::Gone(_)));
}

pub async fn delete_with_finalizers_waits_for_them<B: Backend>(b: &B) {
    let store = b.store();
    let created =
        store.create(NS, &widget("a").finalizer("x/one").finalizer("x/two")).await.unwrap();
    let mut watch =
        store.watch::<Widget>(None, &Selector::everything(), &rv(&created)).await.unwrap();

    let Deleted::Finalizing(deleting) =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap()
    else {
        panic!("expected Finalizing")
    };
    assert!(deleting.meta().deletion_timestamp.is_some());
    assert_eq!(deleting.meta().deletion_grace_period_seconds, Some(0));
    // Starting the deletion bumps generation on both backends (as the API server does).
    assert_eq!(deleting.meta().generation, Some(2));
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), deleting);

    // A second delete changes nothing.
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

    let events: Vec<_> = take(&mut watch, 4).await;
    let summary: Vec<_> =
        events.iter().map(|e| (kind_and_name(e).0, rv(object(e).as_ref()))).collect();
    assert_eq!(
        summary[..3],
        [("Modified", rv(&deleting)), ("Modified", rv(&with_status)), ("Modified", rv(&one_left)),]
    );
    // The last event is the removal of the same object. The embedded store shows the state the
    // last update left (no finalizers); the API server shows the state it removed, which still
    // has the last finalizer (the update never stored a version without it).
    let WatchEvent::Deleted(removed) = &events[3] else { panic!("expected Deleted") };
    assert_eq!(removed.meta().uid, created.meta().uid);
    assert_eq!(removed.status, with_status.status);
    let finalizers = removed.meta().finalizers.clone().unwrap_or_default();
    assert!(finalizers.is_empty() || finalizers == ["x/two"], "{finalizers:?}");
    assert_quiet(&mut watch, b.settle()).await;
}

pub async fn adding_finalizers_to_a_deleting_object_is_invalid<B: Backend>(b: &B) {
    let store = b.store();
    store.create(NS, &widget("a").finalizer("x/one")).await.unwrap();
    let deleting =
        store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap().object().clone();
    let more = deleting.clone().finalizer("x/new");
    let err = store.update(NS, &more).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("x/new")), "{err}");
    assert_eq!(store.get::<Widget>(NS, "a").await.unwrap(), deleting);
}

pub async fn deleting_owner_cascades_to_dependents<B: Backend>(b: &B) {
    if !b.cascades() {
        eprintln!("skipped: this backend has no garbage collector (owner cascade)");
        return;
    }
    let store = b.store();
    let owner = store.create(NS, &widget("owner")).await.unwrap();
    let other = store.create(NS, &widget("other-owner")).await.unwrap();
    // owner → child (Gadget) → grandchild (Widget): removed in turn.
    let child = store.create(NS, &gadget("child").owned_by(&owner)).await.unwrap();
    store.create(NS, &widget("grandchild").owned_by(&child)).await.unwrap();
    // A dependent with finalizers only starts its deletion.
    store.create(NS, &gadget("guarded").owned_by(&owner).finalizer("x/keep")).await.unwrap();
    // A dependent with another live owner only loses the reference.
    store.create(NS, &widget("shared").owned_by(&owner).owned_by(&other)).await.unwrap();
    let unrelated = store.create(NS, &widget("unrelated")).await.unwrap();

    let deleted = store.delete::<Widget>(NS, "owner", &Preconditions::default()).await.unwrap();
    assert!(matches!(deleted, Deleted::Gone(_)));

    // On Kubernetes the cascade runs in the background: wait for it.
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        let child_gone = store.get::<Gadget>(NS, "child").await.is_err_and(|e| e.is_not_found());
        let grandchild_gone =
            store.get::<Widget>(NS, "grandchild").await.is_err_and(|e| e.is_not_found());
        if child_gone && grandchild_gone {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "dependents not removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let guarded: Gadget = store.get(NS, "guarded").await.unwrap();
    assert!(guarded.meta().deletion_timestamp.is_some());
    let shared: Widget = store.get(NS, "shared").await.unwrap();
    let owners: Vec<_> =
        shared.meta().owner_references.iter().flatten().map(|r| r.uid.clone()).collect();
    assert_eq!(owners, [other.meta().uid.clone().unwrap()]);
    assert_eq!(store.get::<Widget>(NS, "unrelated").await.unwrap(), unrelated);
}

// === watch ===

pub async fn watch_delivers_changes_in_order<B: Backend>(b: &B) {
    let store = b.store();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let a = store.create(NS, &widget("a")).await.unwrap();
    let b_ = store.create("other", &widget("b")).await.unwrap();
    store.create(NS, &gadget("not-a-widget")).await.unwrap();
    let mut a2 = a.clone();
    a2.spec.size = 3;
    let a2 = store.update(NS, &a2).await.unwrap();
    store.delete::<Widget>("other", "b", &Preconditions::default()).await.unwrap();

    assert_eq!(next(&mut watch).await, WatchEvent::Added(Arc::new(a.clone())));
    assert_eq!(next(&mut watch).await, WatchEvent::Added(Arc::new(b_.clone())));
    assert_eq!(next(&mut watch).await, WatchEvent::Modified(Arc::new(a2.clone())));
    let WatchEvent::Deleted(gone) = next(&mut watch).await else { panic!("expected Deleted") };
    assert_eq!(gone.meta().uid, b_.meta().uid);
    assert_quiet(&mut watch, b.settle()).await;

    // A watch from an earlier version replays from there; a namespaced one sees its namespace.
    let mut replay =
        store.watch::<Widget>(Some(NS), &Selector::everything(), &rv(&a)).await.unwrap();
    assert_eq!(next(&mut replay).await, WatchEvent::Modified(Arc::new(a2)));
    assert_quiet(&mut replay, b.settle()).await;
}

pub async fn watch_from_empty_version_starts_now<B: Backend>(b: &B) {
    let store = b.store();
    store.create(NS, &widget("old")).await.unwrap();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    assert_quiet(&mut watch, b.settle()).await;
    store.create(NS, &widget("new")).await.unwrap();
    assert_eq!(kind_and_name(&next(&mut watch).await), ("Added", "new".into()));
    assert_quiet(&mut watch, b.settle()).await;
}

pub async fn watch_from_an_expired_version_is_gone_and_a_relist_recovers<B: Backend>(b: &B) {
    let store = b.store();
    store.create(NS, &widget("first")).await.unwrap();
    b.expire_history().await;
    // "1" is the embedded store's first version (`first`'s), and older than anything the API
    // server's watch cache holds (it starts at the revision its CRD was first served at).
    let err = watch_error(store, "1").await;
    assert!(matches!(err, StoreError::Gone { ref requested, .. } if requested == "1"), "{err:?}");
    assert_eq!(err.http_status(), 410);
    // What a caller does about it: list again, and watch from the list.
    let list = store.list::<Widget>(None, &Selector::everything()).await.unwrap();
    assert!(names(&list).contains(&format!("{NS}/first")));
    let mut watch =
        store.watch::<Widget>(None, &Selector::everything(), &list.resource_version).await.unwrap();
    store.create(NS, &widget("after")).await.unwrap();
    assert_eq!(kind_and_name(&next(&mut watch).await), ("Added", "after".into()));
}

pub async fn selector_watch_sees_objects_leave_and_enter<B: Backend>(b: &B) {
    let store = b.store();
    let mut watch = store.watch::<Widget>(Some(NS), &sel("color=red"), "").await.unwrap();
    let blue = store.create(NS, &widget("a").labeled("color", "blue")).await.unwrap();
    let now_red = store.update(NS, &blue.clone().labeled("color", "red")).await.unwrap();
    let mut resized = now_red.clone();
    resized.spec.size = 7;
    let resized = store.update(NS, &resized).await.unwrap();
    let green = store.update(NS, &resized.clone().labeled("color", "green")).await.unwrap();
    store.delete::<Widget>(NS, "a", &Preconditions::default()).await.unwrap();

    let events = take(&mut watch, 3).await;
    assert_eq!(events[0], WatchEvent::Added(Arc::new(now_red)));
    assert_eq!(events[1], WatchEvent::Modified(Arc::new(resized.clone())));
    // Leaving the selector is a deletion for this watcher, at the version of the change.
    let WatchEvent::Deleted(left) = &events[2] else { panic!("expected Deleted") };
    assert_eq!(rv(left.as_ref()), rv(&green));
    assert_eq!(left.spec, resized.spec);
    // The embedded store reports the last state the watcher could see (still red); the API
    // server reports the new state (green). The trait promises the removal and its version.
    let color = left.meta().labels.as_ref().and_then(|l| l.get("color")).cloned();
    assert!(matches!(color.as_deref(), Some("red" | "green")), "{color:?}");
    assert_quiet(&mut watch, b.settle()).await;
}

pub async fn raw_watch_sees_what_a_typed_one_sees_as_json<B: Backend>(b: &B) {
    let store = b.store();
    let red = sel("color=red");
    let mut typed = store.watch::<Widget>(Some(NS), &red, "").await.unwrap();
    let mut raw = store.watch_raw::<Widget>(Some(NS), &red, "").await.unwrap();
    let a = store.create(NS, &widget("a").labeled("color", "red")).await.unwrap();
    let mut resized = a.clone();
    resized.spec.size = 3;
    let resized = store.update(NS, &resized).await.unwrap();
    store.update(NS, &resized.clone().labeled("color", "green")).await.unwrap();
    let typed: Vec<_> =
        take(&mut typed, 3).await.into_iter().map(|e| RawWatchEvent::of(e).unwrap()).collect();
    let mut raws = Vec::new();
    while raws.len() < 3 {
        let event = tokio::time::timeout(EVENT_TIMEOUT, raw.next()).await.unwrap().unwrap();
        match event.unwrap() {
            RawWatchEvent::Bookmark(_) => {}
            event => raws.push(event),
        }
    }
    let json = |e: &RawWatchEvent| -> serde_json::Value {
        match e {
            RawWatchEvent::Added(o) | RawWatchEvent::Modified(o) | RawWatchEvent::Deleted(o) => {
                serde_json::from_slice(&o.json).unwrap()
            }
            RawWatchEvent::Bookmark(rv) => serde_json::json!(rv),
        }
    };
    for (raw, typed) in raws.iter().zip(&typed) {
        assert_eq!(std::mem::discriminant(raw), std::mem::discriminant(typed));
        assert_eq!(json(raw), json(typed));
    }
    let RawWatchEvent::Modified(modified) = &raws[1] else { panic!("expected Modified") };
    assert_eq!((modified.name.as_str(), modified.namespace.as_str()), ("a", NS));
    assert_eq!(modified.resource_version, rv(&resized));
}

// === concurrency ===

pub async fn concurrent_creates_of_one_name_have_one_winner<B: Backend>(b: &B) {
    let store = b.store();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut results = Vec::new();
                for i in 0..5 {
                    let own = store.create(NS, &widget(&format!("t{t}-{i}"))).await.map(|w| rv(&w));
                    let shared =
                        store.create(NS, &widget(&format!("shared-{i}"))).await.map(|w| rv(&w));
                    results.push((own, shared));
                }
                results
            })
        })
        .collect();
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
    assert_eq!(shared_wins, 5);
    assert_eq!(rvs.len(), 8 * 5 + 5);
}

pub async fn watch_sees_every_concurrent_write_once<B: Backend>(b: &B) {
    let store = b.store();
    let mut watch = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut written = Vec::new();
                for i in 0..4 {
                    let w = store.create(NS, &widget(&format!("t{t}-{i}"))).await.unwrap();
                    written.push(rv(&w));
                    let mut bigger = w.clone();
                    bigger.spec.size = 2;
                    written.push(rv(&store.update(NS, &bigger).await.unwrap()));
                }
                written
            })
        })
        .collect();
    let mut written = BTreeSet::new();
    for writer in writers {
        written.extend(writer.await.unwrap());
    }
    let events = take(&mut watch, written.len()).await;
    let seen: Vec<_> = events.iter().map(|e| rv(object(e).as_ref())).collect();
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), written, "each write seen");
    assert_eq!(seen.len(), written.len(), "and seen once");
    // Each object's changes arrive in the order they were made.
    let mut added = BTreeSet::new();
    for event in &events {
        let (ty, name) = kind_and_name(event);
        match ty {
            "Added" => assert!(added.insert(name)),
            "Modified" => assert!(added.contains(&name), "{name} modified before added"),
            other => panic!("unexpected {other}"),
        }
    }
    assert_quiet(&mut watch, b.settle()).await;
}

pub async fn watch_outlives_the_backends_watch_sessions<B: Backend>(b: &B) {
    let (store, session) = b.short_watch_sessions().await;
    let mut watch = store.watch::<Widget>(Some(NS), &Selector::everything(), "").await.unwrap();
    let a = store.create(NS, &widget("a")).await.unwrap();
    assert_eq!(next(&mut watch).await, WatchEvent::Added(Arc::new(a.clone())));
    // Stay idle across several of the backend's watch sessions; the stream must neither end
    // nor fail, and must not replay what it delivered.
    tokio::time::sleep(session * 3 + Duration::from_millis(100)).await;
    let mut a2 = a.clone();
    a2.spec.size = 2;
    let a2 = store.update(NS, &a2).await.unwrap();
    assert_eq!(next(&mut watch).await, WatchEvent::Modified(Arc::new(a2)));
    // Changes made while a session is being re-opened are not lost either.
    for i in 0..3 {
        tokio::time::sleep(session).await;
        store.create(NS, &widget(&format!("b{i}"))).await.unwrap();
    }
    let names: Vec<_> = take(&mut watch, 3).await.iter().map(kind_and_name).collect();
    assert_eq!(
        names,
        [("Added", "b0".to_owned()), ("Added", "b1".to_owned()), ("Added", "b2".to_owned())]
    );
    assert_quiet(&mut watch, b.settle()).await;
}
