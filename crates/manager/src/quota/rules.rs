//! The quota's decisions, pure (no IO, no clock): the arithmetic of an acquire and a release
//! (what the reference's Lua scripts do, so the embedded ledger and Redis agree), what an
//! observed change of a sandbox does to its entry, and what one anti-drift pass repairs.
//!
//! The executors are [`super::local`] (applies [`plan_acquire`]/[`plan_release`] to its
//! in-memory sums), [`super::redis`] (runs the same rules as Lua inside Redis) and
//! [`super::antidrift`] (feeds [`plan_event`] and [`plan_subject`] and carries out their
//! verdicts through the backend).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::model::{Dimension, Entry, QuotaSpec, Scope};

/// One change of one sum: `q:sum:{K}:<dimension>[scope] += delta` (then floored at 0).
pub type Delta = (Dimension, Scope, i64);

/// What an acquire does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquirePlan {
    /// A limited sum would go over its limit: nothing is written.
    Rejected,
    /// Apply the non-zero deltas; write the entry when it changed.
    Apply {
        /// The sums' changes.
        deltas: Vec<Delta>,
        /// Whether the stored entry differs from the new one.
        write_entry: bool,
    },
}

/// The change of (dimension, scope) when `old` (if stored) becomes `new`.
fn delta(old: Option<&Entry>, new: &Entry, dimension: Dimension, scope: Scope) -> i64 {
    let added = if new.counts_in(scope) { new.amount(dimension) } else { 0 };
    let removed = match old {
        Some(old) if old.counts_in(scope) => old.amount(dimension),
        _ => 0,
    };
    added - removed
}

/// An upsert of entry `new` where `old` is stored (the acquire script): for every dimension
/// and scope the delta is (scope counts new ? new amount : 0) − (scope counts old ? old amount :
/// 0). Enforcing, a **positive** delta of a limited pair rejects when `sum + delta > limit`;
/// non-positive deltas never reject, so a retried acquire and a repair after a fail-open
/// never fail. `sum` reads the current sums.
pub fn plan_acquire(
    old: Option<&Entry>,
    new: &Entry,
    enforce: bool,
    limits: Option<&QuotaSpec>,
    sum: impl Fn(Dimension, Scope) -> i64,
) -> AcquirePlan {
    if enforce && let Some(limits) = limits {
        for limit in &limits.limits {
            let d = delta(old, new, limit.dimension, limit.scope);
            if d > 0 && sum(limit.dimension, limit.scope).saturating_add(d) > limit.limit {
                return AcquirePlan::Rejected;
            }
        }
    }
    let mut deltas = Vec::new();
    for dimension in Dimension::ALL {
        for scope in Scope::ALL {
            let d = delta(old, new, dimension, scope);
            if d != 0 {
                deltas.push((dimension, scope, d));
            }
        }
    }
    AcquirePlan::Apply { deltas, write_entry: old != Some(new) }
}

/// A release of `old` (the release script): its amounts leave every scope it counts in.
/// Nothing stored: nothing to do.
pub fn plan_release(old: Option<&Entry>) -> Vec<Delta> {
    let Some(old) = old else { return Vec::new() };
    let mut deltas = Vec::new();
    for dimension in Dimension::ALL {
        let amount = old.amount(dimension);
        if amount == 0 {
            continue;
        }
        for scope in Scope::ALL.into_iter().filter(|s| old.counts_in(*s)) {
            deltas.push((dimension, scope, -amount));
        }
    }
    deltas
}

/// A sum after `delta`, floored at 0 as the scripts do.
pub fn apply_delta(sum: i64, delta: i64) -> i64 {
    sum.saturating_add(delta).max(0)
}

/// What the quota of one (owner, lock) should become after its sandbox changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventAction {
    /// Upsert this entry without enforcing (pause, resume, resize: never refused).
    Upsert(Entry),
    /// Release the entry (the sandbox is gone, no longer live, or holds another lock now).
    Release,
}

/// The action for the entry (owner, lock) given what the sandbox that held it looks like now:
/// `current` = its (owner, lock, live) and its entry, `None` when it is gone.
pub fn plan_event(
    owner: &str,
    lock: &str,
    current: Option<((&str, &str), bool, Entry)>,
) -> EventAction {
    match current {
        Some(((o, l), true, entry)) if o == owner && l == lock => EventAction::Upsert(entry),
        _ => EventAction::Release,
    }
}

/// What one anti-drift pass does for one owner.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubjectPlan {
    /// Entries to upsert without enforcing: live sandboxes whose entry is missing or stale.
    pub upserts: Vec<(String, Entry)>,
    /// Entries to release: no live sandbox holds them, they were already seen so on an
    /// earlier pass, and for at least the grace period.
    pub releases: Vec<String>,
    /// The leak candidates to remember for the next pass: lock → when first seen.
    pub leaks: HashMap<String, Instant>,
}

