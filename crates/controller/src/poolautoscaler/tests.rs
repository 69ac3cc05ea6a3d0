//! The PoolAutoscaler planner: the proposal's test vectors, a table per rule (bounds,
//! suspension, target checks, cron catch-up and winners, capacity sampling, the in-flight
//! guard, stabilization), and properties over random traffic: never outside the bounds, never
//! flapping within a stabilization window.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::conditions::find;
use oka_api::poolautoscaler::{
    CapacityPolicy, CronScalingPolicy, PoolAutoscalerSpec, ScalingRules,
};
use oka_api::{SandboxSetSpec, SandboxSetStatus};
use proptest::prelude::*;

use super::*;

/// 2026-01-05T07:00:00Z, a Monday.
fn t0() -> Timestamp {
    "2026-01-05T07:00:00Z".parse().unwrap()
}

fn at(seconds: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(seconds)).unwrap()
}

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn autoscaler(min: i32, max: i32) -> PoolAutoscaler {
    let mut pa = PoolAutoscaler::new(
        "scaler",
        PoolAutoscalerSpec {
            scale_target_ref: ScaleTargetRef::sandbox_set("pool"),
            min_replicas: min,
            max_replicas: max,
            ..PoolAutoscalerSpec::default()
        },
    );
    pa.metadata.namespace = Some("default".into());
    pa.metadata.uid = Some("pa-uid".into());
    pa.metadata.generation = Some(1);
    pa.metadata.creation_timestamp = Some(Time(at(-3600)));
    pa
}

fn capacity(target: IntOrString, tolerance: IntOrString, up: i32, down: i32) -> CapacityPolicy {
    CapacityPolicy {
        target_available: target,
        tolerance: Some(tolerance),
        scale_up: Some(ScalingRules { stabilization_window_seconds: Some(up) }),
        scale_down: Some(ScalingRules { stabilization_window_seconds: Some(down) }),
    }
}

fn percent(p: u32) -> IntOrString {
    IntOrString::String(format!("{p}%"))
}

fn cron(name: &str, schedule: &str, target: i32) -> CronScalingPolicy {
    CronScalingPolicy {
        name: name.into(),
        time_zone: None,
        schedule: schedule.into(),
        target_replicas: target,
    }
}

fn pool(current: i32, observed: i32, available: i32) -> SandboxSet {
    let mut set =
        SandboxSet::new("pool", SandboxSetSpec { replicas: current, ..SandboxSetSpec::default() });
    set.metadata.namespace = Some("default".into());
    set.metadata.generation = Some(1);
    set.metadata.resource_version = Some("5".into());
    set.status = Some(SandboxSetStatus {
        observed_generation: Some(1),
        replicas: observed,
        available_replicas: available,
        ..SandboxSetStatus::default()
    });
    set
}

/// Settings whose observation window holds one sample: every tick decides on its own sample
/// (the proposal's "window of identical samples").
fn one_sample() -> Settings {
    Settings {
        sampling_interval: Duration::from_secs(15),
        observation_window: Duration::from_secs(15),
        ..Settings::default()
    }
}

fn plan(
    pa: &PoolAutoscaler,
    set: Option<&SandboxSet>,
    memory: &Memory,
    settings: &Settings,
    now: Timestamp,
) -> Planned {
    let zones = load_zones(pa);
    plan_with(pa, set, 0, &zones, memory, settings, now)
}

fn plan_with(
    pa: &PoolAutoscaler,
    set: Option<&SandboxSet>,
    ready_since: i32,
    zones: &Zones,
    memory: &Memory,
    settings: &Settings,
    now: Timestamp,
) -> Planned {
    let target = match set {
        Some(set) => Target::Found { set, ready_since },
        None => Target::NotFound,
    };
    let observed = Observed { autoscaler: pa, target, older: None, zones };
    plan_pool_autoscaler(&observed, memory, settings, now)
}

fn scaled_to(planned: &Planned) -> Option<i32> {
    planned.plan.actions.iter().find_map(|a| match a {
        AutoscalerAction::Scale { to, .. } => Some(*to),
        _ => None,
    })
}

fn status_of(planned: &Planned) -> Option<&PoolAutoscalerStatus> {
    planned.plan.actions.iter().find_map(|a| match a {
        AutoscalerAction::UpdateStatus(s) => Some(s.as_ref()),
        _ => None,
    })
}

fn events(planned: &Planned) -> Vec<(&'static str, String)> {
    planned
        .plan
        .actions
        .iter()
        .filter_map(|a| match a {
            AutoscalerAction::Event { reason, message, .. } => Some((*reason, message.clone())),
            _ => None,
        })
        .collect()
}

