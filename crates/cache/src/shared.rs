//! Informers shared by every user in a process ([`Informers`], [`SharedInformer`]), as
//! client-go's `SharedInformerFactory`: one list+watch and one [`Cache`] per kind and scope,
//! however many controllers, indexes and route tables follow it.
//!
//! Why: on a cluster every informer is a watch the API server feeds and a copy of every object
//! the process keeps. A controller process whose six users of Sandboxes each had their own
//! informer held six watches and six copies of every sandbox, and the API server spent its
//! CPU sending each write six times.
//!
//! # Expected flow
//!
//! 1. A process makes one [`Informers`] over its store (cheap to clone; every clone is the same
//!    factory) and hands it to everything that follows the store.
//! 2. Each user asks for [`Informers::informer`]`::<K>(scope)`: the same [`SharedInformer`] (same
//!    cache, same loop) for the same kind, namespace and label selector.
//! 3. Users add handlers ([`SharedInformer::on_change`]) and indexes
//!    ([`Cache::add_index`]) whenever they like, before or after the informer runs.
//! 4. The informer's loop starts on first use: the first [`SharedInformer::start`] (which
//!    [`Controller::run`](crate::Controller::run) calls for every shared informer it uses)
//!    spawns it on the current tokio runtime; later calls do nothing.
//! 5. It runs until [`Informers::shutdown`] is called or the factory and every handle of the
//!    informer are dropped.
//!
//! # Guarantees
//!
//! - One list+watch per (kind, namespace, selector) per factory, however many users.
//! - A handler added after the cache was filled is first called with every cached object as
//!   new (`Applied` without `old`, as client-go's `AddEventHandler` replays its store), then
//!   with every later change; no change falls between the replay and the live changes, and
//!   none is delivered twice or out of order.
//! - A relist (after `Gone` or a stream end) reports what changed to every handler.
//!
//! # Caveats
//!
//! - The first user of a scope sets its backoff ([`WatchConfig::initial_backoff`],
//!   [`WatchConfig::max_backoff`]); the scope alone is the key.
//! - An index on a shared cache is seen by every user of it: index names must say whose they
//!   are (a module prefix), since [`Cache::add_index`] refuses a name already taken.
//! - A handler must not block, nor add a handler to the same informer (it runs under the lock
//!   that orders the handlers).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::BoxFuture;
use oka_store::{Object, Store};
use tokio::sync::watch;

use crate::cache::{Cache, Change, HandlerId};
use crate::reflector::{Feed, WatchConfig, WatchStats, list_watch};

/// Where a shared informer looks: its kind and scope (backoff aside).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Scope {
    kind: TypeId,
    namespace: Option<String>,
    selector: String,
}

/// One informer of the factory, with its type erased.
struct Slot {
    informer: Box<dyn Any + Send + Sync>,
    synced: Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
}

/// The informers themselves, shared by every [`Informers`] of a process whatever store type
/// it writes through.
struct Registry {
    informers: Mutex<HashMap<Scope, Slot>>,
    /// Kept by the factory and every informer handle: the loops stop once it says stop or
    /// is dropped with the last of them.
    stop: Arc<watch::Sender<bool>>,
}

/// The shared informers of one process over store `S`; see the [module documentation](self).
pub struct Informers<S: Store> {
    store: S,
    inner: Arc<Registry>,
}

impl<S: Store> Clone for Informers<S> {
    fn clone(&self) -> Self {
        Self { store: self.store.clone(), inner: Arc::clone(&self.inner) }
    }
}

impl<S: Store> fmt::Debug for Informers<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Informers").field("informers", &self.lock().len()).finish()
    }
}

/// A factory of its own over `store`, for a user that shares nothing (tests, tools).
impl<S: Store> From<S> for Informers<S> {
    fn from(store: S) -> Self {
        Self::new(store)
    }
}

impl<S: Store> Informers<S> {
    /// A factory over `store` with no informer yet.
    pub fn new(store: S) -> Self {
        Self {
            store,
            inner: Arc::new(Registry {
                informers: Mutex::new(HashMap::new()),
                stop: Arc::new(watch::Sender::new(false)),
            }),
        }
    }

    /// The same informers, handed out with another store to write through (a wrapper of the
    /// same store, such as one that marks the writes of reconciles): users that write
    /// through different store types still share one list+watch per scope. A scope's
    /// list+watch goes through the store of the first user that asks for it.
    pub fn with_store<T: Store>(&self, store: T) -> Informers<T> {
        Informers { store, inner: Arc::clone(&self.inner) }
    }

