//! Placement: on a cluster whose sandboxes run on oka's node agents, which node runs a new
//! sandbox, and what happens to the sandboxes of a node that is lost.
//!
//! A sandbox is placed by writing the label [`labels::NODE_NAME`] (one update, before any node
//! sees it; each node agent watches only the sandboxes labelled with its name), and stays on
//! that node for life: its processes, memory and snapshots are there. The same update adds the
//! sandbox controller's finalizer, which the node would otherwise add in a write of its own.
//!
//! # Rules ([`place`], pure)
//!
//! 1. A sandbox created from a snapshot (`agents.kruise.io/restore-from`) goes where the
//!    snapshot is: the node of the Checkpoint whose `status.checkpointId` it names; it waits
//!    while that is unknown, and fails when that node is lost.
//! 2. A sandbox the Pod runtime runs ([`oka_api::runtime_choice`] with
//!    [`PlacementOptions::default_runtime`]) is not placed: the cluster's scheduler places its
//!    Pod. A Checkpoint of it (written by hand: the manager refuses snapshots of Pod sandboxes)
//!    is marked `Failed` at once ([`pod_checkpoint_refusal`]): no node agent will take it.
//! 3. Otherwise the candidates are the live nodes that are not `unschedulable`, whose labels
//!    match the pod template's `nodeSelector` and its required node affinity (the Kubernetes
//!    rules: terms ORed, expressions ANDed, `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`,
//!    `Lt`), and that have room: the sandboxes already placed there plus this one fit every
//!    capacity the node declares (`cpu` and `memory` by the containers' requests, else their
//!    limits; `sandboxes` by count).
//! 4. Among them the highest preferred-affinity weight wins, then the least allocated (the
//!    largest share of any capacity after placing, lowest first, so sandboxes spread), then the
//!    fewest sandboxes, then the name (so the result is deterministic).
//! 5. No candidate: the sandbox stays unplaced, with a reason in the scheduler's words
//!    (`0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match node selector`),
//!    and is tried again when nodes or sandboxes change.
//!
//! # Lost nodes
//!
//! A node is lost when its SandboxNode is gone, or its heartbeat has not changed for
//! [`PlacementOptions::node_lost_after`] as observed here (the time this process saw the last
//! change, never the node's own clock). Its sandboxes that have not ended fail (phase
//! `Failed`, reason [`REASON_NODE_LOST`]), so their pools replace them; a deleting sandbox of
//! a lost node has its finalizer removed (its instance is gone with the node, or is removed by
//! the node agent's re-adoption if the node comes back).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodTemplateSpec};
use oka_api::checkpoint::Checkpoint;
use oka_api::quantity::{self, Rounding};
use oka_api::runtime_choice::{SandboxRuntime, sandbox_runtime};
use oka_api::sandboxnode::{CAPACITY_SANDBOXES, SandboxNode};
use oka_api::{Sandbox, SandboxPhase, SandboxTemplate, annotations, finalizers, labels};
use oka_cache::{Action, Cache, Controller, Informers, ObjectKey};
use oka_store::{Store, StoreError};
use tracing::{info, warn};

use crate::Config;

/// The reason of a sandbox failed because its node was lost.
pub const REASON_NODE_LOST: &str = "NodeLost";

/// What a sandbox asks of its node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Demand {
    /// CPU in millicores (requests, else limits, summed over containers).
    pub cpu_millis: u64,
    /// Memory in bytes (likewise).
    pub memory_bytes: u64,
    /// The pod template's `nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The required node affinity's terms (ORed); empty: no requirement.
    pub required_terms: Vec<NodeSelectorTerm>,
    /// The preferred node affinity: (weight, term).
    pub preferred_terms: Vec<(i32, NodeSelectorTerm)>,
}

