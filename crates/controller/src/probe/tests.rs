//! Table tests of the probe runner's planner and the auto-pause decisions, on an injected
//! clock (plain timestamps).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::conditions::sandbox::{AUTO_PAUSED, PAUSED, READY, auto_paused_reason, probe_reason};
use oka_api::conditions::{FALSE, TRUE, UNKNOWN};
use oka_api::probes::{
    ActivityProbe, AutoPausePolicy, PauseRule, ResumeRule, RuleConditionStatus, SandboxProbe,
};
use oka_api::{Sandbox, SandboxPhase, annotations};

use super::*;
use crate::sandbox::autopause::{Decision, decide};

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_767_225_600 + s).unwrap()
}

fn probe(period: i32, success: i32, failure: i32) -> SandboxProbe {
    SandboxProbe {
        name: "p".into(),
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(8000), host: None }),
        period_seconds: period,
        success_threshold: success,
        failure_threshold: failure,
        ..SandboxProbe::default()
    }
}

fn with_condition(mut sandbox: Sandbox, type_: &str, status: &str, since: Timestamp) -> Sandbox {
    let list =
        sandbox.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
    list.retain(|c| c.type_ != type_);
    list.push(Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "Test".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(since),
    });
    sandbox
}

#[test]
fn thresholds_count_consecutive_results() {
    let p = probe(10, 2, 3);
    let ok = Outcome::Success("HTTP 200".into());
    let bad = Outcome::Failure("HTTP 503".into());
    let slow = Outcome::Timeout("timed out after 1s".into());
    let err = Outcome::Error("no such port".into());
    // (outcomes, expected verdict after the last one as (status, reason) or None)
    type Case<'a> = (&'a [&'a Outcome], Option<(&'a str, &'a str)>);
    let table: &[Case<'_>] = &[
        (&[&ok], None),
        (&[&ok, &ok], Some((TRUE, probe_reason::SUCCEEDED))),
        (&[&ok, &bad, &ok], None),
        (&[&bad, &bad], None),
        (&[&bad, &bad, &bad], Some((FALSE, probe_reason::FAILED))),
        (&[&bad, &bad, &slow], Some((FALSE, probe_reason::TIMEOUT))),
        (&[&bad, &ok, &bad, &bad], None),
        (&[&err, &err], None),
        (&[&err, &err, &err], Some((UNKNOWN, probe_reason::ERROR))),
        // Errors count toward neither threshold: two failures, an error, a failure ⇒ False.
        (&[&bad, &bad, &err, &bad], Some((FALSE, probe_reason::FAILED))),
        (&[&ok, &err, &ok], Some((TRUE, probe_reason::SUCCEEDED))),
    ];
    for (outcomes, expected) in table {
        let mut counters = Counters::default();
        let mut last = None;
        for outcome in *outcomes {
            last = counters.record(&p, outcome);
        }
        let got = last.as_ref().map(|v| (v.status, v.reason));
        assert_eq!(got, *expected, "{outcomes:?}");
    }
}

#[test]
fn writes_only_on_status_or_reason_change() {
    let verdict = Verdict::new(TRUE, probe_reason::SUCCEEDED, "HTTP 200");
    assert!(needs_write(None, &verdict));
    let same = verdict.condition("p", at(0));
    let other_message = Verdict::new(TRUE, probe_reason::SUCCEEDED, "HTTP 204");
    assert!(!needs_write(Some(&same), &other_message));
    let failed = Verdict::new(FALSE, probe_reason::FAILED, "HTTP 500");
    assert!(needs_write(Some(&same), &failed));
    let timeout = Verdict::new(FALSE, probe_reason::TIMEOUT, "");
    assert!(needs_write(Some(&failed.condition("p", at(0))), &timeout));
}

#[test]
fn lifecycle_transition_time_moves_only_on_a_flip() {
    let mut sandbox = Sandbox::test().claimed().phase(SandboxPhase::Running).ready().build();
    let t = |v: &Verdict, s| Edit::Set(v.condition("p", at(s)));
    let up = Verdict::new(TRUE, probe_reason::SUCCEEDED, "a");
    assert!(apply_edits(&mut sandbox, &[t(&up, 10)]));
    assert!(!apply_edits(
        &mut sandbox,
        &[t(&Verdict::new(TRUE, probe_reason::SUCCEEDED, "b"), 20)]
    ));
    let down = Verdict::new(FALSE, probe_reason::FAILED, "c");
    assert!(apply_edits(&mut sandbox, &[t(&down, 30)]));
    let timeout = Verdict::new(FALSE, probe_reason::TIMEOUT, "d");
    assert!(apply_edits(&mut sandbox, &[t(&timeout, 40)]));
    let c = sandbox.condition("probe.agents.kruise.io/p").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.last_transition_time.0),
        (FALSE, probe_reason::TIMEOUT, at(30))
    );
    assert!(apply_edits(&mut sandbox, &[Edit::Remove("probe.agents.kruise.io/p".into())]));
    assert!(sandbox.condition("probe.agents.kruise.io/p").is_none());
}

