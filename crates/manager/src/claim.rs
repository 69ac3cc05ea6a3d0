//! The claim engine: hand one available sandbox of a warm pool to one caller, with one
//! compare-and-swap write.
//!
//! # Expected flow
//!
//! [`ClaimEngine::claim`]`(pool, options)`:
//!
//! 1. **Plan.** Read a window of the pool's claim candidates from the [`Index`] (fed by the
//!    store's watch; it keeps per pool the unclaimed members that are Ready and unlocked):
//!    [`ClaimConfig::window`] of them plus as many as other claims are writing, starting at a
//!    per-call random position, so concurrent claims (and managers) spread over the pool
//!    instead of all racing for its first member, and planning costs the same for a pool of
//!    10 or 10,000.
//! 2. **Pick.** The pure [`choose_claim`] takes the first candidate of the window whose derived
//!    state is `available` now, that carries no `agents.kruise.io/lock`, that no other claim of
//!    this process is writing (the in-flight set) and that this call has not already lost;
//!    members of the pool's current revision (`template-hash` = SandboxSet
//!    `status.updateRevision`) first. It is marked in flight.
//! 3. **Write** one update of that sandbox with the resourceVersion it was read at as the
//!    precondition ([`claim_object`]): label `agents.kruise.io/sandbox-claimed=true`, label
//!    `agents.kruise.io/sandbox-id=<new short ID>`, annotations `lock` (a fresh UUID),
//!    `owner`, `claim-timestamp`, `init-runtime-request`, `runtime-access-token` and
//!    `updated-metadata-in-claim`, the caller's labels and annotations, the pod template's
//!    `owner` label, `spec.shutdownTime`/`spec.pauseTime` from the timeout, and the controller
//!    ownerReference to the SandboxSet removed, so the pool controller replaces the sandbox
//!    behind the claim.
//! 4. **Success**: the written version goes into the index at once (so the next claim and a
//!    following `GET` see it), the in-flight mark is dropped, the claimed sandbox is returned.
//!    **Conflict or NotFound** (someone else wrote it first: another manager, the pool's
//!    scale-down lock, a deletion): the candidate is excluded for this call and step 2 runs
//!    again on a fresh window, at most [`ClaimConfig::max_attempts`] writes in all.
//! 5. No candidate left ⇒ [`ClaimError::PoolExhausted`] at once; the caller answers with a
//!    retryable status. Nothing waits for a controller.
//!
//! # Guarantees
//!
//! - **Never two owners.** A sandbox is handed out only by a successful update whose
//!   precondition is the version in which it was unclaimed and unlocked; the store serialises
//!   updates of one object, so at most one claim of a given version succeeds, and the version
//!   it writes is claimed and locked, which no later plan accepts.
//! - Within one process, two concurrent claims never write the same candidate (the in-flight
//!   set), so a pool of N available sandboxes serves N concurrent claims without a conflict.
//! - A claim is bounded: at most `max_attempts` store writes, no sleeps.
//! - The in-flight mark is released on every path, including cancellation (a drop guard).
//!
//! # Caveats
//!
//! - The index lags the store: a sandbox claimed by another process may still look available
//!   and cost one conflicting write.
//! - The current-revision preference applies within the window, not across the whole pool.
//! - The reference also requires a pod IP; local sandboxes have none (their ports are reached
//!   through their network namespace), so readiness alone decides.
//! - Creating a sandbox when the pool is empty (`create-on-no-stock`) is
//!   [`ClaimEngine::create_new`] ([`crate::create`]); [`ClaimEngine::claim_or_create`]
//!   ([`crate::acquire`]) chooses between the two for the E2B create and SandboxClaims.
//!
//! # Cost
//!
//! A claim is one durable store write; choosing the candidate checks a window of 64 in a few
//! microseconds, where planning over the whole pool cost 0.3 ms per claim at 1,000 members.
//! Figures: `cargo bench -p oka-manager --bench claim`, reported in `docs/benchmarks.md`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::sandboxset::SANDBOX_SET_KIND;
use oka_api::{Sandbox, SandboxState, annotations, labels, sandbox_state};
use oka_store::{Store, StoreError};
use serde::Serialize;
use tracing::{debug, info};

use crate::id::IdGenerator;
use crate::index::{Index, ObjectKey, sandbox_id};
use crate::quota::{Quota, QuotaError, QuotaSpec};

/// A warm pool: the SandboxSet `name` in `namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolRef {
    /// The SandboxSet's namespace.
    pub namespace: String,
    /// The SandboxSet's name (the E2B `templateID`).
    pub name: String,
}

