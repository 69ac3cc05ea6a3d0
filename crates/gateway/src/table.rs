//! The route table: public sandbox ID → the claimed Sandbox object, kept by the controller
//! runtime's [`Informer`] (list, then watch; relist on `Gone`).
//!
//! # Expected flow
//!
//! 1. [`RouteTable::spawn`] starts an informer over every Sandbox. Each change it reports is
//!    applied here: a claimed sandbox (label `agents.kruise.io/sandbox-claimed: "true"`) is
//!    routed under its ID (label `agents.kruise.io/sandbox-id`, else the legacy
//!    `<namespace>--<name>`); an unclaimed or deleted one loses its route.
//! 2. Every applied change bumps a version that waiters ([`RouteTable::subscribe`]) see, so a
//!    request waiting for a sandbox to resume wakes on the watch event, not by polling.
//!
//! # Guarantees
//!
//! - The table is rebuilt from a list when the gateway starts and on every relist, so it is
//!   correct after a restart and never keeps a sandbox the store dropped.
//! - An ID is removed only by the object that holds it: a sandbox whose ID moved to another
//!   object does not take the other's route down when it is deleted.
//!
//! # Caveats
//!
//! - The table lags the store by the watch latency (on a busy machine, milliseconds). So that a
//!   request sent right after a create is not answered "not found", the manager answers a create
//!   only once the gateway routes the new sandbox ([`RouteTable::wait_routed`], through
//!   `oka_manager::api::RouteWaiter` in `oka serve`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use oka_api::Sandbox;
use oka_controller::reflector::{Cache, Change, Informer, ObjectKey};
use oka_store::Store;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// The public ID a sandbox is routed under, or `None` when it is not claimed: the one rule the
/// manager hands IDs out by, [`oka_api::public_id::of_claimed`].
pub use oka_api::public_id::of_claimed as route_id;

#[derive(Default)]
struct Routes {
    by_id: HashMap<String, Arc<Sandbox>>,
    ids: HashMap<ObjectKey, String>,
    /// Every object applied, routed or not: when it has as many as the informer's cache, the
    /// table has caught up with the cache.
    known: HashSet<ObjectKey>,
}

impl Routes {
    fn unroute(&mut self, key: &ObjectKey) {
        if let Some(id) = self.ids.remove(key)
            && self.by_id.get(&id).is_some_and(|s| ObjectKey::of(s.as_ref()) == *key)
        {
            self.by_id.remove(&id);
        }
    }

    fn apply(&mut self, change: &Change<Sandbox>) {
        match change {
            Change::Applied { new, .. } => {
                let key = ObjectKey::of(new.as_ref());
                self.known.insert(key.clone());
                self.unroute(&key);
                if let Some(id) = route_id(new) {
                    self.ids.insert(key, id.clone());
                    self.by_id.insert(id, Arc::clone(new));
                }
            }
            Change::Deleted(old) => {
                let key = ObjectKey::of(old.as_ref());
                self.known.remove(&key);
                self.unroute(&key);
            }
        }
    }
}

/// The route table; see the [module documentation](self).
pub struct RouteTable {
    routes: RwLock<Routes>,
    version: watch::Sender<u64>,
    cache: Cache<Sandbox>,
    /// Latched [`Cache::is_ready`], read by every request without the cache's lock.
    ready: AtomicBool,
    informer: AbortHandle,
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable").field("routes", &self.len()).finish()
    }
}

impl Drop for RouteTable {
    fn drop(&mut self) {
        self.informer.abort();
    }
}

impl RouteTable {
    /// Starts the informer that fills the table (needs a tokio runtime). The informer stops
    /// when the table is dropped.
    pub fn spawn<S: Store>(store: S) -> Arc<Self> {
        let mut informer = Informer::<Sandbox, S>::new(store);
        let cache = informer.cache();
        Arc::new_cyclic(|weak: &std::sync::Weak<RouteTable>| {
            let weak = weak.clone();
            informer.on_change(move |change| {
                if let Some(table) = weak.upgrade() {
                    table.apply(change);
                }
            });
            let task = tokio::spawn(informer.run(std::future::pending()));
            RouteTable {
                routes: RwLock::new(Routes::default()),
                version: watch::Sender::new(0),
                cache,
                ready: AtomicBool::new(false),
                informer: task.abort_handle(),
            }
        })
    }

    fn apply(&self, change: &Change<Sandbox>) {
        self.routes.write().unwrap_or_else(PoisonError::into_inner).apply(change);
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The sandbox routed under `id`. While the table is catching up with the informer's
    /// cache (which is filled just before the table hears of a change, for example during
    /// the first list), a miss is confirmed against the cache.
    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        let caught_up = {
            let routes = self.routes.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(hit) = routes.by_id.get(id) {
                return Some(Arc::clone(hit));
            }
            routes.known.len() == self.cache.len()
        };
        if caught_up {
            return None;
        }
        self.cache.filter(|s| route_id(s).as_deref() == Some(id)).into_iter().next()
    }

    /// How many sandboxes are routed.
    pub fn len(&self) -> usize {
        self.routes.read().unwrap_or_else(PoisonError::into_inner).by_id.len()
    }

    /// Whether no sandbox is routed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first list has filled the table (once it has, it stays so).
    pub fn is_ready(&self) -> bool {
        if self.ready.load(Ordering::Relaxed) {
            return true;
        }
        let ready = self.cache.is_ready();
        if ready {
            self.ready.store(true, Ordering::Relaxed);
        }
        ready
    }

    /// Resolves once the first list has filled the table.
    pub async fn wait_ready(&self) {
        self.cache.wait_ready().await;
    }

    /// Waits until a sandbox is routed under `id`, for at most `timeout`; whether it is. Woken
    /// by the table's changes, not by polling.
    pub async fn wait_routed(&self, id: &str, timeout: std::time::Duration) -> bool {
        let mut changes = self.version.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.mark_unchanged();
            if self.get(id).is_some() {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.get(id).is_some(),
            }
        }
    }

    /// A receiver that sees every later change of the table (`changed()` resolves).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}
