//! The runtime's Prometheus series, recorded by [`Metered`], a [`Runtime`] that times another:
//! so the series cover any runtime and the local runtime's code stays free of them.
//!
//! - `oka_runtime_operations_total{operation,result}` and
//!   `oka_runtime_operation_duration_seconds{operation}` for every state-changing verb: `ensure`
//!   (a start: the pool's fill rate is the rate of its successes), `pause` and `resume` (the
//!   freezer), `hibernate` and `restore` (CRIU dump and restore), `snapshot` (CRIU dump, leave
//!   running), `checkpoint_restore`, `stop`, `delete`.
//!
//! The `operation` label takes only these fixed values, so the families stay small.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpStream;

use crate::{
    Runtime, RuntimeError, SandboxId, SandboxSpec, SandboxStatus, SnapshotInfo, SnapshotName,
};

/// `operation`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The verb.
    pub operation: &'static str,
}

/// `operation`, `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The verb.
    pub operation: &'static str,
    /// `success` or `failure`.
    pub result: &'static str,
}

fn histogram() -> Histogram {
    // 1 ms doubling 16 times, up to ~65 s: freezes take milliseconds, CRIU dumps seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The runtime's series.
#[derive(Debug)]
pub struct RuntimeMetrics {
    operations: Family<ResultLabels, Counter>,
    durations: Family<OperationLabels, Histogram, fn() -> Histogram>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        Self { operations: Family::default(), durations: Family::new_with_constructor(histogram) }
    }
}

impl RuntimeMetrics {
    /// Registers the runtime's families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "oka_runtime_operations",
            "Runtime operations (ensure = a sandbox start; pause/resume = the freezer; hibernate/restore/snapshot = CRIU), by result",
            self.operations.clone(),
        );
        registry.register(
            "oka_runtime_operation_duration_seconds",
            "Time of runtime operations that succeeded",
            self.durations.clone(),
        );
    }

    fn record<T>(&self, operation: &'static str, took: Duration, result: &Result<T, RuntimeError>) {
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.operations.get_or_create(&ResultLabels { operation, result: outcome }).inc();
        if result.is_ok() {
            self.durations
                .get_or_create(&OperationLabels { operation })
                .observe(took.as_secs_f64());
        }
    }
}

/// A [`Runtime`] that records each operation of `inner` into its [`RuntimeMetrics`].
pub struct Metered<R> {
    inner: R,
    metrics: std::sync::Arc<RuntimeMetrics>,
}

impl<R> Metered<R> {
    /// `inner`, timed into `metrics`.
    pub fn new(inner: R, metrics: std::sync::Arc<RuntimeMetrics>) -> Self {
        Self { inner, metrics }
    }
}

macro_rules! timed {
    ($self:ident, $name:literal, $call:expr) => {{
        let started = Instant::now();
        let result = $call.await;
        $self.metrics.record($name, started.elapsed(), &result);
        result
    }};
}

#[async_trait]
impl<R: Runtime> Runtime for Metered<R> {
    async fn ensure(&self, spec: &SandboxSpec) -> Result<SandboxStatus, RuntimeError> {
        timed!(self, "ensure", self.inner.ensure(spec))
    }
    async fn inspect(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        self.inner.inspect(id).await
    }
    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        timed!(self, "pause", self.inner.pause(id))
    }
    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        timed!(self, "resume", self.inner.resume(id))
    }
    async fn hibernate(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        timed!(self, "hibernate", self.inner.hibernate(id))
    }
    async fn restore(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        timed!(self, "restore", self.inner.restore(id))
    }
    async fn stop(&self, id: &SandboxId, grace: Duration) -> Result<(), RuntimeError> {
        timed!(self, "stop", self.inner.stop(id, grace))
    }
    async fn delete(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        timed!(self, "delete", self.inner.delete(id))
    }
    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError> {
        self.inner.list().await
    }
    async fn connect(&self, id: &SandboxId, port: u16) -> Result<TcpStream, RuntimeError> {
        self.inner.connect(id, port).await
    }
    async fn update(&self, spec: &SandboxSpec) -> Result<crate::UpdateOutcome, RuntimeError> {
        self.inner.update(spec).await
    }
    async fn checkpoint_restore(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        timed!(self, "checkpoint_restore", self.inner.checkpoint_restore(spec))
    }
    async fn snapshot(
        &self,
        id: &SandboxId,
        name: &SnapshotName,
    ) -> Result<SnapshotInfo, RuntimeError> {
        timed!(self, "snapshot", self.inner.snapshot(id, name))
    }
    async fn delete_snapshot(&self, name: &SnapshotName) -> Result<(), RuntimeError> {
        self.inner.delete_snapshot(name).await
    }
    async fn set_egress(
        &self,
        id: &SandboxId,
        policy: &crate::EgressPolicy,
    ) -> Result<(), RuntimeError> {
        timed!(self, "set_egress", self.inner.set_egress(id, policy))
    }
}
