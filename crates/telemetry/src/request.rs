//! The root span of one API request.
//!
//! Its trace ID is the request's ID (`X-Request-ID`, or the 32 hex digits the manager made up),
//! so the ID a user sees in a response or an error body finds the trace. The ID must then be
//! a valid trace ID: 32 hex digits, not all zero ([`valid_request_id`]); the manager refuses
//! other IDs while tracing is on, as the reference does.
//!
//! The span is started before routing and named when the route is known
//! ([`RequestSpan::finish`]): `"<METHOD> <route pattern>"`, e.g. `DELETE /sandboxes/{sandboxID}`.

use std::cell::Cell;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, TraceId, Tracer as _};
use opentelemetry::{Context, KeyValue, global};

use crate::context::RequestRoot;
use crate::{MANAGER, enabled};

thread_local! {
    /// The trace ID the next root span started on this thread must take (read by the
    /// provider's ID generator, `export::RequestIdGenerator`).
    static REQUESTED_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// The trace ID set for the root span being started on this thread, taken once.
pub fn take_requested_trace_id() -> Option<TraceId> {
    REQUESTED_TRACE_ID.with(Cell::take)
}

/// Whether `id` can be a trace ID: 32 hex digits, not all zero.
pub fn valid_request_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0')
}

/// The message of the 400 answered to a request ID that cannot be a trace ID while tracing is
/// on (the reference's wording).
pub const INVALID_REQUEST_ID: &str =
    "invalid X-Request-ID: must be 32 hex characters and not all-zero when tracing is enabled";

/// A started request root span; `None` inside when tracing is off.
#[derive(Debug, Clone)]
pub struct RequestSpan {
    context: Option<Context>,
}

impl RequestSpan {
    /// Starts the root span of a request with `method` and `request_id` (its trace ID when it
    /// is a valid one). Without tracing, nothing is started.
    pub fn start(method: &str, request_id: &str) -> Self {
        if !enabled() {
            return Self { context: None };
        }
        let tracer = global::tracer(MANAGER);
        let trace_id = TraceId::from_hex(request_id).ok().filter(|_| valid_request_id(request_id));
        REQUESTED_TRACE_ID.with(|cell| cell.set(trace_id));
        let span = tracer
            .span_builder(method.to_owned())
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("request.id", request_id.to_owned())])
            .start_with_context(&tracer, &Context::new());
        // A provider without our ID generator leaves it set: never leak it to the next span.
        REQUESTED_TRACE_ID.with(Cell::take);
        let root = RequestRoot(opentelemetry::trace::Span::span_context(&span).clone());
        Self { context: Some(Context::new().with_span(span).with_value(root)) }
    }

    /// The context the request's work runs in (an empty one without tracing).
    pub fn context(&self) -> Context {
        self.context.clone().unwrap_or_default()
    }

    /// Names the span after its route (`"<METHOD> <route>"`; the method alone when no route
    /// matched), sets its status from the answer, and ends it.
    pub fn finish(self, method: &str, route: Option<&str>, error: Option<String>) {
        let Some(cx) = self.context else { return };
        let span = cx.span();
        span.update_name(match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_owned(),
        });
        span.set_status(match error {
            Some(message) => Status::error(message),
            None => Status::Ok,
        });
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_that_can_be_trace_ids() {
        assert!(valid_request_id("0af7651916cd43dd8448eb211c80319c"));
        assert!(valid_request_id("0AF7651916CD43DD8448EB211C80319C"));
        assert!(!valid_request_id("00000000000000000000000000000000"));
        assert!(!valid_request_id("0af76519-16cd-43dd-8448-eb211c80319c"));
        assert!(!valid_request_id("0af7651916cd43dd8448eb211c80319"));
        assert!(!valid_request_id("0af7651916cd43dd8448eb211c80319g"));
    }
}