    /// The store the informers follow (and their users write through).
    pub fn store(&self) -> &S {
        &self.store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, Slot>> {
        // Only inserts happen under this lock; a panic cannot leave a half-made slot.
        self.inner.informers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The informer of kind `K` in `config`'s scope (namespace and label selector): the one
    /// already made for that scope, or a new one (not running until first started).
    pub fn informer<K: Object>(&self, config: WatchConfig) -> SharedInformer<K> {
        let scope = Scope {
            kind: TypeId::of::<K>(),
            namespace: config.namespace.clone(),
            selector: config.selector.to_string(),
        };
        let mut informers = self.lock();
        if let Some(found) =
            informers.get(&scope).and_then(|slot| slot.informer.downcast_ref::<SharedInformer<K>>())
        {
            return found.clone();
        }
        let feed: Arc<Feed<K>> = Arc::default();
        let run = {
            let store = self.store.clone();
            let feed = Arc::clone(&feed);
            let config = config.clone();
            let mut stop = self.inner.stop.subscribe();
            async move {
                tokio::select! {
                    // Told to stop, or every holder of the sender is gone.
                    _ = stop.wait_for(|stop| *stop) => {}
                    () = list_watch(&store, &config, &feed) => {}
                }
            }
            .boxed()
        };
        let informer = SharedInformer {
            entry: Arc::new(Entry {
                feed,
                config,
                run: Mutex::new(Some(run)),
                _stop: Arc::clone(&self.inner.stop),
            }),
        };
        let cache = informer.cache();
        let synced = Box::new(move || {
            let cache = cache.clone();
            async move { cache.wait_ready().await }.boxed()
        });
        informers.insert(scope, Slot { informer: Box::new(informer.clone()), synced });
        informer
    }

    /// The informer of kind `K` over every namespace and object.
    pub fn all<K: Object>(&self) -> SharedInformer<K> {
        self.informer(WatchConfig::default())
    }

    /// Resolves once every informer made so far has filled its cache (each must be started).
    pub async fn wait_synced(&self) {
        let waits: Vec<_> = self.lock().values().map(|slot| (slot.synced)()).collect();
        futures::future::join_all(waits).await;
    }

    /// Stops every informer's loop (their caches keep what they hold).
    pub fn shutdown(&self) {
        self.inner.stop.send_replace(true);
    }
}

struct Entry<K> {
    feed: Arc<Feed<K>>,
    config: WatchConfig,
    /// The loop, until the first start takes it.
    run: Mutex<Option<BoxFuture<'static, ()>>>,
    _stop: Arc<watch::Sender<bool>>,
}

/// A handle to one shared informer: its cache and handlers; see the
/// [module documentation](self).
pub struct SharedInformer<K> {
    entry: Arc<Entry<K>>,
}

impl<K> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self { entry: Arc::clone(&self.entry) }
    }
}

impl<K: Object> fmt::Debug for SharedInformer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedInformer")
            .field("kind", &K::kind(&()))
            .field("config", &self.entry.config)
            .finish()
    }
}

impl<K: Object> SharedInformer<K> {
    /// The cache every user of this informer reads.
    pub fn cache(&self) -> Cache<K> {
        self.entry.feed.cache()
    }

    /// The informer's counters.
    pub fn stats(&self) -> Arc<WatchStats> {
        self.entry.feed.stats()
    }

    /// The scope and backoff it runs with (its first user's).
    pub fn config(&self) -> &WatchConfig {
        &self.entry.config
    }

    /// Calls `handler` with every object already cached (as new), then after every change to
    /// the cache, until [`SharedInformer::remove_handler`]. Handlers must not block.
    pub fn on_change(&self, handler: impl Fn(&Change<K>) + Send + Sync + 'static) -> HandlerId {
        self.entry.feed.add_handler(Box::new(handler))
    }

    /// Stops calling a handler.
    pub fn remove_handler(&self, id: HandlerId) {
        self.entry.feed.remove_handler(id);
    }

    /// Starts the list+watch loop on the current tokio runtime, unless it was started already.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::spawn`).
    pub fn start(&self) {
        let run = self.entry.run.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(run) = run {
            tokio::spawn(run);
        }
    }

    /// Resolves once a first list has filled the cache (the informer must be started).
    pub async fn wait_synced(&self) {
        self.entry.feed.cache().wait_ready().await;
    }
}
