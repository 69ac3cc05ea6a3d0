//! A keyed work queue: de-duplication, per-key serialization, delayed requeue and per-key
//! exponential backoff, with the semantics of client-go's `workqueue` (dirty/processing sets)
//! and kube-runtime's scheduler (one pending deadline per key, the earlier one wins).
//!
//! # Expected flow
//!
//! 1. A producer (a watch event, a trigger, a reconcile result) calls [`WorkQueue::add`],
//!    [`WorkQueue::requeue_after`] or [`WorkQueue::requeue_rate_limited`].
//! 2. A worker calls [`WorkQueue::get`] and receives a [`Lease`] on one key. While the lease
//!    is alive the key is *processing*.
//! 3. The worker reconciles, then tells the queue what comes next: [`WorkQueue::forget`] on
//!    success (resets the key's backoff), [`WorkQueue::requeue_after`] to look again later,
//!    [`WorkQueue::requeue_rate_limited`] to retry with backoff.
//! 4. The worker drops the lease. If the key was added again while it was processing, it is
//!    ready again now, once.
//!
//! # Guarantees
//!
//! - **De-duplication.** A key is held at most once: adding a key that is already waiting is a
//!   no-op, so a burst of events for one object yields one reconcile.
//! - **Per-key serialization.** [`WorkQueue::get`] never hands out a key whose lease is still
//!   alive. A key added during processing is handed out again after the lease is dropped,
//!   exactly once however many times it was added.
//! - **One deadline per key, the earlier wins.** A key waits for at most one deadline. A
//!   request for an earlier time replaces a later one; a request for a later time is dropped.
//!   [`WorkQueue::add`] is a request for "now", so it supersedes a pending delayed requeue.
//!   Every request is answered by a processing that starts after the request was made and no
//!   later than its deadline (given a free worker).
//! - **Backoff.** [`WorkQueue::requeue_rate_limited`] waits `base_delay · 2^n` for the n-th
//!   consecutive failure of that key (counted from 0), capped at `max_delay`, until
//!   [`WorkQueue::forget`] resets it.
//! - **Shutdown.** After [`WorkQueue::shutdown`], [`WorkQueue::get`] returns `None` at once
//!   (waiting keys are dropped, new adds ignored); leases already handed out stay valid, and
//!   [`WorkQueue::drained`] resolves once they are all dropped.
//!
//! # Caveats
//!
//! - Time is `tokio::time`, so tests under `tokio::time::pause()` are instant.
//! - Delayed keys become ready when a worker waiting in [`WorkQueue::get`] notices their
//!   deadline; with every worker busy they are picked up by the next free one.
//! - All state is behind one mutex and no lock is held across an `.await`; the only
//!   concurrency protocol is the wake-up through `tokio::sync::Notify`, which registers the
//!   waiter before reading the state so no wake-up is lost. The state machine itself is the
//!   synchronous [`QueueState`], property-tested against a model of these guarantees.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Keys the queue can hold: cheap to clone, hashable, sendable.
pub trait QueueKey: Clone + Eq + Hash + Send + Sync + 'static {}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> QueueKey for T {}

/// Backoff settings of a [`WorkQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Delay of the first rate-limited retry of a key.
    pub base_delay: Duration,
    /// Upper bound of the delay of any rate-limited retry.
    pub max_delay: Duration,
}

impl Default for QueueConfig {
    /// 5 ms doubling to at most 5 minutes, as client-go's default controller rate limiter.
    fn default() -> Self {
        Self { base_delay: Duration::from_millis(5), max_delay: Duration::from_secs(300) }
    }
}

impl QueueConfig {
    /// The delay of the retry after `failures` consecutive earlier failures.
    pub fn backoff(&self, failures: u32) -> Duration {
        exponential(self.base_delay, self.max_delay, failures)
    }
}

/// `initial · 2^failures`, capped at `max` (saturating, never overflowing).
pub(crate) fn exponential(initial: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 2u32.checked_pow(failures).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(max)
}

/// A point-in-time view of a queue's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Keys ready to be handed to a worker.
    pub ready: usize,
    /// Keys waiting for a deadline.
    pub delayed: usize,
    /// Keys whose lease is alive.
    pub processing: usize,
}

/// The queue's state machine, without synchronization or a clock: every operation takes
/// `now`. [`WorkQueue`] wraps it in a mutex; it is public so its rules can be tested alone.
#[derive(Debug)]
pub struct QueueState<T: QueueKey> {
    config: QueueConfig,
    /// Keys ready for a worker, in order; always `dirty − processing`.
    ready: VecDeque<T>,
    /// Keys requested for "now": in `ready`, or processing and to be handed out again.
    dirty: HashSet<T>,
    /// Keys whose lease is alive.
    processing: HashSet<T>,
    /// Keys waiting for a deadline (never also in `dirty`), with their timer entry.
    delayed: HashMap<T, (Instant, u64)>,
    /// Timer entries in deadline order; the sequence number keeps equal deadlines apart.
    timers: BTreeMap<(Instant, u64), T>,
    next_seq: u64,
    /// Consecutive rate-limited retries per key.
    failures: HashMap<T, u32>,
    shutting_down: bool,
}