impl Demand {
    /// What `template`'s pod asks for. Quantities that do not parse count as zero (admission
    /// refuses them before they get here).
    pub fn of(template: Option<&PodTemplateSpec>) -> Self {
        let Some(pod) = template.and_then(|t| t.spec.as_ref()) else { return Self::default() };
        let mut demand = Self::default();
        for container in &pod.containers {
            let resources = container.resources.as_ref();
            let amount = |name: &str, scale: u128| -> u64 {
                let requests = resources.and_then(|r| r.requests.as_ref());
                let limits = resources.and_then(|r| r.limits.as_ref());
                let value = requests.and_then(|r| r.get(name)).or_else(|| limits?.get(name));
                value
                    .and_then(|q| quantity::parse(&q.0).ok())
                    .and_then(|a| a.scaled(scale, 1, Rounding::Up).ok())
                    .unwrap_or(0)
            };
            demand.cpu_millis = demand.cpu_millis.saturating_add(amount("cpu", 1000));
            demand.memory_bytes = demand.memory_bytes.saturating_add(amount("memory", 1));
        }
        demand.node_selector = pod.node_selector.clone().unwrap_or_default();
        let affinity = pod.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
        if let Some(required) =
            affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
        {
            demand.required_terms = required.node_selector_terms.clone();
        }
        if let Some(preferred) =
            affinity.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
        {
            demand.preferred_terms =
                preferred.iter().map(|p| (p.weight, p.preference.clone())).collect();
        }
        demand
    }
}

/// A node as placement sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    /// The SandboxNode's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its CPU capacity in millicores, if it declares one.
    pub cpu_millis: Option<u64>,
    /// Its memory capacity in bytes, if it declares one.
    pub memory_bytes: Option<u64>,
    /// The most sandboxes it runs, if it declares it.
    pub sandboxes: Option<u64>,
    /// No new sandbox goes there.
    pub unschedulable: bool,
    /// Alive: its heartbeat moved recently.
    pub live: bool,
}

impl NodeView {
    /// The view of `node` (`live` as the caller observed it).
    pub fn of(node: &SandboxNode, live: bool) -> Self {
        let capacity = |name: &str, scale: u128| {
            let q = node.spec.capacity.get(name)?;
            quantity::parse(&q.0).ok()?.scaled(scale, 1, Rounding::Down).ok()
        };
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            cpu_millis: capacity("cpu", 1000),
            memory_bytes: capacity("memory", 1),
            sandboxes: capacity(CAPACITY_SANDBOXES, 1),
            unschedulable: node.spec.unschedulable,
            live,
        }
    }
}

/// What is already placed on a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Millicores.
    pub cpu_millis: u64,
    /// Bytes.
    pub memory_bytes: u64,
    /// Sandboxes.
    pub sandboxes: u64,
}

impl Load {
    /// This load plus `demand`'s sandbox.
    fn plus(self, demand: &Demand) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_add(demand.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(demand.memory_bytes),
            sandboxes: self.sandboxes.saturating_add(1),
        }
    }
}

/// How much a node is preferred: preferred-affinity weight, then least allocated, then fewest
/// sandboxes (higher is better).
type Score = (i64, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>);

/// Why a sandbox cannot be placed now, in the scheduler's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unplaceable(pub String);

