//! The in-memory copy of one kind ([`Cache`]), with named secondary indexes, as client-go's
//! `Indexer`: an index is a function from an object to the values it is filed under ("its
//! pool", "its public ID"), kept up to date on every change, so a lookup by value costs the
//! size of its answer, not of the cache.
//!
//! A cache is filled by an [`Informer`](crate::Informer) (list, then watch). Whoever writes
//! the store may also record its own write at once ([`Cache::apply`], [`Cache::delete`]), so
//! it reads its own write before the watch brings it back.
//!
//! # Guarantees
//!
//! - The objects and every index change together, under one lock: a reader never sees an
//!   index that disagrees with the objects, even while changes are applied.
//! - An object is never replaced by an older version of itself. When both resourceVersions
//!   are decimal counters (the embedded store's, and etcd's on Kubernetes), a version that is
//!   not newer than the one held is ignored; otherwise only the version held (same uid, same
//!   resourceVersion) is. A removal reported for a version older than the one held (the
//!   object was recreated meanwhile) is ignored too.
//! - An object the caller deleted ([`Cache::delete`]) stays gone until a version newer than
//!   the deleted one arrives, or the watch reports the deletion, or a list no longer shows it.
//!
//! # Caveats
//!
//! - Index functions must be pure and cheap: they run under the cache's write lock, twice per
//!   change (on the old and the new version), and must give the same values for the same
//!   object.
//! - On Kubernetes, resourceVersions are opaque by contract; comparing them as counters is
//!   what makes read-your-writes work without waiting for the watch, and where they are not
//!   counters the rule degrades to last-writer-wins.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::Resource;
use tokio::sync::watch;

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

/// One change to the cache, as reported to [`Informer::on_change`](crate::Informer::on_change)
/// handlers and returned by [`Cache::apply`] and [`Cache::delete`].
#[derive(Debug)]
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

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Change::Applied { old, new } => {
                Change::Applied { old: old.clone(), new: Arc::clone(new) }
            }
            Change::Deleted(obj) => Change::Deleted(Arc::clone(obj)),
        }
    }
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

/// What the cache's indexes are made of: the values an object is filed under (none, one or
/// several). See the module's caveats.
pub type IndexFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// A misuse of the cache's indexes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// [`Cache::add_index`] with a name already taken.
    #[error("the cache already has an index named {0:?}")]
    IndexExists(&'static str),
    /// A lookup in an index that was never added.
    #[error("the cache has no index named {0:?}")]
    NoIndex(String),
}

/// The objects filed under one value of one index, in key order.
type Bucket<K> = BTreeMap<ObjectKey, Arc<K>>;

struct Index<K> {
    name: &'static str,
    func: IndexFn<K>,
    buckets: HashMap<String, Bucket<K>>,
}

impl<K> Index<K> {
    fn file(&mut self, key: &ObjectKey, obj: &Arc<K>, values: Vec<String>) {
        for value in values {
            self.buckets.entry(value).or_default().insert(key.clone(), Arc::clone(obj));
        }
    }

    fn unfile(&mut self, key: &ObjectKey, value: &str) {
        if let Some(bucket) = self.buckets.get_mut(value) {
            bucket.remove(key);
            if bucket.is_empty() {
                self.buckets.remove(value);
            }
        }
    }
}

struct Contents<K> {
    objects: BTreeMap<ObjectKey, Arc<K>>,
    indexes: Vec<Index<K>>,
    /// Objects the caller deleted ([`Cache::delete`]), with the version deleted.
    tombstones: HashMap<ObjectKey, Option<String>>,
}

impl<K> Contents<K> {
    fn index(&self, name: &str) -> Result<&Index<K>, CacheError> {
        self.indexes
            .iter()
            .find(|index| index.name == name)
            .ok_or_else(|| CacheError::NoIndex(name.to_owned()))
    }

    /// Puts `obj` under `key` in the map and every index; returns the version it replaced.
    fn put(&mut self, key: ObjectKey, obj: Arc<K>) -> Option<Arc<K>> {
        let old = self.objects.insert(key.clone(), Arc::clone(&obj));
        for index in &mut self.indexes {
            let values = (index.func)(&obj);
            if let Some(old) = &old {
                for value in (index.func)(old) {
                    if !values.contains(&value) {
                        index.unfile(&key, &value);
                    }
                }
            }
            index.file(&key, &obj, values);
        }
        old
    }

    /// Removes `key` from the map and every index; returns the version it held.
    fn take(&mut self, key: &ObjectKey) -> Option<Arc<K>> {
        let old = self.objects.remove(key)?;
        for index in &mut self.indexes {
            for value in (index.func)(&old) {
                index.unfile(key, &value);
            }
        }
        Some(old)
    }
}

