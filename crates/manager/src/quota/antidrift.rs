//! Keeping the quota's backend true to the store: the event path and the periodic
//! anti-drift pass (the executor of [`super::rules::plan_event`] and
//! [`super::rules::plan_subject`]).
//!
//! # Expected flow
//!
//! 1. [`AntiDrift::spawn`] waits for the index's first list, runs one pass at once, then
//!    marks the quota ready (the embedded ledger is rebuilt: admissions may decide).
//! 2. **Event path.** Whenever a claimed sandbox changes, the index records its (owner, lock)
//!    ([`Index::take_lock_changes`]). For an owner whose key is limited, the sandbox holding
//!    that lock now decides ([`plan_event`]): live ⇒ upsert its entry without enforcing
//!    (a pause leaves `running`, a resume enters it even over the limit: never gated), gone or
//!    not live ⇒ release. An entry already upserted unchanged is not sent again. Each call is
//!    bounded by [`AntiDriftConfig::event_timeout`] (2 s).
//! 3. **Periodic pass**, every [`AntiDriftConfig::interval`] (5 m), bounded by
//!    min(30 s, interval): for every limited key, the entries its live sandboxes should have
//!    against what the backend holds ([`plan_subject`]): missing or stale ⇒ upsert at once;
//!    held without a live sandbox ⇒ released once seen so on two passes at least
//!    [`AntiDriftConfig::grace`] (10 m) apart. A key-store error skips the pass
//!    (`antidrift_skipped_total{reason="key_store_error"}`): never read as "no keys".
//!
//! The periodic pass is the correctness backstop: events lost while Redis was away, creates
//! that failed open, entries a crash left behind all come right within one interval (a leak
//! within interval + grace).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use oka_api::Sandbox;
use tracing::{debug, info, warn};

use super::model::{Entry, QuotaSpec, entry_of, footprint, live, owner_and_lock};
use super::rules::{EventAction, plan_event, plan_subject};
use super::{AcquireParams, Quota};
use crate::index::Index;

/// The keys whose quota is limited (the key store).
pub trait QuotaSubjects: Send + Sync + 'static {
    /// Every limited key: (key ID, quota).
    ///
    /// # Errors
    ///
    /// When the key store cannot be read (the pass is skipped).
    fn limited(&self) -> BoxFuture<'_, Result<Vec<(String, QuotaSpec)>, String>>;

    /// The quota of key `user` as currently known (no store read), if limited.
    fn lookup<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Option<QuotaSpec>>;
}

/// Settings of the anti-drift driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AntiDriftConfig {
    /// Between two periodic passes (`--quota-anti-drift-interval`, 5 m).
    pub interval: Duration,
    /// How long an entry without a live sandbox is kept (`--quota-anti-drift-grace`, 10 m).
    pub grace: Duration,
    /// The longest periodic pass (30 s; at most the interval).
    pub cycle_timeout: Duration,
    /// The bound of one event's backend call (2 s).
    pub event_timeout: Duration,
}

impl Default for AntiDriftConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(300),
            grace: Duration::from_secs(600),
            cycle_timeout: Duration::from_secs(30),
            event_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Default)]
struct DriftState {
    /// Limited keys as of the last pass (and event-path lookups since).
    limited: HashMap<String, QuotaSpec>,
    /// Leak candidates per owner: lock → first seen.
    leaks: HashMap<String, HashMap<String, Instant>>,
    /// The entry last upserted per (owner, lock), so unchanged events cost nothing.
    last: HashMap<(String, String), Entry>,
}

/// The event path and the periodic pass; see the [module documentation](self).
pub struct AntiDrift {
    quota: Arc<Quota>,
    index: Arc<Index>,
    subjects: Arc<dyn QuotaSubjects>,
    config: AntiDriftConfig,
    state: Mutex<DriftState>,
}

impl std::fmt::Debug for AntiDrift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AntiDrift").field("config", &self.config).finish_non_exhaustive()
    }
}

