//! The controller runner: informers feed a work queue, workers call a reconciler.
//!
//! A [`Controller`] drives one kind `K` through any [`Store`]. It is a builder (which extra
//! sources wake which keys, how many workers, when to stop) that ends in
//! [`Controller::run`]`(reconcile, error_policy, ctx)`, the shape of kube-runtime's controller.
//!
//! # Expected flow
//!
//! 1. [`Controller::run`] adds its handlers to the shared informer of `K` (list, then watch
//!    from the list's `resourceVersion`, relist on `Gone`; see [`crate::reflector`] and
//!    [`crate::shared`]: one per kind and scope in the process, started by its first user) and
//!    to those added with [`Controller::watches_shared`] and [`Controller::owns_shared`],
//!    and starts the informers of its own ([`Controller::watches`], [`Controller::owns`]) and
//!    the streams of [`Controller::reconcile_on`]. A handler added to a cache already filled
//!    first sees every object as new, as after a first list.
//! 2. It waits until every informer's cache has been filled by a first list, so a reconciler
//!    never mistakes "not listed yet" for "does not exist".
//! 3. It starts [`Config::workers`] workers. Each takes a key from the [`WorkQueue`], reads the
//!    object from the cache and calls `reconcile(object, ctx)`.
//! 4. The reconciler answers with an [`Action`]: look again after a duration, or wait for the
//!    next change. On success the key's backoff is reset. On `Err(e)` the separate
//!    `error_policy(object, &e, ctx)` chooses the action; [`Action::backoff`] (the default
//!    policy, [`default_error_policy`]) uses the queue's per-key exponential backoff.
//!    A panicking reconcile is logged, counted, and retried with backoff.
//! 5. When the trigger given to [`Controller::shutdown_on`] fires, the queue stops handing
//!    out keys, in-flight reconciles run to completion, then its own informers stop, its
//!    handlers leave the shared ones (which run on for their other users until
//!    [`Informers::shutdown`] or their last handle is dropped) and `run` returns.
//!
//! # Guarantees
//!
//! - One object is never reconciled by two workers at once; a change that arrives during a
//!   reconcile causes exactly one more reconcile after it.
//! - A burst of changes to one object yields one reconcile, of the newest cached version.
//! - Every change seen by an informer is followed by a reconcile of each key it maps to that
//!   starts after the cache holds the change.
//! - A requeue asked for is kept until answered; when several are pending for a key the
//!   earliest wins, and a change-triggered reconcile answers them all.
//!
//! # Assumptions
//!
//! - The reconciler is idempotent and level-triggered: it does not know why it was called
//!   (a change, a requeue, a relist, a retry) and looks at the whole observed state each time.
//! - It never sleeps to wait for the world: it returns [`Action::requeue_after`] instead.
//! - It is cancel-safe: the process may stop at any `.await`.
//!
//! # Caveats
//!
//! - **Deleted objects are not reconciled.** A key whose object is no longer in the cache is
//!   dropped without calling the reconciler: there is nothing left to converge. Cleanup that
//!   must happen before an object goes away is done with a finalizer: while it is pending
//!   the object stays (with `deletionTimestamp` set) and is reconciled as usual. For
//!   bookkeeping after removal (forgetting metrics, expectations) a controller may ask for
//!   [`Controller::on_delete`], which gets the object's last state once.
//! - The cache may be older than the store (see [`crate::reflector`]); writes carry the
//!   observed `resourceVersion`, so a stale write fails with a conflict and is retried.
//! - Graceful shutdown waits for in-flight reconciles without a deadline; to stop harder,
//!   drop the `run` future (which is safe, see *Assumptions*).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{Stream, StreamExt};
use futures::{FutureExt, TryFutureExt};
use kube::Resource;
use oka_store::{Object, Store};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::cache::{Cache, Change, ObjectKey};
use crate::queue::{QueueConfig, QueueStats, WorkQueue};
use crate::reflector::{Informer, WatchConfig, WatchStats};
use crate::shared::{Informers, SharedInformer};

/// What a reconcile (or the error policy) asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    next: Next,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    After(Duration),
    AwaitChange,
    Backoff,
}

impl Action {
    /// Reconcile again after `duration`, or earlier if the object changes.
    pub fn requeue_after(duration: Duration) -> Self {
        Self { next: Next::After(duration) }
    }

