//! Test support: small test kinds, and [`FaultyStore`], an in-memory [`Store`] whose lists and
//! watches can be made to fail the ways a real backend does (errors, `Gone`, a stream that
//! ends), so the runtime's recovery paths can be driven on purpose and under paused time.
//!
//! It keeps the trait's rules that the runtime relies on (a global resourceVersion, status
//! only through `update_status`, finalizers, watch replay from a version, `Gone` below the
//! retained history); it is not a model of the whole Store contract, which the store crate
//! tests itself.

#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::CustomResource;
use oka_store::{
    Deleted, Object, ObjectList, Preconditions, Result, Selector, Store, StoreError, WatchEvent,
    WatchStream,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The primary kind of the runtime tests.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "test.oka.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    pub size: i32,
}

/// The status of a [`Widget`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct WidgetStatus {
    pub observed: i32,
}

/// A second kind, owned by widgets.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "test.oka.dev", version = "v1", kind = "Part", namespaced)]
pub struct PartSpec {
    pub note: String,
}

pub fn widget(name: &str, size: i32) -> Widget {
    let mut widget = Widget::new(name, WidgetSpec { size });
    widget.metadata.namespace = Some("default".into());
    widget
}

pub fn part(name: &str, owner: Option<&Widget>) -> Part {
    let mut part = Part::new(name, PartSpec { note: String::new() });
    part.metadata.namespace = Some("default".into());
    if let Some(owner) = owner {
        part.metadata.owner_references =
            Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "test.oka.dev/v1".into(),
                kind: "Widget".into(),
                name: owner.metadata.name.clone().unwrap_or_default(),
                uid: owner.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                ..Default::default()
            }]);
    }
    part
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Added,
    Modified,
    Deleted,
}

struct Record {
    rv: u64,
    kind: String,
    event: EventKind,
    object: Value,
}

struct Watcher {
    kind: String,
    namespace: Option<String>,
    selector: Selector,
    tx: mpsc::UnboundedSender<Result<(EventKind, Value)>>,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    next_uid: u64,
    objects: BTreeMap<(String, String, String), Value>,
    history: Vec<Record>,
    /// Watches from a version below this fail with `Gone`.
    oldest: u64,
    watchers: Vec<Watcher>,
    /// Lists still to fail, per kind.
    fail_lists: BTreeMap<String, u32>,
    lists: u64,
    watches: u64,
}

/// An in-memory store with fault injection. Clones share state.
#[derive(Clone, Default)]
pub struct FaultyStore {
    inner: Arc<Mutex<Inner>>,
}

fn labels(object: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(object["metadata"]["labels"].clone()).unwrap_or_default()
}

fn matches(watcher: &Watcher, kind: &str, object: &Value) -> bool {
    watcher.kind == kind
        && watcher
            .namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
        && watcher.selector.matches(Some(&labels(object)))
}

fn decode<K: Object>(value: Value) -> Result<K> {
    serde_json::from_value(value).map_err(|e| StoreError::Internal(e.to_string()))
}

