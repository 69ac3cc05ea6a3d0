//! The manager's in-memory index of Sandboxes, SandboxSets and SandboxTemplates: three
//! `oka-cache` caches, each filled by its informer (list, then watch; relist on `Gone`), with
//! the claim engine's lookups as secondary indexes of the Sandbox cache.
//!
//! # Expected flow
//!
//! 1. [`Index::spawn`] follows one informer per kind (the process's shared ones, when given
//!    its `oka_cache::Informers`). Each lists every object of its kind into its cache, then
//!    watches from the list's resourceVersion and applies each event.
//! 2. The Sandbox cache files every sandbox in its indexes: [`POOLS`] (the claim candidates of
//!    each pool), [`IDS`] (claimed sandboxes by public ID), [`IDEMPOTENCY`] (claimed sandboxes
//!    by owner and `Idempotency-Key`), [`OWNERS`] (sandboxes by namespace and owner).
//! 3. The manager's own writes are applied at once ([`Index::apply_sandbox`],
//!    [`Index::forget_sandbox`]) so a caller reads its own writes without waiting for the
//!    watch: a claim never picks the sandbox the previous claim just took.
//!
//! # Guarantees
//!
//! - The secondary indexes always agree with the sandboxes: the cache changes both under one
//!   lock.
//! - An object is never replaced by an older version of itself, and a sandbox the manager
//!   deleted stays gone until the watch reports something newer than the version deleted
//!   (the cache's rules, `oka_cache::cache`).
//!
//! # Caveats
//!
//! - The index lags the store. The claim engine never trusts it for correctness: every claim is
//!   a compare-and-swap on the resourceVersion it read here.
//! - On Kubernetes, resourceVersions are opaque; there the newest-wins rule degrades to
//!   last-writer-wins between the watch and the manager's own writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use oka_api::{Sandbox, SandboxSet, SandboxTemplate, labels};
use oka_cache::{Cache, Change, Informers, WatchConfig};
use oka_store::Store;
use tokio::sync::watch;

pub use oka_cache::ObjectKey;

/// The Sandbox cache's index of claim candidates, by pool ([`pool_value`]).
pub const POOLS: &str = "manager/pools";
/// The Sandbox cache's index of claimed sandboxes, by public ID ([`sandbox_id`]).
pub const IDS: &str = "manager/ids";
/// The Sandbox cache's index of claimed sandboxes created with an `Idempotency-Key`, by
/// [`idempotency_value`].
pub const IDEMPOTENCY: &str = "manager/idempotency";
/// The Sandbox cache's index of sandboxes by namespace and owner (annotation
/// `agents.kruise.io/owner`), by [`owner_value`].
pub const OWNERS: &str = "manager/owners";

/// The [`POOLS`] value of pool `namespace/set`.
pub fn pool_value(namespace: &str, set: &str) -> String {
    format!("{namespace}/{set}")
}

/// The [`OWNERS`] value of `owner` in `namespace`.
pub fn owner_value(namespace: &str, owner: &str) -> String {
    format!("{namespace}/{owner}")
}

/// The [`IDEMPOTENCY`] value of `owner`'s `key` (length-prefixed: both are free text).
pub fn idempotency_value(owner: &str, key: &str) -> String {
    format!("{}:{owner}{key}", owner.len())
}

/// The pool a sandbox is a claim candidate of: an unclaimed member (labels and controller
/// reference agree) that is claimable but for the clock (Ready, unlocked, not deleting; a
/// passed `shutdownTime` is checked when a claim plans).
fn pool_of(sandbox: &Sandbox) -> Option<String> {
    if !crate::claim::is_claimable(sandbox, jiff::Timestamp::MIN) {
        return None;
    }
    let labels = sandbox.metadata.labels.as_ref()?;
    if labels.get(labels::SANDBOX_CLAIMED).is_some_and(|v| v == labels::TRUE) {
        return None;
    }
    let pool = labels.get(labels::SANDBOX_POOL)?;
    let owner = sandbox.controller_ref()?;
    (sandbox.is_controlled_by_sandbox_set() && &owner.name == pool)
        .then(|| pool_value(sandbox.metadata.namespace.as_deref().unwrap_or_default(), pool))
}

/// The public sandbox ID of a claimed sandbox, `None` for one that is not claimed: the one rule
/// the gateway routes by, [`oka_api::public_id::of_claimed`].
pub use oka_api::public_id::of_claimed as sandbox_id;