impl PoolRef {
    /// The pool `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for PoolRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a claim writes besides the claim metadata itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimOptions {
    /// `spec.shutdownTime`: when the sandbox is deleted (`None`: never).
    pub shutdown_time: Option<Timestamp>,
    /// `spec.pauseTime`: when the sandbox is paused (`None`: never).
    pub pause_time: Option<Timestamp>,
    /// Labels to add (user `label:` metadata).
    pub labels: BTreeMap<String, String>,
    /// Annotations to add (user metadata).
    pub annotations: BTreeMap<String, String>,
    /// Environment variables for the agent runtime's `/init`, recorded in
    /// `agents.kruise.io/init-runtime-request` so a re-init can replay them.
    pub env_vars: BTreeMap<String, String>,
    /// The agent runtime's access token (`None`: the runtime is not initialised).
    pub access_token: Option<String>,
    /// `spec.pauseStrategy` to write instead of the pool's (E2B's filesystem-only timeout
    /// pause); `None` keeps the pool's.
    pub pause_strategy: Option<oka_api::common::PauseStrategy>,
    /// The SandboxClaim this sandbox is claimed for (label `agents.kruise.io/claim-name`);
    /// `None` for the E2B API's claims.
    pub claim_name: Option<String>,
    /// Labels added to the sandbox's pod template too (a SandboxClaim's `labels`, as the
    /// reference propagates them); the E2B API adds none.
    pub pod_labels: BTreeMap<String, String>,
    /// An in-place update of the claimed sandbox (a SandboxClaim's `inplaceUpdate`, the E2B
    /// create's `image`, `cpu-request` and `cpu-limit` extensions), written in the same
    /// compare-and-swap write; `None`: the sandbox is taken as it is.
    pub inplace_update: Option<InplaceUpdate>,
    /// The caller's API-key quota: the claim is admitted by the engine's [`Quota`] between
    /// choosing the sandbox and writing it. `None`: unlimited (no quota call).
    pub quota: Option<QuotaSpec>,
}

/// An in-place update a claim makes of the sandbox it takes (reference: the claim's
/// `InplaceUpdateOptions`): the first container of the sandbox's pod template gets `image`,
/// and its CPU request and limit where the template sets them (a CPU value the template leaves
/// unset stays unset, as in the reference: adding one would change the sandbox's QoS class).
/// Memory cannot change in place (the reference refuses it; so do the callers). The sandbox
/// controller then makes the change (limits live; a new root by restarting the sandbox on it),
/// and the claim waits for it ([`ClaimEngine::await_inplace_update`]) before `/init`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InplaceUpdate {
    /// The first container's new image. oka's local runtime runs an image that is an absolute
    /// directory path as the sandbox's root and any other reference on its default root (it
    /// pulls no OCI images yet).
    pub image: Option<String>,
    /// The first container's new CPU request (written only where the template has one).
    pub cpu_request: Option<Quantity>,
    /// The first container's new CPU limit (written only where the template has one).
    pub cpu_limit: Option<Quantity>,
    /// How long the claim waits for the sandbox to run updated (`waitReadyTimeout`).
    pub ready_timeout: std::time::Duration,
}

impl InplaceUpdate {
    /// Writes the update into `template` (pure): the first container's image, and its CPU
    /// request and limit where they are set and not zero. Returns whether anything changed.
    pub fn apply(&self, template: &mut PodTemplateSpec) -> bool {
        let Some(container) = template.spec.as_mut().and_then(|p| p.containers.first_mut()) else {
            return false;
        };
        let mut changed = false;
        if let Some(image) = self.image.as_ref().filter(|i| !i.is_empty())
            && container.image.as_ref() != Some(image)
        {
            container.image = Some(image.clone());
            changed = true;
        }
        let resources = container.resources.get_or_insert_default();
        for (target, list) in
            [(&self.cpu_request, &mut resources.requests), (&self.cpu_limit, &mut resources.limits)]
        {
            let Some(target) = target else { continue };
            let Some(current) = list.as_mut().and_then(|l| l.get_mut("cpu")) else { continue };
            let set = oka_api::quantity::parse(&current.0).is_ok_and(|v| v.is_positive());
            if set && current != target {
                *current = target.clone();
                changed = true;
            }
        }
        changed
    }
}

/// Whether a claimed sandbox whose in-place update was written runs updated (pure): `None` while
/// the sandbox controller has not made it (its `observedGeneration` behind, `InplaceUpdate` still
/// `InplaceUpdating`, or not Running and Ready yet); `Some(Err(why))` when it cannot (the update
/// failed, the new instance cannot start, the sandbox ended or is being deleted); `Some(Ok(()))`
/// once it runs updated (the reference's wait: generation observed, no in-place update in
/// progress, running).
pub fn inplace_update_outcome(sandbox: &Sandbox) -> Option<Result<(), String>> {
    use oka_api::conditions::sandbox::{
        INPLACE_UPDATE, READY, inplace_update_reason, ready_reason,
    };
    if let Some(why) = crate::create::failed(sandbox) {
        return Some(Err(why));
    }
    let status = sandbox.status.as_ref()?;
    if status.observed_generation != sandbox.metadata.generation {
        return None;
    }
    if let Some(update) = status.condition(INPLACE_UPDATE) {
        match update.reason.as_str() {
            inplace_update_reason::INPLACE_UPDATING => return None,
            inplace_update_reason::FAILED => {
                return Some(Err(format!("the in-place update failed: {}", update.message)));
            }
            _ => {}
        }
    }
    if let Some(ready) = status.condition(READY)
        && ready.status != oka_api::conditions::TRUE
        && matches!(
            ready.reason.as_str(),
            ready_reason::START_CONTAINER_FAILED | ready_reason::POD_CREATE_FAILED
        )
    {
        return Some(Err(format!("it cannot start: {}", ready.message)));
    }
    (sandbox.phase() == Some(&oka_api::SandboxPhase::Running) && sandbox.is_ready())
        .then_some(Ok(()))
}