#[test]
fn due_times() {
    let p = SandboxProbe { initial_delay_seconds: 30, ..probe(10, 1, 3) };
    let ready_at = at(100);
    let sandbox = with_condition(
        Sandbox::test().claimed().phase(SandboxPhase::Running).build(),
        READY,
        TRUE,
        ready_at,
    );
    // First attempt: Ready's transition + initialDelay + jitter below 10 % of the period.
    for seed in [0, 1, 999, 12345, u64::MAX] {
        let due = first_due(&sandbox, &p, seed, at(101));
        let offset = due.duration_since(at(130));
        assert!(
            offset >= SignedDuration::ZERO && offset < SignedDuration::from_secs(1),
            "{offset:?}"
        );
    }
    // A claim after Ready moves the start.
    let claimed = Sandbox {
        metadata: {
            let mut m = sandbox.metadata.clone();
            m.annotations
                .get_or_insert_with(Default::default)
                .insert(annotations::CLAIM_TIMESTAMP.into(), at(200).to_string());
            m
        },
        ..sandbox.clone()
    };
    assert_eq!(first_due(&claimed, &p, 0, at(201)), at(230));
    // Never in the past (the runner started late).
    assert_eq!(first_due(&sandbox, &p, 0, at(1000)), at(1000));
    // Then every period from the start of the previous attempt.
    assert_eq!(next_due(at(130), &p), at(140));
    assert_eq!(next_due(at(140), &SandboxProbe { period_seconds: 3600, ..p }), at(3740));
}

#[test]
fn which_sandboxes_are_probed() {
    let probes = [probe(10, 1, 3)];
    let running = Sandbox::test().claimed().phase(SandboxPhase::Running).ready().build();
    let all = Situation::Probe { in_sandbox: true, external: true };
    let external = Situation::Probe { in_sandbox: false, external: true };
    let table = [
        (running.clone(), &probes[..], all),
        (running.clone(), &[][..], Situation::Ignore),
        (
            Sandbox::test().pooled("pool").phase(SandboxPhase::Running).ready().build(),
            &probes[..],
            Situation::Ignore,
        ),
        (
            Sandbox::test().claimed().phase(SandboxPhase::Running).not_ready().build(),
            &probes[..],
            external,
        ),
        (
            Sandbox::test().claimed().phase(SandboxPhase::Paused).paused().build(),
            &probes[..],
            external,
        ),
        (Sandbox::test().claimed().phase(SandboxPhase::Resuming).build(), &probes[..], external),
        (Sandbox::test().claimed().phase(SandboxPhase::Pending).build(), &probes[..], external),
        (
            Sandbox::test().claimed().phase(SandboxPhase::Recycling).build(),
            &probes[..],
            Situation::Probe { in_sandbox: false, external: false },
        ),
        (
            Sandbox::test().claimed().phase(SandboxPhase::Failed).build(),
            &probes[..],
            Situation::Stop,
        ),
        (
            Sandbox::test().claimed().phase(SandboxPhase::Running).ready().deleting().build(),
            &probes[..],
            Situation::Stop,
        ),
    ];
    for (sandbox, probes, expected) in table {
        assert_eq!(situation(&sandbox, probes), expected, "{:?}", sandbox.phase());
    }
}

