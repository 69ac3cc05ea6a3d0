//! The SandboxSet controller (reference: `pkg/controller/sandboxset`): a warm pool that keeps
//! `spec.replicas` unclaimed sandboxes and rolls them to a changed template.
//!
//! # Expected flow
//!
//! [`reconcile_sandbox_set`] lists the pool's sandboxes from the store (label
//! `agents.kruise.io/sandbox-pool=<name>`), looks up the SandboxTemplate `spec.templateRef`
//! names, and calls the pure [`plan_sandbox_set`]:
//!
//! 1. **Members** are the sandboxes whose controller ownerReference is this SandboxSet (by uid)
//!    and whose `agents.kruise.io/sandbox-claimed` label is not `true`. Nothing else is ever
//!    touched: a claimed sandbox (label flipped, ownerReference removed) is no longer the
//!    pool's, and the pool replaces it.
//! 2. Members are grouped by [`oka_api::sandbox_state`]: creating, available, dead. Members
//!    already being deleted count for nothing.
//! 3. **Scale up** when creating + available < `spec.replicas`: create the difference, capped
//!    by `scaleStrategy.maxUnavailable` (a count, or a percentage of `replicas` rounded up)
//!    minus the members still creating. Each new sandbox is [`new_pool_sandbox`].
//! 4. **Scale down** when creating + available > `spec.replicas`, in this order (first
//!    deleted first): members of an older revision (`template-hash` not up to date, see
//!    [`Revisions`]) before
//!    current ones; within each, (1) creating (phase Pending or empty), newest first; (2)
//!    reused (`reuseCount`/`recycledCount` > 0), highest count first, then newest; (3) running
//!    but not Ready, newest first; (4) available, newest first. A member locked by someone else
//!    (annotation `agents.kruise.io/lock` set, owner not `__manager_scale_down`) is skipped.
//!    Each deletion takes the lock first ([`execute`]), so a claimer that got there first wins.
//! 5. **Rolling update**, when the pool is at `spec.replicas` once the scaling above is done
//!    and members of an older revision (`template-hash` neither `updateRevision` nor one of the
//!    reference's other forms of it, [`Revisions`]) are left: every
//!    old member still creating is replaced, then old available ones, oldest first, as many
//!    as `updateStrategy.maxUnavailable` (default `20%` of `replicas`, rounded up;
//!    [`update_max_unavailable`]) less the members already creating. Each replacement is a
//!    create of the new revision in the same plan, which the executor makes before the
//!    delete (lock, then delete, as a scale-down). A claimed or locked sandbox is never
//!    rolled.
//! 6. **Dead** members not yet being deleted are deleted.
//! 7. **Templates** ([`templates`]): an inline template is materialised as the SandboxTemplate
//!    `<set>-<revision>`; stale ones are marked `cleanup-candidate` and then deleted.
//! 8. **Status**: `replicas` (creating + available), `availableReplicas`, `updateRevision`
//!    ([`sandbox_set_revision`]), `updatedReplicas` and `updatedAvailableReplicas` (members
//!    at `updateRevision`, all and available), `observedGeneration`, `selector`
//!    (`pool_selector`), `currentRevision` (the referenced template's name, or the
//!    materialised `<set>-<revision>`), all as they will be once the plan's creates and
//!    deletes are done.
//!
//! # Guarantees
//!
//! - The planner is pure; the status it writes is the outcome of its own plan, so re-planning
//!   after the plan was applied writes nothing.
//! - Without interference the pool converges to `spec.replicas` unclaimed members, and never
//!   overshoots: creates never exceed the shortfall, deletes never exceed the excess.
//! - A sandbox that is not a member (claimed, or owned by another pool) is never deleted.
//!
//! # Where this differs from the reference, and why
//!
//! - Members are read from the store, not the cache: a store list reflects every write
//!   acknowledged before it, so no create/delete expectations are needed. On Kubernetes this
//!   is one list per reconcile.
//! - Scale-down order is the mission's (`seed-extensions.md` §7.4: newest first, reuse before
//!   readiness), not the reference's (oldest first, readiness before reuse).
//! - Rolling update: the reference deletes old members and lets the next reconcile's
//!   scale-up create their replacements (so the pool is short between the two); oka plans the
//!   replacement with the delete and creates it first, so the pool keeps its size and the
//!   next reconcile sees the new members. The budget is the same (members creating count
//!   against it). It also runs when the same plan scaled the pool to its size (the reference
//!   waits for the next reconcile), so a plan applied is a fixed point. The `RollingUpdate`
//!   Event is not recorded yet.
//! - Stale materialised templates are deleted, not only marked (see [`templates`]).
//! - Creates are not split into slow-start batches by the planner but by the executor.
//! - Revisions are the reference's, byte for byte (see [`crate::revision`]).

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::sandboxset::{SANDBOX_SET_KIND, pool_selector};
use oka_api::{Sandbox, SandboxPhase, sandbox_state};
use oka_api::{
    SandboxSet, SandboxSetStatus, SandboxSpec, SandboxState, SandboxTemplate, annotations, labels,
};
use oka_store::{Preconditions, Requirement, Selector, Store, StoreError};
use tracing::{debug, info, warn};

