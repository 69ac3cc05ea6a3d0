//! The tracer provider a binary installs: where spans go, which are sampled, which dropped.
//!
//! Modes, as the reference's `--tracing-mode` (plus OTLP over HTTP):
//!
//! | mode | spans go to |
//! |---|---|
//! | `none` (default) | nowhere; nothing is installed and tracing costs nothing |
//! | `otel` | an OTLP collector over gRPC at `endpoint` |
//! | `otel-http` | an OTLP collector over HTTP/protobuf at `endpoint` (`/v1/traces` when no path is given) |
//! | `std` | standard output, one JSON object per span |
//! | `file` | `file` (created with mode 0600), one JSON object per span, appended |
//!
//! An endpoint without a scheme gets `https://`, or `http://` with `insecure` (the reference's
//! `--tracing-insecure`); TLS trusts the system's roots.
//!
//! The pipeline: spans ended → [`NoopFilter`] (drops `reconcile.noop=true`) → a batch
//! processor on the Tokio runtime (queue 2,048, batches of 512, every 5 s; the SDK's defaults)
//! → the exporter. Ending a span only enqueues it; when the collector is slow or gone the
//! queue fills and spans are dropped, never waited for.
//!
//! Sampling: a span with a parent follows its parent's decision; a root is sampled with
//! probability `sampling_ratio` by a random draw, never from its trace ID (which the caller
//! chooses through `X-Request-ID`).
//!
//! Resource: `service.name` (the binary's) and `service.version`, then
//! `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`, which win.

use std::fmt;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{Link, SpanId, SpanKind, TraceContextExt as _, TraceId};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, SamplingResult, SdkTracerProvider,
    ShouldSample, Span, SpanData, SpanExporter, SpanProcessor,
};

use crate::reconcile::NOOP;
use crate::set_enabled;

/// Where spans go (`--tracing-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Tracing off.
    #[default]
    None,
    /// OTLP over gRPC.
    Otel,
    /// OTLP over HTTP with protobuf bodies.
    OtelHttp,
    /// JSON lines on standard output.
    Std,
    /// JSON lines appended to a file.
    File,
}

impl std::str::FromStr for Mode {
    type Err = TracingError;

    fn from_str(value: &str) -> Result<Self, TracingError> {
        match value {
            "" | "none" => Ok(Self::None),
            "otel" => Ok(Self::Otel),
            "otel-http" => Ok(Self::OtelHttp),
            "std" => Ok(Self::Std),
            "file" => Ok(Self::File),
            other => Err(TracingError::Invalid(format!(
                "unknown tracing mode {other:?}: use none, otel, otel-http, std or file"
            ))),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Otel => "otel",
            Self::OtelHttp => "otel-http",
            Self::Std => "std",
            Self::File => "file",
        })
    }
}

/// The tracing settings of a binary.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// Where spans go.
    pub mode: Mode,
    /// The collector's address (`otel`, `otel-http`).
    pub endpoint: String,
    /// The share of root spans sampled, in `[0, 1]`.
    pub sampling_ratio: f64,
    /// Plain text to an endpoint without a scheme (else TLS).
    pub insecure: bool,
    /// The file of mode `file`.
    pub file: Option<PathBuf>,
    /// `service.name` unless `OTEL_SERVICE_NAME` says otherwise.
    pub service_name: String,
}

impl Default for TracingSettings {
    fn default() -> Self {
        Self {
            mode: Mode::None,
            endpoint: "localhost:4317".to_owned(),
            sampling_ratio: 1.0,
            insecure: false,
            file: None,
            service_name: "oka".to_owned(),
        }
    }
}

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    /// A setting is wrong.
    #[error("{0}")]
    Invalid(String),
    /// The exporter could not be built.
    #[error("cannot set up the trace exporter: {0}")]
    Exporter(String),
}

/// The installed provider: [`Tracing::shutdown`] flushes the spans still queued.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Exports what is queued (bounded by the exporter's timeout) and stops.
    pub fn shutdown(self) {
        set_enabled(false);
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the trace exporter did not shut down cleanly");
        }
    }
}