    /// Reconcile again only when the object (or something mapped to it) changes.
    pub fn await_change() -> Self {
        Self { next: Next::AwaitChange }
    }

    /// Retry with the work queue's per-key exponential backoff (5 ms doubling to 5 min by
    /// default), which only a successful reconcile resets. Meant for error policies.
    pub fn backoff() -> Self {
        Self { next: Next::Backoff }
    }

    /// The requested delay, for [`Action::requeue_after`].
    pub fn requeue_duration(&self) -> Option<Duration> {
        match self.next {
            Next::After(duration) => Some(duration),
            Next::AwaitChange | Next::Backoff => None,
        }
    }

    /// Whether this is [`Action::await_change`].
    pub fn is_await_change(&self) -> bool {
        self.next == Next::AwaitChange
    }

    /// Whether this is [`Action::backoff`].
    pub fn is_backoff(&self) -> bool {
        self.next == Next::Backoff
    }
}

/// The error policy every controller gets unless it chooses one: retry with the queue's
/// per-key exponential backoff, whatever the error.
pub fn default_error_policy<K, E, C>(_obj: &K, _error: &E, _ctx: &C) -> Action {
    Action::backoff()
}

/// How a controller runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The number of objects reconciled at once (at least 1).
    pub workers: usize,
    /// The retry backoff of the work queue.
    pub queue: QueueConfig,
    /// Scope and backoff of the informer of the controller's own kind.
    pub watch: WatchConfig,
    /// How long a change waits before it wakes its key: a change of a watched object, or an
    /// update of one of the controller's own objects (a new one is reconciled at once). Every
    /// change within that time is answered by the same reconcile, and later changes do not
    /// push it back, so a key whose children change a thousand times a second is reconciled
    /// about once per `debounce` (its own status writes included), and no change waits longer.
    /// Zero (the default) wakes the key at once.
    pub debounce: Duration,
    /// Stretches [`Config::debounce`] for keys whose reconciles are slow: a change waits at
    /// least this many times as long as the key's last reconcile took (wall time, awaits
    /// included), and at most [`MAX_STRETCHED_DEBOUNCE`]. A key whose reconcile reads a
    /// thousand objects then spends at most about `1 / (1 + scale)` of a CPU on reconciles
    /// however fast its children change, and a reconcile slowed down by a busy machine backs
    /// off by itself. Zero (the default) keeps the debounce fixed.
    pub debounce_scale: u32,
}

/// The longest a change waits when [`Config::debounce_scale`] stretches the debounce.
pub const MAX_STRETCHED_DEBOUNCE: Duration = Duration::from_millis(250);

/// How long a change waits before it wakes a key: `debounce`, stretched to `scale` times the
/// key's last reconcile (`last`), but never beyond [`MAX_STRETCHED_DEBOUNCE`] (nor below
/// `debounce`).
fn stretched_debounce(debounce: Duration, scale: u32, last: Duration) -> Duration {
    debounce.max(last.saturating_mul(scale).min(MAX_STRETCHED_DEBOUNCE))
}

impl Default for Config {
    /// One worker, default backoff, all namespaces, no debounce.
    fn default() -> Self {
        Self {
            workers: 1,
            queue: QueueConfig::default(),
            watch: WatchConfig::default(),
            debounce: Duration::ZERO,
            debounce_scale: 0,
        }
    }
}

impl Config {
    /// This config with `workers` workers.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// This config with changes debounced by `debounce` ([`Config::debounce`]).
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    /// This config with the debounce stretched for slow reconciles ([`Config::debounce_scale`]).
    pub fn debounce_scale(mut self, scale: u32) -> Self {
        self.debounce_scale = scale;
        self
    }
}

/// When a change wakes its key ([`Config::debounce`], [`Config::debounce_scale`]): keeps how
/// long each key's last reconcile took, when the debounce is stretched.
struct Debouncer {
    debounce: Duration,
    scale: u32,
    last: Mutex<HashMap<ObjectKey, Duration>>,
}

