//! Watch (`?watch=true`): a chunked stream of JSON events, one per line, as the API server
//! sends them: `{"type":"ADDED","object":{...}}`.
//!
//! - Without a resourceVersion (or with "0", or with `sendInitialEvents=true`) the stream
//!   starts with an `ADDED` event per matching object, then the changes after that list; with
//!   `sendInitialEvents` and bookmarks, a bookmark annotated `k8s.io/initial-events-end` marks
//!   the end of that state.
//! - With a resourceVersion it sends every change after it; one older than the store's history
//!   ends the stream with an `ERROR` event carrying 410 Expired, so the client lists again.
//! - With `allowWatchBookmarks`, a `BOOKMARK` every minute carries the newest resourceVersion
//!   the stream has reached, so a client resumes from there without replaying.
//! - It ends after `timeoutSeconds` (default 30 minutes, as the API server's request timeout),
//!   when the client goes away, or when the store shuts down.
//! - As a Table (`Accept: ...;as=Table`), each event's object is a one-row Table.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt as _};
use oka_store::{RawWatchEvent, Store, StoreError};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::KubeApi;
use crate::listing::{FieldSelector, ListOptions, item_key};
use crate::resources::Resource;
use crate::status::ApiStatus;
use crate::table::{self, IncludeObject};
use crate::typed::{JsonEvent, OpError, dispatch};

/// The most bytes of events sent in one write.
const MAX_BATCH: usize = 256 * 1024;
/// How often a stream that allows bookmarks sends one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// How long a watch without `timeoutSeconds` lasts.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How each event's object is written.
#[derive(Debug, Clone)]
pub(crate) struct Format {
    /// `Some` when the client asked for Tables.
    pub table: Option<IncludeObject>,
    /// The resource's printer columns.
    pub columns: Vec<table::Column>,
    /// The resource's kind, for bookmarks.
    pub kind: String,
    /// The resource's `apiVersion`, for bookmarks.
    pub api_version: String,
}

impl Format {
    fn line(&self, ty: &str, object: Value) -> Bytes {
        let object = match (&self.table, ty) {
            (Some(include), "ADDED" | "MODIFIED" | "DELETED") => {
                let rv = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                table::table(&self.columns, &[object], &rv, *include, jiff::Timestamp::now())
            }
            (Some(_), "BOOKMARK") => json!({
                "kind": "Table",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
                "columnDefinitions": [],
                "rows": [],
            }),
            _ => object,
        };
        let mut line =
            serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }
}

/// One event ready to send: its line, and the resourceVersion it moves the stream to (`None`
/// for one the watcher does not get, such as another object's under a field selector).
pub(crate) struct Outgoing {
    line: Option<Bytes>,
    rv: String,
    bookmark: bool,
}

/// The typed events as lines: filtered by `fields`, each object a Table when asked.
fn typed_lines(
    events: BoxStream<'static, JsonEvent>,
    fields: FieldSelector,
    format: Format,
) -> BoxStream<'static, Result<Outgoing, OpError>> {
    events
        .map(move |event| {
            let (ty, object) = event?;
            let rv = object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let bookmark = ty == "BOOKMARK";
            let shown = bookmark || fields.matches(&object);
            Ok(Outgoing { line: shown.then(|| format.line(ty, object)), rv, bookmark })
        })
        .boxed()
}

/// The stored JSON of each event in its envelope, without parsing or serializing it again;
/// filtered by `fields`, which read only the name and namespace.
fn raw_lines(
    events: oka_store::RawWatchStream,
    fields: FieldSelector,
) -> BoxStream<'static, Result<Outgoing, OpError>> {
    events
        .map(move |event| {
            let (ty, object) = match event? {
                RawWatchEvent::Added(o) => ("ADDED", o),
                RawWatchEvent::Modified(o) => ("MODIFIED", o),
                RawWatchEvent::Deleted(o) => ("DELETED", o),
                RawWatchEvent::Bookmark(rv) => {
                    return Ok(Outgoing { line: None, rv, bookmark: true });
                }
            };
            let shown = fields.is_empty() || fields.matches_name(&object.namespace, &object.name);
            let line = shown.then(|| {
                let mut line = Vec::with_capacity(object.json.len() + 40);
                line.extend_from_slice(b"{\"type\":\"");
                line.extend_from_slice(ty.as_bytes());
                line.extend_from_slice(b"\",\"object\":");
                line.extend_from_slice(&object.json);
                line.extend_from_slice(b"}\n");
                Bytes::from(line)
            });
            Ok(Outgoing { line, rv: object.resource_version.clone(), bookmark: false })
        })
        .boxed()
}

fn error_event(status: &ApiStatus) -> (&'static str, Value) {
    ("ERROR", status.to_json())
}

/// The 410 a watcher gets when its resourceVersion is older than the history.
fn too_old(requested: &str, oldest: &str) -> ApiStatus {
    ApiStatus::expired(format!("too old resource version: {requested} ({oldest})"))
}

