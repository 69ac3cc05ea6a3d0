//! The claim planner: a table of lifecycle cases, the condition details, and properties over
//! random claims and clocks.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::{SandboxClaim, SandboxClaimPhase, SandboxClaimSpec, SandboxClaimStatus, SandboxSet};
use proptest::prelude::*;

use super::*;
use oka_api::conditions::find as find_condition;

/// 2026-03-01T12:00:00Z, a whole second.
fn t0() -> Timestamp {
    Timestamp::from_second(1_772_366_400).unwrap()
}

fn secs(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

fn at(offset: SignedDuration) -> Timestamp {
    t0().checked_add(offset).unwrap()
}

/// A claim fixture: `claim().claiming(at(..)).claimed(1)`.
#[derive(Clone)]
struct Fixture(SandboxClaim);

fn claim() -> Fixture {
    let mut claim = SandboxClaim::new("c", SandboxClaimSpec::new("pool"));
    claim.metadata.namespace = Some("default".into());
    claim.metadata.uid = Some("uid-1".into());
    claim.metadata.resource_version = Some("7".into());
    claim.metadata.generation = Some(1);
    Fixture(claim)
}

impl Fixture {
    fn replicas(mut self, n: i32) -> Self {
        self.0.spec.replicas = n;
        self
    }
    fn timeout(mut self, d: &str) -> Self {
        self.0.spec.claim_timeout = d.into();
        self
    }
    fn ttl(mut self, d: &str) -> Self {
        self.0.spec.ttl_after_completed = d.into();
        self
    }
    fn status(&mut self) -> &mut SandboxClaimStatus {
        self.0.status.get_or_insert_with(Default::default)
    }
    fn observed(mut self) -> Self {
        self.status().observed_generation = Some(1);
        self
    }
    fn claiming(mut self, started: Timestamp) -> Self {
        let status = self.status();
        status.observed_generation = Some(1);
        status.phase = Some(SandboxClaimPhase::Claiming);
        status.claim_start_time = Some(Time(started));
        self
    }
    fn claimed(mut self, n: i32) -> Self {
        self.status().claimed_replicas = Some(n);
        self
    }
    fn completed(mut self, completed: Timestamp) -> Self {
        let status = self.status();
        status.observed_generation = Some(1);
        status.phase = Some(SandboxClaimPhase::Completed);
        status.completion_time = Some(Time(completed));
        self
    }
    fn phase(mut self, phase: &str) -> Self {
        self.status().phase = Some(SandboxClaimPhase::from(phase));
        self
    }
}

fn pool() -> SandboxSet {
    let mut set = SandboxSet::new("pool", Default::default());
    set.metadata.namespace = Some("default".into());
    set
}

/// What a plan did, in short, for the table.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// No write; look again after this long (or wait for a change).
    Wait(Option<Duration>),
    /// A status write to this phase with this `Completed` reason; then look again after.
    Status { phase: &'static str, completed: Option<&'static str>, requeue: Option<Duration> },
    /// The claim is deleted.
    Delete,
    /// A batch of `count` claims after `claimed`, `left` before the timeout; `first`: the
    /// status (a new claim's Claiming) is written before the batch.
    Claim { count: i32, claimed: i32, left: Duration, first: bool },
}

fn outcome(plan: &Plan<ClaimAction>) -> Outcome {
    let actions: Vec<&ClaimAction> =
        plan.actions.iter().filter(|a| !matches!(a, ClaimAction::Record(_))).collect();
    match actions.as_slice() {
        [ClaimAction::Claim(b)] => {
            return Outcome::Claim {
                count: b.count,
                claimed: b.claimed,
                left: b.time_left,
                first: false,
            };
        }
        [ClaimAction::UpdateStatus(s), ClaimAction::Claim(b)] => {
            assert_eq!(s.phase, Some(SandboxClaimPhase::Claiming));
            return Outcome::Claim {
                count: b.count,
                claimed: b.claimed,
                left: b.time_left,
                first: true,
            };
        }
        _ => {}
    }
    match actions.as_slice() {
        [] => Outcome::Wait(plan.requeue_after),
        [ClaimAction::Delete] => Outcome::Delete,
        [ClaimAction::UpdateStatus(status)] => Outcome::Status {
            phase: match status.phase.as_ref().map(SandboxClaimPhase::as_str) {
                Some("Claiming") => "Claiming",
                Some("Completed") => "Completed",
                other => panic!("unexpected phase {other:?}"),
            },
            completed: status.conditions.as_deref().and_then(|c| {
                find_condition(c, COMPLETED).map(|c| match c.reason.as_str() {
                    "SandboxSetNotFound" => "SandboxSetNotFound",
                    "AllReplicasClaimed" => "AllReplicasClaimed",
                    "TimeoutReached" => "TimeoutReached",
                    "UnsupportedField" => "UnsupportedField",
                    other => panic!("unexpected reason {other}"),
                })
            }),
            requeue: plan.requeue_after,
        },
        other => panic!("unexpected actions {other:?}"),
    }
}