fn condition(status: &PoolAutoscalerStatus, type_: &str) -> (String, String) {
    let c = find(status.conditions.as_deref().unwrap_or_default(), type_).unwrap();
    (c.status.clone(), c.reason.clone())
}

/// A running autoscaler and its pool: each step plans, then applies the plan's status and
/// scale as the executor would.
struct Sim {
    pa: PoolAutoscaler,
    set: SandboxSet,
    memory: Memory,
    settings: Settings,
}

impl Sim {
    fn new(pa: PoolAutoscaler, current: i32, settings: Settings) -> Sim {
        Sim { pa, set: pool(current, current, current), memory: Memory::default(), settings }
    }

    /// One pass at `now` with the pool's status showing `observed` and `available`.
    fn step(&mut self, now: Timestamp, observed: i32, available: i32, ready_since: i32) -> Planned {
        let status = self.set.status.get_or_insert_with(Default::default);
        status.replicas = observed;
        status.available_replicas = available;
        let zones = load_zones(&self.pa);
        let planned = plan_with(
            &self.pa,
            Some(&self.set),
            ready_since,
            &zones,
            &self.memory,
            &self.settings,
            now,
        );
        self.memory = planned.memory.clone();
        if let Some(to) = scaled_to(&planned) {
            self.set.spec.replicas = to;
        }
        if let Some(status) = status_of(&planned) {
            self.pa.status = Some(status.clone());
        }
        planned
    }

    fn current(&self) -> i32 {
        self.set.spec.replicas
    }
}

#[test]
fn vectors_absolute_target() {
    // target 10, tol 5: (current, available) → final, with observed == current.
    let cases = [(1, 1, 10), (10, 0, 20), (20, 0, 30), (30, 30, 10), (10, 10, 10), (10, 5, 10)];
    for (current, available, expected) in cases {
        let mut pa = autoscaler(0, 100);
        pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(5), 0, 0));
        let set = pool(current, current, available);
        let planned = plan(&pa, Some(&set), &Memory::default(), &one_sample(), t0());
        assert_eq!(scaled_to(&planned).unwrap_or(current), expected, "({current},{available})");
    }
}

#[test]
fn vectors_percent_target() {
    // target 70 %, tol 10 %: the proposal's chain, each final the next current.
    let chain = [
        (4, 4, 4),
        (4, 0, 7),
        (7, 0, 12),
        (12, 0, 21),
        (21, 0, 36),
        (36, 36, 26),
        (26, 26, 19),
        (19, 19, 14),
        (14, 14, 10),
        (10, 10, 7),
        (7, 7, 5),
        (5, 5, 4),
        (4, 4, 4),
    ];
    let mut pa = autoscaler(0, 100);
    pa.spec.capacity_policy = Some(capacity(percent(70), percent(10), 0, 0));
    let mut sim = Sim::new(pa, 4, one_sample());
    for (i, (current, available, expected)) in chain.into_iter().enumerate() {
        assert_eq!(sim.current(), current, "step {i}");
        // Claims happen between ticks: what the last scale-up added became ready and was
        // claimed, so the guard has no effect.
        sim.step(at(15 * i as i64), current, available, 1000);
        assert_eq!(sim.current(), expected, "step {i}: ({current},{available})");
    }
}

#[test]
fn vectors_cron_within_bounds() {
    // min 30, max 50; 08:00 → 100, 20:00 → 20 (UTC).
    let mut pa = autoscaler(30, 50);
    pa.spec.cron_policies =
        Some(vec![cron("morning", "0 8 * * *", 100), cron("evening", "0 20 * * *", 20)]);
    let mut sim = Sim::new(pa, 40, Settings::default());
    sim.step(ts("2026-01-05T07:00:00Z"), 40, 40, 0);
    assert_eq!(sim.current(), 40, "nothing due at creation");
    let planned = sim.step(ts("2026-01-05T08:00:01Z"), 40, 40, 0);
    assert_eq!(sim.current(), 50);
    assert_eq!(
        events(&planned),
        [(event_reason::SUCCESSFUL_RESCALE, "New size: 50; reason: above maxReplicas".to_owned())]
    );
    sim.step(ts("2026-01-05T20:00:01Z"), 50, 50, 0);
    assert_eq!(sim.current(), 30);
}