/// The node for a sandbox asking `demand` ([module rules](self) 2-4).
///
/// # Errors
///
/// [`Unplaceable`] when no node qualifies, saying how many nodes failed for which reason.
pub fn place(
    demand: &Demand,
    nodes: &[NodeView],
    loads: &HashMap<String, Load>,
) -> Result<String, Unplaceable> {
    let mut reasons: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut best: Option<(Score, &NodeView)> = None;
    for node in nodes {
        let load = loads.get(&node.name).copied().unwrap_or_default().plus(demand);
        let reason = if !node.live {
            Some("node(s) were lost")
        } else if node.unschedulable {
            Some("node(s) were unschedulable")
        } else if !selector_matches(&demand.node_selector, &node.labels)
            || !(demand.required_terms.is_empty()
                || demand.required_terms.iter().any(|t| term_matches(t, node)))
        {
            Some("node(s) didn't match Pod's node affinity/selector")
        } else if node.cpu_millis.is_some_and(|cap| load.cpu_millis > cap) {
            Some("Insufficient cpu")
        } else if node.memory_bytes.is_some_and(|cap| load.memory_bytes > cap) {
            Some("Insufficient memory")
        } else if node.sandboxes.is_some_and(|cap| load.sandboxes > cap) {
            Some("Too many sandboxes")
        } else {
            None
        };
        if let Some(reason) = reason {
            *reasons.entry(reason).or_default() += 1;
            continue;
        }
        let preferred: i64 = demand
            .preferred_terms
            .iter()
            .filter(|(_, term)| term_matches(term, node))
            .map(|(weight, _)| i64::from(*weight))
            .sum();
        // The largest share of a declared capacity after placing, in millionths.
        let share = |used: u64, cap: Option<u64>| match cap {
            Some(0) | None => 0,
            Some(cap) => {
                u64::try_from(u128::from(used) * 1_000_000 / u128::from(cap)).unwrap_or(u64::MAX)
            }
        };
        let allocated = share(load.cpu_millis, node.cpu_millis)
            .max(share(load.memory_bytes, node.memory_bytes))
            .max(share(load.sandboxes, node.sandboxes));
        let score = (preferred, std::cmp::Reverse(allocated), std::cmp::Reverse(load.sandboxes));
        let better = match &best {
            None => true,
            Some((best_score, best_node)) => {
                score > *best_score || (score == *best_score && node.name < best_node.name)
            }
        };
        if better {
            best = Some((score, node));
        }
    }
    match best {
        Some((_, node)) => Ok(node.name.clone()),
        None => {
            let detail: Vec<String> =
                reasons.iter().map(|(reason, n)| format!("{n} {reason}")).collect();
            let detail =
                if detail.is_empty() { String::new() } else { format!(": {}", detail.join(", ")) };
            Err(Unplaceable(format!("0/{} nodes are available{detail}", nodes.len())))
        }
    }
}

