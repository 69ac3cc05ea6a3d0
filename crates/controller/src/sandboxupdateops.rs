//! The SandboxUpdateOps controller (reference: `pkg/controller/sandboxupdateops`): upgrades a
//! batch of sandboxes by patching their pod template, a few at a time.
//!
//! # Expected flow
//!
//! [`reconcile_update_ops`] reads the SandboxUpdateOps, the sandboxes of its namespace (from
//! the cache) and the other SandboxUpdateOps there, and calls the pure [`plan_update_ops`]:
//!
//! 1. Another SandboxUpdateOps of the namespace is `Updating` ⇒ nothing (it goes first).
//! 2. **Deleting** ⇒ every sandbox labelled `agents.kruise.io/update-ops=<name>` is released
//!    (label and `upgrade-resume-trigger` removed, `upgradePolicy` cleared when its upgrade
//!    succeeded), then the finalizer `agents.kruise.io/sandboxupdateops-protection` goes.
//! 3. The finalizer is added first; a `Completed` or `Failed` one is done.
//! 4. The sandboxes its selector picks are classified (skipped: deleting, Succeeded or Failed,
//!    owned by a SandboxSet (pool members are upgraded by their pool), not in `stateFilter`
//!    unless already ours, ours-to-be whose template already equals the patched one, taken by
//!    another active SandboxUpdateOps): *candidate*, *updating* (ours, not yet observed or
//!    upgrading), *updated* (`Upgrading=True/Succeeded`; its `upgrade-failed` label goes and its
//!    `upgradePolicy` is cleared), *failed* (an `Upgrading` failure reason; labelled
//!    `agents.kruise.io/upgrade-failed=true`), *resume-succeed* (a paused one resumed for its
//!    upgrade: counted as updating, its template is patched now).
//! 5. **Status**: `replicas` = all four kinds; `Pending` ⇒ `Updating`; once updated + failed ==
//!    replicas with no candidate left ⇒ `Failed` if any failed, else `Completed`.
//! 6. While `Updating` and not `paused`: candidates are started in name order, at most
//!    `maxUnavailable` (a count or a percentage of replicas rounded up; absent or ≤ 0 means 1)
//!    minus those updating and failed: `upgradePolicy` set to the strategy's type, `lifecycle`
//!    copied, label `update-ops=<name>`, and then a Running one gets the patched template while
//!    a Paused one gets the annotation `upgrade-resume-trigger=true` first (two phases).
//!
//! The sandbox controller does each sandbox's upgrade (phase `Upgrading`, see
//! [`crate::sandbox`]); this controller only chooses, patches and counts.
//!
//! # Guarantees
//!
//! - The planner is pure; re-planning after its writes changes nothing more.
//! - Never more sandboxes upgrading or failed than the budget; failed ones keep using it, so a
//!   bad patch stops after `maxUnavailable` failures.
//! - A sandbox is taken by one SandboxUpdateOps at a time.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::common::{SandboxLifecycle, UpgradePolicy, UpgradePolicyType};
use oka_api::conditions::sandbox::{PAUSED, UPGRADING, upgrading_reason};
use oka_api::sandboxupdateops::{SandboxUpdateOpsPhase, SandboxUpdateOpsState};
use oka_api::{
    Sandbox, SandboxPhase, SandboxUpdateOps, SandboxUpdateOpsStatus, annotations, finalizers,
    labels,
};
use oka_store::{Requirement, Selector, Store, StoreError};
use serde_json::Value;
use tracing::info;

use crate::Config;
use crate::events::{EventRecorder, EventType};
use crate::plan::{Clock, Plan};
use oka_cache::{Action, Controller};
use oka_cache::{Cache, Informers, ObjectKey};

