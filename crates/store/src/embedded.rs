//! The embedded durable backend: [`EmbeddedStore`], the [`Store`] on one machine, in one file.
//!
//! # Shape
//!
//! ```text
//!  callers (any task)           writer thread (one)                      readers / watchers
//!  ─────────────────            ───────────────────                      ──────────────────
//!  serialize K → JSON  ──queue──▶ drain the queue (a batch)
//!                                validate + apply each request in order
//!                                (own rv each; owner cascade included)
//!                                one redb write txn, one commit (fsync)
//!                                publish: objects + history ──RwLock──▶ get/list: Arc clones
//!                                notify (last rv)      ──tokio watch──▶ watch streams
//!  ◀──────── reply ───────────── reply to every request of the batch
//! ```
//!
//! - **Group commit.** One thread owns write transactions. It drains every request queued
//!   while the previous commit was running (waiting up to [`EmbeddedOptions::commit_linger`]
//!   for as many as the previous batch held), applies them in order to its own copy of the
//!   current objects, writes what the batch touched in one transaction and commits it with
//!   [`redb::Durability::Immediate`]: one `fsync` acknowledges the whole batch. A request that
//!   fails validation (conflict, not found, invalid) changes nothing and does not affect the
//!   others. A failed commit fails the whole batch with [`StoreError::Internal`] and publishes
//!   nothing; since a failed commit may still have reached the disk, the store then refuses
//!   every write until it has reopened its file and learnt whether that batch landed (tried at
//!   most once a second, so a full disk stops writes only until space is freed; see
//!   `writer.rs`).
//! - **Reads from memory.** The committed objects live in an in-memory index (rebuilt from the
//!   file at open), one immutable `Entry` per version holding the JSON, the typed metadata and
//!   a lazily filled typed object (`OnceLock<Arc<dyn Any>>`, downcast to `Arc<K>`). A list is a
//!   range scan over `(kind, namespace, name)` plus an `Arc` clone per item; a get clones one `K`.
//! - **Watch history.** Every change (one per resourceVersion) goes into a bounded ring of the
//!   last [`EmbeddedOptions::history_size`] changes. A watch is a cursor over that ring (see
//!   `watch.rs`); a cursor older than the ring gets [`StoreError::Gone`]. The ring is not
//!   persisted: after a restart it starts at the current resourceVersion.
//!
//! # Invariants
//!
//! 1. The resourceVersion counter is global and strictly increasing, and every value of it names
//!    exactly one change (create, update, deletion start, removal, cascade step). It is stored in
//!    the same transaction as the objects it versions, so after any crash the file holds the
//!    counter of the last durable commit and every stored object's rv is at most the counter.
//! 2. A write is acknowledged only after the commit that contains it has returned from `fsync`;
//!    an acknowledged write survives `kill -9` and power loss (given the assumptions below).
//! 3. Readers never see uncommitted state: the index and the history are updated after the
//!    commit, under one lock, before any caller is answered, so a caller reads its own writes
//!    and a watch started from any rv a caller has seen misses nothing after it.
//! 4. The history holds changes `oldest+1 ..= rv` without gaps, in commit order; a watch from
//!    `r` with `r >= oldest` sees exactly the changes after `r` that match its filter.
//! 5. A request applies completely or not at all; an owner cascade is part of the request that
//!    removed the owner and commits with it.
//! 6. Only the writer thread writes the file; one process (one [`EmbeddedStore`] tree of
//!    clones) opens it at a time, enforced by redb's file lock.
//! 7. Server-owned metadata (uid, creationTimestamp, generation, deletionTimestamp,
//!    resourceVersion) is only ever set by the writer.
//! 8. What readers are shown is a prefix of what a reopen finds: after a failed commit (whose
//!    outcome on disk is unknown) the writer writes nothing more until the store is reopened.
//!
//! # Assumptions about the underlying media
//!
//! These are redb's (see its `docs/design.md`), which the store inherits:
//!
//! 1. After `fsync` returns, the data written before it is durable.
//! 2. Single-byte writes are atomic: a byte is written completely or not at all, even on power
//!    loss.
//! 3. "Powersafe overwrite": writing a range of bytes never changes bytes outside that range,
//!    even when a crash interrupts the write.
//!
//! Beyond them, the store assumes that no other program writes the file (redb's lock keeps out
//! other opens, not arbitrary writers), and it uses the wall clock only for timestamps, never
//! for order: order is the resourceVersion counter.
//!
//! # Why redb
//!
//! - **Pure Rust, no C build**: nothing to cross-compile or link; `cargo build` is the whole
//!   story (unlike RocksDB or SQLite bindings).
//! - **Crash-safe commits with one `fsync`**: its default 1-phase + checksum commit writes the
//!   new pages and a checksummed (XXH3-128 Merkle) transaction header, flips the primary slot,
//!   then fsyncs once; after a crash a commit whose checksums do not verify is rolled back to
//!   the previous one. That single fsync per batch is what group commit amortizes.
//! - **MVCC readers**: read transactions never block the writer (the store reads from memory
//!   anyway, but the rebuild at open and any future tooling can read beside a running writer).
//! - **One file**, an exclusive lock on it, a stable file format, and a B-tree with tuple keys
//!   that fits `(kind, namespace, name)` directly.
//!
//! # Figures
//!
//! `cargo bench -p oka-store --bench store`; the current figures are in `docs/benchmarks.md`
//! (Store). A durable write costs one `O_DSYNC` write of the log (~0.25 ms on a virtio disk);
//! concurrent writers share it (group commit).
//!
//! # Semantics beyond the trait's
//!
//! As the Kubernetes API server does: create ignores `status` (custom resources with a status
//! subresource) and refuses a set `resourceVersion`; `generateName` appends five random
//! characters and retries on a clash; an update or status update that changes nothing is not a
//! write (no new resourceVersion, no event); starting an object's deletion bumps its
//! `generation` and sets `deletionGracePeriodSeconds: 0`; empty label, annotation, finalizer
//! and ownerReference lists are stored as absent. The owner cascade runs synchronously, breadth
//! first, visiting one owner's dependents in `(kind, namespace, name)` order. Dependents are
//! found by `ownerReferences[].uid` alone, in any kind and namespace; an object whose owners
//! never existed is not collected (only the removal of an owner starts a cascade).
//!
//! A watch from `""` starts at the current resourceVersion without synthetic `Added` events;
//! one from a resourceVersion the store has not reached is [`StoreError::Invalid`]. Watches
//! send no bookmarks.