/// oka extension: the `Idempotency-Key` of the create that claimed the sandbox.
pub const IDEMPOTENCY_KEY: &str = "agents.kruise.io/idempotency-key";
/// The lowercase hex SHA-256 of the create body an `Idempotency-Key` was first used with: a
/// replay with another body is refused.
pub const IDEMPOTENCY_BODY_SHA256: &str = "agents.kruise.io/idempotency-body-sha256";

/// The [`IDEMPOTENCY`] value of a claimed sandbox created with an `Idempotency-Key`.
fn idempotency_of(sandbox: &Sandbox) -> Option<String> {
    sandbox_id(sandbox)?;
    let notes = sandbox.metadata.annotations.as_ref()?;
    Some(idempotency_value(notes.get(oka_api::annotations::OWNER)?, notes.get(IDEMPOTENCY_KEY)?))
}

/// The [`OWNERS`] value of a sandbox with an owner.
fn owner_of(sandbox: &Sandbox) -> Option<String> {
    let owner = sandbox.metadata.annotations.as_ref()?.get(oka_api::annotations::OWNER)?;
    Some(owner_value(sandbox.metadata.namespace.as_deref().unwrap_or_default(), owner))
}

/// What a sandbox is filed under in one index, if anything.
type IndexValue = fn(&Sandbox) -> Option<String>;

/// A new Sandbox cache with the index's secondary indexes.
fn sandbox_cache(cache: Cache<Sandbox>) -> Cache<Sandbox> {
    let indexes: [(&'static str, IndexValue); 4] =
        [(POOLS, pool_of), (IDS, sandbox_id), (IDEMPOTENCY, idempotency_of), (OWNERS, owner_of)];
    for (name, value) in indexes {
        // The cache may be shared (names say whose they are): taken already means by another
        // index over the same informers, with this function.
        let _ = cache.add_index(name, move |sandbox| value(sandbox).into_iter().collect());
    }
    cache
}

/// The in-memory index; see the [module documentation](self).
pub struct Index {
    sandboxes: Cache<Sandbox>,
    sets: Cache<SandboxSet>,
    templates: Cache<SandboxTemplate>,
    /// Bumped whenever a pool's claim candidates change (one joins, leaves or is updated).
    pools_generation: AtomicU64,
    /// (owner, lock) → sandbox of every claimed sandbox that changed since the quota last took
    /// them ([`Index::take_lock_changes`]); `None` until the quota asks.
    locks: Mutex<Option<HashMap<(String, String), ObjectKey>>>,
    /// Bumped after every change of a sandbox, so waiters re-check ([`Index::wait_for`]).
    changes: watch::Sender<u64>,
    /// Woken after every change of a sandbox, for the quota's event path.
    lock_notify: tokio::sync::Notify,
    /// Removes the index's handler from the shared Sandbox informer and lets go of the
    /// informers ([`Index::shutdown`]).
    detach: Mutex<Option<Detach>>,
}

/// What [`Index::shutdown`] runs once.
type Detach = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("sandboxes", &self.sandboxes.len())
            .field("sets", &self.sets.len())
            .finish_non_exhaustive()
    }
}