impl Debouncer {
    fn new(config: &Config) -> Self {
        Self {
            debounce: config.debounce,
            scale: config.debounce_scale,
            last: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Duration>> {
        self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes `key` after its debounce, or at once when that is zero.
    fn wake(&self, queue: &WorkQueue<ObjectKey>, key: ObjectKey) {
        let delay = match self.scale {
            0 => self.debounce,
            scale => {
                let last = self.lock().get(&key).copied().unwrap_or_default();
                stretched_debounce(self.debounce, scale, last)
            }
        };
        if delay.is_zero() {
            queue.add(key);
        } else {
            queue.requeue_after(key, delay);
        }
    }

    /// Notes that a reconcile of `key` took `took`.
    fn record(&self, key: &ObjectKey, took: Duration) {
        if self.scale > 0 {
            self.lock().insert(key.clone(), took);
        }
    }

    /// Forgets a key whose object is gone.
    fn forget(&self, key: &ObjectKey) {
        if self.scale > 0 {
            self.lock().remove(key);
        }
    }
}

/// Counters of one controller, cheap to read while it runs (for a metrics exporter).
pub struct ControllerStats {
    name: String,
    reconciles: AtomicU64,
    reconcile_errors: AtomicU64,
    reconcile_panics: AtomicU64,
    skipped_deleted: AtomicU64,
    queue: WorkQueue<ObjectKey>,
    watch: Arc<WatchStats>,
}

impl fmt::Debug for ControllerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerStats").field("snapshot", &self.snapshot()).finish()
    }
}

/// The values of a [`ControllerStats`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// The controller's name.
    pub name: String,
    /// Reconciles started.
    pub reconciles: u64,
    /// Reconciles that returned an error or panicked.
    pub reconcile_errors: u64,
    /// Reconciles that panicked (also counted in `reconcile_errors`).
    pub reconcile_panics: u64,
    /// Keys dropped because their object was no longer cached.
    pub skipped_deleted: u64,
    /// The work queue's size: `ready` is the queue depth.
    pub queue: QueueStats,
    /// Successful lists of the controller's kind.
    pub lists: u64,
    /// Watch failures of the controller's kind (relists and resumes).
    pub watch_errors: u64,
}

impl ControllerStats {
    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            name: self.name.clone(),
            reconciles: self.reconciles.load(Ordering::Relaxed),
            reconcile_errors: self.reconcile_errors.load(Ordering::Relaxed),
            reconcile_panics: self.reconcile_panics.load(Ordering::Relaxed),
            skipped_deleted: self.skipped_deleted.load(Ordering::Relaxed),
            queue: self.queue.stats(),
            lists: self.watch.lists(),
            watch_errors: self.watch.watch_errors(),
        }
    }
}

/// Everything a background source needs when the controller starts it.
type SourceStart = Box<dyn FnOnce(WorkQueue<ObjectKey>, Stopped) -> BoxFuture<'static, ()> + Send>;

/// A future that resolves when the controller's background tasks must stop.
type Stopped = BoxFuture<'static, ()>;

/// Adds a controller's handler to a shared informer and starts it; returns what removes the
/// handler again when the controller stops.
type Attach = Box<dyn FnOnce() -> Box<dyn FnOnce() + Send> + Send>;

/// A hook called with each change of the controller's own cache.
type Hook<K> = Box<dyn Fn(&Change<K>) + Send + Sync>;

/// The hook called with the last state of a removed object.
type DeleteHook<K> = Arc<dyn Fn(&K) + Send + Sync>;

/// Runs a reconciler for kind `K` over store `S`; see the [module documentation](self).
pub struct Controller<K: Object, S: Store> {
    name: String,
    config: Config,
    informers: Informers<S>,
    primary: SharedInformer<K>,
    /// The controller's own [`Controller::on_change`] hooks, called before its enqueueing.
    hooks: Vec<Hook<K>>,
    queue: WorkQueue<ObjectKey>,
    sources: Vec<SourceStart>,
    attachments: Vec<Attach>,
    synced: Vec<BoxFuture<'static, ()>>,
    on_delete: Option<DeleteHook<K>>,
    shutdown: Option<BoxFuture<'static, ()>>,
    stats: Arc<ControllerStats>,
    debouncer: Arc<Debouncer>,
}

impl<K: Object, S: Store> fmt::Debug for Controller<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("kind", &K::kind(&()))
            .field("config", &self.config)
            .field("sources", &self.sources.len())
            .finish()
    }
}

impl<K: Object, S: Store> Controller<K, S> {
    /// A controller named `name` (for logs and metrics) for kind `K` in `store`: given a
    /// store, a factory of its own; given [`Informers`], [`Controller::shared`].
    pub fn new(name: impl Into<String>, store: impl Into<Informers<S>>, config: Config) -> Self {
        Self::shared(name, &store.into(), config)
    }