#[test]
fn vectors_bounds_only() {
    for (current, expected) in [(3, 5), (12, 10), (7, 7)] {
        let pa = autoscaler(5, 10);
        let set = pool(current, current, current);
        let planned = plan(&pa, Some(&set), &Memory::default(), &Settings::default(), t0());
        assert_eq!(scaled_to(&planned).unwrap_or(current), expected, "{current}");
        let status = status_of(&planned).unwrap();
        assert_eq!(condition(status, SCALING_ACTIVE), ("True".into(), active::BOUNDS_ONLY.into()));
        let limited = condition(status, SCALING_LIMITED).1;
        let want = match current {
            3 => limited::TOO_FEW_REPLICAS,
            12 => limited::TOO_MANY_REPLICAS,
            _ => limited::DESIRED_WITHIN_RANGE,
        };
        assert_eq!(limited, want);
        assert_eq!(planned.plan.requeue_after, Some(RESYNC));
    }
}

#[test]
fn vectors_scale_down_window() {
    // target 10, tol 5, scale-down window 300: at (30,30) a 30 recommended 15 s before holds.
    let mut pa = autoscaler(0, 100);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(5), 0, 300));
    let mut sim = Sim::new(pa, 30, one_sample());
    sim.memory = Memory {
        identity: Some(("pool".into(), Mode::Capacity)),
        history: vec![Recommendation { at: at(-15), replicas: 30 }],
        ..Memory::default()
    };
    let planned = sim.step(at(0), 30, 30, 0);
    assert_eq!(sim.current(), 30);
    let status = status_of(&planned).unwrap();
    assert_eq!(
        condition(status, ABLE_TO_SCALE),
        ("True".into(), able::SCALE_DOWN_STABILIZED.into())
    );
    sim.step(at(270), 30, 30, 0);
    assert_eq!(sim.current(), 30, "the 30 is still in the window");
    sim.step(at(285), 30, 30, 0);
    assert_eq!(sim.current(), 10, "the 30 aged out");
}

#[test]
fn a_restart_never_scales_down_before_a_full_window() {
    let mut pa = autoscaler(0, 100);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(5), 0, 300));
    let mut sim = Sim::new(pa, 30, one_sample());
    sim.step(at(0), 30, 30, 0);
    assert_eq!(sim.current(), 30, "the history starts with (now, 30)");
    sim.step(at(285), 30, 30, 0);
    assert_eq!(sim.current(), 30);
    sim.step(at(300), 30, 30, 0);
    assert_eq!(sim.current(), 10);
}

#[test]
fn suspension_stops_everything_and_skips_the_fires_it_spans() {
    let mut pa = autoscaler(5, 10);
    pa.spec.suspend = true;
    pa.spec.cron_policies = Some(vec![cron("hourly", "0 * * * *", 8)]);
    pa.status = Some(PoolAutoscalerStatus {
        applied_cron_policies: Some(vec![AppliedCronPolicy {
            name: "hourly".into(),
            last_schedule_time: Some(Time(ts("2026-01-05T06:00:00Z"))),
            observed_time: Some(Time(ts("2026-01-05T05:00:00Z"))),
        }]),
        ..PoolAutoscalerStatus::default()
    });
    let mut sim = Sim::new(pa, 2, Settings::default());
    let planned = sim.step(ts("2026-01-05T09:30:00Z"), 2, 2, 0);
    assert_eq!(scaled_to(&planned), None, "not even bounds");
    let status = status_of(&planned).unwrap();
    assert_eq!(status.suspended, Some(true));
    assert_eq!(condition(status, SCALING_ACTIVE), ("False".into(), active::SUSPENDED.into()));
    assert_eq!(planned.plan.requeue_after, Some(RESYNC));

    sim.pa.spec.suspend = false;
    let planned = sim.step(ts("2026-01-05T09:40:00Z"), 2, 2, 0);
    assert_eq!(scaled_to(&planned), Some(5), "bounds again, but no catch-up of 07:00..09:00");
    let status = status_of(&planned).unwrap();
    assert_eq!(status.suspended, Some(false));
    let applied = &status.applied_cron_policies.as_ref().unwrap()[0];
    assert_eq!(applied.observed_time, Some(Time(ts("2026-01-05T09:40:00Z"))));
    assert_eq!(applied.last_schedule_time, Some(Time(ts("2026-01-05T06:00:00Z"))));
    sim.step(ts("2026-01-05T10:00:01Z"), 5, 5, 0);
    assert_eq!(sim.current(), 8, "the next fire applies");
}

