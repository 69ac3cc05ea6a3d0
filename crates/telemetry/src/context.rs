//! The trace context an object carries: annotation `agents.kruise.io/trace-context`, a W3C
//! `traceparent` (`00-<32 hex trace>-<16 hex span>-<2 hex flags>`).
//!
//! A request's writes record its **root** span (not the child span that happens to be
//! current), so every controller reconcile of the object is a direct child of the request's
//! root, as the reference's injection does. Each write overwrites the annotation: the object
//! belongs to the trace of the last operation on it. An object without a valid annotation is
//! reconciled in a new root span.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use oka_api::annotations::TRACE_CONTEXT;
use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};

use crate::enabled;

/// The span context of a request's root span, kept in the request's [`Context`] so injections
/// made under its child spans still name the root.
#[derive(Debug, Clone)]
pub struct RequestRoot(pub SpanContext);

/// `context` as a W3C `traceparent`, or `None` when it is not valid.
pub fn traceparent(context: &SpanContext) -> Option<String> {
    context.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    })
}

/// The remote span context a `traceparent` names, or `None` when `value` is not a valid one
/// (wrong version `ff`, wrong lengths, upper-case or non-hex digits, an all-zero ID).
pub fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !lower_hex(version, 2) || version == "ff" || !lower_hex(trace, 32) || !lower_hex(span, 16) {
        return None;
    }
    // Version 00 has exactly four fields; a later version may append more.
    if !lower_hex(flags, 2) || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sampled = if flags & 1 == 1 { TraceFlags::SAMPLED } else { TraceFlags::default() };
    let context = SpanContext::new(trace_id, span_id, sampled, true, TraceState::default());
    context.is_valid().then_some(context)
}

/// The `traceparent` a write made now should record: the current request's root, else the
/// current span; `None` without tracing or outside any span.
pub fn current_traceparent() -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = Context::current();
    match cx.get::<RequestRoot>() {
        Some(root) => traceparent(&root.0),
        None => traceparent(cx.span().span_context()),
    }
}

/// Records the current trace context on `metadata` (see [`current_traceparent`]); returns
/// whether it did. Without a valid context nothing is written, not even an empty map.
pub fn inject(metadata: &mut ObjectMeta) -> bool {
    inject_into(&mut metadata.annotations)
}

/// [`inject`] into an annotation map.
pub fn inject_into(annotations: &mut Option<BTreeMap<String, String>>) -> bool {
    match current_traceparent() {
        Some(value) => {
            annotations.get_or_insert_default().insert(TRACE_CONTEXT.to_owned(), value);
            true
        }
        None => false,
    }
}

/// The parent context `metadata`'s annotation names (a remote span context), or an empty
/// context, whose spans are new roots.
pub fn extract(metadata: &ObjectMeta) -> Context {
    metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TRACE_CONTEXT))
        .and_then(|value| parse_traceparent(value))
        .map_or_else(Context::new, |sc| Context::new().with_remote_span_context(sc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips() {
        let value = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let context = parse_traceparent(value).expect("valid");
        assert!(context.is_remote());
        assert!(context.is_sampled());
        assert_eq!(traceparent(&context).as_deref(), Some(value));
        let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        assert!(!parse_traceparent(unsampled).expect("valid").is_sampled());
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for value in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333g-01",
        ] {
            assert!(parse_traceparent(value).is_none(), "{value:?} must be refused");
        }
        // A later version may carry more fields.
        assert!(
            parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xyz")
                .is_some()
        );
    }

    #[test]
    fn nothing_is_injected_without_tracing() {
        let mut meta = ObjectMeta::default();
        assert!(!inject(&mut meta));
        assert!(meta.annotations.is_none());
        assert!(!extract(&meta).span().span_context().is_valid());
    }
}
