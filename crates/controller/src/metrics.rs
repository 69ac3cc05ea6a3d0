//! The controllers' Prometheus series, named, typed, labelled and bucketed as the reference's
//! (`pkg/controller/*/metrics.go`), plus the seed's timestamp chain.
//!
//! Two kinds of series, recorded two ways:
//!
//! - **Per-object gauges** (`sandbox_info`, `sandbox_status_*`, `sandboxset_replicas`,
//!   `sandbox_claim_*`, …) are computed at scrape time from the controllers' caches by
//!   [`ObjectCollector`]. So a deleted object's series are gone at the next scrape without a
//!   garbage collector, their number is bounded by the objects that exist, and the controllers'
//!   hot paths do nothing for them.
//! - **Durations and totals** are recorded at the transitions, from the changes the controllers'
//!   informers see ([`ControllerMetrics::observe_sandbox`], [`ControllerMetrics::observe_claim`])
//!   and from the executors (pool creates, claims, TTL deletions). A transition is timed from the
//!   moment its start was seen to the moment its end was seen (conditions' transition times have
//!   one-second precision, which would round every pause to 0 or 1 s); when the start was not
//!   seen (a restart in between) the conditions' times are used. Objects already in their state
//!   when first listed record nothing, so a restart does not count old transitions again.
//!
//! The reference keeps `sandbox_status_paused_time` and `sandbox_status_resumed_time` after
//! their conditions disappear (a resume removes SandboxPaused): they are remembered here per
//! sandbox until it is deleted, as is the first detection time of an abnormal state.
//!
//! Not exported: `sandbox_runtime_container_abnormal` (there are no runtime init containers in a
//! local sandbox). `sandbox_metrics_gc_dropped_total` is exported and stays 0: series are dropped
//! at scrape, never through a queue that could overflow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use oka_api::conditions::{self, sandbox as cond};
use oka_api::{
    PoolAutoscaler, Sandbox, SandboxClaim, SandboxClaimPhase, SandboxPhase, SandboxSet, labels,
};
use oka_metrics::prometheus_client::collector::Collector;
use oka_metrics::prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet,
};
use oka_metrics::prometheus_client::metrics::MetricType;
use oka_metrics::prometheus_client::metrics::counter::Counter;
use oka_metrics::prometheus_client::metrics::family::Family;
use oka_metrics::prometheus_client::metrics::histogram::Histogram;
use oka_metrics::{Registry, Shared, Source, buckets, unix_seconds};

use oka_cache::{Cache, Change, ObjectKey};

pub use oka_metrics::labels::{NamespaceLabels, ResultLabels};

/// `namespace`, `name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

/// `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn e20_histogram() -> Histogram {
    Histogram::new(buckets::e20())
}

/// Which controllers run in this process, for [`ControllerMetrics::caches_synced`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunningControllers {
    /// The sandbox controller (a node's).
    pub sandboxes: bool,
    /// The SandboxSet controller.
    pub sets: bool,
    /// The SandboxClaim controller.
    pub claims: bool,
}

/// The controllers' series; one per process, shared by every controller through
/// [`crate::Config::metrics`].
#[derive(Debug)]
pub struct ControllerMetrics {
    shared: Shared,
    creation_duration: HistogramFamily<NamespaceLabels>,
    creation_total: Family<ResultLabels, Counter>,
    inplace_update_duration: HistogramFamily<NamespaceLabels>,
    pause_total: Family<ResultLabels, Counter>,
    resume_total: Family<ResultLabels, Counter>,
    deletion_duration: HistogramFamily<NamespaceLabels>,
    recycle_total: Family<ResultLabels, Counter>,
    set_sandboxes_created: Family<ObjectLabels, Counter>,
    set_sandboxes_claimed: Family<ObjectLabels, Counter>,
    set_claims_total: Family<ResultLabels, Counter>,
    claim_expired_total: Family<NamespaceLabels, Counter>,
    gc_dropped: Family<ReasonLabels, Counter>,
    objects: Arc<ObjectCollector>,
    claims_seen: Mutex<HashMap<ObjectKey, Instant>>,
    /// The PoolAutoscaler's, the probe runner's and the AutoPausePolicy's series.
    pub policy: crate::policy_metrics::PolicyMetrics,
}

/// What was seen of one sandbox: the starts of transitions in progress, and the timestamp
/// gauges that outlive their conditions.
#[derive(Debug, Default, Clone)]
struct Seen {
    first_seen: Option<Instant>,
    created_recorded: bool,
    pause_started: Option<Instant>,
    resume_started: Option<Instant>,
    recycle_started: Option<Instant>,
    inplace_started: Option<Instant>,
    deletion_seen: Option<Instant>,
    paused_time: Option<f64>,
    resumed_time: Option<f64>,
    abnormal: Option<(&'static str, f64)>,
}

impl ControllerMetrics {
    /// The controllers' series, recording the shared families into `shared`; nothing is
    /// exported until [`ControllerMetrics::register`].
    pub fn new(shared: Shared, label_allowlist: Vec<String>) -> Self {
        Self {
            shared,
            creation_duration: Family::new_with_constructor(e20_histogram),
            creation_total: Family::default(),
            inplace_update_duration: Family::new_with_constructor(e20_histogram),
            pause_total: Family::default(),
            resume_total: Family::default(),
            deletion_duration: Family::new_with_constructor(e20_histogram),
            recycle_total: Family::default(),
            set_sandboxes_created: Family::default(),
            set_sandboxes_claimed: Family::default(),
            set_claims_total: Family::default(),
            claim_expired_total: Family::default(),
            gc_dropped: Family::default(),
            objects: Arc::new(ObjectCollector { label_allowlist, ..ObjectCollector::default() }),
            claims_seen: Mutex::default(),
            policy: crate::policy_metrics::PolicyMetrics::default(),
        }
    }

