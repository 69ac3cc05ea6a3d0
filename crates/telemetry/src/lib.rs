//! Traces across the manager and the controllers, as OpenTelemetry spans.
//!
//! # The model (the reference's, `pkg/tracing`, with the mission's sibling spans)
//!
//! - Every E2B API request is one root span, kind Server, named `"<METHOD> <route>"`, whose
//!   trace ID is the request's ID ([`request`]): a user who has the `X-Request-ID` of a slow
//!   create finds its trace by that ID.
//! - Each write a request makes records the root's span context on the object it writes, as
//!   the W3C `traceparent` in annotation `agents.kruise.io/trace-context`
//!   ([`context::inject`]).
//! - Each controller's reconcile of that object is a span `controller.Reconcile` whose parent
//!   is the request's root ([`reconcile`]): the passes of one operation are siblings in the
//!   request's trace, and the gaps between them are time spent waiting.
//! - A reconcile that writes nothing is marked `reconcile.noop=true` and never exported
//!   (`export`, with feature `export`), so idle resyncs cost no trace storage.
//!
//! # Cost
//!
//! Tracing is off unless a binary installs a provider (`export::install`). While it is off,
//! [`enabled`] is false and every helper here returns at once: no span, no task-local, no
//! annotation. Spans are exported by a batch processor off the request path: a missing or
//! slow collector fills its queue and drops spans; it never slows a request.

pub mod context;
#[cfg(feature = "export")]
pub mod export;
pub mod reconcile;
pub mod request;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

pub use opentelemetry::Context;
pub use opentelemetry::KeyValue as Attribute;
use opentelemetry::trace::{FutureExt as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{KeyValue, global};

/// The instrumentation scope of the manager's spans (the reference's service name for it).
pub const MANAGER: &str = "sandbox-manager";
/// The instrumentation scope of the controllers' spans.
pub const CONTROLLER: &str = "sandbox-controller";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether a tracer provider is installed: the helpers of this crate do nothing otherwise.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turns the helpers on (a provider is installed) or off. `export::install` calls it; tests
/// that install their own provider call it too.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Runs `future` inside a child span `name` of the current context (a new root when there is
/// none), with `attributes`; the span's status is the future's outcome. Without tracing,
/// `future` runs as it is.
pub async fn in_span<T, E, F>(
    scope: &'static str,
    name: &'static str,
    attributes: Vec<KeyValue>,
    future: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: Future<Output = Result<T, E>>,
{
    if !enabled() {
        return future.await;
    }
    let tracer = global::tracer(scope);
    let parent = Context::current();
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    let cx = parent.with_span(span);
    let result = future.with_context(cx.clone()).await;
    let span = cx.span();
    match &result {
        Ok(_) => span.set_status(Status::Ok),
        Err(error) => span.set_status(Status::error(error.to_string())),
    }
    span.end();
    result
}

/// Adds `attribute` to the current span (nothing without tracing or outside a span).
pub fn set_attribute(attribute: KeyValue) {
    if enabled() {
        Context::current().span().set_attribute(attribute);
    }
}

/// `future`, run in the OpenTelemetry context `cx` (its spans are children of `cx`'s span).
pub fn with_context<F: Future>(future: F, cx: Context) -> impl Future<Output = F::Output> {
    future.with_context(cx)
}
