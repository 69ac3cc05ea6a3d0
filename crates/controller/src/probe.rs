//! The probe runner (oka extension, seed-extensions §2.3–2.4): runs each sandbox's
//! `spec.probes` and reports them as conditions `probe.agents.kruise.io/<name>`.
//!
//! # Shape
//!
//! A pure planner (this module's free functions: [`situation`], [`Counters::record`],
//! [`first_due`], [`next_due`], [`needs_write`]) and a thin executor, [`run_probe_runner`]:
//! **one task** keeps a binary heap of due times (a timer wheel of one level) over every
//! (sandbox, probe), starts the due attempts as futures polled by that same task (at most
//! [`ProbeRunnerOptions::max_in_flight`] at once), and writes a condition only when its status or
//! reason changes. There is no task per sandbox or per probe; the cost is one heap operation
//! and one connection per attempt.
//!
//! # Rules
//!
//! - **Which sandboxes** ([`situation`]): unclaimed pool members (controlled by a SandboxSet)
//!   are not probed and get no condition; deleting, Succeeded and Failed sandboxes stop (their
//!   conditions stay); Running with `Ready=True` runs every probe; Pending, Upgrading,
//!   Resuming and Paused run only external probes (an `activity` probe, or
//!   `httpGet`/`tcpSocket` with a `host`), the in-sandbox ones get `Unknown/NotProbing` once
//!   and their counters reset; Recycling runs none.
//! - **Which probes**: the sandbox's `spec.probes`, else those of the SandboxTemplate its
//!   `templateRef` names (the pool does not copy them onto its members yet).
//! - **When**: the first attempt at `max(Ready's lastTransitionTime, claim-timestamp) +
//!   initialDelaySeconds + jitter` (jitter up to 10 % of the period, from a hash of the
//!   sandbox and probe, so a thousand sandboxes created together do not probe together), then
//!   every `periodSeconds` from the start of the previous attempt; an attempt is cut at
//!   `timeoutSeconds`.
//! - **Results** ([`Counters::record`]): `True/ProbeSucceeded` after `successThreshold`
//!   consecutive successes; `False/ProbeFailed` (or `ProbeTimeout` when the last failure timed
//!   out) after `failureThreshold` consecutive failures; an error that prevents the attempt
//!   (the runtime cannot reach the sandbox, an unresolvable named port, an HTTPS probe) counts
//!   toward neither, and `failureThreshold` consecutive errors make `Unknown/ProbeError`.
//!   `Unknown/ProbeInitializing` is written once when probing starts.
//! - **Writes**: only when status or reason changes (a new message alone is not written);
//!   `lastTransitionTime` is the time of the attempt that crossed the threshold. Removing a probe
//!   from the spec removes its condition.
//! - **Handlers** ([`handlers`]): `tcpSocket` connects (through [`Runtime::connect`] into the
//!   sandbox's network namespace without `host`, over the host's network with one);
//!   `httpGet` sends one HTTP/1.1 GET over such a connection (path, `httpHeaders` and `host`
//!   with `$(SANDBOX_NAME)`, `$(SANDBOX_NAMESPACE)` and `$(SANDBOX_ID)` substituted; named ports
//!   resolved from the pod template) and passes on a status in 200..=399; `activity` passes
//!   while the last request the gateway routed to the sandbox (an [`ActivitySource`]) or the
//!   annotation `agents.kruise.io/last-activity-time`, the claim time or Ready's transition is
//!   younger than `windowSeconds`.
//!
//! # Where oka differs from the proposal, and why
//!
//! - `exec` probes are not run: oka has no client for the agent runtime's process API in the
//!   controllers yet. Their condition says so (`Unknown/ProbeError`, "exec probes are not run
//!   yet ..."), so they are never silently ignored.
//! - `httpGet` with `scheme: HTTPS` is an error (`Unknown/ProbeError`): the runner has no TLS
//!   client. Redirects are not followed (as proposed).
//! - Without `host` a probe goes to `127.0.0.1` inside the sandbox's network namespace, not to a
//!   pod IP: local sandboxes are loopback-only by default. The `Host` header is then
//!   `127.0.0.1:<port>`.
//! - Activity comes from the gateway in the same process (no annotation flush, see
//!   `oka_gateway::activity`); the manager's own proxying is not counted. On a cluster it comes
//!   from the node agent's relay, which every byte between the gateway and the sandbox passes
//!   (`oka_relay::Activity`; there the manager's `/init` counts too).
//! - No `--probe-workers` pool of tasks: attempts are futures of the one runner task.
//! - Counters live in memory: a restart starts them again (conditions persist in the store).