/// One write the SandboxUpdateOps executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateOpsAction {
    /// Add the protection finalizer.
    AddFinalizer,
    /// Remove it (the SandboxUpdateOps is deleting and released every sandbox).
    RemoveFinalizer,
    /// Take sandbox `name` out of this SandboxUpdateOps (on its deletion).
    Release {
        /// The sandbox.
        name: String,
        /// Its upgrade succeeded: `upgradePolicy` is cleared too.
        clear_policy: bool,
    },
    /// Start upgrading sandbox `name`.
    Start {
        /// The sandbox.
        name: String,
        /// The patched template (a Running sandbox), or `None` (a Paused one: resume first).
        template: Option<Box<PodTemplateSpec>>,
    },
    /// Patch the template of a sandbox resumed for its upgrade, and drop its resume trigger.
    PatchResumed {
        /// The sandbox.
        name: String,
        /// The patched template.
        template: Box<PodTemplateSpec>,
    },
    /// Its upgrade succeeded: clear `upgradePolicy` and the `upgrade-failed` label.
    MarkUpdated(String),
    /// Its upgrade failed: label it `upgrade-failed=true`.
    MarkFailed(String),
    /// Replace the status.
    UpdateStatus(Box<SandboxUpdateOpsStatus>),
}

/// Why a SandboxUpdateOps cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidUpdateOps {
    /// The selector cannot be read.
    #[error("invalid spec.selector: {0}")]
    Selector(String),
    /// The patch does not make a valid pod template.
    #[error("spec.patch does not make a valid pod template: {0}")]
    Patch(String),
}

/// How one selected sandbox stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Candidate,
    Updating,
    Updated,
    Failed,
    ResumeSucceed,
}

/// The reasons of `Upgrading` that end an upgrade as failed.
const FAILED_REASONS: [&str; 4] = [
    upgrading_reason::PRE_UPGRADE_FAILED,
    upgrading_reason::POST_UPGRADE_FAILED,
    upgrading_reason::UPGRADE_POD_FAILED,
    upgrading_reason::CHECKPOINT_FAILED,
];

/// `selector` as a store selector.
///
/// # Errors
///
/// [`InvalidUpdateOps::Selector`] for an operator the API does not have.
pub fn selector_of(selector: &LabelSelector) -> Result<Selector, InvalidUpdateOps> {
    let mut requirements: Vec<Requirement> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
        .collect();
    for expression in selector.match_expressions.iter().flatten() {
        let key = expression.key.clone();
        let values = expression.values.clone().unwrap_or_default();
        requirements.push(match expression.operator.as_str() {
            "In" => Requirement::In(key, values),
            "NotIn" => Requirement::NotIn(key, values),
            "Exists" => Requirement::Exists(key),
            "DoesNotExist" => Requirement::DoesNotExist(key),
            other => {
                return Err(InvalidUpdateOps::Selector(format!("unknown operator {other:?}")));
            }
        });
    }
    Ok(Selector::new(requirements))
}

/// The template `sandbox` gets from `patch`.
///
/// # Errors
///
/// [`InvalidUpdateOps::Patch`] when the result is not a pod template.
pub fn patched_template(
    sandbox: &Sandbox,
    templates: &Templates,
    patch: Option<&Value>,
) -> Result<PodTemplateSpec, InvalidUpdateOps> {
    let current = effective_template(sandbox, templates).unwrap_or_default();
    let mut template =
        serde_json::to_value(current).map_err(|e| InvalidUpdateOps::Patch(e.to_string()))?;
    if let Some(patch) = patch {
        oka_api::strategic::patch_pod_template(&mut template, patch);
    }
    serde_json::from_value(template).map_err(|e| InvalidUpdateOps::Patch(e.to_string()))
}

/// The pod templates of the namespace's SandboxTemplates, by name.
pub type Templates = BTreeMap<String, PodTemplateSpec>;

/// The template `sandbox` runs: its own, else the one of the SandboxTemplate it refers to. A
/// patched template becomes the sandbox's own (an inline template wins over the reference).
pub fn effective_template(sandbox: &Sandbox, templates: &Templates) -> Option<PodTemplateSpec> {
    sandbox.spec.template.clone().or_else(|| {
        let name = &sandbox.spec.template_ref.as_ref()?.name;
        templates.get(name).cloned()
    })
}