    /// Registers every controller family, and the per-object collector, into `registry`.
    /// The shared families ([`Shared`]) are registered by whoever made them.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sandbox_metrics_gc_dropped",
            "Per-object series whose removal was dropped (always 0: series are computed at scrape)",
            self.gc_dropped.clone(),
        );
        registry.register(
            "sandbox_inplace_update_duration_seconds",
            "Time from InplaceUpdate False to True",
            self.inplace_update_duration.clone(),
        );
        registry.register(
            "sandboxset_sandboxes_created",
            "Sandboxes a SandboxSet created",
            self.set_sandboxes_created.clone(),
        );
        registry.register_collector(Box::new(Arc::clone(&self.objects)));
        self.policy.register(registry);
        let k8s = registry.sub_registry_with_label(("source".into(), Source::K8s.as_str().into()));
        k8s.register(
            "sandbox_creation_duration_seconds",
            "Time from a sandbox's creation to its first Ready",
            self.creation_duration.clone(),
        );
        k8s.register(
            "sandbox_creation",
            "Sandboxes that became Ready (success) or Failed (failure) for the first time",
            self.creation_total.clone(),
        );
        k8s.register("sandbox_pause", "Pauses completed", self.pause_total.clone());
        k8s.register("sandbox_resume", "Resumes completed", self.resume_total.clone());
        k8s.register(
            "sandbox_deletion_duration_seconds",
            "Time from a sandbox's deletionTimestamp to its removal",
            self.deletion_duration.clone(),
        );
        k8s.register(
            "sandbox_recycle",
            "Returns of sandboxes to their pools, by result",
            self.recycle_total.clone(),
        );
        k8s.register(
            "sandboxset_sandboxes_claimed",
            "Sandboxes of a SandboxSet claimed by SandboxClaims",
            self.set_sandboxes_claimed.clone(),
        );
        k8s.register(
            "sandboxset_claims",
            "Sandbox claims made by SandboxClaims, by result",
            self.set_claims_total.clone(),
        );
        k8s.register(
            "sandboxclaim_expired",
            "SandboxClaims deleted after ttlAfterCompleted",
            self.claim_expired_total.clone(),
        );
    }

    /// Lets the scrape read the sandbox controller's cache.
    pub fn watch_sandboxes(&self, cache: Cache<Sandbox>) {
        let _ = self.objects.sandboxes.set(cache);
    }

    /// Lets the scrape read the SandboxSet controller's cache.
    pub fn watch_sets(&self, cache: Cache<SandboxSet>) {
        let _ = self.objects.sets.set(cache);
    }

    /// Lets the scrape read the SandboxClaim controller's cache.
    pub fn watch_claims(&self, cache: Cache<SandboxClaim>) {
        let _ = self.objects.claims.set(cache);
    }

    /// Lets the scrape read the PoolAutoscaler controller's cache.
    pub fn watch_autoscalers(&self, cache: Cache<PoolAutoscaler>) {
        let _ = self.objects.autoscalers.set(cache);
    }

    /// Whether the caches of the controllers in `running` have been handed over and filled
    /// (readiness).
    pub fn caches_synced(&self, running: RunningControllers) -> bool {
        fn synced<K>(cache: &OnceLock<Cache<K>>, wanted: bool) -> bool {
            !wanted || cache.get().is_some_and(Cache::is_ready)
        }
        synced(&self.objects.sandboxes, running.sandboxes)
            && synced(&self.objects.sets, running.sets)
            && synced(&self.objects.claims, running.claims)
    }

    /// The number of sandboxes whose transitions are being followed (tests: a deleted sandbox
    /// leaves nothing behind).
    pub fn followed(&self) -> usize {
        self.objects.seen.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// A SandboxSet created `count` sandboxes.
    pub fn sandboxes_created(&self, namespace: &str, set: &str, count: u64) {
        let labels = ObjectLabels { namespace: namespace.to_owned(), name: set.to_owned() };
        self.set_sandboxes_created.get_or_create(&labels).inc_by(count);
    }

    /// A SandboxClaim claimed `claimed` sandboxes of `set` and failed `failed` times.
    pub fn claimed(&self, namespace: &str, set: &str, claimed: u64, failed: u64) {
        if claimed > 0 {
            let labels = ObjectLabels { namespace: namespace.to_owned(), name: set.to_owned() };
            self.set_sandboxes_claimed.get_or_create(&labels).inc_by(claimed);
            let labels = ResultLabels { namespace: namespace.to_owned(), result: "success" };
            self.set_claims_total.get_or_create(&labels).inc_by(claimed);
        }
        if failed > 0 {
            let labels = ResultLabels { namespace: namespace.to_owned(), result: "failed" };
            self.set_claims_total.get_or_create(&labels).inc_by(failed);
        }
    }

    /// A completed SandboxClaim was deleted after its TTL.
    pub fn claim_expired(&self, namespace: &str) {
        let labels = NamespaceLabels { namespace: namespace.to_owned() };
        self.claim_expired_total.get_or_create(&labels).inc();
    }

    /// Records what one change of a Sandbox completed; see the module doc.
    pub fn observe_sandbox(&self, change: &Change<Sandbox>) {
        let now = Instant::now();
        let mut seen = self.objects.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match change {
            Change::Deleted(sandbox) => {
                let key = ObjectKey::of(sandbox.as_ref());
                let Some(state) = seen.remove(&key) else { return };
                let namespace = namespace_of(sandbox.as_ref());
                let took = match (state.deletion_seen, &sandbox.metadata.deletion_timestamp) {
                    (Some(start), _) => Some(now.duration_since(start).as_secs_f64()),
                    (None, Some(ts)) => Some(seconds_since(ts)),
                    (None, None) => None,
                };
                if let Some(took) = took {
                    self.deletion_duration
                        .get_or_create(&NamespaceLabels { namespace })
                        .observe(took.max(0.0));
                }
            }
            Change::Applied { old, new } => {
                let key = ObjectKey::of(new.as_ref());
                let state = seen.entry(key).or_default();
                self.transitions(state, old.as_deref(), new, now);
            }
        }
    }

    fn transitions(&self, state: &mut Seen, old: Option<&Sandbox>, new: &Sandbox, now: Instant) {
        let namespace = namespace_of(new);
        let new_conditions = conditions_of(new);
        let old_conditions = old.map(conditions_of).unwrap_or_default();
        let find_new = |t| conditions::find(new_conditions, t);
        let find_old = |t| conditions::find(old_conditions, t);
        let first_sight = state.first_seen.is_none();
        state.first_seen.get_or_insert(now);

        // Timestamp chain: kept after the conditions go.
        if let Some(c) = find_new(cond::PAUSED).filter(|c| conditions::is_true(c)) {
            state.paused_time = Some(time_seconds(&c.last_transition_time));
        }
        if let Some(c) = find_new(cond::RESUMED).filter(|c| conditions::is_true(c)) {
            state.resumed_time = Some(time_seconds(&c.last_transition_time));
        }
        let abnormal = abnormal_type(new);
        state.abnormal = match (abnormal, state.abnormal) {
            (Some(kind), Some((was, since))) if kind == was => Some((was, since)),
            (Some(kind), _) => Some((kind, now_unix())),
            (None, _) => None,
        };
        if new.metadata.deletion_timestamp.is_some() && !first_sight {
            state.deletion_seen.get_or_insert(now);
        }

        let ready = find_new(cond::READY).is_some_and(conditions::is_true);
        if first_sight {
            // Listed, not seen changing: whatever it completed happened before we looked.
            state.created_recorded =
                ready || !matches!(phase_of(new), None | Some(SandboxPhase::Pending));
            starts(state, new_conditions, now);
            return;
        }

        // Creation: first Ready, or first Failed.
        if !state.created_recorded {
            if ready {
                state.created_recorded = true;
                let took = match state.first_seen {
                    Some(start)
                        if new.metadata.creation_timestamp.as_ref().is_some_and(|c| {
                            seconds_since(c) < 2.0 + now.duration_since(start).as_secs_f64()
                        }) =>
                    {
                        now.duration_since(start).as_secs_f64()
                    }
                    _ => lag(
                        new.metadata.creation_timestamp.as_ref(),
                        find_new(cond::READY).map(|c| &c.last_transition_time),
                    ),
                };
                self.creation_duration
                    .get_or_create(&NamespaceLabels { namespace: namespace.clone() })
                    .observe(took);
                self.creation_total
                    .get_or_create(&ResultLabels {
                        namespace: namespace.clone(),
                        result: "success",
                    })
                    .inc();
            } else if phase_of(new) == Some(SandboxPhase::Failed) {
                state.created_recorded = true;
                self.creation_total
                    .get_or_create(&ResultLabels {
                        namespace: namespace.clone(),
                        result: "failure",
                    })
                    .inc();
            }
        }

        // Pause and resume: the condition False → True.
        if let Some(took) =
            completed(find_old(cond::PAUSED), find_new(cond::PAUSED), state.pause_started, now)
        {
            self.shared.pause_duration.observe(Source::K8s, &namespace, took);
            self.pause_total
                .get_or_create(&ResultLabels { namespace: namespace.clone(), result: "success" })
                .inc();
        }
        if let Some(took) =
            completed(find_old(cond::RESUMED), find_new(cond::RESUMED), state.resume_started, now)
        {
            self.shared.resume_duration.observe(Source::K8s, &namespace, took);
            self.resume_total
                .get_or_create(&ResultLabels { namespace: namespace.clone(), result: "success" })
                .inc();
        }
        if let Some(took) = completed(
            find_old(cond::INPLACE_UPDATE),
            find_new(cond::INPLACE_UPDATE),
            state.inplace_started,
            now,
        ) {
            self.inplace_update_duration
                .get_or_create(&NamespaceLabels { namespace: namespace.clone() })
                .observe(took);
        }

        // Recycling: RecyclingStarted → Succeeded, Failed or Timeout.
        use cond::recycling_reason as r;
        let old_recycle = find_old(cond::RECYCLING).map(|c| c.reason.as_str());
        let new_recycle = find_new(cond::RECYCLING);
        if let Some(c) = new_recycle
            && old_recycle != Some(c.reason.as_str())
        {
            let result = match c.reason.as_str() {
                r::SUCCEEDED => Some("success"),
                r::FAILED => Some("failed"),
                r::TIMEOUT => Some("timeout"),
                _ => None,
            };
            if let Some(result) = result {
                if result == "success" {
                    let took = match state.recycle_started {
                        Some(start) => now.duration_since(start).as_secs_f64(),
                        None => lag(
                            find_old(cond::RECYCLING).map(|c| &c.last_transition_time),
                            Some(&c.last_transition_time),
                        ),
                    };
                    self.shared.recycle_duration.observe(Source::K8s, &namespace, took);
                }
                self.recycle_total
                    .get_or_create(&ResultLabels { namespace: namespace.clone(), result })
                    .inc();
                state.recycle_started = None;
            }
        }
        starts(state, new_conditions, now);
    }

    /// Records what one change of a SandboxClaim completed: its claim duration, once.
    pub fn observe_claim(&self, change: &Change<SandboxClaim>) {
        let now = Instant::now();
        let mut seen = self.claims_seen.lock().unwrap_or_else(PoisonError::into_inner);
        match change {
            Change::Deleted(claim) => {
                seen.remove(&ObjectKey::of(claim.as_ref()));
            }
            Change::Applied { old, new } => {
                let key = ObjectKey::of(new.as_ref());
                let phase = |c: &SandboxClaim| c.status.as_ref().and_then(|s| s.phase.clone());
                let Some(old) = old else {
                    if phase(new) != Some(SandboxClaimPhase::Completed) {
                        seen.insert(key, now);
                    }
                    return;
                };
                if phase(new) == Some(SandboxClaimPhase::Completed)
                    && phase(old) != Some(SandboxClaimPhase::Completed)
                {
                    let status = new.status.as_ref();
                    let took = match seen.remove(&key) {
                        Some(start) => now.duration_since(start).as_secs_f64(),
                        None => lag(
                            status.and_then(|s| s.claim_start_time.as_ref()),
                            status.and_then(|s| s.completion_time.as_ref()),
                        ),
                    };
                    self.shared.claim_duration.observe(
                        Source::K8s,
                        &namespace_of(new.as_ref()),
                        took,
                    );
                }
            }
        }
    }

    /// The scrape-time collector (benches fill its caches by hand).
    pub fn collector(&self) -> Arc<ObjectCollector> {
        Arc::clone(&self.objects)
    }
}

