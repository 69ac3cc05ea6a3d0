//! The circuit breaker in front of the Redis backend: after `max_failures` consecutive
//! failures the backend is not called for `open_for` (calls fail at once, so a create that
//! fails open costs nothing while Redis is away); then exactly one call probes it (half-open;
//! concurrent calls keep failing fast); its success closes the breaker, its failure opens it
//! for another `open_for`.
//!
//! [`Breaker`] is the state machine alone, with the clock passed in, so it is tested without
//! waiting; [`BreakerBackend`] wraps a [`QuotaBackend`]'s acquire and release with it (shared
//! state). A quota refusal is an answer, so it counts as a success. A call whose future is
//! dropped before it ends (a caller's timeout) counts as a failure, so a half-open probe
//! cannot leave the breaker stuck.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use super::metrics::QuotaMetrics;
use super::{AcquireParams, BackendError, QuotaBackend};

/// Whether a call may go to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Closed: call.
    Pass,
    /// The open period is over: this call is the one probe (half-open).
    Probe,
    /// Open, or another call is probing: fail at once.
    FailFast,
}

/// What a transition was, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Closed (or half-open) → open.
    Opened,
    /// Open → half-open: this call is the probe.
    HalfOpened,
    /// Open or half-open → closed.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    consecutive: u32,
    open_until: Option<Instant>,
    probing: bool,
}

/// The breaker's state machine; see the [module documentation](self).
#[derive(Debug)]
pub struct Breaker {
    max_failures: u32,
    open_for: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// A closed breaker (`max_failures` at least 1).
    pub fn new(max_failures: u32, open_for: Duration) -> Self {
        Self { max_failures: max_failures.max(1), open_for, state: Mutex::default() }
    }

    /// Before a call at `now`.
    pub fn before(&self, now: Instant) -> Gate {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.open_until {
            None => Gate::Pass,
            Some(until) if now < until => Gate::FailFast,
            Some(_) if state.probing => Gate::FailFast,
            Some(_) => {
                state.probing = true;
                Gate::Probe
            }
        }
    }

    /// After a call at `now` that succeeded (`ok`) or failed.
    pub fn after(&self, now: Instant, ok: bool) -> Option<Transition> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if ok {
            let was_open = state.open_until.is_some() || state.probing;
            *state = State::default();
            return was_open.then_some(Transition::Closed);
        }
        if state.probing {
            state.probing = false;
            state.consecutive = 0;
            state.open_until = Some(now + self.open_for);
            return Some(Transition::Opened);
        }
        if state.open_until.is_some() {
            // A call that started before the breaker opened; it is open already.
            return None;
        }
        state.consecutive += 1;
        if state.consecutive < self.max_failures {
            return None;
        }
        state.consecutive = 0;
        state.open_until = Some(now + self.open_for);
        Some(Transition::Opened)
    }

    /// How long it stays open.
    pub fn open_for(&self) -> Duration {
        self.open_for
    }
}

/// A [`QuotaBackend`] whose acquire and release go through a [`Breaker`]; listing and cleanup
/// bypass it (maintenance, with their own timeout).
pub struct BreakerBackend<B> {
    inner: B,
    breaker: Arc<Breaker>,
    metrics: Arc<QuotaMetrics>,
    clock: Arc<dyn Fn() -> Instant + Send + Sync>,
}

impl<B> std::fmt::Debug for BreakerBackend<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerBackend").field("breaker", &self.breaker).finish_non_exhaustive()
    }
}

impl<B: QuotaBackend> BreakerBackend<B> {
    /// `inner` behind `breaker`, on the system clock.
    pub fn new(inner: B, breaker: Breaker, metrics: Arc<QuotaMetrics>) -> Self {
        Self { inner, breaker: Arc::new(breaker), metrics, clock: Arc::new(Instant::now) }
    }

    fn record(&self, transition: Option<Transition>) {
        self.metrics.breaker_transition(transition, self.breaker.open_for());
    }

    async fn guarded<T>(
        &self,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match self.breaker.before((self.clock)()) {
            Gate::FailFast => return Err(BackendError::BreakerOpen),
            Gate::Probe => self.record(Some(Transition::HalfOpened)),
            Gate::Pass => {}
        }
        let mut guard = Pending { owner: self, done: false };
        let result = call.await;
        guard.done = true;
        let ok = matches!(result, Ok(_) | Err(BackendError::Exceeded));
        self.record(self.breaker.after((self.clock)(), ok));
        result
    }
}

/// Records a failure when a guarded call is dropped before it ends.
struct Pending<'a, B: QuotaBackend> {
    owner: &'a BreakerBackend<B>,
    done: bool,
}

impl<B: QuotaBackend> Drop for Pending<'_, B> {
    fn drop(&mut self) {
        if !self.done {
            self.owner.record(self.owner.breaker.after((self.owner.clock)(), false));
        }
    }
}