fn not_found<K: Object>(namespace: &str, name: &str) -> StoreError {
    StoreError::NotFound {
        kind: K::kind(&()).into_owned(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn conflict<K: Object>(namespace: &str, name: &str, message: &str) -> StoreError {
    StoreError::Conflict {
        kind: K::kind(&()).into_owned(),
        namespace: namespace.into(),
        name: name.into(),
        message: message.into(),
    }
}

impl Inner {
    fn record(&mut self, kind: &str, event: EventKind, object: &Value) {
        self.history.push(Record { rv: self.rv, kind: kind.into(), event, object: object.clone() });
        self.watchers.retain(|watcher| {
            !matches(watcher, kind, object) || watcher.tx.send(Ok((event, object.clone()))).is_ok()
        });
    }

    fn bump(&mut self, object: &mut Value) {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }
}

impl FaultyStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `n` lists of kind `K` fail with `Unavailable`.
    pub fn fail_next_lists<K: Object>(&self, n: u32) {
        self.inner.lock().unwrap().fail_lists.insert(K::kind(&()).into_owned(), n);
    }

    /// Forgets all history: every open watch fails with `Gone`, and so does any new watch
    /// from a version before now.
    pub fn compact(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.oldest = inner.rv + 1;
        inner.history.clear();
        let requested = inner.rv.to_string();
        let oldest = inner.oldest.to_string();
        for watcher in inner.watchers.drain(..) {
            let _ = watcher.tx.send(Err(StoreError::Gone {
                requested: requested.clone(),
                oldest: oldest.clone(),
            }));
        }
    }

    /// Every open watch fails with `error` (history is kept, so a resume replays).
    pub fn break_watches(&self, error: StoreError) {
        let mut inner = self.inner.lock().unwrap();
        for watcher in inner.watchers.drain(..) {
            let _ = watcher.tx.send(Err(error.clone()));
        }
    }

    /// Every open watch stream ends without an error.
    pub fn end_watches(&self) {
        self.inner.lock().unwrap().watchers.clear();
    }

    /// Successful and failed list calls so far.
    pub fn lists(&self) -> u64 {
        self.inner.lock().unwrap().lists
    }

    /// Watch calls so far.
    pub fn watches(&self) -> u64 {
        self.inner.lock().unwrap().watches
    }

    /// Open watch streams.
    pub fn open_watches(&self) -> usize {
        let mut inner = self.inner.lock().unwrap();
        inner.watchers.retain(|w| !w.tx.is_closed());
        inner.watchers.len()
    }
}

impl Store for FaultyStore {
    async fn create<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        let kind = K::kind(&()).into_owned();
        let mut inner = self.inner.lock().unwrap();
        let mut value =
            serde_json::to_value(obj).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let name = match value["metadata"]["name"].as_str() {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => format!(
                "{}{}",
                value["metadata"]["generateName"].as_str().unwrap_or("obj-"),
                inner.next_uid
            ),
        };
        let key = (kind.clone(), namespace.to_string(), name.clone());
        if inner.objects.contains_key(&key) {
            return Err(StoreError::AlreadyExists { kind, namespace: namespace.into(), name });
        }
        inner.next_uid += 1;
        let uid = format!("uid-{}", inner.next_uid);
        value["metadata"]["name"] = json!(name);
        value["metadata"]["namespace"] = json!(namespace);
        value["metadata"]["uid"] = json!(uid);
        value["metadata"]["generation"] = json!(1);
        value["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        inner.bump(&mut value);
        inner.objects.insert(key, value.clone());
        inner.record(&kind, EventKind::Added, &value);
        decode(value)
    }

    async fn get<K: Object>(&self, namespace: &str, name: &str) -> Result<K> {
        let kind = K::kind(&()).into_owned();
        let inner = self.inner.lock().unwrap();
        let value = inner
            .objects
            .get(&(kind, namespace.into(), name.into()))
            .cloned()
            .ok_or_else(|| not_found::<K>(namespace, name))?;
        decode(value)
    }

    async fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Result<ObjectList<K>> {
        let kind = K::kind(&()).into_owned();
        let mut inner = self.inner.lock().unwrap();
        inner.lists += 1;
        if let Some(remaining) = inner.fail_lists.get_mut(&kind).filter(|n| **n > 0) {
            *remaining -= 1;
            return Err(StoreError::Unavailable("injected list failure".into()));
        }
        let mut items = Vec::new();
        for ((k, ns, _), value) in &inner.objects {
            if *k == kind
                && namespace.is_none_or(|n| n == ns)
                && selector.matches(Some(&labels(value)))
            {
                items.push(Arc::new(decode(value.clone())?));
            }
        }
        Ok(ObjectList { items, resource_version: inner.rv.to_string() })
    }

    async fn update<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.write(namespace, obj, false)
    }

    async fn update_status<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.write(namespace, obj, true)
    }

    async fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted<K>> {
        let kind = K::kind(&()).into_owned();
        let key = (kind.clone(), namespace.to_string(), name.to_string());
        let mut inner = self.inner.lock().unwrap();
        let mut value =
            inner.objects.get(&key).cloned().ok_or_else(|| not_found::<K>(namespace, name))?;
        if preconditions.uid.as_deref().is_some_and(|uid| value["metadata"]["uid"] != json!(uid))
            || preconditions
                .resource_version
                .as_deref()
                .is_some_and(|rv| value["metadata"]["resourceVersion"] != json!(rv))
        {
            return Err(conflict::<K>(namespace, name, "precondition failed"));
        }
        let has_finalizers =
            value["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        inner.bump(&mut value);
        if has_finalizers {
            value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            inner.objects.insert(key, value.clone());
            inner.record(&kind, EventKind::Modified, &value);
            Ok(Deleted::Finalizing(decode(value)?))
        } else {
            inner.objects.remove(&key);
            inner.record(&kind, EventKind::Deleted, &value);
            Ok(Deleted::Gone(decode(value)?))
        }
    }

    async fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<WatchStream<K>> {
        let kind = K::kind(&()).into_owned();
        let mut inner = self.inner.lock().unwrap();
        inner.watches += 1;
        let from = if resource_version.is_empty() {
            inner.rv
        } else {
            resource_version.parse::<u64>().map_err(|_| {
                StoreError::Invalid(format!("bad resourceVersion {resource_version}"))
            })?
        };
        if from + 1 < inner.oldest {
            return Err(StoreError::Gone {
                requested: resource_version.into(),
                oldest: inner.oldest.to_string(),
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = Watcher {
            kind: kind.clone(),
            namespace: namespace.map(Into::into),
            selector: selector.clone(),
            tx,
        };
        for record in &inner.history {
            if record.rv > from && matches(&watcher, &record.kind, &record.object) {
                let _ = watcher.tx.send(Ok((record.event, record.object.clone())));
            }
        }
        inner.watchers.push(watcher);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            Some((item, rx))
        })
        .map(|item| {
            let (event, value) = item?;
            let obj = Arc::new(decode::<K>(value)?);
            Ok(match event {
                EventKind::Added => WatchEvent::Added(obj),
                EventKind::Modified => WatchEvent::Modified(obj),
                EventKind::Deleted => WatchEvent::Deleted(obj),
            })
        });
        Ok(stream.boxed())
    }
}

impl FaultyStore {
    fn write<K: Object>(&self, namespace: &str, obj: &K, status: bool) -> Result<K> {
        let kind = K::kind(&()).into_owned();
        let name = obj.meta().name.clone().unwrap_or_default();
        let key = (kind.clone(), namespace.to_string(), name.clone());
        let mut inner = self.inner.lock().unwrap();
        let current =
            inner.objects.get(&key).cloned().ok_or_else(|| not_found::<K>(namespace, &name))?;
        if let Some(rv) = &obj.meta().resource_version
            && current["metadata"]["resourceVersion"] != json!(rv)
        {
            return Err(conflict::<K>(namespace, &name, "stale resourceVersion"));
        }
        let incoming = serde_json::to_value(obj).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut value = current.clone();
        if status {
            value["status"] = incoming["status"].clone();
        } else {
            for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
                value["metadata"][field] = incoming["metadata"][field].clone();
            }
            if incoming["spec"] != current["spec"] {
                value["spec"] = incoming["spec"].clone();
                let generation = current["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                value["metadata"]["generation"] = json!(generation);
            }
        }
        inner.bump(&mut value);
        let finalized = value["metadata"]["deletionTimestamp"].is_string()
            && value["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        if finalized {
            inner.objects.remove(&key);
            inner.record(&kind, EventKind::Deleted, &value);
        } else {
            inner.objects.insert(key, value.clone());
            inner.record(&kind, EventKind::Modified, &value);
        }
        decode(value)
    }
}