/// `nodeSelector`: every pair is among the labels.
fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A node selector term on `node`: every expression holds (an empty term matches nothing, as
/// Kubernetes'). Field expressions (`matchFields`) know `metadata.name`, the node's name.
fn term_matches(term: &NodeSelectorTerm, node: &NodeView) -> bool {
    let expressions = term.match_expressions.iter().flatten();
    let fields = term.match_fields.iter().flatten();
    if expressions.clone().next().is_none() && fields.clone().next().is_none() {
        return false;
    }
    expressions.clone().all(|e| requirement_matches(e, node.labels.get(&e.key)))
        && fields
            .clone()
            .all(|e| e.key == "metadata.name" && requirement_matches(e, Some(&node.name)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => match (value.and_then(|v| number(v)), values.first().and_then(|v| number(v))) {
            (Some(v), Some(bound)) => v > bound,
            _ => false,
        },
        "Lt" => match (value.and_then(|v| number(v)), values.first().and_then(|v| number(v))) {
            (Some(v), Some(bound)) => v < bound,
            _ => false,
        },
        _ => false,
    }
}

/// The node a sandbox is placed on, if it is.
pub fn node_of(sandbox: &Sandbox) -> Option<&str> {
    sandbox.metadata.labels.as_ref()?.get(labels::NODE_NAME).map(String::as_str)
}

/// Settings of the placement controller.
#[derive(Debug, Clone)]
pub struct PlacementOptions {
    /// The namespace node agents write their SandboxNodes in.
    pub node_namespace: String,
    /// How long a heartbeat may stand still before its node is lost.
    pub node_lost_after: Duration,
    /// The runtime of sandboxes neither annotated nor of the `oka-node` runtime class
    /// (`cluster.defaultRuntime`): only node-runtime sandboxes are placed
    /// ([`oka_api::runtime_choice`]); the Pod runtime's go to the cluster's scheduler.
    pub default_runtime: SandboxRuntime,
}

impl Default for PlacementOptions {
    /// SandboxNodes in `sandbox-system`; lost after the default grace; every sandbox on node
    /// agents.
    fn default() -> Self {
        Self {
            node_namespace: "sandbox-system".to_owned(),
            node_lost_after: Duration::from_secs(oka_api::sandboxnode::NODE_LOST_AFTER_SECONDS),
            default_runtime: SandboxRuntime::Node,
        }
    }
}

/// The heartbeats seen, and when each last changed here.
#[derive(Debug, Default)]
struct Heartbeats(Mutex<HashMap<String, (Option<String>, Instant)>>);

impl Heartbeats {
    fn observe(&self, node: &SandboxNode) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let beat =
            node.status.as_ref().and_then(|s| s.heartbeat_time.as_ref()).map(|t| t.0.to_string());
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.get(&name) {
            Some((last, _)) if *last == beat => {}
            _ => {
                seen.insert(name, (beat, Instant::now()));
            }
        }
    }

    fn live(&self, name: &str, lost_after: Duration) -> bool {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(name).is_some_and(|(_, at)| at.elapsed() < lost_after)
    }
}

/// What the placement reconciler reads.
pub struct PlacementContext<S: Store> {
    store: S,
    sandboxes: Cache<Sandbox>,
    nodes: Cache<SandboxNode>,
    templates: Cache<SandboxTemplate>,
    checkpoints: Cache<Checkpoint>,
    heartbeats: Arc<Heartbeats>,
    options: PlacementOptions,
    /// Placements written but maybe not yet seen in the cache, so a burst does not pile every
    /// sandbox on the node that was emptiest before it.
    pending: Mutex<HashMap<ObjectKey, (String, Load)>>,
    /// The sandboxes waiting for room, and why (to say it once).
    unplaceable: Mutex<HashMap<ObjectKey, String>>,
}

/// A failed placement step.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Index of sandboxes by node.
const BY_NODE: &str = "placement/node";
/// Index of Checkpoints by checkpoint ID.
const BY_CHECKPOINT_ID: &str = "placement/checkpoint-id";

impl<S: Store> PlacementContext<S> {
    fn live_nodes(&self) -> Vec<NodeView> {
        self.nodes
            .list_namespace(&self.options.node_namespace)
            .iter()
            .map(|node| {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                NodeView::of(node, self.heartbeats.live(name, self.options.node_lost_after))
            })
            .collect()
    }

    fn is_live(&self, node: &str) -> bool {
        self.nodes.get(&ObjectKey::new(&self.options.node_namespace, node)).is_some()
            && self.heartbeats.live(node, self.options.node_lost_after)
    }

    fn template_of(&self, sandbox: &Sandbox) -> Option<PodTemplateSpec> {
        template_in(&self.templates, sandbox)
    }

    /// Every node's load: the sandboxes placed there that have not ended, and the placements
    /// written but not yet seen.
    fn loads(&self) -> HashMap<String, Load> {
        let mut loads: HashMap<String, Load> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for sandbox in self.sandboxes.list() {
            let Some(node) = node_of(&sandbox) else { continue };
            seen.insert(ObjectKey::of(sandbox.as_ref()));
            if ended(&sandbox) {
                continue;
            }
            let demand = Demand::of(self.template_of(&sandbox).as_ref());
            let load = loads.entry(node.to_owned()).or_default();
            *load = Load {
                cpu_millis: load.cpu_millis.saturating_add(demand.cpu_millis),
                memory_bytes: load.memory_bytes.saturating_add(demand.memory_bytes),
                sandboxes: load.sandboxes + 1,
            };
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|key, _| !seen.contains(key));
        for (node, extra) in pending.values() {
            let load = loads.entry(node.clone()).or_default();
            load.cpu_millis = load.cpu_millis.saturating_add(extra.cpu_millis);
            load.memory_bytes = load.memory_bytes.saturating_add(extra.memory_bytes);
            load.sandboxes += 1;
        }
        loads
    }
}

/// The sandbox has ended (it holds no room).
fn ended(sandbox: &Sandbox) -> bool {
    matches!(
        sandbox.status.as_ref().and_then(|s| s.phase.as_ref()),
        Some(SandboxPhase::Failed | SandboxPhase::Succeeded)
    )
}

/// Places one sandbox, or fails / releases it when its node is lost.
pub async fn reconcile_placement<S: Store>(
    sandbox: Arc<Sandbox>,
    ctx: Arc<PlacementContext<S>>,
) -> Result<Action, PlacementError> {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    if let Some(node) = node_of(&sandbox) {
        if ctx.is_live(node) {
            return Ok(Action::await_change());
        }
        return node_lost(&ctx, &namespace, &name, &sandbox, node).await;
    }
    if sandbox.metadata.deletion_timestamp.is_some() || ended(&sandbox) {
        return Ok(Action::await_change());
    }
    let template = ctx.template_of(&sandbox);
    let demand = Demand::of(template.as_ref());
    let restore_from = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::RESTORE_FROM))
        .filter(|v| !v.is_empty());
    let chosen = match restore_from {
        Some(checkpoint_id) => {
            let found =
                ctx.checkpoints.by_index(BY_CHECKPOINT_ID, checkpoint_id).unwrap_or_default();
            let node = found
                .iter()
                .find_map(|c| c.metadata.labels.as_ref()?.get(labels::NODE_NAME).cloned());
            match node {
                Some(node) => node,
                None => {
                    info!(sandbox = %name, %checkpoint_id, "waiting for the snapshot's node");
                    return Ok(Action::requeue_after(Duration::from_secs(1)));
                }
            }
        }
        None => {
            if template.is_none() && sandbox.spec.template_ref.is_some() {
                // Its SandboxTemplate is not seen yet; a change of templates wakes it.
                return Ok(Action::await_change());
            }
            if sandbox_runtime(&sandbox, template.as_ref(), ctx.options.default_runtime)
                != SandboxRuntime::Node
            {
                // A Pod: the cluster's scheduler places it.
                return Ok(Action::await_change());
            }
            match place(&demand, &ctx.live_nodes(), &ctx.loads()) {
                Ok(node) => node,
                Err(Unplaceable(reason)) => {
                    // Said once per sandbox and reason; tried again as nodes and loads change.
                    let key = ObjectKey::of(sandbox.as_ref());
                    let mut told = ctx.unplaceable.lock().unwrap_or_else(PoisonError::into_inner);
                    if told.get(&key) != Some(&reason) {
                        warn!(sandbox = %name, %namespace, %reason, "cannot place the sandbox");
                        told.insert(key, reason);
                    }
                    return Ok(Action::requeue_after(Duration::from_secs(5)));
                }
            }
        }
    };
    let mut placed = (*sandbox).clone();
    placed
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::NODE_NAME.to_owned(), chosen.clone());
    // The node's sandbox controller would add its finalizer as its first write; the same
    // write as the placement saves one per sandbox (a lost node's placement removes it).
    let list = placed.metadata.finalizers.get_or_insert_default();
    if !list.iter().any(|f| f == finalizers::SANDBOX) {
        list.push(finalizers::SANDBOX.to_owned());
    }
    placed.status = None;
    let key = ObjectKey::of(sandbox.as_ref());
    let load =
        Load { cpu_millis: demand.cpu_millis, memory_bytes: demand.memory_bytes, sandboxes: 1 };
    ctx.pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key.clone(), (chosen.clone(), load));
    ctx.unplaceable.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
    match ctx.store.update(&namespace, &placed).await {
        Ok(_) => {
            info!(sandbox = %name, %namespace, node = %chosen, "placed");
            Ok(Action::await_change())
        }
        Err(error) => {
            ctx.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
            match error {
                StoreError::NotFound { .. } | StoreError::Conflict { .. } => {
                    Ok(Action::await_change())
                }
                other => Err(other.into()),
            }
        }
    }
}

