//! The list+watch loop ([`Informer`]) and the in-memory copy of one kind it keeps ([`Cache`]).
//!
//! # Expected flow
//!
//! 1. **List.** The informer lists the kind (one namespace or all, filtered by a label
//!    selector), replaces the cache with the result, marks the cache ready, and tells its
//!    handlers what changed compared with the previous cache content: on the first list every
//!    object is new; on a relist only objects that appeared, changed (another
//!    `resourceVersion`) or disappeared are reported.
//! 2. **Watch** from the list's `resourceVersion`. Every event updates the cache first, then
//!    the handlers are called with a [`Change`]; a bookmark only advances the resume point.
//! 3. **Recover.** [`StoreError::Gone`] (the resume point is older than the store's history)
//!    or the end of the stream ⇒ back to 1 (relist). Any other error ⇒ wait with exponential
//!    backoff and watch again from the last seen `resourceVersion`. Failed lists are retried
//!    with the same backoff, reset by the next success.
//! 4. The loop runs until its shutdown future resolves.
//!
//! # Guarantees
//!
//! - The cache is written by one informer only; [`Cache`] handles are read-only clones.
//! - A handler sees an object's change after the cache holds it, so a reconcile triggered by
//!   it reads that version or a newer one.
//! - A relist reports deletions that happened while the watch was broken, so the cache never
//!   keeps an object the store no longer has once a list succeeded.
//! - Events that carry the `resourceVersion` the cache already holds (a replay after a
//!   resumed watch) are not reported again.
//!
//! # Caveats
//!
//! - The cache lags the store: a reader may see an older version of an object, or miss one
//!   just created. Decisions that are final (for example "the named SandboxSet does not
//!   exist") should be confirmed by reading the store.
//! - Handlers run on the informer's task and must not block: they enqueue keys.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use oka_store::{Object, Selector, Store, StoreError, WatchEvent};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::queue::exponential;

/// The identity of a namespaced object: what the work queue holds and the cache is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key of `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// The key of an object (an unset namespace or name counts as empty).
    pub fn of<K: Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One change to the cache, as reported to [`Informer::on_change`] handlers.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// The object was created or changed; `old` is the version the cache held before.
    Applied {
        /// The previous version, when the cache had one.
        old: Option<Arc<K>>,
        /// The version now in the cache.
        new: Arc<K>,
    },
    /// The object was removed; this is its last known state.
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    /// Every version this change involves: the old and the new one, or the deleted one.
    /// Mapping both sides matters when a link moves: a Sandbox whose owner reference is
    /// removed must still wake its former owner.
    pub fn objects(&self) -> impl Iterator<Item = &Arc<K>> {
        let (first, second) = match self {
            Change::Applied { old, new } => (old.as_ref(), Some(new)),
            Change::Deleted(obj) => (Some(obj), None),
        };
        first.into_iter().chain(second)
    }

    /// The version after the change, or the last one of a deleted object.
    pub fn latest(&self) -> &Arc<K> {
        match self {
            Change::Applied { new, .. } => new,
            Change::Deleted(obj) => obj,
        }
    }
}

struct CacheInner<K> {
    objects: RwLock<BTreeMap<ObjectKey, Arc<K>>>,
    ready: watch::Sender<bool>,
}

/// A read-only, cloneable view of the objects of one kind, kept up to date by an [`Informer`].
pub struct Cache<K> {
    inner: Arc<CacheInner<K>>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<K> fmt::Debug for Cache<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache").field("len", &self.len()).field("ready", &self.is_ready()).finish()
    }
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(CacheInner {
                objects: RwLock::new(BTreeMap::new()),
                ready: watch::Sender::new(false),
            }),
        }
    }
}

impl<K> Cache<K> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<ObjectKey, Arc<K>>> {
        // Writers never panic half-way through an update, so a poisoned map is consistent.
        self.inner.objects.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<ObjectKey, Arc<K>>> {
        self.inner.objects.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached object with this key.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.read().get(key).cloned()
    }

    /// The cached object `namespace/name`.
    pub fn get_named(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.get(&ObjectKey::new(namespace, name))
    }