mod object;
#[cfg(test)]
mod tests;
mod watch;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use redb::DatabaseError;

use self::object::{Entry, KindInfo, ObjKey, bind_namespace, check_name, check_namespace, split};
use self::writer::{Op, Outcome, Request, Shared, State, Writer};
use crate::{
    Deleted, Object, ObjectList, Preconditions, RawWatchStream, Result, Selector, Store,
    StoreError, WatchEvent, WatchStream,
};

/// Settings of an [`EmbeddedStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// How many changes the watch history keeps in memory. A watch can start from any
    /// resourceVersion within the last `history_size` changes, and a watch stream that falls
    /// this far behind ends with [`StoreError::Gone`]. Default 10,000.
    pub history_size: usize,
    /// The most writes one commit takes. Default 1,024.
    pub max_batch: usize,
    /// The size of redb's page cache, in bytes. Reads are served from the store's own index,
    /// so this only speeds up writes to a large file. Default 64 MiB.
    pub cache_size: usize,
    /// How long the writer waits, before committing a batch smaller than the previous one, for
    /// the callers answered by that batch to send their next writes. Concurrent writers then
    /// share one `fsync` instead of splitting into alternating small and large batches; a lone
    /// writer (previous batch of one) never waits. Default 250 µs; zero disables it.
    pub commit_linger: Duration,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            history_size: 10_000,
            max_batch: 1024,
            cache_size: 64 << 20,
            commit_linger: Duration::from_micros(250),
        }
    }
}