/// Notes the starts of the transitions whose condition is False now.
fn starts(state: &mut Seen, conditions: &[Condition], now: Instant) {
    let started =
        |t: &str| conditions::find(conditions, t).is_some_and(|c| c.status == conditions::FALSE);
    if started(cond::PAUSED) {
        state.pause_started.get_or_insert(now);
    } else {
        state.pause_started = None;
    }
    if started(cond::RESUMED) {
        state.resume_started.get_or_insert(now);
    } else {
        state.resume_started = None;
    }
    if started(cond::INPLACE_UPDATE) {
        state.inplace_started.get_or_insert(now);
    } else {
        state.inplace_started = None;
    }
    let recycling = conditions::find(conditions, cond::RECYCLING)
        .is_some_and(|c| c.reason == cond::recycling_reason::STARTED);
    if recycling {
        state.recycle_started.get_or_insert(now);
    }
}

/// How long a condition took from False to True, when this change made it True: from the
/// start seen, else from the conditions' transition times.
fn completed(
    old: Option<&Condition>,
    new: Option<&Condition>,
    started: Option<Instant>,
    now: Instant,
) -> Option<f64> {
    let new = new.filter(|c| conditions::is_true(c))?;
    if old.is_some_and(conditions::is_true) {
        return None;
    }
    Some(match started {
        Some(start) => now.duration_since(start).as_secs_f64(),
        None => lag(old.map(|c| &c.last_transition_time), Some(&new.last_transition_time)),
    })
}

