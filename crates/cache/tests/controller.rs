//! The controller runtime end to end over a store: events to reconciles, requeues, the error
//! policy, deletions, relists, secondary kinds, concurrency and shutdown. Time is paused, so
//! every delay is exact and instant.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oka_cache::{Action, Config, Controller, Informer, ObjectKey, default_error_policy};
use oka_store::{Preconditions, Store, StoreError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use support::{FaultyStore, Part, Widget, part, widget};

/// Longer than any delay in these tests; instant under paused time.
const QUIET: Duration = Duration::from_secs(3600);

/// One call of the test reconciler: which object, which size it saw, when.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    name: String,
    size: i32,
    at: Instant,
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error("transient")]
    Transient,
    #[error("permanent")]
    Permanent,
}

type Script = Arc<dyn Fn(&Widget, usize) -> Result<Action, TestError> + Send + Sync>;

/// What the reconciler sees: where to report calls, and what to answer.
struct Ctx {
    calls: mpsc::UnboundedSender<Call>,
    /// Answers the n-th call (0-based) for a widget.
    script: Script,
    count: AtomicUsize,
    /// Held while a reconcile runs, to detect overlap.
    running: Mutex<HashSet<String>>,
    /// Set when one object was reconciled twice at once. (A panic in the reconciler would be
    /// caught by the runtime, so this is a flag, not an assert.)
    overlap: AtomicBool,
    max_parallel: AtomicUsize,
    /// When set, reconciles wait for this before returning.
    gate: Mutex<Option<tokio::sync::watch::Receiver<bool>>>,
    hold: Duration,
}

async fn reconcile(obj: Arc<Widget>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    {
        let mut running = ctx.running.lock().unwrap();
        if !running.insert(name.clone()) {
            ctx.overlap.store(true, Ordering::SeqCst);
        }
        ctx.max_parallel.fetch_max(running.len(), Ordering::SeqCst);
    }
    let n = ctx.count.fetch_add(1, Ordering::SeqCst);
    let _ = ctx.calls.send(Call { name: name.clone(), size: obj.spec.size, at: Instant::now() });
    if !ctx.hold.is_zero() {
        tokio::time::sleep(ctx.hold).await;
    }
    let gate = ctx.gate.lock().unwrap().clone();
    if let Some(mut gate) = gate {
        let _ = gate.wait_for(|open| *open).await;
    }
    ctx.running.lock().unwrap().remove(&name);
    (ctx.script)(&obj, n)
}

struct Harness {
    calls: mpsc::UnboundedReceiver<Call>,
    ctx: Arc<Ctx>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    fn new(script: Script) -> (Self, Arc<Ctx>) {
        Self::holding(script, Duration::ZERO)
    }

    /// A harness whose reconciles each take `hold`.
    fn holding(script: Script, hold: Duration) -> (Self, Arc<Ctx>) {
        let (tx, calls) = mpsc::unbounded_channel();
        let ctx = Arc::new(Ctx {
            calls: tx,
            script,
            count: AtomicUsize::new(0),
            running: Mutex::default(),
            overlap: AtomicBool::new(false),
            max_parallel: AtomicUsize::new(0),
            gate: Mutex::new(None),
            hold,
        });
        (Self { calls, ctx: Arc::clone(&ctx), stop: None, task: None }, ctx)
    }

    /// Starts `controller` with the test reconciler and `policy`.
    fn start<P>(&mut self, controller: Controller<Widget, FaultyStore>, policy: P)
    where
        P: Fn(&Widget, &TestError, &Ctx) -> Action + Send + Sync + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        let controller = controller.shutdown_on(async move {
            let _ = stopped.await;
        });
        self.stop = Some(stop);
        self.task = Some(tokio::spawn(controller.run(reconcile, policy, Arc::clone(&self.ctx))));
    }

    /// The next reconcile call, or `None` if none comes within [`QUIET`].
    async fn next_call(&mut self) -> Option<Call> {
        timeout(QUIET, self.calls.recv()).await.ok().flatten()
    }

    async fn expect_call(&mut self, name: &str) -> Call {
        let call =
            self.next_call().await.unwrap_or_else(|| panic!("expected a reconcile of {name}"));
        assert_eq!(call.name, name);
        call
    }

    async fn expect_quiet(&mut self) {
        if let Some(call) = self.next_call().await {
            panic!("unexpected reconcile: {call:?}");
        }
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            timeout(QUIET, task).await.expect("controller stops").expect("controller task");
        }
        assert!(!self.ctx.overlap.load(Ordering::SeqCst), "an object was reconciled concurrently");
    }
}

