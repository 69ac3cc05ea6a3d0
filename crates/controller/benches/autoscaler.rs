//! Autoscaler simulation: a synthetic day of bursty claim traffic replayed through the pure
//! PoolAutoscaler planner with a simulated clock, against fixed pools.
//!
//! Traffic (seeded, the same for every pool): a diurnal rate of claims (0.01/s at night, up to
//! 0.15/s in the afternoon) plus bursts (a dozen a day in working hours, each 0.5 to 1.5
//! claims/s for 20 to 90 s). A claim takes an available sandbox, or it is an **empty-pool
//! answer**. The pool is refilled at once, as the SandboxSet controller does, and a new sandbox
//! is ready 5 to 20 s after it is created. **Idle sandbox-hours** are the pool's unclaimed
//! sandboxes (creating or available) integrated over the day: what a warm pool costs.
//!
//! Each autoscaler policy is compared with the fixed pools around its mean size: the fixed
//! pool of the same mean size (rounded up, so it has at least the autoscaler's idle hours) and
//! the smallest fixed pool that answers as few claims empty, with its idle hours.
//!
//! `cargo bench -p oka-controller --bench autoscaler` (env `DAYS`, default 7; `SEED`,
//! default 1).
#![allow(clippy::unwrap_used, missing_docs)]

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use oka_api::poolautoscaler::{CapacityPolicy, PoolAutoscalerSpec, ScaleTargetRef, ScalingRules};
use oka_api::{PoolAutoscaler, SandboxSet, SandboxSetSpec, SandboxSetStatus};
use oka_controller::poolautoscaler::{
    AutoscalerAction, Memory, Observed, Settings, Target, Zones, plan_pool_autoscaler,
};

const DAY: usize = 86_400;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// SplitMix64: a small seeded generator, enough for synthetic traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }

    /// A Poisson draw (Knuth's method; the rates here are small).
    fn poisson(&mut self, lambda: f64) -> u32 {
        let limit = (-lambda).exp();
        let mut product = self.unit();
        let mut count = 0;
        while product > limit {
            count += 1;
            product *= self.unit();
        }
        count
    }
}

/// Claims arriving in each second of `days` days.
fn traffic(days: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    let mut rate = vec![0.0f64; days * DAY];
    for (t, r) in rate.iter_mut().enumerate() {
        let hour = (t % DAY) as f64 / 3600.0;
        let diurnal = if (7.0..21.0).contains(&hour) {
            (std::f64::consts::PI * (hour - 7.0) / 14.0).sin()
        } else {
            0.0
        };
        *r = 0.01 + 0.14 * diurnal;
    }
    for day in 0..days {
        for _ in 0..12 {
            let start = day * DAY + (rng.range(8.0, 20.0) * 3600.0) as usize;
            let length = rng.range(20.0, 90.0) as usize;
            let extra = rng.range(0.5, 1.5);
            for r in rate.iter_mut().skip(start).take(length) {
                *r += extra;
            }
        }
    }
    rate.into_iter().map(|r| rng.poisson(r)).collect()
}

/// One sandbox the pool created.
#[derive(Clone, Copy)]
struct Member {
    created: usize,
    ready: usize,
    claimed: bool,
    gone: bool,
}

#[derive(Default, Debug, Clone, Copy)]
struct Outcome {
    claims: u64,
    empty: u64,
    idle_seconds: u64,
    scales: u64,
}

impl Outcome {
    fn idle_hours(&self) -> f64 {
        self.idle_seconds as f64 / 3600.0
    }

    fn mean_pool(&self, seconds: usize) -> f64 {
        self.idle_seconds as f64 / seconds as f64
    }
}

struct Pool {
    members: Vec<Member>,
    replicas: i32,
    rng: Rng,
}

impl Pool {
    fn unclaimed(&self) -> impl Iterator<Item = (usize, &Member)> {
        self.members.iter().enumerate().filter(|(_, m)| !m.claimed && !m.gone)
    }

