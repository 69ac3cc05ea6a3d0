//! The placement rules, pure: [`place`] over node views and loads.

use super::*;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, PreferredSchedulingTerm, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn node(name: &str, labels: &[(&str, &str)]) -> NodeView {
    NodeView {
        name: name.to_owned(),
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        cpu_millis: Some(4000),
        memory_bytes: Some(8 << 30),
        sandboxes: Some(100),
        unschedulable: false,
        live: true,
    }
}

fn demand(cpu: u64, memory: u64) -> Demand {
    Demand { cpu_millis: cpu, memory_bytes: memory, ..Demand::default() }
}

fn loads(entries: &[(&str, u64, u64, u64)]) -> HashMap<String, Load> {
    entries
        .iter()
        .map(|(n, cpu, mem, count)| {
            ((*n).to_owned(), Load { cpu_millis: *cpu, memory_bytes: *mem, sandboxes: *count })
        })
        .collect()
}

fn term(key: &str, operator: &str, values: &[&str]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        }]),
        match_fields: None,
    }
}

#[test]
fn sandboxes_spread_to_the_least_allocated_node() {
    let nodes = [node("a", &[]), node("b", &[])];
    let busy = loads(&[("a", 2000, 0, 2), ("b", 500, 0, 1)]);
    assert_eq!(place(&demand(500, 0), &nodes, &busy).unwrap(), "b");
    // Equal load: the fewest sandboxes, then the name.
    assert_eq!(place(&demand(0, 0), &nodes, &HashMap::new()).unwrap(), "a");
    let count = loads(&[("a", 0, 0, 3), ("b", 0, 0, 1)]);
    assert_eq!(place(&demand(0, 0), &nodes, &count).unwrap(), "b");
}

#[test]
fn a_node_without_room_is_skipped_and_no_room_anywhere_says_why() {
    let nodes = [node("a", &[]), node("b", &[])];
    let full = loads(&[("a", 3900, 0, 1), ("b", 0, 8 << 30, 1)]);
    let error = place(&demand(200, 1), &nodes, &full).unwrap_err();
    assert_eq!(error.0, "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient memory");
    assert_eq!(place(&demand(100, 0), &nodes, &loads(&[("b", 0, 8 << 30, 1)])).unwrap(), "a");
    let mut small = node("c", &[]);
    small.sandboxes = Some(1);
    let one = loads(&[("c", 0, 0, 1)]);
    assert_eq!(
        place(&demand(0, 0), &[small], &one).unwrap_err().0,
        "0/1 nodes are available: 1 Too many sandboxes"
    );
}

#[test]
fn undeclared_capacity_is_not_limited() {
    let mut open = node("a", &[]);
    open.cpu_millis = None;
    open.memory_bytes = None;
    open.sandboxes = None;
    assert_eq!(place(&demand(1_000_000, 1 << 50), &[open], &HashMap::new()).unwrap(), "a");
}

#[test]
fn lost_and_unschedulable_nodes_take_nothing() {
    let mut lost = node("a", &[]);
    lost.live = false;
    let mut cordoned = node("b", &[]);
    cordoned.unschedulable = true;
    let error = place(&demand(0, 0), &[lost, cordoned.clone()], &HashMap::new()).unwrap_err();
    assert_eq!(
        error.0,
        "0/2 nodes are available: 1 node(s) were lost, 1 node(s) were unschedulable"
    );
    assert_eq!(
        place(&demand(0, 0), &[], &HashMap::new()).unwrap_err().0,
        "0/0 nodes are available"
    );
    cordoned.unschedulable = false;
    assert_eq!(place(&demand(0, 0), &[cordoned], &HashMap::new()).unwrap(), "b");
}

#[test]
fn node_selector_and_required_affinity_are_honoured() {
    let nodes = [node("a", &[("zone", "x"), ("gpu", "yes")]), node("b", &[("zone", "y")])];
    let mut wants = demand(0, 0);
    wants.node_selector.insert("zone".into(), "y".into());
    assert_eq!(place(&wants, &nodes, &HashMap::new()).unwrap(), "b");
    wants.node_selector.insert("gpu".into(), "yes".into());
    assert_eq!(
        place(&wants, &nodes, &HashMap::new()).unwrap_err().0,
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector"
    );

    let mut affinity = demand(0, 0);
    affinity.required_terms = vec![term("gpu", "Exists", &[])];
    assert_eq!(place(&affinity, &nodes, &HashMap::new()).unwrap(), "a");
    // Terms are ORed.
    affinity.required_terms = vec![term("zone", "In", &["nowhere"]), term("zone", "NotIn", &["x"])];
    assert_eq!(place(&affinity, &nodes, &HashMap::new()).unwrap(), "b");
    affinity.required_terms = vec![term("gpu", "DoesNotExist", &[])];
    assert_eq!(place(&affinity, &nodes, &HashMap::new()).unwrap(), "b");
    // An empty term matches nothing.
    affinity.required_terms = vec![NodeSelectorTerm::default()];
    assert!(place(&affinity, &nodes, &HashMap::new()).is_err());
}