impl Default for Index {
    fn default() -> Self {
        Self::over(Cache::default(), Cache::default(), Cache::default())
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Index {
    fn over(
        sandboxes: Cache<Sandbox>,
        sets: Cache<SandboxSet>,
        templates: Cache<SandboxTemplate>,
    ) -> Self {
        Self {
            sandboxes: sandbox_cache(sandboxes),
            sets,
            templates,
            pools_generation: AtomicU64::new(0),
            locks: Mutex::new(None),
            changes: watch::Sender::new(0),
            lock_notify: tokio::sync::Notify::new(),
            detach: Mutex::new(None),
        }
    }

    /// Keeps a new index up to date over the informers of every Sandbox, SandboxSet and
    /// SandboxTemplate, starting them unless they run already (on the current tokio runtime).
    /// Given a store, the informers are the index's own and stop when [`Index::shutdown`] is
    /// called or the index is dropped; given the process's [`Informers`], they are shared with
    /// the controllers and the gateway (the first user of a kind sets its backoff).
    pub fn spawn<S: Store>(informers: impl Into<Informers<S>>) -> Arc<Self> {
        let informers: Informers<S> = informers.into();
        let config = WatchConfig {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            ..WatchConfig::default()
        };
        let sandboxes = informers.informer::<Sandbox>(config.clone());
        let sets = informers.informer::<SandboxSet>(config.clone());
        let templates = informers.informer::<SandboxTemplate>(config);
        let index = Arc::new(Self::over(sandboxes.cache(), sets.cache(), templates.cache()));
        let weak = Arc::downgrade(&index);
        let handler = sandboxes.on_change(move |change| {
            if let Some(index) = weak.upgrade() {
                index.sandbox_changed(change);
            }
        });
        sandboxes.start();
        sets.start();
        templates.start();
        let detach: Detach = Box::new(move || {
            sandboxes.remove_handler(handler);
            drop((sandboxes, sets, templates, informers));
        });
        *index.detach.lock().unwrap_or_else(PoisonError::into_inner) = Some(detach);
        index
    }

    /// Stops following the store: the index's handler is removed and its informers let go
    /// (its own ones stop). The index keeps what it holds, but a shared cache goes on
    /// changing for its other users.
    pub fn shutdown(&self) {
        let detach = self.detach.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(detach) = detach {
            detach();
        }
    }

    /// Whether every kind has been listed once.
    pub fn is_ready(&self) -> bool {
        self.sandboxes.is_ready() && self.sets.is_ready() && self.templates.is_ready()
    }

    /// Resolves once every kind has been listed once.
    pub async fn wait_ready(&self) {
        self.sandboxes.wait_ready().await;
        self.sets.wait_ready().await;
        self.templates.wait_ready().await;
    }

    /// The bookkeeping of one change of a sandbox, from the watch or the manager's own write:
    /// the pools' generation, the quota's lock changes, and the waiters.
    fn sandbox_changed(&self, change: &Change<Sandbox>) {
        if change.objects().any(|sandbox| pool_of(sandbox).is_some()) {
            // Joined, left, or changed while a candidate: the same member, but a new version.
            self.pools_generation.fetch_add(1, Ordering::Relaxed);
        }
        {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(locks) = locks.as_mut() {
                for sandbox in change.objects() {
                    if let Some((owner, lock)) = crate::quota::model::owner_and_lock(sandbox) {
                        locks.insert(
                            (owner.to_owned(), lock.to_owned()),
                            ObjectKey::of(sandbox.as_ref()),
                        );
                    }
                }
            }
        }
        self.changed();
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        self.lock_notify.notify_one();
    }

    /// The (owner, lock) of every claimed sandbox that was created, changed or removed since
    /// the last call, with the sandbox that held it (look it up with [`Index::sandbox`]: gone,
    /// or holding another lock, means the lock ended). The first call starts the recording.
    pub fn take_lock_changes(&self) -> HashMap<(String, String), ObjectKey> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        match locks.as_mut() {
            Some(locks) => std::mem::take(locks),
            None => {
                *locks = Some(HashMap::new());
                HashMap::new()
            }
        }
    }

    /// Resolves after a change of a sandbox since the last call (a missed wake-up is kept).
    pub async fn lock_changed(&self) {
        self.lock_notify.notified().await;
    }

    /// The sandbox `key`.
    pub fn sandbox(&self, key: &ObjectKey) -> Option<Arc<Sandbox>> {
        self.sandboxes.get(key)
    }

    /// Every sandbox, by namespace then name.
    pub fn sandboxes(&self) -> Vec<Arc<Sandbox>> {
        self.sandboxes.list()
    }

    /// Waits until `check` (called now and after every change of a sandbox in the index)
    /// returns `Some`, for at most `timeout`; `None` when the time is up. Watch-driven: no
    /// polling.
    pub async fn wait_for<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&Index) -> Option<T>,
    ) -> Option<T> {
        let mut changes = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.mark_unchanged();
            if let Some(found) = check(self) {
                return Some(found);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return check(self),
            }
        }
    }

    /// Records a version of a sandbox the manager wrote; an older version than the one held is
    /// ignored.
    pub fn apply_sandbox(&self, sandbox: Arc<Sandbox>) {
        match self.sandboxes.apply(sandbox) {
            Some(change) => self.sandbox_changed(&change),
            None => self.changed(),
        }
    }

    /// Drops a sandbox the manager deleted; versions up to `sandbox`'s are ignored afterwards.
    pub fn forget_sandbox(&self, sandbox: &Sandbox) {
        match self.sandboxes.delete(sandbox) {
            Some(change) => self.sandbox_changed(&change),
            None => self.changed(),
        }
    }

    /// The claim candidates of pool `namespace/set` (unclaimed, Ready, unlocked members), by
    /// name.
    pub fn pool_members(&self, namespace: &str, set: &str) -> Vec<Arc<Sandbox>> {
        self.sandboxes.by_index(POOLS, &pool_value(namespace, set)).unwrap_or_default()
    }

    /// The claim candidates of every pool, with the pools' generation: a number that changes
    /// whenever a candidate joins, leaves or is updated (equal generations, same candidates).
    pub fn all_pool_members(&self) -> (u64, Vec<Arc<Sandbox>>) {
        // The generation first: the members read after it are at least as new.
        let generation = self.pools_generation.load(Ordering::Relaxed);
        (generation, self.sandboxes.indexed(POOLS).unwrap_or_default())
    }

    /// A receiver that sees a change after every change of a sandbox in the index; it ends
    /// when the index is dropped.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// At most `limit` claim candidates of pool `namespace/set`, starting at position
    /// `start % len` in name order and wrapping around, so concurrent callers with different
    /// `start`s look at different parts of a large pool.
    pub fn pool_window(
        &self,
        namespace: &str,
        set: &str,
        start: u64,
        limit: usize,
    ) -> Vec<Arc<Sandbox>> {
        let window = |members: oka_cache::Indexed<'_, Sandbox>| {
            let len = members.len();
            let skip = (start % len.max(1) as u64) as usize;
            members.iter().cycle().skip(skip).take(limit.min(len)).cloned().collect()
        };
        self.sandboxes.with_index(POOLS, &pool_value(namespace, set), window).unwrap_or_default()
    }

    /// The claimed sandbox with this public ID.
    pub fn by_id(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.sandboxes.with_index(IDS, id, |found| found.iter().next().cloned()).ok().flatten()
    }

    /// The claimed sandbox `owner` created with idempotency key `key`.
    pub fn by_idempotency_key(&self, owner: &str, key: &str) -> Option<Arc<Sandbox>> {
        let value = idempotency_value(owner, key);
        self.sandboxes
            .with_index(IDEMPOTENCY, &value, |found| found.iter().next().cloned())
            .ok()
            .flatten()
    }

    /// Every claimed sandbox (in `namespace`, or all), by namespace then name.
    pub fn claimed(&self, namespace: Option<&str>) -> Vec<Arc<Sandbox>> {
        let mut claimed = self.sandboxes.indexed(IDS).unwrap_or_default();
        if let Some(namespace) = namespace {
            claimed.retain(|s| s.metadata.namespace.as_deref().unwrap_or_default() == namespace);
        }
        claimed
    }

    /// The sandboxes of `namespace` claimed by `owner` (annotation `agents.kruise.io/owner`:
    /// a SandboxClaim's uid, an API key's user), by name.
    pub fn owned_by(&self, namespace: &str, owner: &str) -> Vec<Arc<Sandbox>> {
        self.sandboxes.by_index(OWNERS, &owner_value(namespace, owner)).unwrap_or_default()
    }

    /// The SandboxSet `name` in `namespace`, or, with `None`, in any namespace (`default`
    /// first, then by namespace order).
    pub fn sandbox_set(&self, namespace: Option<&str>, name: &str) -> Option<Arc<SandboxSet>> {
        match namespace {
            Some(ns) => self.sets.get_named(ns, name),
            None => self.sets.get_named("default", name).or_else(|| {
                self.sets
                    .filter(|set| set.metadata.name.as_deref() == Some(name))
                    .into_iter()
                    .next()
            }),
        }
    }

    /// `f` of the pod template a sandbox (or a pool) runs: its own, else that of the
    /// SandboxTemplate its `templateRef` names in `namespace` (`None` when that is not known).
    pub fn with_pod_template<T>(
        &self,
        namespace: Option<&str>,
        own: Option<&PodTemplateSpec>,
        reference: Option<&oka_api::common::SandboxTemplateRef>,
        f: impl FnOnce(Option<&PodTemplateSpec>) -> T,
    ) -> T {
        if own.is_some() {
            return f(own);
        }
        let Some(reference) = reference else { return f(None) };
        let template =
            self.templates.get_named(namespace.unwrap_or_default(), reference.name.as_str());
        f(template.as_ref().and_then(|t| t.spec.template.as_ref()))
    }

    /// Every SandboxSet (in `namespace`, or all), by namespace then name.
    pub fn sandbox_sets(&self, namespace: Option<&str>) -> Vec<Arc<SandboxSet>> {
        match namespace {
            Some(ns) => self.sets.list_namespace(ns),
            None => self.sets.list(),
        }
    }
}