/// `maxUnavailable` of `total`: a count, or a percentage rounded up; absent or ≤ 0 means 1.
pub fn budget(max_unavailable: Option<&IntOrString>, total: usize) -> usize {
    let n = match max_unavailable {
        None => 1,
        Some(IntOrString::Int(n)) => i64::from(*n),
        Some(IntOrString::String(text)) => match text.strip_suffix('%') {
            Some(p) => p.trim().parse::<i64>().map_or(1, |p| {
                let total = i64::try_from(total).unwrap_or(i64::MAX);
                (p.saturating_mul(total) + 99) / 100
            }),
            None => text.trim().parse::<i64>().unwrap_or(1),
        },
    };
    usize::try_from(n.max(1)).unwrap_or(1)
}

fn is_pool_member(sandbox: &Sandbox) -> bool {
    sandbox
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "SandboxSet")
}

fn label<'a>(sandbox: &'a Sandbox, key: &str) -> Option<&'a str> {
    sandbox.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn classify(
    suo: &SandboxUpdateOps,
    sandbox: &Sandbox,
    current: Option<&PodTemplateSpec>,
    patched: &PodTemplateSpec,
    active_others: &[String],
) -> Option<Class> {
    let name = suo.metadata.name.as_deref().unwrap_or_default();
    let phase = sandbox.phase();
    let ours = label(sandbox, labels::UPDATE_OPS) == Some(name);
    if sandbox.metadata.deletion_timestamp.is_some()
        || matches!(phase, Some(SandboxPhase::Succeeded | SandboxPhase::Failed))
        || is_pool_member(sandbox)
    {
        return None;
    }
    let upgrading = sandbox.status.as_ref().and_then(|s| s.condition(UPGRADING));
    let observed =
        sandbox.status.as_ref().and_then(|s| s.observed_generation) == sandbox.metadata.generation;
    let matches = current == Some(patched);
    if !ours {
        if label(sandbox, labels::UPDATE_OPS).is_some_and(|o| active_others.iter().any(|a| a == o))
        {
            return None;
        }
        let states = suo.spec.selected_states();
        let eligible = match phase {
            Some(SandboxPhase::Running) => states.contains(&SandboxUpdateOpsState::Running),
            Some(SandboxPhase::Paused) => {
                let paused_done = sandbox
                    .status
                    .as_ref()
                    .and_then(|s| s.condition(PAUSED))
                    .is_some_and(|c| c.status == "True");
                states.contains(&SandboxUpdateOpsState::Paused)
                    && paused_done
                    && sandbox.is_paused()
            }
            Some(SandboxPhase::Upgrading) => true,
            _ => false,
        };
        if !eligible || (matches && phase != Some(&SandboxPhase::Upgrading) && observed) {
            return None;
        }
        return Some(Class::Candidate);
    }
    if !observed {
        return Some(Class::Updating);
    }
    match upgrading {
        Some(c) if c.status == "True" && c.reason == upgrading_reason::SUCCEEDED => {
            Some(Class::Updated)
        }
        Some(c) if FAILED_REASONS.contains(&c.reason.as_str()) => Some(Class::Failed),
        Some(c) if c.reason == upgrading_reason::RESUME_SUCCEED => Some(Class::ResumeSucceed),
        None if phase == Some(&SandboxPhase::Running) && !matches => Some(Class::ResumeSucceed),
        None if matches => None,
        _ => Some(Class::Updating),
    }
}