impl<K: Resource> Contents<K> {
    /// Stores `obj` unless a tombstone or the version held says it is old; the change, if any.
    fn apply(&mut self, obj: Arc<K>) -> Option<Change<K>> {
        let key = ObjectKey::of(obj.as_ref());
        if let Some(deleted) = self.tombstones.get(&key) {
            if !after(obj.meta().resource_version.as_ref(), deleted.as_ref()) {
                return None;
            }
            self.tombstones.remove(&key);
        }
        if self.objects.get(&key).is_some_and(|held| !supersedes(held.as_ref(), obj.as_ref())) {
            return None;
        }
        let old = self.put(key, Arc::clone(&obj));
        Some(Change::Applied { old, new: obj })
    }
}

/// Parses two resourceVersions as counters, when both are.
fn counters(a: Option<&String>, b: Option<&String>) -> Option<(u64, u64)> {
    Some((a?.parse().ok()?, b?.parse().ok()?))
}

/// Whether version `new` may pass a tombstone of version `deleted`: it is newer, or the two
/// cannot be compared.
fn after(new: Option<&String>, deleted: Option<&String>) -> bool {
    counters(new, deleted).is_none_or(|(new, deleted)| new > deleted)
}

/// Whether `new` may replace `held` (see the module's guarantees).
fn supersedes<K: Resource>(held: &K, new: &K) -> bool {
    let (held, new) = (held.meta(), new.meta());
    match counters(held.resource_version.as_ref(), new.resource_version.as_ref()) {
        Some((held, new)) => new > held,
        None => {
            !(held.uid == new.uid
                && held.resource_version.is_some()
                && held.resource_version == new.resource_version)
        }
    }
}

/// Whether the version held is strictly newer than `other` (both counters).
fn held_is_newer<K: Resource>(held: &K, other: &K) -> bool {
    counters(held.meta().resource_version.as_ref(), other.meta().resource_version.as_ref())
        .is_some_and(|(held, other)| held > other)
}

/// A change handler; see [`Informer::on_change`](crate::Informer::on_change).
pub(crate) type Handler<K> = Box<dyn Fn(&Change<K>) + Send + Sync>;

/// Names a handler added to a [`SharedInformer`](crate::SharedInformer), to remove it. It
/// holds the handler's "still wanted" flag, so removing needs no lock and may happen inside a
/// handler (a user dropped by its own handler removes it from there).
#[derive(Debug, Clone)]
pub struct HandlerId(Arc<AtomicBool>);

/// The handlers of one cache, in the order they were added, each with its flag.
struct Handlers<K> {
    list: Vec<(Arc<AtomicBool>, Handler<K>)>,
}

struct CacheInner<K> {
    contents: RwLock<Contents<K>>,
    ready: watch::Sender<bool>,
    /// Held while the cache changes and its handlers are told, and while a handler is added
    /// (and replayed the cache), so every handler sees every change once and in order, from
    /// the watch or from a writer, however late it was added. Taken before `contents`.
    handlers: Mutex<Handlers<K>>,
}

/// A cloneable handle to the objects of one kind, kept up to date by an
/// [`Informer`](crate::Informer); see the [module documentation](self).
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
        let contents = self.read();
        let indexes: Vec<&str> = contents.indexes.iter().map(|index| index.name).collect();
        f.debug_struct("Cache")
            .field("len", &contents.objects.len())
            .field("indexes", &indexes)
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(CacheInner {
                contents: RwLock::new(Contents {
                    objects: BTreeMap::new(),
                    indexes: Vec::new(),
                    tombstones: HashMap::new(),
                }),
                ready: watch::Sender::new(false),
                handlers: Mutex::new(Handlers { list: Vec::new() }),
            }),
        }
    }
}

/// The objects one value of an index files, borrowed from the cache for the length of a
/// [`Cache::with_index`] call, in key order.
pub struct Indexed<'a, K> {
    bucket: Option<&'a Bucket<K>>,
}

impl<'a, K> Indexed<'a, K> {
    /// How many objects the value files.
    pub fn len(&self) -> usize {
        self.bucket.map_or(0, BTreeMap::len)
    }

    /// Whether the value files no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects, in key order (a cloneable iterator, so it can be cycled).
    pub fn iter(&self) -> impl Iterator<Item = &'a Arc<K>> + Clone + 'a {
        self.bucket.into_iter().flat_map(BTreeMap::values)
    }
}