    /// Every cached object, ordered by namespace, then name.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.read().values().cloned().collect()
    }

    /// The cached objects of one namespace, ordered by name.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.read()
            .iter()
            .filter(|(key, _)| key.namespace == namespace)
            .map(|(_, obj)| Arc::clone(obj))
            .collect()
    }

    /// The cached objects for which `keep` is true, ordered by namespace, then name.
    pub fn filter(&self, mut keep: impl FnMut(&K) -> bool) -> Vec<Arc<K>> {
        self.read().values().filter(|obj| keep(obj)).cloned().collect()
    }

    /// The number of cached objects.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether the cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Whether a first list has filled the cache.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// Resolves once a first list has filled the cache.
    pub async fn wait_ready(&self) {
        let mut ready = self.inner.ready.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = ready.wait_for(|ready| *ready).await;
    }

    fn mark_ready(&self) {
        self.inner.ready.send_replace(true);
    }
}

impl<K: Resource> Cache<K> {
    /// Stores `obj`; returns the change, or `None` when the cache already holds this version.
    pub(crate) fn apply(&self, obj: Arc<K>) -> Option<Change<K>> {
        let key = ObjectKey::of(obj.as_ref());
        let mut objects = self.write();
        let old = objects.get(&key).cloned();
        if old.as_ref().is_some_and(|old| same_version(old.as_ref(), obj.as_ref())) {
            return None;
        }
        objects.insert(key, Arc::clone(&obj));
        Some(Change::Applied { old, new: obj })
    }

    /// Removes the object `obj` names; returns the change (with the store's last state).
    pub(crate) fn remove(&self, obj: Arc<K>) -> Option<Change<K>> {
        let key = ObjectKey::of(obj.as_ref());
        self.write().remove(&key).map(|_| Change::Deleted(obj))
    }

    /// Replaces the whole content with a list result; returns what differs.
    fn replace(&self, items: Vec<Arc<K>>) -> Vec<Change<K>> {
        let fresh: BTreeMap<ObjectKey, Arc<K>> =
            items.into_iter().map(|obj| (ObjectKey::of(obj.as_ref()), obj)).collect();
        let mut objects = self.write();
        let mut changes = Vec::new();
        for (key, old) in objects.iter() {
            if !fresh.contains_key(key) {
                changes.push(Change::Deleted(Arc::clone(old)));
            }
        }
        for (key, new) in &fresh {
            let old = objects.get(key);
            if !old.is_some_and(|old| same_version(old.as_ref(), new.as_ref())) {
                changes.push(Change::Applied { old: old.cloned(), new: Arc::clone(new) });
            }
        }
        *objects = fresh;
        changes
    }
}

fn same_version<K: Resource>(a: &K, b: &K) -> bool {
    let (a, b) = (a.meta(), b.meta());
    a.uid == b.uid && a.resource_version.is_some() && a.resource_version == b.resource_version
}

/// Where an informer looks, and how it backs off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// One namespace, or all of them.
    pub namespace: Option<String>,
    /// Only objects whose labels match.
    pub selector: Selector,
    /// The wait after a first failure.
    pub initial_backoff: Duration,
    /// The longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for WatchConfig {
    /// All namespaces, every object, backoff 100 ms doubling to 30 s.
    fn default() -> Self {
        Self {
            namespace: None,
            selector: Selector::everything(),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Counters of one informer, readable while it runs.
#[derive(Debug, Default)]
pub struct WatchStats {
    lists: AtomicU64,
    list_errors: AtomicU64,
    watch_errors: AtomicU64,
    events: AtomicU64,
}

impl WatchStats {
    /// Successful lists, the first one included.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }

    /// Failed lists.
    pub fn list_errors(&self) -> u64 {
        self.list_errors.load(Ordering::Relaxed)
    }

    /// Watch failures of any kind (including `Gone` and stream ends).
    pub fn watch_errors(&self) -> u64 {
        self.watch_errors.load(Ordering::Relaxed)
    }

    /// Watch events received.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }
}

type Handler<K> = Box<dyn Fn(&Change<K>) + Send + Sync>;

/// Lists then watches one kind through a [`Store`] and keeps a [`Cache`] of it; see the
/// [module documentation](self) for the loop.
pub struct Informer<K: Object, S: Store> {
    store: S,
    config: WatchConfig,
    cache: Cache<K>,
    handlers: Vec<Handler<K>>,
    stats: Arc<WatchStats>,
}

impl<K: Object, S: Store> fmt::Debug for Informer<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Informer")
            .field("kind", &K::kind(&()))
            .field("config", &self.config)
            .field("handlers", &self.handlers.len())
            .finish()
    }
}