/// One anti-drift pass over one owner: `live` = the entries its live sandboxes should have
/// (by lock), `stored` = what the backend holds, `seen` = leak candidates of earlier passes.
/// Missing or different entries are upserted at once; a stored entry without a live sandbox
/// is released only when the source is `healthy`, it was seen on an earlier pass and
/// `now - first seen >= grace` (the source may lag a create of another manager).
pub fn plan_subject(
    live: &HashMap<String, Entry>,
    stored: &HashMap<String, Entry>,
    seen: &HashMap<String, Instant>,
    now: Instant,
    grace: Duration,
    healthy: bool,
) -> SubjectPlan {
    let mut plan = SubjectPlan::default();
    for (lock, want) in live {
        if stored.get(lock) != Some(want) {
            plan.upserts.push((lock.clone(), *want));
        }
    }
    plan.upserts.sort_by(|a, b| a.0.cmp(&b.0));
    if !healthy {
        return plan;
    }
    for lock in stored.keys().filter(|lock| !live.contains_key(*lock)) {
        match seen.get(lock) {
            Some(first) if now.saturating_duration_since(*first) >= grace => {
                plan.releases.push(lock.clone());
            }
            Some(first) => {
                plan.leaks.insert(lock.clone(), *first);
            }
            None => {
                plan.leaks.insert(lock.clone(), now);
            }
        }
    }
    plan.releases.sort();
    plan
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::model::QuotaLimit;
    use super::*;

    fn entry(cpu: i64, mem: i64, running: bool) -> Entry {
        Entry { cpu_milli: cpu, memory_mib: mem, running }
    }

    fn spec(limits: &[(Dimension, Scope, i64)]) -> QuotaSpec {
        QuotaSpec {
            limits: limits
                .iter()
                .map(|&(dimension, scope, limit)| QuotaLimit { dimension, scope, limit })
                .collect(),
        }
    }

    /// A ledger of sums driven by the plans, as the local backend keeps it.
    #[derive(Default, Debug)]
    struct Ledger {
        entries: HashMap<String, Entry>,
        sums: HashMap<(Dimension, Scope), i64>,
    }

    impl Ledger {
        fn sum(&self, d: Dimension, s: Scope) -> i64 {
            self.sums.get(&(d, s)).copied().unwrap_or(0)
        }
        fn acquire(&mut self, lock: &str, new: Entry, enforce: bool, limits: &QuotaSpec) -> bool {
            match plan_acquire(self.entries.get(lock), &new, enforce, Some(limits), |d, s| {
                self.sum(d, s)
            }) {
                AcquirePlan::Rejected => false,
                AcquirePlan::Apply { deltas, .. } => {
                    for (d, s, delta) in deltas {
                        let sum = self.sums.entry((d, s)).or_default();
                        *sum = apply_delta(*sum, delta);
                    }
                    self.entries.insert(lock.into(), new);
                    true
                }
            }
        }
        fn release(&mut self, lock: &str) {
            for (d, s, delta) in plan_release(self.entries.get(lock)) {
                let sum = self.sums.entry((d, s)).or_default();
                *sum = apply_delta(*sum, delta);
            }
            self.entries.remove(lock);
        }
    }

    #[test]
    fn the_seed_worked_example() {
        // Limit {sandbox.count, running, 2}.
        let limits = spec(&[(Dimension::SandboxCount, Scope::Running, 2)]);
        let mut l = Ledger::default();
        let run = entry(0, 0, true);
        assert!(l.acquire("a", run, true, &limits));
        assert!(l.acquire("b", run, true, &limits));
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::Running), 2);
        assert!(!l.acquire("c", run, true, &limits), "a third running sandbox is refused");
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::All), 2, "a refusal writes nothing");
        // Pause A: the event path upserts it without `running`.
        assert!(l.acquire("a", entry(0, 0, false), false, &limits));
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::Running), 1);
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::All), 2);
        assert!(l.acquire("c", run, true, &limits));
        // Resume A: never gated, running goes over its limit; creates are then refused.
        assert!(l.acquire("a", run, false, &limits));
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::Running), 3);
        assert!(!l.acquire("d", run, true, &limits));
        // A retried acquire of an existing entry is a no-op, never refused.
        assert!(l.acquire("a", run, true, &limits));
        assert_eq!(
            plan_acquire(Some(&run), &run, true, Some(&limits), |_, _| 99),
            AcquirePlan::Apply { deltas: vec![], write_entry: false }
        );
        // Kill B: released; a second release is a no-op.
        l.release("b");
        l.release("b");
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::Running), 2);
        assert_eq!(l.sum(Dimension::SandboxCount, Scope::All), 2);
    }

    #[test]
    fn resource_dimensions_and_hard_zero() {
        let limits = spec(&[
            (Dimension::LimitsCpu, Scope::All, 1000),
            (Dimension::LimitsMemory, Scope::Running, 1024),
        ]);
        let mut l = Ledger::default();
        assert!(l.acquire("a", entry(600, 512, true), true, &limits));
        assert!(!l.acquire("b", entry(600, 10, true), true, &limits), "cpu 1200 > 1000");
        assert!(!l.acquire("b", entry(100, 600, true), true, &limits), "memory 1112 > 1024");
        assert!(
            l.acquire("b", entry(100, 600, false), true, &limits),
            "paused: memory not running"
        );
        let zero = spec(&[(Dimension::SandboxCount, Scope::All, 0)]);
        assert!(!Ledger::default().acquire("a", Entry::default(), true, &zero));
        // A shrinking entry is never refused, even over the limit.
        let mut over = Ledger::default();
        assert!(over.acquire("a", entry(5000, 0, true), false, &limits));
        assert!(over.acquire("a", entry(4000, 0, true), true, &limits));
    }

    #[test]
    fn sums_are_floored_at_zero() {
        assert_eq!(apply_delta(1, -3), 0);
        assert_eq!(apply_delta(1, 2), 3);
        assert_eq!(plan_release(None), vec![]);
        assert_eq!(
            plan_release(Some(&entry(0, 7, false))),
            vec![
                (Dimension::SandboxCount, Scope::All, -1),
                (Dimension::LimitsMemory, Scope::All, -7)
            ]
        );
    }

    #[test]
    fn events_upsert_live_holders_and_release_the_rest() {
        let e = entry(1, 2, true);
        assert_eq!(plan_event("u", "l", Some((("u", "l"), true, e))), EventAction::Upsert(e));
        assert_eq!(plan_event("u", "l", Some((("u", "l"), false, e))), EventAction::Release);
        assert_eq!(plan_event("u", "l", Some((("u", "l2"), true, e))), EventAction::Release);
        assert_eq!(plan_event("u", "l", Some((("v", "l"), true, e))), EventAction::Release);
        assert_eq!(plan_event("u", "l", None), EventAction::Release);
    }

    #[test]
    fn anti_drift_repairs_at_once_and_releases_after_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(600);
        let a = entry(1, 1, true);
        let live = HashMap::from([("a".to_owned(), a), ("b".to_owned(), a)]);
        let stored = HashMap::from([
            ("a".to_owned(), a),
            ("b".to_owned(), entry(1, 1, false)),
            ("x".to_owned(), a),
        ]);
        let first = plan_subject(&live, &stored, &HashMap::new(), t0, grace, true);
        assert_eq!(first.upserts, vec![("b".to_owned(), a)]);
        assert!(first.releases.is_empty(), "a leak is never released the first time it is seen");
        assert_eq!(first.leaks, HashMap::from([("x".to_owned(), t0)]));
        let early = plan_subject(&live, &stored, &first.leaks, t0 + grace / 2, grace, true);
        assert!(early.releases.is_empty());
        assert_eq!(early.leaks, first.leaks);
        let late = plan_subject(&live, &stored, &first.leaks, t0 + grace, grace, true);
        assert_eq!(late.releases, vec!["x".to_owned()]);
        assert!(late.leaks.is_empty());
        let unhealthy = plan_subject(&live, &stored, &first.leaks, t0 + grace, grace, false);
        assert!(unhealthy.releases.is_empty() && unhealthy.leaks.is_empty());
        assert_eq!(unhealthy.upserts, first.upserts, "repairs still happen");
    }

    fn arb_entry() -> impl Strategy<Value = Entry> {
        (0i64..3000, 0i64..3000, any::<bool>()).prop_map(|(c, m, r)| Entry {
            cpu_milli: c,
            memory_mib: m,
            running: r,
        })
    }

    proptest! {
        /// Whatever the order of acquires, updates and releases, the sums equal what the
        /// stored entries add up to (no drift without a fault), and an enforcing acquire never
        /// takes a limited sum over its limit.
        #[test]
        fn sums_always_match_the_entries(
            ops in proptest::collection::vec((0usize..6, arb_entry(), any::<bool>(), any::<bool>()), 0..60),
            limit in 0i64..5,
        ) {
            let limits = spec(&[
                (Dimension::SandboxCount, Scope::All, limit),
                (Dimension::LimitsCpu, Scope::Running, 2500),
            ]);
            let mut l = Ledger::default();
            for (slot, e, enforce, release) in ops {
                let lock = format!("l{slot}");
                if release {
                    l.release(&lock);
                    continue;
                }
                let before = l.sum(Dimension::SandboxCount, Scope::All);
                let ok = l.acquire(&lock, e, enforce, &limits);
                if enforce && ok && !l.entries.is_empty() {
                    let after = l.sum(Dimension::SandboxCount, Scope::All);
                    prop_assert!(after <= limit.max(before));
                }
                for d in Dimension::ALL {
                    for s in Scope::ALL {
                        let want: i64 = l.entries.values().filter(|e| e.counts_in(s)).map(|e| e.amount(d)).sum();
                        prop_assert_eq!(l.sum(d, s), want);
                    }
                }
            }
        }
    }
}