#[test]
fn a_target_that_cannot_be_scaled_blocks_with_a_reason() {
    // Not a SandboxSet.
    let mut pa = autoscaler(1, 3);
    pa.spec.scale_target_ref.kind = "Deployment".into();
    let planned = plan(&pa, Some(&pool(0, 0, 0)), &Memory::default(), &Settings::default(), t0());
    assert_eq!(scaled_to(&planned), None);
    assert_eq!(
        condition(status_of(&planned).unwrap(), ABLE_TO_SCALE),
        ("False".into(), able::INVALID_TARGET.into())
    );
    assert_eq!(planned.plan.requeue_after, None);

    // Missing: a warning once, then only the retry.
    let mut pa = autoscaler(1, 3);
    let planned = plan(&pa, None, &Memory::default(), &Settings::default(), t0());
    assert_eq!(
        events(&planned),
        [(event_reason::TARGET_NOT_FOUND, "SandboxSet pool not found".to_owned())]
    );
    assert_eq!(planned.plan.requeue_after, Some(TARGET_NOT_FOUND_RETRY));
    pa.status = status_of(&planned).cloned();
    let again = plan(&pa, None, &planned.memory, &Settings::default(), at(30));
    assert!(again.plan.actions.is_empty(), "{:?}", again.plan.actions);

    // Ambiguous: the younger one stands down.
    let pa = autoscaler(1, 3);
    let set = pool(0, 0, 0);
    let zones = Zones::new();
    let observed = Observed {
        autoscaler: &pa,
        target: Target::Found { set: &set, ready_since: 0 },
        older: Some("first"),
        zones: &zones,
    };
    let planned = plan_pool_autoscaler(&observed, &Memory::default(), &Settings::default(), t0());
    assert_eq!(scaled_to(&planned), None, "bounds are the older one's business");
    assert_eq!(
        events(&planned),
        [(
            event_reason::AMBIGUOUS_TARGET,
            "PoolAutoscaler first already targets SandboxSet pool".to_owned()
        )]
    );
}

#[test]
fn failed_reads_and_writes_of_the_target_warn_once() {
    let pa = autoscaler(1, 3);
    let plan = plan_failed_get(&pa, "store unavailable", t0());
    let events: Vec<_> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            AutoscalerAction::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(events, [event_reason::FAILED_GET_SCALE]);
    let Some(AutoscalerAction::UpdateStatus(status)) = plan.actions.last() else {
        panic!("{plan:?}")
    };
    assert_eq!(condition(status, ABLE_TO_SCALE), ("False".into(), able::FAILED_GET_SCALE.into()));
    let mut failed = pa.clone();
    failed.status = Some((**status).clone());
    assert!(plan_failed_get(&failed, "store unavailable", at(10)).actions.is_empty());

    let plan = plan_failed_rescale(&failed, "disk full", at(20));
    let Some(AutoscalerAction::UpdateStatus(status)) = plan.actions.last() else {
        panic!("{plan:?}")
    };
    assert_eq!(
        condition(status, ABLE_TO_SCALE),
        ("False".into(), able::FAILED_UPDATE_SCALE.into())
    );
    assert!(matches!(
        &plan.actions[0],
        AutoscalerAction::Event { reason: event_reason::FAILED_RESCALE, .. }
    ));
}

#[test]
fn the_oldest_autoscaler_of_a_target_acts() {
    let make = |name: &str, created: i64, target: &str| {
        let mut pa = autoscaler(0, 1);
        pa.metadata.name = Some(name.into());
        pa.metadata.uid = Some(format!("{name}-uid"));
        pa.metadata.creation_timestamp = Some(Time(at(created)));
        pa.spec.scale_target_ref.name = target.into();
        Arc::new(pa)
    };
    let all = vec![
        make("b", 0, "pool"),
        make("a", 0, "pool"),
        make("old", -10, "other"),
        make("c", 5, "pool"),
    ];
    assert_eq!(older_autoscaler(&all[0], &all), Some("a"), "same time: by name");
    assert_eq!(older_autoscaler(&all[1], &all), None);
    assert_eq!(older_autoscaler(&all[3], &all), Some("a"));
    assert_eq!(older_autoscaler(&all[2], &all), None, "another target");
}

#[test]
fn an_unknown_zone_or_schedule_stops_the_autoscaler_bounds_included() {
    let mut pa = autoscaler(5, 10);
    let mut policy = cron("morning", "0 8 * * *", 8);
    policy.time_zone = Some("Mars/Olympus".into());
    pa.spec.cron_policies = Some(vec![policy]);
    let planned = plan(&pa, Some(&pool(1, 1, 1)), &Memory::default(), &Settings::default(), t0());
    assert_eq!(scaled_to(&planned), None);
    let status = status_of(&planned).unwrap();
    assert_eq!(
        condition(status, SCALING_ACTIVE),
        ("False".into(), active::UNKNOWN_TIME_ZONE.into())
    );
    assert_eq!(events(&planned)[0].0, event_reason::UNKNOWN_TIME_ZONE);

    let mut pa = autoscaler(5, 10);
    pa.spec.cron_policies = Some(vec![cron("bad", "0 8 * *", 8)]);
    let planned = plan(&pa, Some(&pool(1, 1, 1)), &Memory::default(), &Settings::default(), t0());
    assert_eq!(scaled_to(&planned), None);
    assert_eq!(
        events(&planned),
        [(
            event_reason::INVALID_SCHEDULE,
            "cron policy bad: expected 5 fields (minute hour day-of-month month day-of-week), found 4".to_owned()
        )]
    );
}