#[test]
fn gt_and_lt_compare_integers() {
    let nodes = [node("small", &[("cores", "4")]), node("big", &[("cores", "64")])];
    let mut wants = demand(0, 0);
    wants.required_terms = vec![term("cores", "Gt", &["8"])];
    assert_eq!(place(&wants, &nodes, &HashMap::new()).unwrap(), "big");
    wants.required_terms = vec![term("cores", "Lt", &["8"])];
    assert_eq!(place(&wants, &nodes, &HashMap::new()).unwrap(), "small");
    wants.required_terms = vec![term("cores", "Gt", &["many"])];
    assert!(place(&wants, &nodes, &HashMap::new()).is_err());
}

#[test]
fn preferred_affinity_outweighs_spreading() {
    let nodes = [node("a", &[("disk", "ssd")]), node("b", &[])];
    let mut wants = demand(100, 0);
    wants.preferred_terms = vec![(10, term("disk", "In", &["ssd"]))];
    let busy = loads(&[("a", 3000, 0, 5)]);
    assert_eq!(place(&wants, &nodes, &busy).unwrap(), "a");
}

#[test]
fn demand_reads_requests_else_limits_summed_over_containers() {
    let resources = |requests: &[(&str, &str)], limits: &[(&str, &str)]| {
        let map = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect()
            })
        };
        Some(ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        })
    };
    let template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![
                Container {
                    name: "a".into(),
                    resources: resources(&[("cpu", "250m")], &[("cpu", "1"), ("memory", "1Gi")]),
                    ..Container::default()
                },
                Container {
                    name: "b".into(),
                    resources: resources(&[], &[("cpu", "0.5"), ("memory", "512Mi")]),
                    ..Container::default()
                },
            ],
            node_selector: Some([("zone".to_owned(), "x".to_owned())].into()),
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![term("gpu", "Exists", &[])],
                    }),
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        PreferredSchedulingTerm {
                            weight: 5,
                            preference: term("ssd", "Exists", &[]),
                        },
                    ]),
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        }),
    };
    let demand = Demand::of(Some(&template));
    assert_eq!(demand.cpu_millis, 750);
    assert_eq!(demand.memory_bytes, (1 << 30) + (512 << 20));
    assert_eq!(demand.node_selector.get("zone").map(String::as_str), Some("x"));
    assert_eq!(demand.required_terms.len(), 1);
    assert_eq!(demand.preferred_terms[0].0, 5);
    assert_eq!(Demand::of(None), Demand::default());
}

#[test]
fn a_node_view_reads_its_capacity() {
    let mut sandbox_node = SandboxNode::new(
        "n1",
        oka_api::SandboxNodeSpec { relay_address: "10.0.0.1:4990".into(), ..Default::default() },
    );
    sandbox_node.spec.capacity.insert("cpu".into(), Quantity("3500m".into()));
    sandbox_node.spec.capacity.insert("memory".into(), Quantity("2Gi".into()));
    sandbox_node.spec.capacity.insert("sandboxes".into(), Quantity("50".into()));
    let view = NodeView::of(&sandbox_node, true);
    assert_eq!(view.cpu_millis, Some(3500));
    assert_eq!(view.memory_bytes, Some(2 << 30));
    assert_eq!(view.sandboxes, Some(50));
    assert!(view.live);
}

/// A placement context over an embedded store with one live, empty node `n1`.
fn context(
    dir: &std::path::Path,
    default_runtime: SandboxRuntime,
) -> (Arc<PlacementContext<oka_store::embedded::EmbeddedStore>>, oka_store::embedded::EmbeddedStore)
{
    let store = oka_store::embedded::EmbeddedStore::open(
        &dir.join("store.redb"),
        oka_store::embedded::EmbeddedOptions::default(),
    )
    .unwrap();
    let nodes = Cache::default();
    let mut n1 = SandboxNode::new("n1", oka_api::sandboxnode::SandboxNodeSpec::default());
    n1.metadata.namespace = Some("sandbox-system".into());
    n1.metadata.resource_version = Some("1".into());
    nodes.apply(Arc::new(n1.clone()));
    let heartbeats = Arc::new(Heartbeats::default());
    heartbeats.observe(&n1);
    let ctx = PlacementContext {
        store: store.clone(),
        sandboxes: Cache::default(),
        nodes,
        templates: Cache::default(),
        checkpoints: Cache::default(),
        heartbeats,
        options: PlacementOptions { default_runtime, ..PlacementOptions::default() },
        pending: Mutex::new(HashMap::new()),
        unplaceable: Mutex::new(HashMap::new()),
    };
    (Arc::new(ctx), store)
}