impl<B: QuotaBackend> QuotaBackend for BreakerBackend<B> {
    fn acquire<'a>(&'a self, params: &'a AcquireParams) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.guarded(self.inner.acquire(params)))
    }

    fn release<'a>(
        &'a self,
        user: &'a str,
        lock: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.guarded(self.inner.release(user, lock)))
    }

    fn list_entries<'a>(
        &'a self,
        user: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<String, super::Entry>, BackendError>> {
        self.inner.list_entries(user)
    }

    fn cleanup<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.cleanup(user)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_n_failures_probes_once_then_closes_or_reopens() {
        let t0 = Instant::now();
        let d = Duration::from_secs(30);
        let b = Breaker::new(3, d);
        for _ in 0..2 {
            assert_eq!(b.before(t0), Gate::Pass);
            assert_eq!(b.after(t0, false), None);
        }
        // A success in between resets the count.
        assert_eq!(b.after(t0, true), None);
        for _ in 0..2 {
            assert_eq!(b.after(t0, false), None);
        }
        assert_eq!(b.after(t0, false), Some(Transition::Opened));
        // Open: fail fast until D has passed.
        assert_eq!(b.before(t0), Gate::FailFast);
        assert_eq!(b.before(t0 + d - Duration::from_millis(1)), Gate::FailFast);
        // One probe; concurrent calls keep failing fast.
        assert_eq!(b.before(t0 + d), Gate::Probe);
        assert_eq!(b.before(t0 + d), Gate::FailFast);
        // The probe fails: open for another D.
        assert_eq!(b.after(t0 + d, false), Some(Transition::Opened));
        assert_eq!(b.before(t0 + d + d / 2), Gate::FailFast);
        assert_eq!(b.before(t0 + 2 * d), Gate::Probe);
        // The probe succeeds: closed.
        assert_eq!(b.after(t0 + 2 * d, true), Some(Transition::Closed));
        assert_eq!(b.before(t0 + 2 * d), Gate::Pass);
        assert_eq!(b.after(t0 + 2 * d, false), None, "counting starts over");
    }

    #[test]
    fn late_failures_of_calls_started_before_opening_change_nothing() {
        let t0 = Instant::now();
        let b = Breaker::new(1, Duration::from_secs(1));
        assert_eq!(b.after(t0, false), Some(Transition::Opened));
        assert_eq!(b.after(t0, false), None);
        assert_eq!(b.before(t0), Gate::FailFast);
    }

    struct Flaky(std::sync::atomic::AtomicBool);

    impl QuotaBackend for Flaky {
        fn acquire<'a>(&'a self, _: &'a AcquireParams) -> BoxFuture<'a, Result<(), BackendError>> {
            let up = self.0.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if up {
                    Err(BackendError::Exceeded)
                } else {
                    Err(BackendError::Unavailable("down".into()))
                }
            })
        }
        fn release<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            Box::pin(std::future::pending())
        }
        fn list_entries<'a>(
            &'a self,
            _: &'a str,
        ) -> BoxFuture<'a, Result<HashMap<String, super::super::Entry>, BackendError>> {
            Box::pin(async { Ok(HashMap::new()) })
        }
        fn cleanup<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
            Box::pin(async { Ok(()) })
        }
        fn name(&self) -> &'static str {
            "flaky"
        }
    }

    #[tokio::test]
    async fn the_wrapper_fails_fast_while_open_and_a_refusal_is_a_success() {
        let now = Arc::new(Mutex::new(Instant::now()));
        let clock = {
            let now = Arc::clone(&now);
            Arc::new(move || *now.lock().unwrap()) as Arc<dyn Fn() -> Instant + Send + Sync>
        };
        let metrics = Arc::new(QuotaMetrics::default());
        let backend = BreakerBackend {
            inner: Flaky(std::sync::atomic::AtomicBool::new(false)),
            breaker: Arc::new(Breaker::new(2, Duration::from_secs(30))),
            metrics: Arc::clone(&metrics),
            clock,
        };
        let params = AcquireParams::test("u", "l");
        for _ in 0..2 {
            assert!(matches!(backend.acquire(&params).await, Err(BackendError::Unavailable(_))));
        }
        assert_eq!(backend.acquire(&params).await, Err(BackendError::BreakerOpen));
        assert_eq!(metrics.breaker_count("open"), 1);
        *now.lock().unwrap() += Duration::from_secs(30);
        backend.inner.0.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(backend.acquire(&params).await, Err(BackendError::Exceeded));
        assert_eq!(metrics.breaker_count("half_open"), 1);
        assert_eq!(metrics.breaker_count("closed"), 1);
        // A release dropped by its caller's timeout counts as a failure.
        let dropped =
            tokio::time::timeout(Duration::from_millis(5), backend.release("u", "l")).await;
        assert!(dropped.is_err());
        assert_eq!(backend.breaker.after(*now.lock().unwrap(), false), Some(Transition::Opened));
    }
}
