//! The embedded store's Prometheus series: its commits (each one `fsync`), how many writes each
//! carries, what it holds, and how long its watchers wait for a change. The writer thread
//! records the commits; each watch stream records the lag of the events it delivers; the scrape
//! reads the object count and the resourceVersion from the in-memory view.
//!
//! The watch lag is observed once per event a stream yields (every watcher, every kind), into
//! one lock-free histogram ([`DurationHistogram`]): a clock read and two atomic additions, no
//! label, so its cost and its series are bounded whatever the number of watchers.

use oka_metrics::DurationHistogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The embedded store's series.
#[derive(Debug)]
pub struct StoreMetrics {
    pub(crate) commits: Counter,
    pub(crate) writes: Counter,
    pub(crate) commit_duration: Histogram,
    pub(crate) fsync_duration: Histogram,
    pub(crate) batch_writes: Histogram,
    /// From a change's commit to a watch stream yielding it.
    pub(crate) watch_lag: DurationHistogram,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            commits: Counter::default(),
            writes: Counter::default(),
            commit_duration: Histogram::new(oka_metrics::buckets::fast()),
            fsync_duration: Histogram::new(oka_metrics::buckets::fast()),
            // 1 doubling 11 times, up to 1,024 (the default batch limit).
            batch_writes: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            watch_lag: DurationHistogram::new(oka_metrics::buckets::fast()),
        }
    }
}

impl StoreMetrics {
    /// Registers the families into `registry`; `view` reads (objects, resourceVersion) at
    /// scrape time.
    pub fn register(
        &self,
        registry: &mut Registry,
        view: impl Fn() -> (usize, u64) + Send + Sync + 'static,
    ) {
        registry.register(
            "oka_store_commits",
            "Durable commits (one fsync each)",
            self.commits.clone(),
        );
        registry.register("oka_store_writes", "Writes committed", self.writes.clone());
        registry.register(
            "oka_store_commit_duration_seconds",
            "Time of a commit: serialising the batch's objects, writing and fsync",
            self.commit_duration.clone(),
        );
        registry.register(
            "oka_store_fsync_duration_seconds",
            "Time of the durable transaction commit alone (the fsync)",
            self.fsync_duration.clone(),
        );
        registry.register(
            "oka_store_batch_writes",
            "Writes per commit (group commit)",
            self.batch_writes.clone(),
        );
        registry.register(
            "oka_store_watch_lag_seconds",
            "Time from a change's commit to its delivery by a watch stream (every watcher)",
            self.watch_lag.clone(),
        );
        registry.register_collector(Box::new(ViewCollector(Box::new(view))));
    }
}

struct ViewCollector(Box<dyn Fn() -> (usize, u64) + Send + Sync>);

impl std::fmt::Debug for ViewCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ViewCollector")
    }
}

impl Collector for ViewCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (objects, rv) = (self.0)();
        let objects = ConstGauge::new(i64::try_from(objects).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "oka_store_objects",
            "Objects in the store",
            None,
            objects.metric_type(),
        )?;
        objects.encode(metric)?;
        let rv = ConstGauge::new(i64::try_from(rv).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "oka_store_resource_version",
            "The store's last resourceVersion (its write count)",
            None,
            rv.metric_type(),
        )?;
        rv.encode(metric)
    }
}
