//! The elector: acquires, renews, loses and releases the Lease (see the crate documentation
//! for the rules).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use oka_store::{Store, StoreError};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::config::random_u64;
use crate::{ElectionConfig, ElectionError};

/// How often, at most, a standby logs who holds the Lease when the holder has not changed.
const STANDBY_LOG_EVERY: Duration = Duration::from_secs(60);

/// Where a leader stands, as [`Leadership`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderState {
    /// This replica leads and renews the Lease.
    Leading,
    /// Shutdown started: stop leader work; the Lease is released once `lead`'s future ends
    /// (and renewed until then).
    ShuttingDown,
    /// Leadership is lost: stop leader work at once. The Lease is never written again.
    Lost,
}

/// What `lead` is given: tells the leader work when to stop.
#[derive(Debug, Clone)]
pub struct Leadership {
    state: watch::Receiver<LeaderState>,
    identity: Arc<str>,
}

impl Leadership {
    /// Resolves when this replica must stop its leader work: leadership was lost, or
    /// shutdown started (also when the elector itself was dropped, since nobody renews then).
    pub async fn lost(&self) {
        let mut state = self.state.clone();
        // An error means the elector is gone: nobody renews, so stop as for a loss.
        let _ = state.wait_for(|s| *s != LeaderState::Leading).await;
    }

    /// The state now.
    pub fn state(&self) -> LeaderState {
        *self.state.borrow()
    }

    /// This replica's identity, as written in the Lease's `holderIdentity`.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// How an election ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// Shutdown came while standing by: `lead` was never called.
    NeverLed,
    /// Leadership was lost while leading; `lead`'s future has ended with this value. The
    /// caller should exit non-zero: it can no longer know that it was the only leader.
    Lost(T),
    /// Shutdown came while leading; `lead`'s future ended with this value, then the Lease was
    /// released (when the release write failed, it expires as if the replica had died).
    Released(T),
    /// `lead`'s future ended by itself while leading, with this value; the Lease was released.
    Finished(T),
}

impl<T> Outcome<T> {
    /// True for [`Outcome::Lost`]: the caller should exit non-zero.
    pub fn is_lost(&self) -> bool {
        matches!(self, Outcome::Lost(_))
    }

    /// `lead`'s value, when it was called.
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::NeverLed => None,
            Outcome::Lost(t) | Outcome::Released(t) | Outcome::Finished(t) => Some(t),
        }
    }
}

/// What one look at the Lease found.
enum Attempt {
    /// This replica holds the Lease now (created, taken or renewed).
    Held,
    /// Another replica holds it, and it has not expired by this replica's observation.
    HeldBy(String),
}

/// Why a leader stopped holding the Lease.
enum Loss {
    /// No renewal succeeded for the renew deadline.
    Deadline,
    /// Another replica holds the Lease.
    TakenBy(String),
}

/// One replica's candidacy for one Lease. [`Elector::run`] is the election.
#[derive(Debug)]
pub struct Elector<S> {
    store: S,
    config: ElectionConfig,
    is_leader: watch::Sender<bool>,
    /// The Lease as last read or written, for the release's compare-and-swap.
    lease: Option<Lease>,
    /// The Lease's record as last observed, and when (this replica's monotonic clock) it was
    /// first seen with that value.
    observed: Option<(LeaseSpec, Instant)>,
    /// The holder last logged while standing by, and when.
    logged_holder: Option<(String, Instant)>,
}

impl<S: Store> Elector<S> {
    /// A candidate for `config`'s Lease in `store`.
    ///
    /// # Errors
    ///
    /// When `config` breaks a timing rule ([`ElectionConfig::validate`]).
    pub fn new(store: S, config: ElectionConfig) -> Result<Self, ElectionError> {
        config.validate()?;
        Ok(Elector {
            store,
            config,
            is_leader: watch::Sender::new(false),
            lease: None,
            observed: None,
            logged_holder: None,
        })
    }