    /// A controller named `name` for kind `K` whose own objects come from the shared informer
    /// of `config.watch`'s scope in `informers`: its cache is every other user's too.
    pub fn shared(name: impl Into<String>, informers: &Informers<S>, config: Config) -> Self {
        let name = name.into();
        let primary = informers.informer::<K>(config.watch.clone());
        let queue = WorkQueue::new(config.queue);
        let stats = Arc::new(ControllerStats {
            name: name.clone(),
            reconciles: AtomicU64::new(0),
            reconcile_errors: AtomicU64::new(0),
            reconcile_panics: AtomicU64::new(0),
            skipped_deleted: AtomicU64::new(0),
            queue: queue.clone(),
            watch: primary.stats(),
        });
        let debouncer = Arc::new(Debouncer::new(&config));
        Self {
            name,
            config,
            informers: informers.clone(),
            primary,
            hooks: Vec::new(),
            queue,
            sources: Vec::new(),
            attachments: Vec::new(),
            synced: Vec::new(),
            on_delete: None,
            shutdown: None,
            stats,
            debouncer,
        }
    }

    /// The cache of `K` the reconciler's objects come from (also readable by mappers).
    pub fn cache(&self) -> Cache<K> {
        self.primary.cache()
    }

    /// The informers this controller shares, for the other kinds it follows.
    pub fn informers(&self) -> &Informers<S> {
        &self.informers
    }

    /// The work queue, to wake keys by hand.
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// The controller's counters.
    pub fn stats(&self) -> Arc<ControllerStats> {
        Arc::clone(&self.stats)
    }

    /// Also runs `informer` (of any kind `C`), and wakes the keys `mapper` returns for every
    /// version of every object it sees change (before and after the change, so a moved link
    /// wakes both ends), after [`Config::debounce`]. Workers start only once its cache is
    /// filled, so a reconciler may read it: take [`Informer::cache`] before passing the informer
    /// here.
    pub fn watches<C, S2, M>(mut self, mut informer: Informer<C, S2>, mapper: M) -> Self
    where
        C: Object,
        S2: Store,
        M: Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    {
        let queue = self.queue.clone();
        let debouncer = Arc::clone(&self.debouncer);
        informer.on_change(move |change: &Change<C>| {
            for obj in change.objects() {
                for key in mapper(obj) {
                    debouncer.wake(&queue, key);
                }
            }
        });
        let cache = informer.cache();
        self.synced.push(async move { cache.wait_ready().await }.boxed());
        self.sources.push(Box::new(move |_queue, stopped| informer.run(stopped).boxed()));
        self
    }

    /// [`Controller::watches`] with the mapper "the objects of kind `K` named in the child's
    /// owner references" (same namespace, matching API group and kind).
    pub fn owns<C, S2>(self, informer: Informer<C, S2>) -> Self
    where
        C: Object,
        S2: Store,
    {
        self.watches(informer, owner_keys::<K, C>)
    }

    /// [`Controller::watches`] over a shared informer: the controller adds its handler when it
    /// runs (it first sees every cached object, as after a first list), starts the informer
    /// if nobody has, and removes its handler when it stops.
    pub fn watches_shared<C, M>(mut self, informer: SharedInformer<C>, mapper: M) -> Self
    where
        C: Object,
        M: Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    {
        let queue = self.queue.clone();
        let debouncer = Arc::clone(&self.debouncer);
        let cache = informer.cache();
        self.synced.push(async move { cache.wait_ready().await }.boxed());
        self.attachments.push(Box::new(move || {
            let id = informer.on_change(move |change: &Change<C>| {
                for obj in change.objects() {
                    for key in mapper(obj) {
                        debouncer.wake(&queue, key);
                    }
                }
            });
            informer.start();
            Box::new(move || informer.remove_handler(id))
        }));
        self
    }

    /// [`Controller::owns`] over a shared informer ([`Controller::watches_shared`]).
    pub fn owns_shared<C: Object>(self, informer: SharedInformer<C>) -> Self {
        self.watches_shared(informer, owner_keys::<K, C>)
    }

