//! The quota's metrics: the seed's families (§5.8), named as the reference names them, as
//! `prometheus_client` types, so the `/metrics` endpoint registers them with
//! [`QuotaMetrics::register`]. Counters are registered without `_total`, which
//! `prometheus_client` appends. No constant labels.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::breaker::Transition;

/// Label `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// The outcome.
    pub result: &'static str,
}

/// Label `operation`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    /// The backend operation.
    pub operation: &'static str,
}

/// Label `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// The breaker state entered.
    pub state: &'static str,
}

/// Label `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: &'static str,
}

/// Prometheus' default histogram buckets (client_golang's `DefBuckets`).
const DEF_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The quota's metric families; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct QuotaMetrics {
    /// `sandbox_manager_quota_acquire_total{result=unlimited|allowed|rejected|fail_open|error}`.
    pub acquire: Family<ResultLabel, Counter>,
    /// `sandbox_manager_quota_release_total{result=released|error|skipped}`.
    pub release: Family<ResultLabel, Counter>,
    /// `sandbox_manager_quota_backend_errors_total{operation=acquire|release|cleanup|list_entries|list_entries_decode}`.
    pub backend_errors: Family<OperationLabel, Counter>,
    /// `sandbox_manager_quota_breaker_state_total{state=open|half_open|closed}`.
    pub breaker_state: Family<StateLabel, Counter>,
    /// `sandbox_manager_quota_breaker_open_duration_seconds`: the open duration, at each open.
    pub breaker_open_duration: Histogram,
    /// `sandbox_manager_quota_antidrift_skipped_total{reason=not_primary|not_ready|key_store_error}`.
    pub antidrift_skipped: Family<ReasonLabel, Counter>,
    /// `sandbox_manager_quota_antidrift_errors_total{operation=list_live|list_entries|acquire|release|event_acquire|event_release}`.
    pub antidrift_errors: Family<OperationLabel, Counter>,
    /// `sandbox_manager_quota_antidrift_event_release_total{result=released|error|skipped_unhealthy}`.
    pub antidrift_event_release: Family<ResultLabel, Counter>,
    /// `sandboxcr_quota_source_event_drop_total{reason=invalid_tombstone}` (kept for the name;
    /// the embedded store's watch has no tombstones, so it stays 0).
    pub source_event_drop: Family<ReasonLabel, Counter>,
}

impl Default for QuotaMetrics {
    fn default() -> Self {
        Self {
            acquire: Family::default(),
            release: Family::default(),
            backend_errors: Family::default(),
            breaker_state: Family::default(),
            breaker_open_duration: Histogram::new(DEF_BUCKETS),
            antidrift_skipped: Family::default(),
            antidrift_errors: Family::default(),
            antidrift_event_release: Family::default(),
            source_event_drop: Family::default(),
        }
    }
}

impl QuotaMetrics {
    /// New families, registered in `registry` (each family is shared: the returned value and
    /// the registry see the same counts).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "sandbox_manager_quota_acquire",
            "Total quota acquire decisions",
            metrics.acquire.clone(),
        );
        registry.register(
            "sandbox_manager_quota_release",
            "Total quota release decisions",
            metrics.release.clone(),
        );
        registry.register(
            "sandbox_manager_quota_backend_errors",
            "Total quota backend errors by operation",
            metrics.backend_errors.clone(),
        );
        registry.register(
            "sandbox_manager_quota_breaker_state",
            "Total quota backend breaker state transitions",
            metrics.breaker_state.clone(),
        );
        registry.register(
            "sandbox_manager_quota_breaker_open_duration_seconds",
            "Configured quota backend breaker open window duration",
            metrics.breaker_open_duration.clone(),
        );
        registry.register(
            "sandbox_manager_quota_antidrift_skipped",
            "Total quota anti-drift skips by reason",
            metrics.antidrift_skipped.clone(),
        );
        registry.register(
            "sandbox_manager_quota_antidrift_errors",
            "Total quota anti-drift errors by operation",
            metrics.antidrift_errors.clone(),
        );
        registry.register(
            "sandbox_manager_quota_antidrift_event_release",
            "Total quota anti-drift event release results",
            metrics.antidrift_event_release.clone(),
        );
        registry.register(
            "sandboxcr_quota_source_event_drop",
            "Total quota source events dropped by reason",
            metrics.source_event_drop.clone(),
        );
        metrics
    }

    /// Counts an acquire decision.
    pub fn acquired(&self, result: &'static str) {
        self.acquire.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a release decision.
    pub fn released(&self, result: &'static str) {
        self.release.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a backend error.
    pub fn backend_error(&self, operation: &'static str) {
        self.backend_errors.get_or_create(&OperationLabel { operation }).inc();
    }

    /// Counts an anti-drift error.
    pub fn antidrift_error(&self, operation: &'static str) {
        self.antidrift_errors.get_or_create(&OperationLabel { operation }).inc();
    }

    /// Counts a skipped anti-drift pass.
    pub fn antidrift_skip(&self, reason: &'static str) {
        self.antidrift_skipped.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts an event-path release.
    pub fn event_release(&self, result: &'static str) {
        self.antidrift_event_release.get_or_create(&ResultLabel { result }).inc();
    }

    /// Records a breaker transition (none: nothing).
    pub fn breaker_transition(&self, transition: Option<Transition>, open_for: Duration) {
        let state = match transition {
            None => return,
            Some(Transition::Opened) => {
                self.breaker_open_duration.observe(open_for.as_secs_f64());
                "open"
            }
            Some(Transition::HalfOpened) => "half_open",
            Some(Transition::Closed) => "closed",
        };
        self.breaker_state.get_or_create(&StateLabel { state }).inc();
    }

    /// `acquire_total{result}` so far.
    pub fn acquire_count(&self, result: &'static str) -> u64 {
        self.acquire.get_or_create(&ResultLabel { result }).get()
    }

    /// `breaker_state_total{state}` so far.
    pub fn breaker_count(&self, state: &'static str) -> u64 {
        self.breaker_state.get_or_create(&StateLabel { state }).get()
    }

    /// `backend_errors_total{operation}` so far.
    pub fn backend_error_count(&self, operation: &'static str) -> u64 {
        self.backend_errors.get_or_create(&OperationLabel { operation }).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_exposed_under_the_seed_names() {
        let mut registry = Registry::default();
        let metrics = QuotaMetrics::register(&mut registry);
        metrics.acquired("fail_open");
        metrics.released("released");
        metrics.backend_error("acquire");
        metrics.breaker_transition(Some(Transition::Opened), Duration::from_secs(30));
        metrics.antidrift_skip("not_ready");
        metrics.antidrift_error("list_live");
        metrics.event_release("released");
        let _ =
            metrics.source_event_drop.get_or_create(&ReasonLabel { reason: "invalid_tombstone" });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "sandbox_manager_quota_acquire_total{result=\"fail_open\"} 1",
            "sandbox_manager_quota_release_total{result=\"released\"} 1",
            "sandbox_manager_quota_backend_errors_total{operation=\"acquire\"} 1",
            "sandbox_manager_quota_breaker_state_total{state=\"open\"} 1",
            "sandbox_manager_quota_breaker_open_duration_seconds_sum 30.0",
            "sandbox_manager_quota_antidrift_skipped_total{reason=\"not_ready\"} 1",
            "sandbox_manager_quota_antidrift_errors_total{operation=\"list_live\"} 1",
            "sandbox_manager_quota_antidrift_event_release_total{result=\"released\"} 1",
            "sandboxcr_quota_source_event_drop_total{reason=\"invalid_tombstone\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