#[test]
fn checks_are_built_once_from_the_probe() {
    let sandbox = Sandbox::test()
        .claimed()
        .label(oka_api::labels::SANDBOX_ID, "abc")
        .phase(SandboxPhase::Running)
        .ready()
        .build();
    let http = SandboxProbe {
        name: "h".into(),
        http_get: Some(HTTPGetAction {
            port: IntOrString::Int(8000),
            path: Some("/v1/$(SANDBOX_NAMESPACE)/$(SANDBOX_ID)".into()),
            ..HTTPGetAction::default()
        }),
        ..SandboxProbe::default()
    };
    let Check::Http { endpoint, head } = Check::of(&sandbox, None, &http) else { panic!("http") };
    assert_eq!((endpoint.port, endpoint.host), (8000, None));
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("GET /v1/default/abc HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"), "{head}");
    let https = SandboxProbe {
        http_get: Some(HTTPGetAction {
            scheme: Some("HTTPS".into()),
            ..http.http_get.clone().unwrap()
        }),
        ..http.clone()
    };
    assert!(matches!(Check::of(&sandbox, None, &https), Check::Invalid(_)));
    let named = SandboxProbe {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::String("web".into()), host: None }),
        ..SandboxProbe::default()
    };
    assert!(
        matches!(Check::of(&sandbox, None, &named), Check::Invalid(why) if why.contains("web"))
    );
    let exec = SandboxProbe { exec: Some(ExecAction::default()), ..SandboxProbe::default() };
    assert_eq!(
        Check::of(&sandbox, None, &exec),
        Check::Invalid("the exec probe has no command".into())
    );
    let command = vec!["test".to_owned(), "-d".to_owned(), "/tmp".to_owned()];
    let exec = SandboxProbe {
        exec: Some(ExecAction { command: Some(command.clone()) }),
        ..SandboxProbe::default()
    };
    assert_eq!(Check::of(&sandbox, None, &exec), Check::Exec { command });
}

// --- AutoPausePolicy decisions ---

fn activity_probe() -> SandboxProbe {
    SandboxProbe {
        name: "idle".into(),
        activity: Some(ActivityProbe::default()),
        ..SandboxProbe::default()
    }
}

fn policy(for_seconds: i32, min_running: i32) -> AutoPausePolicy {
    AutoPausePolicy {
        resume: Some(ResumeRule::new("idle")),
        min_running_seconds: min_running,
        min_paused_seconds: 30,
        ..AutoPausePolicy::new(PauseRule { for_seconds, ..PauseRule::new("idle") })
    }
}

fn running(ready_at: Timestamp, probe_status: &str, probe_since: Timestamp) -> Sandbox {
    let s = Sandbox::test().claimed().phase(SandboxPhase::Running).build();
    let s = with_condition(s, READY, TRUE, ready_at);
    with_condition(s, "probe.agents.kruise.io/idle", probe_status, probe_since)
}

fn decide_at(
    sandbox: &Sandbox,
    policy: Option<&AutoPausePolicy>,
    now: Timestamp,
) -> crate::sandbox::autopause::Step {
    decide_within(sandbox, policy, &crate::sandbox::autopause::Budget::default(), now)
}

fn decide_within(
    sandbox: &Sandbox,
    policy: Option<&AutoPausePolicy>,
    budget: &crate::sandbox::autopause::Budget<'_>,
    now: Timestamp,
) -> crate::sandbox::autopause::Step {
    let probes = [activity_probe()];
    decide(sandbox, policy, &probes, sandbox.status.as_ref().unwrap(), budget, now)
}

#[test]
fn every_threshold_and_hold_of_the_policy_is_honoured() {
    let secs = std::time::Duration::from_secs;
    // pause.forSeconds from the later of the probe's and Ready's transitions.
    let p = policy(300, 0);
    assert_eq!(
        decide_at(&running(at(0), FALSE, at(100)), Some(&p), at(399)).decision,
        Decision::Wait(secs(1))
    );
    assert_eq!(
        decide_at(&running(at(0), FALSE, at(100)), Some(&p), at(400)).decision,
        Decision::Pause
    );
    assert_eq!(
        decide_at(&running(at(200), FALSE, at(100)), Some(&p), at(400)).decision,
        Decision::Wait(secs(100)),
        "Ready's later transition (a resume) restarts the hold"
    );
    // minRunningSeconds from Ready's transition, even with forSeconds 0.
    let p = policy(0, 60);
    assert_eq!(
        decide_at(&running(at(0), FALSE, at(0)), Some(&p), at(59)).decision,
        Decision::Wait(secs(1))
    );
    assert_eq!(
        decide_at(&running(at(0), FALSE, at(0)), Some(&p), at(60)).decision,
        Decision::Pause
    );
    // resume.forSeconds from the later of the probe's and SandboxPaused's transitions, and
    // minPausedSeconds (30) from SandboxPaused's.
    let mut p = policy(0, 0);
    p.resume.as_mut().unwrap().for_seconds = 45;
    assert_eq!(
        decide_at(&policy_paused(at(0), TRUE, at(10)), Some(&p), at(50)).decision,
        Decision::Wait(secs(5))
    );
    assert_eq!(
        decide_at(&policy_paused(at(0), TRUE, at(10)), Some(&p), at(55)).decision,
        Decision::Resume
    );
    assert_eq!(
        decide_at(&policy_paused(at(40), TRUE, at(0)), Some(&p), at(60)).decision,
        Decision::Wait(secs(25)),
        "the pause's own transition restarts the resume hold"
    );
    p.resume.as_mut().unwrap().for_seconds = 0;
    assert_eq!(
        decide_at(&policy_paused(at(0), TRUE, at(0)), Some(&p), at(29)).decision,
        Decision::Wait(secs(1))
    );
}