use crate::Config;
use crate::plan::{Clock, Plan};
use crate::revision::{accepted_sandbox_set_revisions, effective_template, sandbox_set_revision};
use crate::versions::WrittenVersions;
use oka_cache::{Action, Controller};
use oka_cache::{Cache, Informers, ObjectKey};
pub use templates::{TemplateAction, materialized_name, plan_templates};

/// The size of the first batch of creates; each next batch doubles (the reference's
/// `--sandboxset-initial-batch-size`).
pub const INITIAL_CREATE_BATCH: usize = 16;
/// The [`Config::debounce`] the pool controller is run with (`oka serve`): how long changes of
/// a pool's sandboxes gather before the pool is reconciled. A burst of claims takes sandboxes
/// out of the pool a thousand times a second, and each reconcile reads every sandbox of the
/// pool; reconciling once per window instead of once per claim leaves the CPU to the claims,
/// and delays a refill by no more than this.
pub const SANDBOX_EVENT_DEBOUNCE: Duration = Duration::from_millis(10);
/// The [`Config::debounce_scale`] the pool controller is run with (`oka serve`). A reconcile
/// lists and classifies every sandbox of the pool: ~3 ms for a pool of 1,024 on a 2-core
/// machine, so a fixed 10 ms window let a large pool's reconciles take a quarter of a CPU
/// while its sandboxes changed. Waiting ten times the last reconcile's duration bounds that to
/// about a tenth, and leaves a small pool's refill as quick as before.
pub const SANDBOX_EVENT_DEBOUNCE_SCALE: u32 = 10;
/// The longest `generateName` prefix of a pool's sandboxes (the reference's 58).
pub const MAX_GENERATE_NAME: usize = 58;

/// One write the pool executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum SetAction {
    /// Create this sandbox (it has a `generateName`).
    Create(Box<Sandbox>),
    /// Scale down: lock this member, then delete it.
    ScaleDown(Arc<Sandbox>),
    /// Delete this dead member.
    DeleteDead(Arc<Sandbox>),
    /// Rolling update: lock this member of an older revision, then delete it (its
    /// replacement is a [`SetAction::Create`] of the same plan).
    RollingDelete(Arc<Sandbox>),
    /// Replace the SandboxSet's status with this one.
    UpdateStatus(Box<SandboxSetStatus>),
}

/// Why a SandboxSet cannot be planned. Retrying does not help; changing it (or creating its
/// SandboxTemplate) does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSet {
    /// The object lacks a field the store always sets.
    #[error("the SandboxSet has no metadata.{0}")]
    MissingMetadata(&'static str),
    /// `spec.templateRef` names a SandboxTemplate that does not exist.
    #[error("SandboxTemplate {0} not found")]
    TemplateNotFound(String),
    /// `spec.scaleStrategy.maxUnavailable` is neither a count nor a percentage.
    #[error(
        "invalid spec.scaleStrategy.maxUnavailable {0:?}: use a count or a percentage such as \"20%\""
    )]
    MaxUnavailable(String),
    /// `spec.updateStrategy.maxUnavailable` is neither a count nor a percentage.
    #[error(
        "invalid spec.updateStrategy.maxUnavailable {0:?}: use a count or a percentage such as \"20%\""
    )]
    UpdateMaxUnavailable(String),
    /// The SandboxTemplate named for the current revision exists and is not the pool's.
    #[error("SandboxTemplate {0} already exists but is not owned by this SandboxSet")]
    TemplateTaken(String),
}

/// Why a SandboxSet reconcile failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SetError {
    /// The SandboxSet cannot be acted on.
    #[error(transparent)]
    Invalid(#[from] InvalidSet),
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// Whether `sandbox` is an unclaimed member of the pool with uid `uid`.
pub fn is_member(sandbox: &Sandbox, uid: &str) -> bool {
    let claimed = sandbox
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::SANDBOX_CLAIMED))
        .is_some_and(|v| v == labels::TRUE);
    !claimed
        && sandbox.is_controlled_by_sandbox_set()
        && sandbox.controller_ref().is_some_and(|r| r.uid == uid)
}

