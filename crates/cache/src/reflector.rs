//! The list+watch loop ([`Informer`]) that keeps a [`Cache`] of one kind.
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
//! - The cache is filled by one informer only; other writers record only their own writes
//!   ([`Cache::apply`], [`Cache::delete`]), which the watch later confirms.
//! - A handler sees an object's change after the cache holds it, so a reconcile triggered by
//!   it reads that version or a newer one.
//! - A relist reports deletions that happened while the watch was broken, so the cache never
//!   keeps an object the store no longer has once a list succeeded.
//! - Events that carry the `resourceVersion` the cache already holds (a replay after a
//!   resumed watch, or the echo of a write recorded with [`Cache::apply`]) are not reported
//!   again; nor are older versions (see [`crate::cache`]).
//!
//! # Caveats
//!
//! - The cache lags the store: a reader may see an older version of an object, or miss one
//!   just created. Decisions that are final (for example "the named SandboxSet does not
//!   exist") should be confirmed by reading the store.
//! - Handlers run on the informer's task, under the lock that orders them, and must not block
//!   (they enqueue keys) nor add handlers to the same informer (that would deadlock).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use oka_store::{Object, Selector, Store, StoreError, WatchEvent};
use tracing::{debug, warn};

use crate::cache::{Cache, Change, Handler, HandlerId};
use crate::queue::exponential;

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

/// What a list+watch loop fills and tells: the cache (with its handlers) and its counters.
pub(crate) struct Feed<K> {
    cache: Cache<K>,
    stats: Arc<WatchStats>,
}

impl<K> Default for Feed<K> {
    fn default() -> Self {
        Self { cache: Cache::default(), stats: Arc::default() }
    }
}

impl<K: Object> Feed<K> {
    pub(crate) fn cache(&self) -> Cache<K> {
        self.cache.clone()
    }

    pub(crate) fn stats(&self) -> Arc<WatchStats> {
        Arc::clone(&self.stats)
    }

    /// See [`Cache::add_handler`].
    pub(crate) fn add_handler(&self, handler: Handler<K>) -> HandlerId {
        self.cache.add_handler(handler)
    }

    /// See [`Cache::remove_handler`].
    pub(crate) fn remove_handler(&self, id: HandlerId) {
        self.cache.remove_handler(id);
    }
}

/// Lists then watches one kind through a [`Store`] and keeps a [`Cache`] of it; see the
/// [module documentation](self) for the loop. An informer of its own: for one shared by every
/// user in the process, see [`Informers`](crate::Informers).
pub struct Informer<K: Object, S: Store> {
    store: S,
    config: WatchConfig,
    feed: Arc<Feed<K>>,
}

impl<K: Object, S: Store> fmt::Debug for Informer<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Informer")
            .field("kind", &K::kind(&()))
            .field("config", &self.config)
            .field("handlers", &self.feed.cache.handler_count())
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
        Self { store, config, feed: Arc::default() }
    }

    /// The cache this informer fills; clone it into a reconciler's context before running.
    pub fn cache(&self) -> Cache<K> {
        self.feed.cache()
    }

    /// The informer's counters.
    pub fn stats(&self) -> Arc<WatchStats> {
        self.feed.stats()
    }

    /// Calls `handler` after every change to the cache (and at once for each object already
    /// cached). Handlers must not block.
    pub fn on_change(&mut self, handler: impl Fn(&Change<K>) + Send + Sync + 'static) {
        self.feed.add_handler(Box::new(handler));
    }

    /// Runs the list+watch loop until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = shutdown => {}
            () = list_watch(&self.store, &self.config, &self.feed) => {}
        }
    }
}

/// The list+watch loop of the [module documentation](self), forever.
pub(crate) async fn list_watch<K: Object, S: Store>(
    store: &S,
    config: &WatchConfig,
    feed: &Feed<K>,
) {
    let kind = K::kind(&());
    let namespace = config.namespace.as_deref();
    let selector = &config.selector;
    let stats = &feed.stats;
    let mut failures = 0u32;
    let backoff = |failures: &mut u32| {
        let delay = exponential(config.initial_backoff, config.max_backoff, *failures);
        *failures = failures.saturating_add(1);
        tokio::time::sleep(delay)
    };
    // `None`: list next; `Some(rv)`: watch from rv.
    let mut resume: Option<String> = None;
    loop {
        let Some(resource_version) = resume.take() else {
            match store.list::<K>(namespace, selector).await {
                Ok(list) => {
                    stats.lists.fetch_add(1, Ordering::Relaxed);
                    failures = 0;
                    let mut count = 0;
                    feed.cache.deliver(|cache| {
                        let changes = cache.replace(list.items);
                        cache.mark_ready();
                        count = changes.len();
                        changes
                    });
                    debug!(%kind, objects = feed.cache.len(), changes = count, "listed");
                    resume = Some(list.resource_version);
                }
                Err(error) => {
                    stats.list_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(%kind, %error, "list failed; retrying with backoff");
                    backoff(&mut failures).await;
                }
            }
            continue;
        };
        let mut stream = match store.watch::<K>(namespace, selector, &resource_version).await {
            Ok(stream) => stream,
            Err(StoreError::Gone { .. }) => {
                stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                debug!(%kind, %resource_version, "watch resume point expired; relisting");
                continue;
            }
            Err(error) => {
                stats.watch_errors.fetch_add(1, Ordering::Relaxed);
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
                    stats.events.fetch_add(1, Ordering::Relaxed);
                    failures = 0;
                    match event {
                        WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                            advance(&mut last_seen, obj.as_ref());
                            feed.cache.deliver(|cache| cache.observe(obj));
                        }
                        WatchEvent::Deleted(obj) => {
                            advance(&mut last_seen, obj.as_ref());
                            feed.cache.deliver(|cache| cache.remove_observed(obj));
                        }
                        WatchEvent::Bookmark(version) => last_seen = version,
                    }
                }
                Some(Err(StoreError::Gone { .. })) => {
                    stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                    debug!(%kind, "watch fell behind the store's history; relisting");
                    break;
                }
                Some(Err(error)) => {
                    stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(%kind, %error, "watch failed; resuming with backoff");
                    backoff(&mut failures).await;
                    resume = Some(last_seen);
                    break;
                }
                None => {
                    stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                    debug!(%kind, "watch stream ended; relisting");
                    backoff(&mut failures).await;
                    break;
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