/// Seconds from `from` to `to`, 0 when either is unknown or `to` is earlier.
fn lag(from: Option<&Time>, to: Option<&Time>) -> f64 {
    match (from, to) {
        (Some(from), Some(to)) => (time_seconds(to) - time_seconds(from)).max(0.0),
        _ => 0.0,
    }
}

fn time_seconds(time: &Time) -> f64 {
    unix_seconds(time.0.as_second(), time.0.subsec_nanosecond())
}

fn now_unix() -> f64 {
    let now = jiff::Timestamp::now();
    unix_seconds(now.as_second(), now.subsec_nanosecond())
}

fn seconds_since(time: &Time) -> f64 {
    (now_unix() - time_seconds(time)).max(0.0)
}

fn namespace_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().namespace.clone().unwrap_or_default()
}

fn conditions_of(sandbox: &Sandbox) -> &[Condition] {
    sandbox.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

fn phase_of(sandbox: &Sandbox) -> Option<SandboxPhase> {
    sandbox.status.as_ref().and_then(|s| s.phase.clone())
}

/// The reference's abnormal states: Paused without SandboxPaused True, Resuming without
/// SandboxResumed True.
fn abnormal_type(sandbox: &Sandbox) -> Option<&'static str> {
    let conditions = conditions_of(sandbox);
    let holds = |t| conditions::find(conditions, t).is_some_and(conditions::is_true);
    match phase_of(sandbox) {
        Some(SandboxPhase::Paused) if !holds(cond::PAUSED) => Some("pause_incomplete"),
        Some(SandboxPhase::Resuming) if !holds(cond::RESUMED) => Some("resume_incomplete"),
        _ => None,
    }
}

/// Computes the per-object gauges at scrape time from the controllers' caches.
#[derive(Debug, Default)]
pub struct ObjectCollector {
    sandboxes: OnceLock<Cache<Sandbox>>,
    sets: OnceLock<Cache<SandboxSet>>,
    claims: OnceLock<Cache<SandboxClaim>>,
    autoscalers: OnceLock<Cache<PoolAutoscaler>>,
    /// Label keys exported by `sandbox_labels` (the reference's `--metric-labels-allowlist`).
    label_allowlist: Vec<String>,
    /// What was seen of each sandbox (the transitions in progress, and the timestamp gauges
    /// that outlive their conditions), kept by [`ControllerMetrics::observe_sandbox`].
    seen: Mutex<HashMap<ObjectKey, Seen>>,
}

impl ObjectCollector {
    /// A collector over `sandboxes` alone (benches).
    pub fn over(sandboxes: Cache<Sandbox>) -> Self {
        let collector = Self::default();
        let _ = collector.sandboxes.set(sandboxes);
        collector
    }
}

/// Writes one gauge family from `rows`, nothing when there are none.
fn gauges<'a, T: 'a, L: EncodeLabelSet, V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    items: &'a [Arc<T>],
    row: impl Fn(&'a T) -> Option<(L, V)>,
) -> std::fmt::Result {
    let mut rows = items.iter().filter_map(|item| row(item.as_ref())).peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        metric.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

fn meta_str(value: Option<&String>) -> &str {
    value.map_or("", String::as_str)
}

fn time_of(time: Option<&Time>) -> Option<f64> {
    time.map(time_seconds)
}

/// The sanitised `label_<key>` name of a label key, as kube-state-metrics writes it.
pub fn label_name(key: &str) -> String {
    let mut name = String::with_capacity(key.len() + 6);
    name.push_str("label_");
    name.extend(key.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }));
    name
}

impl Collector for ObjectCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        if let Some(cache) = self.sandboxes.get() {
            let mut remembered = Remembered::new();
            {
                let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                let kept = seen.iter().filter(|(_, s)| {
                    s.paused_time.is_some() || s.resumed_time.is_some() || s.abnormal.is_some()
                });
                for (k, s) in kept {
                    remembered
                        .entry(k.namespace.clone())
                        .or_default()
                        .insert(k.name.clone(), (s.paused_time, s.resumed_time, s.abnormal));
                }
            }
            self.encode_sandboxes(&mut encoder, &cache.list(), &remembered)?;
        }
        if let Some(cache) = self.sets.get() {
            encode_sets(&mut encoder, &cache.list())?;
        }
        if let Some(cache) = self.claims.get() {
            encode_claims(&mut encoder, &cache.list())?;
        }
        if let Some(cache) = self.autoscalers.get() {
            encode_autoscalers(&mut encoder, &cache.list())?;
        }
        Ok(())
    }
}