/// Serves a watch of `r` in `ns` (all namespaces with `None`).
pub(crate) async fn serve<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: Option<&str>,
    options: &ListOptions,
    format: Format,
) -> Result<Response, ApiStatus> {
    let requested = options.requested_version()?;
    let op_error = |e: OpError| crate::handlers::op_error(e, r, "");
    let mut initial = Vec::new();
    let from = match requested {
        Some(rv) if !options.send_initial_events => rv.to_string(),
        _ => {
            let (items, rv) = dispatch!(
                r.kind.as_str(),
                list(&api.store, ns, &options.labels),
                Ok((Vec::new(), String::new()))
            )
            .map_err(op_error)?;
            if let (Some(requested), Ok(current)) = (requested, rv.parse::<u64>())
                && requested > current
            {
                return Err(ApiStatus::too_large_resource_version(requested, current));
            }
            initial = items.into_iter().filter(|o| options.fields.matches(o)).collect();
            initial.sort_by(|a, b| item_key(a).cmp(&item_key(b)));
            rv
        }
    };
    // Without a Table or a field selector that reads the objects, every line is the stored
    // JSON as it is: the store serializes each change once for all its watchers. (Namespaces
    // are served without the namespace the store files them under: typed.)
    let raw = format.table.is_none() && options.fields.only_metadata() && r.namespaced;
    let watched = if raw {
        dispatch!(
            r.kind.as_str(),
            watch_raw(&api.store, ns, &options.labels, &from),
            Err(OpError::Decode(String::new()))
        )
        .map(|events| raw_lines(events, options.fields.clone()))
    } else {
        dispatch!(
            r.kind.as_str(),
            watch(&api.store, ns, &options.labels, &from),
            Err(OpError::Decode(String::new()))
        )
        .map(|events| typed_lines(events, options.fields.clone(), format.clone()))
    };
    let events: BoxStream<'static, Result<Outgoing, OpError>> = match watched {
        Ok(events) => events,
        Err(OpError::Store(StoreError::Gone { requested, oldest })) => {
            let status = too_old(&requested, &oldest);
            return Ok(stream_response(vec![error_event(&status)], None, options, from, format));
        }
        Err(OpError::Store(StoreError::Invalid(_))) if requested.is_some() => {
            // The store refuses a resourceVersion it has not reached yet.
            let (_, rv) = dispatch!(
                r.kind.as_str(),
                list(&api.store, ns, &oka_store::Selector::everything()),
                Ok((Vec::new(), String::new()))
            )
            .map_err(op_error)?;
            let current = rv.parse().unwrap_or(0);
            return Err(ApiStatus::too_large_resource_version(requested.unwrap_or(0), current));
        }
        Err(e) => return Err(op_error(e)),
    };
    let mut first: Vec<(&'static str, Value)> = initial.into_iter().map(|o| ("ADDED", o)).collect();
    if options.send_initial_events && options.bookmarks {
        first.push((
            "BOOKMARK",
            json!({
                "kind": r.kind,
                "apiVersion": r.api_version(),
                "metadata": {
                    "resourceVersion": from,
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }),
        ));
    }
    Ok(stream_response(first, Some(events), options, from, format))
}

/// The streaming response: `first`, then `events` (filtered by the field selector), with
/// bookmarks when allowed, until the timeout, the client leaving, or the stream's end.
fn stream_response(
    first: Vec<(&'static str, Value)>,
    events: Option<BoxStream<'static, Result<Outgoing, OpError>>>,
    options: &ListOptions,
    from: String,
    format: Format,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let bookmarks = options.bookmarks;
    let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
    crate::runtime::background().spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        for (ty, object) in first {
            if tx.send(format.line(ty, object)).await.is_err() {
                return;
            }
        }
        let Some(mut events) = events else { return };
        let mut last_rv = from;
        let mut bookmark = tokio::time::interval_at(
            tokio::time::Instant::now() + BOOKMARK_INTERVAL,
            BOOKMARK_INTERVAL,
        );
        loop {
            let next = tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep_until(deadline) => return,
                _ = bookmark.tick(), if bookmarks => None,
                event = events.next() => Some(event),
            };
            let Some(event) = next else {
                let line = format.line(
                    "BOOKMARK",
                    json!({
                        "kind": format.kind,
                        "apiVersion": format.api_version,
                        "metadata": {"resourceVersion": last_rv},
                    }),
                );
                if tx.send(line).await.is_err() {
                    return;
                }
                continue;
            };
            // Every event already waiting goes out with this one, in one write: a burst of
            // changes costs each watcher a few writes, not one per change.
            let mut batch = Vec::new();
            let mut event = event;
            let end = loop {
                match event {
                    None => break Some(None),
                    Some(Err(e)) => break Some(Some(e)),
                    Some(Ok(outgoing)) => {
                        if !outgoing.rv.is_empty() {
                            last_rv = outgoing.rv;
                        }
                        if let Some(line) = outgoing.line
                            && (!outgoing.bookmark || bookmarks)
                        {
                            batch.extend_from_slice(&line);
                        }
                    }
                }
                if batch.len() >= MAX_BATCH {
                    break None;
                }
                match events.next().now_or_never() {
                    Some(next) => event = next,
                    None => break None,
                }
            };
            if !batch.is_empty() && tx.send(Bytes::from(batch)).await.is_err() {
                return;
            }
            match end {
                None => {}
                Some(None) => return,
                Some(Some(e)) => {
                    let status = match e {
                        OpError::Store(StoreError::Gone { requested, oldest }) => {
                            too_old(&requested, &oldest)
                        }
                        OpError::Store(e) => ApiStatus::internal(e.to_string()),
                        OpError::Decode(message) => ApiStatus::internal(message),
                    };
                    let (ty, object) = error_event(&status);
                    let _ = tx.send(format.line(ty, object)).await;
                    return;
                }
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok::<_, std::convert::Infallible>(line), rx))
    });
    let mut response = (StatusCode::OK, Body::from_stream(body)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