/// A sandbox handed to one caller.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedSandbox {
    /// The sandbox as the claim wrote it.
    pub sandbox: Arc<Sandbox>,
    /// Its public ID.
    pub sandbox_id: String,
    /// The lock UUID written in `agents.kruise.io/lock`.
    pub lock: String,
    /// How many writes the claim took (1 without contention).
    pub attempts: u32,
}

/// Why a claim failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClaimError {
    /// No available, unlocked sandbox in the pool right now. Retryable: the pool refills.
    #[error("no available sandbox in pool {pool}; retry later")]
    PoolExhausted {
        /// The pool.
        pool: PoolRef,
    },
    /// Every write lost a race; retryable.
    #[error("claim from pool {pool} lost {attempts} races; retry later")]
    TooManyConflicts {
        /// The pool.
        pool: PoolRef,
        /// The writes tried.
        attempts: u32,
    },
    /// The pool is empty and creating a new sandbox is rate limited; retryable.
    #[error("no available sandbox in pool {pool} and new sandboxes are rate limited; retry later")]
    RateLimited {
        /// The pool.
        pool: PoolRef,
    },
    /// A new sandbox (create-on-no-stock) failed or did not run in time; it was deleted.
    #[error("cannot create a new sandbox in pool {pool}: {reason}")]
    CreateFailed {
        /// The pool.
        pool: PoolRef,
        /// What happened.
        reason: String,
    },
    /// The claimed sandbox did not run its in-place update within the claim's wait; it was
    /// deleted (or kept, when the caller reserves failed sandboxes).
    #[error("sandbox {sandbox} of pool {pool} is not ready after its in-place update: {reason}")]
    NotReady {
        /// The pool.
        pool: PoolRef,
        /// The sandbox's name.
        sandbox: String,
        /// What happened.
        reason: String,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The caller's quota refuses the sandbox (nothing was written), or its admission failed.
    #[error(transparent)]
    Quota(#[from] QuotaError),
}

impl ClaimError {
    /// Whether the same claim may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClaimError::PoolExhausted { .. }
            | ClaimError::TooManyConflicts { .. }
            | ClaimError::RateLimited { .. }
            | ClaimError::CreateFailed { .. }
            | ClaimError::NotReady { .. } => true,
            ClaimError::Store(error) => error.is_retryable(),
            ClaimError::Quota(_) => false,
        }
    }
}

/// Settings of a [`ClaimEngine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimConfig {
    /// The most store writes one claim makes before giving up with
    /// [`ClaimError::TooManyConflicts`]. Default 8.
    pub max_attempts: u32,
    /// How many candidates one claim plans over, beyond those other claims of this process
    /// are writing (the reference collects up to 100). Default 64.
    pub window: usize,
    /// New sandboxes per second when a pool is empty (create-on-no-stock; the reference's
    /// `--max-create-qps`); the burst is the same. Default 49.
    pub max_create_qps: u32,
}

impl Default for ClaimConfig {
    fn default() -> Self {
        Self { max_attempts: 8, window: 64, max_create_qps: 49 }
    }
}

/// Whether `sandbox` may be claimed at `now`: derived state `available` (a Ready pool member,
/// not deleting, not past its shutdown time) and no `agents.kruise.io/lock`.
pub fn is_claimable(sandbox: &Sandbox, now: Timestamp) -> bool {
    let locked = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::LOCK))
        .is_some_and(|lock| !lock.is_empty());
    !locked && sandbox_state(sandbox, now).state == SandboxState::Available
}

fn template_hash(sandbox: &Sandbox) -> Option<&str> {
    sandbox.metadata.labels.as_ref()?.get(labels::TEMPLATE_HASH).map(String::as_str)
}

/// The candidate a claim writes (pure): the first member, in window order, that `busy` does not
/// reject and that is claimable at `now`, members of the pool's current revision
/// (`template-hash == update_revision`) before the others. Lazy: a claim checks members only
/// until it finds one (usually the first or second), not the whole window.
pub fn choose_claim<'a>(
    members: &'a [Arc<Sandbox>],
    update_revision: Option<&str>,
    now: Timestamp,
    mut busy: impl FnMut(&Sandbox) -> bool,
) -> Option<&'a Arc<Sandbox>> {
    let current = |s: &Sandbox| update_revision.is_some() && template_hash(s) == update_revision;
    let mut first = |of_current: bool| {
        members.iter().find(|s| current(s) == of_current && !busy(s) && is_claimable(s, now))
    };
    first(true).or_else(|| first(false))
}

/// The JSON of `agents.kruise.io/init-runtime-request`.
#[derive(Serialize)]
struct InitRuntimeRequest<'a> {
    #[serde(rename = "envVars")]
    env_vars: &'a BTreeMap<String, String>,
    #[serde(rename = "accessToken")]
    access_token: &'a str,
}