/// What is remembered of a sandbox: its paused and resumed times, its abnormal state and since.
type Memory = (Option<f64>, Option<f64>, Option<(&'static str, f64)>);

/// [`Memory`] by namespace, then name (looked up by `&str`, without building a key).
type Remembered = HashMap<String, HashMap<String, Memory>>;

impl ObjectCollector {
    fn encode_sandboxes(
        &self,
        e: &mut DescriptorEncoder,
        all: &[Arc<Sandbox>],
        remembered: &Remembered,
    ) -> std::fmt::Result {
        fn key(s: &Sandbox) -> (&str, &str) {
            (meta_str(s.metadata.namespace.as_ref()), meta_str(s.metadata.name.as_ref()))
        }
        let find = |s, t: &str| conditions::find(conditions_of(s), t);
        let memory = |s: &Sandbox| -> Memory {
            let (ns, name) = key(s);
            remembered.get(ns).and_then(|m| m.get(name)).copied().unwrap_or_default()
        };
        gauges(e, "sandbox_info", "Information about a sandbox (always 1)", all, |s| {
            let l = s.metadata.labels.as_ref();
            let (ns, name) = key(s);
            let labels = [
                ("namespace", ns),
                ("name", name),
                ("sandbox_pool", meta_str(l.and_then(|l| l.get(labels::SANDBOX_POOL)))),
                ("node", meta_str(s.status.as_ref().and_then(|st| st.node_name.as_ref()))),
                ("sandbox_template", meta_str(l.and_then(|l| l.get(labels::SANDBOX_TEMPLATE)))),
            ];
            Some((labels, 1i64))
        })?;
        gauges(e, "sandbox_created", "Unix creation timestamp of a sandbox", all, |s| {
            let (ns, name) = key(s);
            Some((
                [("namespace", ns), ("name", name)],
                time_of(s.metadata.creation_timestamp.as_ref())?,
            ))
        })?;
        gauges(
            e,
            "sandbox_deletion_timestamp",
            "Unix deletion timestamp of a sandbox being deleted",
            all,
            |s| {
                let (ns, name) = key(s);
                Some((
                    [("namespace", ns), ("name", name)],
                    time_of(s.metadata.deletion_timestamp.as_ref())?,
                ))
            },
        )?;
        gauges(
            e,
            "sandbox_status_phase",
            "The sandbox's current phase (1; only the current phase has a series)",
            all,
            |s| {
                let (ns, name) = key(s);
                let phase = s
                    .status
                    .as_ref()
                    .and_then(|st| st.phase.as_ref())
                    .map_or("Pending", |p| p.as_str());
                Some(([("namespace", ns), ("name", name), ("phase", phase)], 1i64))
            },
        )?;
        gauges(
            e,
            "sandbox_status_ready",
            "Whether the sandbox is Ready (1) or not (0)",
            all,
            |s| {
                let (ns, name) = key(s);
                let ready = find(s, cond::READY).is_some_and(conditions::is_true);
                Some(([("namespace", ns), ("name", name)], i64::from(ready)))
            },
        )?;
        gauges(
            e,
            "sandbox_status_ready_time",
            "Unix time the sandbox last became Ready, while it is",
            all,
            |s| {
                let (ns, name) = key(s);
                let c = find(s, cond::READY).filter(|c| conditions::is_true(c))?;
                Some(([("namespace", ns), ("name", name)], time_seconds(&c.last_transition_time)))
            },
        )?;
        // InplaceUpdate, SandboxPaused, SandboxResumed False ⇒ 1 (+ its transition time).
        for (type_, gauge, help) in [
            (
                cond::INPLACE_UPDATE,
                "sandbox_status_inplace_updating",
                "Whether an in-place update is in progress (InplaceUpdate False)",
            ),
            (
                cond::PAUSED,
                "sandbox_status_unpaused",
                "Whether a pause is in progress (SandboxPaused False)",
            ),
            (
                cond::RESUMED,
                "sandbox_status_unresumed",
                "Whether a resume is in progress (SandboxResumed False)",
            ),
        ] {
            gauges(e, gauge, help, all, |s| {
                let (ns, name) = key(s);
                let on = find(s, type_).is_some_and(|c| c.status == conditions::FALSE);
                Some(([("namespace", ns), ("name", name)], i64::from(on)))
            })?;
            let time_name = format!("{gauge}_time");
            let time_help = format!("Unix time {gauge} became 1, while it is");
            gauges(e, &time_name, &time_help, all, |s| {
                let (ns, name) = key(s);
                let c = find(s, type_).filter(|c| c.status == conditions::FALSE)?;
                Some(([("namespace", ns), ("name", name)], time_seconds(&c.last_transition_time)))
            })?;
        }
        gauges(
            e,
            "sandbox_status_paused_time",
            "Unix time the sandbox was last paused (SandboxPaused True), kept after a resume",
            all,
            |s| {
                let (ns, name) = key(s);
                Some(([("namespace", ns), ("name", name)], memory(s).0?))
            },
        )?;
        gauges(
            e,
            "sandbox_status_resumed_time",
            "Unix time the sandbox was last resumed (SandboxResumed True), kept after a pause",
            all,
            |s| {
                let (ns, name) = key(s);
                Some(([("namespace", ns), ("name", name)], memory(s).1?))
            },
        )?;
        gauges(
            e,
            "sandbox_status_abnormal",
            "A sandbox in an abnormal state (pause_incomplete, resume_incomplete)",
            all,
            |s| {
                let (ns, name) = key(s);
                let kind = abnormal_type(s)?;
                Some(([("namespace", ns), ("name", name), ("type", kind)], 1i64))
            },
        )?;
        gauges(
            e,
            "sandbox_status_abnormal_time",
            "Unix time the abnormal state was first seen",
            all,
            |s| {
                let (ns, name) = key(s);
                let (kind, since) = memory(s).2?;
                (abnormal_type(s) == Some(kind))
                    .then_some(([("namespace", ns), ("name", name), ("type", kind)], since))
            },
        )?;
        if !self.label_allowlist.is_empty() {
            gauges(e, "sandbox_labels", "The sandbox's allowlisted labels (1)", all, |s| {
                let (ns, name) = key(s);
                let mut labels = vec![
                    ("namespace".to_owned(), ns.to_owned()),
                    ("name".to_owned(), name.to_owned()),
                ];
                for allowed in &self.label_allowlist {
                    let value = s.metadata.labels.as_ref().and_then(|l| l.get(allowed));
                    labels.push((label_name(allowed), value.cloned().unwrap_or_default()));
                }
                Some((labels, 1i64))
            })?;
        }
        Ok(())
    }
}

fn encode_sets(e: &mut DescriptorEncoder, sets: &[Arc<SandboxSet>]) -> std::fmt::Result {
    fn key(s: &SandboxSet) -> [(&'static str, &str); 2] {
        [
            ("namespace", meta_str(s.metadata.namespace.as_ref())),
            ("name", meta_str(s.metadata.name.as_ref())),
        ]
    }
    type Field = fn(&SandboxSet) -> Option<i64>;
    let fields: [(&str, &str, Field); 5] = [
        ("sandboxset_replicas", "Sandboxes in the pool (status.replicas)", |s| {
            s.status.as_ref().map(|st| i64::from(st.replicas))
        }),
        (
            "sandboxset_available_replicas",
            "Available sandboxes in the pool (status.availableReplicas)",
            |s| s.status.as_ref().map(|st| i64::from(st.available_replicas)),
        ),
        ("sandboxset_desired_replicas", "Desired sandboxes in the pool (spec.replicas)", |s| {
            Some(i64::from(s.spec.replicas))
        }),
        ("sandboxset_updated_replicas", "Sandboxes of the pool at the current revision", |s| {
            s.status.as_ref().and_then(|st| st.updated_replicas).map(i64::from)
        }),
        (
            "sandboxset_updated_available_replicas",
            "Available sandboxes of the pool at the current revision",
            |s| s.status.as_ref().and_then(|st| st.updated_available_replicas).map(i64::from),
        ),
    ];
    for (name, help, field) in fields {
        gauges(e, name, help, sets, |s| Some((key(s), field(s)?)))?;
    }
    gauges(e, "sandboxset_created", "Unix creation timestamp of a SandboxSet", sets, |s| {
        Some((key(s), time_of(s.metadata.creation_timestamp.as_ref())?))
    })
}

fn encode_autoscalers(e: &mut DescriptorEncoder, all: &[Arc<PoolAutoscaler>]) -> std::fmt::Result {
    fn key(pa: &PoolAutoscaler) -> [(&'static str, &str); 2] {
        [
            ("namespace", meta_str(pa.metadata.namespace.as_ref())),
            ("name", meta_str(pa.metadata.name.as_ref())),
        ]
    }
    type Field = fn(&PoolAutoscaler) -> Option<i64>;
    let fields: [(&str, &str, Field); 3] = [
        (
            "pool_autoscaler_desired_replicas",
            "The replicas a PoolAutoscaler last computed for its pool (status.desiredReplicas)",
            |pa| pa.status.as_ref().and_then(|s| s.desired_replicas).map(i64::from),
        ),
        (
            "pool_autoscaler_current_replicas",
            "The pool's replicas as a PoolAutoscaler last read them (status.currentReplicas)",
            |pa| pa.status.as_ref().and_then(|s| s.current_replicas).map(i64::from),
        ),
        (
            "pool_autoscaler_available_replicas",
            "The pool's available sandboxes as a PoolAutoscaler last read them",
            |pa| {
                let capacity = pa.status.as_ref()?.current_capacity.as_ref()?;
                capacity.available.map(i64::from)
            },
        ),
    ];
    for (name, help, field) in fields {
        gauges(e, name, help, all, |pa| Some((key(pa), field(pa)?)))?;
    }
    Ok(())
}

fn encode_claims(e: &mut DescriptorEncoder, claims: &[Arc<SandboxClaim>]) -> std::fmt::Result {
    fn key(c: &SandboxClaim) -> [(&'static str, &str); 3] {
        [
            ("namespace", meta_str(c.metadata.namespace.as_ref())),
            ("name", meta_str(c.metadata.name.as_ref())),
            ("source", Source::K8s.as_str()),
        ]
    }
    gauges(e, "sandbox_claim_info", "Information about a SandboxClaim (1)", claims, |c| {
        let [ns, name, source] = key(c);
        let labels = [
            ns,
            name,
            ("template_name", c.spec.template_name.as_str()),
            ("uid", meta_str(c.metadata.uid.as_ref())),
            source,
        ];
        Some((labels, 1i64))
    })?;
    gauges(e, "sandbox_claim_created", "Unix creation timestamp of a SandboxClaim", claims, |c| {
        Some((key(c), time_of(c.metadata.creation_timestamp.as_ref())?))
    })?;
    gauges(e, "sandbox_claim_status_phase", "The claim's current phase (1)", claims, |c| {
        let [ns, name, source] = key(c);
        let phase = c.status.as_ref().and_then(|s| s.phase.as_ref())?.as_str();
        Some(([ns, name, ("phase", phase), source], 1i64))
    })?;
    gauges(e, "sandbox_claim_start_time", "Unix time the claim started claiming", claims, |c| {
        Some((key(c), time_of(c.status.as_ref().and_then(|s| s.claim_start_time.as_ref()))?))
    })?;
    gauges(e, "sandbox_claim_completion_time", "Unix time the claim completed", claims, |c| {
        Some((key(c), time_of(c.status.as_ref().and_then(|s| s.completion_time.as_ref()))?))
    })?;
    gauges(e, "sandbox_claim_claimed_replicas", "Sandboxes the claim has claimed", claims, |c| {
        Some((key(c), i64::from(c.status.as_ref().and_then(|s| s.claimed_replicas).unwrap_or(0))))
    })?;
    gauges(e, "sandbox_claim_desired_replicas", "Sandboxes the claim asks for", claims, |c| {
        Some((key(c), i64::from(c.spec.replicas)))
    })
}

#[cfg(test)]
mod tests {
    //! The transitions' recording, change by change, as the sandbox controller's informer
    //! reports them, read back from a scrape (Prometheus text) of the families and the gauges.

    use std::time::Duration;

    use jiff::Timestamp;
    use oka_metrics::scrape::{Format, encode};

    use super::*;

    /// Unix seconds as a condition time.
    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("a valid time"))
    }

    /// The metrics of one process, with a sandbox cache the informer would fill.
    struct Harness {
        metrics: ControllerMetrics,
        registry: Registry,
        cache: Cache<Sandbox>,
        sandbox: Sandbox,
        version: u64,
    }

    impl Harness {
        fn new() -> Self {
            let shared = Shared::default();
            let mut registry = Registry::default();
            shared.register(&mut registry);
            let metrics = ControllerMetrics::new(shared, Vec::new());
            metrics.register(&mut registry);
            let cache = Cache::default();
            metrics.watch_sandboxes(cache.clone());
            let mut sandbox = Sandbox::test().name("sbx").namespace("team").no_status().build();
            sandbox.metadata.creation_timestamp = Some(at(1_000));
            Self { metrics, registry, cache, sandbox, version: 0 }
        }

        /// The informer sees the sandbox as `change` leaves it.
        fn step(&mut self, change: impl FnOnce(&mut Sandbox)) {
            change(&mut self.sandbox);
            self.version += 1;
            self.sandbox.metadata.resource_version = Some(self.version.to_string());
            let reported = self.cache.apply(Arc::new(self.sandbox.clone())).expect("a new version");
            self.metrics.observe_sandbox(&reported);
        }

        /// The informer sees the sandbox go.
        fn delete(&mut self) {
            let reported = self.cache.delete(&self.sandbox).expect("cached");
            self.metrics.observe_sandbox(&reported);
        }

        fn scrape(&self) -> String {
            encode(&self.registry, Format::PrometheusText).expect("encodes")
        }

        /// The value of `series` (a name, and labels in any order), if exported.
        fn value(&self, series: &str) -> Option<f64> {
            let wanted = split(series);
            self.scrape().lines().filter(|l| !l.starts_with('#')).find_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                (split(name) == wanted).then(|| value.parse().expect("a number"))
            })
        }

        fn get(&self, series: &str) -> f64 {
            self.value(series).unwrap_or_else(|| panic!("no {series} in\n{}", self.scrape()))
        }
    }

    /// A series' name and its sorted labels.
    fn split(series: &str) -> (String, Vec<String>) {
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let mut labels: Vec<String> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        labels.sort();
        (name.to_owned(), labels)
    }

    const OBJ: &str = "{namespace=\"team\",name=\"sbx\"}";
    const K8S: &str = "{namespace=\"team\",source=\"k8s\"}";

    fn series(name: &str, labels: &str) -> String {
        format!("{name}{labels}")
    }

    fn phase(sandbox: &mut Sandbox, phase: SandboxPhase) {
        sandbox.status.get_or_insert_with(Default::default).phase = Some(phase);
    }

    /// Sets condition `type_` (replacing one of that type) with its transition at `seconds`.
    fn set(sandbox: &mut Sandbox, type_: &str, status: &str, reason: &str, seconds: i64) {
        let list = sandbox
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new);
        list.retain(|c| c.type_ != type_);
        list.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at(seconds),
        });
    }

    fn unset(sandbox: &mut Sandbox, type_: &str) {
        if let Some(list) = sandbox.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            list.retain(|c| c.type_ != type_);
        }
    }

    const T: &str = conditions::TRUE;
    const F: &str = conditions::FALSE;
    const PAUSE_TIME: Duration = Duration::from_millis(40);

    /// Creation, a pause, its resume, a second pause: the totals, the durations (timed from
    /// the changes seen) and the timestamp chain, which keeps each time after its condition
    /// goes.
    #[test]
    fn creation_pause_and_resume_are_recorded_once_each_with_the_timestamp_chain() {
        let mut h = Harness::new();
        h.step(|s| phase(s, SandboxPhase::Pending));
        assert_eq!(h.value(&series("sandbox_creation_total", K8S)), None, "nothing yet");

        // First Ready, 3 s after the creation (seen only now, so timed from the conditions).
        h.step(|s| {
            phase(s, SandboxPhase::Running);
            set(s, cond::READY, T, "PodReady", 1_003);
        });
        let created = "{namespace=\"team\",result=\"success\",source=\"k8s\"}";
        assert_eq!(h.get(&series("sandbox_creation_total", created)), 1.0);
        assert_eq!(h.get(&series("sandbox_creation_duration_seconds_count", K8S)), 1.0);
        assert_eq!(h.get(&series("sandbox_creation_duration_seconds_sum", K8S)), 3.0);
        assert_eq!(h.get(&series("sandbox_status_ready_time", OBJ)), 1_003.0);
        assert_eq!(h.get(&series("sandbox_created", OBJ)), 1_000.0);

        // Pausing: SandboxPaused False (phase Paused, not complete: abnormal meanwhile).
        h.step(|s| {
            phase(s, SandboxPhase::Paused);
            set(s, cond::READY, F, "PodReady", 1_010);
            set(s, cond::PAUSED, F, "Pending", 1_010);
        });
        assert_eq!(h.get(&series("sandbox_status_unpaused", OBJ)), 1.0);
        assert_eq!(h.get(&series("sandbox_status_unpaused_time", OBJ)), 1_010.0);
        let incomplete = "{namespace=\"team\",name=\"sbx\",type=\"pause_incomplete\"}";
        assert_eq!(h.get(&series("sandbox_status_abnormal", incomplete)), 1.0);
        assert!(h.value(&series("sandbox_status_abnormal_time", incomplete)).is_some());
        assert_eq!(h.value(&series("sandbox_status_paused_time", OBJ)), None);
        std::thread::sleep(PAUSE_TIME);

        // Paused: SandboxPaused True.
        h.step(|s| set(s, cond::PAUSED, T, "FreezePauseSucceed", 1_012));
        let success = "{namespace=\"team\",result=\"success\",source=\"k8s\"}";
        assert_eq!(h.get(&series("sandbox_pause_total", success)), 1.0);
        assert_eq!(h.get(&series("sandbox_pause_duration_seconds_count", K8S)), 1.0);
        let took = h.get(&series("sandbox_pause_duration_seconds_sum", K8S));
        assert!(took >= PAUSE_TIME.as_secs_f64() && took < 5.0, "timed from the changes: {took}");
        assert_eq!(h.get(&series("sandbox_status_paused_time", OBJ)), 1_012.0);
        assert_eq!(h.get(&series("sandbox_status_unpaused", OBJ)), 0.0);
        assert_eq!(h.value(&series("sandbox_status_unpaused_time", OBJ)), None);
        assert_eq!(h.value(&series("sandbox_status_abnormal", incomplete)), None);
        assert_eq!(h.value(&series("sandbox_status_resumed_time", OBJ)), None);

        // Resuming: phase Resuming, SandboxResumed False (SandboxPaused still True).
        h.step(|s| {
            phase(s, SandboxPhase::Resuming);
            set(s, cond::RESUMED, F, "CreatePod", 1_020);
        });
        assert_eq!(h.get(&series("sandbox_status_unresumed", OBJ)), 1.0);
        assert_eq!(h.get(&series("sandbox_status_unresumed_time", OBJ)), 1_020.0);
        let resuming = "{namespace=\"team\",name=\"sbx\",type=\"resume_incomplete\"}";
        assert_eq!(h.get(&series("sandbox_status_abnormal", resuming)), 1.0);
        std::thread::sleep(PAUSE_TIME);

        // Resumed: SandboxResumed True, SandboxPaused removed, Running and Ready again.
        h.step(|s| {
            phase(s, SandboxPhase::Running);
            set(s, cond::RESUMED, T, "ResumePod", 1_021);
            unset(s, cond::PAUSED);
            set(s, cond::READY, T, "PodReady", 1_021);
        });
        assert_eq!(h.get(&series("sandbox_resume_total", success)), 1.0);
        assert_eq!(h.get(&series("sandbox_resume_duration_seconds_count", K8S)), 1.0);
        let took = h.get(&series("sandbox_resume_duration_seconds_sum", K8S));
        assert!(took >= PAUSE_TIME.as_secs_f64() && took < 5.0, "the Resuming phase: {took}");
        assert_eq!(h.get(&series("sandbox_status_resumed_time", OBJ)), 1_021.0);
        assert_eq!(
            h.get(&series("sandbox_status_paused_time", OBJ)),
            1_012.0,
            "kept after SandboxPaused is removed"
        );
        assert_eq!(h.value(&series("sandbox_status_abnormal", resuming)), None);
        assert_eq!(h.get(&series("sandbox_status_unresumed", OBJ)), 0.0);
        // A new Ready is not a second creation.
        assert_eq!(h.get(&series("sandbox_creation_total", created)), 1.0);
        assert_eq!(h.get(&series("sandbox_creation_duration_seconds_count", K8S)), 1.0);

        // A second pause: the paused time moves, the resumed time stays.
        h.step(|s| {
            phase(s, SandboxPhase::Paused);
            unset(s, cond::RESUMED);
            set(s, cond::PAUSED, F, "Pending", 1_030);
        });
        h.step(|s| set(s, cond::PAUSED, T, "FreezePauseSucceed", 1_031));
        assert_eq!(h.get(&series("sandbox_pause_total", success)), 2.0);
        assert_eq!(h.get(&series("sandbox_pause_duration_seconds_count", K8S)), 2.0);
        assert_eq!(h.get(&series("sandbox_status_paused_time", OBJ)), 1_031.0);
        assert_eq!(h.get(&series("sandbox_status_resumed_time", OBJ)), 1_021.0);
        // The same version reported again (a resumed watch) counts nothing.
        let again = Change::Applied {
            old: Some(Arc::new(h.sandbox.clone())),
            new: Arc::new(h.sandbox.clone()),
        };
        h.metrics.observe_sandbox(&again);
        assert_eq!(h.get(&series("sandbox_pause_total", success)), 2.0);
        // Only the manager records e2b series.
        let e2b = "{namespace=\"team\",source=\"e2b\"}";
        assert_eq!(h.value(&series("sandbox_pause_duration_seconds_count", e2b)), None);
    }

    #[test]
    fn recycles_count_by_result_and_time_the_successes() {
        let mut h = Harness::new();
        h.step(|s| {
            phase(s, SandboxPhase::Running);
            set(s, cond::READY, T, "PodReady", 1_001);
        });
        use cond::recycling_reason as r;
        h.step(|s| set(s, cond::RECYCLING, F, r::STARTED, 1_100));
        std::thread::sleep(PAUSE_TIME);
        h.step(|s| set(s, cond::RECYCLING, F, r::COMPLETED, 1_101));
        assert_eq!(h.value(&series("sandbox_recycle_duration_seconds_count", K8S)), None);
        h.step(|s| set(s, cond::RECYCLING, T, r::SUCCEEDED, 1_102));
        let result = |r: &str| format!("{{namespace=\"team\",result=\"{r}\",source=\"k8s\"}}");
        assert_eq!(h.get(&series("sandbox_recycle_total", &result("success"))), 1.0);
        assert_eq!(h.get(&series("sandbox_recycle_duration_seconds_count", K8S)), 1.0);
        let took = h.get(&series("sandbox_recycle_duration_seconds_sum", K8S));
        assert!(took >= PAUSE_TIME.as_secs_f64() && took < 5.0, "from RecyclingStarted: {took}");
        // E10 buckets for the controller's recycles.
        let bucket = "{namespace=\"team\",source=\"k8s\",le=\"409.6\"}";
        assert_eq!(h.get(&series("sandbox_recycle_duration_seconds_bucket", bucket)), 1.0);

        // A failed and a timed-out recycle: counted, not timed.
        h.step(|s| set(s, cond::RECYCLING, F, r::STARTED, 1_200));
        h.step(|s| set(s, cond::RECYCLING, F, r::FAILED, 1_201));
        h.step(|s| set(s, cond::RECYCLING, F, r::STARTED, 1_300));
        h.step(|s| set(s, cond::RECYCLING, F, r::TIMEOUT, 1_301));
        assert_eq!(h.get(&series("sandbox_recycle_total", &result("failed"))), 1.0);
        assert_eq!(h.get(&series("sandbox_recycle_total", &result("timeout"))), 1.0);
        assert_eq!(h.get(&series("sandbox_recycle_duration_seconds_count", K8S)), 1.0);
    }

    #[test]
    fn a_deletion_is_timed_and_leaves_no_series_behind() {
        let mut h = Harness::new();
        h.step(|s| {
            phase(s, SandboxPhase::Paused);
            set(s, cond::PAUSED, T, "FreezePauseSucceed", 1_050);
        });
        assert_eq!(h.get(&series("sandbox_status_paused_time", OBJ)), 1_050.0);
        h.step(|s| s.metadata.deletion_timestamp = Some(at(1_060)));
        assert_eq!(h.get(&series("sandbox_deletion_timestamp", OBJ)), 1_060.0);
        std::thread::sleep(PAUSE_TIME);
        h.delete();
        assert_eq!(h.get(&series("sandbox_deletion_duration_seconds_count", K8S)), 1.0);
        let took = h.get(&series("sandbox_deletion_duration_seconds_sum", K8S));
        assert!(took >= PAUSE_TIME.as_secs_f64() && took < 5.0, "from the deletion seen: {took}");
        assert_eq!(h.metrics.followed(), 0, "nothing is remembered of it");
        let text = h.scrape();
        assert!(!text.lines().any(|l| l.contains("name=\"sbx\"")), "{text}");
    }

    #[test]
    fn what_was_done_before_the_first_list_is_not_counted() {
        let mut h = Harness::new();
        // First seen Paused (after a restart): its creation and pause happened before.
        h.step(|s| {
            phase(s, SandboxPhase::Paused);
            set(s, cond::READY, F, "PodReady", 1_010);
            set(s, cond::PAUSED, T, "FreezePauseSucceed", 1_011);
        });
        for family in ["sandbox_creation_total", "sandbox_pause_total"] {
            assert!(!h.scrape().lines().any(|l| l.starts_with(family)), "{family}");
        }
        // …but the timestamp gauge says when it was paused.
        assert_eq!(h.get(&series("sandbox_status_paused_time", OBJ)), 1_011.0);
        // A sandbox that fails before it was ever Ready: a failed creation.
        let mut h = Harness::new();
        h.step(|s| phase(s, SandboxPhase::Pending));
        h.step(|s| phase(s, SandboxPhase::Failed));
        let failure = "{namespace=\"team\",result=\"failure\",source=\"k8s\"}";
        assert_eq!(h.get(&series("sandbox_creation_total", failure)), 1.0);
        assert_eq!(h.value(&series("sandbox_creation_duration_seconds_count", K8S)), None);
    }
}
