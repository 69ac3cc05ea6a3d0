//! The arithmetic of a capacity policy: percentages of the pool, the watermarks, the raw
//! recommendation, and HPA-style stabilization over a history of recommendations. All pure.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A count or a percentage of the pool, as `targetAvailable` and `tolerance` write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// An absolute number of sandboxes.
    Count(i64),
    /// A percentage (0 to 100) of `spec.replicas`.
    Percent(i64),
}

impl Amount {
    /// Parses a count (`>= 0`) or `"N%"` (`0 <= N <= 100`); `None` for anything else.
    pub fn parse(value: &IntOrString) -> Option<Amount> {
        match value {
            IntOrString::Int(n) if *n >= 0 => Some(Amount::Count(i64::from(*n))),
            IntOrString::Int(_) => None,
            IntOrString::String(text) => {
                let percent: i64 = text.trim().strip_suffix('%')?.trim().parse().ok()?;
                (0..=100).contains(&percent).then_some(Amount::Percent(percent))
            }
        }
    }

    /// The amount for a pool of `base` sandboxes; percentages round up.
    pub fn scaled(self, base: i64) -> i64 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => ceil_percent(base, p),
        }
    }
}

/// `ceil(base × percent / 100)` for a non-negative `base`.
fn ceil_percent(base: i64, percent: i64) -> i64 {
    (base.max(0) * percent + 99).div_euclid(100)
}

/// The target and the dead zone around it, for a pool whose `spec.replicas` is `current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    /// The target number of available sandboxes.
    pub target: i64,
    /// The lower watermark: fewer available (strictly) scales up.
    pub lower: i64,
    /// The upper watermark: more available (strictly) scales down.
    pub upper: i64,
}

impl Band {
    /// The band of `target` ± `tolerance` for a pool of `current`.
    ///
    /// Percentages are of `current` and round up. When both are percentages the percentages
    /// are combined first and rounded once (`ceil(current × (t% ± tol%))`); otherwise the
    /// tolerance is scaled on its own. The lower watermark is never below zero.
    pub fn new(target: Amount, tolerance: Amount, current: i64) -> Band {
        let target_abs = target.scaled(current);
        match (target, tolerance) {
            (Amount::Percent(t), Amount::Percent(tol)) => Band {
                target: target_abs,
                lower: ceil_percent(current, (t - tol).max(0)),
                upper: ceil_percent(current, t + tol),
            },
            _ => {
                let tol = tolerance.scaled(current);
                Band {
                    target: target_abs,
                    lower: (target_abs - tol).max(0),
                    upper: target_abs + tol,
                }
            }
        }
    }

    /// The raw recommendation for the window's means: inside the band (both watermarks
    /// included) keep `current`; outside, the sandboxes in use (observed minus available minus
    /// this autoscaler's own creations still in flight), rounded up, plus the target.
    pub fn recommend(self, current: i64, observed: f64, available: f64, own_inflight: f64) -> i64 {
        if available < self.lower as f64 || available > self.upper as f64 {
            let used = (observed - available - own_inflight).max(0.0);
            // A mean of i32 counts: the ceil fits an i64.
            used.ceil() as i64 + self.target
        } else {
            current
        }
    }
}

/// One recommendation of the stabilization history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recommendation {
    /// When it was made.
    pub at: Timestamp,
    /// The recommended replicas, before stabilization.
    pub replicas: i64,
}

/// Which window held the result back from the recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The scale-up window kept the result below the recommendation.
    ScaleUp,
    /// The scale-down window kept the result above the recommendation.
    ScaleDown,
}

