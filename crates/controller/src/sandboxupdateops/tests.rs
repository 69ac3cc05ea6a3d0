//! Planner tests of the SandboxUpdateOps controller.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::json;

fn suo(max_unavailable: Option<IntOrString>) -> SandboxUpdateOps {
    serde_json::from_value(json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxUpdateOps",
        "metadata": {"name": "up", "namespace": "default", "generation": 1,
                     "finalizers": [finalizers::SANDBOX_UPDATE_OPS]},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "patch": {"spec": {"containers": [{"name": "main", "image": "app:2"}]}},
            "updateStrategy": {"maxUnavailable": max_unavailable},
        },
    }))
    .unwrap()
}

fn sandbox(name: &str, phase: &str, image: &str) -> Sandbox {
    serde_json::from_value(json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name, "namespace": "default", "generation": 1,
                     "labels": {"app": "agent"}},
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": image}]}}},
        "status": {"phase": phase, "observedGeneration": 1},
    }))
    .unwrap()
}

fn upgrading(mut s: Sandbox, status: &str, reason: &str) -> Sandbox {
    s.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(labels::UPDATE_OPS.into(), "up".into());
    let conditions =
        s.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
    conditions.push(Condition {
        type_: UPGRADING.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    });
    s
}

fn names(plan: &Plan<UpdateOpsAction>) -> Vec<String> {
    plan.actions
        .iter()
        .map(|a| match a {
            UpdateOpsAction::Start { name, template } => {
                format!("start {name}{}", if template.is_some() { "" } else { " (resume first)" })
            }
            UpdateOpsAction::UpdateStatus(s) => format!(
                "status {} {}/{}/{}/{}",
                s.phase.as_ref().map_or("", SandboxUpdateOpsPhase::as_str),
                s.replicas,
                s.updated_replicas,
                s.updating_replicas,
                s.failed_replicas
            ),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn candidates_start_within_the_budget_in_name_order() {
    let boxes: Vec<Arc<Sandbox>> =
        ["c", "a", "b"].iter().map(|n| Arc::new(sandbox(n, "Running", "app:1"))).collect();
    let plan =
        plan_update_ops(&suo(Some(IntOrString::Int(2))), &boxes, &Templates::new(), &[], false)
            .unwrap();
    assert_eq!(names(&plan), ["start a", "start b", "status Updating 3/0/2/0"]);
    let started = sandbox_after(&suo(None), &boxes[1], &plan.actions[0]).unwrap();
    assert_eq!(
        started.spec.template.unwrap().spec.unwrap().containers[0].image.as_deref(),
        Some("app:2")
    );
    assert_eq!(started.spec.upgrade_policy.unwrap().type_, Some(UpgradePolicyType::Recreate));
    assert_eq!(started.metadata.labels.unwrap()[labels::UPDATE_OPS], "up");
}

#[test]
fn failures_use_the_budget_and_the_end_is_failed_or_completed() {
    let failed = upgrading(
        sandbox("a", "Upgrading", "app:2"),
        "False",
        upgrading_reason::UPGRADE_POD_FAILED,
    );
    let boxes = vec![Arc::new(failed), Arc::new(sandbox("b", "Running", "app:1"))];
    // One failed, budget 1: nothing more starts.
    let plan = plan_update_ops(&suo(None), &boxes, &Templates::new(), &[], false).unwrap();
    assert_eq!(names(&plan), ["MarkFailed(\"a\")", "status Updating 2/0/0/1"]);
    let done = upgrading(sandbox("b", "Running", "app:2"), "True", upgrading_reason::SUCCEEDED);
    let boxes = vec![boxes[0].clone(), Arc::new(done)];
    let plan = plan_update_ops(&suo(None), &boxes, &Templates::new(), &[], false).unwrap();
    assert!(names(&plan).contains(&"status Failed 2/1/0/1".to_owned()), "{:?}", names(&plan));
}

#[test]
fn what_is_not_ours_to_upgrade_is_left_alone() {
    let mut pool_member = sandbox("p", "Running", "app:1");
    pool_member.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet", "name": "pool",
            "uid": "u", "controller": true
        }))
        .unwrap(),
    ]);
    let mut other = sandbox("o", "Running", "app:1");
    other
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(labels::UPDATE_OPS.into(), "other".into());
    let current = sandbox("u", "Running", "app:2");
    let paused = sandbox("z", "Paused", "app:1");
    let boxes: Vec<Arc<Sandbox>> =
        [pool_member, other, current, paused].into_iter().map(Arc::new).collect();
    let plan = plan_update_ops(&suo(None), &boxes, &Templates::new(), &["other".to_owned()], false)
        .unwrap();
    assert_eq!(names(&plan), ["status Completed 0/0/0/0"]);
}