impl<K: Object, S: Store> Informer<K, S> {
    /// An informer over every object of kind `K` in every namespace.
    pub fn new(store: S) -> Self {
        Self::with_config(store, WatchConfig::default())
    }

    /// An informer with explicit scope and backoff.
    pub fn with_config(store: S, config: WatchConfig) -> Self {
        Self { store, config, cache: Cache::default(), handlers: Vec::new(), stats: Arc::default() }
    }

    /// The cache this informer fills; clone it into a reconciler's context before running.
    pub fn cache(&self) -> Cache<K> {
        self.cache.clone()
    }

    /// The informer's counters.
    pub fn stats(&self) -> Arc<WatchStats> {
        Arc::clone(&self.stats)
    }

    /// Calls `handler` after every change to the cache. Handlers must not block.
    pub fn on_change(&mut self, handler: impl Fn(&Change<K>) + Send + Sync + 'static) {
        self.handlers.push(Box::new(handler));
    }

    /// Runs the list+watch loop until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = shutdown => {}
            () = self.run_forever() => {}
        }
    }

    fn emit(&self, change: &Change<K>) {
        for handler in &self.handlers {
            handler(change);
        }
    }

    async fn run_forever(&self) {
        let kind = K::kind(&());
        let namespace = self.config.namespace.as_deref();
        let selector = &self.config.selector;
        let mut failures = 0u32;
        let backoff = |failures: &mut u32| {
            let delay =
                exponential(self.config.initial_backoff, self.config.max_backoff, *failures);
            *failures = failures.saturating_add(1);
            tokio::time::sleep(delay)
        };
        // `None`: list next; `Some(rv)`: watch from rv.
        let mut resume: Option<String> = None;
        loop {
            let Some(resource_version) = resume.take() else {
                match self.store.list::<K>(namespace, selector).await {
                    Ok(list) => {
                        self.stats.lists.fetch_add(1, Ordering::Relaxed);
                        failures = 0;
                        let changes = self.cache.replace(list.items);
                        self.cache.mark_ready();
                        debug!(%kind, objects = self.cache.len(), changes = changes.len(), "listed");
                        for change in &changes {
                            self.emit(change);
                        }
                        resume = Some(list.resource_version);
                    }
                    Err(error) => {
                        self.stats.list_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(%kind, %error, "list failed; retrying with backoff");
                        backoff(&mut failures).await;
                    }
                }
                continue;
            };
            let mut stream =
                match self.store.watch::<K>(namespace, selector, &resource_version).await {
                    Ok(stream) => stream,
                    Err(StoreError::Gone { .. }) => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        debug!(%kind, %resource_version, "watch resume point expired; relisting");
                        continue;
                    }
                    Err(error) => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(%kind, %error, "watch failed; retrying with backoff");
                        backoff(&mut failures).await;
                        resume = Some(resource_version);
                        continue;
                    }
                };
            let mut last_seen = resource_version;
            loop {
                match stream.next().await {
                    Some(Ok(event)) => {
                        self.stats.events.fetch_add(1, Ordering::Relaxed);
                        failures = 0;
                        let change = match event {
                            WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                                advance(&mut last_seen, obj.as_ref());
                                self.cache.apply(obj)
                            }
                            WatchEvent::Deleted(obj) => {
                                advance(&mut last_seen, obj.as_ref());
                                self.cache.remove(obj)
                            }
                            WatchEvent::Bookmark(version) => {
                                last_seen = version;
                                None
                            }
                        };
                        if let Some(change) = change {
                            self.emit(&change);
                        }
                    }
                    Some(Err(StoreError::Gone { .. })) => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        debug!(%kind, "watch fell behind the store's history; relisting");
                        break;
                    }
                    Some(Err(error)) => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(%kind, %error, "watch failed; resuming with backoff");
                        backoff(&mut failures).await;
                        resume = Some(last_seen);
                        break;
                    }
                    None => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        debug!(%kind, "watch stream ended; relisting");
                        backoff(&mut failures).await;
                        break;
                    }
                }
            }
        }
    }
}

fn advance<K: Resource>(last_seen: &mut String, obj: &K) {
    if let Some(version) = &obj.meta().resource_version {
        last_seen.clone_from(version);
    }
}