impl<T: QueueKey> QueueState<T> {
    /// An empty queue.
    pub fn new(config: QueueConfig) -> Self {
        Self {
            config,
            ready: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashSet::new(),
            delayed: HashMap::new(),
            timers: BTreeMap::new(),
            next_seq: 0,
            failures: HashMap::new(),
            shutting_down: false,
        }
    }

    /// Requests processing of `key` now. Returns true when the key became ready for a worker.
    pub fn add(&mut self, key: T) -> bool {
        if self.shutting_down {
            return false;
        }
        self.cancel_timer(&key);
        if !self.dirty.insert(key.clone()) {
            return false;
        }
        if self.processing.contains(&key) {
            return false;
        }
        self.ready.push_back(key);
        true
    }

    /// Requests processing of `key` at `at`, unless an earlier request is pending. Returns
    /// true when the key became ready now or the queue's earliest deadline moved earlier
    /// (so a waiting worker must look again).
    pub fn add_at(&mut self, key: T, at: Instant, now: Instant) -> bool {
        if self.shutting_down {
            return false;
        }
        if at <= now {
            return self.add(key);
        }
        if self.dirty.contains(&key) {
            return false;
        }
        if let Some(&(pending, _)) = self.delayed.get(&key) {
            if pending <= at {
                return false;
            }
            self.cancel_timer(&key);
        }
        let earliest_before = self.next_deadline();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.timers.insert((at, seq), key.clone());
        self.delayed.insert(key, (at, seq));
        earliest_before.is_none_or(|earliest| at < earliest)
    }

    /// Records one more failure of `key` and requests it after the backoff delay. Returns the
    /// delay and whether a waiting worker must look again (as [`QueueState::add_at`]).
    pub fn add_rate_limited(&mut self, key: T, now: Instant) -> (Duration, bool) {
        if self.shutting_down {
            return (Duration::ZERO, false);
        }
        let failures = self.failures.entry(key.clone()).or_insert(0);
        let delay = self.config.backoff(*failures);
        *failures = failures.saturating_add(1);
        let wake = self.add_at(key, now + delay, now);
        (delay, wake)
    }

    /// Resets the failure count of `key`.
    pub fn forget(&mut self, key: &T) {
        self.failures.remove(key);
    }

    /// The number of consecutive rate-limited retries of `key` since it was last forgotten.
    pub fn num_requeues(&self, key: &T) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }

    /// Moves every key whose deadline is at or before `now` to the ready set.
    pub fn promote(&mut self, now: Instant) {
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.delayed.remove(&key);
            if self.dirty.insert(key.clone()) && !self.processing.contains(&key) {
                self.ready.push_back(key);
            }
        }
    }

    /// Takes the first ready key and marks it processing. Deadlines are not looked at: call
    /// [`QueueState::promote`] first.
    pub fn pop(&mut self) -> Option<T> {
        if self.shutting_down {
            return None;
        }
        let key = self.ready.pop_front()?;
        self.dirty.remove(&key);
        self.processing.insert(key.clone());
        Some(key)
    }

    /// Ends the processing of `key`. Returns true when the key is ready again because it
    /// was added while processing.
    pub fn done(&mut self, key: &T) -> bool {
        if !self.processing.remove(key) {
            return false;
        }
        if self.dirty.contains(key) && !self.shutting_down {
            self.ready.push_back(key.clone());
            return true;
        }
        false
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.first_key_value().map(|((at, _), _)| *at)
    }

    /// Stops handing out keys and drops every waiting one; processing keys stay processing.
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        self.ready.clear();
        self.dirty.clear();
        self.delayed.clear();
        self.timers.clear();
    }

    /// Whether [`QueueState::shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Whether `key` is processing.
    pub fn is_processing(&self, key: &T) -> bool {
        self.processing.contains(key)
    }

    /// Whether `key` is requested for now (ready, or processing and to be handed out again).
    pub fn is_dirty(&self, key: &T) -> bool {
        self.dirty.contains(key)
    }

    /// The pending deadline of `key`, if it waits for one.
    pub fn deadline_of(&self, key: &T) -> Option<Instant> {
        self.delayed.get(key).map(|(at, _)| *at)
    }

    /// The sizes of the queue's sets.
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            ready: self.ready.len(),
            delayed: self.delayed.len(),
            processing: self.processing.len(),
        }
    }

    fn cancel_timer(&mut self, key: &T) {
        if let Some((at, seq)) = self.delayed.remove(key) {
            self.timers.remove(&(at, seq));
        }
    }
}

struct Shared<T: QueueKey> {
    state: Mutex<QueueState<T>>,
    /// Wakes workers waiting in `get`: a key became ready, the earliest deadline moved
    /// earlier, or the queue shut down.
    wake: Notify,
    /// Wakes `drained` waiters when the last lease is dropped.
    idle: Notify,
}