pub mod handlers;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use oka_api::conditions::sandbox::{READY, probe_reason};
use oka_api::conditions::{self, DEFAULT_MAX_MESSAGE_LEN, FALSE, TRUE, UNKNOWN, truncate_message};
use oka_api::probes::{PROBE_CONDITION_PREFIX, SandboxProbe, probe_name_of_condition};
use oka_api::{Sandbox, SandboxPhase, SandboxTemplate, annotations};
use oka_runtime_api::Runtime;
use oka_store::{Store, StoreError};
use tracing::{debug, warn};

use crate::plan::{Clock, whole_seconds};
use oka_cache::{Cache, Informers, ObjectKey};

pub use handlers::{Check, Outcome};

/// Where the last request to a sandbox is known (the gateway's registry in `oka serve`).
pub trait ActivitySource: Send + Sync {
    /// Unix seconds of the last request routed to `sandbox` on one of `ports` (any port when
    /// empty), if any was seen.
    fn last_activity(&self, sandbox: &Sandbox, ports: &[i32]) -> Option<i64>;
}

/// What a condition should become: status and reason decide a write, the message is detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// One of [`probe_reason`].
    pub reason: &'static str,
    /// Detail (`HTTP 503`, `connection refused`, ...).
    pub message: String,
}

impl Verdict {
    fn new(status: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self { status, reason, message: message.into() }
    }

    /// The condition of probe `name` with this verdict, transitioned at `at`.
    pub fn condition(&self, name: &str, at: Timestamp) -> Condition {
        Condition {
            type_: format!("{PROBE_CONDITION_PREFIX}{name}"),
            status: self.status.to_owned(),
            reason: self.reason.to_owned(),
            message: truncate_message(&self.message, DEFAULT_MAX_MESSAGE_LEN),
            last_transition_time: whole_seconds(at),
            observed_generation: None,
        }
    }
}

/// The message of an exec probe's condition when no command runner is configured.
pub const EXEC_NOT_RUN: &str =
    "exec probes need the agent runtime's process API, and this probe runner has no client for it";

/// Consecutive results of one probe since probing (re)started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Consecutive successes.
    pub successes: u32,
    /// Consecutive failures (timeouts included).
    pub failures: u32,
    /// Consecutive errors (the attempt could not be made).
    pub errors: u32,
}

fn threshold(n: i32) -> u32 {
    u32::try_from(n.max(1)).unwrap_or(1)
}

impl Counters {
    /// Counts `outcome` and returns the verdict once a threshold is reached (see the module
    /// rules), else `None` (the condition stays as it is).
    pub fn record(&mut self, probe: &SandboxProbe, outcome: &Outcome) -> Option<Verdict> {
        match outcome {
            Outcome::Success(message) => {
                self.successes = self.successes.saturating_add(1);
                (self.failures, self.errors) = (0, 0);
                (self.successes >= threshold(probe.success_threshold))
                    .then(|| Verdict::new(TRUE, probe_reason::SUCCEEDED, message.clone()))
            }
            Outcome::Failure(message) | Outcome::Timeout(message) => {
                self.failures = self.failures.saturating_add(1);
                (self.successes, self.errors) = (0, 0);
                let reason = if matches!(outcome, Outcome::Timeout(_)) {
                    probe_reason::TIMEOUT
                } else {
                    probe_reason::FAILED
                };
                (self.failures >= threshold(probe.failure_threshold))
                    .then(|| Verdict::new(FALSE, reason, message.clone()))
            }
            Outcome::Error(message) => {
                self.errors = self.errors.saturating_add(1);
                (self.errors >= threshold(probe.failure_threshold))
                    .then(|| Verdict::new(UNKNOWN, probe_reason::ERROR, message.clone()))
            }
        }
    }
}