#[cfg(test)]
mod tests {
    use oka_api::SandboxPhase;

    use super::*;

    fn member(rv: &str) -> Arc<Sandbox> {
        let mut sandbox =
            Sandbox::test().name("m").pooled("pool").phase(SandboxPhase::Running).ready().build();
        sandbox.metadata.resource_version = Some(rv.into());
        Arc::new(sandbox)
    }

    fn claimed(rv: &str) -> Arc<Sandbox> {
        let mut sandbox = (*member(rv)).clone();
        sandbox.metadata.owner_references = None;
        let labels = sandbox.metadata.labels.get_or_insert_default();
        labels.insert(labels::SANDBOX_CLAIMED.into(), labels::TRUE.into());
        labels.insert(labels::SANDBOX_ID.into(), "abc".into());
        Arc::new(sandbox)
    }

    #[test]
    fn older_versions_never_replace_newer_ones() {
        let index = Index::default();
        index.apply_sandbox(member("5"));
        assert_eq!(index.pool_members("default", "pool").len(), 1);
        // The manager's own claim write (rv 7) lands before the watch's rv 6.
        index.apply_sandbox(claimed("7"));
        index.apply_sandbox(member("6"));
        assert!(index.pool_members("default", "pool").is_empty());
        assert_eq!(index.by_id("abc").unwrap().metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(index.claimed(Some("default")).len(), 1);
        assert!(index.claimed(Some("other")).is_empty());
    }

    #[test]
    fn the_pools_generation_moves_with_the_candidates_only() {
        let index = Index::default();
        let start = index.all_pool_members().0;
        index.apply_sandbox(member("5"));
        let (joined, members) = index.all_pool_members();
        assert_ne!(joined, start);
        assert_eq!(members.len(), 1);
        index.apply_sandbox(claimed("7"));
        let (left, members) = index.all_pool_members();
        assert_ne!(left, joined);
        assert!(members.is_empty());
        // A claimed sandbox's updates do not concern the pools.
        index.apply_sandbox(claimed("8"));
        assert_eq!(index.all_pool_members().0, left);
        index.forget_sandbox(&claimed("9"));
        assert_eq!(index.all_pool_members().0, left);
        index.apply_sandbox(member("10"));
        index.forget_sandbox(&member("11"));
        assert_ne!(index.all_pool_members().0, left);
        assert!(index.all_pool_members().1.is_empty());
    }

    #[test]
    fn a_forgotten_sandbox_stays_gone_until_something_newer_arrives() {
        let index = Index::default();
        index.apply_sandbox(claimed("7"));
        index.forget_sandbox(&claimed("8"));
        assert!(index.by_id("abc").is_none());
        index.apply_sandbox(claimed("8")); // a late event of the deleted version
        assert!(index.by_id("abc").is_none());
        index.apply_sandbox(claimed("9")); // recreated
        assert!(index.by_id("abc").is_some());
    }

    #[test]
    fn claimed_sandboxes_are_found_by_id_owner_and_idempotency_key() {
        let index = Index::default();
        let mut sandbox = (*claimed("7")).clone();
        let notes = sandbox.metadata.annotations.get_or_insert_default();
        notes.insert(oka_api::annotations::OWNER.into(), "alice".into());
        notes.insert(IDEMPOTENCY_KEY.into(), "k1".into());
        index.apply_sandbox(Arc::new(sandbox));
        assert_eq!(index.owned_by("default", "alice").len(), 1);
        assert!(index.owned_by("other", "alice").is_empty());
        assert!(index.by_idempotency_key("alice", "k1").is_some());
        // Owner and key are free text: "alic" + "ek1" is another pair.
        assert!(index.by_idempotency_key("alic", "ek1").is_none());
        index.forget_sandbox(&claimed("8"));
        assert!(index.owned_by("default", "alice").is_empty());
        assert!(index.by_idempotency_key("alice", "k1").is_none());
        assert!(index.claimed(None).is_empty());
    }

    #[test]
    fn locked_or_unready_members_are_not_candidates_and_windows_wrap() {
        let index = Index::default();
        for (name, ready, lock) in
            [("a", true, ""), ("b", false, ""), ("c", true, "x"), ("d", true, ""), ("e", true, "")]
        {
            let mut builder =
                Sandbox::test().name(name).pooled("pool").phase(SandboxPhase::Running);
            builder = if ready { builder.ready() } else { builder.not_ready() };
            if !lock.is_empty() {
                builder = builder.annotation(oka_api::annotations::LOCK, lock);
            }
            index.apply_sandbox(Arc::new(builder.build()));
        }
        let names = |v: Vec<Arc<Sandbox>>| -> Vec<String> {
            v.iter().map(|s| s.metadata.name.clone().unwrap()).collect()
        };
        assert_eq!(names(index.pool_members("default", "pool")), ["a", "d", "e"]);
        assert_eq!(names(index.pool_window("default", "pool", 2, 2)), ["e", "a"]);
        assert_eq!(names(index.pool_window("default", "pool", 4, 10)), ["d", "e", "a"]);
        assert!(index.pool_window("default", "none", 0, 10).is_empty());
    }
}
