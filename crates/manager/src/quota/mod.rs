//! Per-API-key quota: how many sandboxes, CPU and memory a key's sandboxes may hold, over all
//! of them or over the running ones, enforced when a create takes a sandbox (pool claim,
//! create-on-no-stock, snapshot clone, fork) and released when one ends.
//!
//! # Where each rule lives
//!
//! | rule | where |
//! |---|---|
//! | the quota's shape and validation (400 at key create), a sandbox's footprint, live and running, the wire JSON | [`model`] (pure) |
//! | acquire/release arithmetic (the Lua scripts' rules), event and anti-drift decisions | [`rules`] (pure) |
//! | the circuit breaker (3 failures ⇒ open 30 s ⇒ one probe) | [`breaker`] (pure state machine + wrapper) |
//! | the embedded ledger (`oka serve` without Redis) | [`local`] |
//! | the Redis key model and Lua scripts, byte for byte the reference's | [`redis`] |
//! | the event path and the periodic anti-drift pass | [`antidrift`] |
//! | metrics (§5.8 families) | [`metrics`] |
//! | admission: unlimited ⇒ no IO; refusal ⇒ 403; backend error ⇒ fail open | [`Quota::acquire`], called by the claim engine between choosing a sandbox and writing it ([`crate::claim`], [`crate::create`]) |
//! | release after an accepted kill (owner = caller, lock set, 250 ms, detached) | `api/sandboxes.rs` (`kill`) |
//! | release of a charge whose write provably did not happen (conflict, refused create) | [`crate::claim`], [`crate::create`] |
//! | pause, resume, deletion by timeout or kubectl: the event path (enforce off; resume is never gated) | [`antidrift`] |
//! | `QuotaExceeded: api-key quota exceeded` (403) | [`QuotaError::Exceeded`] → `ClaimError::Quota` → `ApiError::Forbidden` |
//!
//! # Backends
//!
//! One small trait, [`QuotaBackend`]: acquire (an idempotent upsert of one sandbox's entry,
//! enforcing or not), release, list an owner's entries, clean an owner up.
//!
//! - No Redis configured (`oka serve` on one machine): [`local::LocalBackend`], an in-memory
//!   ledger rebuilt from the embedded store's live sandboxes by the first anti-drift pass at
//!   start; no admission decision is taken before that pass, so a `kill -9` neither loses nor
//!   leaks counts.
//! - Redis configured (`--quota-redis-addr`): [`redis::RedisBackend`] behind
//!   [`breaker::BreakerBackend`]. Every backend failure (transport, timeout, unexpected reply,
//!   breaker open) **fails open**: the create is allowed, a `warn!` is logged (at most every
//!   10 s) and `acquire_total{result="fail_open"}` counts it; the anti-drift pass repairs the
//!   sums once Redis answers again.
//!
//! # Where oka differs from the reference, and why
//!
//! - Without Redis the reference does not enforce quotas at all (its no-op backend); oka
//!   enforces them with the embedded ledger, because `oka serve` is one process and needs no
//!   shared counter to be exact.
//! - Leadership: the reference runs anti-drift on the Lease-elected primary only. `oka serve`
//!   is always its own primary; several managers sharing one Redis each run it, which the
//!   idempotent scripts and the grace period make safe (a second manager's leak release of an
//!   entry whose sandbox it has not seen yet waits for the grace period, as the primary's
//!   does).
//! - The event path reads the manager's index (fed by the store's watch) instead of an
//!   informer; a relist marks every sandbox it replaced as changed, so no tombstone is needed
//!   (`sandboxcr_quota_source_event_drop_total` is registered but stays 0).
//! - A fork (oka extension) is admitted like a clone, one charge per new sandbox.

pub mod antidrift;
pub mod breaker;
pub mod local;
pub mod metrics;
pub mod model;
pub mod redis;
pub mod rules;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::watch;
use tracing::{debug, warn};

pub use self::antidrift::{AntiDrift, AntiDriftConfig, QuotaSubjects};
pub use self::metrics::QuotaMetrics;
pub use self::model::{Dimension, Entry, InvalidQuota, QuotaLimit, QuotaSpec, Scope};