/// Plans the next writes of `suo`; see the [module documentation](self) for the rules.
/// `sandboxes` are those of its namespace; `active_others` the names of the other
/// SandboxUpdateOps there that are Pending or Updating, and whether one of them is Updating.
///
/// # Errors
///
/// [`InvalidUpdateOps`] when its selector or patch cannot be used.
pub fn plan_update_ops(
    suo: &SandboxUpdateOps,
    sandboxes: &[Arc<Sandbox>],
    templates: &Templates,
    active_others: &[String],
    other_updating: bool,
) -> Result<Plan<UpdateOpsAction>, InvalidUpdateOps> {
    let mut plan = Plan::default();
    let name = suo.metadata.name.as_deref().unwrap_or_default();
    let has_finalizer =
        suo.metadata.finalizers.iter().flatten().any(|f| f == finalizers::SANDBOX_UPDATE_OPS);
    if suo.metadata.deletion_timestamp.is_some() {
        for sandbox in sandboxes.iter().filter(|s| label(s, labels::UPDATE_OPS) == Some(name)) {
            let succeeded = sandbox
                .status
                .as_ref()
                .and_then(|s| s.condition(UPGRADING))
                .is_some_and(|c| c.status == "True" && c.reason == upgrading_reason::SUCCEEDED);
            let name = sandbox.metadata.name.clone().unwrap_or_default();
            plan = plan.with(UpdateOpsAction::Release { name, clear_policy: succeeded });
        }
        if has_finalizer {
            plan = plan.with(UpdateOpsAction::RemoveFinalizer);
        }
        return Ok(plan);
    }
    let status = suo.status.clone().unwrap_or_default();
    if other_updating && status.phase != Some(SandboxUpdateOpsPhase::Updating) {
        return Ok(plan);
    }
    if !has_finalizer {
        plan = plan.with(UpdateOpsAction::AddFinalizer);
    }
    if matches!(
        status.phase,
        Some(SandboxUpdateOpsPhase::Completed | SandboxUpdateOpsPhase::Failed)
    ) {
        return Ok(plan);
    }
    let selector = selector_of(&suo.spec.selector)?;
    let mut classes: BTreeMap<String, (Class, &Sandbox, PodTemplateSpec)> = BTreeMap::new();
    for sandbox in sandboxes.iter().filter(|s| selector.matches(s.metadata.labels.as_ref())) {
        let patched = patched_template(sandbox, templates, suo.spec.patch.as_ref())?;
        let current = effective_template(sandbox, templates);
        if let Some(class) = classify(suo, sandbox, current.as_ref(), &patched, active_others) {
            let name = sandbox.metadata.name.clone().unwrap_or_default();
            classes.insert(name, (class, sandbox.as_ref(), patched));
        }
    }
    let count = |class: Class| classes.values().filter(|(c, ..)| *c == class).count();
    let (updated, failed) = (count(Class::Updated), count(Class::Failed));
    let updating = count(Class::Updating) + count(Class::ResumeSucceed);
    let candidates = count(Class::Candidate);
    let total = updated + failed + updating + candidates;
    let mut next = status.clone();
    next.observed_generation = suo.metadata.generation;
    next.replicas = i32::try_from(total).unwrap_or(i32::MAX);
    next.updated_replicas = i32::try_from(updated).unwrap_or(i32::MAX);
    next.failed_replicas = i32::try_from(failed).unwrap_or(i32::MAX);
    next.updating_replicas = i32::try_from(updating).unwrap_or(i32::MAX);
    if matches!(next.phase, None | Some(SandboxUpdateOpsPhase::Pending)) {
        next.phase = Some(SandboxUpdateOpsPhase::Updating);
    }
    if updated + failed == total && candidates == 0 {
        next.phase = Some(if failed > 0 {
            SandboxUpdateOpsPhase::Failed
        } else {
            SandboxUpdateOpsPhase::Completed
        });
    }
    for (sandbox, (class, current, _)) in &classes {
        let failed_label = label(current, labels::UPGRADE_FAILED) == Some("true");
        match class {
            Class::Updated if failed_label || current.spec.upgrade_policy.is_some() => {
                plan = plan.with(UpdateOpsAction::MarkUpdated(sandbox.clone()));
            }
            Class::Failed if !failed_label => {
                plan = plan.with(UpdateOpsAction::MarkFailed(sandbox.clone()));
            }
            _ => {}
        }
    }
    if next.phase == Some(SandboxUpdateOpsPhase::Updating) && suo.spec.paused != Some(true) {
        for (sandbox, (class, current, patched)) in &classes {
            let now = effective_template(current, templates);
            if *class == Class::ResumeSucceed && now.as_ref() != Some(patched) {
                plan = plan.with(UpdateOpsAction::PatchResumed {
                    name: sandbox.clone(),
                    template: Box::new(patched.clone()),
                });
            }
        }
        let room = budget(
            suo.spec.update_strategy.as_ref().and_then(|s| s.max_unavailable.as_ref()),
            total,
        )
        .saturating_sub(updating + failed);
        let mut started = 0;
        for (sandbox, (class, current, patched)) in &classes {
            if started >= room {
                break;
            }
            if *class != Class::Candidate {
                continue;
            }
            let template =
                (current.phase() != Some(&SandboxPhase::Paused)).then(|| Box::new(patched.clone()));
            plan = plan.with(UpdateOpsAction::Start { name: sandbox.clone(), template });
            started += 1;
        }
        if started > 0 {
            let n = i32::try_from(started).unwrap_or(i32::MAX);
            next.updating_replicas = next.updating_replicas.saturating_add(n);
        }
    }
    if next != status {
        plan = plan.with(UpdateOpsAction::UpdateStatus(Box::new(next)));
    }
    Ok(plan)
}