fn always(action: Action) -> Script {
    Arc::new(move |_, _| Ok(action))
}

async fn create(store: &FaultyStore, w: Widget) -> Widget {
    store.create("default", &w).await.expect("create")
}

async fn resize(store: &FaultyStore, name: &str, size: i32) -> Widget {
    let mut w: Widget = store.get("default", name).await.expect("get");
    w.spec.size = size;
    store.update("default", &w).await.expect("update")
}

fn controller(store: &FaultyStore) -> Controller<Widget, FaultyStore> {
    Controller::new("widgets", store.clone(), Config::default())
}

#[tokio::test(start_paused = true)]
async fn reconciles_every_listed_object_once_at_start() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    create(&store, widget("b", 2)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    h.start(controller(&store), default_error_policy);

    let mut names = vec![h.next_call().await.unwrap().name, h.next_call().await.unwrap().name];
    names.sort();
    assert_eq!(names, ["a", "b"]);
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_change_is_reconciled_with_the_newest_version() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    h.start(controller(&store), default_error_policy);
    h.expect_call("a").await;

    // A burst of changes collapses into one reconcile of the last version.
    resize(&store, "a", 2).await;
    resize(&store, "a", 3).await;
    resize(&store, "a", 4).await;
    assert_eq!(h.expect_call("a").await.size, 4);
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn requeue_after_reconciles_again_after_the_delay() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let script: Script = Arc::new(|_, n| {
        Ok(if n < 2 {
            Action::requeue_after(Duration::from_secs(30))
        } else {
            Action::await_change()
        })
    });
    let (mut h, _) = Harness::new(script);
    h.start(controller(&store), default_error_policy);

    let first = h.expect_call("a").await;
    let second = h.expect_call("a").await;
    let third = h.expect_call("a").await;
    assert_eq!(second.at - first.at, Duration::from_secs(30));
    assert_eq!(third.at - second.at, Duration::from_secs(30));
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_change_answers_a_pending_requeue() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let script: Script = Arc::new(|_, n| {
        Ok(if n == 0 {
            Action::requeue_after(Duration::from_secs(30))
        } else {
            Action::await_change()
        })
    });
    let (mut h, _) = Harness::new(script);
    h.start(controller(&store), default_error_policy);
    let first = h.expect_call("a").await;

    tokio::time::sleep(Duration::from_secs(10)).await;
    resize(&store, "a", 2).await;
    let second = h.expect_call("a").await;
    assert_eq!(second.at - first.at, Duration::from_secs(10));
    // The 30 s requeue was answered by the change-triggered reconcile.
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn error_policy_chooses_the_next_step_by_error_kind() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let script: Script = Arc::new(|_, n| match n {
        0 => Err(TestError::Transient),
        1 => Err(TestError::Permanent),
        _ => Ok(Action::await_change()),
    });
    let (mut h, _) = Harness::new(script);
    let policy = |_: &Widget, error: &TestError, _: &Ctx| match error {
        TestError::Transient => Action::requeue_after(Duration::from_secs(7)),
        TestError::Permanent => Action::await_change(),
    };
    h.start(controller(&store), policy);

    let first = h.expect_call("a").await;
    let second = h.expect_call("a").await;
    assert_eq!(second.at - first.at, Duration::from_secs(7));
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn default_error_policy_backs_off_exponentially_and_resets_on_success() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    // Fail 3 times, succeed once (asking to look again in 1 s), then fail twice more.
    let script: Script = Arc::new(|_, n| match n {
        0..=2 | 4 | 5 => Err(TestError::Transient),
        3 => Ok(Action::requeue_after(Duration::from_secs(1))),
        _ => Ok(Action::await_change()),
    });
    let (mut h, _) = Harness::new(script);
    let c = controller(&store);
    let stats = c.stats();
    h.start(c, default_error_policy);

    let mut at = Vec::new();
    for _ in 0..7 {
        at.push(h.expect_call("a").await.at);
    }
    let gaps: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(gaps, [5, 10, 20, 1000, 5, 10]);
    h.expect_quiet().await;
    assert_eq!(stats.snapshot().reconcile_errors, 5);
    assert_eq!(stats.snapshot().reconciles, 7);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_is_retried_with_backoff() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let script: Script = Arc::new(|_, n| {
        assert!(n != 0, "reconcile bug");
        Ok(Action::await_change())
    });
    let (mut h, _) = Harness::new(script);
    let c = controller(&store);
    let stats = c.stats();
    h.start(c, default_error_policy);

    let first = h.expect_call("a").await;
    let second = h.expect_call("a").await;
    assert_eq!(second.at - first.at, Duration::from_millis(5));
    assert_eq!(stats.snapshot().reconcile_panics, 1);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deleted_objects_are_not_reconciled_and_on_delete_sees_the_last_state() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let (mut h, _) = Harness::new(always(Action::requeue_after(Duration::from_secs(5))));
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let c = controller(&store).on_delete({
        let deleted = Arc::clone(&deleted);
        move |w: &Widget| deleted.lock().unwrap().push((w.metadata.name.clone(), w.spec.size))
    });
    let stats = c.stats();
    h.start(c, default_error_policy);
    h.expect_call("a").await;

    resize(&store, "a", 9).await;
    store.delete::<Widget>("default", "a", &Preconditions::default()).await.unwrap();
    // Neither the change nor the pending 5 s requeue reconcile a deleted object.
    h.expect_quiet().await;
    assert_eq!(*deleted.lock().unwrap(), [(Some("a".to_string()), 9)]);
    assert!(stats.snapshot().skipped_deleted >= 1);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_object_with_finalizers_is_reconciled_while_it_is_deleted() {
    let store = FaultyStore::new();
    let mut w = widget("a", 1);
    w.metadata.finalizers = Some(vec!["test.oka.dev/cleanup".into()]);
    create(&store, w).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    h.start(controller(&store), default_error_policy);
    h.expect_call("a").await;

    store.delete::<Widget>("default", "a", &Preconditions::default()).await.unwrap();
    h.expect_call("a").await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn gone_watch_relists_and_reports_what_changed_meanwhile() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    create(&store, widget("b", 1)).await;
    create(&store, widget("c", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let c = controller(&store).on_delete({
        let deleted = Arc::clone(&deleted);
        move |w: &Widget| deleted.lock().unwrap().push(w.metadata.name.clone().unwrap())
    });
    let stats = c.stats();
    let cache = c.cache();
    h.start(c, default_error_policy);
    for _ in 0..3 {
        h.next_call().await.expect("initial reconciles");
    }

    // The store forgets its history and the watch fails with Gone. Changes made now reach the
    // informer only through the relist.
    store.compact();
    store.fail_next_lists::<Widget>(1);
    resize(&store, "a", 2).await;
    store.delete::<Widget>("default", "b", &Preconditions::default()).await.unwrap();
    create(&store, widget("d", 1)).await;

    let mut names = vec![h.next_call().await.unwrap().name, h.next_call().await.unwrap().name];
    names.sort();
    assert_eq!(names, ["a", "d"], "changed and new objects are reconciled, unchanged c is not");
    h.expect_quiet().await;
    assert_eq!(*deleted.lock().unwrap(), ["b"]);
    let mut cached: Vec<_> =
        cache.list().iter().map(|w| w.metadata.name.clone().unwrap()).collect();
    cached.sort();
    assert_eq!(cached, ["a", "c", "d"]);
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.lists, 2);
    assert!(snapshot.watch_errors >= 1);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn list_errors_are_retried_with_backoff() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    store.fail_next_lists::<Widget>(3);
    let (mut h, _) = Harness::new(always(Action::await_change()));
    let start = Instant::now();
    h.start(controller(&store), default_error_policy);

    let call = h.expect_call("a").await;
    // 100 ms, 200 ms, 400 ms of backoff before the fourth list succeeds.
    assert_eq!(call.at - start, Duration::from_millis(700));
    assert_eq!(store.lists(), 4);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_broken_watch_resumes_from_the_last_version_without_relisting() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    h.start(controller(&store), default_error_policy);
    h.expect_call("a").await;

    store.break_watches(StoreError::Unavailable("connection reset".into()));
    resize(&store, "a", 5).await;
    // The change made while the watch was down is replayed by the resumed watch.
    assert_eq!(h.expect_call("a").await.size, 5);
    assert_eq!(store.lists(), 1);
    assert_eq!(store.watches(), 2);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_ended_watch_relists() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    h.start(controller(&store), default_error_policy);
    h.expect_call("a").await;

    store.end_watches();
    resize(&store, "a", 5).await;
    assert_eq!(h.expect_call("a").await.size, 5);
    assert_eq!(store.lists(), 2);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn owned_objects_wake_their_owner_also_when_the_link_is_removed() {
    let store = FaultyStore::new();
    let owner = create(&store, widget("owner", 1)).await;
    create(&store, widget("other", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    let parts = Informer::<Part, _>::new(store.clone());
    h.start(controller(&store).owns(parts), default_error_policy);
    for _ in 0..2 {
        h.next_call().await.expect("initial reconciles");
    }

    let child = store.create("default", &part("p1", Some(&owner))).await.unwrap();
    h.expect_call("owner").await;
    h.expect_quiet().await;

    // The child leaves its owner (as a claimed sandbox leaves its pool): the former owner
    // is woken although the new version names no owner.
    let mut orphan = child.clone();
    orphan.metadata.owner_references = None;
    store.update("default", &orphan).await.unwrap();
    h.expect_call("owner").await;

    // An unrelated part wakes nobody.
    store.create("default", &part("p2", None)).await.unwrap();
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn debounced_changes_share_one_reconcile_that_waits_no_longer_than_the_debounce() {
    const DEBOUNCE: Duration = Duration::from_millis(10);
    let store = FaultyStore::new();
    let owner = create(&store, widget("owner", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    let parts = Informer::<Part, _>::new(store.clone());
    let config = Config::default().debounce(DEBOUNCE);
    h.start(Controller::new("widgets", store.clone(), config).owns(parts), default_error_policy);
    h.expect_call("owner").await;

    // Twenty children appear one millisecond apart: a burst of claims, seen by a pool.
    let first = Instant::now();
    for i in 0..20 {
        store.create("default", &part(&format!("p{i}"), Some(&owner))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut calls = Vec::new();
    while let Some(call) = h.next_call().await {
        calls.push(call.at);
    }
    // A reconcile per window, each no later than the debounce after the first change it
    // answers; nothing after the last window.
    assert!((2..=3).contains(&calls.len()), "{} reconciles for 20 changes", calls.len());
    assert_eq!(calls[0] - first, DEBOUNCE);
    assert!(calls.windows(2).all(|w| w[1] - w[0] >= DEBOUNCE), "{calls:?}");
    assert!(*calls.last().unwrap() - first <= Duration::from_millis(20) + DEBOUNCE);

    // An update of the owner itself waits for the debounce too (in a burst, the pool's own
    // status writes); a new object is reconciled at once.
    let updated = Instant::now();
    resize(&store, "owner", 2).await;
    assert_eq!(h.expect_call("owner").await.at - updated, DEBOUNCE);
    let created = Instant::now();
    create(&store, widget("new", 1)).await;
    assert_eq!(h.expect_call("new").await.at, created);
    h.expect_quiet().await;

    // Without a debounce every change wakes the owner at once.
    h.shutdown().await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    let parts = Informer::<Part, _>::new(store.clone());
    h.start(controller(&store).owns(parts), default_error_policy);
    for _ in 0..2 {
        h.next_call().await.expect("initial reconciles");
    }
    let changed = Instant::now();
    store.create("default", &part("late", Some(&owner))).await.unwrap();
    assert_eq!(h.expect_call("owner").await.at, changed);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_reconcile_stretches_the_debounce_of_its_key() {
    const DEBOUNCE: Duration = Duration::from_millis(10);
    const HOLD: Duration = Duration::from_millis(8);
    const STRETCHED: Duration = Duration::from_millis(40); // 5 × HOLD
    let store = FaultyStore::new();
    let owner = create(&store, widget("owner", 1)).await;
    let (mut h, _) = Harness::holding(always(Action::await_change()), HOLD);
    let parts = Informer::<Part, _>::new(store.clone());
    let config = Config::default().debounce(DEBOUNCE).debounce_scale(5);
    h.start(Controller::new("widgets", store.clone(), config).owns(parts), default_error_policy);
    h.expect_call("owner").await;
    tokio::time::sleep(HOLD).await;

    // A child changes every millisecond for 200 ms (a pool during a burst of claims): each
    // reconcile took 8 ms, so changes gather for 40 ms instead of 10.
    let first = Instant::now();
    for i in 0..200 {
        store.create("default", &part(&format!("p{i}"), Some(&owner))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let last = Instant::now();
    let mut calls = Vec::new();
    while let Some(call) = h.next_call().await {
        calls.push(call.at);
    }
    assert_eq!(calls[0] - first, STRETCHED);
    assert!(calls.windows(2).all(|w| w[1] - w[0] >= STRETCHED), "{calls:?}");
    assert!((4..=6).contains(&calls.len()), "{} reconciles in 200 ms", calls.len());
    // The last change (at `last` − 1 ms) is answered by a reconcile that starts after it, and
    // no later than the stretched debounce.
    assert!(*calls.last().unwrap() >= last - Duration::from_millis(1));
    assert!(*calls.last().unwrap() - last <= STRETCHED);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn reconcile_on_wakes_keys_from_a_stream() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    let (mut h, _) = Harness::new(always(Action::await_change()));
    let (tx, rx) = mpsc::unbounded_channel();
    let triggers =
        futures::stream::unfold(rx, |mut rx| async move { Some((rx.recv().await?, rx)) });
    h.start(controller(&store).reconcile_on(triggers), default_error_policy);
    h.expect_call("a").await;

    tx.send(ObjectKey::new("default", "a")).unwrap();
    h.expect_call("a").await;
    // A key with no object behind it is dropped.
    tx.send(ObjectKey::new("default", "ghost")).unwrap();
    h.expect_quiet().await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn one_object_is_never_reconciled_concurrently() {
    let store = FaultyStore::new();
    for name in ["a", "b", "c", "d"] {
        create(&store, widget(name, 0)).await;
    }
    let (tx, mut calls) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        calls: tx,
        script: always(Action::await_change()),
        count: AtomicUsize::new(0),
        running: Mutex::default(),
        overlap: AtomicBool::new(false),
        max_parallel: AtomicUsize::new(0),
        gate: Mutex::new(None),
        hold: Duration::from_millis(10),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let c = Controller::new("widgets", store.clone(), Config::default().workers(4)).shutdown_on(
        async move {
            let _ = stopped.await;
        },
    );
    let task = tokio::spawn(c.run(reconcile, default_error_policy, Arc::clone(&ctx)));

    // Keep changing every widget while reconciles of them are running.
    for round in 1..=20 {
        for name in ["a", "b", "c", "d"] {
            resize(&store, name, round).await;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    tokio::time::sleep(QUIET).await;
    let _ = stop.send(());
    task.await.unwrap();

    // Every widget's last reconcile saw its last version; objects ran in parallel.
    let mut last = std::collections::HashMap::new();
    while let Ok(call) = calls.try_recv() {
        last.insert(call.name, call.size);
    }
    assert_eq!(last.len(), 4);
    assert!(last.values().all(|size| *size == 20), "{last:?}");
    assert!(!ctx.overlap.load(Ordering::SeqCst), "an object was reconciled concurrently");
    assert!(ctx.max_parallel.load(Ordering::SeqCst) > 1);
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_finishes_in_flight_reconciles_and_starts_no_new_ones() {
    let store = FaultyStore::new();
    create(&store, widget("a", 1)).await;
    create(&store, widget("b", 1)).await;
    let (mut h, ctx) = Harness::new(always(Action::requeue_after(Duration::from_millis(1))));
    let (open, gate) = tokio::sync::watch::channel(false);
    *ctx.gate.lock().unwrap() = Some(gate);
    h.start(controller(&store), default_error_policy);
    // One worker: a is in flight and blocked, b waits in the queue.
    let first = h.next_call().await.expect("a reconcile starts");

    let (stop, task) = (h.stop.take().unwrap(), h.task.take().unwrap());
    let _ = stop.send(());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!task.is_finished(), "run waits for the in-flight reconcile");

    let _ = open.send(true);
    timeout(QUIET, task).await.expect("run returns").unwrap();
    assert_eq!(ctx.count.load(Ordering::SeqCst), 1, "no reconcile started after the trigger");
    assert!(h.calls.try_recv().is_err(), "only {} ran", first.name);
    assert_eq!(store.open_watches(), 0, "informers stopped");
}

#[tokio::test(start_paused = true)]
async fn workers_start_only_once_every_cache_is_filled() {
    let store = FaultyStore::new();
    let owner = create(&store, widget("a", 1)).await;
    store.create("default", &part("p1", Some(&owner))).await.unwrap();
    // The widgets list succeeds at once; the parts list fails twice first.
    store.fail_next_lists::<Part>(2);
    let parts = Informer::<Part, _>::new(store.clone());
    let part_cache = parts.cache();
    let saw_unready = Arc::new(AtomicBool::new(false));
    let script: Script = Arc::new({
        let saw_unready = Arc::clone(&saw_unready);
        move |_, _| {
            if !part_cache.is_ready() || part_cache.is_empty() {
                saw_unready.store(true, Ordering::SeqCst);
            }
            Ok(Action::await_change())
        }
    });
    let (mut h, _) = Harness::new(script);
    let start = Instant::now();
    h.start(controller(&store).owns(parts), default_error_policy);

    let call = h.expect_call("a").await;
    assert!(!saw_unready.load(Ordering::SeqCst), "reconciled before the parts cache was filled");
    // 100 ms + 200 ms of list backoff for the parts.
    assert_eq!(call.at - start, Duration::from_millis(300));
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn stats_count_reconciles_errors_and_queue_depth() {
    let store = FaultyStore::new();
    for name in ["a", "b", "c"] {
        create(&store, widget(name, 1)).await;
    }
    let (mut h, ctx) = Harness::new(always(Action::await_change()));
    let (open, gate) = tokio::sync::watch::channel(false);
    *ctx.gate.lock().unwrap() = Some(gate);
    let c = controller(&store);
    let stats = c.stats();
    h.start(c, default_error_policy);
    h.next_call().await.expect("first reconcile");

    let snapshot = stats.snapshot();
    assert_eq!(snapshot.name, "widgets");
    assert_eq!(snapshot.reconciles, 1);
    assert_eq!(snapshot.queue.processing, 1);
    assert_eq!(snapshot.queue.ready, 2, "two keys wait for the single worker");
    assert_eq!(snapshot.lists, 1);

    let _ = open.send(true);
    for _ in 0..2 {
        h.next_call().await.expect("the others");
    }
    h.expect_quiet().await;
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.reconciles, 3);
    assert_eq!(snapshot.reconcile_errors, 0);
    assert_eq!(snapshot.queue.ready + snapshot.queue.processing, 0);
    h.shutdown().await;
}