/// Installs the provider `settings` describe as the global one and turns the crate's helpers
/// on; `Ok(None)` for mode `none`. Call it inside the Tokio runtime.
///
/// # Errors
///
/// [`TracingError::Invalid`] for a ratio outside `[0, 1]`, mode `file` without a file or a
/// file that cannot be opened; [`TracingError::Exporter`] when the exporter cannot be built
/// (a malformed endpoint).
pub fn install(settings: &TracingSettings) -> Result<Option<Tracing>, TracingError> {
    if !(0.0..=1.0).contains(&settings.sampling_ratio) || settings.sampling_ratio.is_nan() {
        return Err(TracingError::Invalid(format!(
            "tracing sampling ratio {} is outside [0, 1]",
            settings.sampling_ratio
        )));
    }
    let provider = match settings.mode {
        Mode::None => return Ok(None),
        Mode::Otel => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint_url(&settings.endpoint, settings.insecure, None))
                .with_tls_config(
                    opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new()
                        .with_native_roots(),
                )
                .build()
                .map_err(|e| TracingError::Exporter(e.to_string()))?;
            provider(settings, exporter)
        }
        Mode::OtelHttp => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint_url(
                    &settings.endpoint,
                    settings.insecure,
                    Some("/v1/traces"),
                ))
                .build()
                .map_err(|e| TracingError::Exporter(e.to_string()))?;
            provider(settings, exporter)
        }
        Mode::Std => provider(settings, JsonLines::new(Box::new(std::io::stdout()))),
        Mode::File => {
            let path = settings.file.as_ref().ok_or_else(|| {
                TracingError::Invalid("tracing mode file needs a tracing file".to_owned())
            })?;
            let file = open_private_append(path).map_err(|e| {
                TracingError::Invalid(format!(
                    "cannot open the tracing file {}: {e}",
                    path.display()
                ))
            })?;
            provider(settings, JsonLines::new(Box::new(file)))
        }
    };
    global::set_tracer_provider(provider.clone());
    set_enabled(true);
    Ok(Some(Tracing { provider }))
}

fn open_private_append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// `endpoint` with a scheme (`https://`, or `http://` when `insecure`), and `path` when it has
/// none of its own.
fn endpoint_url(endpoint: &str, insecure: bool, path: Option<&str>) -> String {
    let mut url = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("{}://{endpoint}", if insecure { "http" } else { "https" })
    };
    if let Some(path) = path {
        let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
        if !after_scheme.contains('/') {
            url.push_str(path);
        }
    }
    url
}

fn provider(
    settings: &TracingSettings,
    exporter: impl SpanExporter + 'static,
) -> SdkTracerProvider {
    let batch = BatchSpanProcessor::builder(exporter, runtime::Tokio).build();
    SdkTracerProvider::builder()
        .with_span_processor(NoopFilter { next: batch })
        .with_sampler(Sampler::ParentBased(Box::new(RandomRatio(settings.sampling_ratio))))
        .with_id_generator(RequestIdGenerator::default())
        .with_resource(resource(&settings.service_name))
        .build()
}

fn resource(service_name: &str) -> Resource {
    let detectors: [Box<dyn ResourceDetector>; 1] = [Box::new(EnvResourceDetector::new())];
    let builder = Resource::builder_empty()
        .with_service_name(service_name.to_owned())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_detectors(&detectors);
    match std::env::var("OTEL_SERVICE_NAME") {
        Ok(name) if !name.is_empty() => builder.with_service_name(name),
        _ => builder,
    }
    .build()
}

/// Drops the spans of reconciles that wrote nothing (`reconcile.noop=true`); passes the rest
/// to the batch processor.
#[derive(Debug)]
pub struct NoopFilter<P> {
    next: P,
}

impl<P: SpanProcessor> SpanProcessor for NoopFilter<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.next.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let noop = span
            .attributes
            .iter()
            .any(|a| a.key.as_str() == NOOP && a.value == opentelemetry::Value::Bool(true));
        if !noop {
            self.next.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.next.set_resource(resource);
    }
}

/// Samples roots with probability `.0` by a random draw (the trace ID is the caller's choice,
/// so its bits are no coin).
#[derive(Debug, Clone)]
struct RandomRatio(f64);