fn plan(fixture: &Fixture, set: bool, now: Timestamp) -> Plan<ClaimAction> {
    let pool = pool();
    plan_sandbox_claim(&fixture.0, set.then_some(&pool), &[], now).expect("valid claim")
}

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn lifecycle_table() {
    use Outcome::*;
    let cases: Vec<(&str, Fixture, bool, Timestamp, Outcome)> = vec![
        (
            "a new claim shows Claiming, then claims its first batch",
            claim(),
            true,
            t0(),
            Claim { count: 1, claimed: 0, left: MIN, first: true },
        ),
        (
            "a new claim without its SandboxSet completes at once",
            claim(),
            false,
            t0(),
            Status {
                phase: "Completed",
                completed: Some("SandboxSetNotFound"),
                requeue: Some(HOUR),
            },
        ),
        (
            "a claiming claim whose SandboxSet disappeared completes",
            claim().claiming(t0()),
            false,
            at(secs(10)),
            Status {
                phase: "Completed",
                completed: Some("SandboxSetNotFound"),
                requeue: Some(HOUR),
            },
        ),
        (
            "a claiming claim claims what is missing before its timeout",
            claim().replicas(3).claiming(t0()).claimed(1),
            true,
            at(secs(20)),
            Claim { count: 2, claimed: 1, left: Duration::from_secs(40), first: false },
        ),
        (
            "a batch is at most 50",
            claim().replicas(120).claiming(t0()).claimed(30),
            true,
            at(secs(20)),
            Claim { count: 50, claimed: 30, left: Duration::from_secs(40), first: false },
        ),
        (
            "a claiming claim with every replica claimed completes",
            claim().replicas(2).claiming(t0()).claimed(2),
            true,
            at(secs(5)),
            Status {
                phase: "Completed",
                completed: Some("AllReplicasClaimed"),
                requeue: Some(HOUR),
            },
        ),
        (
            "more claimed than desired also completes",
            claim().replicas(1).claiming(t0()).claimed(3),
            true,
            at(secs(5)),
            Status {
                phase: "Completed",
                completed: Some("AllReplicasClaimed"),
                requeue: Some(HOUR),
            },
        ),
        (
            "a claiming claim at its timeout completes timed out",
            claim().claiming(t0()),
            true,
            at(secs(60)),
            Status { phase: "Completed", completed: Some("TimeoutReached"), requeue: Some(HOUR) },
        ),
        (
            "a custom timeout is honoured",
            claim().timeout("10m").claiming(t0()),
            true,
            at(secs(60)),
            Claim { count: 1, claimed: 0, left: Duration::from_secs(540), first: false },
        ),
        (
            "a claiming claim without a start time gets one",
            claim().observed().phase("Claiming"),
            true,
            t0(),
            Claim { count: 1, claimed: 0, left: MIN, first: false },
        ),
        (
            "a completed claim waits for its TTL",
            claim().completed(t0()),
            true,
            at(secs(600)),
            Wait(Some(Duration::from_secs(3000))),
        ),
        (
            "a completed claim is deleted when its TTL has elapsed",
            claim().completed(t0()),
            true,
            at(secs(3600)),
            Delete,
        ),
        (
            "a completed claim without its SandboxSet still only waits for its TTL",
            claim().completed(t0()),
            false,
            at(secs(10)),
            Wait(Some(Duration::from_secs(3590))),
        ),
        (
            "a negative TTL keeps a completed claim forever",
            claim().ttl("-1s").completed(t0()),
            true,
            at(secs(1_000_000)),
            Wait(None),
        ),
        (
            "completing with a negative TTL asks for no requeue",
            claim().ttl("-1s"),
            false,
            t0(),
            Status { phase: "Completed", completed: Some("SandboxSetNotFound"), requeue: None },
        ),
        (
            "a zero TTL deletes right after completion",
            claim().ttl("0s").completed(t0()),
            true,
            t0(),
            Delete,
        ),
        (
            "a completed claim without a completion time is kept",
            claim().observed().phase("Completed"),
            true,
            at(secs(1_000_000)),
            Wait(None),
        ),
        (
            "an unknown phase is left alone",
            claim().observed().phase("Pending"),
            true,
            t0(),
            Wait(None),
        ),
        (
            "an unknown phase still completes when every replica is claimed",
            claim().observed().phase("Pending").claimed(1),
            true,
            t0(),
            Status {
                phase: "Completed",
                completed: Some("AllReplicasClaimed"),
                requeue: Some(HOUR),
            },
        ),
    ];
    for (name, fixture, set, now, expected) in cases {
        assert_eq!(outcome(&plan(&fixture, set, now)), expected, "{name}");
    }
}

