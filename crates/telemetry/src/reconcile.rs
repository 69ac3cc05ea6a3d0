//! One controller reconcile as one span, `controller.Reconcile`, and the write flag that
//! decides whether it is worth exporting.
//!
//! The span's parent is the trace context the object carries ([`crate::context::extract`]):
//! the request that last wrote it. A reconcile that wrote nothing (no create, update, status
//! update or delete through its store) and did not fail is marked `reconcile.noop=true`; the
//! exporter drops such spans, so a resync of ten thousand idle sandboxes exports nothing.
//! Writes are marked by whoever performs them ([`mark_write`]); a controller's store is
//! wrapped to do it (`oka_controller::trace::MarkWrites`).

use std::cell::Cell;
use std::future::Future;

use opentelemetry::trace::{FutureExt as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, global};

use crate::{CONTROLLER, enabled};

/// The attribute a reconcile span that wrote nothing carries; the exporter drops those spans.
pub const NOOP: &str = "reconcile.noop";

tokio::task_local! {
    static WROTE: Cell<bool>;
}

/// Records that the current reconcile wrote to the store (nothing outside a traced
/// reconcile).
pub fn mark_write() {
    let _ = WROTE.try_with(|wrote| wrote.set(true));
}

/// Runs one reconcile, `future`, in a `controller.Reconcile` span child of the context
/// `parent` gives, with the `attributes` it gives; marks it `reconcile.noop=true` when it
/// succeeded without writing. Without tracing, `future` runs as it is and `parent` is not
/// called.
pub async fn reconcile<T, E, F>(
    parent: impl FnOnce() -> (Context, Vec<KeyValue>),
    future: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: Future<Output = Result<T, E>>,
{
    if !enabled() {
        return future.await;
    }
    let (parent, attributes) = parent();
    let tracer = global::tracer(CONTROLLER);
    let span = tracer
        .span_builder("controller.Reconcile")
        .with_kind(SpanKind::Internal)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    let cx = parent.with_span(span);
    let (result, wrote) = WROTE
        .scope(Cell::new(false), async {
            let result = future.with_context(cx.clone()).await;
            (result, WROTE.with(Cell::get))
        })
        .await;
    let span = cx.span();
    match &result {
        Err(error) => span.set_status(Status::error(error.to_string())),
        Ok(_) if !wrote => span.set_attribute(KeyValue::new(NOOP, true)),
        Ok(_) => span.set_status(Status::Ok),
    }
    span.end();
    result
}
