//! Shared informers ([`Informers`]): one list and one watch per kind and scope however many
//! controllers use them, late handlers that miss nothing, relists and deletions that reach
//! every user, over [`FaultyStore`], which counts lists and watches.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oka_cache::{Action, Change, Config, Controller, Informers, WatchConfig, default_error_policy};
use oka_store::{Preconditions, Selector, Store, StoreError};
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;

use support::{FaultyStore, Part, Widget, part, widget};

const QUIET: Duration = Duration::from_secs(3600);

async fn create(store: &FaultyStore, w: Widget) -> Widget {
    store.create("default", &w).await.expect("create")
}

async fn resize(store: &FaultyStore, name: &str, size: i32) -> Widget {
    let mut w: Widget = store.get("default", name).await.expect("get");
    w.spec.size = size;
    store.update("default", &w).await.expect("update")
}

fn name_of(w: &Widget) -> String {
    w.metadata.name.clone().unwrap_or_default()
}

/// A running controller of widgets named `name` over `informers` that reports each reconciled
/// widget's name to `calls` and each deleted one to `deleted`; stops when the sender is used.
fn run(
    name: &'static str,
    informers: &Informers<FaultyStore>,
    calls: mpsc::UnboundedSender<(&'static str, String)>,
    deleted: Arc<Mutex<Vec<(&'static str, String)>>>,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = Controller::<Widget, _>::shared(name, informers, Config::default())
        .owns_shared(informers.all::<Part>())
        .on_delete(move |w: &Widget| deleted.lock().unwrap().push((name, name_of(w))))
        .shutdown_on(async move {
            let _ = stopped.await;
        });
    let task = tokio::spawn(controller.run(
        move |w: Arc<Widget>, calls: Arc<mpsc::UnboundedSender<(&'static str, String)>>| async move {
            let _ = calls.send((name, name_of(&w)));
            Ok::<_, StoreError>(Action::await_change())
        },
        default_error_policy,
        Arc::new(calls),
    ));
    (stop, task)
}

async fn next(
    calls: &mut mpsc::UnboundedReceiver<(&'static str, String)>,
) -> (&'static str, String) {
    timeout(QUIET, calls.recv()).await.expect("a reconcile").expect("open")
}

#[tokio::test(start_paused = true)]
async fn one_list_and_one_watch_per_kind_and_scope_however_many_controllers() {
    let store = FaultyStore::new();
    let w = create(&store, widget("a", 1)).await;
    store.create("default", &part("p", Some(&w))).await.unwrap();
    let informers = Informers::new(store.clone());
    let deleted = Arc::default();
    let (tx, mut calls) = mpsc::unbounded_channel();
    let controllers: Vec<_> = ["one", "two", "three"]
        .into_iter()
        .map(|name| run(name, &informers, tx.clone(), Arc::clone(&deleted)))
        .collect();
    let mut seen: Vec<_> = Vec::new();
    for _ in 0..3 {
        seen.push(next(&mut calls).await);
    }
    seen.sort();
    assert_eq!(seen, [("one", "a".into()), ("three", "a".into()), ("two", "a".into())]);
    // Widgets and Parts: one list and one watch each, for three controllers.
    assert_eq!(store.lists(), 2);
    assert_eq!(store.watches(), 2);
    assert_eq!(store.open_watches(), 2);
    // Every controller hears of a change through the one watch.
    resize(&store, "a", 2).await;
    let mut woken: Vec<_> = Vec::new();
    for _ in 0..3 {
        woken.push(next(&mut calls).await.0);
    }
    woken.sort_unstable();
    assert_eq!(woken, ["one", "three", "two"]);

    // Another scope (a label selector) is another list+watch, once however often asked for.
    let scope = WatchConfig {
        selector: Selector::from_labels([("tier", "gold")]),
        ..WatchConfig::default()
    };
    let gold = informers.informer::<Widget>(scope.clone());
    let again = informers.informer::<Widget>(scope);
    gold.start();
    again.start();
    informers.wait_synced().await;
    assert_eq!(store.lists(), 3);
    assert_eq!(store.open_watches(), 3);
    assert!(gold.cache().is_empty(), "the selector scopes the cache");

    for (stop, task) in controllers {
        let _ = stop.send(());
        timeout(QUIET, task).await.unwrap().unwrap();
    }
    // The informers outlive the controllers for their other users, until shut down.
    assert_eq!(store.open_watches(), 3);
    informers.shutdown();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(store.open_watches(), 0);
}

/// What a handler saw: the widget, its version, and whether it was new, changed or deleted.
type Seen = Arc<Mutex<Vec<(String, String, &'static str)>>>;

fn recorder(seen: &Seen) -> impl Fn(&Change<Widget>) + Send + Sync + 'static {
    let seen = Arc::clone(seen);
    move |change| {
        let obj = change.latest();
        let what = match change {
            Change::Applied { old: None, .. } => "new",
            Change::Applied { old: Some(_), .. } => "changed",
            Change::Deleted(_) => "deleted",
        };
        let version = obj.metadata.resource_version.clone().unwrap_or_default();
        seen.lock().unwrap().push((name_of(obj), version, what));
    }
}

#[tokio::test(start_paused = true)]
async fn a_late_handler_gets_the_cached_objects_then_live_changes_in_order() {
    let store = FaultyStore::new();
    let a = create(&store, widget("a", 1)).await;
    let b = create(&store, widget("b", 1)).await;
    let informers = Informers::new(store.clone());
    let widgets = informers.all::<Widget>();
    let early: Seen = Arc::default();
    widgets.on_change(recorder(&early));
    widgets.start();
    widgets.wait_synced().await;

    let late: Seen = Arc::default();
    widgets.on_change(recorder(&late));
    let a2 = resize(&store, "a", 2).await;
    let c = create(&store, widget("c", 1)).await;
    store.delete::<Widget>("default", "b", &Preconditions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;

    let rv = |w: &Widget| w.metadata.resource_version.clone().unwrap();
    // The deletion carries the store's version of it: one after the create of c.
    let deleted = (rv(&c).parse::<u64>().unwrap() + 1).to_string();
    let live = [
        ("a".to_owned(), rv(&a2), "changed"),
        ("c".to_owned(), rv(&c), "new"),
        ("b".to_owned(), deleted, "deleted"),
    ];
    let replay = [("a".to_owned(), rv(&a), "new"), ("b".to_owned(), rv(&b), "new")];
    let expected: Vec<_> = replay.iter().chain(&live).cloned().collect();
    assert_eq!(*late.lock().unwrap(), expected);
    assert_eq!(*early.lock().unwrap(), expected, "the first list reads as the replay does");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_added_during_a_stream_of_changes_misses_none_and_sees_them_in_order() {
    let store = FaultyStore::new();
    create(&store, widget("a", 0)).await;
    let informers = Informers::new(store.clone());
    let widgets = informers.all::<Widget>();
    widgets.start();
    widgets.wait_synced().await;
    let writer = tokio::spawn({
        let store = store.clone();
        async move {
            let mut last = None;
            for size in 1..=300 {
                last = Some(resize(&store, "a", size).await);
            }
            last.unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    let seen: Seen = Arc::default();
    widgets.on_change(recorder(&seen));
    let last = writer.await.unwrap();
    let final_version = last.metadata.resource_version.clone().unwrap();
    timeout(Duration::from_secs(10), async {
        while seen.lock().unwrap().last().map(|s| s.1.clone()) != Some(final_version.clone()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the handler sees the last version");
    let versions: Vec<u64> = seen.lock().unwrap().iter().map(|s| s.1.parse().unwrap()).collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "in order, none twice: {versions:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].2, "new", "the replay first");
    assert!(seen[1..].iter().all(|s| s.2 == "changed"));
}

#[tokio::test(start_paused = true)]
async fn a_relist_reaches_every_handler() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    create(&store, widget("b", 1)).await;
    let informers = Informers::new(store.clone());
    let widgets = informers.all::<Widget>();
    let (first, second): (Seen, Seen) = (Arc::default(), Arc::default());
    widgets.on_change(recorder(&first));
    widgets.start();
    widgets.wait_synced().await;
    widgets.on_change(recorder(&second));
    first.lock().unwrap().clear();
    second.lock().unwrap().clear();

    // The store forgets its history: the changes arrive through the relist only.
    store.compact();
    let a2 = resize(&store, "a", 2).await;
    store.delete::<Widget>("default", "b", &Preconditions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(store.lists(), 2);

    let mut expected = vec![
        ("a".to_owned(), a2.metadata.resource_version.clone().unwrap(), "changed"),
        ("b".to_owned(), String::new(), "deleted"),
    ];
    for seen in [&first, &second] {
        let mut got: Vec<_> = seen.lock().unwrap().clone();
        got.sort();
        // The deleted version is the cache's last one; only its name matters here.
        got.iter_mut().filter(|s| s.2 == "deleted").for_each(|s| s.1.clear());
        expected.sort();
        assert_eq!(got, expected);
    }
}

#[tokio::test(start_paused = true)]
async fn each_controller_hears_of_a_deleted_object_once() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    create(&store, widget("b", 1)).await;
    let informers = Informers::new(store.clone());
    let deleted: Arc<Mutex<Vec<(&'static str, String)>>> = Arc::default();
    let (tx, mut calls) = mpsc::unbounded_channel();
    let first = run("first", &informers, tx.clone(), Arc::clone(&deleted));
    for _ in 0..2 {
        next(&mut calls).await;
    }
    // A controller that starts after the cache is filled still sees every object.
    let second = run("second", &informers, tx, Arc::clone(&deleted));
    let mut late: Vec<_> = Vec::new();
    for _ in 0..2 {
        late.push(next(&mut calls).await);
    }
    late.sort();
    assert_eq!(late, [("second", "a".into()), ("second", "b".into())]);

    store.delete::<Widget>("default", "a", &Preconditions::default()).await.unwrap();
    // And a deletion seen only through a relist.
    store.compact();
    store.delete::<Widget>("default", "b", &Preconditions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut got = deleted.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        [
            ("first", "a".into()),
            ("first", "b".into()),
            ("second", "a".into()),
            ("second", "b".into())
        ]
    );
    for (stop, task) in [first, second] {
        let _ = stop.send(());
        timeout(QUIET, task).await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_writers_own_change_reaches_every_other_user_once() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let informers = Informers::new(store.clone());
    let widgets = informers.all::<Widget>();
    widgets.start();
    widgets.wait_synced().await;
    let other: Seen = Arc::default();
    widgets.on_change(recorder(&other));
    other.lock().unwrap().clear();

    // One user records its own write at once (read-your-writes); the others must still hear
    // of it, and the watch's echo must not be reported again.
    let written = resize(&store, "a", 2).await;
    let change = widgets.cache().apply(Arc::new(written.clone()));
    assert!(change.is_some());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let version = written.metadata.resource_version.clone().unwrap();
    assert_eq!(*other.lock().unwrap(), [("a".to_owned(), version, "changed")]);
}

#[tokio::test(start_paused = true)]
async fn a_handler_may_remove_itself_while_it_is_called() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let informers = Informers::new(store.clone());
    let widgets = informers.all::<Widget>();
    widgets.start();
    widgets.wait_synced().await;
    // A user whose handler lets go of it (as a user dropped by its own handler's last
    // reference does) must not deadlock the informer.
    let slot: Arc<Mutex<Option<oka_cache::HandlerId>>> = Arc::default();
    let calls = Arc::new(Mutex::new(0));
    let id = widgets.on_change({
        let (slot, calls, widgets) = (Arc::clone(&slot), Arc::clone(&calls), widgets.clone());
        move |_| {
            *calls.lock().unwrap() += 1;
            if let Some(id) = slot.lock().unwrap().take() {
                widgets.remove_handler(id);
            }
        }
    });
    assert_eq!(*calls.lock().unwrap(), 1, "the replay");
    *slot.lock().unwrap() = Some(id);
    resize(&store, "a", 2).await;
    resize(&store, "a", 3).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*calls.lock().unwrap(), 2, "called once more, then gone");
    assert_eq!(widgets.cache().get_named("default", "a").unwrap().spec.size, 3);
}