impl<T: QueueKey> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        // The state is consistent after every method (none panics half-way), so a poisoned
        // lock is safe to keep using.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn done(&self, key: &T) {
        let (ready_again, idle) = {
            let mut state = self.lock();
            let ready_again = state.done(key);
            (ready_again, state.processing.is_empty())
        };
        if ready_again {
            self.wake.notify_one();
        }
        if idle {
            self.idle.notify_waiters();
        }
    }
}

/// A cloneable handle to a keyed work queue; see the [module documentation](self).
pub struct WorkQueue<T: QueueKey> {
    shared: Arc<Shared<T>>,
}

impl<T: QueueKey> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<T: QueueKey> std::fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue").field("stats", &self.stats()).finish()
    }
}

impl<T: QueueKey> Default for WorkQueue<T> {
    fn default() -> Self {
        Self::new(QueueConfig::default())
    }
}

impl<T: QueueKey> WorkQueue<T> {
    /// An empty queue with the given backoff settings.
    pub fn new(config: QueueConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(QueueState::new(config)),
                wake: Notify::new(),
                idle: Notify::new(),
            }),
        }
    }

    /// Requests processing of `key` as soon as a worker is free (and its current processing,
    /// if any, has ended). Supersedes a pending [`WorkQueue::requeue_after`] of the key.
    pub fn add(&self, key: T) {
        let wake = self.shared.lock().add(key);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Requests processing of `key` after `delay`, unless it is already requested earlier.
    pub fn requeue_after(&self, key: T, delay: Duration) {
        let now = Instant::now();
        let wake = self.shared.lock().add_at(key, now + delay, now);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Records a failure of `key` and requests it after its backoff delay, which doubles
    /// with each consecutive failure until [`WorkQueue::forget`]. Returns the delay.
    pub fn requeue_rate_limited(&self, key: T) -> Duration {
        let (delay, wake) = self.shared.lock().add_rate_limited(key, Instant::now());
        if wake {
            self.shared.wake.notify_one();
        }
        delay
    }

    /// Resets the backoff of `key` (call it when the key was processed successfully).
    pub fn forget(&self, key: &T) {
        self.shared.lock().forget(key);
    }

    /// The number of consecutive rate-limited retries of `key`.
    pub fn num_requeues(&self, key: &T) -> u32 {
        self.shared.lock().num_requeues(key)
    }

    /// Waits for a ready key and leases it. Returns `None` once the queue is shut down.
    ///
    /// Cancel-safe: dropping the future before it resolves takes no key.
    pub async fn get(&self) -> Option<Lease<T>> {
        loop {
            // Register for a wake-up before reading the state, so a change made between the
            // read and the wait is not missed.
            let notified = self.shared.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let mut state = self.shared.lock();
                if state.is_shutting_down() {
                    return None;
                }
                state.promote(Instant::now());
                if let Some(key) = state.pop() {
                    let more = state.stats().ready > 0;
                    drop(state);
                    if more {
                        // Several keys may have become ready at once; pass the wake-up on.
                        self.shared.wake.notify_one();
                    }
                    return Some(Lease { key, shared: Arc::clone(&self.shared) });
                }
                state.next_deadline()
            };
            match deadline {
                Some(at) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Stops handing out keys: [`WorkQueue::get`] returns `None` from now on, waiting keys
    /// are dropped and later adds are ignored. Leases already handed out stay valid.
    pub fn shutdown(&self) {
        self.shared.lock().shutdown();
        self.shared.wake.notify_waiters();
    }

    /// Whether [`WorkQueue::shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.lock().is_shutting_down()
    }

    /// Resolves when no lease is alive (at once if none is).
    pub async fn drained(&self) {
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.lock().processing.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// [`WorkQueue::shutdown`], then [`WorkQueue::drained`].
    pub async fn shutdown_and_drain(&self) {
        self.shutdown();
        self.drained().await;
    }

    /// The sizes of the queue's sets (ready keys are the queue depth).
    pub fn stats(&self) -> QueueStats {
        self.shared.lock().stats()
    }
}

/// A key handed to one worker. Dropping it ends the key's processing (client-go's `Done`),
/// also when the worker panics, so a key is never stuck.
pub struct Lease<T: QueueKey> {
    key: T,
    shared: Arc<Shared<T>>,
}

impl<T: QueueKey> Lease<T> {
    /// The leased key.
    pub fn key(&self) -> &T {
        &self.key
    }
}

impl<T: QueueKey> Deref for Lease<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.key()
    }
}

impl<T: QueueKey + std::fmt::Debug> std::fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lease").field(&self.key).finish()
    }
}

impl<T: QueueKey> Drop for Lease<T> {
    fn drop(&mut self) {
        self.shared.done(&self.key);
    }
}

#[cfg(test)]
mod tests;