#[test]
fn cron_policies_use_their_zone() {
    let mut pa = autoscaler(0, 100);
    let mut policy = cron("morning", "0 8 * * *", 40);
    policy.time_zone = Some("Asia/Shanghai".into());
    pa.spec.cron_policies = Some(vec![policy]);
    let mut sim = Sim::new(pa, 10, Settings::default());
    sim.step(ts("2026-01-04T23:00:00Z"), 10, 10, 0);
    let planned = sim.step(ts("2026-01-05T00:00:00Z"), 10, 10, 0);
    assert_eq!(sim.current(), 40, "08:00 in Shanghai is midnight UTC");
    assert_eq!(
        events(&planned)[0].1,
        "New size: 40; reason: cron policy morning fired at 2026-01-05T00:00:00Z"
    );
    assert_eq!(planned.plan.requeue_after, Some(RESYNC), "the next fire is a day away");
}

#[test]
fn only_the_latest_missed_fire_applies_after_downtime() {
    let mut pa = autoscaler(0, 100);
    pa.spec.cron_policies = Some(vec![cron("daily", "0 8 * * *", 30)]);
    pa.status = Some(PoolAutoscalerStatus {
        applied_cron_policies: Some(vec![AppliedCronPolicy {
            name: "daily".into(),
            last_schedule_time: Some(Time(ts("2026-01-01T08:00:00Z"))),
            observed_time: Some(Time(ts("2025-12-01T00:00:00Z"))),
        }]),
        ..PoolAutoscalerStatus::default()
    });
    let mut sim = Sim::new(pa, 10, Settings::default());
    let planned = sim.step(ts("2026-01-05T09:00:00Z"), 10, 10, 0);
    assert_eq!(sim.current(), 30);
    assert_eq!(
        events(&planned),
        [
            (
                event_reason::MISSED_SCHEDULE,
                "cron policy daily applied its fire of 2026-01-05T08:00:00Z late; 3 earlier fires skipped".to_owned()
            ),
            (
                event_reason::SUCCESSFUL_RESCALE,
                "New size: 30; reason: cron policy daily fired at 2026-01-05T08:00:00Z".to_owned()
            ),
        ]
    );
    let applied = &sim.pa.status.as_ref().unwrap().applied_cron_policies.as_ref().unwrap()[0];
    assert_eq!(applied.last_schedule_time, Some(Time(ts("2026-01-05T08:00:00Z"))));

    // A manual change between fires persists.
    sim.set.spec.replicas = 12;
    sim.step(ts("2026-01-05T12:00:00Z"), 12, 12, 0);
    assert_eq!(sim.current(), 12);
}

#[test]
fn the_latest_due_fire_wins_then_the_larger_target_then_the_list() {
    type Policies = &'static [(&'static str, &'static str, i32)];
    let cases: &[(Policies, i32)] = &[
        // 07:00 and 08:00 both due: 08:00 is later.
        (&[("a", "0 8 * * *", 3), ("b", "0 7 * * *", 9)], 3),
        // Same instant: the larger target.
        (&[("a", "0 8 * * *", 3), ("b", "0 8 * * *", 9)], 9),
        // Same instant and target: the first listed (either way, 4).
        (&[("a", "0 8 * * *", 4), ("b", "0 8 * * 1", 4)], 4),
    ];
    for (policies, expected) in cases {
        let mut pa = autoscaler(0, 100);
        pa.spec.cron_policies = Some(policies.iter().map(|(n, s, t)| cron(n, s, *t)).collect());
        let mut sim = Sim::new(pa, 1, Settings::default());
        sim.step(ts("2026-01-05T06:00:00Z"), 1, 1, 0);
        sim.step(ts("2026-01-05T08:30:00Z"), 1, 1, 0);
        assert_eq!(sim.current(), *expected, "{policies:?}");
        let applied = sim.pa.status.as_ref().unwrap().applied_cron_policies.clone().unwrap();
        assert!(
            applied.iter().all(|a| a.last_schedule_time.is_some()),
            "every due policy is consumed"
        );
    }
}