fn unplaced_sandbox(runtime_class: Option<&str>) -> Sandbox {
    let mut s = Sandbox::new(
        "s1",
        oka_api::SandboxSpec {
            template: Some(PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    runtime_class_name: runtime_class.map(str::to_owned),
                    containers: vec![Container { name: "c".into(), ..Container::default() }],
                    ..PodSpec::default()
                }),
            }),
            ..oka_api::SandboxSpec::default()
        },
    );
    s.metadata.namespace = Some("default".into());
    s
}

#[tokio::test]
async fn only_node_runtime_sandboxes_are_placed() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, store) = context(dir.path(), SandboxRuntime::Pod);
    // A Pod-runtime sandbox is left to the cluster's scheduler: no label.
    let pod_one = store.create("default", &unplaced_sandbox(None)).await.unwrap();
    reconcile_placement(Arc::new(pod_one), Arc::clone(&ctx)).await.unwrap();
    let seen: Sandbox = store.get("default", "s1").await.unwrap();
    assert_eq!(node_of(&seen), None);
    // The oka-node runtime class is the node agent's: placed on n1.
    store.delete::<Sandbox>("default", "s1", &oka_store::Preconditions::default()).await.unwrap();
    let node_one = store.create("default", &unplaced_sandbox(Some("oka-node"))).await.unwrap();
    reconcile_placement(Arc::new(node_one), Arc::clone(&ctx)).await.unwrap();
    let seen: Sandbox = store.get("default", "s1").await.unwrap();
    assert_eq!(node_of(&seen), Some("n1"));
}

#[tokio::test]
async fn a_checkpoint_of_a_pod_sandbox_fails_at_once_and_one_of_a_node_sandbox_is_placed() {
    let dir = tempfile::tempdir().unwrap();
    let store = oka_store::embedded::EmbeddedStore::open(
        &dir.path().join("store.redb"),
        oka_store::embedded::EmbeddedOptions::default(),
    )
    .unwrap();
    let sandboxes = Cache::default();
    let ctx = Arc::new(CheckpointPlacementContext {
        store: store.clone(),
        sandboxes: sandboxes.clone(),
        templates: Cache::default(),
        default_runtime: SandboxRuntime::Pod,
    });
    let checkpoint_of = |name: &str| {
        let mut c = Checkpoint::new(
            name,
            oka_api::CheckpointSpec {
                sandbox_name: Some("s1".into()),
                ..oka_api::CheckpointSpec::default()
            },
        );
        c.metadata.namespace = Some("default".into());
        c
    };
    // A Pod sandbox (the default runtime): Failed, the message naming why and the way out.
    let mut pod_sandbox = unplaced_sandbox(None);
    pod_sandbox.metadata.resource_version = Some("1".into());
    sandboxes.apply(Arc::new(pod_sandbox));
    let created = store.create("default", &checkpoint_of("c1")).await.unwrap();
    reconcile_checkpoint_placement(Arc::new(created), Arc::clone(&ctx)).await.unwrap();
    let seen: Checkpoint = store.get("default", "c1").await.unwrap();
    let status = seen.status.unwrap();
    assert_eq!(status.phase, Some(oka_api::CheckpointPhase::Failed));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "sandbox s1 runs as a Pod: checkpoints need the node runtime (annotation agents.kruise.io/runtime: node)"
        )
    );
    assert!(seen.metadata.labels.is_none_or(|l| !l.contains_key(labels::NODE_NAME)));
    // A node-runtime sandbox on n1: the Checkpoint is labelled with its node.
    let mut node_sandbox = unplaced_sandbox(Some("oka-node"));
    node_sandbox.metadata.resource_version = Some("2".into());
    node_sandbox.metadata.labels = Some([(labels::NODE_NAME.to_owned(), "n1".to_owned())].into());
    sandboxes.apply(Arc::new(node_sandbox));
    let created = store.create("default", &checkpoint_of("c2")).await.unwrap();
    reconcile_checkpoint_placement(Arc::new(created), Arc::clone(&ctx)).await.unwrap();
    let seen: Checkpoint = store.get("default", "c2").await.unwrap();
    assert_eq!(seen.metadata.labels.unwrap()[labels::NODE_NAME], "n1");
    assert!(seen.status.is_none_or(|s| s.phase != Some(oka_api::CheckpointPhase::Failed)));
}