    fn counts(&self, t: usize) -> (i32, i32) {
        let (mut creating, mut available) = (0, 0);
        for (_, m) in self.unclaimed() {
            if m.ready <= t {
                available += 1;
            } else {
                creating += 1;
            }
        }
        (creating, available)
    }

    /// The SandboxSet controller: create the shortfall, delete the excess (creating first,
    /// newest first).
    fn reconcile(&mut self, t: usize) {
        let (creating, available) = self.counts(t);
        let members = creating + available;
        for _ in members..self.replicas {
            let ready = t + self.rng.range(5.0, 20.0) as usize;
            self.members.push(Member { created: t, ready, claimed: false, gone: false });
        }
        if members > self.replicas {
            let mut order: Vec<usize> = self.unclaimed().map(|(i, _)| i).collect();
            order.sort_by_key(|&i| {
                (self.members[i].ready <= t, std::cmp::Reverse(self.members[i].created))
            });
            for &i in order.iter().take((members - self.replicas) as usize) {
                self.members[i].gone = true;
            }
        }
        // Keep the list short: gone members matter no more, claimed ones only for the
        // guard's count, which looks back no further than the settle timeout (5 min).
        if self.members.len() > 256 {
            self.members.retain(|m| !m.gone && (!m.claimed || m.created + 400 > t));
        }
    }

    fn claim(&mut self, t: usize) -> bool {
        let found = self.unclaimed().filter(|(_, m)| m.ready <= t).map(|(i, _)| i).next();
        match found {
            Some(i) => {
                self.members[i].claimed = true;
                true
            }
            None => false,
        }
    }

    fn ready_since(&self, since: usize, t: usize) -> i32 {
        let count = self
            .members
            .iter()
            .filter(|m| !m.gone && m.created >= since && (m.claimed || m.ready <= t))
            .count();
        count as i32
    }
}

fn at(t: usize) -> Timestamp {
    Timestamp::from_second(1_767_225_600 + t as i64).unwrap()
}

/// Runs `arrivals` against a pool of `replicas`, scaled by `autoscaler` when given.
fn simulate(
    arrivals: &[u32],
    replicas: i32,
    autoscaler: Option<&PoolAutoscaler>,
    seed: u64,
) -> Outcome {
    let mut pool = Pool { members: Vec::new(), replicas, rng: Rng(seed ^ 0x5eed) };
    let mut outcome = Outcome::default();
    let settings = Settings::default();
    let interval = settings.sampling_interval.as_secs() as usize;
    let mut pa = autoscaler.cloned();
    let mut memory = Memory::default();
    let zones = Zones::new();
    // The pool starts full and ready.
    for _ in 0..replicas {
        pool.members.push(Member { created: 0, ready: 0, claimed: false, gone: false });
    }
    for (t, &claims) in arrivals.iter().enumerate() {
        for _ in 0..claims {
            outcome.claims += 1;
            if !pool.claim(t) {
                outcome.empty += 1;
            }
        }
        pool.reconcile(t);
        if let Some(pa) = pa.as_mut()
            && t % interval == 0
        {
            let (creating, available) = pool.counts(t);
            let mut set = SandboxSet::new(
                "pool",
                SandboxSetSpec { replicas: pool.replicas, ..Default::default() },
            );
            set.metadata.generation = Some(1);
            set.status = Some(SandboxSetStatus {
                observed_generation: Some(1),
                replicas: creating + available,
                available_replicas: available,
                ..Default::default()
            });
            let since = pa
                .status
                .as_ref()
                .and_then(|s| s.pending_scale_up.as_ref())
                .map(|p| (p.start_time.0.as_second() - 1_767_225_600) as usize);
            let ready_since = since.map_or(0, |since| pool.ready_since(since, t));
            let observed = Observed {
                autoscaler: pa,
                target: Target::Found { set: &set, ready_since },
                older: None,
                zones: &zones,
            };
            let planned = plan_pool_autoscaler(&observed, &memory, &settings, at(t));
            memory = planned.memory;
            for action in planned.plan.actions {
                match action {
                    AutoscalerAction::Scale { to, .. } => {
                        pool.replicas = to;
                        outcome.scales += 1;
                    }
                    AutoscalerAction::UpdateStatus(status) => pa.status = Some(*status),
                    AutoscalerAction::Event { .. } => {}
                }
            }
            pool.reconcile(t);
        }
        let (creating, available) = pool.counts(t);
        outcome.idle_seconds += (creating + available) as u64;
    }
    outcome
}