#[test]
fn a_new_or_changed_policy_waits_for_its_next_fire() {
    let mut pa = autoscaler(0, 100);
    pa.spec.cron_policies = Some(vec![cron("p", "0 8 * * *", 20)]);
    let mut sim = Sim::new(pa, 1, Settings::default());
    sim.step(ts("2026-01-05T09:00:00Z"), 1, 1, 0);
    assert_eq!(sim.current(), 1, "no backfill of today's 08:00");
    // Editing the schedule moves its baseline to now.
    sim.pa.spec.cron_policies = Some(vec![cron("p", "30 8 * * *", 20)]);
    sim.step(ts("2026-01-05T09:10:00Z"), 1, 1, 0);
    assert_eq!(sim.current(), 1);
    // A removed policy leaves the status.
    sim.pa.spec.cron_policies = Some(vec![cron("q", "0 10 * * *", 7)]);
    sim.step(ts("2026-01-05T09:20:00Z"), 1, 1, 0);
    let names: Vec<String> = sim
        .pa
        .status
        .as_ref()
        .unwrap()
        .applied_cron_policies
        .iter()
        .flatten()
        .map(|a| a.name.clone())
        .collect();
    assert_eq!(names, ["q"]);
    let planned = sim.step(ts("2026-01-05T09:59:00Z"), 1, 1, 0);
    assert_eq!(
        planned.plan.requeue_after,
        Some(Duration::from_secs(61)),
        "one second after the fire"
    );
    sim.step(ts("2026-01-05T10:00:01Z"), 1, 1, 0);
    assert_eq!(sim.current(), 7);
}

#[test]
fn a_stale_target_status_skips_the_tick() {
    let mut pa = autoscaler(0, 100);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(0), 0, 0));
    let mut sim = Sim::new(pa, 5, one_sample());
    sim.set.metadata.generation = Some(2);
    let planned = sim.step(at(0), 5, 0, 0);
    assert_eq!(scaled_to(&planned), None);
    assert!(sim.memory.samples.is_empty(), "no sample of a lagging status");
    sim.step(at(59), 5, 0, 0);
    let conditions = sim.pa.status.as_ref().unwrap().conditions.clone().unwrap_or_default();
    assert!(find(&conditions, SCALING_ACTIVE).is_none(), "not yet a minute");
    sim.step(at(60), 5, 0, 0);
    let active = condition(sim.pa.status.as_ref().unwrap(), SCALING_ACTIVE);
    assert_eq!(active, ("False".into(), active::STALE_TARGET_STATUS.into()));
    sim.set.status.as_mut().unwrap().observed_generation = Some(2);
    sim.step(at(75), 5, 0, 0);
    assert_eq!(sim.current(), 15);
}

#[test]
fn passes_between_ticks_enforce_bounds_only() {
    let mut pa = autoscaler(2, 50);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(0), 0, 0));
    let mut sim = Sim::new(pa, 5, Settings::default());
    sim.step(at(0), 5, 5, 0);
    assert_eq!(sim.current(), 10);
    // A manual scale 3 s later: within half an interval, so no decision, only bounds.
    sim.set.spec.replicas = 60;
    let planned = sim.step(at(3), 10, 10, 0);
    assert_eq!(sim.current(), 50);
    assert_eq!(planned.plan.requeue_after, Some(Duration::from_secs(12)), "the next tick");
    assert_eq!(sim.memory.samples.len(), 1);
    let able = condition(sim.pa.status.as_ref().unwrap(), ABLE_TO_SCALE);
    assert_eq!(able, ("True".into(), able::SUCCEEDED_RESCALE.into()));
    // Another pass between ticks decides nothing: the last rescale stays the news.
    let planned = sim.step(at(5), 10, 10, 0);
    assert_eq!(scaled_to(&planned), None);
    let able = condition(sim.pa.status.as_ref().unwrap(), ABLE_TO_SCALE);
    assert_eq!(able, ("True".into(), able::SUCCEEDED_RESCALE.into()));
    // The next tick decides on the means of both samples.
    sim.step(at(15), 50, 50, 0);
    assert_eq!(sim.memory.samples.len(), 2);
}

#[test]
fn the_in_flight_guard_keeps_slow_creations_from_counting_as_demand() {
    // 10 creating, none available, no new claims: settles at 20, never runs away.
    let mut pa = autoscaler(0, 1000);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(5), 0, 0));
    let mut sim = Sim::new(pa, 10, one_sample());
    sim.step(at(0), 10, 0, 0);
    assert_eq!(sim.current(), 20);
    let pending = sim.pa.status.as_ref().unwrap().pending_scale_up.clone().unwrap();
    assert_eq!((pending.start_time.0, pending.replicas), (at(0), 10));
    for i in 1..10 {
        sim.step(at(15 * i), 20, 0, 0);
        assert_eq!(sim.current(), 20, "tick {i}");
    }
    // Half of them ready: the guard still holds the other half.
    sim.step(at(150), 20, 5, 5);
    assert_eq!(sim.current(), 20);
    // All ready: the record is cleared.
    sim.step(at(165), 20, 10, 10);
    assert_eq!(sim.pa.status.as_ref().unwrap().pending_scale_up, None);
    assert_eq!(sim.current(), 20, "10 used + target 10");
}

