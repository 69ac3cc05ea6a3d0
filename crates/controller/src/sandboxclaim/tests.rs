//! The claim planner: a table of lifecycle cases, the condition details, and properties over
//! random claims and clocks.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
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
}

fn outcome(plan: &Plan<ClaimAction>) -> Outcome {
    match plan.actions.as_slice() {
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
    plan_sandbox_claim(&fixture.0, set.then_some(&pool), now).expect("valid claim")
}

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn lifecycle_table() {
    use Outcome::*;
    let cases: Vec<(&str, Fixture, bool, Timestamp, Outcome)> = vec![
        (
            "a new claim starts claiming and looks again at its timeout",
            claim(),
            true,
            t0(),
            Status { phase: "Claiming", completed: None, requeue: Some(MIN) },
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
            "a claiming claim waits for its timeout deadline",
            claim().claiming(t0()),
            true,
            at(secs(20)),
            Wait(Some(Duration::from_secs(40))),
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
            Wait(Some(Duration::from_secs(540))),
        ),
        (
            "a claiming claim without a start time gets one",
            claim().observed().phase("Claiming"),
            true,
            t0(),
            Status { phase: "Claiming", completed: None, requeue: Some(MIN) },
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
    let [ClaimAction::UpdateStatus(status)] = plan.actions.as_slice() else { panic!("{plan:?}") };
    assert_eq!(status.claim_start_time, Some(Time(at(secs(1)))));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.completion_time, None);
    assert_eq!(status.conditions, None);
    // The deadline is measured from the recorded start.
    assert_eq!(plan.requeue_after, Some(Duration::from_millis(59_500)));
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
    let error = plan_sandbox_claim(&claim().timeout("1d").0, Some(&pool), t0()).unwrap_err();
    assert_eq!(error.field, "claimTimeout");
    let error =
        plan_sandbox_claim(&claim().ttl("soon").completed(t0()).0, Some(&pool), t0()).unwrap_err();
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
        let plan = plan_sandbox_claim(&claim, set.then_some(&pool), now).unwrap();
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
        let plan = plan_sandbox_claim(&claim, set.then_some(&pool), now).unwrap();
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
        let plan = plan_sandbox_claim(&claim, set, now).unwrap();
        if let Some(next) = apply(&claim, &plan) {
            let again = plan_sandbox_claim(&next, set, now).unwrap();
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
        let plan = plan_sandbox_claim(&claim, set, now).unwrap();
        let (Some(next), Some(wait)) = (apply(&claim, &plan), plan.requeue_after) else {
            return Ok(());
        };
        let deadline = now.checked_add(SignedDuration::try_from(wait).unwrap()).unwrap();
        if !wait.is_zero() {
            let before = deadline.checked_sub(SignedDuration::from_nanos(1)).unwrap();
            let early = plan_sandbox_claim(&next, set, before).unwrap();
            prop_assert!(early.actions.is_empty(), "acted before the deadline: {:?}", early);
            prop_assert!(
                early.requeue_after == Some(Duration::from_nanos(1)),
                "the deadline moved: {:?}", early
            );
        }
        let due = plan_sandbox_claim(&next, set, deadline).unwrap();
        prop_assert!(!due.actions.is_empty(), "nothing happened at the deadline: {:?}", due);
    }
}