#[test]
fn a_new_claim_records_its_start_time_in_whole_seconds() {
    let now = at(SignedDuration::from_millis(1_500));
    let plan = plan(&claim(), true, now);
    let [ClaimAction::UpdateStatus(status), ClaimAction::Claim(batch)] = plan.actions.as_slice()
    else {
        panic!("{plan:?}")
    };
    assert_eq!(status.claim_start_time, Some(Time(at(secs(1)))));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.claimed_replicas, Some(0));
    assert_eq!(status.completion_time, None);
    assert_eq!(status.conditions, None);
    // The deadline is measured from the recorded start.
    assert_eq!(batch.time_left, Duration::from_millis(59_500));
    assert_eq!(&batch.status, status);
}

/// A sandbox the claim `uid-1` owns.
fn owned(name: &str) -> oka_api::testing::SandboxBuilder {
    Sandbox::test()
        .name(name)
        .phase(oka_api::SandboxPhase::Running)
        .ready()
        .claimed()
        .annotation(oka_api::annotations::OWNER, "uid-1")
}

fn plan_owning(
    fixture: &Fixture,
    owned: Vec<oka_api::testing::SandboxBuilder>,
    now: Timestamp,
) -> Plan<ClaimAction> {
    let owned: Vec<Arc<Sandbox>> = owned.into_iter().map(|b| Arc::new(b.build())).collect();
    plan_sandbox_claim(&fixture.0, Some(&pool()), &owned, now).expect("valid claim")
}