/// The sandbox's node is lost: fail it (its pool replaces it), and let a deletion complete.
async fn node_lost<S: Store>(
    ctx: &PlacementContext<S>,
    namespace: &str,
    name: &str,
    sandbox: &Sandbox,
    node: &str,
) -> Result<Action, PlacementError> {
    let result = if sandbox.metadata.deletion_timestamp.is_some() {
        let mut released = sandbox.clone();
        let Some(list) = released.metadata.finalizers.as_mut() else {
            return Ok(Action::await_change());
        };
        if !list.iter().any(|f| f == finalizers::SANDBOX) {
            return Ok(Action::await_change());
        }
        list.retain(|f| f != finalizers::SANDBOX);
        warn!(sandbox = %name, %namespace, %node, "node lost: releasing the deleted sandbox");
        ctx.store.update(namespace, &released).await.map(drop)
    } else if !ended(sandbox) {
        let mut failed = sandbox.clone();
        let status = failed.status.get_or_insert_default();
        status.phase = Some(SandboxPhase::Failed);
        status.message = Some(format!("{REASON_NODE_LOST}: node {node} stopped reporting"));
        warn!(sandbox = %name, %namespace, %node, "node lost: the sandbox fails");
        ctx.store.update_status(namespace, &failed).await.map(drop)
    } else {
        return Ok(Action::await_change());
    };
    match result {
        Ok(()) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {
            Ok(Action::await_change())
        }
        Err(other) => Err(other.into()),
    }
}

