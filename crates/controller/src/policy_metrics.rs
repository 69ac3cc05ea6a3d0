//! The series of oka's own policies, as the seed names them (§1.10, §2.5): the
//! PoolAutoscaler's reconciles, the probe runner's attempts and the AutoPausePolicy's actions.
//!
//! Counters and histograms are recorded where the work is done (the autoscaler's reconcile, the
//! probe runner's finished attempt, the sandbox controller's executed policy action); every
//! label is a fixed word or a namespace, never a per-object value. The per-autoscaler gauges
//! (`pool_autoscaler_desired_replicas`, `_current_replicas`, `_available_replicas`) are
//! computed at scrape from the autoscaler controller's cache, so they leave with their
//! autoscaler (see [`crate::metrics::ObjectCollector`]).

use oka_metrics::Registry;
use oka_metrics::prometheus_client::encoding::EncodeLabelSet;
use oka_metrics::prometheus_client::metrics::counter::Counter;
use oka_metrics::prometheus_client::metrics::family::Family;
use oka_metrics::prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// `action`, `error` of an autoscaler reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `scale_up`, `scale_down` or `none`.
    pub action: &'static str,
    /// `internal` or `none`.
    pub error: &'static str,
}

/// `namespace`, `type`, `result` of a probe attempt.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeResultLabels {
    /// The sandbox's namespace.
    pub namespace: String,
    /// `exec`, `httpGet`, `tcpSocket` or `activity`.
    #[prometheus(flatten)]
    pub kind: ProbeTypeLabels,
    /// `success`, `failure`, `timeout` or `error`.
    pub result: &'static str,
}

/// `type` of a probe.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeTypeLabels {
    /// `exec`, `httpGet`, `tcpSocket` or `activity`.
    pub r#type: &'static str,
}

/// `namespace`, `action`, `result` of an auto-pause action.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AutoPauseLabels {
    /// The sandbox's namespace.
    pub namespace: String,
    /// `pause` or `resume`.
    pub action: &'static str,
    /// `success`, `conflict` or `error`.
    pub result: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The policies' counters and histograms.
#[derive(Debug)]
pub struct PolicyMetrics {
    reconciliations: Family<ReconcileLabels, Counter>,
    reconciliation_duration: Histograms<ReconcileLabels>,
    probe_results: Family<ProbeResultLabels, Counter>,
    probe_duration: Histograms<ProbeTypeLabels>,
    auto_pause_actions: Family<AutoPauseLabels, Counter>,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        Self {
            reconciliations: Family::default(),
            reconciliation_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 15))
            }),
            probe_results: Family::default(),
            probe_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 12))
            }),
            auto_pause_actions: Family::default(),
        }
    }
}

impl PolicyMetrics {
    /// Registers the families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pool_autoscaler_reconciliations",
            "PoolAutoscaler reconciles, by the scaling they decided and whether they failed",
            self.reconciliations.clone(),
        );
        registry.register(
            "pool_autoscaler_reconciliation_duration_seconds",
            "How long a PoolAutoscaler reconcile took",
            self.reconciliation_duration.clone(),
        );
        registry.register(
            "sandbox_probe_results",
            "Probe attempts, by probe type and result",
            self.probe_results.clone(),
        );
        registry.register(
            "sandbox_probe_duration_seconds",
            "How long a probe attempt took",
            self.probe_duration.clone(),
        );
        registry.register(
            "sandbox_auto_pause_actions",
            "Pauses and resumes the AutoPausePolicy made, by result",
            self.auto_pause_actions.clone(),
        );
    }

    /// One autoscaler reconcile: the scaling it decided, whether it failed, how long it took.
    pub fn autoscaler_reconciled(
        &self,
        action: &'static str,
        failed: bool,
        took: std::time::Duration,
    ) {
        let labels = ReconcileLabels { action, error: if failed { "internal" } else { "none" } };
        self.reconciliations.get_or_create(&labels).inc();
        self.reconciliation_duration.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// One probe attempt of a sandbox in `namespace`.
    pub fn probed(
        &self,
        namespace: &str,
        kind: &'static str,
        result: &'static str,
        took: std::time::Duration,
    ) {
        let kind = ProbeTypeLabels { r#type: kind };
        let labels =
            ProbeResultLabels { namespace: namespace.to_owned(), kind: kind.clone(), result };
        self.probe_results.get_or_create(&labels).inc();
        self.probe_duration.get_or_create(&kind).observe(took.as_secs_f64());
    }

    /// One pause or resume written by the AutoPausePolicy.
    pub fn auto_pause_acted(&self, namespace: &str, action: &'static str, result: &'static str) {
        let labels = AutoPauseLabels { namespace: namespace.to_owned(), action, result };
        self.auto_pause_actions.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policies_series_carry_the_seeds_names_and_labels() {
        let metrics = PolicyMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.autoscaler_reconciled("scale_up", false, std::time::Duration::from_millis(3));
        metrics.probed("team", "httpGet", "timeout", std::time::Duration::from_millis(40));
        metrics.auto_pause_acted("team", "pause", "success");
        let text =
            oka_metrics::scrape::encode(&registry, oka_metrics::scrape::Format::PrometheusText)
                .expect("encodes");
        for series in [
            r#"pool_autoscaler_reconciliations_total{action="scale_up",error="none"} 1"#,
            r#"pool_autoscaler_reconciliation_duration_seconds_count{action="scale_up",error="none"} 1"#,
            r#"sandbox_probe_results_total{namespace="team",type="httpGet",result="timeout"} 1"#,
            r#"sandbox_probe_duration_seconds_count{type="httpGet"} 1"#,
            r#"sandbox_auto_pause_actions_total{namespace="team",action="pause",result="success"} 1"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }
}