/// The refusal message (the reference's, word for word).
pub const QUOTA_EXCEEDED: &str = "QuotaExceeded: api-key quota exceeded";
/// How long a release after a kill may take (the reference's 250 ms).
pub const RELEASE_BOUND: Duration = Duration::from_millis(250);
/// How long an admission waits for the embedded ledger's first rebuild at start.
pub const READY_WAIT: Duration = Duration::from_secs(10);
/// The shortest time between two fail-open warnings.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// One acquire: upsert `entry` as `lock` of `user`; with `enforce`, refuse when a limited sum
/// would go over its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireParams {
    /// The owner (API key ID).
    pub user: String,
    /// The sandbox's lock string.
    pub lock: String,
    /// What the sandbox costs.
    pub entry: Entry,
    /// Whether to refuse over the limits (admission) or not (repairs, pause, resume).
    pub enforce: bool,
    /// The owner's limits.
    pub limits: Option<QuotaSpec>,
}

#[cfg(test)]
impl AcquireParams {
    fn test(user: &str, lock: &str) -> Self {
        Self {
            user: user.into(),
            lock: lock.into(),
            entry: Entry::default(),
            enforce: true,
            limits: None,
        }
    }
}

/// Why a backend call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The limits refuse it (an answer, not a failure).
    #[error("quota exceeded")]
    Exceeded,
    /// The circuit breaker is open: Redis was not called.
    #[error("quota backend unavailable: circuit breaker open")]
    BreakerOpen,
    /// The backend failed (transport, timeout, unexpected reply).
    #[error("quota backend unavailable: {0}")]
    Unavailable(String),
}

/// Where quota state is kept; see the [module documentation](self).
pub trait QuotaBackend: Send + Sync + 'static {
    /// Upserts one entry (idempotent); [`BackendError::Exceeded`] when enforcing refuses.
    fn acquire<'a>(&'a self, params: &'a AcquireParams) -> BoxFuture<'a, Result<(), BackendError>>;
    /// Removes one entry and its amounts (idempotent).
    fn release<'a>(
        &'a self,
        user: &'a str,
        lock: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>>;
    /// Every entry of `user`, by lock.
    fn list_entries<'a>(
        &'a self,
        user: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<String, Entry>, BackendError>>;
    /// Removes everything of `user` (its key was deleted).
    fn cleanup<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<(), BackendError>>;
    /// `embedded` or `redis`, for logs.
    fn name(&self) -> &'static str;
}

/// Why an admission failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// The key's quota refuses the sandbox: 403.
    #[error("{QUOTA_EXCEEDED}")]
    Exceeded,
    /// A limited key's admission without an owner or a lock (a bug; never failed open).
    #[error("quota acquire missing identity: user={user:?} lockString={lock:?}")]
    MissingIdentity {
        /// The owner given.
        user: String,
        /// The lock given.
        lock: String,
    },
}

/// The Redis settings of `oka serve` (`--quota-redis-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failures that open the breaker (3).
    pub max_failures: u32,
    /// How long it stays open (30 s).
    pub open_for: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self { max_failures: 3, open_for: Duration::from_secs(30) }
    }
}

/// The quota as the manager uses it: admission, release, cleanup, over one backend; see the
/// [module documentation](self).
pub struct Quota {
    backend: Arc<dyn QuotaBackend>,
    metrics: Arc<QuotaMetrics>,
    ready: watch::Sender<bool>,
    last_warn: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quota").field("backend", &self.backend.name()).finish_non_exhaustive()
    }
}

impl Quota {
    /// A quota over `backend`; `ready`: admissions need not wait for a first anti-drift pass.
    pub fn new(backend: Arc<dyn QuotaBackend>, metrics: Arc<QuotaMetrics>, ready: bool) -> Self {
        Self { backend, metrics, ready: watch::Sender::new(ready), last_warn: Mutex::new(None) }
    }

    /// The embedded ledger, ready once the anti-drift driver's first pass has rebuilt it.
    pub fn local(metrics: Arc<QuotaMetrics>) -> Self {
        Self::new(Arc::new(local::LocalBackend::new()), metrics, false)
    }