/// Whether a claimer holds `sandbox`'s lock (a lock the pool's own scale-down took does not
/// count).
pub fn is_locked_by_other(sandbox: &Sandbox) -> bool {
    let annotations = sandbox.metadata.annotations.as_ref();
    let get = |key| annotations.and_then(|a| a.get(key)).map(String::as_str);
    get(annotations::LOCK).is_some_and(|lock| !lock.is_empty())
        && get(annotations::OWNER) != Some(annotations::OWNER_MANAGER_SCALE_DOWN)
}

/// The member's `template-hash` label.
fn template_hash(sandbox: &Sandbox) -> Option<&str> {
    sandbox.metadata.labels.as_ref()?.get(labels::TEMPLATE_HASH).map(String::as_str)
}

/// The revisions a pool's members may carry and still be up to date: its revision, and the
/// others the reference labelled members with ([`accepted_sandbox_set_revisions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revisions {
    /// `status.updateRevision`, what new members are labelled with.
    pub current: String,
    /// The reference's other forms of the same template.
    pub accepted: Vec<String>,
}

impl Revisions {
    /// Whether `sandbox`'s `template-hash` is one of these.
    pub fn is_up_to_date(&self, sandbox: &Sandbox) -> bool {
        template_hash(sandbox)
            .is_some_and(|h| h == self.current || self.accepted.iter().any(|a| a == h))
    }
}

/// The scale-down rank of a member (smaller is deleted first); see the
/// [module documentation](self).
pub fn scale_down_rank(
    sandbox: &Sandbox,
    revision: &str,
) -> (bool, u8, Reverse<i32>, Reverse<Timestamp>, Reverse<String>) {
    scale_down_rank_among(
        sandbox,
        &Revisions { current: revision.to_owned(), accepted: Vec::new() },
    )
}

/// [`scale_down_rank`], with every revision of `revisions` up to date.
pub fn scale_down_rank_among(
    sandbox: &Sandbox,
    revisions: &Revisions,
) -> (bool, u8, Reverse<i32>, Reverse<Timestamp>, Reverse<String>) {
    let up_to_date = revisions.is_up_to_date(sandbox);
    let reuse = sandbox.reuse_count();
    let tier = match sandbox.phase() {
        None | Some(SandboxPhase::Pending) => 0,
        _ if reuse > 0 => 1,
        _ if !sandbox.is_ready() => 2,
        _ => 3,
    };
    let reuse = if tier == 1 { reuse } else { 0 };
    let created = sandbox.metadata.creation_timestamp.as_ref().map_or(Timestamp::MAX, |t| t.0);
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    (up_to_date, tier, Reverse(reuse), Reverse(created), Reverse(name))
}

/// `scaleStrategy.maxUnavailable` as a count (a percentage of `replicas` rounded up), or
/// `None` when not set.
/// `value` as a count of `replicas`: a count, or a percentage rounded up (Kubernetes'
/// `GetScaledValueFromIntOrPercent(.., roundUp=true)`); `None` when it is neither.
fn scaled(value: &IntOrString, replicas: i64) -> Option<i64> {
    match value {
        IntOrString::Int(count) => Some(i64::from(*count).max(0)),
        IntOrString::String(text) => {
            let percent: i64 = text.strip_suffix('%')?.parse().ok()?;
            (percent >= 0).then_some((percent * replicas + 99) / 100)
        }
    }
}

/// `spec.updateStrategy.maxUnavailable` as a count: how many members may be unavailable
/// during a rolling update (default `20%` of `replicas`, rounded up, as the reference's
/// webhook defaults it and its controller rounds).
pub fn update_max_unavailable(set: &SandboxSet) -> Result<i64, InvalidSet> {
    let default = IntOrString::String(oka_api::sandboxset::DEFAULT_UPDATE_MAX_UNAVAILABLE.into());
    let value = set
        .spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.max_unavailable.as_ref())
        .unwrap_or(&default);
    let replicas = i64::from(set.spec.replicas.max(0));
    scaled(value, replicas).ok_or_else(|| {
        InvalidSet::UpdateMaxUnavailable(match value {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => s.clone(),
        })
    })
}

fn max_unavailable(set: &SandboxSet) -> Result<Option<i64>, InvalidSet> {
    let Some(value) = set.spec.scale_strategy.as_ref().and_then(|s| s.max_unavailable.as_ref())
    else {
        return Ok(None);
    };
    let replicas = i64::from(set.spec.replicas.max(0));
    match value {
        IntOrString::Int(count) => Ok(Some(i64::from(*count).max(0))),
        IntOrString::String(text) => {
            let invalid = || InvalidSet::MaxUnavailable(text.clone());
            let percent: i64 =
                text.strip_suffix('%').ok_or_else(invalid)?.parse().map_err(|_| invalid())?;
            if percent < 0 {
                return Err(invalid());
            }
            Ok(Some((percent * replicas + 99) / 100))
        }
    }
}