#[test]
fn another_updating_one_goes_first_and_deletion_releases() {
    let boxes = vec![Arc::new(sandbox("a", "Running", "app:1"))];
    let plan = plan_update_ops(&suo(None), &boxes, &Templates::new(), &[], true).unwrap();
    assert!(plan.actions.is_empty());
    let mut deleting = suo(None);
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let done = upgrading(sandbox("a", "Running", "app:2"), "True", upgrading_reason::SUCCEEDED);
    let plan =
        plan_update_ops(&deleting, &[Arc::new(done)], &Templates::new(), &[], false).unwrap();
    assert_eq!(
        plan.actions,
        [
            UpdateOpsAction::Release { name: "a".into(), clear_policy: true },
            UpdateOpsAction::RemoveFinalizer
        ]
    );
}

#[test]
fn a_sandbox_on_a_sandbox_template_gets_the_patched_template_as_its_own() {
    let mut on_ref = sandbox("r", "Running", "unused");
    on_ref.spec.template = None;
    on_ref.spec.template_ref =
        Some(oka_api::common::SandboxTemplateRef { name: "base".into(), ..Default::default() });
    let base: PodTemplateSpec = serde_json::from_value(
        json!({"spec": {"containers": [{"name": "main", "image": "app:1", "command": ["sleep", "9"]}]}}),
    )
    .unwrap();
    let templates = Templates::from([("base".to_owned(), base)]);
    let boxes = vec![Arc::new(on_ref)];
    let plan = plan_update_ops(&suo(None), &boxes, &templates, &[], false).unwrap();
    assert_eq!(names(&plan), ["start r", "status Updating 1/0/1/0"]);
    let started = sandbox_after(&suo(None), &boxes[0], &plan.actions[0]).unwrap();
    assert!(started.spec.template_ref.is_none());
    let container = &started.spec.template.unwrap().spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("app:2"));
    assert_eq!(container.command.as_deref(), Some(&["sleep".to_owned(), "9".to_owned()][..]));
}

#[test]
fn budgets_round_up_and_never_drop_below_one() {
    assert_eq!(budget(None, 10), 1);
    assert_eq!(budget(Some(&IntOrString::String("25%".into())), 10), 3);
    assert_eq!(budget(Some(&IntOrString::Int(0)), 10), 1);
    assert_eq!(budget(Some(&IntOrString::String("0%".into())), 10), 1);
}

proptest::proptest! {
    /// Whatever the sandboxes, never more upgrading or failed than the budget allows once
    /// the plan is applied.
    #[test]
    fn the_budget_is_never_exceeded(
        states in proptest::collection::vec(0u8..4, 0..20),
        max in 1i32..5,
    ) {
        let boxes: Vec<Arc<Sandbox>> = states.iter().enumerate().map(|(i, s)| {
            let b = sandbox(&format!("s{i:02}"), "Running", "app:1");
            Arc::new(match s {
                0 => b,
                1 => upgrading(sandbox(&format!("s{i:02}"), "Upgrading", "app:2"), "False", upgrading_reason::UPGRADE_POD),
                2 => upgrading(sandbox(&format!("s{i:02}"), "Upgrading", "app:2"), "False", upgrading_reason::UPGRADE_POD_FAILED),
                _ => upgrading(sandbox(&format!("s{i:02}"), "Running", "app:2"), "True", upgrading_reason::SUCCEEDED),
            })
        }).collect();
        let busy = states.iter().filter(|s| **s == 1 || **s == 2).count();
        let plan = plan_update_ops(&suo(Some(IntOrString::Int(max))), &boxes, &Templates::new(), &[], false).unwrap();
        let started = plan.actions.iter().filter(|a| matches!(a, UpdateOpsAction::Start { .. })).count();
        let max = usize::try_from(max).unwrap();
        proptest::prop_assert!(started == 0 || busy + started <= max);
    }
}
