//! The webhooks' series, the reference's (`pkg/webhook/metrics.go`): every review answered,
//! by path, operation and verdict.
//!
//! - `sandbox_admission_total{webhook, operation, allowed}`: reviews answered;
//! - `sandbox_admission_duration_seconds{webhook, operation, allowed}`: how long each took,
//!   what the rule read from the cluster included (buckets 1 ms doubling 12 times, to ~4 s).
//!
//! `webhook` is the path (`/validate-sandboxset`), `operation` the review's (`CREATE`,
//! `UPDATE`, `DELETE`, `CONNECT`), `allowed` `true` or `false`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The labels of both series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// The webhook's path.
    pub webhook: &'static str,
    /// The review's operation.
    pub operation: String,
    /// `true` or `false`.
    pub allowed: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 12))
}

/// The webhooks' families; cheap to clone (they share their series).
#[derive(Debug, Clone)]
pub struct AdmissionMetrics {
    total: Family<AdmissionLabels, Counter>,
    duration: Family<AdmissionLabels, Histogram, fn() -> Histogram>,
}

impl Default for AdmissionMetrics {
    fn default() -> Self {
        AdmissionMetrics {
            total: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl AdmissionMetrics {
    /// Registers both families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sandbox_admission",
            "Total number of admission webhook handler invocations.",
            self.total.clone(),
        );
        registry.register(
            "sandbox_admission_duration_seconds",
            "Duration of admission webhook handler invocations in seconds.",
            self.duration.clone(),
        );
    }

    /// Records one review answered.
    pub fn record(&self, webhook: &'static str, operation: &str, allowed: bool, took: Duration) {
        let labels = AdmissionLabels {
            webhook,
            operation: operation.to_owned(),
            allowed: if allowed { "true" } else { "false" },
        };
        self.total.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_is_counted_and_timed_under_the_references_names() {
        let metrics = AdmissionMetrics::default();
        metrics.record("/validate-sandboxset", "CREATE", false, Duration::from_millis(3));
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let labels = "webhook=\"/validate-sandboxset\",operation=\"CREATE\",allowed=\"false\"";
        assert!(text.contains(&format!("sandbox_admission_total{{{labels}}} 1")), "{text}");
        assert!(
            text.contains(&format!(
                "sandbox_admission_duration_seconds_bucket{{le=\"0.004\",{labels}}} 1"
            )),
            "{text}"
        );
    }
}