#[test]
fn the_action_budget_rate_limits_pauses_and_resumes() {
    use crate::sandbox::autopause::{ActionLog, Budget};
    let secs = std::time::Duration::from_secs;
    let p = policy(0, 0);
    let idle = running(at(0), FALSE, at(0));
    // Three actions an hour: three in the last hour leave none.
    let recent = [at(1000), at(2000), at(3000)];
    let budget = Budget { recent: &recent, max_per_hour: 3 };
    let step = decide_within(&idle, Some(&p), &budget, at(3600));
    assert_eq!(step.decision, Decision::Wait(secs(1000)), "until the oldest leaves the hour");
    let (status, reason, message) = step.condition.unwrap();
    assert_eq!((status, reason), (FALSE, auto_paused_reason::RATE_LIMITED));
    assert!(message.contains("3 times an hour"), "{message}");
    // Once it left, the pause goes on.
    let step = decide_within(&idle, Some(&p), &budget, at(4600));
    assert_eq!(step.decision, Decision::Pause);
    // Resumes count against the same budget.
    let mut p2 = p.clone();
    p2.min_paused_seconds = 0;
    let asleep = policy_paused(at(0), TRUE, at(0));
    let step = decide_within(&asleep, Some(&p2), &budget, at(3600));
    assert_eq!(step.condition.unwrap().1, auto_paused_reason::RATE_LIMITED);
    assert_eq!(step.decision, Decision::Wait(secs(1000)));
    // Zero means no budget; fewer actions than the budget leave room.
    let unlimited = Budget { recent: &recent, max_per_hour: 0 };
    assert_eq!(decide_within(&idle, Some(&p), &unlimited, at(3600)).decision, Decision::Pause);
    let roomy = Budget { recent: &recent, max_per_hour: 4 };
    assert_eq!(decide_within(&idle, Some(&p), &roomy, at(3600)).decision, Decision::Pause);
    // Nothing to do is never rate limited.
    let busy = running(at(0), TRUE, at(0));
    assert_eq!(decide_within(&busy, Some(&p), &budget, at(3600)).condition, None);

    // The controller's log: per sandbox, the last hour only.
    let log = ActionLog::default();
    log.record("a", at(0));
    log.record("a", at(3000));
    log.record("b", at(3500));
    assert_eq!(log.recent("a", at(3600)), vec![at(3000)]);
    assert_eq!(log.recent("b", at(3600)), vec![at(3500)]);
    log.forget("b");
    assert!(log.recent("b", at(3600)).is_empty());
}