/// The JSON of `agents.kruise.io/updated-metadata-in-claim`: the user keys a claim added,
/// removed again when the sandbox returns to its pool.
#[derive(Serialize)]
struct UpdatedMetadata<'a> {
    labels: Vec<&'a str>,
    annotations: Vec<&'a str>,
}

/// Timestamps are written in whole seconds, as a Kubernetes `Time` keeps them.
pub fn truncate_to_second(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

/// The claimed version of `sandbox` (pure): what step 3 of the [module flow](self) writes.
/// The resourceVersion is kept, so the update fails if the sandbox changed since it was read.
pub fn claim_object(
    sandbox: &Sandbox,
    owner: &str,
    options: &ClaimOptions,
    id: &str,
    lock: &str,
    now: Timestamp,
) -> Sandbox {
    let mut claimed = sandbox.clone();
    let meta = &mut claimed.metadata;
    if let Some(owners) = meta.owner_references.as_mut() {
        owners.retain(|o| !(o.controller == Some(true) && o.kind == SANDBOX_SET_KIND));
        if owners.is_empty() {
            meta.owner_references = None;
        }
    }
    let user_labels: Vec<&str> = options.labels.keys().map(String::as_str).collect();
    let user_annotations: Vec<&str> = options.annotations.keys().map(String::as_str).collect();
    let label_map = meta.labels.get_or_insert_with(BTreeMap::new);
    label_map.extend(options.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    label_map.insert(labels::SANDBOX_CLAIMED.into(), labels::TRUE.into());
    label_map.insert(labels::SANDBOX_ID.into(), id.into());
    if let Some(claim) = &options.claim_name {
        label_map.insert(labels::CLAIM_NAME.into(), claim.clone());
    }
    let notes = meta.annotations.get_or_insert_with(BTreeMap::new);
    notes.extend(options.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    notes.insert(annotations::LOCK.into(), lock.into());
    notes.insert(annotations::OWNER.into(), owner.into());
    notes.insert(annotations::CLAIM_TIMESTAMP.into(), claim_timestamp(now));
    if let Some(token) = &options.access_token {
        let request = InitRuntimeRequest { env_vars: &options.env_vars, access_token: token };
        if let Ok(json) = serde_json::to_string(&request) {
            notes.insert(annotations::INIT_RUNTIME_REQUEST.into(), json);
        }
        notes.insert(annotations::RUNTIME_ACCESS_TOKEN.into(), token.clone());
    }
    let updated = UpdatedMetadata { labels: user_labels, annotations: user_annotations };
    if let Ok(json) = serde_json::to_string(&updated) {
        notes.insert(annotations::UPDATED_METADATA_IN_CLAIM.into(), json);
    }
    if let (Some(update), Some(template)) =
        (&options.inplace_update, claimed.spec.template.as_mut())
    {
        update.apply(template);
    }
    if let Some(template) = claimed.spec.template.as_mut() {
        let pod_labels =
            template.metadata.get_or_insert_with(Default::default).labels.get_or_insert_default();
        pod_labels.extend(options.pod_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        pod_labels.insert(labels::OWNER.into(), owner.into());
    }
    claimed.spec.shutdown_time = options.shutdown_time.map(|t| Time(truncate_to_second(t)));
    claimed.spec.pause_time = options.pause_time.map(|t| Time(truncate_to_second(t)));
    if let Some(strategy) = &options.pause_strategy {
        claimed.spec.pause_strategy = Some(strategy.clone());
    }
    claimed
}

/// `agents.kruise.io/claim-timestamp`: RFC 3339 in microseconds, so that sandboxes claimed
/// within one second still list newest first (the reference writes whole seconds; both
/// parse as RFC 3339).
pub fn claim_timestamp(now: Timestamp) -> String {
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now).to_string()
}

/// Removes its key from the in-flight set when dropped.
struct InFlight<'a> {
    set: &'a Mutex<HashSet<ObjectKey>>,
    key: ObjectKey,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.key);
    }
}

/// Claims sandboxes from warm pools; see the [module documentation](self).
pub struct ClaimEngine<S> {
    pub(crate) store: S,
    index: Arc<Index>,
    in_flight: Mutex<HashSet<ObjectKey>>,
    pub(crate) ids: IdGenerator,
    pub(crate) create_limiter: crate::create::TokenBucket,
    config: ClaimConfig,
    /// The API-key quota admitting claims and creates; unset: quotas are not enforced.
    quota: std::sync::OnceLock<Arc<Quota>>,
}

