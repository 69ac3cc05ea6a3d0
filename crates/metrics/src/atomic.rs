//! A histogram of durations whose observation takes no lock: for hot paths (the gateway's
//! requests, the store's watch deliveries) where `prometheus_client`'s `Histogram`, a mutex per
//! observation, would be one lock per request.
//!
//! Each bucket is an atomic count and the sum is atomic nanoseconds, so an observation is a
//! binary search over the bounds and two relaxed atomic additions. A scrape reads the counts one
//! by one: it may see an observation in its bucket before its sum (or the reverse), which is
//! within the precision a scrape promises anyway. The count is the buckets' total, so `_count`
//! and the `+Inf` bucket always agree.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// A lock-free histogram of durations, exported in seconds; cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct DurationHistogram(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Upper bounds in seconds, finite and ascending; the `+Inf` bucket follows them.
    bounds: Box<[f64]>,
    /// One count per bound, then `+Inf` (not cumulative).
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl DurationHistogram {
    /// A histogram with these upper bounds (seconds); non-finite bounds are dropped and the rest
    /// sorted, the `+Inf` bucket is implicit.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let mut bounds: Vec<f64> = bounds.into_iter().filter(|b| b.is_finite()).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(Inner {
            bounds: bounds.into_boxed_slice(),
            counts,
            sum_nanos: AtomicU64::new(0),
        }))
    }

    /// Observes `took`.
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        // The first bucket whose bound is at least the value (`le` is inclusive).
        let index = self.0.bounds.partition_point(|bound| *bound < seconds);
        self.0.counts[index].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The sum of the observations, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        Duration::from_nanos(self.0.sum_nanos.load(Ordering::Relaxed)).as_secs_f64()
    }
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .0
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;
    use crate::scrape::{Format, encode};

    #[test]
    fn observations_land_in_their_buckets_and_encode_like_a_histogram() {
        let histogram = DurationHistogram::new([0.001, 0.01, 0.1]);
        histogram.observe(Duration::from_micros(500));
        histogram.observe(Duration::from_millis(1)); // on the bound: `le` is inclusive
        histogram.observe(Duration::from_millis(50));
        histogram.observe(Duration::from_secs(2));
        assert_eq!(histogram.count(), 4);
        assert!((histogram.sum_seconds() - 2.0515).abs() < 1e-9);
        let mut registry = Registry::default();
        registry.register("lag_seconds", "Lag", histogram.clone());
        let text = encode(&registry, Format::OpenMetrics).expect("encodes");
        for line in [
            "# TYPE lag_seconds histogram",
            "lag_seconds_count 4",
            "lag_seconds_bucket{le=\"0.001\"} 2",
            "lag_seconds_bucket{le=\"0.01\"} 2",
            "lag_seconds_bucket{le=\"0.1\"} 3",
            "lag_seconds_bucket{le=\"+Inf\"} 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