impl<K> Cache<K> {
    fn read(&self) -> RwLockReadGuard<'_, Contents<K>> {
        // Writers never panic half-way through an update, so a poisoned lock is consistent.
        self.inner.contents.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Contents<K>> {
        self.inner.contents.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached object with this key.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.read().objects.get(key).cloned()
    }

    /// The cached object `namespace/name`.
    pub fn get_named(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.get(&ObjectKey::new(namespace, name))
    }

    /// Every cached object, ordered by namespace, then name.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.read().objects.values().cloned().collect()
    }

    /// The cached objects of one namespace, ordered by name.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let from = ObjectKey::new(namespace, "");
        self.read()
            .objects
            .range(from..)
            .take_while(|(key, _)| key.namespace == namespace)
            .map(|(_, obj)| Arc::clone(obj))
            .collect()
    }

    /// The cached objects for which `keep` is true, ordered by namespace, then name.
    pub fn filter(&self, mut keep: impl FnMut(&K) -> bool) -> Vec<Arc<K>> {
        self.read().objects.values().filter(|obj| keep(obj)).cloned().collect()
    }

    /// The number of cached objects.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Whether the cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.read().objects.is_empty()
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

    fn handlers(&self) -> MutexGuard<'_, Handlers<K>> {
        // Handlers are called under this lock; one that panicked left the list intact.
        self.inner.handlers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `handler`: it is first called with every cached object as new (`Applied` without
    /// `old`, as a first list reports them), then with every later change.
    pub(crate) fn add_handler(&self, handler: Handler<K>) -> HandlerId {
        let mut handlers = self.handlers();
        handlers.list.retain(|(live, _)| live.load(Ordering::Acquire));
        for obj in self.list() {
            handler(&Change::Applied { old: None, new: obj });
        }
        let live = Arc::new(AtomicBool::new(true));
        handlers.list.push((Arc::clone(&live), handler));
        HandlerId(live)
    }

    /// Removes a handler: no change reaches it after this returns. Safe inside a handler: the
    /// entry is only marked there, and dropped by the next change of the handler list.
    pub(crate) fn remove_handler(&self, id: HandlerId) {
        id.0.store(false, Ordering::Release);
        if let Ok(mut handlers) = self.inner.handlers.try_lock() {
            handlers.list.retain(|(live, _)| live.load(Ordering::Acquire));
        }
    }

    /// The number of handlers still wanted.
    pub(crate) fn handler_count(&self) -> usize {
        self.handlers().list.iter().filter(|(live, _)| live.load(Ordering::Acquire)).count()
    }

    /// Applies `update` and tells every handler each change it returns, all under the
    /// handlers' lock.
    pub(crate) fn deliver<I: IntoIterator<Item = Change<K>>>(
        &self,
        update: impl FnOnce(&Self) -> I,
    ) {
        let handlers = self.handlers();
        for change in update(self) {
            for (live, handler) in &handlers.list {
                if live.load(Ordering::Acquire) {
                    handler(&change);
                }
            }
        }
    }

    pub(crate) fn mark_ready(&self) {
        self.inner.ready.send_replace(true);
    }

    /// Adds the index `name`: from now on every object is filed under the values `func`
    /// returns for it (see the module's caveats). Objects already cached are filed at once, so
    /// an index may be added before or after the cache fills.
    pub fn add_index(
        &self,
        name: &'static str,
        func: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Result<(), CacheError> {
        let mut contents = self.write();
        if contents.indexes.iter().any(|index| index.name == name) {
            return Err(CacheError::IndexExists(name));
        }
        let mut index = Index { name, func: Arc::new(func), buckets: HashMap::new() };
        for (key, obj) in &contents.objects {
            let values = (index.func)(obj);
            index.file(key, obj, values);
        }
        contents.indexes.push(index);
        Ok(())
    }

    /// The objects index `name` files under `value`, in key order (client-go's `ByIndex`).
    pub fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<K>>, CacheError> {
        self.with_index(name, value, |found| found.iter().cloned().collect())
    }

    /// The keys of the objects index `name` files under `value`, in order (client-go's
    /// `IndexKeys`).
    pub fn index_keys(&self, name: &str, value: &str) -> Result<Vec<ObjectKey>, CacheError> {
        let contents = self.read();
        let index = contents.index(name)?;
        Ok(index.buckets.get(value).map(|b| b.keys().cloned().collect()).unwrap_or_default())
    }

    /// `f` of the objects index `name` files under `value`, borrowed under the cache's read
    /// lock (keep `f` short): for answers that are a part of a large bucket.
    pub fn with_index<T>(
        &self,
        name: &str,
        value: &str,
        f: impl FnOnce(Indexed<'_, K>) -> T,
    ) -> Result<T, CacheError> {
        let contents = self.read();
        let index = contents.index(name)?;
        Ok(f(Indexed { bucket: index.buckets.get(value) }))
    }

    /// Every value index `name` files at least one object under, in no particular order
    /// (client-go's `ListIndexFuncValues`).
    pub fn index_values(&self, name: &str) -> Result<Vec<String>, CacheError> {
        Ok(self.read().index(name)?.buckets.keys().cloned().collect())
    }

    /// How many values index `name` files at least one object under.
    pub fn index_value_count(&self, name: &str) -> Result<usize, CacheError> {
        Ok(self.read().index(name)?.buckets.len())
    }

    /// Every object index `name` files under at least one value, each once, in key order.
    pub fn indexed(&self, name: &str) -> Result<Vec<Arc<K>>, CacheError> {
        let contents = self.read();
        let index = contents.index(name)?;
        let mut found: Vec<(&ObjectKey, &Arc<K>)> =
            index.buckets.values().flat_map(|bucket| bucket.iter()).collect();
        found.sort_unstable_by(|a, b| a.0.cmp(b.0));
        found.dedup_by(|a, b| a.0 == b.0);
        Ok(found.into_iter().map(|(_, obj)| Arc::clone(obj)).collect())
    }
}

impl<K: Resource> Cache<K> {
    /// Records a version of an object the caller wrote (read-your-writes): stored unless the
    /// cache holds a newer one or a tombstone says it was deleted (see the module's
    /// guarantees). Returns the change, or `None` when nothing changed. Every handler of the
    /// informer is told of the change too, the caller's own included (the watch's echo of the
    /// same version is then not reported again): a cache shared with other users must not
    /// swallow a change they would have seen in a cache of their own.
    pub fn apply(&self, obj: Arc<K>) -> Option<Change<K>> {
        let mut change = None;
        self.deliver(|cache| {
            change = cache.write().apply(obj);
            change.clone()
        });
        change
    }

    /// Records that the caller deleted `obj`: it is removed, and versions up to `obj`'s are
    /// ignored until the watch reports the deletion. Returns the change (with the last cached
    /// state), or `None` when the cache did not hold it; the informer's handlers are told, as
    /// by [`Cache::apply`].
    pub fn delete(&self, obj: &K) -> Option<Change<K>> {
        let mut change = None;
        self.deliver(|cache| {
            let key = ObjectKey::of(obj);
            let mut contents = cache.write();
            let old = contents.take(&key);
            contents.tombstones.insert(key, obj.meta().resource_version.clone());
            change = old.map(Change::Deleted);
            change.clone()
        });
        change
    }

    /// Stores a version the watch reported (the handlers are told by the caller).
    pub(crate) fn observe(&self, obj: Arc<K>) -> Option<Change<K>> {
        self.write().apply(obj)
    }

    /// Removes the object a watch reported deleted (and its tombstone); returns the change
    /// (with the store's last state), or `None` when the cache did not hold it or holds a
    /// newer version of it (a recreation).
    pub(crate) fn remove_observed(&self, obj: Arc<K>) -> Option<Change<K>> {
        let key = ObjectKey::of(obj.as_ref());
        let mut contents = self.write();
        contents.tombstones.remove(&key);
        if contents.objects.get(&key).is_some_and(|held| held_is_newer(held.as_ref(), &obj)) {
            return None;
        }
        contents.take(&key).map(|_| Change::Deleted(obj))
    }

    /// Replaces the whole content with a list result; returns what differs. A tombstone stays
    /// only for an object the list still shows (the list raced the deletion).
    pub(crate) fn replace(&self, items: Vec<Arc<K>>) -> Vec<Change<K>> {
        let fresh: BTreeMap<ObjectKey, Arc<K>> =
            items.into_iter().map(|obj| (ObjectKey::of(obj.as_ref()), obj)).collect();
        let mut contents = self.write();
        let mut changes = Vec::new();
        let gone: Vec<ObjectKey> =
            contents.objects.keys().filter(|key| !fresh.contains_key(*key)).cloned().collect();
        for key in gone {
            if let Some(old) = contents.take(&key) {
                changes.push(Change::Deleted(old));
            }
        }
        contents.tombstones.retain(|key, _| fresh.contains_key(key));
        changes.extend(fresh.into_values().filter_map(|obj| contents.apply(obj)));
        changes
    }
}

#[cfg(test)]
mod tests;