/// Whether a condition must be written to become `verdict`: it is absent, or its status or
/// reason differs.
pub fn needs_write(current: Option<&Condition>, verdict: &Verdict) -> bool {
    current.is_none_or(|c| c.status != verdict.status || c.reason != verdict.reason)
}

/// What the runner does with a sandbox's probes (the table of the module rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Situation {
    /// No probes, or an unclaimed pool member: nothing, no condition.
    Ignore,
    /// Deleting or terminal: stop probing, leave the conditions.
    Stop,
    /// Probe: in-sandbox probes run when `in_sandbox`, external ones when `external`; the
    /// others are `Unknown/NotProbing`.
    Probe {
        /// In-sandbox probes run.
        in_sandbox: bool,
        /// External probes run.
        external: bool,
    },
}

/// The runner's [`Situation`] for `sandbox` (whose probes are `probes`).
pub fn situation(sandbox: &Sandbox, probes: &[SandboxProbe]) -> Situation {
    if probes.is_empty() || sandbox.is_controlled_by_sandbox_set() {
        return Situation::Ignore;
    }
    if sandbox.metadata.deletion_timestamp.is_some() {
        return Situation::Stop;
    }
    match sandbox.phase() {
        Some(SandboxPhase::Succeeded | SandboxPhase::Failed | SandboxPhase::Terminating) => {
            Situation::Stop
        }
        Some(SandboxPhase::Running) if sandbox.is_ready() && !sandbox.is_paused() => {
            Situation::Probe { in_sandbox: true, external: true }
        }
        Some(SandboxPhase::Recycling) => Situation::Probe { in_sandbox: false, external: false },
        _ => Situation::Probe { in_sandbox: false, external: true },
    }
}

/// The probes of `sandbox`: its own, else those of `template` (the SandboxTemplate its
/// `templateRef` names).
pub fn probes_of<'a>(
    sandbox: &'a Sandbox,
    template: Option<&'a SandboxTemplate>,
) -> &'a [SandboxProbe] {
    match &sandbox.spec.probes {
        Some(probes) => probes,
        None => template.and_then(|t| t.spec.probes.as_deref()).unwrap_or_default(),
    }
}

fn seconds(n: i32) -> SignedDuration {
    SignedDuration::from_secs(i64::from(n.max(0)))
}

/// When probing `probe` of `sandbox` starts: `max(Ready's transition, claim time) +
/// initialDelaySeconds + jitter`, not before `now`. `jitter_seed` spreads sandboxes over the
/// first 10 % of the period.
pub fn first_due(
    sandbox: &Sandbox,
    probe: &SandboxProbe,
    jitter_seed: u64,
    now: Timestamp,
) -> Timestamp {
    let ready =
        sandbox.condition(READY).filter(|c| c.status == TRUE).map(|c| c.last_transition_time.0);
    let claimed = annotation_time(sandbox, annotations::CLAIM_TIMESTAMP);
    let start = ready.into_iter().chain(claimed).max().unwrap_or(now);
    let period_ms = u64::try_from(probe.period_seconds.max(1)).unwrap_or(1) * 100;
    let jitter_ms = i64::try_from(jitter_seed % period_ms.max(1)).unwrap_or(0);
    let at = start.saturating_add(seconds(probe.initial_delay_seconds)).unwrap_or(Timestamp::MAX);
    at.max(now).saturating_add(SignedDuration::from_millis(jitter_ms)).unwrap_or(Timestamp::MAX)
}