/// A watch stream whose events carry the instant their change was committed; see
/// [`EmbeddedStore::watch_timed`].
pub type TimedWatchStream<K> = BoxStream<'static, Result<(WatchEvent<K>, Instant)>>;

/// The embedded, durable [`Store`]: one redb file, one writer thread, reads from memory.
///
/// Cloning is cheap and shares the store. The writer thread stops, and the file is closed,
/// when [`EmbeddedStore::close`] is called or the last clone is dropped; watch streams end then.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

struct Inner {
    path: PathBuf,
    /// The writer's queue; `None` once closed.
    requests: Mutex<Option<mpsc::Sender<Request>>>,
    shared: Arc<Shared>,
    /// A receiver to clone for each watch stream.
    notify: tokio::sync::watch::Receiver<u64>,
    writer: Mutex<Option<JoinHandle<Result<()>>>>,
    closed: AtomicBool,
    metrics: Arc<crate::metrics::StoreMetrics>,
}

impl Inner {
    /// Stops accepting writes, lets the writer finish what is queued, and waits for it to
    /// close the file.
    fn shutdown(&self) -> Result<()> {
        self.closed.store(true, Ordering::SeqCst);
        drop(self.requests.lock().unwrap_or_else(PoisonError::into_inner).take());
        let handle = self.writer.lock().unwrap_or_else(PoisonError::into_inner).take();
        match handle {
            None => Ok(()),
            Some(handle) => match handle.join() {
                Ok(result) => result,
                Err(_) => Err(StoreError::Internal("the store's writer thread panicked".into())),
            },
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(path = %self.path.display(), error = %e, "embedded store did not close cleanly");
        }
    }
}

/// The error for a store file that does not verify: what was found, and what the operator can
/// do about it.
fn damaged(path: &str, why: &str) -> StoreError {
    StoreError::Internal(format!(
        "the store database {path} is damaged and will not be used ({why}); restore it from a \
         backup, or move it away to start with an empty store (the objects it holds are then \
         lost)"
    ))
}

/// A repair callback that says so when redb falls back to the commit before the last one
/// (the progress it reports once the last commit has failed verification).
fn warn_on_rollback(path: String) -> impl Fn(&mut redb::RepairSession) + 'static {
    move |session| {
        if session.progress() > 0.0 && session.progress() < 0.5 {
            tracing::warn!(
                path = %path,
                "the store's last commit does not verify: rolled back to the commit before it \
                 (a commit a crash interrupted, which was never acknowledged, or damage to the file)"
            );
        }
    }
}

/// The text of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "the file's structure is invalid".to_owned())
}

/// Opens and verifies the redb file at `path` and loads every object (see
/// [`EmbeddedStore::open`]); also how the writer reopens the file after a failed commit.
fn open_file(path: &Path, cache_size: usize) -> Result<(redb::Database, writer::Objects, u64)> {
    let shown = path.display().to_string();
    // redb asserts some invariants of the file it reads with panics: a damaged file must be an
    // error naming it, not a crash.
    let opened = std::panic::catch_unwind(|| {
        let db = redb::Database::builder()
            .set_cache_size(cache_size)
            .set_check_integrity_on_open(true)
            .set_repair_callback(warn_on_rollback(shown.clone()))
            .create(path)
            .map_err(|e| match e {
                DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                    "the store database {shown} is already open, by this process or another; \
                     only one store may open it at a time"
                )),
                DatabaseError::Storage(redb::StorageError::Corrupted(why)) => {
                    damaged(&shown, &format!("redb: {why}"))
                }
                DatabaseError::Storage(redb::StorageError::Io(e)) => {
                    StoreError::Unavailable(format!("cannot open the store database {shown}: {e}"))
                }
                e => StoreError::Internal(format!("cannot open the store database {shown}: {e}")),
            })?;
        let (objects, rv) = writer::load(&db).map_err(|e| match e {
            StoreError::Internal(why) => {
                StoreError::Internal(format!("cannot load the store database {shown}: {why}"))
            }
            e => e,
        })?;
        Ok((db, objects, rv))
    });
    match opened {
        Ok(opened) => opened,
        Err(panic) => Err(damaged(&shown, &format!("redb: {}", panic_message(panic.as_ref())))),
    }
}

