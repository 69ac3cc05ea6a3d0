//! Kubernetes Events (`core/v1`) about the objects the controllers act on, so `kubectl describe`
//! and `kubectl get events` tell what happened to a sandbox, as on a cluster.
//!
//! - [`EventRecorder::record`] never waits: it queues the event for a writer task and drops it
//!   when the queue is full (an event is a diagnostic, never worth slowing a reconcile).
//! - Repeats aggregate as client-go's recorder does: the same object, type, reason and message
//!   make one Event (named after the object and a hash of the rest) whose `count` and
//!   `lastTimestamp` grow.
//! - Events expire [`EVENT_TTL`] after they were last seen (the API server's `--event-ttl`), by
//!   [`sweep_expired_events`].

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Resource;
use oka_store::{Preconditions, Selector, Store, StoreError};
use tokio::sync::mpsc;
use tracing::debug;

/// How long an Event lives after it was last seen.
pub const EVENT_TTL: Duration = Duration::from_secs(3600);
/// How many events may wait for the writer before new ones are dropped.
const QUEUE: usize = 1024;

/// `Normal` or `Warning`, as Events say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event to write.
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    involved: ObjectReference,
    type_: EventType,
    reason: String,
    message: String,
}

/// Queues Events for a writer task; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventRecorder {
    queue: Option<mpsc::Sender<Pending>>,
}

impl EventRecorder {
    /// A recorder whose events `component` writes into `store`. Outside a Tokio runtime it
    /// records nothing.
    pub fn spawn<S: Store>(store: S, component: &str) -> Self {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return EventRecorder::disabled();
        };
        let (queue, mut pending) = mpsc::channel::<Pending>(QUEUE);
        let component = component.to_owned();
        handle.spawn(async move {
            while let Some(event) = pending.recv().await {
                if let Err(error) = write(&store, &component, event).await {
                    debug!(%error, "event not recorded");
                }
            }
        });
        EventRecorder { queue: Some(queue) }
    }

    /// A recorder that records nothing.
    pub fn disabled() -> Self {
        EventRecorder { queue: None }
    }

    /// Records an event about `obj`.
    pub fn record<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let Some(queue) = &self.queue else { return };
        let meta = obj.meta();
        let involved = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            field_path: None,
        };
        let event =
            Pending { involved, type_, reason: reason.to_owned(), message: message.to_owned() };
        if queue.try_send(event).is_err() {
            debug!(reason, "event queue full: event dropped");
        }
    }
}

/// The name of the Event that aggregates `event`: the object's name and a hash of what makes
/// two events the same.
fn event_name(event: &Pending) -> String {
    let mut hasher = DefaultHasher::new();
    (
        &event.involved.uid,
        &event.involved.kind,
        event.type_.as_str(),
        &event.reason,
        &event.message,
    )
        .hash(&mut hasher);
    let object = event.involved.name.as_deref().unwrap_or("object");
    format!("{object}.{:016x}", hasher.finish())
}

async fn write<S: Store>(store: &S, component: &str, event: Pending) -> Result<(), StoreError> {
    let namespace = event.involved.namespace.clone().unwrap_or_else(|| "default".to_owned());
    let name = event_name(&event);
    let now = jiff::Timestamp::now();
    match store.get::<Event>(&namespace, &name).await {
        Ok(mut existing) => {
            existing.count = Some(existing.count.unwrap_or(1) + 1);
            existing.last_timestamp = Some(Time(now));
            existing.involved_object.resource_version = event.involved.resource_version;
            // A conflict means another write counted this one meanwhile: good enough.
            match store.update(&namespace, &existing).await {
                Ok(_) | Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => Ok(()),
                Err(error) => Err(error),
            }
        }
        Err(StoreError::NotFound { .. }) => {
            let created = Event {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(namespace.clone()),
                    ..ObjectMeta::default()
                },
                involved_object: event.involved,
                type_: Some(event.type_.as_str().to_owned()),
                reason: Some(event.reason),
                message: Some(event.message),
                source: Some(EventSource { component: Some(component.to_owned()), host: None }),
                reporting_component: Some(component.to_owned()),
                first_timestamp: Some(Time(now)),
                last_timestamp: Some(Time(now)),
                event_time: Some(MicroTime(now)),
                count: Some(1),
                ..Event::default()
            };
            match store.create(&namespace, &created).await {
                Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                Err(error) => Err(error),
            }
        }
        Err(error) => Err(error),
    }
}

/// Whether `event` was last seen more than `ttl` before `now`.
fn expired(event: &Event, now: jiff::Timestamp, ttl: Duration) -> bool {
    let last = event
        .last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let ttl = jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX);
    last.is_some_and(|last| now.duration_since(last) > ttl)
}

/// Deletes the Events last seen more than `ttl` ago, every `every`, until the store closes.
pub async fn sweep_expired_events<S: Store>(store: S, ttl: Duration, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let events = match store.list::<Event>(None, &Selector::everything()).await {
            Ok(list) => list.items,
            Err(StoreError::Unavailable(_)) => return,
            Err(error) => {
                debug!(%error, "cannot list events to expire them");
                continue;
            }
        };
        let now = jiff::Timestamp::now();
        let mut gone = BTreeMap::new();
        for event in events.iter().filter(|e| expired(e, now, ttl)) {
            let namespace = event.metadata.namespace.clone().unwrap_or_default();
            let name = event.metadata.name.clone().unwrap_or_default();
            let pre = Preconditions { uid: event.metadata.uid.clone(), resource_version: None };
            if store.delete::<Event>(&namespace, &name, &pre).await.is_ok() {
                *gone.entry(namespace).or_insert(0) += 1;
            }
        }
        if !gone.is_empty() {
            debug!(?gone, "expired events deleted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(reason: &str, message: &str) -> Pending {
        Pending {
            involved: ObjectReference {
                name: Some("base-x".into()),
                uid: Some("u1".into()),
                kind: Some("Sandbox".into()),
                ..ObjectReference::default()
            },
            type_: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn the_same_event_aggregates_and_another_does_not() {
        let a = event_name(&pending("SandboxRunning", "Sandbox started"));
        assert_eq!(a, event_name(&pending("SandboxRunning", "Sandbox started")));
        assert_ne!(a, event_name(&pending("SandboxPaused", "Pause sandbox")));
        assert!(a.starts_with("base-x."));
    }

    #[test]
    fn events_expire_after_the_ttl() {
        let now: jiff::Timestamp = "2026-01-01T02:00:00Z".parse().unwrap();
        let at =
            |t: &str| Event { last_timestamp: Some(Time(t.parse().unwrap())), ..Event::default() };
        assert!(expired(&at("2026-01-01T00:59:59Z"), now, EVENT_TTL));
        assert!(!expired(&at("2026-01-01T01:00:01Z"), now, EVENT_TTL));
    }
}