    /// Whether this replica leads now: true from acquiring the Lease until leadership is
    /// lost or `lead`'s future has ended. For a `leader_election_master_status` gauge and a
    /// readiness check.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.is_leader.subscribe()
    }

    /// Runs the election; see [`crate::run_leader_elected`].
    ///
    /// # Errors
    ///
    /// [`ElectionError::Store`] when the store refuses the Lease as malformed.
    pub async fn run<F, Fut, T>(
        mut self,
        shutdown: impl Future<Output = ()>,
        lead: F,
    ) -> Result<Outcome<T>, ElectionError>
    where
        F: FnOnce(Leadership) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut shutdown = pin!(shutdown);
        let Some(acquired_at) = self.acquire(shutdown.as_mut()).await? else {
            return Ok(Outcome::NeverLed);
        };
        tracing::info!(
            lease = %self.lease_name(),
            identity = %self.config.identity,
            transitions = self.transitions(),
            "acquired the lease: leading"
        );
        self.is_leader.send_replace(true);

        let (state, state_rx) = watch::channel(LeaderState::Leading);
        let leadership =
            Leadership { state: state_rx, identity: Arc::from(self.config.identity.as_str()) };
        let mut work = pin!(lead(leadership));
        let mut shutting_down = false;
        let lease_name = self.lease_name();
        let ended = {
            let mut hold = pin!(self.hold(acquired_at));
            loop {
                tokio::select! {
                    value = &mut work => break Ok(value),
                    loss = &mut hold => break Err(loss),
                    () = &mut shutdown, if !shutting_down => {
                        shutting_down = true;
                        state.send_replace(LeaderState::ShuttingDown);
                        tracing::info!(
                            lease = %lease_name,
                            "shutting down: the lease is released once leader work stops"
                        );
                    }
                }
            }
        };
        match ended {
            Ok(value) => {
                self.is_leader.send_replace(false);
                self.release().await;
                Ok(if shutting_down { Outcome::Released(value) } else { Outcome::Finished(value) })
            }
            Err(loss) => {
                self.is_leader.send_replace(false);
                state.send_replace(LeaderState::Lost);
                match loss {
                    Loss::Deadline => tracing::error!(
                        lease = %self.lease_name(),
                        renew_deadline = ?self.config.renew_deadline,
                        "leadership lost: no renewal succeeded within the renew deadline"
                    ),
                    Loss::TakenBy(holder) => tracing::error!(
                        lease = %self.lease_name(),
                        %holder,
                        "leadership lost: another replica holds the lease"
                    ),
                }
                Ok(Outcome::Lost(work.await))
            }
        }
    }

    /// Tries every retry period (jittered) until this replica holds the Lease, and returns
    /// when the successful attempt started; `None` when `shutdown` came first.
    async fn acquire(
        &mut self,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Instant>, ElectionError> {
        loop {
            let started = Instant::now();
            let attempt = tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(None),
                attempt = self.try_acquire_or_renew() => attempt,
            };
            match attempt {
                Ok(Attempt::Held) => return Ok(Some(started)),
                Ok(Attempt::HeldBy(holder)) => self.log_standby(holder),
                Err(StoreError::Invalid(message)) => {
                    return Err(ElectionError::Store(StoreError::Invalid(message)));
                }
                Err(e @ (StoreError::Conflict { .. } | StoreError::AlreadyExists { .. })) => {
                    tracing::debug!(
                        lease = %self.lease_name(), error = %e,
                        "another replica wrote the lease first; retrying"
                    );
                }
                Err(e) => tracing::warn!(
                    lease = %self.lease_name(), error = %e,
                    "cannot read or write the lease; retrying"
                ),
            }
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(None),
                () = sleep(jittered(self.config.retry_period)) => {}
            }
        }
    }

    /// Renews every retry period while leading; returns when leadership is lost. Dropping it
    /// stops renewing.
    async fn hold(&mut self, mut last_renewed: Instant) -> Loss {
        let (retry_period, renew_deadline) = (self.config.retry_period, self.config.renew_deadline);
        let mut next = last_renewed + retry_period;
        loop {
            // Counted from the start of the last successful renewal: a standby saw that
            // renewal after it started, so it waits at least until then + lease_duration.
            let deadline = last_renewed + renew_deadline;
            tokio::select! {
                biased;
                () = sleep_until(deadline) => return Loss::Deadline,
                () = sleep_until(next) => {}
            }
            let started = Instant::now();
            next = started + retry_period;
            // A renewal that hangs must not hold the loss back.
            let attempt = tokio::select! {
                biased;
                () = sleep_until(deadline) => return Loss::Deadline,
                attempt = self.try_acquire_or_renew() => attempt,
            };
            match attempt {
                Ok(Attempt::Held) => {
                    last_renewed = started;
                    tracing::trace!(lease = %self.lease_name(), "renewed the lease");
                }
                Ok(Attempt::HeldBy(holder)) => return Loss::TakenBy(holder),
                Err(e) => tracing::warn!(
                    lease = %self.lease_name(), error = %e,
                    remaining = ?deadline.saturating_duration_since(Instant::now()),
                    "renewing the lease failed; retrying until the renew deadline"
                ),
            }
        }
    }

    /// One look at the Lease, client-go's `tryAcquireOrRenew`: create it when missing; renew
    /// it when this replica holds it; take it when nobody holds it or its observed time plus
    /// its duration has passed; otherwise report its holder.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, StoreError> {
        let (namespace, name) = (self.config.namespace.clone(), self.config.name.clone());
        let current = match self.store.get::<Lease>(&namespace, &name).await {
            Ok(lease) => lease,
            Err(e) if e.is_not_found() => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(name), ..ObjectMeta::default() },
                    spec: Some(self.record(None)),
                };
                let created = self.store.create(&namespace, &lease).await?;
                self.observe(created);
                return Ok(Attempt::Held);
            }
            Err(e) => return Err(e),
        };
        self.observe(current.clone());
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if !holder.is_empty() && holder != self.config.identity && !self.observed_expired(&spec) {
            return Ok(Attempt::HeldBy(holder));
        }
        let mut next = current;
        next.spec = Some(self.record(Some(&spec)));
        // `next` keeps the resourceVersion just read: a compare-and-swap.
        let written = self.store.update(&namespace, &next).await?;
        self.observe(written);
        Ok(Attempt::Held)
    }

    /// Whether the Lease whose record is `spec` has expired by this replica's observation.
    fn observed_expired(&self, spec: &LeaseSpec) -> bool {
        let Some((_, seen_at)) = &self.observed else { return false };
        let duration = spec.lease_duration_seconds.map_or(self.config.lease_duration, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        });
        Instant::now() >= *seen_at + duration
    }

    /// Records `lease` as the last one seen, restarting the observed time when its record
    /// changed.
    fn observe(&mut self, lease: Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        let changed = self.observed.as_ref().is_none_or(|(seen, _)| *seen != spec);
        if changed {
            self.observed = Some((spec, Instant::now()));
        }
        self.lease = Some(lease);
    }

    /// The record this replica writes to hold the Lease, over the current one (`None` when
    /// creating it).
    fn record(&self, current: Option<&LeaseSpec>) -> LeaseSpec {
        let now = micro_now();
        let mine = current
            .is_some_and(|c| c.holder_identity.as_deref() == Some(self.config.identity.as_str()));
        let (acquire_time, transitions) = match current {
            Some(c) if mine => {
                (c.acquire_time.clone().unwrap_or(now.clone()), c.lease_transitions.unwrap_or(0))
            }
            Some(c) => (now.clone(), c.lease_transitions.unwrap_or(0).saturating_add(1)),
            None => (now.clone(), 0),
        };
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: self.config.lease_duration_seconds(),
            acquire_time: Some(acquire_time),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..current.cloned().unwrap_or_default()
        }
    }

    /// Writes the Lease free (empty holder, one-second duration, transitions kept) so a
    /// standby takes it at its next retry. Bounded by the renew deadline; on failure the
    /// Lease simply expires.
    async fn release(&mut self) {
        let name = self.lease_name();
        let released = tokio::time::timeout(self.config.renew_deadline, self.try_release()).await;
        match released {
            Ok(Ok(true)) => tracing::info!(
                lease = %name, transitions = self.transitions(),
                "released the lease"
            ),
            Ok(Ok(false)) => tracing::info!(
                lease = %name,
                "the lease is no longer ours: nothing to release"
            ),
            Ok(Err(e)) => tracing::warn!(
                lease = %name, error = %e,
                "could not release the lease: a standby takes over when it expires"
            ),
            Err(_) => tracing::warn!(
                lease = %name,
                "releasing the lease timed out: a standby takes over when it expires"
            ),
        }
    }

    /// The release's compare-and-swap, retried when the Lease changed but is still ours
    /// (a renewal dropped in flight may have landed). False when it is not ours.
    async fn try_release(&mut self) -> Result<bool, StoreError> {
        let namespace = self.config.namespace.clone();
        for _ in 0..3 {
            let Some(lease) = self.lease.clone() else { return Ok(false) };
            let Some(spec) = lease.spec.clone() else { return Ok(false) };
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            let now = micro_now();
            let mut free = lease;
            free.spec = Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..spec
            });
            match self.store.update(&namespace, &free).await {
                Ok(written) => {
                    self.observe(written);
                    return Ok(true);
                }
                Err(e) if e.is_conflict() => {
                    let current = self.store.get::<Lease>(&namespace, &self.config.name).await?;
                    self.lease = Some(current);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Logs who holds the Lease while standing by: when the holder changes, and at most once
    /// a minute otherwise.
    fn log_standby(&mut self, holder: String) {
        let now = Instant::now();
        let due = self.logged_holder.as_ref().is_none_or(|(logged, at)| {
            *logged != holder || now.saturating_duration_since(*at) >= STANDBY_LOG_EVERY
        });
        if due {
            tracing::debug!(
                lease = %self.lease_name(), %holder,
                "the lease is held by another replica: standing by"
            );
            self.logged_holder = Some((holder, now));
        }
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn transitions(&self) -> i32 {
        self.observed.as_ref().and_then(|(spec, _)| spec.lease_transitions).unwrap_or(0)
    }
}

/// Now, to the microsecond a `MicroTime` keeps, so a record read back equals the one written.
fn micro_now() -> MicroTime {
    let now = Timestamp::now();
    MicroTime(Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now))
}

/// `period` stretched by up to 20 %, so standbys that started together do not retry in step
/// (client-go's jitter factor 1.2).
fn jittered(period: Duration) -> Duration {
    // 53 random bits as a fraction in [0, 1).
    let fraction = (random_u64() >> 11) as f64 / (1u64 << 53) as f64;
    period.mul_f64(1.0 + 0.2 * fraction)
}
