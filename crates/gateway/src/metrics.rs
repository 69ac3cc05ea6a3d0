//! The gateway's Prometheus series (oka's own; the reference's gateway is Envoy and exports
//! Envoy's stats), and `sandbox_routes`, the reference's route-table size.
//!
//! Every counter the request path touches is a plain atomic fetched once at start (no label
//! lookup, no lock per request); the families' label values are fixed. The relayed bytes are
//! counted by the upstream connections themselves ([`crate::idle::ByteMeter`], one atomic
//! addition per read or write); the first-byte latency is a lock-free histogram
//! ([`DurationHistogram`]).

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_metrics::DurationHistogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpStream;

use crate::dial::{DialError, Dialer};
use crate::idle::ByteMeter;

/// `path`: which relay served a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    /// `fast` (the HTTP/1.1 relay) or `hyper` (HTTP/2, upgrades, the rest).
    pub path: &'static str,
}

/// `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success`, `gone` (no such instance) or `failure`.
    pub result: &'static str,
}

/// `direction`: which way relayed bytes went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `in` (into sandboxes: requests) or `out` (out of sandboxes: responses).
    pub direction: &'static str,
}

/// The gateway's series.
#[derive(Debug)]
pub struct GatewayMetrics {
    requests: Family<PathLabels, Counter>,
    pub(crate) fast_requests: Counter,
    pub(crate) hyper_requests: Counter,
    pub(crate) connections: Counter,
    pub(crate) wakes: Counter,
    dials: Family<ResultLabels, Counter>,
    dial_ok: Counter,
    dial_gone: Counter,
    dial_failed: Counter,
    dial_duration: Histogram,
    bytes: Family<DirectionLabels, Counter>,
    /// Counts the bytes of every upstream connection.
    pub(crate) upstream_bytes: ByteMeter,
    /// From a request sent upstream to the first byte of its response.
    pub(crate) first_byte: DurationHistogram,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        let requests = Family::<PathLabels, Counter>::default();
        let dials = Family::<ResultLabels, Counter>::default();
        let bytes = Family::<DirectionLabels, Counter>::default();
        Self {
            fast_requests: requests.get_or_create_owned(&PathLabels { path: "fast" }),
            hyper_requests: requests.get_or_create_owned(&PathLabels { path: "hyper" }),
            requests,
            connections: Counter::default(),
            wakes: Counter::default(),
            dial_ok: dials.get_or_create_owned(&ResultLabels { result: "success" }),
            dial_gone: dials.get_or_create_owned(&ResultLabels { result: "gone" }),
            dial_failed: dials.get_or_create_owned(&ResultLabels { result: "failure" }),
            dials,
            dial_duration: Histogram::new(oka_metrics::buckets::fast()),
            upstream_bytes: ByteMeter {
                // Read from a sandbox: a response going out; written to it: a request coming in.
                read: bytes.get_or_create_owned(&DirectionLabels { direction: "out" }),
                written: bytes.get_or_create_owned(&DirectionLabels { direction: "in" }),
            },
            bytes,
            first_byte: DurationHistogram::new(oka_metrics::buckets::fast()),
        }
    }
}

impl GatewayMetrics {
    /// Registers the gateway's families into `registry`; `routes` counts the routed
    /// sandboxes at scrape time.
    pub fn register(
        &self,
        registry: &mut Registry,
        routes: impl Fn() -> usize + Send + Sync + 'static,
    ) {
        registry.register(
            "oka_gateway_requests",
            "Requests the gateway relayed or answered, by relay",
            self.requests.clone(),
        );
        registry.register(
            "oka_gateway_connections",
            "Client connections accepted",
            self.connections.clone(),
        );
        registry.register(
            "oka_gateway_wakes",
            "Paused sandboxes woken by a request",
            self.wakes.clone(),
        );
        registry.register(
            "oka_gateway_upstream_dials",
            "Connections opened into sandboxes, by result",
            self.dials.clone(),
        );
        registry.register(
            "oka_gateway_upstream_dial_duration_seconds",
            "Time to open a connection into a sandbox",
            self.dial_duration.clone(),
        );
        registry.register(
            "oka_gateway_relayed_bytes",
            "Bytes relayed to and from sandboxes (HTTP heads included, as sent upstream): in (requests), out (responses)",
            self.bytes.clone(),
        );
        registry.register(
            "oka_gateway_upstream_first_byte_seconds",
            "Time from a request sent into a sandbox to the first byte of its response",
            self.first_byte.clone(),
        );
        registry.register_collector(Box::new(Routes(Box::new(routes))));
    }
}

/// `sandbox_routes` (the reference's proxy gauge), read at scrape.
struct Routes(Box<dyn Fn() -> usize + Send + Sync>);

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Routes")
    }
}

impl Collector for Routes {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let gauge = ConstGauge::new(i64::try_from((self.0)()).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "sandbox_routes",
            "Sandboxes in the gateway's route table",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

/// A [`Dialer`] that times another.
pub(crate) struct MeteredDialer {
    pub(crate) inner: Arc<dyn Dialer>,
    pub(crate) metrics: Arc<GatewayMetrics>,
}

impl Dialer for MeteredDialer {
    fn dial<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, Result<TcpStream, DialError>> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.inner.dial(sandbox, port).await;
            match &result {
                Ok(_) => {
                    self.metrics.dial_ok.inc();
                    self.metrics.dial_duration.observe(started.elapsed().as_secs_f64());
                }
                Err(DialError::SandboxGone(_)) => {
                    self.metrics.dial_gone.inc();
                }
                Err(_) => {
                    self.metrics.dial_failed.inc();
                }
            }
            result
        })
    }
}