/// The attempt after one that started at `started`.
pub fn next_due(started: Timestamp, probe: &SandboxProbe) -> Timestamp {
    started.saturating_add(seconds(probe.period_seconds.max(1))).unwrap_or(Timestamp::MAX)
}

/// An RFC 3339 annotation of `sandbox` as a time.
pub fn annotation_time(sandbox: &Sandbox, key: &str) -> Option<Timestamp> {
    sandbox.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// A changes to one sandbox's conditions.
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    /// Set the condition unless it already has this status and reason.
    Set(Condition),
    /// Remove the condition of this type.
    Remove(String),
}

/// Applies `edits` to `sandbox`'s conditions; reports whether anything changed.
pub fn apply_edits(sandbox: &mut Sandbox, edits: &[Edit]) -> bool {
    let status = sandbox.status.get_or_insert_with(Default::default);
    let list = status.conditions.get_or_insert_with(Vec::new);
    let mut changed = false;
    for edit in edits {
        match edit {
            Edit::Set(new) => {
                let current = list.iter().find(|c| c.type_ == new.type_);
                if current.is_none_or(|c| c.status != new.status || c.reason != new.reason) {
                    changed |= conditions::set(list, new.clone());
                }
            }
            Edit::Remove(type_) => changed |= conditions::remove(list, type_),
        }
    }
    changed
}

/// How the runner runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRunnerOptions {
    /// Attempts in flight at once; due attempts beyond it wait for a slot.
    pub max_in_flight: usize,
    /// How often the sandbox cache is looked at for changed specs and phases.
    pub resync: Duration,
    /// Where attempts are counted and timed (`sandbox_probe_*`).
    pub metrics: Option<crate::sandbox::Shared<crate::metrics::ControllerMetrics>>,
    /// The sandboxes probed: those of this node.
    pub selector: oka_store::Selector,
}

impl Default for ProbeRunnerOptions {
    /// 256 attempts in flight, a resync every second.
    fn default() -> Self {
        Self {
            max_in_flight: 256,
            resync: Duration::from_secs(1),
            metrics: None,
            selector: oka_store::Selector::everything(),
        }
    }
}

/// One probe of one sandbox, as the runner keeps it.
struct Entry {
    sandbox: ObjectKey,
    probe: SandboxProbe,
    check: Arc<Check>,
    counters: Counters,
    /// The status and reason last written (or found), to write only on change.
    reported: Option<(String, String)>,
    due: Timestamp,
    running: bool,
}

type Attempt = Pin<Box<dyn Future<Output = (u64, Timestamp, Outcome, Duration)> + Send>>;

/// The runner's state: entries by id, the heap of due times, and what it knows per sandbox.
struct Runner<S: Store> {
    store: S,
    runtime: Arc<dyn Runtime>,
    /// Runs exec probes' commands in the sandbox (through its agent runtime).
    hooks: Option<Arc<dyn crate::sandbox::HookRunner>>,
    activity: Option<Arc<dyn ActivitySource>>,
    clock: Clock,
    options: ProbeRunnerOptions,
    sandboxes: Cache<Sandbox>,
    templates: Cache<SandboxTemplate>,
    entries: HashMap<u64, Entry>,
    by_key: HashMap<(ObjectKey, String), u64>,
    heap: BinaryHeap<Reverse<(Timestamp, u64)>>,
    /// Resource version of each sandbox at the last sync.
    seen: HashMap<ObjectKey, String>,
    next_id: u64,
}