/// Backoff on store errors.
pub fn placement_error_policy<S: Store>(
    _sandbox: &Sandbox,
    _error: &PlacementError,
    _ctx: &PlacementContext<S>,
) -> Action {
    Action::backoff()
}

/// The resolved pod template of `sandbox`: inline, else its SandboxTemplate's in `templates`.
fn template_in(templates: &Cache<SandboxTemplate>, sandbox: &Sandbox) -> Option<PodTemplateSpec> {
    if let Some(template) = &sandbox.spec.template {
        return Some(template.clone());
    }
    let reference = sandbox.spec.template_ref.as_ref()?;
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let template = templates.get(&ObjectKey::new(namespace, &reference.name))?;
    template.spec.template.clone()
}

/// What the Checkpoint placement reads: the sandboxes (by key) and their SandboxTemplates.
pub struct CheckpointPlacementContext<S: Store> {
    store: S,
    sandboxes: Cache<Sandbox>,
    templates: Cache<SandboxTemplate>,
    default_runtime: SandboxRuntime,
}

/// Why a Checkpoint of `sandbox` (resolved pod template `template`) cannot be taken: the
/// sandbox runs as a Pod, which no node agent checkpoints. `None` for a node-runtime sandbox.
pub fn pod_checkpoint_refusal(
    sandbox: &Sandbox,
    template: Option<&PodTemplateSpec>,
    default: SandboxRuntime,
) -> Option<String> {
    if sandbox_runtime(sandbox, template, default) != SandboxRuntime::Pod {
        return None;
    }
    Some(format!(
        "sandbox {} runs as a Pod: checkpoints need the node runtime (annotation {}: {})",
        sandbox.metadata.name.as_deref().unwrap_or_default(),
        oka_api::annotations::RUNTIME,
        oka_api::annotations::RUNTIME_NODE
    ))
}