impl AntiDrift {
    /// A driver keeping `quota` true to `index` for the keys of `subjects`.
    pub fn new(
        quota: Arc<Quota>,
        index: Arc<Index>,
        subjects: Arc<dyn QuotaSubjects>,
        config: AntiDriftConfig,
    ) -> Arc<Self> {
        // Start recording lock changes now, so none made before the first pass is missed.
        let _ = index.take_lock_changes();
        Arc::new(Self { quota, index, subjects, config, state: Mutex::default() })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DriftState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the driver until the task is aborted; see the [module documentation](self).
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let driver = Arc::clone(self);
        tokio::spawn(async move {
            driver.index.wait_ready().await;
            driver.run_once().await;
            driver.quota.mark_ready();
            info!(
                backend = driver.quota.backend().name(),
                "quota: ledger checked against the store"
            );
            let mut ticker = tokio::time::interval(driver.config.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = ticker.tick() => driver.run_once().await,
                    () = driver.index.lock_changed() => driver.drain_events().await,
                }
            }
        })
    }

    /// The entry `sandbox` should have (its footprint from its pod template, its own or its
    /// SandboxTemplate's).
    pub fn entry_for(index: &Index, sandbox: &Sandbox) -> Entry {
        let cost = index.with_pod_template(
            sandbox.metadata.namespace.as_deref(),
            sandbox.spec.template.as_ref(),
            sandbox.spec.template_ref.as_ref(),
            footprint,
        );
        entry_of(sandbox, cost)
    }

    async fn limits_of(&self, user: &str) -> Option<QuotaSpec> {
        if let Some(spec) = self.state().limited.get(user).cloned() {
            return Some(spec);
        }
        let spec = self.subjects.lookup(user).await?;
        self.state().limited.insert(user.to_owned(), spec.clone());
        Some(spec)
    }

    /// Applies the lock changes recorded since the last call (the event path).
    pub async fn drain_events(&self) {
        let changes = self.index.take_lock_changes();
        for ((owner, lock), key) in changes {
            let Some(limits) = self.limits_of(&owner).await else { continue };
            let current = self.index.sandbox(&key);
            let view = current.as_deref().and_then(|s| {
                let holder = owner_and_lock(s)?;
                Some((holder, live(s), Self::entry_for(&self.index, s)))
            });
            let slot = (owner.clone(), lock.clone());
            match plan_event(&owner, &lock, view) {
                EventAction::Upsert(entry) => {
                    if self.state().last.get(&slot) == Some(&entry) {
                        continue;
                    }
                    let params = AcquireParams {
                        user: owner.clone(),
                        lock: lock.clone(),
                        entry,
                        enforce: false,
                        limits: Some(limits),
                    };
                    let call = self.quota.backend().acquire(&params);
                    match tokio::time::timeout(self.config.event_timeout, call).await {
                        Ok(Ok(())) => {
                            self.state().last.insert(slot, entry);
                        }
                        _ => self.quota.metrics().antidrift_error("event_acquire"),
                    }
                }
                EventAction::Release => {
                    if !self.index.is_ready() {
                        self.quota.metrics().event_release("skipped_unhealthy");
                        continue;
                    }
                    self.state().last.remove(&slot);
                    let call = self.quota.backend().release(&owner, &lock);
                    match tokio::time::timeout(self.config.event_timeout, call).await {
                        Ok(Ok(())) => self.quota.metrics().event_release("released"),
                        _ => {
                            self.quota.metrics().antidrift_error("event_release");
                            self.quota.metrics().event_release("error");
                        }
                    }
                }
            }
        }
    }

    /// One periodic pass over every limited key, bounded by min(cycle timeout, interval).
    pub async fn run_once(&self) {
        let bound = self.config.cycle_timeout.min(self.config.interval);
        if tokio::time::timeout(bound, self.pass()).await.is_err() {
            warn!(?bound, "quota anti-drift pass did not finish in time");
        }
    }

    async fn pass(&self) {
        if !self.index.is_ready() {
            self.quota.metrics().antidrift_skip("not_ready");
            return;
        }
        let subjects = match self.subjects.limited().await {
            Ok(subjects) => subjects,
            Err(error) => {
                warn!(%error, "quota anti-drift: cannot list the keys; pass skipped");
                self.quota.metrics().antidrift_skip("key_store_error");
                self.state().leaks.clear();
                return;
            }
        };
        {
            let mut state = self.state();
            state.limited = subjects.iter().cloned().collect();
            let limited = &state.limited;
            let keep: Vec<String> =
                state.leaks.keys().filter(|u| limited.contains_key(*u)).cloned().collect();
            state.leaks.retain(|u, _| keep.contains(u));
            let limited = state.limited.clone();
            state.last.retain(|(owner, _), _| limited.contains_key(owner));
        }
        // The live sandboxes of the limited keys, by owner then lock.
        let mut live_by_owner: HashMap<String, HashMap<String, Entry>> = HashMap::new();
        for sandbox in self.index.sandboxes() {
            let Some((owner, lock)) = owner_and_lock(&sandbox) else { continue };
            if !live(&sandbox) || !subjects.iter().any(|(u, _)| u == owner) {
                continue;
            }
            let entry = Self::entry_for(&self.index, &sandbox);
            live_by_owner.entry(owner.to_owned()).or_default().insert(lock.to_owned(), entry);
        }
        let now = Instant::now();
        for (user, limits) in &subjects {
            let stored = match self.quota.backend().list_entries(user).await {
                Ok(stored) => stored,
                Err(error) => {
                    debug!(%user, %error, "quota anti-drift: cannot list entries");
                    self.quota.metrics().antidrift_error("list_entries");
                    self.state().leaks.remove(user);
                    continue;
                }
            };
            let live = live_by_owner.remove(user).unwrap_or_default();
            let seen = self.state().leaks.get(user).cloned().unwrap_or_default();
            let healthy = self.index.is_ready();
            let plan = plan_subject(&live, &stored, &seen, now, self.config.grace, healthy);
            for (lock, entry) in plan.upserts {
                let params = AcquireParams {
                    user: user.clone(),
                    lock: lock.clone(),
                    entry,
                    enforce: false,
                    limits: Some(limits.clone()),
                };
                match self.quota.backend().acquire(&params).await {
                    Ok(()) => {
                        self.state().last.insert((user.clone(), lock), entry);
                    }
                    Err(error) => {
                        debug!(%user, %error, "quota anti-drift: repair failed");
                        self.quota.metrics().antidrift_error("acquire");
                    }
                }
            }
            let mut leaks = plan.leaks;
            for lock in plan.releases {
                match self.quota.backend().release(user, &lock).await {
                    Ok(()) => {
                        info!(%user, %lock, "quota anti-drift: released an entry no live sandbox holds");
                    }
                    Err(_) => {
                        self.quota.metrics().antidrift_error("release");
                        if let Some(first) = seen.get(&lock) {
                            leaks.insert(lock, *first);
                        }
                    }
                }
            }
            self.state().leaks.insert(user.clone(), leaks);
        }
    }
}