/// Runs the probe runner over the Sandboxes of `informers` (shared, or a store for its own) until
/// `shutdown` resolves; see the [module documentation](self). `activity` feeds `activity` probes
/// (without it they see only the annotation, the claim time and Ready's transition).
pub async fn run_probe_runner<S: Store>(
    informers: impl Into<Informers<S>>,
    runtime: Arc<dyn Runtime>,
    hooks: Option<Arc<dyn crate::sandbox::HookRunner>>,
    activity: Option<Arc<dyn ActivitySource>>,
    clock: Clock,
    options: ProbeRunnerOptions,
    shutdown: impl Future<Output = ()> + Send,
) {
    let watch = oka_cache::WatchConfig {
        selector: options.selector.clone(),
        ..oka_cache::WatchConfig::default()
    };
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let sandboxes = informers.informer::<Sandbox>(watch);
    let templates = informers.all::<SandboxTemplate>();
    // Shared with the process's other users; they run on after the runner stops.
    sandboxes.start();
    templates.start();
    let mut runner = Runner {
        store,
        runtime,
        hooks,
        activity,
        clock,
        options,
        sandboxes: sandboxes.cache(),
        templates: templates.cache(),
        entries: HashMap::new(),
        by_key: HashMap::new(),
        heap: BinaryHeap::new(),
        seen: HashMap::new(),
        next_id: 0,
    };
    runner.run(shutdown).await;
}

impl<S: Store> Runner<S> {
    async fn run(&mut self, shutdown: impl Future<Output = ()> + Send) {
        tokio::pin!(shutdown);
        let mut in_flight: FuturesUnordered<Attempt> = FuturesUnordered::new();
        let mut resync = tokio::time::interval(self.options.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wait = self.heap.peek().map(|Reverse((due, _))| {
                let left = due.duration_since(self.clock.now());
                Duration::try_from(left).unwrap_or(Duration::ZERO)
            });
            let room = in_flight.len() < self.options.max_in_flight;
            tokio::select! {
                () = &mut shutdown => return,
                Some((id, started, outcome, took)) = in_flight.next(), if !in_flight.is_empty() => {
                    self.finished(id, started, &outcome, took);
                }
                _ = resync.tick() => self.sync(),
                () = tokio::time::sleep(wait.unwrap_or(Duration::MAX)), if wait.is_some() && room => {
                    self.start_due(&mut in_flight);
                }
            }
        }
    }

    /// Starts every attempt due by now, as far as there is room.
    fn start_due(&mut self, in_flight: &mut FuturesUnordered<Attempt>) {
        let now = self.clock.now();
        while in_flight.len() < self.options.max_in_flight {
            let Some(Reverse((due, id))) = self.heap.peek().copied() else { return };
            if due > now {
                return;
            }
            self.heap.pop();
            let Some(entry) = self.entries.get_mut(&id) else { continue };
            if entry.due != due || entry.running {
                continue;
            }
            entry.running = true;
            let check = Arc::clone(&entry.check);
            let timeout =
                Duration::from_secs(u64::try_from(entry.probe.timeout_seconds.max(1)).unwrap_or(1));
            let runtime = Arc::clone(&self.runtime);
            let last_activity = match check.as_ref() {
                Check::Activity { ports, .. } => self
                    .sandboxes
                    .get(&entry.sandbox)
                    .and_then(|s| self.activity.as_ref().and_then(|a| a.last_activity(&s, ports))),
                _ => None,
            };
            let exec = match check.as_ref() {
                Check::Exec { .. } => self.hooks.clone().zip(self.sandboxes.get(&entry.sandbox)),
                _ => None,
            };
            in_flight.push(Box::pin(async move {
                let exec = exec.as_ref().map(|(hooks, sandbox)| (hooks.as_ref(), sandbox.as_ref()));
                let clock = std::time::Instant::now();
                let outcome =
                    handlers::attempt(runtime.as_ref(), &check, timeout, now, last_activity, exec)
                        .await;
                (id, now, outcome, clock.elapsed())
            }));
        }
    }