impl<S> std::fmt::Debug for ClaimEngine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimEngine").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<S: Store> ClaimEngine<S> {
    /// An engine that claims through `store`, choosing from `index`.
    pub fn new(store: S, index: Arc<Index>, config: ClaimConfig) -> Self {
        Self {
            store,
            index,
            in_flight: Mutex::new(HashSet::new()),
            ids: IdGenerator::default(),
            create_limiter: crate::create::TokenBucket::new(f64::from(config.max_create_qps)),
            config,
            quota: std::sync::OnceLock::new(),
        }
    }

    /// Enforces API-key quotas through `quota` from now on (once; later calls are ignored).
    pub fn set_quota(&self, quota: Arc<Quota>) {
        let _ = self.quota.set(quota);
    }

    /// The quota, if set.
    pub fn quota(&self) -> Option<&Arc<Quota>> {
        self.quota.get()
    }

    /// Admits `sandbox` (about to be written with `lock` for `owner`) under `options.quota`;
    /// `Ok(true)` when a charge was taken (to be released if the write provably fails).
    ///
    /// # Errors
    ///
    /// [`ClaimError::Quota`] when the quota refuses it: nothing may be written.
    pub(crate) async fn admit(
        &self,
        owner: &str,
        lock: &str,
        sandbox: &Sandbox,
        options: &ClaimOptions,
    ) -> Result<bool, ClaimError> {
        let (Some(quota), Some(spec)) = (self.quota.get(), options.quota.as_ref()) else {
            return Ok(false);
        };
        let entry = crate::quota::AntiDrift::entry_for(&self.index, sandbox);
        quota.acquire(owner, Some(spec), lock, entry).await?;
        Ok(true)
    }

    /// Gives back the charge `admit` took for `lock` when its write provably did not happen.
    pub(crate) async fn unadmit(&self, owner: &str, lock: &str, charged: bool) {
        if charged && let Some(quota) = self.quota.get() {
            quota.release_detached(owner, lock, crate::quota::RELEASE_BOUND).await;
        }
    }

    /// The index the engine chooses from.
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// Claims one available sandbox of `pool` for `owner`; see the
    /// [module documentation](self).
    ///
    /// # Errors
    ///
    /// [`ClaimError::PoolExhausted`] when no candidate is left,
    /// [`ClaimError::TooManyConflicts`] after `max_attempts` lost races, [`ClaimError::Store`]
    /// when the store fails otherwise.
    pub async fn claim(
        &self,
        pool: &PoolRef,
        owner: &str,
        options: &ClaimOptions,
    ) -> Result<ClaimedSandbox, ClaimError> {
        let update_revision = self
            .index
            .sandbox_set(Some(&pool.namespace), &pool.name)
            .and_then(|set| set.status.as_ref().and_then(|s| s.update_revision.clone()));
        let seed = uuid::Uuid::new_v4().as_u128() as u64;
        let mut lost: HashSet<String> = HashSet::new();
        let mut attempts = 0u32;
        while attempts < self.config.max_attempts {
            let now = Timestamp::now();
            let busy = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner).len();
            let window = self.config.window + busy + lost.len();
            let members = self.index.pool_window(&pool.namespace, &pool.name, seed, window);
            let (candidate, _guard) = {
                let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(candidate) =
                    choose_claim(&members, update_revision.as_deref(), now, |s| {
                        let name = s.metadata.name.as_deref().unwrap_or_default();
                        lost.contains(name)
                            || in_flight.contains(&ObjectKey::new(pool.namespace.as_str(), name))
                    })
                else {
                    debug!(%pool, attempts, "pool exhausted");
                    return Err(ClaimError::PoolExhausted { pool: pool.clone() });
                };
                let key = ObjectKey::new(
                    pool.namespace.as_str(),
                    candidate.metadata.name.as_deref().unwrap_or_default(),
                );
                in_flight.insert(key.clone());
                (Arc::clone(candidate), InFlight { set: &self.in_flight, key })
            };
            attempts += 1;
            let id = self.ids.next_id();
            let lock = uuid::Uuid::new_v4().to_string();
            let candidate = self.inline_template(candidate, options);
            let mut claimed = claim_object(&candidate, owner, options, &id, &lock, now);
            oka_telemetry::context::inject(&mut claimed.metadata);
            // Quota admission: a refusal returns before anything is written (the candidate
            // stays unlocked in its pool).
            let charged = self.admit(owner, &lock, &claimed, options).await?;
            match self.store.update(&pool.namespace, &claimed).await {
                Ok(written) => {
                    let written = Arc::new(written);
                    self.index.apply_sandbox(Arc::clone(&written));
                    let sandbox_id = sandbox_id(&written).unwrap_or(id);
                    info!(%pool, sandbox = %sandbox_id, owner, attempts, "sandbox claimed");
                    return Ok(ClaimedSandbox { sandbox: written, sandbox_id, lock, attempts });
                }
                Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
                    debug!(%pool, candidate = ?candidate.metadata.name, "claim lost a race");
                    self.unadmit(owner, &lock, charged).await;
                    lost.insert(candidate.metadata.name.clone().unwrap_or_default());
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(ClaimError::TooManyConflicts { pool: pool.clone(), attempts })
    }
}

impl<S> ClaimEngine<S> {
    /// `candidate` with the referenced SandboxTemplate's pod template copied into its own
    /// `spec.template` when the claim updates it in place and it has none of its own (a pool
    /// whose members reference their template): the update is written on the sandbox, so it
    /// needs a template of its own (the reference writes only an inline template, so its
    /// in-place update does nothing to such a member). As it is when the template is not known.
    fn inline_template(&self, candidate: Arc<Sandbox>, options: &ClaimOptions) -> Arc<Sandbox> {
        if options.inplace_update.is_none() || candidate.spec.template.is_some() {
            return candidate;
        }
        let template = self.index.with_pod_template(
            candidate.metadata.namespace.as_deref(),
            None,
            candidate.spec.template_ref.as_ref(),
            |t| t.cloned(),
        );
        match template {
            Some(template) => {
                let mut inlined = (*candidate).clone();
                inlined.spec.template = Some(template);
                Arc::new(inlined)
            }
            None => candidate,
        }
    }

