//! The planner/executor shape shared by every controller: [`Plan`], and the [`Clock`] that
//! executors read `now` from so planners never do.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use oka_cache::Action;

/// What a pure `plan_*` function decided: the writes to make, in order, and when to look
/// again if nothing changes before.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<A> {
    /// The writes, in the order the executor applies them. Each must be idempotent.
    pub actions: Vec<A>,
    /// Look again after this long even if nothing changes (`None`: wait for a change).
    pub requeue_after: Option<Duration>,
}

impl<A> Default for Plan<A> {
    fn default() -> Self {
        Self { actions: Vec::new(), requeue_after: None }
    }
}

impl<A> Plan<A> {
    /// Nothing to do, nothing to wait for.
    pub fn nothing() -> Self {
        Self::default()
    }

    /// This plan with `action` appended.
    pub fn with(mut self, action: A) -> Self {
        self.actions.push(action);
        self
    }

    /// This plan, looking again after `duration` (the earlier one wins if already set).
    pub fn requeue_after(mut self, duration: Duration) -> Self {
        self.requeue_after = Some(self.requeue_after.map_or(duration, |d| d.min(duration)));
        self
    }

    /// The runtime's next step once the actions are applied.
    pub fn next_action(&self) -> Action {
        self.requeue_after.map_or_else(Action::await_change, Action::requeue_after)
    }
}

/// Where executors read the wall-clock time that planners take as `now`.
///
/// Passed in through a controller's context, never global, so tests choose the time.
#[derive(Clone)]
pub struct Clock {
    now: Arc<dyn Fn() -> Timestamp + Send + Sync>,
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Clock").field("now", &self.now()).finish()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Self {
        Self::from_fn(Timestamp::now)
    }

    /// A clock that reads `now` from a function.
    pub fn from_fn(now: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self { now: Arc::new(now) }
    }

    /// A clock that starts at `start` and advances with `tokio::time`, so it follows
    /// `tokio::time::pause()` and `advance()` in tests (and real time otherwise).
    pub fn tokio(start: Timestamp) -> Self {
        let origin = tokio::time::Instant::now();
        Self::from_fn(move || {
            let elapsed = origin.elapsed();
            // A span of more than ~500 years cannot elapse in a test.
            let elapsed =
                jiff::SignedDuration::try_from(elapsed).unwrap_or(jiff::SignedDuration::MAX);
            start.checked_add(elapsed).unwrap_or(Timestamp::MAX)
        })
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        (self.now)()
    }
}

/// `now` truncated to whole seconds, as a Kubernetes `Time` serializes it, so a status read
/// back equals the one planned.
pub(crate) fn whole_seconds(
    now: Timestamp,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::from_second(now.as_second()).unwrap_or(now),
    )
}

/// The time from `now` until `deadline`, zero when it has passed.
pub(crate) fn until(now: Timestamp, deadline: Timestamp) -> Duration {
    let left = deadline.duration_since(now);
    if left.is_negative() { Duration::ZERO } else { left.unsigned_abs() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earlier_requeue_of_a_plan_wins() {
        let plan: Plan<()> = Plan::nothing()
            .requeue_after(Duration::from_secs(10))
            .requeue_after(Duration::from_secs(3))
            .requeue_after(Duration::from_secs(7));
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(3)));
        assert_eq!(plan.next_action(), Action::requeue_after(Duration::from_secs(3)));
        assert!(Plan::<()>::nothing().next_action().is_await_change());
    }

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_paused_time() {
        let start = Timestamp::from_second(1_000).unwrap();
        let clock = Clock::tokio(start);
        assert_eq!(clock.now(), start);
        tokio::time::advance(Duration::from_millis(5_500)).await;
        assert_eq!(clock.now(), Timestamp::from_millisecond(1_005_500).unwrap());
    }
}