    /// Counts an attempt's outcome, writes a changed condition, schedules the next attempt.
    fn finished(&mut self, id: u64, started: Timestamp, outcome: &Outcome, took: Duration) {
        let Some(entry) = self.entries.get_mut(&id) else { return };
        entry.running = false;
        if let Some(metrics) = &self.options.metrics {
            let result = match outcome {
                Outcome::Success(_) => "success",
                Outcome::Failure(_) => "failure",
                Outcome::Timeout(_) => "timeout",
                Outcome::Error(_) => "error",
            };
            let kind = entry.check.kind();
            metrics.0.policy.probed(&entry.sandbox.namespace, kind, result, took);
        }
        let verdict = entry.counters.record(&entry.probe, outcome);
        if let Some(verdict) = verdict {
            let changed = entry
                .reported
                .as_ref()
                .is_none_or(|(s, r)| s != verdict.status || r != verdict.reason);
            if changed {
                debug!(sandbox = %entry.sandbox, probe = %entry.probe.name, status = verdict.status, reason = verdict.reason, "probe condition changes");
                entry.reported = Some((verdict.status.to_owned(), verdict.reason.to_owned()));
                let edit = Edit::Set(verdict.condition(&entry.probe.name, started));
                spawn_write(self.store.clone(), entry.sandbox.clone(), vec![edit]);
            }
        }
        entry.due = next_due(started, &entry.probe);
        self.heap.push(Reverse((entry.due, id)));
    }

    fn remove_entry(&mut self, key: &(ObjectKey, String)) {
        if let Some(id) = self.by_key.remove(key) {
            self.entries.remove(&id);
        }
    }

    /// Brings the entries in line with the cache: new, changed and removed probes, phases.
    fn sync(&mut self) {
        let now = self.clock.now();
        let listed = self.sandboxes.list();
        let mut present = HashSet::with_capacity(listed.len());
        for sandbox in &listed {
            let key = ObjectKey::of(sandbox.as_ref());
            present.insert(key.clone());
            let version = sandbox.metadata.resource_version.clone().unwrap_or_default();
            if self.seen.get(&key) == Some(&version) {
                continue;
            }
            self.seen.insert(key.clone(), version);
            self.sync_sandbox(&key, sandbox, now);
        }
        self.seen.retain(|key, _| present.contains(key));
        let gone: Vec<_> =
            self.by_key.keys().filter(|(key, _)| !present.contains(key)).cloned().collect();
        for key in gone {
            self.remove_entry(&key);
        }
    }