    /// Waits, driven by the index's watch, until the claimed sandbox `claimed` runs its in-place
    /// update ([`inplace_update_outcome`]), at most `timeout`. The caller discards the sandbox
    /// on an error.
    ///
    /// # Errors
    ///
    /// [`ClaimError::NotReady`] when it failed or the time ran out.
    pub async fn await_inplace_update(
        &self,
        pool: &PoolRef,
        claimed: ClaimedSandbox,
        timeout: std::time::Duration,
    ) -> Result<ClaimedSandbox, ClaimError> {
        let id = claimed.sandbox_id.clone();
        let outcome = self
            .index
            .wait_for(timeout, |index| {
                let current = index.by_id(&id)?;
                inplace_update_outcome(&current).map(|outcome| outcome.map(|()| current))
            })
            .await
            .unwrap_or_else(|| {
                Err(format!("it did not run updated within {}s", timeout.as_secs()))
            });
        match outcome {
            Ok(updated) => {
                info!(%pool, sandbox = %id, "in-place update done");
                Ok(ClaimedSandbox { sandbox: updated, ..claimed })
            }
            Err(reason) => Err(ClaimError::NotReady {
                pool: pool.clone(),
                sandbox: claimed.sandbox.metadata.name.clone().unwrap_or_default(),
                reason,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;
    use oka_api::SandboxPhase;
    use proptest::prelude::*;

    use super::*;

    const NOW: i64 = 1_767_225_600;

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn member(name: &str) -> oka_api::testing::SandboxBuilder {
        Sandbox::test().name(name).pooled("pool").phase(SandboxPhase::Running).ready()
    }

    /// The order in which successive claims would take `members`: each [`choose_claim`] with the
    /// ones taken before it busy.
    fn order(members: &[Arc<Sandbox>], revision: Option<&str>) -> Vec<String> {
        let mut taken: Vec<String> = Vec::new();
        while let Some(next) = choose_claim(members, revision, now(), |s| {
            taken.iter().any(|t| Some(t.as_str()) == s.metadata.name.as_deref())
        }) {
            taken.push(next.metadata.name.clone().unwrap());
        }
        taken
    }

    #[track_caller]
    fn check(
        members: Vec<oka_api::testing::SandboxBuilder>,
        revision: Option<&str>,
        expected: &[&str],
    ) {
        let members: Vec<_> = members.into_iter().map(|b| Arc::new(b.build())).collect();
        assert_eq!(order(&members, revision), expected);
    }

    #[test]
    fn only_claimable_members_are_chosen() {
        let past = now() - SignedDuration::from_secs(1);
        check(vec![member("a")], None, &["a"]);
        check(vec![member("a").not_ready()], None, &[]);
        check(vec![member("a").phase(SandboxPhase::Pending)], None, &[]);
        check(vec![member("a").deleting()], None, &[]);
        check(vec![member("a").shutdown_at(past)], None, &[]);
        check(vec![member("a").annotation(annotations::LOCK, "x")], None, &[]);
        check(vec![member("a").annotation(annotations::LOCK, "")], None, &["a"]);
        check(vec![member("a").claimed()], None, &[]);
        check(vec![member("a").phase(SandboxPhase::Failed)], None, &[]);
        check(vec![member("a"), member("b").not_ready(), member("c")], None, &["a", "c"]);
    }

    #[test]
    fn the_current_revision_is_chosen_first() {
        let old = |n| member(n).label(labels::TEMPLATE_HASH, "r1");
        let new = |n| member(n).label(labels::TEMPLATE_HASH, "r2");
        check(vec![old("a"), new("b"), old("c"), new("d")], Some("r2"), &["b", "d", "a", "c"]);
        check(vec![old("a"), new("b")], None, &["a", "b"]);
        check(vec![old("a"), old("b")], Some("r2"), &["a", "b"]);
    }

    #[test]
    fn busy_candidates_are_skipped() {
        let members: Vec<_> = ["a", "b"].iter().map(|n| Arc::new(member(n).build())).collect();
        let pick = |busy: &[&str]| {
            choose_claim(&members, None, now(), |s| {
                busy.contains(&s.metadata.name.as_deref().unwrap())
            })
            .map(|s| s.metadata.name.clone().unwrap())
        };
        assert_eq!(pick(&[]).as_deref(), Some("a"));
        assert_eq!(pick(&["a"]).as_deref(), Some("b"));
        assert_eq!(pick(&["a", "b"]), None);
    }

    #[test]
    fn a_choice_checks_members_only_until_it_finds_one() {
        let members: Vec<_> =
            (0..64).map(|i| Arc::new(member(&format!("m{i:02}")).build())).collect();
        let mut asked = 0;
        let chosen = choose_claim(&members, None, now(), |_| {
            asked += 1;
            false
        });
        assert_eq!(chosen.and_then(|s| s.metadata.name.as_deref()), Some("m00"));
        assert_eq!(asked, 1);
    }

    #[test]
    fn claim_object_writes_the_claim_metadata_and_detaches_from_the_pool() {
        let sandbox = member("a").annotation("keep", "me").build();
        let options = ClaimOptions {
            shutdown_time: Some(now() + SignedDuration::from_millis(300_500)),
            labels: BTreeMap::from([("app".into(), "demo".into())]),
            annotations: BTreeMap::from([("userId".into(), "7".into())]),
            env_vars: BTreeMap::from([("FOO".into(), "bar".into())]),
            access_token: Some("tok".into()),
            ..ClaimOptions::default()
        };
        let claimed = claim_object(&sandbox, "user-1", &options, "abc", "lock-1", now());
        assert!(claimed.metadata.owner_references.is_none());
        assert!(!claimed.metadata.labels.as_ref().unwrap().contains_key(labels::CLAIM_NAME));
        let l = claimed.metadata.labels.as_ref().unwrap();
        assert_eq!(l[labels::SANDBOX_CLAIMED], "true");
        assert_eq!(l[labels::SANDBOX_ID], "abc");
        assert_eq!(l[labels::SANDBOX_POOL], "pool");
        assert_eq!(l["app"], "demo");
        let a = claimed.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[annotations::LOCK], "lock-1");
        assert_eq!(a[annotations::OWNER], "user-1");
        assert_eq!(a[annotations::CLAIM_TIMESTAMP], "2026-01-01T00:00:00Z");
        assert_eq!(a[annotations::RUNTIME_ACCESS_TOKEN], "tok");
        assert_eq!(
            a[annotations::INIT_RUNTIME_REQUEST],
            r#"{"envVars":{"FOO":"bar"},"accessToken":"tok"}"#
        );
        assert_eq!(
            a[annotations::UPDATED_METADATA_IN_CLAIM],
            r#"{"labels":["app"],"annotations":["userId"]}"#
        );
        assert_eq!(a["keep"], "me");
        assert_eq!(a["userId"], "7");
        assert_eq!(
            claimed.spec.shutdown_time.clone().unwrap().0.to_string(),
            "2026-01-01T00:05:00Z"
        );
        assert_eq!(claimed.spec.pause_time, None);
        assert!(!is_claimable(&claimed, now()));
        assert_eq!(sandbox_state(&claimed, now()).state, SandboxState::Running);
    }

    #[test]
    fn a_sandbox_claims_claim_writes_its_name_and_pod_labels() {
        let mut sandbox = member("a").build();
        sandbox.spec.template = Some(Default::default());
        let options = ClaimOptions {
            claim_name: Some("team-a".into()),
            labels: BTreeMap::from([("team".into(), "a".into())]),
            pod_labels: BTreeMap::from([("team".into(), "a".into())]),
            ..ClaimOptions::default()
        };
        let claimed = claim_object(&sandbox, "uid-1", &options, "abc", "lock-1", now());
        assert_eq!(claimed.metadata.labels.as_ref().unwrap()[labels::CLAIM_NAME], "team-a");
        let template = claimed.spec.template.unwrap().metadata.unwrap().labels.unwrap();
        assert_eq!(template["team"], "a");
        assert_eq!(template[labels::OWNER], "uid-1");
        // The claim name is the claim's own, not user metadata removed on recycle by key.
        let notes = claimed.metadata.annotations.unwrap();
        assert_eq!(
            notes[annotations::UPDATED_METADATA_IN_CLAIM],
            r#"{"labels":["team"],"annotations":[]}"#
        );
    }

    fn template(
        image: &str,
        requests: &[(&str, &str)],
        limits: &[(&str, &str)],
    ) -> PodTemplateSpec {
        use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
        let list = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect()
            })
        };
        PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "main".into(),
                        image: Some(image.into()),
                        resources: Some(ResourceRequirements {
                            requests: list(requests),
                            limits: list(limits),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    Container {
                        name: "sidecar".into(),
                        image: Some("side".into()),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn an_in_place_update_writes_the_first_containers_image_and_the_cpu_it_sets() {
        let update = InplaceUpdate {
            image: Some("/srv/roots/python".into()),
            cpu_request: Some(Quantity("2".into())),
            cpu_limit: Some(Quantity("4".into())),
            ..InplaceUpdate::default()
        };
        let mut both = template("base", &[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "1")]);
        assert!(update.apply(&mut both));
        let spec = both.spec.as_ref().unwrap();
        let main = &spec.containers[0];
        assert_eq!(main.image.as_deref(), Some("/srv/roots/python"));
        let resources = main.resources.as_ref().unwrap();
        assert_eq!(resources.requests.as_ref().unwrap()["cpu"].0, "2");
        assert_eq!(resources.requests.as_ref().unwrap()["memory"].0, "1Gi", "memory untouched");
        assert_eq!(resources.limits.as_ref().unwrap()["cpu"].0, "4");
        assert_eq!(spec.containers[1].image.as_deref(), Some("side"), "only the first container");
        assert!(!update.apply(&mut both), "applied twice changes nothing");
        // CPU the template leaves unset (or zero) stays so: setting it would change the QoS.
        let mut unset = template("base", &[("cpu", "0")], &[]);
        let cpu_only = InplaceUpdate { image: None, ..update.clone() };
        assert!(!cpu_only.apply(&mut unset));
        let resources = unset.spec.unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(resources.requests.unwrap()["cpu"].0, "0");
        assert_eq!(resources.limits, None);
        assert!(!update.apply(&mut PodTemplateSpec::default()), "no container, nothing to do");
    }

    #[test]
    fn a_claim_writes_its_in_place_update_in_the_same_write() {
        let mut sandbox = member("a").build();
        sandbox.spec.template = Some(template("base", &[], &[("cpu", "1")]));
        let update = InplaceUpdate { image: Some("/srv/r".into()), ..InplaceUpdate::default() };
        let options = ClaimOptions { inplace_update: Some(update), ..ClaimOptions::default() };
        let claimed = claim_object(&sandbox, "me", &options, "abc", "l", now());
        let main = &claimed.spec.template.unwrap().spec.unwrap().containers[0];
        assert_eq!(main.image.as_deref(), Some("/srv/r"));
    }

    #[test]
    fn the_claim_waits_for_the_generation_the_update_and_readiness() {
        use oka_api::conditions::sandbox::{INPLACE_UPDATE, READY};
        let running = || {
            let mut s = member("a").claimed().build();
            s.metadata.generation = Some(2);
            s.status.as_mut().unwrap().observed_generation = Some(2);
            s
        };
        let with = |type_: &str, status: &str, reason: &str| {
            let mut s = running();
            let conditions = s.status.as_mut().unwrap().conditions.get_or_insert_default();
            conditions.retain(|c| c.type_ != type_);
            conditions.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: "why".into(),
                last_transition_time: Time(now()),
                observed_generation: None,
            });
            s
        };
        assert_eq!(inplace_update_outcome(&running()), Some(Ok(())));
        let mut behind = running();
        behind.status.as_mut().unwrap().observed_generation = Some(1);
        assert_eq!(inplace_update_outcome(&behind), None, "not observed yet");
        assert_eq!(inplace_update_outcome(&with(INPLACE_UPDATE, "False", "InplaceUpdating")), None);
        assert_eq!(
            inplace_update_outcome(&with(INPLACE_UPDATE, "True", "Succeeded")),
            Some(Ok(()))
        );
        assert_eq!(
            inplace_update_outcome(&with(INPLACE_UPDATE, "False", "Failed")),
            Some(Err("the in-place update failed: why".into()))
        );
        assert_eq!(inplace_update_outcome(&with(READY, "False", "InplaceUpdating")), None);
        assert_eq!(
            inplace_update_outcome(&with(READY, "False", "PodCreateFailed")),
            Some(Err("it cannot start: why".into()))
        );
        let mut ended = running();
        ended.status.as_mut().unwrap().phase = Some(SandboxPhase::Failed);
        assert!(matches!(inplace_update_outcome(&ended), Some(Err(_))));
    }

    /// A member described by its flags: (ready, locked, current revision, deleting).
    fn arb_member() -> impl Strategy<Value = (bool, bool, bool, bool)> {
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>())
    }

