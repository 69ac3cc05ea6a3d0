//! The histograms the controller (`source="k8s"`) and the manager (`source="e2b"`) both
//! record under one name; see the crate doc for why they live here.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Who recorded a series: the reference's constant label `source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The controllers (Kubernetes objects).
    K8s,
    /// The E2B-compatible manager.
    E2b,
}

impl Source {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::K8s => "k8s",
            Source::E2b => "e2b",
        }
    }

    fn index(self) -> usize {
        match self {
            Source::K8s => 0,
            Source::E2b => 1,
        }
    }
}

/// A histogram family labelled `namespace` and `source`, each source with its own buckets (the
/// reference's controller and manager observe the recycle and claim durations with different
/// layouts under the same name).
#[derive(Debug, Clone)]
pub struct SourcedHistogram(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    buckets: [Vec<f64>; 2],
    series: [RwLock<HashMap<String, Histogram>>; 2],
}

impl SourcedHistogram {
    /// A family whose `k8s` series use `k8s` buckets and whose `e2b` series use `e2b`.
    pub fn new(k8s: impl IntoIterator<Item = f64>, e2b: impl IntoIterator<Item = f64>) -> Self {
        Self(Arc::new(Inner {
            buckets: [k8s.into_iter().collect(), e2b.into_iter().collect()],
            series: Default::default(),
        }))
    }

    /// Observes `seconds` in the series of (`namespace`, `source`). After the first
    /// observation of a series this takes a read lock and the histogram's own lock.
    pub fn observe(&self, source: Source, namespace: &str, seconds: f64) {
        let series = &self.0.series[source.index()];
        if let Some(h) = series.read().unwrap_or_else(PoisonError::into_inner).get(namespace) {
            h.observe(seconds);
            return;
        }
        let buckets = self.0.buckets[source.index()].iter().copied();
        series
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(namespace.to_owned())
            .or_insert_with(|| Histogram::new(buckets))
            .observe(seconds);
    }
}

impl EncodeMetric for SourcedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for source in [Source::K8s, Source::E2b] {
            let series =
                self.0.series[source.index()].read().unwrap_or_else(PoisonError::into_inner);
            for (namespace, histogram) in series.iter() {
                let labels = [("namespace", namespace.as_str()), ("source", source.as_str())];
                histogram.encode(encoder.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The families both the controllers and the manager record, registered once.
#[derive(Debug, Clone)]
pub struct Shared {
    /// `sandbox_pause_duration_seconds`: controller SandboxPaused False → True (E20); manager
    /// pause calls that succeeded (E20).
    pub pause_duration: SourcedHistogram,
    /// `sandbox_resume_duration_seconds`: controller SandboxResumed False → True, the Resuming
    /// phase alone (E20); manager resume calls (E20).
    pub resume_duration: SourcedHistogram,
    /// `sandbox_recycle_duration_seconds`: controller RecyclingStarted → Succeeded (E10);
    /// manager recycle triggers (E20).
    pub recycle_duration: SourcedHistogram,
    /// `sandbox_claim_duration_seconds`: SandboxClaim start → completion (C10); manager
    /// claim-based creates that succeeded (E20).
    pub claim_duration: SourcedHistogram,
}

impl Default for Shared {
    fn default() -> Self {
        use crate::buckets::{c10, e10, e20};
        Self {
            pause_duration: SourcedHistogram::new(e20(), e20()),
            resume_duration: SourcedHistogram::new(e20(), e20()),
            recycle_duration: SourcedHistogram::new(e10(), e20()),
            claim_duration: SourcedHistogram::new(c10(), e20()),
        }
    }
}

impl Shared {
    /// Registers the shared families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sandbox_pause_duration_seconds",
            "Time to pause a sandbox: the controller's SandboxPaused False to True (k8s), the manager's pause call (e2b)",
            self.pause_duration.clone(),
        );
        registry.register(
            "sandbox_resume_duration_seconds",
            "Time to resume a sandbox: the controller's SandboxResumed False to True (k8s), the manager's resume call (e2b)",
            self.resume_duration.clone(),
        );
        registry.register(
            "sandbox_recycle_duration_seconds",
            "Time to return a sandbox to its pool: RecyclingStarted to Succeeded (k8s), the manager's recycle trigger (e2b)",
            self.recycle_duration.clone(),
        );
        registry.register(
            "sandbox_claim_duration_seconds",
            "Time to claim: a SandboxClaim's start to completion (k8s), a claim-based create (e2b)",
            self.claim_duration.clone(),
        );
    }
}