    /// Redis behind the circuit breaker.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when the address is not `host:port`.
    pub fn redis(
        config: redis::RedisConfig,
        breaker: &BreakerSettings,
        metrics: Arc<QuotaMetrics>,
    ) -> Result<Self, BackendError> {
        let backend = redis::RedisBackend::new(config, Arc::clone(&metrics))?;
        let guarded = breaker::BreakerBackend::new(
            backend,
            breaker::Breaker::new(breaker.max_failures, breaker.open_for),
            Arc::clone(&metrics),
        );
        Ok(Self::new(Arc::new(guarded), metrics, true))
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn QuotaBackend> {
        &self.backend
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<QuotaMetrics> {
        &self.metrics
    }

    /// Admissions may go ahead (the anti-drift driver's first pass is done).
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }

    /// Whether admissions go ahead without waiting.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        if tokio::time::timeout(READY_WAIT, ready.wait_for(|r| *r)).await.is_err() {
            warn!("quota: the ledger is not rebuilt yet; admitting on what it holds");
        }
    }

    /// Admits the sandbox `lock` of `user` costing `entry` under `quota`: `Ok` for an
    /// unlimited key (no backend call), when it fits, and when the backend fails (fail open).
    ///
    /// # Errors
    ///
    /// [`QuotaError::Exceeded`] when a limit refuses it, [`QuotaError::MissingIdentity`] for a
    /// limited key without owner or lock.
    pub async fn acquire(
        &self,
        user: &str,
        quota: Option<&QuotaSpec>,
        lock: &str,
        entry: Entry,
    ) -> Result<(), QuotaError> {
        let Some(quota) = quota.filter(|q| !q.limits.is_empty()) else {
            self.metrics.acquired("unlimited");
            return Ok(());
        };
        if user.is_empty() || lock.is_empty() {
            self.metrics.acquired("error");
            return Err(QuotaError::MissingIdentity { user: user.into(), lock: lock.into() });
        }
        if !self.is_ready() {
            self.wait_ready().await;
        }
        let params = AcquireParams {
            user: user.into(),
            lock: lock.into(),
            entry,
            enforce: true,
            limits: Some(quota.clone()),
        };
        match self.backend.acquire(&params).await {
            Ok(()) => {
                self.metrics.acquired("allowed");
                Ok(())
            }
            Err(BackendError::Exceeded) => {
                self.metrics.acquired("rejected");
                debug!(user, "quota exceeded");
                Err(QuotaError::Exceeded)
            }
            Err(error) => {
                self.metrics.backend_error("acquire");
                self.metrics.acquired("fail_open");
                self.warn_fail_open(user, &error);
                Ok(())
            }
        }
    }

    fn warn_fail_open(&self, user: &str, error: &BackendError) {
        let mut last = self.last_warn.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *last = Some(Instant::now());
            warn!(user, %error, backend = self.backend.name(), "quota acquire failed; failing open (allowed) until the backend answers again");
        }
    }

    /// Releases `lock` of `user`; whether it was released.
    pub async fn release(&self, user: &str, lock: &str) -> bool {
        if user.is_empty() || lock.is_empty() {
            self.metrics.released("skipped");
            return true;
        }
        match self.backend.release(user, lock).await {
            Ok(()) => {
                self.metrics.released("released");
                true
            }
            Err(error) => {
                self.metrics.backend_error("release");
                self.metrics.released("error");
                warn!(user, %error, "quota release failed; anti-drift will repair it");
                false
            }
        }
    }

    /// Releases `lock` of `user` on a task of its own (a cancelled request does not cancel
    /// it), bounded by `bound`; resolves when it is done or the bound has passed.
    pub async fn release_detached(self: &Arc<Self>, user: &str, lock: &str, bound: Duration) {
        let quota = Arc::clone(self);
        let (user, lock) = (user.to_owned(), lock.to_owned());
        let task = tokio::spawn(async move {
            if tokio::time::timeout(bound, quota.release(&user, &lock)).await.is_err() {
                quota.metrics.released("error");
                warn!(%user, "quota release timed out; anti-drift will repair it");
            }
        });
        let _ = task.await;
    }

    /// Removes what the backend holds of a deleted key, in the background (best effort, 10 s,
    /// retried with a 100 ms to 500 ms backoff); never undoes the deletion.
    pub fn cleanup_in_background(self: &Arc<Self>, user: &str) {
        let quota = Arc::clone(self);
        let user = user.to_owned();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut backoff = Duration::from_millis(100);
            loop {
                match quota.backend.cleanup(&user).await {
                    Ok(()) => return,
                    Err(error) => {
                        quota.metrics.backend_error("cleanup");
                        if Instant::now() + backoff >= deadline {
                            warn!(%user, %error, "quota cleanup of a deleted key failed");
                            return;
                        }
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        });
    }
}