/// The controller ownerReference a member of `set` carries.
pub fn pool_owner_reference(set: &SandboxSet) -> OwnerReference {
    OwnerReference {
        api_version: oka_api::API_VERSION.into(),
        kind: SANDBOX_SET_KIND.into(),
        name: set.metadata.name.clone().unwrap_or_default(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A new member of `set` (reference: `NewSandboxFromSandboxSet`): `generateName` `<set>-`,
/// the pod template's labels and annotations without `agents.kruise.io/*` keys (but for the
/// preserved ones), the pool labels (`sandbox-pool`, `sandbox-template`,
/// `sandbox-claimed=false`, `template-hash=<revision>`), a controller ownerReference to the
/// set, and the set's template, template reference, pause strategy, persistent contents,
/// runtimes, volume claim templates, probes and auto-pause policy (the referenced
/// SandboxTemplate's where the set has none).
pub fn new_pool_sandbox(
    set: &SandboxSet,
    referenced: Option<&SandboxTemplate>,
    revision: &str,
) -> Sandbox {
    let name = set.metadata.name.clone().unwrap_or_default();
    let effective = effective_template(&set.spec, referenced.map(|t| &t.spec));
    let template_meta = effective.template.as_ref().and_then(|t| t.metadata.as_ref());
    let keep = |(key, _): &(&String, &String)| {
        !key.starts_with("agents.kruise.io/")
            || annotations::PRESERVED_ON_CREATION.contains(&key.as_str())
    };
    let copy = |map: Option<&BTreeMap<String, String>>| -> BTreeMap<String, String> {
        map.into_iter().flatten().filter(keep).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let mut member_labels = copy(template_meta.and_then(|m| m.labels.as_ref()));
    let member_annotations = copy(template_meta.and_then(|m| m.annotations.as_ref()));
    let template_name = set.spec.template_ref.as_ref().map_or(name.clone(), |r| r.name.clone());
    member_labels.insert(labels::SANDBOX_POOL.into(), name.clone());
    member_labels.insert(labels::SANDBOX_TEMPLATE.into(), template_name);
    member_labels.insert(labels::SANDBOX_CLAIMED.into(), labels::FALSE.into());
    member_labels.insert(labels::TEMPLATE_HASH.into(), revision.to_owned());
    let mut prefix: String = name.chars().take(MAX_GENERATE_NAME - 1).collect();
    prefix.push('-');
    let owner = pool_owner_reference(set);
    let referenced_spec = referenced.map(|t| &t.spec);
    Sandbox {
        metadata: ObjectMeta {
            generate_name: Some(prefix),
            namespace: set.metadata.namespace.clone(),
            labels: Some(member_labels),
            annotations: (!member_annotations.is_empty()).then_some(member_annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: SandboxSpec {
            pause_strategy: set
                .spec
                .pause_strategy
                .clone()
                .or_else(|| referenced_spec.and_then(|t| t.pause_strategy.clone())),
            persistent_contents: set
                .spec
                .persistent_contents
                .clone()
                .or_else(|| referenced_spec.and_then(|t| t.persistent_contents.clone())),
            runtimes: set
                .spec
                .runtimes
                .clone()
                .or_else(|| referenced_spec.and_then(|t| t.runtimes.clone())),
            template_ref: set.spec.template_ref.clone(),
            template: set.spec.template.clone(),
            volume_claim_templates: set.spec.volume_claim_templates.clone(),
            probes: set
                .spec
                .probes
                .clone()
                .or_else(|| referenced_spec.and_then(|t| t.probes.clone())),
            auto_pause_policy: set
                .spec
                .auto_pause_policy
                .clone()
                .or_else(|| referenced_spec.and_then(|t| t.auto_pause_policy.clone())),
            ..SandboxSpec::default()
        },
        status: None,
    }
}

/// Plans the pool `set` from its sandboxes (`sandboxes`: at least its members; others are
/// ignored) and `template` (the SandboxTemplate `spec.templateRef` names, if it exists); see
/// the [module documentation](self).
///
/// # Errors
///
/// [`InvalidSet`] when the referenced SandboxTemplate is missing, `maxUnavailable` is invalid
/// or the object lacks its uid.
pub fn plan_sandbox_set(
    set: &SandboxSet,
    sandboxes: &[Arc<Sandbox>],
    template: Option<&SandboxTemplate>,
    now: Timestamp,
) -> Result<Plan<SetAction>, InvalidSet> {
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(Plan::nothing());
    }
    let uid = set.metadata.uid.as_deref().ok_or(InvalidSet::MissingMetadata("uid"))?;
    let name = set.metadata.name.as_deref().ok_or(InvalidSet::MissingMetadata("name"))?;
    let referenced = match (&set.spec.template, &set.spec.template_ref) {
        (None, Some(reference)) => {
            let found = template.filter(|t| t.metadata.name.as_deref() == Some(&reference.name));
            Some(found.ok_or_else(|| InvalidSet::TemplateNotFound(reference.name.clone()))?)
        }
        _ => None,
    };
    let revision = sandbox_set_revision(&set.spec, referenced.map(|t| &t.spec));
    let revisions = Revisions {
        current: revision.clone(),
        accepted: accepted_sandbox_set_revisions(&set.spec, referenced.map(|t| &t.spec)),
    };
    let cap = max_unavailable(set)?;
    let update_budget = update_max_unavailable(set)?;

    let mut creating = Vec::new();
    let mut available = Vec::new();
    let mut dead = Vec::new();
    for sandbox in sandboxes.iter().filter(|s| is_member(s, uid)) {
        if sandbox.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match sandbox_state(sandbox, now).state {
            SandboxState::Creating => creating.push(sandbox),
            SandboxState::Available => available.push(sandbox),
            SandboxState::Dead => dead.push(sandbox),
            // A controlled sandbox is never running or paused by the state rules.
            SandboxState::Running | SandboxState::Paused => {}
        }
    }

    let desired = i64::from(set.spec.replicas.max(0));
    let count = (creating.len() + available.len()) as i64;
    let mut plan = Plan::nothing();
    let mut created = 0usize;
    if count < desired {
        let shortfall = desired - count;
        let room = cap.map_or(shortfall, |cap| (cap - creating.len() as i64).max(0));
        created = usize::try_from(shortfall.min(room)).unwrap_or(0);
        for _ in 0..created {
            plan = plan
                .with(SetAction::Create(Box::new(new_pool_sandbox(set, referenced, &revision))));
        }
    }
    let mut removed: Vec<&Arc<Sandbox>> = Vec::new();
    if count > desired {
        let excess = usize::try_from(count - desired).unwrap_or(0);
        let mut candidates: Vec<&Arc<Sandbox>> =
            creating.iter().chain(&available).copied().filter(|s| !is_locked_by_other(s)).collect();
        candidates.sort_by_cached_key(|s| scale_down_rank_among(s, &revisions));
        removed = candidates.into_iter().take(excess).collect();
        for sandbox in &removed {
            plan = plan.with(SetAction::ScaleDown(Arc::clone(sandbox)));
        }
    }
    // Rolling update, when the pool is at its size once this plan's scaling is done: every
    // member of an older revision still creating is replaced, and of the available ones as
    // many as the budget allows, oldest first. Each replacement is created in the same plan
    // (the executor creates before it deletes), so the pool keeps its size and the members
    // unavailable (creating) never exceed `updateStrategy.maxUnavailable`.
    let is_kept = |s: &&Arc<Sandbox>| !removed.iter().any(|r| Arc::ptr_eq(r, s));
    let left_creating: Vec<&Arc<Sandbox>> = creating.iter().copied().filter(is_kept).collect();
    let left_available: Vec<&Arc<Sandbox>> = available.iter().copied().filter(is_kept).collect();
    if (left_creating.len() + left_available.len() + created) as i64 == desired {
        let is_old = |s: &&Arc<Sandbox>| !revisions.is_up_to_date(s);
        let unlocked = |s: &&Arc<Sandbox>| !is_locked_by_other(s);
        let old_creating: Vec<&Arc<Sandbox>> =
            left_creating.iter().copied().filter(is_old).filter(unlocked).collect();
        let mut old_available: Vec<&Arc<Sandbox>> =
            left_available.iter().copied().filter(is_old).filter(unlocked).collect();
        old_available.sort_by_key(|s| {
            (s.metadata.creation_timestamp.as_ref().map(|t| t.0), s.metadata.name.clone())
        });
        let unavailable = (left_creating.len() + created) as i64;
        let budget = usize::try_from(update_budget - unavailable).unwrap_or(0);
        let rolled: Vec<&Arc<Sandbox>> =
            old_creating.into_iter().chain(old_available.into_iter().take(budget)).collect();
        for sandbox in &rolled {
            plan = plan
                .with(SetAction::Create(Box::new(new_pool_sandbox(set, referenced, &revision))))
                .with(SetAction::RollingDelete(Arc::clone(sandbox)));
        }
        created += rolled.len();
        removed.extend(rolled);
    }
    dead.sort_by_key(|s| s.metadata.name.clone());
    for sandbox in dead {
        plan = plan.with(SetAction::DeleteDead(Arc::clone(sandbox)));
    }

    let kept = |s: &&&Arc<Sandbox>| !removed.iter().any(|r| Arc::ptr_eq(r, s));
    let kept_creating = creating.iter().filter(kept).count();
    let kept_available: Vec<_> = available.iter().filter(kept).collect();
    let updated =
        |list: &[&&Arc<Sandbox>]| list.iter().filter(|s| revisions.is_up_to_date(s)).count();
    let kept_creating_list: Vec<_> = creating.iter().filter(kept).collect();
    let to_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let before = set.status.clone().unwrap_or_default();
    let status = SandboxSetStatus {
        observed_generation: set.metadata.generation,
        replicas: to_i32(kept_creating + kept_available.len() + created),
        available_replicas: to_i32(kept_available.len()),
        update_revision: Some(revision.clone()),
        current_revision: match referenced {
            Some(template) => template.metadata.name.clone(),
            None if set.spec.template.is_some() => Some(materialized_name(name, &revision)),
            None => before.current_revision.clone(),
        },
        updated_replicas: Some(to_i32(
            updated(&kept_creating_list) + updated(&kept_available) + created,
        )),
        updated_available_replicas: Some(to_i32(updated(&kept_available))),
        conditions: before.conditions.clone(),
        selector: Some(pool_selector(name)),
    };
    if status != before {
        plan = plan.with(SetAction::UpdateStatus(Box::new(status)));
    }
    Ok(plan)
}

/// Applies `plan` to `set` through `store` and returns the runtime's next step.
///
/// Creates run in slow-start batches ([`INITIAL_CREATE_BATCH`], doubling), each batch at once;
/// a batch with a failure ends the pass. A scale-down first stamps the member's lock
/// (`agents.kruise.io/lock` = a fresh UUID per pass, owner `__manager_scale_down`) with the
/// observed `resourceVersion`, then deletes it with that write's `resourceVersion`: a member a
/// claimer locked or changed meanwhile fails the precondition and is left alone (the pool is
/// woken by that change and plans again).
///
/// # Errors
///
/// [`SetError::Store`] when a write fails for another reason than "not found" or a lost race.
pub async fn execute<S: Store>(
    store: &S,
    set: &SandboxSet,
    plan: &Plan<SetAction>,
    metrics: Option<&crate::metrics::ControllerMetrics>,
) -> Result<Executed, SetError> {
    let namespace = set.metadata.namespace.clone().unwrap_or_default();
    let creates: Vec<&Sandbox> = plan
        .actions
        .iter()
        .filter_map(|a| if let SetAction::Create(s) = a { Some(s.as_ref()) } else { None })
        .collect();
    let mut batch = INITIAL_CREATE_BATCH;
    let mut rest = creates.as_slice();
    while !rest.is_empty() {
        let (now, later) = rest.split_at(batch.min(rest.len()));
        let results =
            futures::future::join_all(now.iter().map(|sandbox| store.create(&namespace, *sandbox)))
                .await;
        let mut failure = None;
        let mut created_now = 0;
        for result in results {
            match result {
                Ok(created) => {
                    created_now += 1;
                    debug!(sandbox = ?created.metadata.name, "pool sandbox created");
                }
                Err(error) => failure = Some(error),
            }
        }
        if let Some(metrics) = metrics {
            let set_name = set.metadata.name.as_deref().unwrap_or_default();
            metrics.sandboxes_created(&namespace, set_name, created_now);
        }
        if let Some(error) = failure {
            warn!(%error, "creating pool sandboxes failed");
            return Err(error.into());
        }
        rest = later;
        batch = batch.saturating_mul(2);
    }
    if !creates.is_empty() {
        info!(count = creates.len(), "pool scaled up");
    }

    let lock = uuid::Uuid::new_v4().to_string();
    let mut written = None;
    for action in &plan.actions {
        match action {
            SetAction::Create(_) => {}
            SetAction::ScaleDown(member) | SetAction::RollingDelete(member) => {
                scale_down(store, &namespace, member, &lock).await?;
            }
            SetAction::DeleteDead(member) => {
                let name = member.metadata.name.clone().unwrap_or_default();
                let preconditions =
                    Preconditions { uid: member.metadata.uid.clone(), resource_version: None };
                match store.delete::<Sandbox>(&namespace, &name, &preconditions).await {
                    Ok(_) => info!(sandbox = %name, "dead pool sandbox deleted"),
                    Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            SetAction::UpdateStatus(status) => {
                let mut update = set.clone();
                update.status = Some((**status).clone());
                match store.update_status(&namespace, &update).await {
                    Ok(set) => written = Some(set),
                    Err(StoreError::NotFound { .. }) => {
                        return Ok(Executed { next: Action::await_change(), set: None });
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }
    Ok(Executed { next: plan.next_action(), set: written })
}

/// What [`execute`] left behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    /// The runtime's next step.
    pub next: Action,
    /// The SandboxSet as its status write left it, when there was one.
    pub set: Option<SandboxSet>,
}

async fn scale_down<S: Store>(
    store: &S,
    namespace: &str,
    member: &Sandbox,
    lock: &str,
) -> Result<(), SetError> {
    let name = member.metadata.name.clone().unwrap_or_default();
    let mut locked = member.clone();
    let stamped = locked.metadata.annotations.get_or_insert_with(BTreeMap::new);
    stamped.insert(annotations::LOCK.into(), lock.to_owned());
    stamped.insert(annotations::OWNER.into(), annotations::OWNER_MANAGER_SCALE_DOWN.into());
    let locked = match store.update(namespace, &locked).await {
        Ok(locked) => locked,
        Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {
            debug!(sandbox = %name, "member changed before scale-down; leaving it");
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    let preconditions = Preconditions {
        uid: locked.metadata.uid.clone(),
        resource_version: locked.metadata.resource_version.clone(),
    };
    match store.delete::<Sandbox>(namespace, &name, &preconditions).await {
        Ok(_) => info!(sandbox = %name, "pool scaled down"),
        Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {
            debug!(sandbox = %name, "member changed after locking; leaving it");
        }
        Err(error) => return Err(error.into()),
    }
    Ok(())
}

/// What the pool reconciler reads and writes through.
pub struct SetContext<S: Store> {
    /// Where members are listed and written.
    pub store: S,
    /// The SandboxTemplates, kept by an informer the controller runs.
    pub templates: Cache<SandboxTemplate>,
    /// Where `now` comes from.
    pub clock: Clock,
    /// The versions this controller wrote, to skip reconciles of a cache that lags them.
    pub written: WrittenVersions,
    /// Where pool creates are counted.
    pub metrics: Option<Arc<crate::metrics::ControllerMetrics>>,
}

impl<S: Store> std::fmt::Debug for SetContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetContext").field("templates", &self.templates).finish_non_exhaustive()
    }
}

/// Reconciles one SandboxSet: list its sandboxes, look up its template, [`plan_sandbox_set`],
/// [`execute`].
///
/// # Errors
///
/// [`SetError`] from planning or from the store.
pub async fn reconcile_sandbox_set<S: Store>(
    set: Arc<SandboxSet>,
    ctx: Arc<SetContext<S>>,
) -> Result<Action, SetError> {
    if ctx.written.is_stale(set.as_ref()) {
        return Ok(Action::await_change());
    }
    let namespace = set.metadata.namespace.clone().unwrap_or_default();
    let name = set.metadata.name.clone().unwrap_or_default();
    // Only what can be a member: a claimed sandbox keeps its pool label, and after a burst of
    // claims the claimed ones may outnumber the pool.
    let selector = Selector::new(vec![
        Requirement::Equals(labels::SANDBOX_POOL.into(), name.clone()),
        Requirement::NotEquals(labels::SANDBOX_CLAIMED.into(), labels::TRUE.into()),
    ]);
    let sandboxes = ctx.store.list::<Sandbox>(Some(&namespace), &selector).await?.items;
    let template = match (&set.spec.template, &set.spec.template_ref) {
        (None, Some(reference)) => match ctx.templates.get_named(&namespace, &reference.name) {
            Some(template) => Some((*template).clone()),
            None => match ctx.store.get::<SandboxTemplate>(&namespace, &reference.name).await {
                Ok(template) => Some(template),
                Err(StoreError::NotFound { .. }) => None,
                Err(error) => return Err(error.into()),
            },
        },
        _ => None,
    };
    let plan = plan_sandbox_set(&set, &sandboxes, template.as_ref(), ctx.clock.now())?;
    let revision = plan
        .actions
        .iter()
        .find_map(|a| match a {
            SetAction::UpdateStatus(status) => status.update_revision.clone(),
            _ => None,
        })
        .or_else(|| set.status.as_ref().and_then(|s| s.update_revision.clone()));
    if let Some(revision) = revision {
        let templates = ctx.templates.list_namespace(&namespace);
        let actions = plan_templates(&set, &revision, &templates, &sandboxes);
        execute_templates(&ctx.store, &set, &actions).await?;
    }
    let executed = execute(&ctx.store, &set, &plan, ctx.metrics.as_deref()).await?;
    if let Some(written) = &executed.set {
        ctx.written.record(written);
    }
    Ok(executed.next)
}

/// Applies the template `actions` of `set`. A template of the current revision's name that
/// exists but is not the pool's is an error, as in the reference (the pool does not take
/// over someone else's template).
///
/// # Errors
///
/// [`SetError::Invalid`] for a name taken by another owner; [`SetError::Store`] when a write
/// fails for another reason than "already exists" or "not found".
pub async fn execute_templates<S: Store>(
    store: &S,
    set: &SandboxSet,
    actions: &[TemplateAction],
) -> Result<(), SetError> {
    let namespace = set.metadata.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    for action in actions {
        match action {
            TemplateAction::Create(template) => {
                let name = template.metadata.name.clone().unwrap_or_default();
                match store.create(&namespace, template.as_ref()).await {
                    Ok(_) => info!(template = %name, "revision materialised"),
                    Err(StoreError::AlreadyExists { .. }) => {
                        let existing = store.get::<SandboxTemplate>(&namespace, &name).await?;
                        if !templates::is_owned_by(&existing, &uid) {
                            return Err(InvalidSet::TemplateTaken(name).into());
                        }
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            TemplateAction::MarkCleanupCandidate(template) => {
                let mut marked = (**template).clone();
                marked
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(annotations::CLEANUP_CANDIDATE.into(), labels::TRUE.into());
                match store.update(&namespace, &marked).await {
                    Ok(_) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            TemplateAction::Delete(template) => {
                let name = template.metadata.name.clone().unwrap_or_default();
                let preconditions = Preconditions {
                    uid: template.metadata.uid.clone(),
                    resource_version: template.metadata.resource_version.clone(),
                };
                match store.delete::<SandboxTemplate>(&namespace, &name, &preconditions).await {
                    Ok(_) => info!(template = %name, "stale materialised template deleted"),
                    Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }
    Ok(())
}

/// The pool controller's error policy: an invalid SandboxSet (or a missing SandboxTemplate,
/// whose creation wakes it) waits for a change; store failures back off.
pub fn sandbox_set_error_policy<S: Store>(
    _set: &SandboxSet,
    error: &SetError,
    _ctx: &SetContext<S>,
) -> Action {
    match error {
        SetError::Invalid(_) => Action::await_change(),
        SetError::Store(_) => Action::backoff(),
    }
}

/// Builds the SandboxSet controller over `informers` (shared, or a store for its own): SandboxSets
/// are the primary kind; a change of a Sandbox wakes its owner (before and after the change, so a
/// claimed sandbox still wakes its former pool); a SandboxTemplate change wakes the pools that
/// refer to it.
pub fn sandbox_set_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
) -> (Controller<SandboxSet, S>, Arc<SetContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller = Controller::<SandboxSet, S>::shared("sandboxset", &informers, config.runner);
    let sets = controller.cache();
    let templates = informers.all::<SandboxTemplate>();
    let ctx = Arc::new(SetContext {
        store: store.clone(),
        templates: templates.cache(),
        clock,
        written: WrittenVersions::default(),
        metrics: config.metrics.clone(),
    });
    if let Some(metrics) = &ctx.metrics {
        metrics.watch_sets(controller.cache());
    }
    let forget = Arc::clone(&ctx);
    let controller = controller
        .owns_shared(informers.all::<Sandbox>())
        .watches_shared(templates, move |template: &SandboxTemplate| {
            let namespace = template.metadata.namespace.clone().unwrap_or_default();
            let name = template.metadata.name.as_deref().unwrap_or_default();
            sets.list_namespace(&namespace)
                .iter()
                .filter(|s| {
                    s.spec.template_ref.as_ref().is_some_and(|r| r.name == name)
                        || s.metadata
                            .uid
                            .as_deref()
                            .is_some_and(|uid| templates::is_owned_by(template, uid))
                })
                .map(|s| ObjectKey::of(s.as_ref()))
                .collect()
        })
        .on_delete(move |set: &SandboxSet| forget.written.forget(&ObjectKey::of(set)));
    (controller, ctx)
}

/// Runs the SandboxSet controller until `shutdown` resolves (then finishes in-flight
/// reconciles).
pub async fn run_sandbox_set_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = sandbox_set_controller(informers, config, clock);
    controller
        .shutdown_on(shutdown)
        .run(reconcile_sandbox_set, sandbox_set_error_policy, ctx)
        .await;
}

pub mod templates;

#[cfg(test)]
mod tests;