    /// [`Controller::watches_shared`] with the informer of every `C` in this controller's
    /// factory.
    pub fn watches_all<C, M>(self, mapper: M) -> Self
    where
        C: Object,
        M: Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    {
        let informer = self.informers.all::<C>();
        self.watches_shared(informer, mapper)
    }

    /// Wakes every key `triggers` yields (timers, external signals, another controller).
    pub fn reconcile_on(
        mut self,
        triggers: impl Stream<Item = ObjectKey> + Send + 'static,
    ) -> Self {
        self.sources.push(Box::new(move |queue, stopped| {
            let feed = triggers.for_each(move |key| {
                queue.add(key);
                futures::future::ready(())
            });
            async move {
                tokio::select! {
                    () = stopped => {}
                    () = feed => {}
                }
            }
            .boxed()
        }));
        self
    }

    /// Calls `hook` after every change of the controller's own cache (before the reconcile it
    /// may cause). Hooks must not block.
    pub fn on_change(mut self, hook: impl Fn(&Change<K>) + Send + Sync + 'static) -> Self {
        self.hooks.push(Box::new(hook));
        self
    }

    /// Calls `hook` with the last state of each object of kind `K` that disappears from the
    /// store (after its finalizers, if any). The reconciler is not called for it.
    pub fn on_delete(mut self, hook: impl Fn(&K) + Send + Sync + 'static) -> Self {
        self.on_delete = Some(Arc::new(hook));
        self
    }

    /// Shuts down gracefully when `trigger` resolves: no new reconcile starts, in-flight ones
    /// finish, then [`Controller::run`] returns. Without a trigger, `run` runs until dropped.
    pub fn shutdown_on(mut self, trigger: impl Future<Output = ()> + Send + 'static) -> Self {
        self.shutdown = Some(trigger.boxed());
        self
    }

    /// Runs the controller until the shutdown trigger fires and in-flight work is done.
    ///
    /// `reconcile(object, ctx)` brings the world in line with one object; `error_policy`
    /// picks the next step after a failed reconcile (use [`default_error_policy`] for
    /// exponential backoff). `ctx` is shared by every call.
    pub async fn run<C, E, F, Fut, P>(self, reconcile: F, error_policy: P, ctx: Arc<C>)
    where
        C: Send + Sync + 'static,
        E: std::error::Error + Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(&K, &E, &C) -> Action + Send + Sync + 'static,
    {
        let Controller {
            name,
            config,
            informers: _,
            primary,
            hooks,
            queue,
            sources,
            attachments,
            synced,
            on_delete,
            shutdown,
            stats,
            debouncer,
        } = self;
        let kind = K::kind(&());
        info!(controller = %name, %kind, workers = config.workers, "starting controller");

        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || -> Stopped {
            let mut rx = stop_rx.clone();
            async move {
                // A closed channel also means stop.
                let _ = rx.wait_for(|stop| *stop).await;
            }
            .boxed()
        };

        // The primary informer calls the hooks, then enqueues the key of every change (an update
        // after the debounce, a new object at once); a removal is not enqueued (there is
        // nothing left to reconcile) but is reported to `on_delete`. Added now, the handler
        // first sees every object already cached as new, as after a first list; this
        // controller's handler alone reports a removal to its `on_delete`, so each controller's
        // hook hears of each removal once.
        let primary_handler = {
            let queue = queue.clone();
            let debouncer = Arc::clone(&debouncer);
            primary.on_change(move |change: &Change<K>| {
                for hook in &hooks {
                    hook(change);
                }
                match change {
                    Change::Applied { old: Some(_), new } => {
                        debouncer.wake(&queue, ObjectKey::of(new.as_ref()));
                    }
                    Change::Applied { new, old: None } => queue.add(ObjectKey::of(new.as_ref())),
                    Change::Deleted(obj) => {
                        debouncer.forget(&ObjectKey::of(obj.as_ref()));
                        if let Some(hook) = &on_delete {
                            hook(obj);
                        }
                    }
                }
            })
        };
        primary.start();
        let detach: Vec<_> = attachments.into_iter().map(|attach| attach()).collect();
        let cache = primary.cache();
        let mut background = JoinSet::new();
        for start in sources {
            background.spawn(start(queue.clone(), stopped()));
        }

        let mut shutdown = shutdown.unwrap_or_else(|| futures::future::pending().boxed());
        let all_synced = async {
            cache.wait_ready().await;
            futures::future::join_all(synced).await;
        };
        let started = tokio::select! {
            () = &mut shutdown => false,
            () = all_synced => true,
        };

        let mut workers = JoinSet::new();
        if started {
            debug!(controller = %name, "caches synced; starting workers");
            let reconcile = Arc::new(reconcile);
            let error_policy = Arc::new(error_policy);
            for index in 0..config.workers.max(1) {
                let worker = Worker {
                    name: name.clone(),
                    queue: queue.clone(),
                    cache: cache.clone(),
                    reconcile: Arc::clone(&reconcile),
                    error_policy: Arc::clone(&error_policy),
                    ctx: Arc::clone(&ctx),
                    stats: Arc::clone(&stats),
                    debouncer: Arc::clone(&debouncer),
                };
                workers.spawn(
                    worker.run().instrument(info_span!("worker", controller = %name, index)),
                );
            }
            shutdown.await;
        }

        info!(controller = %name, "shutting down: finishing in-flight reconciles");
        queue.shutdown();
        while let Some(joined) = workers.join_next().await {
            if let Err(error) = joined {
                error!(controller = %name, %error, "worker task failed");
            }
        }
        let _ = stop_tx.send(true);
        while let Some(joined) = background.join_next().await {
            if let Err(error) = joined {
                error!(controller = %name, %error, "informer task failed");
            }
        }
        // The shared informers go on for their other users; this controller stops listening.
        primary.remove_handler(primary_handler);
        for detach in detach {
            detach();
        }
        info!(controller = %name, "controller stopped");
    }
}