/// Labels a Checkpoint with its sandbox's node, so that node's agent takes the snapshot (the
/// manager's Checkpoints carry the label from the start; this is for those written by hand).
/// A Checkpoint of a Pod-runtime sandbox is marked `Failed` at once, its message naming the
/// reason ([`pod_checkpoint_refusal`]), rather than waiting forever for a node.
pub async fn reconcile_checkpoint_placement<S: Store>(
    checkpoint: Arc<Checkpoint>,
    ctx: Arc<CheckpointPlacementContext<S>>,
) -> Result<Action, PlacementError> {
    let placed =
        checkpoint.metadata.labels.as_ref().is_some_and(|l| l.contains_key(labels::NODE_NAME));
    if placed || checkpoint.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = checkpoint.metadata.namespace.clone().unwrap_or_default();
    let sandbox_name = checkpoint.spec.sandbox_name.as_ref().or(checkpoint.spec.pod_name.as_ref());
    let Some(sandbox_name) = sandbox_name else { return Ok(Action::await_change()) };
    let sandbox = ctx.sandboxes.get(&ObjectKey::new(&namespace, sandbox_name));
    let ended = checkpoint.status.as_ref().and_then(|s| s.phase.as_ref()).is_some_and(|p| {
        matches!(p, oka_api::CheckpointPhase::Failed | oka_api::CheckpointPhase::Succeeded)
    });
    if let Some(sandbox) = &sandbox
        && !ended
    {
        let template = template_in(&ctx.templates, sandbox);
        let waiting_for_template = template.is_none() && sandbox.spec.template_ref.is_some();
        if let Some(message) = (!waiting_for_template)
            .then(|| pod_checkpoint_refusal(sandbox, template.as_ref(), ctx.default_runtime))
            .flatten()
        {
            let mut failed = (*checkpoint).clone();
            let status = failed.status.get_or_insert_default();
            status.phase = Some(oka_api::CheckpointPhase::Failed);
            status.message = Some(message);
            return match ctx.store.update_status(&namespace, &failed).await {
                Ok(_) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {
                    Ok(Action::await_change())
                }
                Err(other) => Err(other.into()),
            };
        }
    }
    let node = sandbox.and_then(|s| node_of(&s).map(str::to_owned));
    let Some(node) = node else {
        // The sandbox is not placed (or not seen) yet: its change wakes this Checkpoint.
        return Ok(Action::await_change());
    };
    let mut labelled = (*checkpoint).clone();
    labelled.metadata.labels.get_or_insert_default().insert(labels::NODE_NAME.to_owned(), node);
    labelled.status = None;
    match ctx.store.update(&namespace, &labelled).await {
        Ok(_) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {
            Ok(Action::await_change())
        }
        Err(other) => Err(other.into()),
    }
}

/// Runs the placement controller (Sandboxes, and Checkpoints written without a node) until
/// `shutdown` resolves.
pub async fn run_placement_controller<S: Store>(
    informers: impl Into<Informers<S>>,
    config: Config,
    options: PlacementOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let informers: Informers<S> = informers.into();
    let store = informers.store().clone();
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let checkpoints = Controller::<Checkpoint, S>::shared(
        "checkpoint-placement",
        &informers,
        config.runner.clone(),
    );
    let sandbox_informer = informers.all::<Sandbox>();
    let checkpoint_ctx = Arc::new(CheckpointPlacementContext {
        store: store.clone(),
        sandboxes: sandbox_informer.cache(),
        templates: informers.all::<SandboxTemplate>().cache(),
        default_runtime: options.default_runtime,
    });
    let by_sandbox = checkpoints.cache();
    let checkpoints = checkpoints
        .watches_shared(sandbox_informer, move |sandbox: &Sandbox| {
            let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
            let name = sandbox.metadata.name.as_deref().unwrap_or_default();
            by_sandbox
                .list_namespace(namespace)
                .iter()
                .filter(|c| {
                    c.spec.sandbox_name.as_deref().or(c.spec.pod_name.as_deref()) == Some(name)
                })
                .map(|c| ObjectKey::of(c.as_ref()))
                .collect()
        })
        .shutdown_on(shutdown.clone())
        .run(
            reconcile_checkpoint_placement,
            |_: &Checkpoint, _: &PlacementError, _: &CheckpointPlacementContext<S>| {
                Action::backoff()
            },
            checkpoint_ctx,
        );
    let sandboxes = run_sandbox_placement(&informers, config, options, shutdown);
    futures::join!(checkpoints, sandboxes);
}

