//! Tests of the work queue: one per guarantee, with `tokio::time::pause()` so every timer is
//! instant and exact, plus property tests of random operation sequences.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{Instant, timeout};

use super::*;

/// Long enough for any pending timer in these tests to have fired.
const QUIET: Duration = Duration::from_secs(3600);

fn queue() -> WorkQueue<&'static str> {
    WorkQueue::new(QueueConfig::default())
}

/// The next key, or `None` when nothing becomes ready within [`QUIET`] (instant under paused
/// time).
async fn next(q: &WorkQueue<&'static str>) -> Option<Lease<&'static str>> {
    timeout(QUIET, q.get()).await.ok().flatten()
}

#[tokio::test(start_paused = true)]
async fn duplicate_adds_are_processed_once() {
    let q = queue();
    q.add("a");
    q.add("a");
    q.add("b");
    q.add("a");
    assert_eq!(q.stats().ready, 2);

    let first = next(&q).await.expect("a is ready");
    assert_eq!(*first, "a");
    drop(first);
    let second = next(&q).await.expect("b is ready");
    assert_eq!(*second, "b");
    drop(second);
    assert!(next(&q).await.is_none(), "each key is handed out once");
}

#[tokio::test(start_paused = true)]
async fn key_is_never_processed_concurrently() {
    let q = queue();
    q.add("a");
    let lease = next(&q).await.expect("a is ready");
    q.add("a");
    q.add("b");

    // Another worker gets b, but not a while a's lease is alive.
    let other = next(&q).await.expect("b is ready");
    assert_eq!(*other, "b");
    drop(other);
    assert!(next(&q).await.is_none(), "a must wait for its lease");

    drop(lease);
    let again = next(&q).await.expect("a is ready after its lease ended");
    assert_eq!(*again, "a");
}

#[tokio::test(start_paused = true)]
async fn add_during_processing_reprocesses_once() {
    let q = queue();
    q.add("a");
    let lease = next(&q).await.expect("a is ready");
    q.add("a");
    q.add("a");
    q.requeue_after("a", Duration::from_secs(1));
    assert_eq!(q.stats(), QueueStats { ready: 0, delayed: 0, processing: 1 });

    drop(lease);
    let again = next(&q).await.expect("a is processed again");
    assert_eq!(*again, "a");
    drop(again);
    assert!(next(&q).await.is_none(), "and only once");
}

#[tokio::test(start_paused = true)]
async fn earlier_requeue_wins() {
    let q = queue();
    let start = Instant::now();
    q.requeue_after("a", Duration::from_secs(10));
    q.requeue_after("a", Duration::from_secs(2));
    q.requeue_after("a", Duration::from_secs(5));

    let lease = next(&q).await.expect("a comes back");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    drop(lease);
    assert!(next(&q).await.is_none(), "the later deadlines were dropped");
}

#[tokio::test(start_paused = true)]
async fn add_supersedes_a_pending_requeue() {
    let q = queue();
    let start = Instant::now();
    q.requeue_after("a", Duration::from_secs(10));
    q.add("a");

    let lease = next(&q).await.expect("a is ready now");
    assert_eq!(start.elapsed(), Duration::ZERO);
    drop(lease);
    assert!(next(&q).await.is_none(), "the delayed request was answered early");
}

#[tokio::test(start_paused = true)]
async fn requeue_from_a_worker_returns_after_the_delay() {
    let q = queue();
    q.add("a");
    let lease = next(&q).await.expect("a is ready");
    let start = Instant::now();
    q.requeue_after("a", Duration::from_millis(300));
    drop(lease);

    let again = next(&q).await.expect("a comes back");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_worker_wakes_for_a_new_earlier_deadline() {
    let q = queue();
    q.requeue_after("late", Duration::from_secs(60));
    let worker = tokio::spawn({
        let q = q.clone();
        async move {
            let lease = q.get().await.expect("a key");
            (*lease, Instant::now())
        }
    });
    // Let the worker start waiting for the 60 s deadline, then add an earlier one.
    tokio::task::yield_now().await;
    let start = Instant::now();
    q.requeue_after("early", Duration::from_secs(1));

    let (key, at) = worker.await.expect("worker");
    assert_eq!(key, "early");
    assert_eq!(at - start, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn keys_due_together_reach_every_waiting_worker() {
    let q = queue();
    for key in ["a", "b", "c"] {
        q.requeue_after(key, Duration::from_secs(1));
    }
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let lease = q.get().await.expect("a key");
                let key = *lease;
                // Hold the lease until every worker has one.
                tokio::time::sleep(Duration::from_secs(1)).await;
                key
            })
        })
        .collect();
    let mut keys = Vec::new();
    for worker in workers {
        keys.push(worker.await.expect("worker"));
    }
    keys.sort_unstable();
    assert_eq!(keys, ["a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_and_reset_on_success() {
    let q = WorkQueue::new(QueueConfig {
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(100),
    });
    let mut delays = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let planned = q.requeue_rate_limited("a");
        let lease = next(&q).await.expect("a is retried");
        assert_eq!(start.elapsed(), planned, "the retry comes exactly after the backoff");
        delays.push(planned.as_millis());
        drop(lease);
    }
    assert_eq!(delays, [5, 10, 20, 40, 80, 100, 100]);
    assert_eq!(q.num_requeues(&"a"), 7);

    // Other keys have their own backoff.
    assert_eq!(q.requeue_rate_limited("b"), Duration::from_millis(5));
    drop(next(&q).await);

    q.forget(&"a");
    assert_eq!(q.num_requeues(&"a"), 0);
    assert_eq!(q.requeue_rate_limited("a"), Duration::from_millis(5));
}

#[test]
fn default_backoff_is_5ms_doubling_to_5_minutes() {
    let config = QueueConfig::default();
    assert_eq!(config.backoff(0), Duration::from_millis(5));
    assert_eq!(config.backoff(1), Duration::from_millis(10));
    assert_eq!(config.backoff(15), Duration::from_millis(5 << 15));
    assert_eq!(config.backoff(16), Duration::from_secs(300));
    assert_eq!(config.backoff(u32::MAX), Duration::from_secs(300));
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_workers() {
    let q = queue();
    q.add("a");
    q.add("b");
    let busy_a = next(&q).await.expect("a");
    let busy_b = next(&q).await.expect("b");
    q.requeue_after("c", Duration::from_secs(5));
    let idle_worker = tokio::spawn({
        let q = q.clone();
        async move { q.get().await.map(|lease| *lease) }
    });
    tokio::task::yield_now().await;

    q.shutdown();
    // c was waiting for its deadline and is dropped; the idle worker stops at once.
    assert_eq!(idle_worker.await.expect("worker"), None);
    assert!(q.get().await.is_none(), "no key is handed out after shutdown");
    q.add("d");
    assert_eq!(q.stats(), QueueStats { ready: 0, delayed: 0, processing: 2 });

    // In-flight work is waited for.
    let drained = tokio::spawn({
        let q = q.clone();
        async move { q.drained().await }
    });
    drop(busy_a);
    tokio::task::yield_now().await;
    assert!(!drained.is_finished(), "b is still processing");
    drop(busy_b);
    timeout(QUIET, drained).await.expect("drained resolves").expect("task");
    assert_eq!(q.stats(), QueueStats::default());
}

#[tokio::test(start_paused = true)]
async fn a_panicking_worker_does_not_leave_its_key_processing() {
    let q = queue();
    q.add("a");
    let worker = tokio::spawn({
        let q = q.clone();
        async move {
            let _lease = q.get().await;
            panic!("reconcile bug");
        }
    });
    assert!(worker.await.is_err());
    assert_eq!(q.stats().processing, 0);
    q.add("a");
    assert_eq!(next(&q).await.map(|l| *l), Some("a"));
}

// === Model-based property test of the state machine ===

#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    AddAfter(u8, u64),
    RateLimited(u8),
    Forget(u8),
    Pop,
    Done(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    prop_oneof![
        3 => key.clone().prop_map(Op::Add),
        3 => (key.clone(), 0u64..200).prop_map(|(k, ms)| Op::AddAfter(k, ms)),
        2 => key.clone().prop_map(Op::RateLimited),
        1 => key.prop_map(Op::Forget),
        4 => Just(Op::Pop),
        3 => any::<usize>().prop_map(Op::Done),
        3 => (0u64..150).prop_map(Op::Advance),
    ]
}

/// What the guarantees promise, kept in step with the real state machine.
struct Model {
    now: Instant,
    /// Keys handed out and not yet done.
    in_hand: Vec<u8>,
    /// For each key with an unanswered request: the earliest deadline asked for.
    outstanding: HashMap<u8, Instant>,
    failures: HashMap<u8, u32>,
}

impl Model {
    fn request(&mut self, key: u8, at: Instant) {
        let due = self.outstanding.entry(key).or_insert(at);
        *due = (*due).min(at);
    }

    fn pop(&mut self, state: &mut QueueState<u8>) -> Option<u8> {
        state.promote(self.now);
        let popped = state.pop();
        match popped {
            Some(key) => {
                assert!(!self.in_hand.contains(&key), "{key} handed out twice at once");
                let due = self.outstanding.remove(&key);
                assert!(
                    due.is_some_and(|due| due <= self.now),
                    "{key} handed out without a due request ({due:?})"
                );
                self.in_hand.push(key);
            }
            None => {
                for (key, due) in &self.outstanding {
                    assert!(
                        *due > self.now || self.in_hand.contains(key),
                        "{key} is due but was not handed out (lost)"
                    );
                }
            }
        }
        popped
    }
}

fn run_ops(ops: Vec<Op>) {
    let config =
        QueueConfig { base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(80) };
    let mut state = QueueState::new(config);
    let mut model = Model {
        now: Instant::now(),
        in_hand: Vec::new(),
        outstanding: HashMap::new(),
        failures: HashMap::new(),
    };
    for op in ops {
        match op {
            Op::Add(k) => {
                model.request(k, model.now);
                state.add(k);
            }
            Op::AddAfter(k, ms) => {
                let at = model.now + Duration::from_millis(ms);
                model.request(k, at);
                state.add_at(k, at, model.now);
            }
            Op::RateLimited(k) => {
                let failures = model.failures.entry(k).or_insert(0);
                let expected = config.backoff(*failures);
                *failures += 1;
                model.request(k, model.now + expected);
                let (delay, _) = state.add_rate_limited(k, model.now);
                assert_eq!(delay, expected);
            }
            Op::Forget(k) => {
                model.failures.remove(&k);
                state.forget(&k);
                assert_eq!(state.num_requeues(&k), 0);
            }
            Op::Pop => {
                model.pop(&mut state);
            }
            Op::Done(i) => {
                if !model.in_hand.is_empty() {
                    let key = model.in_hand.remove(i % model.in_hand.len());
                    state.done(&key);
                }
            }
            Op::Advance(ms) => model.now += Duration::from_millis(ms),
        }
        // Structural invariants after every step.
        let stats = state.stats();
        assert_eq!(stats.processing, model.in_hand.len());
        for key in &model.in_hand {
            assert!(state.is_processing(key));
        }
        for key in 0..4u8 {
            assert!(
                !(state.is_dirty(&key) && state.deadline_of(&key).is_some()),
                "{key} both ready and delayed"
            );
        }
    }
    // Drain: finish everything in hand and let every deadline pass. Every request is answered.
    loop {
        for key in std::mem::take(&mut model.in_hand) {
            state.done(&key);
        }
        model.now += Duration::from_secs(1);
        if model.pop(&mut state).is_none() {
            break;
        }
    }
    assert!(model.outstanding.is_empty(), "lost requests: {:?}", model.outstanding);
    assert_eq!(state.stats(), QueueStats { ready: 0, delayed: 0, processing: 0 });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any sequence of adds, delayed adds, retries, pops, dones and clock steps: a key is never
    /// handed out while processing, never without a due request, and no request is lost.
    #[test]
    fn random_operations_keep_the_queue_guarantees(ops in prop::collection::vec(op(), 0..120)) {
        run_ops(ops);
    }
}

// === Random interleavings with real workers (async, paused time) ===

#[derive(Debug, Clone)]
enum Request {
    Add(u8),
    After(u8, u64),
    RateLimited(u8),
}

fn request() -> impl Strategy<Value = (u64, Request)> {
    let key = 0u8..5;
    let req = prop_oneof![
        key.clone().prop_map(Request::Add),
        (key.clone(), 0u64..50).prop_map(|(k, ms)| Request::After(k, ms)),
        key.prop_map(Request::RateLimited),
    ];
    (0u64..20, req)
}

/// Runs `workers` workers that hold each key for a pseudo-random time while a script sends
/// `requests` (each after a gap). Returns nothing; panics on a violated guarantee.
async fn interleave(workers: usize, requests: Vec<(u64, Request)>, hold_ms: Vec<u64>) {
    let q: WorkQueue<u8> = WorkQueue::new(QueueConfig {
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(40),
    });
    // A logical clock: on a current-thread runtime nothing runs between a request and the
    // tick taken right after it, nor between `get` returning and the tick after it.
    let clock = Arc::new(AtomicU64::new(0));
    let in_flight: Arc<std::sync::Mutex<HashSet<u8>>> = Arc::default();
    let starts: Arc<std::sync::Mutex<Vec<(u8, u64)>>> = Arc::default();
    let mut handles = Vec::new();
    for w in 0..workers {
        let (q, clock, in_flight, starts) =
            (q.clone(), Arc::clone(&clock), Arc::clone(&in_flight), Arc::clone(&starts));
        let hold_ms = hold_ms.clone();
        handles.push(tokio::spawn(async move {
            let mut n = w;
            while let Some(lease) = q.get().await {
                let key = *lease;
                let tick = clock.fetch_add(1, Ordering::SeqCst);
                assert!(in_flight.lock().unwrap().insert(key), "{key} processed concurrently");
                starts.lock().unwrap().push((key, tick));
                let hold = hold_ms.get(n % hold_ms.len().max(1)).copied().unwrap_or(0);
                n += 1;
                tokio::time::sleep(Duration::from_millis(hold)).await;
                assert!(in_flight.lock().unwrap().remove(&key));
                drop(lease);
            }
        }));
    }
    let mut made = Vec::new();
    for (gap, req) in requests {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let key = match req {
            Request::Add(k) => {
                q.add(k);
                k
            }
            Request::After(k, ms) => {
                q.requeue_after(k, Duration::from_millis(ms));
                k
            }
            Request::RateLimited(k) => {
                q.requeue_rate_limited(k);
                k
            }
        };
        made.push((key, clock.fetch_add(1, Ordering::SeqCst)));
    }
    // Let every timer fire and every worker finish, then stop.
    tokio::time::sleep(QUIET).await;
    assert_eq!(q.stats(), QueueStats::default(), "work left after a quiet hour");
    q.shutdown_and_drain().await;
    for handle in handles {
        handle.await.expect("worker");
    }
    let starts = starts.lock().unwrap();
    for (key, tick) in made {
        assert!(
            starts.iter().any(|&(k, t)| k == key && t > tick),
            "request for {key} at tick {tick} was never answered"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random interleavings of adds, requeues and retries with 1–4 workers that hold keys for
    /// random times: no key is ever processed by two workers, and every request is followed
    /// by a processing of its key.
    #[test]
    fn random_interleavings_never_process_a_key_concurrently_nor_lose_it(
        workers in 1usize..5,
        requests in prop::collection::vec(request(), 0..60),
        hold_ms in prop::collection::vec(0u64..30, 1..8),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(interleave(workers, requests, hold_ms));
    }
}

/// Real threads, no timers: producers and workers race on the queue's lock and wake-ups.
/// Each producer bumps a key's wanted generation before adding it; each worker records the
/// generation it saw after taking the key. When everything is quiet, every key's last
/// generation has been seen (no lost wake-up, no lost key), and no key ran twice at once.
#[test]
fn threaded_workers_lose_no_key_and_never_overlap() {
    const KEYS: usize = 16;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let q: WorkQueue<usize> = WorkQueue::default();
        let wanted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let seen: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let busy: Arc<Vec<AtomicBool>> =
            Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (q, wanted, seen, busy) =
                (q.clone(), Arc::clone(&wanted), Arc::clone(&seen), Arc::clone(&busy));
            workers.push(tokio::spawn(async move {
                while let Some(lease) = q.get().await {
                    let key = *lease;
                    assert!(!busy[key].swap(true, Ordering::SeqCst), "{key} ran twice at once");
                    seen[key].fetch_max(wanted[key].load(Ordering::SeqCst), Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    busy[key].store(false, Ordering::SeqCst);
                    drop(lease);
                }
            }));
        }
        let mut producers = Vec::new();
        for p in 0..3 {
            let (q, wanted) = (q.clone(), Arc::clone(&wanted));
            producers.push(tokio::spawn(async move {
                for i in 0..5_000usize {
                    let key = (i * 7 + p) % KEYS;
                    wanted[key].fetch_add(1, Ordering::SeqCst);
                    q.add(key);
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for producer in producers {
            producer.await.unwrap();
        }
        let quiet = async {
            while q.stats() != QueueStats::default() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), quiet).await.expect("queue goes quiet");
        for key in 0..KEYS {
            assert_eq!(
                seen[key].load(Ordering::SeqCst),
                wanted[key].load(Ordering::SeqCst),
                "the last add of {key} was not processed"
            );
        }
        q.shutdown_and_drain().await;
        for worker in workers {
            worker.await.unwrap();
        }
    });
}