impl EmbeddedStore {
    /// Opens the store in the redb file at `path`, creating it if needed, loads every object
    /// into memory and starts the writer thread.
    ///
    /// Every open verifies the file: the checksum of every page the committed trees use (redb's
    /// integrity check, a read of the whole file) and every stored object. A file damaged since
    /// it was written is refused, never trusted, because a store that loads damaged objects
    /// hands them to every controller and writes them back. If the last commit does not verify
    /// but the one before it does, redb rolls back to that one: that is how a commit torn by a
    /// crash (never acknowledged) is recovered, and it is logged as a warning since damage to the
    /// last commit looks the same.
    ///
    /// Fails with [`StoreError::Unavailable`] when the file is already open, by this process or
    /// another (only one store may hold it), and with [`StoreError::Internal`] naming the file
    /// when it cannot be read or is damaged.
    pub fn open(path: &Path, options: EmbeddedOptions) -> Result<Self> {
        let (db, objects, rv) = open_file(path, options.cache_size)?;
        let path_owned = path.to_owned();
        let cache_size = options.cache_size;
        let reopen: writer::Reopen = Box::new(move || open_file(&path_owned, cache_size));
        EmbeddedStore::start(db, objects, rv, Some(reopen), &options, path)
    }

    /// Opens the store on a redb storage backend other than a file (fault-injection tests); a
    /// `reopenable` one recovers from a failed commit by opening the backend again, as a file
    /// store does.
    #[cfg(test)]
    pub(crate) fn open_with_backend<B: redb::StorageBackend + Clone>(
        backend: B,
        options: EmbeddedOptions,
        reopenable: bool,
    ) -> Result<Self> {
        let open = move |backend: B| {
            let db = redb::Database::builder()
                .set_check_integrity_on_open(true)
                .create_with_backend(backend)
                .map_err(|e| {
                    StoreError::Internal(format!("cannot open the store database: {e}"))
                })?;
            let (objects, rv) = writer::load(&db)?;
            Ok((db, objects, rv))
        };
        let (db, objects, rv) = open(backend.clone())?;
        let reopen: Option<writer::Reopen> =
            reopenable.then(|| Box::new(move || open(backend.clone())) as writer::Reopen);
        EmbeddedStore::start(db, objects, rv, reopen, &options, Path::new("(test backend)"))
    }