    fn sync_sandbox(&mut self, key: &ObjectKey, sandbox: &Sandbox, now: Timestamp) {
        let namespace = key.namespace.as_str();
        let template = match (&sandbox.spec.probes, &sandbox.spec.template_ref) {
            (None, Some(reference)) => self.templates.get_named(namespace, &reference.name),
            _ => None,
        };
        let probes = probes_of(sandbox, template.as_deref()).to_vec();
        let situation = situation(sandbox, &probes);
        let names: HashSet<&str> = probes.iter().map(|p| p.name.as_str()).collect();
        let mut edits = Vec::new();
        // Conditions of probes no longer in the spec go.
        for condition in
            sandbox.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten()
        {
            if let Some(name) = probe_name_of_condition(&condition.type_)
                && !names.contains(name)
                && situation != Situation::Stop
            {
                edits.push(Edit::Remove(condition.type_.clone()));
            }
        }
        let stale: Vec<_> = self
            .by_key
            .keys()
            .filter(|(k, name)| k == key && !names.contains(name.as_str()))
            .cloned()
            .collect();
        for entry in stale {
            self.remove_entry(&entry);
        }
        let (in_sandbox, external) = match situation {
            Situation::Ignore | Situation::Stop => {
                for probe in &probes {
                    self.remove_entry(&(key.clone(), probe.name.clone()));
                }
                if !edits.is_empty() {
                    spawn_write(self.store.clone(), key.clone(), edits);
                }
                return;
            }
            Situation::Probe { in_sandbox, external } => (in_sandbox, external),
        };
        for probe in &probes {
            let entry_key = (key.clone(), probe.name.clone());
            let current = sandbox.condition(&probe.condition_type());
            let runnable = if probe.is_external() { external } else { in_sandbox };
            if !runnable {
                self.remove_entry(&entry_key);
                let verdict = Verdict::new(
                    UNKNOWN,
                    probe_reason::NOT_PROBING,
                    format!(
                        "the sandbox is {}",
                        sandbox.phase().map_or("Pending", SandboxPhase::as_str)
                    ),
                );
                if needs_write(current, &verdict) {
                    edits.push(Edit::Set(verdict.condition(&probe.name, now)));
                }
                continue;
            }
            if probe.exec.is_some() && self.hooks.is_none() {
                self.remove_entry(&entry_key);
                let verdict = Verdict::new(UNKNOWN, probe_reason::ERROR, EXEC_NOT_RUN);
                if needs_write(current, &verdict) {
                    edits.push(Edit::Set(verdict.condition(&probe.name, now)));
                }
                continue;
            }
            let check = Arc::new(Check::of(sandbox, template.as_deref(), probe));
            if let Some(id) = self.by_key.get(&entry_key)
                && let Some(entry) = self.entries.get_mut(id)
                && entry.probe == *probe
            {
                // Same probe: keep its counters and schedule; the sandbox's details may change.
                entry.check = check;
                continue;
            }
            self.remove_entry(&entry_key);
            let starting = current.is_none_or(|c| c.reason == probe_reason::NOT_PROBING);
            let reported = if starting {
                let verdict = Verdict::new(UNKNOWN, probe_reason::INITIALIZING, "probing starts");
                edits.push(Edit::Set(verdict.condition(&probe.name, now)));
                Some((UNKNOWN.to_owned(), probe_reason::INITIALIZING.to_owned()))
            } else {
                current.map(|c| (c.status.clone(), c.reason.clone()))
            };
            let mut hasher = DefaultHasher::new();
            entry_key.hash(&mut hasher);
            let due = first_due(sandbox, probe, hasher.finish(), now);
            let id = self.next_id;
            self.next_id += 1;
            self.entries.insert(
                id,
                Entry {
                    sandbox: key.clone(),
                    probe: probe.clone(),
                    check,
                    counters: Counters::default(),
                    reported,
                    due,
                    running: false,
                },
            );
            self.by_key.insert(entry_key, id);
            self.heap.push(Reverse((due, id)));
        }
        if !edits.is_empty() {
            spawn_write(self.store.clone(), key.clone(), edits);
        }
    }
}

/// Writes `edits` to the sandbox's status in the background (re-read and retried on conflicts).
fn spawn_write<S: Store>(store: S, key: ObjectKey, edits: Vec<Edit>) {
    tokio::spawn(async move {
        if let Err(error) = write_conditions(&store, &key, &edits).await {
            warn!(sandbox = %key, %error, "writing probe conditions failed");
        }
    });
}

/// Applies `edits` to the stored sandbox's conditions, with its resourceVersion as
/// precondition; a conflict reads again (up to five times). Nothing is written when nothing
/// changes.
///
/// # Errors
///
/// The store's, other than a missing sandbox.
pub async fn write_conditions<S: Store>(
    store: &S,
    key: &ObjectKey,
    edits: &[Edit],
) -> Result<(), StoreError> {
    for _ in 0..5 {
        let mut sandbox = match store.get::<Sandbox>(&key.namespace, &key.name).await {
            Ok(sandbox) => sandbox,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        if sandbox.metadata.deletion_timestamp.is_some() || !apply_edits(&mut sandbox, edits) {
            return Ok(());
        }
        match store.update_status(&key.namespace, &sandbox).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(StoreError::Conflict { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
