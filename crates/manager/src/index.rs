//! The manager's in-memory index of Sandboxes, SandboxSets and SandboxTemplates, fed by a store
//! list+watch.
//!
//! # Expected flow
//!
//! 1. [`Index::spawn`] starts one reflector task per kind. Each lists every object of its kind,
//!    replaces its part of the index with the result, then watches from the list's
//!    resourceVersion and applies each event.
//! 2. When the watch ends or fails (including [`oka_store::StoreError::Gone`]), the reflector
//!    waits briefly and relists: the index never keeps an object the store has dropped.
//! 3. The manager's own writes are applied at once ([`Index::apply_sandbox`],
//!    [`Index::forget_sandbox`]) so a caller reads its own writes without waiting for the
//!    watch.
//!
//! # Guarantees
//!
//! - Secondary indexes (pool members per `(namespace, SandboxSet)`, claimed sandboxes per
//!   sandbox ID) always agree with the primary map: all three change under one lock.
//! - An object is never replaced by an older version of itself: when both resourceVersions are
//!   decimal counters (the embedded store), a version not newer than the held one is ignored;
//!   a sandbox the manager deleted stays gone until the watch reports something newer than
//!   the version deleted.
//!
//! # Caveats
//!
//! - The index lags the store. The claim engine never trusts it for correctness: every claim is
//!   a compare-and-swap on the resourceVersion it read here.
//! - On Kubernetes, resourceVersions are opaque; there the newest-wins rule degrades to
//!   last-writer-wins between the watch and the manager's own writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use oka_api::{Sandbox, SandboxSet, SandboxTemplate, labels};
use oka_store::{Object, Selector, Store, WatchEvent};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tracing::{debug, warn};

/// How many kinds the index reflects.
const KINDS: u8 = 3;

