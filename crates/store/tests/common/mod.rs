//! Test kinds and fixture builders shared by the embedded store's tests.

// Helpers panic on failure: in a test, a panic is the failure report.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{CustomResource, Resource};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{WatchEvent, WatchStream};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A namespaced test kind with a status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "test.oka.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct WidgetSpec {
    pub size: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub color: String,
}

/// The status of a [`Widget`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct WidgetStatus {
    pub phase: String,
}

/// A second namespaced kind, to check that kinds are kept apart and that the owner cascade
/// crosses kinds.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "other.oka.dev",
    version = "v1beta1",
    kind = "Gadget",
    namespaced,
    status = "GadgetStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct GadgetSpec {
    pub mode: String,
}

/// The status of a [`Gadget`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct GadgetStatus {
    pub ready: bool,
}

pub const NS: &str = "default";

/// A fixture builder for [`Widget`].
pub fn widget(name: &str) -> Widget {
    Widget::new(name, WidgetSpec { size: 1, color: String::new() })
}

/// A fixture builder for [`Gadget`].
pub fn gadget(name: &str) -> Gadget {
    Gadget::new(name, GadgetSpec { mode: "on".into() })
}

/// Builder methods for any test object.
pub trait Fixture: Resource + Sized {
    fn labeled(mut self, key: &str, value: &str) -> Self {
        self.meta_mut().labels.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
        self
    }

    fn finalizer(mut self, f: &str) -> Self {
        self.meta_mut().finalizers.get_or_insert_with(Vec::new).push(f.into());
        self
    }

    fn owned_by<O: Resource<DynamicType = ()>>(mut self, owner: &O) -> Self {
        let r = OwnerReference {
            api_version: O::api_version(&()).into_owned(),
            kind: O::kind(&()).into_owned(),
            name: owner.meta().name.clone().unwrap_or_default(),
            uid: owner.meta().uid.clone().unwrap_or_default(),
            ..OwnerReference::default()
        };
        self.meta_mut().owner_references.get_or_insert_with(Vec::new).push(r);
        self
    }

    fn rv(&self) -> u64 {
        self.meta().resource_version.as_deref().unwrap_or("0").parse().unwrap()
    }
}

impl Fixture for Widget {}
impl Fixture for Gadget {}

/// A store in a fresh directory; keep the directory alive as long as the store.
pub fn open_temp(options: EmbeddedOptions) -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.redb"), options).unwrap();
    (dir, store)
}

pub fn open_at(path: &Path) -> EmbeddedStore {
    EmbeddedStore::open(path, EmbeddedOptions::default()).unwrap()
}

/// The next event, waiting at most five seconds.
pub async fn next<K: Clone + Send + 'static>(stream: &mut WatchStream<K>) -> WatchEvent<K> {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("no watch event within 5 s")
        .expect("the watch stream ended")
        .expect("the watch stream failed")
}

/// Every event already delivered to `stream` (writes publish before they return, so after a
/// write its events are ready without waiting).
pub fn ready<K: Clone + Send + 'static>(stream: &mut WatchStream<K>) -> Vec<WatchEvent<K>> {
    let mut out = Vec::new();
    while let Some(Some(item)) = stream.next().now_or_never() {
        out.push(item.expect("the watch stream failed"));
    }
    out
}

/// An event as `(type, name, resourceVersion)`, for comparisons.
pub fn summary<K: Resource>(event: &WatchEvent<K>) -> (&'static str, String, u64) {
    let (ty, obj) = match event {
        WatchEvent::Added(o) => ("Added", o),
        WatchEvent::Modified(o) => ("Modified", o),
        WatchEvent::Deleted(o) => ("Deleted", o),
        WatchEvent::Bookmark(rv) => return ("Bookmark", String::new(), rv.parse().unwrap()),
    };
    let meta = obj.meta();
    (
        ty,
        meta.name.clone().unwrap_or_default(),
        meta.resource_version.as_deref().unwrap_or("0").parse().unwrap(),
    )
}
