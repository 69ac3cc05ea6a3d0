//! An OTLP trace receiver for the tests, built on the official protobuf definitions
//! (`opentelemetry-proto`): it accepts `ExportTraceServiceRequest`s over gRPC
//! (`/opentelemetry.proto.collector.trace.v1.TraceService/Export`, HTTP/2 without TLS) and over
//! HTTP (`POST /v1/traces`, protobuf), and keeps every span it received.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Its name.
    pub name: String,
    /// Its trace ID, 32 hex digits.
    pub trace_id: String,
    /// Its span ID, 16 hex digits.
    pub span_id: String,
    /// Its parent's span ID, empty for a root.
    pub parent_span_id: String,
    /// Its kind (the OTLP enum's number: 2 = server, 1 = internal).
    pub kind: i32,
    /// Its attributes, as strings.
    pub attributes: BTreeMap<String, String>,
    /// Its instrumentation scope.
    pub scope: String,
    /// Its resource's `service.name`.
    pub service: String,
    /// Its status code (0 unset, 1 ok, 2 error) and message.
    pub status: (i32, String),
    /// Which protocol brought it: `grpc` or `http`.
    pub protocol: &'static str,
}

/// A running receiver; stops with the test's runtime.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    /// Starts a receiver on a free loopback port, on a runtime of its own.
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let kept = Arc::clone(&spans);
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let kept = Arc::clone(&kept);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let kept = Arc::clone(&kept);
                        async move { Ok::<_, Infallible>(answer(request, &kept).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
        Self { addr, spans, _runtime: runtime }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits up to `within` until `done(spans)` holds; the spans then.
    pub fn wait_for(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

type AnswerBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    request: hyper::Request<Incoming>,
    kept: &Mutex<Vec<ReceivedSpan>>,
) -> hyper::Response<AnswerBody> {
    let grpc =
        request.uri().path() == "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
    let http = request.uri().path() == "/v1/traces";
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let (message, protocol) = match (grpc, http) {
        // gRPC framing: a compression flag, a 4-byte length, the message.
        (true, _) if body.len() >= 5 => (body.slice(5..), "grpc"),
        (false, true) => (body, "http"),
        _ => {
            return hyper::Response::builder()
                .status(404)
                .body(Full::new(Bytes::new()).boxed())
                .unwrap();
        }
    };
    let Ok(export) = ExportTraceServiceRequest::decode(message) else {
        return hyper::Response::builder()
            .status(400)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap();
    };
    kept.lock().unwrap().extend(flatten(&export, protocol));
    let reply = ExportTraceServiceResponse::default().encode_to_vec();
    if protocol == "http" {
        return hyper::Response::builder()
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::from(reply)).boxed())
            .unwrap();
    }
    let mut framed = BytesMut::with_capacity(5 + reply.len());
    framed.extend_from_slice(&[0]);
    framed.extend_from_slice(&u32::try_from(reply.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&reply);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        vec![Ok(Frame::data(framed.freeze())), Ok(Frame::trailers(trailers))];
    hyper::Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures_stream(frames)).boxed())
        .unwrap()
}

fn futures_stream<T>(items: Vec<T>) -> impl futures::Stream<Item = T> {
    futures::stream::iter(items)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn flatten(export: &ExportTraceServiceRequest, protocol: &'static str) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in &export.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope_spans in &resource_spans.scope_spans {
            let scope = scope_spans.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
            for span in &scope_spans.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        (kv.key.clone(), text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                    })
                    .collect();
                let status =
                    span.status.as_ref().map(|s| (s.code, s.message.clone())).unwrap_or_default();
                out.push(ReceivedSpan {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes,
                    scope: scope.clone(),
                    service: service.clone(),
                    status,
                    protocol,
                });
            }
        }
    }
    out
}