struct Worker<K, C, F, P> {
    name: String,
    queue: WorkQueue<ObjectKey>,
    cache: Cache<K>,
    reconcile: Arc<F>,
    error_policy: Arc<P>,
    ctx: Arc<C>,
    stats: Arc<ControllerStats>,
    debouncer: Arc<Debouncer>,
}

impl<K, C, E, F, Fut, P> Worker<K, C, F, P>
where
    K: Object,
    C: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    P: Fn(&K, &E, &C) -> Action + Send + Sync + 'static,
{
    async fn run(self) {
        while let Some(lease) = self.queue.get().await {
            let key = lease.key().clone();
            let Some(obj) = self.cache.get(&key) else {
                // Deleted since it was queued: nothing to converge (see the module caveats).
                self.stats.skipped_deleted.fetch_add(1, Ordering::Relaxed);
                self.queue.forget(&key);
                debug!(object = %key, "object no longer exists; not reconciling");
                continue;
            };
            self.stats.reconciles.fetch_add(1, Ordering::Relaxed);
            // The object under the field name the logs use for its kind.
            let span = info_span!(
                "reconcile",
                controller = %self.name,
                object = %key,
                sandbox = tracing::field::Empty,
                pool = tracing::field::Empty,
            );
            match K::kind(&()).as_ref() {
                "Sandbox" => {
                    span.record("sandbox", key.name.as_str());
                }
                "SandboxSet" => {
                    span.record("pool", key.name.as_str());
                }
                _ => {}
            }
            let started = tokio::time::Instant::now();
            let reconcile = (self.reconcile)(Arc::clone(&obj), Arc::clone(&self.ctx));
            let traced = oka_telemetry::reconcile::reconcile(
                || span_parent(&self.name, obj.as_ref()),
                reconcile,
            );
            let outcome = AssertUnwindSafe(traced)
                .catch_unwind()
                .map_err(|_panic| ())
                .instrument(span.clone())
                .await;
            self.debouncer.record(&key, started.elapsed());
            let action = match outcome {
                Ok(Ok(action)) => {
                    self.queue.forget(&key);
                    action
                }
                Ok(Err(err)) => {
                    self.stats.reconcile_errors.fetch_add(1, Ordering::Relaxed);
                    let action = (self.error_policy)(&obj, &err, &self.ctx);
                    span.in_scope(|| warn!(error = %err, next = ?action, "reconcile failed"));
                    action
                }
                Err(()) => {
                    self.stats.reconcile_errors.fetch_add(1, Ordering::Relaxed);
                    self.stats.reconcile_panics.fetch_add(1, Ordering::Relaxed);
                    span.in_scope(|| error!("reconcile panicked; retrying with backoff"));
                    Action::backoff()
                }
            };
            match action.next {
                Next::After(duration) => self.queue.requeue_after(key, duration),
                Next::AwaitChange => {}
                Next::Backoff => {
                    self.queue.requeue_rate_limited(key);
                }
            }
            drop(lease);
        }
    }
}

