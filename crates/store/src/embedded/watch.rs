//! Watch streams: cursors over the shared change history.
//!
//! A stream keeps only a resourceVersion cursor. When woken (through a `tokio::sync::watch`
//! channel carrying the last published resourceVersion, so no wake-up is ever lost and a writer
//! never waits for a reader) it copies the `Arc`s of the changes after its cursor out of the
//! history under a short read lock, then filters and types them without any lock. A stream that
//! falls so far behind that the history no longer holds the change after its cursor yields
//! [`StoreError::Gone`] and ends: the consumer must list again. Nothing a stream does slows the
//! writer or the other streams. Each event a stream yields has its lag (commit → yield)
//! observed in the store's `oka_store_watch_lag_seconds`, without a lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::BoxStream;
use oka_metrics::DurationHistogram;
use tokio::sync::watch;

use super::object::Entry;
use super::writer::{Event, EventType, Shared};
use crate::{Object, RawWatchEvent, Selector, StoreError, WatchEvent};

/// How many changes a stream takes from the history per lock.
const CHUNK: usize = 256;

/// A watch event and the instant its batch was committed.
pub(crate) type Timed<K> = Result<(WatchEvent<K>, Instant), StoreError>;

/// Which changes a stream reports.
pub(crate) struct Filter {
    pub kind: Arc<str>,
    pub namespace: Option<String>,
    pub selector: Selector,
}

impl Filter {
    /// The event this watcher sees for `event`, if any.
    ///
    /// As the Kubernetes watch cache does, an object that starts matching the selector is
    /// reported as `Added`, and one that stops matching as `Deleted` (its last matching state,
    /// with the change's resourceVersion). A removal is reported when the watcher could see
    /// the object before it.
    fn convert<K: Object>(&self, event: &Event) -> Result<Option<WatchEvent<K>>, StoreError> {
        let Some((ty, was, is)) = self.classify(event) else { return Ok(None) };
        Ok(match (ty, was, is) {
            (EventType::Deleted, Some(_), _) => Some(WatchEvent::Deleted(event.object.typed()?)),
            (_, None, true) => Some(WatchEvent::Added(event.object.typed()?)),
            (_, Some(_), true) => Some(WatchEvent::Modified(event.object.typed()?)),
            (_, Some(prev), false) => {
                let mut last = K::clone(&*prev.typed::<K>()?);
                last.meta_mut().resource_version = Some(event.rv().to_string());
                Some(WatchEvent::Deleted(Arc::new(last)))
            }
            (_, None, false) => None,
        })
    }

    /// [`Filter::convert`], the object as its JSON (serialized once per version, shared).
    fn convert_raw(&self, event: &Event) -> Result<Option<RawWatchEvent>, StoreError> {
        let Some((ty, was, is)) = self.classify(event) else { return Ok(None) };
        Ok(match (ty, was, is) {
            (EventType::Deleted, Some(_), _) => Some(RawWatchEvent::Deleted(event.object.raw()?)),
            (_, None, true) => Some(RawWatchEvent::Added(event.object.raw()?)),
            (_, Some(_), true) => Some(RawWatchEvent::Modified(event.object.raw()?)),
            (_, Some(prev), false) => {
                Some(RawWatchEvent::Deleted(Arc::new(prev.raw_with_version(Some(event.rv()))?)))
            }
            (_, None, false) => None,
        })
    }

    /// Whether this watcher sees `event` at all, and if so its type, the previous version when
    /// it matched the selector, and whether the new one does.
    fn classify<'e>(&self, event: &'e Event) -> Option<(EventType, Option<&'e Arc<Entry>>, bool)> {
        let key = &event.object.key;
        if key.kind != self.kind || self.namespace.as_ref().is_some_and(|ns| *ns != key.namespace) {
            return None;
        }
        let was = event.prev.as_ref().filter(|prev| prev.matches(&self.selector));
        let is = event.ty != EventType::Deleted && event.object.matches(&self.selector);
        Some((event.ty, was, is))
    }
}

/// A stream's position and what it has read but not yet yielded.
struct Cursor<T> {
    shared: Arc<Shared>,
    notify: watch::Receiver<u64>,
    filter: Filter,
    /// The resourceVersion of the last change read.
    rv: u64,
    pending: VecDeque<Result<(T, Instant), StoreError>>,
    /// The writer has stopped: once the history is drained, the stream ends.
    writer_gone: bool,
    /// An error was yielded: the stream ends after `pending`.
    failed: bool,
    /// Where the lag of each yielded event goes.
    lag: DurationHistogram,
}

/// The changes after `from` that `filter` lets through, as they are committed.
pub(crate) fn stream<K: Object>(
    shared: Arc<Shared>,
    notify: watch::Receiver<u64>,
    filter: Filter,
    from: u64,
    lag: DurationHistogram,
) -> BoxStream<'static, Timed<K>> {
    cursor_stream(shared, notify, filter, from, lag, Filter::convert::<K>)
}

/// [`stream`], each object as its JSON.
pub(crate) fn raw_stream(
    shared: Arc<Shared>,
    notify: watch::Receiver<u64>,
    filter: Filter,
    from: u64,
    lag: DurationHistogram,
) -> BoxStream<'static, Result<(RawWatchEvent, Instant), StoreError>> {
    cursor_stream(shared, notify, filter, from, lag, Filter::convert_raw)
}

/// The changes after `from` that `filter` lets through, each made into a `T` by `convert`.
fn cursor_stream<T: Send + 'static>(
    shared: Arc<Shared>,
    notify: watch::Receiver<u64>,
    filter: Filter,
    from: u64,
    lag: DurationHistogram,
    convert: fn(&Filter, &Event) -> Result<Option<T>, StoreError>,
) -> BoxStream<'static, Result<(T, Instant), StoreError>> {
    let cursor = Cursor {
        shared,
        notify,
        filter,
        rv: from,
        pending: VecDeque::new(),
        writer_gone: false,
        failed: false,
        lag,
    };
    futures::stream::unfold(cursor, move |mut c| async move {
        loop {
            if let Some(item) = c.pending.pop_front() {
                if let Ok((_, committed)) = &item {
                    c.lag.observe(committed.elapsed());
                }
                return Some((item, c));
            }
            if c.failed {
                return None;
            }
            // Marked before reading, so a change published after the read wakes us.
            c.notify.mark_unchanged();
            let events = c.shared.read().events_after(c.rv, CHUNK);
            match events {
                Err(gone) => {
                    tracing::debug!(error = %gone, "watch fell behind the history");
                    c.pending.push_back(Err(gone));
                    c.failed = true;
                }
                Ok(events) if events.is_empty() => {
                    if c.writer_gone {
                        return None;
                    }
                    if c.notify.changed().await.is_err() {
                        c.writer_gone = true;
                    }
                }
                Ok(events) => {
                    for event in events {
                        c.rv = event.rv();
                        match convert(&c.filter, &event) {
                            Ok(Some(we)) => c.pending.push_back(Ok((we, event.committed_at))),
                            Ok(None) => {}
                            Err(e) => {
                                c.pending.push_back(Err(e));
                                c.failed = true;
                                break;
                            }
                        }
                    }
                }
            }
        }
    })
    .boxed()
}
