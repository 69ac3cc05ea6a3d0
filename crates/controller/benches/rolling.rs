//! A rolling update of a 1,000-sandbox pool at `maxUnavailable: 20%`, driven through the pure
//! pool planner over a simulated store: reconciles needed, planner time, and the most members
//! unavailable (creating) at once.
//!
//! Each reconcile plans, applies the plan to the simulated store (creates get a name and start
//! creating, deletes remove), then a start time passes: every member created in an earlier
//! reconcile becomes available (a member started in this reconcile is still creating when the
//! next one runs, as when a start takes longer than the debounce). Wall time on a real pool
//! is the number of start waits times a sandbox's start (create → ready, see the runtime
//! figures).
//!
//! Run with `cargo bench -p oka-controller --bench rolling`.

// A bench binary reports by printing and fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::{
    Sandbox, SandboxPhase, SandboxSet, SandboxSetSpec, SandboxState, labels, sandbox_state,
};
use oka_controller::sandboxset::{SetAction, plan_sandbox_set};

const REPLICAS: usize = 1_000;

fn template(image: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some(image.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    }
}

fn available(mut sandbox: Sandbox, name: &str, second: i64) -> Arc<Sandbox> {
    sandbox.metadata.name = Some(name.into());
    sandbox.metadata.uid = Some(format!("{name}-uid"));
    sandbox.metadata.creation_timestamp =
        Some(Time(Timestamp::from_second(1_700_000_000 + second).unwrap()));
    let ready = Sandbox::test().phase(SandboxPhase::Running).ready().build();
    sandbox.status = ready.status;
    Arc::new(sandbox)
}

fn main() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let mut set = SandboxSet::new(
        "pool",
        SandboxSetSpec {
            replicas: REPLICAS as i32,
            template: Some(template("old:1")),
            ..Default::default()
        },
    );
    set.metadata.namespace = Some("default".into());
    set.metadata.uid = Some("pool-uid".into());

    // The pool at the old revision, all available.
    let old = plan_sandbox_set(&set, &[], None, now).unwrap();
    let mut sandboxes: Vec<Arc<Sandbox>> = Vec::new();
    let mut next = 0;
    for action in &old.actions {
        if let SetAction::Create(sandbox) = action {
            next += 1;
            sandboxes.push(available((**sandbox).clone(), &format!("s{next}"), next));
        }
    }
    // Ten claimed sandboxes of the old revision, which must survive.
    for sandbox in sandboxes.iter_mut().take(10) {
        let mut claimed = (**sandbox).clone();
        claimed.metadata.owner_references = None;
        claimed
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::SANDBOX_CLAIMED.into(), labels::TRUE.into());
        *sandbox = Arc::new(claimed);
    }
    for i in 0..10 {
        next += 1;
        let sandbox = (*sandboxes[10 + i]).clone();
        sandboxes.push(available(sandbox, &format!("s{next}"), next));
    }
    let claimed: Vec<Arc<Sandbox>> = sandboxes[..10].to_vec();

    // The template changes.
    set.spec.template = Some(template("new:2"));
    let mut reconciles = 0;
    let mut start_waits = 0;
    let mut planning = Duration::ZERO;
    let mut most_unavailable = 0;
    let mut created = 0;
    let mut deleted = 0;
    loop {
        let started = Instant::now();
        let plan = plan_sandbox_set(&set, &sandboxes, None, now).unwrap();
        planning += started.elapsed();
        reconciles += 1;
        let mut changed = false;
        let mut fresh = Vec::new();
        for action in &plan.actions {
            match action {
                SetAction::Create(sandbox) => {
                    next += 1;
                    let mut sandbox = (**sandbox).clone();
                    sandbox.metadata.name = Some(format!("s{next}"));
                    sandbox.metadata.uid = Some(format!("s{next}-uid"));
                    fresh.push(Arc::new(sandbox));
                    created += 1;
                    changed = true;
                }
                SetAction::ScaleDown(gone)
                | SetAction::DeleteDead(gone)
                | SetAction::RollingDelete(gone) => {
                    sandboxes.retain(|s| s.metadata.name != gone.metadata.name);
                    deleted += 1;
                    changed = true;
                }
                SetAction::UpdateStatus(status) => set.status = Some((**status).clone()),
            }
        }
        sandboxes.extend(fresh);
        let unavailable = sandboxes
            .iter()
            .filter(|s| sandbox_state(s, now).state == SandboxState::Creating)
            .count();
        most_unavailable = most_unavailable.max(unavailable);
        if !changed && unavailable == 0 {
            break;
        }
        // A start time passes: what was creating is now available.
        if unavailable > 0 {
            start_waits += 1;
            sandboxes = sandboxes
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    if sandbox_state(&s, now).state == SandboxState::Creating {
                        let name = s.metadata.name.clone().unwrap();
                        available((*s).clone(), &name, 10_000 + i as i64)
                    } else {
                        s
                    }
                })
                .collect();
        }
        assert!(reconciles < 10_000, "no convergence");
    }
    for before in &claimed {
        assert!(sandboxes.iter().any(|s| s == before), "a claimed sandbox was touched");
    }
    let status = set.status.clone().unwrap();
    assert_eq!(status.updated_replicas, Some(REPLICAS as i32));
    println!(
        "rolling update of a {REPLICAS}-sandbox pool at maxUnavailable 20% (10 claimed sandboxes kept):"
    );
    println!(
        "  reconciles: {reconciles}, start waits: {start_waits}, created {created}, deleted {deleted}"
    );
    println!(
        "  planner: {:.1} ms in all, {:.2} ms per reconcile",
        planning.as_secs_f64() * 1e3,
        planning.as_secs_f64() * 1e3 / f64::from(reconciles)
    );
    println!("  most members unavailable at once: {most_unavailable} (budget {})", REPLICAS / 5);
    println!(
        "  updatedReplicas {:?}, updatedAvailableReplicas {:?}",
        status.updated_replicas, status.updated_available_replicas
    );
}