#[test]
fn owned_sandboxes_count_when_the_status_lost_them() {
    // A batch claimed two, and its status write was lost: the next pass finds them.
    let fixture = claim().replicas(3).claiming(t0()).claimed(0);
    let plan = plan_owning(&fixture, vec![owned("a"), owned("b")], at(secs(5)));
    let [ClaimAction::Claim(batch)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    assert_eq!((batch.claimed, batch.count), (2, 1));
    assert_eq!(batch.status.claimed_replicas, Some(2));

    // The status is the floor: sandboxes deleted since do not make the claim claim again.
    let fixture = claim().replicas(3).claiming(t0()).claimed(2);
    let plan = plan_owning(&fixture, vec![], at(secs(5)));
    let [ClaimAction::Claim(batch)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    assert_eq!((batch.claimed, batch.count), (2, 1));
}

#[test]
fn dead_and_reserved_sandboxes_do_not_count() {
    let past = t0() - secs(1);
    let sandboxes: Vec<Arc<Sandbox>> = vec![
        owned("live"),
        owned("deleting").deleting(),
        owned("expired").shutdown_at(past),
        owned("failed").phase(oka_api::SandboxPhase::Failed),
        owned("reserved").label(oka_api::labels::RESERVED_FAILED_SANDBOX, "true"),
    ]
    .into_iter()
    .map(|b| Arc::new(b.build()))
    .collect();
    assert_eq!(count_claimed(&sandboxes, t0()), 1);
}

#[test]
fn every_replica_owned_writes_the_references_intermediate_message_then_completes() {
    let fixture = claim().replicas(2).claiming(t0()).claimed(1);
    let plan = plan_owning(&fixture, vec![owned("a"), owned("b")], at(secs(5)));
    let status = plan
        .actions
        .iter()
        .find_map(|a| match a {
            ClaimAction::UpdateStatus(s) => Some(s.clone()),
            _ => None,
        })
        .expect("a status write");
    assert_eq!(status.phase, Some(SandboxClaimPhase::Claiming));
    assert_eq!(status.claimed_replicas, Some(2));
    assert_eq!(status.message.as_deref(), Some("Completed: 2/2 claimed"));
    assert!(plan.actions.contains(&ClaimAction::Record(ClaimEvent {
        type_: EventType::Normal,
        reason: "ClaimCompleted",
        message: "Successfully claimed 2/2 sandboxes".into(),
    })));
    assert_eq!(plan.requeue_after, Some(Duration::ZERO));
    // The next pass completes it, as the reference's does.
    let next = written(&fixture.0, &status);
    let plan = plan_sandbox_claim(&next, Some(&pool()), &[], at(secs(5))).unwrap();
    assert_eq!(
        outcome(&plan),
        Outcome::Status {
            phase: "Completed",
            completed: Some("AllReplicasClaimed"),
            requeue: Some(HOUR)
        }
    );
}

#[test]
fn the_batch_outcome_writes_the_reference_status_and_events() {
    let fixture = claim().replicas(4).claiming(t0()).claimed(1);
    let first = plan(&fixture, true, at(secs(50)));
    let [ClaimAction::Claim(batch)] = first.actions.as_slice() else { panic!("{first:?}") };
    assert_eq!(batch.count, 3);

    let (status, requeue, event) = batch.after(2);
    assert_eq!(status.claimed_replicas, Some(3));
    assert_eq!(status.message.as_deref(), Some("Claiming sandboxes: 3/4 claimed"));
    assert_eq!(status.phase, Some(SandboxClaimPhase::Claiming));
    assert_eq!(requeue, Duration::ZERO);
    assert_eq!((event.type_, event.reason), (EventType::Normal, "SandboxClaimed"));
    assert_eq!(event.message, "Claimed 2 sandbox(es), total: 3/4");

    let (status, requeue, event) = batch.after(0);
    assert_eq!(status.claimed_replicas, Some(1));
    assert_eq!(status.message.as_deref(), Some("Claiming sandboxes: 1/4 claimed"));
    assert_eq!(requeue, CLAIM_RETRY_INTERVAL);
    assert_eq!((event.type_, event.reason), (EventType::Warning, "NoAvailableSandboxes"));
    assert_eq!(event.message, "No available sandboxes in pool pool");

    // Never more than the batch, and the retry never looks past the timeout.
    assert_eq!(batch.after(99).0.claimed_replicas, Some(4));
    let late = plan(&fixture, true, at(SignedDuration::from_millis(59_500)));
    let [ClaimAction::Claim(batch)] = late.actions.as_slice() else { panic!("{late:?}") };
    assert_eq!(batch.after(0).1, Duration::from_millis(500));
}

#[test]
fn the_request_carries_the_claims_spec() {
    let mut fixture = claim().replicas(2).claiming(t0());
    let spec = &mut fixture.0.spec;
    spec.labels = Some([("team".to_owned(), "a".to_owned())].into());
    spec.annotations = Some([("note".to_owned(), "n".to_owned())].into());
    spec.env_vars = Some([("FOO".to_owned(), "bar".to_owned())].into());
    spec.shutdown_time = Some(Time(at(secs(3600))));
    spec.create_on_no_stock = false;
    spec.wait_ready_timeout = "45s".into();
    spec.reserve_failed_sandbox = Some(true);
    spec.skip_init_runtime = true;
    let first = plan(&fixture, true, at(secs(1)));
    let [ClaimAction::Claim(batch)] = first.actions.as_slice() else { panic!("{first:?}") };
    let expected = ClaimRequest {
        namespace: "default".into(),
        pool: "pool".into(),
        owner: "uid-1".into(),
        claim_name: "c".into(),
        labels: [("team".to_owned(), "a".to_owned())].into(),
        annotations: [("note".to_owned(), "n".to_owned())].into(),
        env_vars: [("FOO".to_owned(), "bar".to_owned())].into(),
        init_runtime: false,
        shutdown_time: Some(at(secs(3600))),
        create_on_no_stock: false,
        wait_ready_timeout: Duration::from_secs(45),
        reserve_failed_sandbox: true,
        inplace_update: None,
    };
    assert_eq!(batch.request, expected);

    // The in-place update: the image and the CPU values.
    use oka_api::sandboxclaim::{InplaceUpdate, InplaceUpdateResources};
    let cpu = |v: &str| Some([("cpu".to_owned(), Quantity(v.into()))].into());
    fixture.0.spec.inplace_update = Some(InplaceUpdate {
        image: Some("/srv/roots/python".into()),
        resources: Some(InplaceUpdateResources { requests: cpu("500m"), limits: cpu("2") }),
    });
    let updating = plan(&fixture, true, at(secs(1)));
    let [ClaimAction::Claim(batch)] = updating.actions.as_slice() else { panic!("{updating:?}") };
    assert_eq!(
        batch.request.inplace_update,
        Some(InplaceUpdateRequest {
            image: Some("/srv/roots/python".into()),
            cpu_request: Some(Quantity("500m".into())),
            cpu_limit: Some(Quantity("2".into())),
        })
    );

    fixture.0.spec.wait_ready_timeout = "soon".into();
    let error =
        plan_sandbox_claim(&fixture.0, Some(&pool()), &[], at(secs(1))).expect_err("invalid");
    assert_eq!(error.field, "waitReadyTimeout");
}

#[test]
fn fields_the_runtime_cannot_honour_complete_the_claim_naming_them() {
    use oka_api::common::{CsiMountConfig, RuntimeConfig};
    use oka_api::sandboxclaim::{InplaceUpdate, InplaceUpdateResources};
    let check = |edit: &dyn Fn(&mut SandboxClaimSpec), field: &str| {
        let mut fixture = claim().replicas(2).claiming(t0());
        edit(&mut fixture.0.spec);
        let plan = plan(&fixture, true, at(secs(1)));
        assert_eq!(
            outcome(&plan),
            Outcome::Status {
                phase: "Completed",
                completed: Some("UnsupportedField"),
                requeue: Some(HOUR)
            },
            "{field}"
        );
        let ClaimAction::UpdateStatus(status) = &plan.actions[0] else { panic!("{plan:?}") };
        let message = status.message.clone().unwrap();
        assert!(message.starts_with(field), "{message}");
        let Some(ClaimAction::Record(event)) = plan.actions.get(1) else { panic!("{plan:?}") };
        assert_eq!((event.type_, event.message.as_str()), (EventType::Warning, message.as_str()));
    };
    check(
        &|s| {
            s.dynamic_volumes_mount = Some(vec![CsiMountConfig {
                pv_name: "pv".into(),
                mount_path: "/data".into(),
                ..Default::default()
            }])
        },
        "spec.dynamicVolumesMount",
    );
    let resources = |list: &str, name: &str, value: &str| {
        let values = Some([(name.to_owned(), Quantity(value.into()))].into());
        let resources = if list == "limits" {
            InplaceUpdateResources { limits: values, ..Default::default() }
        } else {
            InplaceUpdateResources { requests: values, ..Default::default() }
        };
        Some(InplaceUpdate { resources: Some(resources), ..Default::default() })
    };
    check(
        &|s| s.inplace_update = resources("limits", "memory", "1Gi"),
        "spec.inplaceUpdate.resources.limits.memory: memory inplace update is not supported",
    );
    check(
        &|s| s.inplace_update = resources("requests", "ephemeral-storage", "1Gi"),
        "spec.inplaceUpdate.resources.requests.ephemeral-storage is not supported",
    );
    check(
        &|s| s.inplace_update = resources("limits", "cpu", "0"),
        "spec.inplaceUpdate.resources.limits.cpu \"0\": target cpu must be a positive value",
    );
    check(&|s| s.runtimes = Some(vec![RuntimeConfig::named("csi")]), "spec.runtimes");
    let id = || Some([(oka_api::labels::SANDBOX_ID.to_owned(), "x".to_owned())].into());
    check(&|s| s.labels = id(), "spec.labels");
    check(&|s| s.annotations = id(), "spec.annotations");

    // What oka can do is accepted: an image, a CPU value, an empty inplaceUpdate, the agent
    // runtime.
    for update in [
        Some(InplaceUpdate { image: Some("img:2".into()), ..Default::default() }),
        resources("limits", "cpu", "2"),
        resources("requests", "cpu", "500m"),
    ] {
        let mut fixture = claim().claiming(t0());
        fixture.0.spec.inplace_update = update;
        assert!(matches!(outcome(&plan(&fixture, true, at(secs(1)))), Outcome::Claim { .. }));
    }
    let mut fixture = claim().claiming(t0());
    fixture.0.spec.inplace_update = Some(InplaceUpdate::default());
    fixture.0.spec.dynamic_volumes_mount = Some(vec![]);
    fixture.0.spec.runtimes = Some(vec![RuntimeConfig::named("agent-runtime")]);
    assert!(matches!(outcome(&plan(&fixture, true, at(secs(1)))), Outcome::Claim { .. }));
}

#[test]
fn all_replicas_claimed_writes_the_reference_messages() {
    let plan = plan(&claim().replicas(3).claiming(t0()).claimed(3), true, at(secs(5)));
    let [ClaimAction::UpdateStatus(status)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    assert_eq!(status.message.as_deref(), Some("Successfully claimed 3/3 sandboxes"));
    assert_eq!(status.completion_time, Some(Time(at(secs(5)))));
    let conditions = status.conditions.as_deref().unwrap();
    assert_eq!(conditions.len(), 1);
    let completed = find_condition(conditions, COMPLETED).unwrap();
    assert_eq!(completed.status, "True");
    assert_eq!(completed.reason, "AllReplicasClaimed");
    assert_eq!(completed.message, "Successfully claimed all 3 sandboxes");
    assert_eq!(completed.last_transition_time, Time(at(secs(5))));
}

#[test]
fn timeout_sets_timed_out_and_completed_conditions() {
    let now = at(SignedDuration::from_millis(61_500));
    let plan = plan(&claim().replicas(3).claiming(t0()).claimed(1), true, now);
    let [ClaimAction::UpdateStatus(status)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    let message = "Timeout reached after 1m1.5s, claimed 1/3 sandboxes";
    assert_eq!(status.message.as_deref(), Some(message));
    assert_eq!(status.completion_time, Some(Time(at(secs(61)))));
    let conditions = status.conditions.as_deref().unwrap();
    let timed_out = find_condition(conditions, TIMED_OUT).unwrap();
    assert_eq!(
        (timed_out.status.as_str(), timed_out.reason.as_str(), timed_out.message.as_str()),
        ("True", "ClaimTimeoutReached", "Timeout after 1m1.5s, claimed 1/3")
    );
    let completed = find_condition(conditions, COMPLETED).unwrap();
    assert_eq!(
        (completed.status.as_str(), completed.reason.as_str(), completed.message.as_str()),
        ("True", "TimeoutReached", message)
    );
}

#[test]
fn sandbox_set_not_found_names_the_set() {
    let plan = plan(&claim(), false, t0());
    let [ClaimAction::UpdateStatus(status)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    assert_eq!(status.message.as_deref(), Some("SandboxSet pool not found"));
    assert_eq!(status.claim_start_time, None);
    let completed = find_condition(status.conditions.as_deref().unwrap(), COMPLETED);
    assert_eq!(completed.map(|c| c.reason.as_str()), Some("SandboxSetNotFound"));
}

#[test]
fn a_spec_change_after_completion_only_updates_observed_generation() {
    let mut fixture = claim().completed(t0());
    fixture.0.metadata.generation = Some(2);
    let plan = plan(&fixture, true, at(secs(10)));
    let [ClaimAction::UpdateStatus(status)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    assert_eq!(status.observed_generation, Some(2));
    assert_eq!(status.completion_time, Some(Time(t0())), "completion time never moves");
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(3590)));
}

#[test]
fn invalid_durations_are_errors_of_the_claim() {
    let pool = pool();
    let error = plan_sandbox_claim(&claim().timeout("1d").0, Some(&pool), &[], t0()).unwrap_err();
    assert_eq!(error.field, "claimTimeout");
    let error = plan_sandbox_claim(&claim().ttl("soon").completed(t0()).0, Some(&pool), &[], t0())
        .unwrap_err();
    assert_eq!(error.field, "ttlAfterCompleted");
    assert!(error.to_string().starts_with("invalid spec.ttlAfterCompleted: "), "{error}");
}

#[test]
fn go_duration_matches_go() {
    let cases = [
        (SignedDuration::ZERO, "0s"),
        (SignedDuration::from_nanos(1), "1ns"),
        (SignedDuration::from_nanos(1_100), "1.1µs"),
        (SignedDuration::from_micros(2_200), "2.2ms"),
        (SignedDuration::from_millis(1_500), "1.5s"),
        (SignedDuration::from_secs(60), "1m0s"),
        (SignedDuration::from_millis(61_500), "1m1.5s"),
        (SignedDuration::from_secs(3600), "1h0m0s"),
        (SignedDuration::new(3 * 3600 + 4 * 60 + 5, 6), "3h4m5.000000006s"),
        (SignedDuration::from_millis(-1_500), "-1.5s"),
    ];
    for (duration, expected) in cases {
        assert_eq!(go_duration(duration), expected);
    }
}

// === Properties ===

/// The store's view of a written claim: its JSON round trip (which keeps whole seconds).
fn written(claim: &SandboxClaim, status: &SandboxClaimStatus) -> SandboxClaim {
    let mut next = claim.clone();
    next.status = Some(status.clone());
    serde_json::from_value(serde_json::to_value(&next).unwrap()).unwrap()
}

/// Applies a plan the way the store would: the claim after it, or `None` if deleted.
fn apply(claim: &SandboxClaim, plan: &Plan<ClaimAction>) -> Option<SandboxClaim> {
    let mut current = claim.clone();
    for action in &plan.actions {
        match action {
            ClaimAction::UpdateStatus(status) => current = written(&current, status),
            // The batch claimed nothing: what the executor writes then.
            ClaimAction::Claim(batch) => current = written(&current, &batch.after(0).0),
            ClaimAction::Record(_) => {}
            ClaimAction::Delete => return None,
        }
    }
    Some(current)
}

fn phase_name(claim: &SandboxClaim) -> Option<String> {
    claim.status.as_ref()?.phase.as_ref().map(|p| p.as_str().to_owned())
}

prop_compose! {
    fn arb_claim()(
        replicas in 1i32..4,
        claimed in proptest::option::of(0i32..5),
        timeout_s in 1i64..600,
        ttl_s in -5i64..600,
        phase in prop_oneof![
            Just(None),
            Just(Some("Claiming")),
            Just(Some("Completed")),
            Just(Some("Pending")),
        ],
        start in proptest::option::of(-1_000i64..1_000),
        completion in proptest::option::of(-1_000i64..1_000),
        generation in 1i64..3,
        observed in proptest::option::of(1i64..3),
    ) -> SandboxClaim {
        let mut claim = claim().replicas(replicas).timeout(&format!("{timeout_s}s")).ttl(&format!("{ttl_s}s")).0;
        claim.metadata.generation = Some(generation);
        let phase = phase.map(SandboxClaimPhase::from);
        let has_status = phase.is_some() || claimed.is_some() || observed.is_some();
        if has_status {
            claim.status = Some(SandboxClaimStatus {
                observed_generation: observed,
                phase,
                claimed_replicas: claimed,
                claim_start_time: start.map(|s| Time(at(secs(s)))),
                completion_time: completion.map(|s| Time(at(secs(s)))),
                ..Default::default()
            });
        }
        claim
    }
}

fn arb_now() -> impl Strategy<Value = Timestamp> {
    (-100i64..2_000, 0i32..1_000_000_000).prop_map(|(s, ns)| at(SignedDuration::new(s, ns)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Completed is terminal: no plan moves a Completed claim to another phase, nor moves its
    /// completion time.
    #[test]
    fn a_completed_claim_never_goes_back(claim in arb_claim(), set: bool, now in arb_now()) {
        let pool = pool();
        let plan = plan_sandbox_claim(&claim, set.then_some(&pool), &[], now).unwrap();
        if phase_name(&claim).as_deref() == Some("Completed") {
            for action in &plan.actions {
                if let ClaimAction::UpdateStatus(status) = action {
                    prop_assert_eq!(status.phase.as_ref(), Some(&SandboxClaimPhase::Completed));
                    prop_assert_eq!(
                        &status.completion_time,
                        &claim.status.as_ref().unwrap().completion_time
                    );
                }
            }
        }
    }

    /// A claim is deleted only when Completed, with a non-negative TTL that has elapsed since
    /// its completion time.
    #[test]
    fn delete_only_after_the_ttl(claim in arb_claim(), set: bool, now in arb_now()) {
        let pool = pool();
        let plan = plan_sandbox_claim(&claim, set.then_some(&pool), &[], now).unwrap();
        if plan.actions.contains(&ClaimAction::Delete) {
            let status = claim.status.as_ref().unwrap();
            prop_assert_eq!(status.phase.as_ref(), Some(&SandboxClaimPhase::Completed));
            let ttl = claim.spec.ttl_after_completed().unwrap().expect("non-negative ttl");
            let completed = status.completion_time.as_ref().unwrap().0;
            prop_assert!(now.duration_since(completed) >= SignedDuration::try_from(ttl).unwrap());
        }
    }

    /// Re-planning what a plan wrote, at the same instant, writes no status: the planner
    /// reaches its fixed point in one step, so a status write never causes another.
    #[test]
    fn replanning_the_written_status_writes_nothing(
        claim in arb_claim(),
        set: bool,
        now in arb_now(),
    ) {
        let pool = pool();
        let set = set.then_some(&pool);
        let plan = plan_sandbox_claim(&claim, set, &[], now).unwrap();
        if let Some(next) = apply(&claim, &plan) {
            let again = plan_sandbox_claim(&next, set, &[], now).unwrap();
            prop_assert!(
                !again.actions.iter().any(|a| matches!(a, ClaimAction::UpdateStatus(_))),
                "second plan {:?} after {:?}", again, plan
            );
        }
    }

    /// A planned requeue is exact: nothing is due before it, and something is due at it.
    /// So the controller neither polls for nothing nor misses a deadline.
    #[test]
    fn the_planned_requeue_is_the_next_deadline(
        claim in arb_claim(),
        set: bool,
        now in arb_now(),
    ) {
        let pool = pool();
        let set = set.then_some(&pool);
        let plan = plan_sandbox_claim(&claim, set, &[], now).unwrap();
        let (Some(next), Some(wait)) = (apply(&claim, &plan), plan.requeue_after) else {
            return Ok(());
        };
        let deadline = now.checked_add(SignedDuration::try_from(wait).unwrap()).unwrap();
        if !wait.is_zero() {
            let before = deadline.checked_sub(SignedDuration::from_nanos(1)).unwrap();
            let early = plan_sandbox_claim(&next, set, &[], before).unwrap();
            prop_assert!(early.actions.is_empty(), "acted before the deadline: {:?}", early);
            prop_assert!(
                early.requeue_after == Some(Duration::from_nanos(1)),
                "the deadline moved: {:?}", early
            );
        }
        let due = plan_sandbox_claim(&next, set, &[], deadline).unwrap();
        prop_assert!(!due.actions.is_empty(), "nothing happened at the deadline: {:?}", due);
    }
}

/// One step of the claim simulation: how the world answers the next reconcile.
#[derive(Debug, Clone)]
struct Step {
    /// How many of the batch's claims the claimer grants (more than asked is capped by it).
    grant: usize,
    /// The status write after the batch is lost (a crash, a conflict).
    lose_write: bool,
    /// One of the claim's sandboxes dies before the next pass.
    kill: bool,
    /// Seconds until the next pass.
    wait: i64,
}

fn arb_step() -> impl Strategy<Value = Step> {
    (0usize..60, proptest::bool::weighted(0.2), proptest::bool::weighted(0.1), 0i64..20)
        .prop_map(|(grant, lose_write, kill, wait)| Step { grant, lose_write, kill, wait })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The controller against a model pool: however the claimer answers, whatever status
    /// writes are lost and sandboxes die, `claimedReplicas` never exceeds `replicas`, the
    /// claim's live sandboxes never exceed `replicas`, and no sandbox is handed out twice
    /// (each batch asks only for sandboxes that no claim owns, and the model checks it).
    #[test]
    fn claimed_replicas_never_exceed_replicas_and_no_sandbox_is_claimed_twice(
        replicas in 1i32..130,
        stock in 0usize..200,
        steps in proptest::collection::vec(arb_step(), 1..40),
    ) {
        let mut claim = claim().replicas(replicas).timeout("10m").0;
        let mut now = t0();
        let mut stocked: Vec<String> = (0..stock).map(|i| format!("s{i:03}")).collect();
        let mut owned: Vec<Arc<Sandbox>> = Vec::new();
        let mut handed: std::collections::HashSet<String> = Default::default();
        for step in steps {
            let plan = plan_sandbox_claim(&claim, Some(&pool()), &owned, now).unwrap();
            for action in &plan.actions {
                match action {
                    ClaimAction::UpdateStatus(status) => claim = written(&claim, status),
                    ClaimAction::Claim(batch) => {
                        prop_assert!(batch.count >= 1 && batch.count <= MAX_CLAIM_BATCH);
                        prop_assert!(batch.claimed + batch.count <= replicas);
                        let granted = step.grant.min(batch.count as usize).min(stocked.len());
                        for name in stocked.drain(..granted) {
                            prop_assert!(handed.insert(name.clone()), "{} handed out twice", name);
                            owned.push(Arc::new(owned_sandbox(&name)));
                        }
                        let (status, _, _) = batch.after(granted as i32);
                        if !step.lose_write {
                            claim = written(&claim, &status);
                        }
                    }
                    ClaimAction::Record(_) | ClaimAction::Delete => {}
                }
            }
            let status = claim.status.clone().unwrap_or_default();
            prop_assert!(status.claimed_replicas.unwrap_or(0) <= replicas, "{:?}", status);
            prop_assert!(count_claimed(&owned, now) <= replicas);
            if step.kill && !owned.is_empty() {
                let dead = owned.remove(0);
                let mut dead = (*dead).clone();
                dead.metadata.deletion_timestamp = Some(Time(now));
                owned.push(Arc::new(dead));
            }
            now = now.checked_add(secs(step.wait)).unwrap();
        }
    }
}

fn owned_sandbox(name: &str) -> Sandbox {
    owned(name).build()
}