#[test]
fn pause_decisions() {
    let p = policy(600, 120);
    let secs = |n| std::time::Duration::from_secs(n);
    // (sandbox, now, expected decision)
    let table = [
        // Idle (False) for 600 s, running 1000 s: pause.
        (running(at(0), FALSE, at(400)), at(1000), Decision::Pause),
        // Idle for 500 s only: wait the rest.
        (running(at(0), FALSE, at(500)), at(1000), Decision::Wait(secs(100))),
        // Active: nothing.
        (running(at(0), TRUE, at(0)), at(5000), Decision::Nothing),
        // Unknown never acts.
        (running(at(0), UNKNOWN, at(0)), at(5000), Decision::Nothing),
        // Resumed 60 s ago (Ready's transition): the hold counts from it, and minRunning too.
        (running(at(940), FALSE, at(0)), at(1000), Decision::Wait(secs(540))),
    ];
    for (sandbox, now, expected) in table {
        assert_eq!(decide_at(&sandbox, Some(&p), now).decision, expected);
    }
    // minRunningSeconds beyond the hold.
    let long = policy(0, 120);
    assert_eq!(
        decide_at(&running(at(900), FALSE, at(950),), Some(&long), at(1000)).decision,
        Decision::Wait(secs(20))
    );
    // Mode 2 (no policy): nothing, no AutoPaused.
    let step = decide_at(&running(at(0), FALSE, at(0)), None, at(5000));
    assert_eq!((step.decision, step.condition), (Decision::Nothing, None));
    // A pool member is never paused by the policy.
    let pooled = with_condition(
        with_condition(
            Sandbox::test().pooled("pool").phase(SandboxPhase::Running).build(),
            READY,
            TRUE,
            at(0),
        ),
        "probe.agents.kruise.io/idle",
        FALSE,
        at(0),
    );
    assert_eq!(decide_at(&pooled, Some(&p), at(5000)).decision, Decision::Nothing);
    // Shutdown reached: the timer's business.
    let mut ending = running(at(0), FALSE, at(0));
    ending.spec.shutdown_time = Some(Time(at(10)));
    assert_eq!(decide_at(&ending, Some(&p), at(5000)).decision, Decision::Nothing);
    // An invalid policy says so.
    let bad = AutoPausePolicy::new(PauseRule::new("missing"));
    let step = decide_at(&running(at(0), FALSE, at(0)), Some(&bad), at(5000));
    assert_eq!(step.decision, Decision::Nothing);
    assert_eq!(step.condition.unwrap().1, auto_paused_reason::INVALID_POLICY);
}

fn policy_paused(paused_at: Timestamp, probe_status: &str, probe_since: Timestamp) -> Sandbox {
    let s = Sandbox::test()
        .claimed()
        .phase(SandboxPhase::Paused)
        .paused()
        .annotation(annotations::PAUSED_BY, annotations::PAUSED_BY_AUTO_PAUSE_POLICY)
        .build();
    let s = with_condition(s, PAUSED, TRUE, paused_at);
    with_condition(s, "probe.agents.kruise.io/idle", probe_status, probe_since)
}

#[test]
fn resume_decisions_and_the_auto_paused_condition() {
    let p = policy(600, 120);
    let step = decide_at(&policy_paused(at(0), TRUE, at(100)), Some(&p), at(200));
    assert_eq!(step.decision, Decision::Resume);
    assert_eq!(
        step.condition.as_ref().map(|c| (c.0, c.1)),
        Some((TRUE, auto_paused_reason::PROBE_DRIVEN))
    );
    // minPausedSeconds (30) after the pause completed.
    let step = decide_at(&policy_paused(at(0), TRUE, at(0)), Some(&p), at(10));
    assert_eq!(step.decision, Decision::Wait(std::time::Duration::from_secs(20)));
    // Still idle: stays paused.
    assert_eq!(
        decide_at(&policy_paused(at(0), FALSE, at(0)), Some(&p), at(500)).decision,
        Decision::Nothing
    );
    // A pause by someone else is not woken under scope PolicyPaused, is under AnyPause.
    let mut manual = policy_paused(at(0), TRUE, at(0));
    manual.metadata.annotations = None;
    assert_eq!(decide_at(&manual, Some(&p), at(500)).decision, Decision::Nothing);
    let mut any = p.clone();
    any.resume.as_mut().unwrap().scope = oka_api::probes::ResumeScope::AnyPause;
    assert_eq!(decide_at(&manual, Some(&any), at(500)).decision, Decision::Resume);
    // A user set spec.paused false but the marker is still there: ManualOverride, marker removed.
    let mut overridden = policy_paused(at(0), FALSE, at(0));
    overridden.spec.paused = Some(false);
    let step = decide_at(&overridden, Some(&p), at(500));
    assert!(step.clear_marker);
    assert_eq!(step.condition.unwrap().1, auto_paused_reason::MANUAL_OVERRIDE);
    // Woken (gateway or resume rule: marker gone) while AutoPaused was True: AutoResumed.
    let woken = with_condition(running(at(400), TRUE, at(400)), AUTO_PAUSED, TRUE, at(0));
    let step = decide_at(&woken, Some(&p), at(500));
    assert_eq!(step.condition.unwrap().1, auto_paused_reason::AUTO_RESUMED);
    // A rule status of True for the pause works too.
    let busy = AutoPausePolicy::new(PauseRule {
        status: RuleConditionStatus::True,
        ..PauseRule::new("idle")
    });
    let step = decide_at(
        &running(at(0), TRUE, at(0)),
        Some(&AutoPausePolicy { min_running_seconds: 0, ..busy }),
        at(10),
    );
    assert_eq!(step.decision, Decision::Pause);
}