impl ShouldSample for RandomRatio {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        _trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        let draw = u64::from_be_bytes(RandomIdGenerator::default().new_span_id().to_bytes());
        // The share of u64 values below the threshold is the ratio (1.0 samples every draw).
        let sampled = self.0 >= 1.0 || (draw as f64) < self.0 * (u64::MAX as f64);
        SamplingResult {
            decision: if sampled {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::Drop
            },
            attributes: Vec::new(),
            trace_state: parent_context
                .map(|cx| cx.span().span_context().trace_state().clone())
                .unwrap_or_default(),
        }
    }
}

/// Random IDs, except the trace ID of a request's root span: the request ID
/// ([`crate::request::take_requested_trace_id`]).
#[derive(Debug, Default)]
struct RequestIdGenerator {
    random: RandomIdGenerator,
}

impl IdGenerator for RequestIdGenerator {
    fn new_trace_id(&self) -> TraceId {
        crate::request::take_requested_trace_id().unwrap_or_else(|| self.random.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.random.new_span_id()
    }
}

/// Writes each span as one JSON object per line (modes `std` and `file`).
struct JsonLines {
    out: Mutex<Box<dyn std::io::Write + Send>>,
}

impl fmt::Debug for JsonLines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JsonLines")
    }
}

impl JsonLines {
    fn new(out: Box<dyn std::io::Write + Send>) -> Self {
        Self { out: Mutex::new(out) }
    }
}

/// One span as JSON: IDs in hex, times in Unix nanoseconds, attributes as a map.
pub fn span_json(span: &SpanData) -> serde_json::Value {
    let nanos = |t: std::time::SystemTime| {
        t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    };
    let attributes: serde_json::Map<String, serde_json::Value> = span
        .attributes
        .iter()
        .map(|kv| (kv.key.to_string(), serde_json::Value::String(kv.value.to_string())))
        .collect();
    let status = match &span.status {
        opentelemetry::trace::Status::Unset => serde_json::json!({"code": "Unset"}),
        opentelemetry::trace::Status::Ok => serde_json::json!({"code": "Ok"}),
        opentelemetry::trace::Status::Error { description } => {
            serde_json::json!({"code": "Error", "description": description})
        }
    };
    serde_json::json!({
        "name": span.name,
        "traceId": format!("{:032x}", span.span_context.trace_id()),
        "spanId": format!("{:016x}", span.span_context.span_id()),
        "parentSpanId": (span.parent_span_id != SpanId::INVALID)
            .then(|| format!("{:016x}", span.parent_span_id)),
        "kind": format!("{:?}", span.span_kind),
        "scope": span.instrumentation_scope.name(),
        "startTimeUnixNano": nanos(span.start_time),
        "endTimeUnixNano": nanos(span.end_time),
        "attributes": attributes,
        "status": status,
    })
}

impl SpanExporter for JsonLines {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut text = String::new();
        for span in &batch {
            text.push_str(&span_json(span).to_string());
            text.push('\n');
        }
        let mut out =
            self.out.lock().map_err(|_| OTelSdkError::InternalFailure("poisoned".into()))?;
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_a_scheme_and_a_path() {
        assert_eq!(endpoint_url("collector:4317", false, None), "https://collector:4317");
        assert_eq!(endpoint_url("collector:4317", true, None), "http://collector:4317");
        assert_eq!(
            endpoint_url("http://c:4318", false, Some("/v1/traces")),
            "http://c:4318/v1/traces"
        );
        assert_eq!(endpoint_url("http://c:4318/x", false, Some("/v1/traces")), "http://c:4318/x");
    }

    #[test]
    fn modes_parse_and_unknown_ones_are_refused() {
        assert_eq!("".parse::<Mode>().ok(), Some(Mode::None));
        assert_eq!("otel".parse::<Mode>().ok(), Some(Mode::Otel));
        assert_eq!("otel-http".parse::<Mode>().ok(), Some(Mode::OtelHttp));
        assert!("jaeger".parse::<Mode>().is_err());
    }

    #[test]
    fn ratios_outside_the_unit_interval_are_refused() {
        let settings = TracingSettings { sampling_ratio: 1.5, ..TracingSettings::default() };
        assert!(matches!(install(&settings), Err(TracingError::Invalid(_))));
        let settings = TracingSettings { mode: Mode::File, ..TracingSettings::default() };
        assert!(matches!(install(&settings), Err(TracingError::Invalid(_))));
    }
}