async fn run_sandbox_placement<S: Store>(
    informers: &Informers<S>,
    config: Config,
    options: PlacementOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let store = informers.store().clone();
    let controller = Controller::<Sandbox, S>::shared("placement", informers, config.runner);
    let sandboxes = controller.cache();
    // The caches are shared: taken already means by another placement controller over the
    // same informers, with the same function.
    let _ = sandboxes
        .add_index(BY_NODE, |s: &Sandbox| node_of(s).map(str::to_owned).into_iter().collect());
    let node_watch = oka_cache::WatchConfig {
        namespace: Some(options.node_namespace.clone()),
        ..oka_cache::WatchConfig::default()
    };
    let nodes_informer = informers.informer::<SandboxNode>(node_watch);
    let heartbeats = Arc::new(Heartbeats::default());
    nodes_informer.on_change({
        let heartbeats = Arc::clone(&heartbeats);
        move |change| {
            for node in change.objects() {
                heartbeats.observe(node);
            }
        }
    });
    let nodes = nodes_informer.cache();
    let templates = informers.all::<SandboxTemplate>();
    let checkpoints = informers.all::<Checkpoint>();
    let _ = checkpoints.cache().add_index(BY_CHECKPOINT_ID, |c: &Checkpoint| {
        c.status.as_ref().and_then(|s| s.checkpoint_id.clone()).into_iter().collect()
    });
    let ctx = Arc::new(PlacementContext {
        store: store.clone(),
        sandboxes: sandboxes.clone(),
        nodes: nodes.clone(),
        templates: templates.cache(),
        checkpoints: checkpoints.cache(),
        heartbeats: Arc::clone(&heartbeats),
        options: options.clone(),
        pending: Mutex::new(HashMap::new()),
        unplaceable: Mutex::new(HashMap::new()),
    });
    // A node change wakes the sandboxes waiting for room (unplaced) and the node's own.
    let unplaced = |sandboxes: &Cache<Sandbox>| -> Vec<ObjectKey> {
        sandboxes
            .list()
            .iter()
            .filter(|s| node_of(s).is_none())
            .map(|s| ObjectKey::of(s.as_ref()))
            .collect()
    };
    let on_node = {
        let sandboxes = sandboxes.clone();
        move |node: &SandboxNode| {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let mut keys = sandboxes.index_keys(BY_NODE, name).unwrap_or_default();
            keys.extend(unplaced(&sandboxes));
            keys
        }
    };
    let on_template = {
        let sandboxes = sandboxes.clone();
        move |_: &SandboxTemplate| unplaced(&sandboxes)
    };
    let on_checkpoint = {
        let sandboxes = sandboxes.clone();
        move |_: &Checkpoint| unplaced(&sandboxes)
    };
    // Lost nodes: every few seconds, the sandboxes of nodes that stopped beating.
    let lost = lost_node_sandboxes(Arc::clone(&ctx), sandboxes.clone());
    let forget = Arc::clone(&ctx);
    controller
        .watches_shared(nodes_informer, on_node)
        .watches_shared(templates, on_template)
        .watches_shared(checkpoints, on_checkpoint)
        .reconcile_on(lost)
        .on_delete(move |sandbox: &Sandbox| {
            let key = ObjectKey::of(sandbox);
            forget.unplaceable.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
            forget.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        })
        .shutdown_on(shutdown)
        .run(reconcile_placement, placement_error_policy, ctx)
        .await;
}

/// The keys of the sandboxes on nodes found lost, checked every second; each node once per
/// loss.
fn lost_node_sandboxes<S: Store>(
    ctx: Arc<PlacementContext<S>>,
    sandboxes: Cache<Sandbox>,
) -> impl futures::Stream<Item = ObjectKey> + Send + 'static {
    let state =
        (ctx, sandboxes, std::collections::HashSet::<String>::new(), Vec::<ObjectKey>::new());
    futures::stream::unfold(state, |(ctx, sandboxes, mut lost, mut pending)| async move {
        loop {
            if let Some(key) = pending.pop() {
                return Some((key, (ctx, sandboxes, lost, pending)));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut names: Vec<String> = Vec::new();
            for sandbox in sandboxes.list() {
                if let Some(node) = node_of(&sandbox)
                    && !names.iter().any(|n| n == node)
                {
                    names.push(node.to_owned());
                }
            }
            for name in names {
                let live = ctx.is_live(&name);
                if live {
                    lost.remove(&name);
                } else if lost.insert(name.clone()) {
                    warn!(node = %name, "node lost: failing its sandboxes");
                    pending.extend(sandboxes.index_keys(BY_NODE, &name).unwrap_or_default());
                }
            }
        }
    })
}

#[cfg(test)]
mod tests;