fn capacity(
    min: i32,
    max: i32,
    target: IntOrString,
    tolerance: IntOrString,
    down: i32,
) -> PoolAutoscaler {
    PoolAutoscaler::new(
        "sim",
        PoolAutoscalerSpec {
            scale_target_ref: ScaleTargetRef::sandbox_set("pool"),
            min_replicas: min,
            max_replicas: max,
            capacity_policy: Some(CapacityPolicy {
                target_available: target,
                tolerance: Some(tolerance),
                scale_up: None,
                scale_down: Some(ScalingRules { stabilization_window_seconds: Some(down) }),
            }),
            ..PoolAutoscalerSpec::default()
        },
    )
}

fn main() {
    let days = env("DAYS", 7) as usize;
    let seed = env("SEED", 1);
    let started = std::time::Instant::now();
    let arrivals = traffic(days, seed);
    let seconds = arrivals.len();
    let policies = [
        ("target 3 ±1, down 300s", capacity(1, 60, IntOrString::Int(3), IntOrString::Int(1), 300)),
        ("target 4 ±1, down 300s", capacity(1, 60, IntOrString::Int(4), IntOrString::Int(1), 300)),
        ("target 6 ±2, down 600s", capacity(2, 60, IntOrString::Int(6), IntOrString::Int(2), 600)),
        (
            "target 50% ±10%, down 300s",
            capacity(
                2,
                60,
                IntOrString::String("50%".into()),
                IntOrString::String("10%".into()),
                300,
            ),
        ),
    ];
    let mut fixed_cache = std::collections::BTreeMap::<i32, Outcome>::new();
    let mut fixed =
        |n: i32| *fixed_cache.entry(n).or_insert_with(|| simulate(&arrivals, n, None, seed));
    let total = fixed(1).claims;
    println!(
        "autoscaler simulation: {days} day(s), seed {seed}, {total} claims, sandboxes ready 5-20 s after creation, 15 s sampling, 60 s window"
    );
    println!(
        "{:<44} {:>14} {:>11} {:>9} {:>8}",
        "pool", "empty", "idle sbx-h", "mean size", "rescales"
    );
    let row = |label: String, o: &Outcome, rescales: Option<u64>| {
        println!(
            "{:<44} {:>14} {:>11.1} {:>9.2} {:>8}",
            label,
            format!("{} ({:.2}%)", o.empty, 100.0 * o.empty as f64 / total.max(1) as f64),
            o.idle_hours(),
            o.mean_pool(seconds),
            rescales.map_or("-".to_owned(), |r| r.to_string())
        );
    };
    for (name, pa) in &policies {
        let auto = simulate(&arrivals, pa.spec.min_replicas.max(1), Some(pa), seed);
        let same = (auto.mean_pool(seconds).ceil() as i32).max(1);
        row(format!("autoscaled: {name}"), &auto, Some(auto.scales));
        row(format!("  fixed pool of {same} (same mean size)"), &fixed(same), None);
        match (same..=same + 40).map(|n| (n, fixed(n))).find(|(_, o)| o.empty <= auto.empty) {
            Some((n, o)) => row(format!("  fixed pool of {n} (as few empty answers)"), &o, None),
            None => println!("  no fixed pool up to {} answers as few claims empty", same + 40),
        }
    }
    println!("(took {:.1?})", started.elapsed());
}