/// The sandbox as `action` leaves it, or `None` when the action does not write a sandbox.
pub fn sandbox_after(
    suo: &SandboxUpdateOps,
    sandbox: &Sandbox,
    action: &UpdateOpsAction,
) -> Option<Sandbox> {
    let name = suo.metadata.name.clone().unwrap_or_default();
    let mut next = sandbox.clone();
    let labels_mut = |s: &mut Sandbox| s.metadata.labels.get_or_insert_with(BTreeMap::new).clone();
    match action {
        UpdateOpsAction::Release { clear_policy, .. } => {
            let mut l = labels_mut(&mut next);
            l.remove(labels::UPDATE_OPS);
            next.metadata.labels = Some(l);
            if let Some(a) = next.metadata.annotations.as_mut() {
                a.remove(annotations::UPGRADE_RESUME_TRIGGER);
            }
            if *clear_policy {
                next.spec.upgrade_policy = None;
            }
        }
        UpdateOpsAction::Start { template, .. } => {
            let type_: UpgradePolicyType = suo.spec.upgrade_type();
            next.spec.upgrade_policy = Some(UpgradePolicy { type_: Some(type_) });
            next.spec.lifecycle = suo.spec.lifecycle.clone().map(|l: SandboxLifecycle| l);
            let mut l = labels_mut(&mut next);
            l.insert(labels::UPDATE_OPS.to_owned(), name);
            l.remove(labels::UPGRADE_FAILED);
            next.metadata.labels = Some(l);
            match template {
                Some(template) => {
                    // The patched template is the sandbox's own from now on.
                    next.spec.template = Some((**template).clone());
                    next.spec.template_ref = None;
                }
                None => {
                    next.metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(annotations::UPGRADE_RESUME_TRIGGER.to_owned(), "true".to_owned());
                }
            }
        }
        UpdateOpsAction::PatchResumed { template, .. } => {
            next.spec.template = Some((**template).clone());
            next.spec.template_ref = None;
            if let Some(a) = next.metadata.annotations.as_mut() {
                a.remove(annotations::UPGRADE_RESUME_TRIGGER);
            }
        }
        UpdateOpsAction::MarkUpdated(_) => {
            next.spec.upgrade_policy = None;
            if let Some(l) = next.metadata.labels.as_mut() {
                l.remove(labels::UPGRADE_FAILED);
            }
        }
        UpdateOpsAction::MarkFailed(_) => {
            next.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(labels::UPGRADE_FAILED.to_owned(), "true".to_owned());
        }
        UpdateOpsAction::AddFinalizer
        | UpdateOpsAction::RemoveFinalizer
        | UpdateOpsAction::UpdateStatus(_) => return None,
    }
    Some(next)
}