#[test]
fn the_in_flight_guard_expires_after_the_settle_timeout() {
    let mut pa = autoscaler(0, 1000);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(5), 0, 0));
    let mut sim = Sim::new(pa, 10, one_sample());
    sim.step(at(0), 10, 0, 0);
    sim.step(at(285), 20, 0, 0);
    assert_eq!(sim.current(), 20);
    sim.step(at(300), 20, 0, 0);
    assert_eq!(sim.current(), 30, "without the guard the creating ones count as used");
    let pending = sim.pa.status.as_ref().unwrap().pending_scale_up.clone().unwrap();
    assert_eq!((pending.start_time.0, pending.replicas), (at(300), 10), "a new record");
}

#[test]
fn a_percent_target_warns_once_on_an_empty_pool() {
    let mut pa = autoscaler(0, 10);
    pa.spec.capacity_policy = Some(capacity(percent(50), percent(10), 0, 0));
    let mut sim = Sim::new(pa, 0, one_sample());
    let planned = sim.step(at(0), 0, 0, 0);
    assert_eq!(events(&planned)[0].0, event_reason::PERCENT_TARGET_FROM_ZERO);
    assert_eq!(sim.current(), 0);
    let planned = sim.step(at(15), 0, 0, 0);
    assert!(events(&planned).is_empty());
}

#[test]
fn an_invalid_capacity_amount_enforces_bounds_only() {
    let mut pa = autoscaler(3, 10);
    pa.spec.capacity_policy =
        Some(capacity(IntOrString::String("lots".into()), IntOrString::Int(0), 0, 0));
    let planned = plan(&pa, Some(&pool(1, 1, 0)), &Memory::default(), &one_sample(), t0());
    assert_eq!(scaled_to(&planned), Some(3));
    assert_eq!(
        condition(status_of(&planned).unwrap(), SCALING_ACTIVE),
        ("False".into(), INVALID_CAPACITY_POLICY.into())
    );
}

#[test]
fn both_policy_kinds_fall_back_to_bounds() {
    let mut pa = autoscaler(3, 10);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(5), IntOrString::Int(0), 0, 0));
    pa.spec.cron_policies = Some(vec![cron("p", "* * * * *", 9)]);
    let planned = plan(&pa, Some(&pool(12, 12, 0)), &Memory::default(), &one_sample(), t0());
    assert_eq!(scaled_to(&planned), Some(10));
    assert_eq!(
        condition(status_of(&planned).unwrap(), SCALING_ACTIVE),
        ("False".into(), active::INVALID_POLICY_COMBINATION.into())
    );
}

#[test]
fn a_new_target_or_policy_kind_starts_over() {
    let mut pa = autoscaler(0, 100);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(10), IntOrString::Int(5), 0, 0));
    let mut sim = Sim::new(pa, 10, one_sample());
    sim.step(at(0), 10, 0, 0);
    assert_eq!(sim.current(), 20);
    // The old target's in-flight record would hide 10 creating sandboxes of the new one.
    sim.pa.spec.scale_target_ref.name = "other".into();
    sim.set.metadata.name = Some("other".into());
    sim.step(at(15), 20, 0, 0);
    assert_eq!(sim.current(), 30, "20 creating count as used: no guard carried over");
    let pending = sim.pa.status.as_ref().unwrap().pending_scale_up.clone().unwrap();
    assert_eq!(pending.start_time.0, at(15));
    assert_eq!(sim.memory.identity, Some(("other".into(), Mode::Capacity)));
    assert_eq!(sim.memory.samples.len(), 1);
}

#[test]
fn replanning_what_was_written_writes_nothing() {
    let mut pa = autoscaler(2, 8);
    pa.spec.capacity_policy = Some(capacity(IntOrString::Int(3), IntOrString::Int(0), 0, 0));
    let mut sim = Sim::new(pa, 1, Settings::default());
    let first = sim.step(at(0), 1, 0, 0);
    assert_eq!(scaled_to(&first), Some(4));
    // The same observation of the pool (its status has not caught up yet).
    let again = sim.step(at(0), 1, 0, 0);
    assert!(again.plan.actions.is_empty(), "{:?}", again.plan.actions);

    let mut pa = autoscaler(0, 100);
    pa.spec.cron_policies = Some(vec![cron("p", "0 8 * * *", 20)]);
    let mut sim = Sim::new(pa, 1, Settings::default());
    sim.step(ts("2026-01-05T07:00:00Z"), 1, 1, 0);
    sim.step(ts("2026-01-05T08:00:00Z"), 1, 1, 0);
    let again = sim.step(ts("2026-01-05T08:00:00Z"), 1, 1, 0);
    assert!(again.plan.actions.is_empty(), "{:?}", again.plan.actions);
}