    proptest! {
        #[test]
        fn claims_take_exactly_the_claimable_members_current_revision_first(
            flags in proptest::collection::vec(arb_member(), 0..24),
            busy in proptest::collection::vec(any::<bool>(), 24),
        ) {
            let members: Vec<Arc<Sandbox>> = flags.iter().enumerate().map(|(i, &(ready, locked, current, deleting))| {
                let mut b = member(&format!("m{i:02}"))
                    .label(labels::TEMPLATE_HASH, if current { "new" } else { "old" });
                if !ready { b = b.not_ready(); }
                if locked { b = b.annotation(annotations::LOCK, "l"); }
                if deleting { b = b.deleting(); }
                Arc::new(b.build())
            }).collect();
            let claimable = |i: usize| {
                let (ready, locked, _, deleting) = flags[i];
                ready && !locked && !deleting
            };
            // Successive claims take exactly the claimable members, each once, the current
            // revision first, each group in window order.
            let (mut current, mut old): (Vec<usize>, Vec<usize>) =
                (0..flags.len()).filter(|&i| claimable(i)).partition(|&i| flags[i].2);
            current.append(&mut old);
            let want: Vec<String> = current.iter().map(|i| format!("m{i:02}")).collect();
            prop_assert_eq!(order(&members, Some("new")), want);
            // One choice with some members busy: the first of that order that is not busy.
            let is_busy = |s: &Sandbox| {
                let name = s.metadata.name.as_deref().unwrap();
                busy[name[1..].parse::<usize>().unwrap()]
            };
            let want = current.iter().find(|&&i| !busy[i]).map(|i| format!("m{i:02}"));
            let got = choose_claim(&members, Some("new"), now(), is_busy)
                .map(|s| s.metadata.name.clone().unwrap());
            prop_assert_eq!(got, want);
        }
    }
}