/// Why a SandboxUpdateOps reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum UpdateOpsError {
    /// The SandboxUpdateOps cannot be acted on until it changes.
    #[error(transparent)]
    Invalid(#[from] InvalidUpdateOps),
    /// A store call failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

fn target(action: &UpdateOpsAction) -> Option<&str> {
    match action {
        UpdateOpsAction::Release { name, .. }
        | UpdateOpsAction::Start { name, .. }
        | UpdateOpsAction::PatchResumed { name, .. }
        | UpdateOpsAction::MarkUpdated(name)
        | UpdateOpsAction::MarkFailed(name) => Some(name),
        _ => None,
    }
}

/// Applies `plan`: sandbox writes with the version they were read at (a conflict retries the
/// reconcile), then the SandboxUpdateOps's finalizer and status.
///
/// # Errors
///
/// [`UpdateOpsError::Store`].
pub async fn execute<S: Store>(
    store: &S,
    events: &EventRecorder,
    suo: &SandboxUpdateOps,
    sandboxes: &[Arc<Sandbox>],
    plan: &Plan<UpdateOpsAction>,
) -> Result<Action, UpdateOpsError> {
    let namespace = suo.metadata.namespace.clone().unwrap_or_default();
    let mut current = suo.clone();
    for action in &plan.actions {
        if let Some(name) = target(action) {
            let Some(sandbox) = sandboxes.iter().find(|s| s.metadata.name.as_deref() == Some(name))
            else {
                continue;
            };
            let Some(next) = sandbox_after(suo, sandbox, action) else { continue };
            match store.update(&namespace, &next).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            if let UpdateOpsAction::Start { .. } = action {
                let message = format!(
                    "Sandbox {name} upgrading by {}",
                    suo.metadata.name.as_deref().unwrap_or_default()
                );
                events.record(suo, EventType::Normal, "SandboxUpgrading", &message);
                info!(sandbox = %name, "upgrade started");
            }
            continue;
        }
        match action {
            UpdateOpsAction::AddFinalizer => {
                current
                    .metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(finalizers::SANDBOX_UPDATE_OPS.to_owned());
                current = store.update(&namespace, &current).await?;
            }
            UpdateOpsAction::RemoveFinalizer => {
                if let Some(list) = current.metadata.finalizers.as_mut() {
                    list.retain(|f| f != finalizers::SANDBOX_UPDATE_OPS);
                }
                match store.update(&namespace, &current).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => return Ok(Action::await_change()),
                    Err(error) => return Err(error.into()),
                }
            }
            UpdateOpsAction::UpdateStatus(status) => {
                let before = current.status.as_ref().and_then(|s| s.phase.clone());
                current.status = Some((**status).clone());
                current = store.update_status(&namespace, &current).await?;
                if before != status.phase {
                    let message = format!(
                        "phase {} total={} updated={} failed={} updating={}",
                        status.phase.as_ref().map_or("", SandboxUpdateOpsPhase::as_str),
                        status.replicas,
                        status.updated_replicas,
                        status.failed_replicas,
                        status.updating_replicas,
                    );
                    events.record(
                        &current,
                        EventType::Normal,
                        "SandboxUpdateOpsPhaseChanged",
                        &message,
                    );
                }
            }
            _ => {}
        }
    }
    Ok(plan.next_action())
}

/// What the reconciler reads: the store, the sandboxes and the other SandboxUpdateOps.
pub struct UpdateOpsContext<S: Store> {
    /// Where writes go.
    pub store: S,
    /// The sandboxes, kept by an informer.
    pub sandboxes: Cache<Sandbox>,
    /// The SandboxTemplates sandboxes refer to.
    pub templates: Cache<oka_api::SandboxTemplate>,
    /// The SandboxUpdateOps themselves (the controller's own cache).
    pub update_ops: Cache<SandboxUpdateOps>,
    /// Where Events go.
    pub events: EventRecorder,
    /// Where `now` comes from.
    pub clock: Clock,
}