#[test]
fn ready_since_counts_the_scale_ups_ready_or_claimed_sandboxes() {
    use oka_api::SandboxPhase;
    let make = |created: i64, ready: bool, claimed: bool| {
        let mut builder = Sandbox::test().pooled("pool").phase(SandboxPhase::Running);
        builder = if ready { builder.ready() } else { builder.not_ready() };
        if claimed {
            builder = builder.claimed();
        }
        let mut sandbox = builder.build();
        sandbox.metadata.creation_timestamp = Some(Time(at(created)));
        Arc::new(sandbox)
    };
    let sandboxes = vec![
        make(-10, true, false), // before the scale-up
        make(0, true, false),   // available
        make(5, false, false),  // still creating
        make(7, true, true),    // claimed
    ];
    assert_eq!(ready_since(&sandboxes, "pool", at(0), at(10)), 2);
    assert_eq!(ready_since(&sandboxes, "other", at(0), at(10)), 0);
}

/// One step of random traffic: seconds since the last, the pool's observed and available
/// counts (as fractions of what the pool could hold), and sometimes a manual scale.
#[derive(Debug, Clone)]
struct Step {
    dt: i64,
    used: i32,
    ready: i32,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (1i64..40, 0i32..60, 0i32..=100).prop_map(|(dt, used, ready)| Step { dt, used, ready }),
        1..80,
    )
}

fn policy() -> impl Strategy<Value = CapacityPolicy> {
    let amount = prop_oneof![(0i32..40).prop_map(IntOrString::Int), (0u32..=100).prop_map(percent)];
    (amount.clone(), amount, 0i32..120, 0i32..400)
        .prop_map(|(target, tol, up, down)| capacity(target, tol, up, down))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every write is within the bounds, whatever the traffic, the policy and manual scales.
    #[test]
    fn never_outside_the_bounds(
        min in 0i32..20,
        span in 1i32..40,
        start in 0i32..80,
        policy in policy(),
        steps in steps(),
        manual in prop::collection::vec(prop::option::weighted(0.1, 0i32..100), 80),
    ) {
        let max = min + span;
        let mut pa = autoscaler(min, max);
        pa.spec.capacity_policy = Some(policy);
        let mut sim = Sim::new(pa, start, Settings::default());
        let mut now = 0;
        for (i, step) in steps.iter().enumerate() {
            now += step.dt;
            if let Some(Some(replicas)) = manual.get(i) {
                sim.set.spec.replicas = *replicas;
            }
            let current = sim.current();
            let available = (current * step.ready / 100).min(current);
            let observed = current + step.used.min(current);
            let planned = sim.step(at(now), observed.max(available), available, 0);
            if let Some(to) = scaled_to(&planned) {
                prop_assert!((min..=max).contains(&to), "{to} outside {min}..={max}");
            }
            let desired = sim.pa.status.as_ref().and_then(|s| s.desired_replicas).unwrap_or(min);
            prop_assert!((min..=max).contains(&desired));
        }
    }

    /// No scale-down within the scale-down window of a scale-up, and no scale-up within the
    /// scale-up window of a scale-down, when nobody else scales the pool.
    #[test]
    fn never_flapping_within_a_window(
        min in 0i32..5,
        span in 1i32..80,
        start in 0i32..40,
        policy in policy(),
        steps in steps(),
    ) {
        let max = min + span;
        let up = i64::from(policy.scale_up_window_seconds());
        let down = i64::from(policy.scale_down_window_seconds());
        let mut pa = autoscaler(min, max);
        pa.spec.capacity_policy = Some(policy);
        let mut sim = Sim::new(pa, start.clamp(min, max), Settings::default());
        let mut now = 0;
        let mut last_up: Option<i64> = None;
        let mut last_down: Option<i64> = None;
        for step in &steps {
            now += step.dt;
            let current = sim.current();
            let available = (current * step.ready / 100).min(current);
            let observed = current + step.used.min(current);
            let planned = sim.step(at(now), observed.max(available), available, 0);
            if let Some(to) = scaled_to(&planned) {
                if to > current {
                    if let Some(t) = last_down {
                        prop_assert!(now - t >= up, "up at {now} {}s after a down (window {up})", now - t);
                    }
                    last_up = Some(now);
                } else {
                    if let Some(t) = last_up {
                        prop_assert!(now - t >= down, "down at {now} {}s after an up (window {down})", now - t);
                    }
                    last_down = Some(now);
                }
            }
        }
    }
}