/// The identity of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    fn of_sandbox(sandbox: &Sandbox) -> Self {
        Self::new(
            sandbox.metadata.namespace.clone().unwrap_or_default(),
            sandbox.metadata.name.clone().unwrap_or_default(),
        )
    }

    fn of_template(template: &SandboxTemplate) -> Self {
        Self::new(
            template.metadata.namespace.clone().unwrap_or_default(),
            template.metadata.name.clone().unwrap_or_default(),
        )
    }

    fn of_set(set: &SandboxSet) -> Self {
        Self::new(
            set.metadata.namespace.clone().unwrap_or_default(),
            set.metadata.name.clone().unwrap_or_default(),
        )
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pool a sandbox is a claim candidate of: an unclaimed member (labels and controller
/// reference agree) that is claimable but for the clock (Ready, unlocked, not deleting; a
/// passed `shutdownTime` is checked when a claim plans).
fn pool_of(sandbox: &Sandbox) -> Option<ObjectKey> {
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
        .then(|| ObjectKey::new(sandbox.metadata.namespace.clone().unwrap_or_default(), pool))
}

/// The public sandbox ID of a claimed sandbox, `None` for one that is not claimed: the one rule
/// the gateway routes by, [`oka_api::public_id::of_claimed`].
pub use oka_api::public_id::of_claimed as sandbox_id;

/// oka extension: the `Idempotency-Key` of the create that claimed the sandbox.
pub const IDEMPOTENCY_KEY: &str = "agents.kruise.io/idempotency-key";
/// The lowercase hex SHA-256 of the create body an `Idempotency-Key` was first used with: a
/// replay with another body is refused.
pub const IDEMPOTENCY_BODY_SHA256: &str = "agents.kruise.io/idempotency-body-sha256";

/// (owner, idempotency key) of a claimed sandbox created with an `Idempotency-Key`.
fn idempotency_of(sandbox: &Sandbox) -> Option<(String, String)> {
    sandbox_id(sandbox)?;
    let notes = sandbox.metadata.annotations.as_ref()?;
    Some((notes.get(oka_api::annotations::OWNER)?.clone(), notes.get(IDEMPOTENCY_KEY)?.clone()))
}

fn rv(resource_version: Option<&String>) -> Option<u64> {
    resource_version.and_then(|v| v.parse().ok())
}

/// Whether `new` may replace `old`: not when both versions are counters and `new` is not newer.
fn newer(old: Option<&String>, new: Option<&String>) -> bool {
    match (rv(old), rv(new)) {
        (Some(old), Some(new)) => new > old,
        _ => true,
    }
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<ObjectKey, Arc<Sandbox>>,
    /// Claim candidates per pool, by name.
    pools: HashMap<ObjectKey, BTreeMap<String, Arc<Sandbox>>>,
    /// Claimed sandboxes per public ID.
    ids: HashMap<String, ObjectKey>,
    /// Claimed sandboxes per (owner, `Idempotency-Key`).
    idempotency: HashMap<(String, String), ObjectKey>,
    /// Sandboxes the manager deleted, with the last version it saw: older events are ignored.
    fences: HashMap<ObjectKey, Option<String>>,
    sets: BTreeMap<ObjectKey, Arc<SandboxSet>>,
    templates: BTreeMap<ObjectKey, Arc<SandboxTemplate>>,
    /// Bumped whenever a pool's claim candidates change (one joins, leaves or is updated).
    pools_generation: u64,
    /// (owner, lock) → sandbox of every claimed sandbox that changed since the quota last took
    /// them ([`Index::take_lock_changes`]); `None` until the quota asks.
    locks: Option<HashMap<(String, String), ObjectKey>>,
}

impl State {
    /// Notes that the sandbox `key` holding `sandbox`'s (owner, lock) changed.
    fn note_lock(&mut self, key: &ObjectKey, sandbox: &Sandbox) {
        if let Some(locks) = self.locks.as_mut()
            && let Some((owner, lock)) = crate::quota::model::owner_and_lock(sandbox)
        {
            locks.insert((owner.to_owned(), lock.to_owned()), key.clone());
        }
    }

    fn unlink(&mut self, key: &ObjectKey, sandbox: &Sandbox) {
        if let Some(pool) = pool_of(sandbox)
            && let Some(members) = self.pools.get_mut(&pool)
        {
            members.remove(&key.name);
            if members.is_empty() {
                self.pools.remove(&pool);
            }
        }
        if let Some(id) = sandbox_id(sandbox)
            && self.ids.get(&id) == Some(key)
        {
            self.ids.remove(&id);
        }
        if let Some(idem) = idempotency_of(sandbox)
            && self.idempotency.get(&idem) == Some(key)
        {
            self.idempotency.remove(&idem);
        }
    }

    fn link(&mut self, key: &ObjectKey, sandbox: &Arc<Sandbox>) {
        if let Some(pool) = pool_of(sandbox) {
            self.pools.entry(pool).or_default().insert(key.name.clone(), Arc::clone(sandbox));
        }
        if let Some(id) = sandbox_id(sandbox) {
            self.ids.insert(id, key.clone());
        }
        if let Some(idem) = idempotency_of(sandbox) {
            self.idempotency.insert(idem, key.clone());
        }
    }

    fn apply(&mut self, sandbox: Arc<Sandbox>) {
        let key = ObjectKey::of_sandbox(&sandbox);
        let version = sandbox.metadata.resource_version.as_ref();
        if let Some(fence) = self.fences.get(&key) {
            if !newer(fence.as_ref(), version) {
                return;
            }
            self.fences.remove(&key);
        }
        let mut was_candidate = false;
        if let Some(old) = self.sandboxes.get(&key).cloned() {
            if !newer(old.metadata.resource_version.as_ref(), version) {
                return;
            }
            was_candidate = pool_of(&old).is_some();
            self.unlink(&key, &old);
            self.note_lock(&key, &old);
        }
        self.note_lock(&key, &sandbox);
        if was_candidate || pool_of(&sandbox).is_some() {
            // Joined, left, or changed while a candidate: the same member, but a new version.
            self.pools_generation = self.pools_generation.wrapping_add(1);
        }
        self.link(&key, &sandbox);
        self.sandboxes.insert(key, sandbox);
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Some(old) = self.sandboxes.remove(key) {
            if pool_of(&old).is_some() {
                self.pools_generation = self.pools_generation.wrapping_add(1);
            }
            self.unlink(key, &old);
            self.note_lock(key, &old);
        }
    }
}

/// The in-memory index; see the [module documentation](self).
pub struct Index {
    state: RwLock<State>,
    /// How many kinds have completed a first list (2 = ready).
    listed: watch::Sender<u8>,
    /// Bumped after every change of a sandbox, so waiters re-check ([`Index::wait_for`]).
    changes: watch::Sender<u64>,
    /// Woken after every change of a sandbox, for the quota's event path.
    lock_notify: tokio::sync::Notify,
    tasks: std::sync::Mutex<Vec<AbortHandle>>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.read();
        f.debug_struct("Index")
            .field("sandboxes", &state.sandboxes.len())
            .field("sets", &state.sets.len())
            .finish_non_exhaustive()
    }
}

impl Default for Index {
    fn default() -> Self {
        Self {
            state: RwLock::new(State::default()),
            listed: watch::Sender::new(0),
            changes: watch::Sender::new(0),
            lock_notify: tokio::sync::Notify::new(),
            tasks: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Index {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // No writer panics half-way through an update, so a poisoned lock is consistent.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the reflectors (one task per kind, on the current tokio runtime) that keep a new
    /// index up to date with `store`. They stop when [`Index::shutdown`] is called or the
    /// index is dropped.
    pub fn spawn<S: Store>(store: S) -> Arc<Self> {
        let index = Arc::new(Self::default());
        let sandboxes = tokio::spawn(reflect::<Sandbox, S>(
            store.clone(),
            Arc::downgrade(&index),
            |index, change| match change {
                Reflected::Listed(items) => index.replace_sandboxes(items),
                Reflected::Applied(obj) => index.apply_sandbox(obj),
                Reflected::Deleted(obj) => {
                    let key = ObjectKey::of_sandbox(&obj);
                    {
                        let mut state = index.write();
                        state.remove(&key);
                        state.fences.remove(&key);
                    }
                    index.changed();
                }
            },
        ));
        let sets = tokio::spawn(reflect::<SandboxSet, S>(
            store.clone(),
            Arc::downgrade(&index),
            |index, change| match change {
                Reflected::Listed(items) => {
                    index.write().sets =
                        items.into_iter().map(|s| (ObjectKey::of_set(&s), s)).collect();
                }
                Reflected::Applied(obj) => {
                    index.write().sets.insert(ObjectKey::of_set(&obj), obj);
                }
                Reflected::Deleted(obj) => {
                    index.write().sets.remove(&ObjectKey::of_set(&obj));
                }
            },
        ));
        let templates = tokio::spawn(reflect::<SandboxTemplate, S>(
            store,
            Arc::downgrade(&index),
            |index, change| match change {
                Reflected::Listed(items) => {
                    index.write().templates =
                        items.into_iter().map(|t| (ObjectKey::of_template(&t), t)).collect();
                }
                Reflected::Applied(obj) => {
                    index.write().templates.insert(ObjectKey::of_template(&obj), obj);
                }
                Reflected::Deleted(obj) => {
                    index.write().templates.remove(&ObjectKey::of_template(&obj));
                }
            },
        ));
        index.tasks.lock().unwrap_or_else(PoisonError::into_inner).extend([
            sandboxes.abort_handle(),
            sets.abort_handle(),
            templates.abort_handle(),
        ]);
        index
    }

    /// Stops the reflectors. The index keeps what it holds.
    pub fn shutdown(&self) {
        for task in self.tasks.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            task.abort();
        }
    }

    /// Whether every kind has been listed once.
    pub fn is_ready(&self) -> bool {
        *self.listed.borrow() >= KINDS
    }

    /// Resolves once every kind has been listed once.
    pub async fn wait_ready(&self) {
        let mut listed = self.listed.subscribe();
        let _ = listed.wait_for(|n| *n >= KINDS).await;
    }

    fn replace_sandboxes(&self, items: Vec<Arc<Sandbox>>) {
        let mut state = self.write();
        let fences = std::mem::take(&mut state.fences);
        // Every sandbox the list replaces counts as changed for the quota (one the list no
        // longer shows was deleted meanwhile).
        let old: Vec<(ObjectKey, Arc<Sandbox>)> =
            state.sandboxes.iter().map(|(k, s)| (k.clone(), Arc::clone(s))).collect();
        for (key, sandbox) in &old {
            state.note_lock(key, sandbox);
        }
        *state = State {
            sets: std::mem::take(&mut state.sets),
            templates: std::mem::take(&mut state.templates),
            pools_generation: state.pools_generation.wrapping_add(1),
            locks: state.locks.take(),
            ..State::default()
        };
        for sandbox in items {
            let key = ObjectKey::of_sandbox(&sandbox);
            // A deletion the list does not show yet (the list raced it) stays fenced.
            if let Some(fence) = fences.get(&key) {
                state.fences.insert(key, fence.clone());
            }
            state.apply(sandbox);
        }
        drop(state);
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
        let mut state = self.write();
        match state.locks.as_mut() {
            Some(locks) => std::mem::take(locks),
            None => {
                state.locks = Some(HashMap::new());
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
        self.read().sandboxes.get(key).cloned()
    }

    /// Every sandbox, in no particular order.
    pub fn sandboxes(&self) -> Vec<Arc<Sandbox>> {
        self.read().sandboxes.values().cloned().collect()
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

    /// Records a version of a sandbox (from the watch or from the manager's own write); an
    /// older version than the one held is ignored.
    pub fn apply_sandbox(&self, sandbox: Arc<Sandbox>) {
        self.write().apply(sandbox);
        self.changed();
    }

    /// Drops a sandbox the manager deleted; versions up to `sandbox`'s are ignored afterwards.
    pub fn forget_sandbox(&self, sandbox: &Sandbox) {
        let key = ObjectKey::of_sandbox(sandbox);
        let mut state = self.write();
        state.remove(&key);
        state.fences.insert(key, sandbox.metadata.resource_version.clone());
        drop(state);
        self.changed();
    }

    /// The claim candidates of pool `namespace/set` (unclaimed, Ready, unlocked members), by
    /// name.
    pub fn pool_members(&self, namespace: &str, set: &str) -> Vec<Arc<Sandbox>> {
        let state = self.read();
        let pool = ObjectKey::new(namespace, set);
        state.pools.get(&pool).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// The claim candidates of every pool, with the pools' generation: a number that changes
    /// whenever a candidate joins, leaves or is updated (equal generations, same candidates).
    pub fn all_pool_members(&self) -> (u64, Vec<Arc<Sandbox>>) {
        let state = self.read();
        let members = state.pools.values().flat_map(|m| m.values().cloned()).collect();
        (state.pools_generation, members)
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
        let state = self.read();
        let Some(members) = state.pools.get(&ObjectKey::new(namespace, set)) else {
            return Vec::new();
        };
        let skip = (start % members.len().max(1) as u64) as usize;
        members.values().cycle().skip(skip).take(limit.min(members.len())).cloned().collect()
    }

    /// The claimed sandbox with this public ID.
    pub fn by_id(&self, id: &str) -> Option<Arc<Sandbox>> {
        let state = self.read();
        state.ids.get(id).and_then(|key| state.sandboxes.get(key)).cloned()
    }

    /// The claimed sandbox `owner` created with idempotency key `key`.
    pub fn by_idempotency_key(&self, owner: &str, key: &str) -> Option<Arc<Sandbox>> {
        let state = self.read();
        let found = state.idempotency.get(&(owner.to_owned(), key.to_owned()))?;
        state.sandboxes.get(found).cloned()
    }

    /// Every claimed sandbox (in `namespace`, or all), in no particular order.
    pub fn claimed(&self, namespace: Option<&str>) -> Vec<Arc<Sandbox>> {
        let state = self.read();
        state
            .ids
            .values()
            .filter(|key| namespace.is_none_or(|ns| key.namespace == ns))
            .filter_map(|key| state.sandboxes.get(key))
            .cloned()
            .collect()
    }

    /// The sandboxes of `namespace` claimed by `owner` (annotation `agents.kruise.io/owner`:
    /// a SandboxClaim's uid, an API key's user), in no particular order.
    pub fn owned_by(&self, namespace: &str, owner: &str) -> Vec<Arc<Sandbox>> {
        let state = self.read();
        state
            .sandboxes
            .iter()
            .filter(|(key, _)| key.namespace == namespace)
            .map(|(_, sandbox)| sandbox)
            .filter(|sandbox| {
                sandbox
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(oka_api::annotations::OWNER))
                    .is_some_and(|o| o == owner)
            })
            .cloned()
            .collect()
    }

    /// The SandboxSet `name` in `namespace`, or, with `None`, in any namespace (`default`
    /// first, then by namespace order).
    pub fn sandbox_set(&self, namespace: Option<&str>, name: &str) -> Option<Arc<SandboxSet>> {
        let state = self.read();
        match namespace {
            Some(ns) => state.sets.get(&ObjectKey::new(ns, name)).cloned(),
            None => state.sets.get(&ObjectKey::new("default", name)).cloned().or_else(|| {
                state.sets.iter().find(|(key, _)| key.name == name).map(|(_, set)| set.clone())
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
        let key = ObjectKey::new(namespace.unwrap_or_default(), reference.name.as_str());
        let state = self.read();
        f(state.templates.get(&key).and_then(|t| t.spec.template.as_ref()))
    }

    /// Every SandboxSet (in `namespace`, or all), by namespace then name.
    pub fn sandbox_sets(&self, namespace: Option<&str>) -> Vec<Arc<SandboxSet>> {
        let state = self.read();
        state
            .sets
            .iter()
            .filter(|(key, _)| namespace.is_none_or(|ns| key.namespace == ns))
            .map(|(_, set)| set.clone())
            .collect()
    }
}

enum Reflected<K> {
    Listed(Vec<Arc<K>>),
    Applied(Arc<K>),
    Deleted(Arc<K>),
}

/// The list+watch loop of one kind; ends when the index is dropped.
async fn reflect<K: Object, S: Store>(
    store: S,
    index: Weak<Index>,
    sink: impl Fn(&Index, Reflected<K>),
) {
    let kind = K::kind(&());
    let everything = Selector::everything();
    let mut first = true;
    let mut backoff = Duration::from_millis(50);
    loop {
        let list = match store.list::<K>(None, &everything).await {
            Ok(list) => list,
            Err(error) => {
                warn!(%kind, %error, "list failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        {
            let Some(index) = index.upgrade() else { return };
            sink(&index, Reflected::Listed(list.items));
            if first {
                first = false;
                index.listed.send_modify(|n| *n += 1);
            }
        }
        let mut stream = match store.watch::<K>(None, &everything, &list.resource_version).await {
            Ok(stream) => stream,
            Err(error) => {
                debug!(%kind, %error, "watch failed to start; relisting");
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        while let Some(event) = stream.next().await {
            let Some(index) = index.upgrade() else { return };
            match event {
                Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                    sink(&index, Reflected::Applied(obj));
                }
                Ok(WatchEvent::Deleted(obj)) => sink(&index, Reflected::Deleted(obj)),
                Ok(WatchEvent::Bookmark(_)) => {}
                Err(error) => {
                    debug!(%kind, %error, "watch ended; relisting");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
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