/// Stabilizes `rec` against `history`, as the Kubernetes HPA's behaviours do: the result
/// moves up from `current` only to the smallest recommendation of the scale-up window, and
/// down only to the largest of the scale-down window (a record is in a window when it is
/// strictly newer than `now − window`). Appends `rec` (unstabilized) to the history and drops
/// the records older than both windows. Returns the result and which window held it back.
pub fn stabilize(
    history: &mut Vec<Recommendation>,
    current: i64,
    rec: i64,
    up_window: Duration,
    down_window: Duration,
    now: Timestamp,
) -> (i64, Option<Held>) {
    let since = |window: Duration| {
        let window = SignedDuration::try_from(window).unwrap_or(SignedDuration::MAX);
        now.checked_sub(window).unwrap_or(Timestamp::MIN)
    };
    let (up_since, down_since) = (since(up_window), since(down_window));
    let up = history.iter().filter(|r| r.at > up_since).map(|r| r.replicas).fold(rec, i64::min);
    let down = history.iter().filter(|r| r.at > down_since).map(|r| r.replicas).fold(rec, i64::max);
    let mut result = current;
    if result < up {
        result = up;
    }
    if result > down {
        result = down;
    }
    history.push(Recommendation { at: now, replicas: rec });
    let keep_since = up_since.min(down_since);
    history.retain(|r| r.at > keep_since);
    let held = match result.cmp(&rec) {
        std::cmp::Ordering::Less => Some(Held::ScaleUp),
        std::cmp::Ordering::Greater => Some(Held::ScaleDown),
        std::cmp::Ordering::Equal => None,
    };
    (result, held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse_counts_and_percentages_only() {
        let cases = [
            (IntOrString::Int(10), Some(Amount::Count(10))),
            (IntOrString::Int(0), Some(Amount::Count(0))),
            (IntOrString::Int(-1), None),
            (IntOrString::String("70%".into()), Some(Amount::Percent(70))),
            (IntOrString::String("0%".into()), Some(Amount::Percent(0))),
            (IntOrString::String("100%".into()), Some(Amount::Percent(100))),
            (IntOrString::String("101%".into()), None),
            (IntOrString::String("-5%".into()), None),
            (IntOrString::String("10".into()), None),
            (IntOrString::String("ten%".into()), None),
        ];
        for (value, expected) in cases {
            assert_eq!(Amount::parse(&value), expected, "{value:?}");
        }
    }

    #[test]
    fn percentages_round_up_and_combine_before_rounding() {
        // The proposal's table: 70% ± 10% of 4 is 3..=4 around 3.
        assert_eq!(
            Band::new(Amount::Percent(70), Amount::Percent(10), 4),
            Band { target: 3, lower: 3, upper: 4 }
        );
        assert_eq!(
            Band::new(Amount::Percent(70), Amount::Percent(10), 36),
            Band { target: 26, lower: 22, upper: 29 }
        );
        // A percentage tolerance of an absolute target is of the pool, rounded on its own.
        assert_eq!(
            Band::new(Amount::Count(10), Amount::Percent(10), 12),
            Band { target: 10, lower: 8, upper: 12 }
        );
        // The lower watermark is floored at zero.
        assert_eq!(
            Band::new(Amount::Count(2), Amount::Count(5), 12),
            Band { target: 2, lower: 0, upper: 7 }
        );
        assert_eq!(
            Band::new(Amount::Percent(5), Amount::Percent(10), 10),
            Band { target: 1, lower: 0, upper: 2 }
        );
        // A percentage of an empty pool is zero.
        assert_eq!(
            Band::new(Amount::Percent(70), Amount::Percent(10), 0),
            Band { target: 0, lower: 0, upper: 0 }
        );
    }

    #[test]
    fn comparisons_are_strict_and_the_band_inclusive() {
        let band = Band::new(Amount::Count(10), Amount::Count(5), 10);
        assert_eq!(band.recommend(10, 10.0, 5.0, 0.0), 10, "5 is not below 5");
        assert_eq!(band.recommend(10, 10.0, 15.0, 0.0), 10, "15 is not above 15");
        assert_eq!(band.recommend(10, 10.0, 4.5, 0.0), 16, "ceil(5.5) + 10");
        assert_eq!(band.recommend(10, 20.0, 15.5, 0.0), 15, "ceil(4.5) + 10");
        assert_eq!(band.recommend(10, 10.0, 0.0, 4.0), 16, "own creations are not demand");
        assert_eq!(band.recommend(10, 10.0, 0.0, 40.0), 10, "used is never negative");
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_772_366_400 + s).unwrap()
    }

    #[test]
    fn stabilization_holds_a_scale_down_for_its_window() {
        let mut history = vec![Recommendation { at: at(-15), replicas: 30 }];
        let window = Duration::from_secs(300);
        let (result, held) = stabilize(&mut history, 30, 10, Duration::ZERO, window, at(0));
        assert_eq!((result, held), (30, Some(Held::ScaleDown)));
        let (result, _) = stabilize(&mut history, 30, 10, Duration::ZERO, window, at(284));
        assert_eq!(result, 30, "the 30 is still in the window");
        let (result, held) = stabilize(&mut history, 30, 10, Duration::ZERO, window, at(285));
        assert_eq!((result, held), (10, None), "the 30 aged out");
        assert!(history.iter().all(|r| r.replicas == 10));
    }

    #[test]
    fn stabilization_holds_a_scale_up_for_its_window() {
        let window = Duration::from_secs(60);
        let mut history = vec![Recommendation { at: at(-30), replicas: 5 }];
        let (result, held) = stabilize(&mut history, 5, 20, window, Duration::ZERO, at(0));
        assert_eq!((result, held), (5, Some(Held::ScaleUp)));
        let (result, held) = stabilize(&mut history, 5, 20, window, Duration::ZERO, at(30));
        assert_eq!((result, held), (20, None), "the 5 aged out; every record since says 20");
    }
}
