//! The route table: public sandbox ID → the claimed Sandbox object, an index on a cache of
//! Sandboxes that `oka-cache`'s [`SharedInformer`] keeps (list, then watch; relist on `Gone`):
//! in one process with the controllers, the same cache as theirs.
//!
//! # Expected flow
//!
//! 1. [`RouteTable::spawn`] starts an informer over every Sandbox, whose cache has the index
//!    [`ROUTES`]: a claimed sandbox (label `agents.kruise.io/sandbox-claimed: "true"`) is filed
//!    under its ID (label `agents.kruise.io/sandbox-id`, else the legacy
//!    `<namespace>--<name>`); an unclaimed or deleted one is filed under none.
//! 2. Every change the informer reports bumps a version that waiters
//!    ([`RouteTable::subscribe`]) see, so a request waiting for a sandbox to resume wakes on
//!    the watch event, not by polling.
//!
//! # Guarantees
//!
//! - The table is rebuilt from a list when the gateway starts and on every relist, so it is
//!   correct after a restart and never keeps a sandbox the store dropped.
//! - The index changes with the cache, under its lock: a sandbox the cache holds is routed as
//!   soon as it is there, and an ID is routed for as long as one object holds it.
//!
//! # Caveats
//!
//! - The table lags the store by the watch latency (on a busy machine, milliseconds). So that a
//!   request sent right after a create is not answered "not found", the manager answers a create
//!   only once the gateway routes the new sandbox ([`RouteTable::wait_routed`], through
//!   `oka_manager::api::RouteWaiter` in `oka serve`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use oka_api::Sandbox;
use oka_cache::{Cache, HandlerId, Informers, SharedInformer};
use oka_store::Store;
use tokio::sync::watch;

/// The name of the cache's index of routed sandboxes by public ID.
pub const ROUTES: &str = "gateway/routes";

/// The public ID a sandbox is routed under, or `None` when it is not claimed: the one rule the
/// manager hands IDs out by, [`oka_api::public_id::of_claimed`].
pub use oka_api::public_id::of_claimed as route_id;

/// The route table; see the [module documentation](self).
pub struct RouteTable {
    cache: Cache<Sandbox>,
    version: watch::Sender<u64>,
    /// Latched [`Cache::is_ready`], read by every request without the cache's lock.
    ready: AtomicBool,
    informer: SharedInformer<Sandbox>,
    handler: HandlerId,
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable").field("routes", &self.len()).finish()
    }
}

impl Drop for RouteTable {
    fn drop(&mut self) {
        // The informer may serve others; this table stops listening (and, over a factory of
        // its own, the informer stops with the last handle).
        self.informer.remove_handler(self.handler.clone());
    }
}

/// The values [`ROUTES`] files a sandbox under: its public ID, when it is claimed.
fn routes_of(sandbox: &Sandbox) -> Vec<String> {
    route_id(sandbox).into_iter().collect()
}

impl RouteTable {
    /// Starts the informer of every Sandbox that fills the table, unless it runs already
    /// (needs a tokio runtime). Given a store, the informer is the table's own and stops when
    /// the table is dropped; given the process's [`Informers`], it is shared.
    pub fn spawn<S: Store>(informers: impl Into<Informers<S>>) -> Arc<Self> {
        let informer = informers.into().all::<Sandbox>();
        let cache = informer.cache();
        // Taken already means by another table over the same informers, with this function.
        let _ = cache.add_index(ROUTES, routes_of);
        let version = watch::Sender::new(0u64);
        let changes = version.clone();
        let handler = informer.on_change(move |_| changes.send_modify(|v| *v = v.wrapping_add(1)));
        informer.start();
        Arc::new(RouteTable { cache, version, ready: AtomicBool::new(false), informer, handler })
    }

    /// The sandbox routed under `id` (of two objects that claim one ID, the first by
    /// namespace and name).
    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.cache.with_index(ROUTES, id, |found| found.iter().next().cloned()).ok().flatten()
    }

    /// How many IDs are routed.
    pub fn len(&self) -> usize {
        self.cache.index_value_count(ROUTES).unwrap_or_default()
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

    /// Waits until the sandbox routed under `id` is at `resource_version` or newer (compared
    /// as counters), for at most `timeout`; whether it is. A writer that changed what the
    /// gateway checks (a refreshed traffic token) waits so before it answers.
    pub async fn wait_version(
        &self,
        id: &str,
        resource_version: &str,
        timeout: std::time::Duration,
    ) -> bool {
        let Ok(wanted) = resource_version.parse::<u64>() else { return self.get(id).is_some() };
        let reached = || {
            self.get(id)
                .and_then(|s| s.metadata.resource_version.as_deref()?.parse::<u64>().ok())
                .is_some_and(|version| version >= wanted)
        };
        let mut changes = self.version.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.mark_unchanged();
            if reached() {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return reached(),
            }
        }
    }

    /// A receiver that sees every later change of the table (`changed()` resolves).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}