impl<S: Store> std::fmt::Debug for UpdateOpsContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateOpsContext").finish_non_exhaustive()
    }
}

/// Reconciles one SandboxUpdateOps: observe, [`plan_update_ops`], [`execute`].
///
/// # Errors
///
/// [`UpdateOpsError`].
pub async fn reconcile_update_ops<S: Store>(
    suo: Arc<SandboxUpdateOps>,
    ctx: Arc<UpdateOpsContext<S>>,
) -> Result<Action, UpdateOpsError> {
    let namespace = suo.metadata.namespace.clone().unwrap_or_default();
    let name = suo.metadata.name.clone().unwrap_or_default();
    let others: Vec<Arc<SandboxUpdateOps>> = ctx
        .update_ops
        .list_namespace(&namespace)
        .into_iter()
        .filter(|o| o.metadata.name.as_deref() != Some(name.as_str()))
        .collect();
    let phase = |o: &SandboxUpdateOps| o.status.as_ref().and_then(|s| s.phase.clone());
    let active: Vec<String> = others
        .iter()
        .filter(|o| {
            matches!(
                phase(o),
                None | Some(SandboxUpdateOpsPhase::Pending | SandboxUpdateOpsPhase::Updating)
            )
        })
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    let other_updating = others.iter().any(|o| phase(o) == Some(SandboxUpdateOpsPhase::Updating));
    let sandboxes = ctx.sandboxes.list_namespace(&namespace);
    let templates: Templates = ctx
        .templates
        .list_namespace(&namespace)
        .iter()
        .filter_map(|t| Some((t.metadata.name.clone()?, t.spec.template.clone()?)))
        .collect();
    let _now: Timestamp = ctx.clock.now();
    let plan = plan_update_ops(&suo, &sandboxes, &templates, &active, other_updating)?;
    execute(&ctx.store, &ctx.events, &suo, &sandboxes, &plan).await
}

/// The error policy: an invalid SandboxUpdateOps waits for a change; store failures back off.
pub fn update_ops_error_policy<S: Store>(
    _suo: &SandboxUpdateOps,
    error: &UpdateOpsError,
    _ctx: &UpdateOpsContext<S>,
) -> Action {
    match error {
        UpdateOpsError::Invalid(_) => Action::await_change(),
        UpdateOpsError::Store(_) => Action::backoff(),
    }
}

/// Builds the controller: SandboxUpdateOps are the primary kind; a change of a sandbox
/// labelled `update-ops=<name>` wakes that SandboxUpdateOps.
pub fn update_ops_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
) -> (Controller<SandboxUpdateOps, S>, Arc<UpdateOpsContext<S>>) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let controller =
        Controller::<SandboxUpdateOps, S>::shared("sandboxupdateops", &informers, config.runner);
    let sandboxes = informers.all::<Sandbox>();
    let templates = informers.all::<oka_api::SandboxTemplate>();
    let ctx = Arc::new(UpdateOpsContext {
        store: store.clone(),
        sandboxes: sandboxes.cache(),
        templates: templates.cache(),
        update_ops: controller.cache(),
        events: EventRecorder::spawn(store, "sandboxupdateops-controller"),
        clock,
    });
    let controller =
        controller.watches_shared(templates, |_: &oka_api::SandboxTemplate| Vec::new());
    let controller = controller.watches_shared(sandboxes, |sandbox: &Sandbox| {
        let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
        label(sandbox, labels::UPDATE_OPS)
            .map(|name| vec![ObjectKey::new(&namespace, name)])
            .unwrap_or_default()
    });
    (controller, ctx)
}

/// Runs the SandboxUpdateOps controller until `shutdown` resolves.
pub async fn run_update_ops_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (controller, ctx) = update_ops_controller(informers, config, clock);
    controller.shutdown_on(shutdown).run(reconcile_update_ops, update_ops_error_policy, ctx).await;
}

#[cfg(test)]
mod tests;