/// The parent and attributes of `obj`'s reconcile span: the trace its annotation names, and
/// `<kind>.id` (its uid), `<kind>.namespace`, `<kind>.name` (for a Sandbox, the reference's
/// `sandbox.id`, `sandbox.namespace`, `sandbox.name`), and `controller.name`.
fn span_parent<K: Object>(
    controller: &str,
    obj: &K,
) -> (oka_telemetry::Context, Vec<oka_telemetry::Attribute>) {
    use oka_telemetry::Attribute;
    let meta = obj.meta();
    let kind = K::kind(&()).to_ascii_lowercase();
    let attributes = vec![
        Attribute::new(format!("{kind}.id"), meta.uid.clone().unwrap_or_default()),
        Attribute::new(format!("{kind}.namespace"), meta.namespace.clone().unwrap_or_default()),
        Attribute::new(format!("{kind}.name"), meta.name.clone().unwrap_or_default()),
        Attribute::new("controller.name", controller.to_owned()),
    ];
    (oka_telemetry::context::extract(meta), attributes)
}

/// The keys of the objects of kind `Owner` named in `obj`'s owner references: same
/// namespace as `obj`, matching kind and API group (any version).
pub fn owner_keys<Owner, C>(obj: &C) -> Vec<ObjectKey>
where
    Owner: Resource<DynamicType = ()>,
    C: Resource,
{
    let kind = Owner::kind(&());
    let group = Owner::group(&());
    let namespace = obj.meta().namespace.clone().unwrap_or_default();
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|owner| owner.kind == kind && api_group(&owner.api_version) == group)
        .map(|owner| ObjectKey::new(namespace.clone(), owner.name.clone()))
        .collect()
}

/// The group of an `apiVersion` (`""` for the core group's `v1`).
fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn owned_by(refs: &[(&str, &str, &str)]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.owner_references = Some(
            refs.iter()
                .map(|(api_version, kind, name)| OwnerReference {
                    api_version: (*api_version).into(),
                    kind: (*kind).into(),
                    name: (*name).into(),
                    ..Default::default()
                })
                .collect(),
        );
        pod
    }

    #[test]
    fn owner_keys_match_kind_and_group_in_the_childs_namespace() {
        let pod = owned_by(&[
            ("v1", "ConfigMap", "a"),
            ("apps/v1", "ConfigMap", "other-group"),
            ("v1", "Secret", "other-kind"),
            ("v1", "ConfigMap", "b"),
        ]);
        assert_eq!(
            owner_keys::<ConfigMap, _>(&pod),
            [ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b")]
        );
        assert!(owner_keys::<ConfigMap, _>(&Pod::default()).is_empty());
    }

    #[test]
    fn the_debounce_stretches_with_the_last_reconcile_up_to_its_cap() {
        let ms = Duration::from_millis;
        // Off, or a quick reconcile: the configured debounce.
        assert_eq!(stretched_debounce(ms(10), 0, ms(50)), ms(10));
        assert_eq!(stretched_debounce(ms(10), 10, Duration::ZERO), ms(10));
        assert_eq!(stretched_debounce(ms(10), 10, Duration::from_micros(300)), ms(10));
        // A pool of a thousand sandboxes: 3 ms a reconcile, 30 ms between them.
        assert_eq!(stretched_debounce(ms(10), 10, ms(3)), ms(30));
        // Never beyond the cap, never below the debounce.
        assert_eq!(stretched_debounce(ms(10), 10, ms(100)), MAX_STRETCHED_DEBOUNCE);
        assert_eq!(stretched_debounce(ms(400), 10, ms(100)), ms(400));
        assert_eq!(stretched_debounce(ms(10), u32::MAX, Duration::MAX), MAX_STRETCHED_DEBOUNCE);
    }

    #[test]
    fn actions_say_what_they_are() {
        assert_eq!(
            Action::requeue_after(Duration::from_secs(1)).requeue_duration(),
            Some(Duration::from_secs(1))
        );
        assert!(Action::await_change().is_await_change());
        assert!(Action::backoff().is_backoff());
        assert!(default_error_policy(&(), &(), &()).is_backoff());
    }
}