    /// Starts the writer thread on the loaded objects.
    fn start(
        db: redb::Database,
        objects: writer::Objects,
        rv: u64,
        reopen: Option<writer::Reopen>,
        options: &EmbeddedOptions,
        path: &Path,
    ) -> Result<Self> {
        let count = objects.len();
        let shared = Arc::new(Shared::new(objects.clone(), rv, options.history_size));
        let (requests, queue) = mpsc::channel();
        let (notify_tx, notify) = tokio::sync::watch::channel(rv);
        let metrics = Arc::new(crate::metrics::StoreMetrics::default());
        let writer = Writer {
            db: Some(db),
            reopen,
            requests: queue,
            state: State::new(objects, rv),
            shared: Arc::clone(&shared),
            notify: notify_tx,
            max_batch: options.max_batch.max(1),
            linger: options.commit_linger,
            failed: None,
            unconfirmed: None,
            next_recovery: Instant::now(),
            metrics: Arc::clone(&metrics),
        };
        let handle = std::thread::Builder::new()
            .name("oka-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| {
                StoreError::Internal(format!("cannot start the store writer thread: {e}"))
            })?;
        tracing::info!(path = %path.display(), objects = count, resource_version = rv, "embedded store open");
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                requests: Mutex::new(Some(requests)),
                shared,
                notify,
                writer: Mutex::new(Some(handle)),
                closed: AtomicBool::new(false),
                metrics,
            }),
        })
    }

    /// Closes the store for every clone: writes already queued are committed, later calls fail
    /// with [`StoreError::Unavailable`], watch streams end, and the file is released when this
    /// returns. Blocks for at most one commit. Closing twice is a no-op.
    pub fn close(&self) -> Result<()> {
        self.inner.shutdown()
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether the store takes requests (not closed).
    pub fn is_open(&self) -> bool {
        !self.inner.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Registers the store's series ([`crate::metrics`]) into `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let shared = Arc::downgrade(&self.inner.shared);
        self.inner.metrics.register(registry, move || {
            shared.upgrade().map_or((0, 0), |shared| {
                let view = shared.read();
                (view.objects.len(), view.rv)
            })
        });
    }

    /// The last committed resourceVersion.
    pub fn resource_version(&self) -> String {
        self.inner.shared.read().rv.to_string()
    }

    /// Like [`Store::watch`], with the instant each event's change was committed, to measure
    /// delivery latency.
    pub fn watch_timed<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<TimedWatchStream<K>> {
        let (filter, from) = self.watch_start::<K>(namespace, selector, resource_version)?;
        let lag = self.inner.metrics.watch_lag.clone();
        let notify = self.inner.notify.clone();
        Ok(watch::stream(Arc::clone(&self.inner.shared), notify, filter, from, lag))
    }

    /// Where a watch of `K` starts, and what it lets through; refuses a resourceVersion this
    /// store does not hold.
    fn watch_start<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<(watch::Filter, u64)> {
        self.check_open()?;
        if let Some(ns) = namespace {
            check_namespace(ns)?;
        }
        let from = {
            let view = self.inner.shared.read();
            if resource_version.is_empty() {
                view.rv
            } else {
                let from: u64 = resource_version.parse().map_err(|_| {
                    StoreError::Invalid(format!(
                        "resourceVersion `{resource_version}` is not one of this store's \
                         (a decimal number)"
                    ))
                })?;
                if from > view.rv {
                    return Err(StoreError::Invalid(format!(
                        "resourceVersion {from} is newer than the store's ({})",
                        view.rv
                    )));
                }
                view.events_after(from, 0)?;
                from
            }
        };
        let filter = watch::Filter {
            kind: KindInfo::of::<K>().key,
            namespace: namespace.map(str::to_owned),
            selector: selector.clone(),
        };
        Ok((filter, from))
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) { Err(closed()) } else { Ok(()) }
    }

    /// Queues a write and waits for its commit.
    async fn submit(&self, kind: KindInfo, namespace: &str, op: Op) -> Result<Outcome> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        {
            let requests = self.inner.requests.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(requests) = requests.as_ref() else { return Err(closed()) };
            let request = Request { kind, namespace: namespace.to_owned(), op, reply };
            requests
                .send(request)
                .map_err(|_| StoreError::Unavailable("the store's writer has stopped".into()))?;
        }
        answer.await.map_err(|_| {
            StoreError::Internal("the store's writer stopped before answering".into())
        })?
    }

    fn lookup(&self, kind: &KindInfo, namespace: &str, name: &str) -> Option<Arc<Entry>> {
        let key = ObjKey {
            kind: Arc::clone(&kind.key),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.inner.shared.read().objects.get(&key).cloned()
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the store is closed".into())
}

/// The caller's own copy of a written object.
fn owned<K: Object>(entry: &Entry) -> Result<K> {
    Ok(K::clone(&*entry.typed::<K>()?))
}

impl Store for EmbeddedStore {
    async fn create<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.check_open()?;
        check_namespace(namespace)?;
        let (mut meta, body) = split(obj)?;
        bind_namespace(&mut meta, namespace)?;
        match self.submit(KindInfo::of::<K>(), namespace, Op::Create { meta, body }).await? {
            Outcome::Written(entry) | Outcome::Deleted { entry, .. } => owned(&entry),
        }
    }

    async fn get<K: Object>(&self, namespace: &str, name: &str) -> Result<K> {
        self.check_open()?;
        check_namespace(namespace)?;
        check_name(name)?;
        let kind = KindInfo::of::<K>();
        match self.lookup(&kind, namespace, name) {
            Some(entry) => owned(&entry),
            None => Err(kind.not_found(namespace, name)),
        }
    }

    async fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Result<ObjectList<K>> {
        self.check_open()?;
        if let Some(ns) = namespace {
            check_namespace(ns)?;
        }
        let kind = KindInfo::of::<K>().key;
        // Under the lock: the typed objects already cached (an Arc clone each), and the
        // entries still to deserialize, which is done after the lock is released.
        let mut items: Vec<Option<Arc<K>>> = Vec::new();
        let mut uncached: Vec<(usize, Arc<Entry>)> = Vec::new();
        let rv = {
            let view = self.inner.shared.read();
            let start = ObjKey {
                kind: Arc::clone(&kind),
                namespace: namespace.unwrap_or_default().to_owned(),
                name: String::new(),
            };
            let matching = view
                .objects
                .range(start..)
                .take_while(|(key, _)| {
                    key.kind == kind && namespace.is_none_or(|ns| key.namespace == ns)
                })
                .filter(|(_, entry)| entry.matches(selector));
            for (_, entry) in matching {
                let cached = entry.cached::<K>();
                if cached.is_none() {
                    uncached.push((items.len(), Arc::clone(entry)));
                }
                items.push(cached);
            }
            view.rv
        };
        for (i, entry) in uncached {
            items[i] = Some(entry.typed::<K>()?);
        }
        let items = items.into_iter().flatten().collect();
        Ok(ObjectList { items, resource_version: rv.to_string() })
    }

    async fn update<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.check_open()?;
        check_namespace(namespace)?;
        let (mut meta, body) = split(obj)?;
        bind_namespace(&mut meta, namespace)?;
        check_name(meta.name.as_deref().unwrap_or_default())?;
        match self.submit(KindInfo::of::<K>(), namespace, Op::Update { meta, body }).await? {
            Outcome::Written(entry) | Outcome::Deleted { entry, .. } => owned(&entry),
        }
    }

    async fn update_status<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.check_open()?;
        check_namespace(namespace)?;
        let (mut meta, body) = split(obj)?;
        bind_namespace(&mut meta, namespace)?;
        check_name(meta.name.as_deref().unwrap_or_default())?;
        match self.submit(KindInfo::of::<K>(), namespace, Op::UpdateStatus { meta, body }).await? {
            Outcome::Written(entry) | Outcome::Deleted { entry, .. } => owned(&entry),
        }
    }

    async fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted<K>> {
        self.check_open()?;
        check_namespace(namespace)?;
        check_name(name)?;
        let op = Op::Delete { name: name.to_owned(), preconditions: preconditions.clone() };
        match self.submit(KindInfo::of::<K>(), namespace, op).await? {
            Outcome::Deleted { entry, finalizing: true } => Ok(Deleted::Finalizing(owned(&entry)?)),
            Outcome::Deleted { entry, finalizing: false } | Outcome::Written(entry) => {
                Ok(Deleted::Gone(owned(&entry)?))
            }
        }
    }

    async fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<WatchStream<K>> {
        let timed = self.watch_timed::<K>(namespace, selector, resource_version)?;
        Ok(timed.map(|item| item.map(|(event, _)| event)).boxed())
    }

    async fn watch_raw<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<RawWatchStream> {
        let (filter, from) = self.watch_start::<K>(namespace, selector, resource_version)?;
        let shared = Arc::clone(&self.inner.shared);
        let lag = self.inner.metrics.watch_lag.clone();
        let raw = watch::raw_stream(shared, self.inner.notify.clone(), filter, from, lag);
        Ok(raw.map(|item| item.map(|(event, _)| event)).boxed())
    }
}
