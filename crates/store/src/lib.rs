//! The Store seam: typed objects with Kubernetes semantics.
//!
//! Everything above this crate (controllers, the manager, the gateway) reads and writes
//! objects through the [`Store`] trait, so the same code runs on one machine, against the
//! embedded durable backend (`embedded::EmbeddedStore`), and on a cluster, against the
//! Kubernetes API server (`kubernetes::KubeStore`).
//!
//! # Semantics (both backends)
//!
//! - Every write gets a new `metadata.resourceVersion`. It is opaque to callers, but on the
//!   embedded backend it is one global, strictly increasing decimal counter.
//! - [`Store::update`] and [`Store::update_status`] take the object's `resourceVersion` as a
//!   precondition when it is set: a stale one fails with [`StoreError::Conflict`].
//! - `metadata.generation` starts at 1 and is bumped when the spec (every top-level field but
//!   `apiVersion`, `kind`, `metadata` and `status`) changes, and when deletion starts.
//!   [`Store::update`] never changes `status`; [`Store::update_status`] changes nothing but
//!   `status`.
//! - [`Store::delete`] of an object with finalizers sets `deletionTimestamp` and returns
//!   [`Deleted::Finalizing`]; the object is removed by the update that empties its finalizers.
//! - When an object is removed, the objects that name it as their only remaining owner (by
//!   `ownerReferences[].uid`) are deleted in turn (owner cascade). The embedded store does it
//!   within the delete; on Kubernetes it is the garbage collector's (kube-controller-manager),
//!   in the background, so dependents disappear shortly after their owner, and not at all on a
//!   server that runs no garbage collector.
//! - [`Store::watch`] streams every change after a resourceVersion; when that version is older
//!   than the retained history it fails with [`StoreError::Gone`] and the caller must relist.
//!   The `Gone` may come from `watch` itself or as the stream's first item (the API server's
//!   watch cache answers that way), and later, when a watcher falls behind: callers handle it
//!   wherever it comes.
//!
//! The same suite of behaviour tests runs on both backends (`tests/suite/`), the Kubernetes one
//! against a real API server.
//!
//! # Architecture invariant
//!
//! The store knows nothing of controllers, sandboxes or E2B: it stores any namespaced kind
//! that implements [`Object`], and any cluster-scoped kind as [`Clustered`] ([`cluster`]).

#![forbid(unsafe_code)]

pub mod cluster;
pub mod embedded;
mod error;
pub mod kubernetes;
pub mod metrics;
pub mod selector;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use cluster::{CLUSTER_NAMESPACE, Clustered};
pub use error::{Result, StoreError};
pub use selector::{Requirement, Selector};

/// A kind the store can hold: a namespaced Kubernetes resource with a static type.
///
/// Every CRD type derived with `kube::CustomResource` in `oka-api` qualifies.
pub trait Object:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Object for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The result of a list: the matching objects and the resourceVersion the list was read at.
///
/// A watch started from `resource_version` sees every change after this list.
#[derive(Debug, Clone)]
pub struct ObjectList<K> {
    /// The matching objects, ordered by namespace, then name.
    pub items: Vec<Arc<K>>,
    /// The store's resourceVersion at the moment of the list.
    pub resource_version: String,
}

/// What a delete did.
#[derive(Debug, Clone, PartialEq)]
pub enum Deleted<K> {
    /// The object is gone; this is its last state.
    Gone(K),
    /// The object has finalizers: `deletionTimestamp` is now set, and the object stays until
    /// its finalizers are removed.
    Finalizing(K),
}

impl<K> Deleted<K> {
    /// The object as the delete left it.
    pub fn object(&self) -> &K {
        match self {
            Deleted::Gone(obj) | Deleted::Finalizing(obj) => obj,
        }
    }
}

/// Conditions a delete checks before it acts; a mismatch fails with [`StoreError::Conflict`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The object's `metadata.uid` must equal this.
    pub uid: Option<String>,
    /// The object's `metadata.resourceVersion` must equal this.
    pub resource_version: Option<String>,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent<K> {
    /// The object was created.
    Added(Arc<K>),
    /// The object changed (spec, status, metadata, or its deletion started).
    Modified(Arc<K>),
    /// The object was removed (or, for a watch with a selector, its labels stopped matching);
    /// this is its last state. On the API server, an object removed by the update that emptied
    /// its finalizers shows the last state stored, with the finalizer that update removed; a
    /// selector watch shows the new labels, where the embedded store shows the last matching
    /// state.
    Deleted(Arc<K>),
    /// No change for this watch, but the store has reached this resourceVersion.
    /// Resuming a watch from it skips nothing.
    Bookmark(String),
}

/// An object as its JSON bytes, with what a watcher filters on: shared by every watcher of a
/// change (the embedded store serializes each version once, however many watch it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawObject {
    /// The object, as JSON.
    pub json: Vec<u8>,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

impl RawObject {
    /// `obj` serialized.
    ///
    /// # Errors
    ///
    /// [`StoreError::Internal`] when it does not serialize.
    pub fn of<K: Object>(obj: &K) -> Result<Self> {
        let json = serde_json::to_vec(obj)
            .map_err(|e| StoreError::Internal(format!("the object does not serialize: {e}")))?;
        let meta = obj.meta();
        Ok(RawObject {
            json,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
        })
    }
}

/// One change seen by a watch, its object as JSON (see [`Store::watch_raw`]).
#[derive(Debug, Clone, PartialEq)]
pub enum RawWatchEvent {
    /// The object was created.
    Added(Arc<RawObject>),
    /// The object changed.
    Modified(Arc<RawObject>),
    /// The object was removed; this is its last state.
    Deleted(Arc<RawObject>),
    /// No change for this watch, but the store has reached this resourceVersion.
    Bookmark(String),
}

impl RawWatchEvent {
    /// A typed event, its object serialized.
    ///
    /// # Errors
    ///
    /// [`StoreError::Internal`] when the object does not serialize.
    pub fn of<K: Object>(event: WatchEvent<K>) -> Result<Self> {
        Ok(match event {
            WatchEvent::Added(obj) => RawWatchEvent::Added(Arc::new(RawObject::of(obj.as_ref())?)),
            WatchEvent::Modified(obj) => {
                RawWatchEvent::Modified(Arc::new(RawObject::of(obj.as_ref())?))
            }
            WatchEvent::Deleted(obj) => {
                RawWatchEvent::Deleted(Arc::new(RawObject::of(obj.as_ref())?))
            }
            WatchEvent::Bookmark(rv) => RawWatchEvent::Bookmark(rv),
        })
    }
}

/// A stream of [`RawWatchEvent`]s, ending as a [`WatchStream`] does.
pub type RawWatchStream = BoxStream<'static, Result<RawWatchEvent>>;

/// A stream of watch events. It ends with an error ([`StoreError::Gone`] when the watcher fell
/// too far behind) or when the store shuts down.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>>>;

/// Typed objects with Kubernetes semantics. See the crate documentation for the rules every
/// backend keeps.
///
/// All objects are namespaced; `namespace` is always given explicitly, as in a Kubernetes
/// request path. An object whose own `metadata.namespace` is set to another namespace is
/// rejected with [`StoreError::Invalid`].
pub trait Store: Clone + Send + Sync + 'static {
    /// Creates `obj`. The store sets `uid`, `resourceVersion`, `generation` (1),
    /// `creationTimestamp`, and `name` from `generateName` when `name` is empty.
    /// Fails with [`StoreError::AlreadyExists`] when the name is taken.
    fn create<K: Object>(&self, namespace: &str, obj: &K)
    -> impl Future<Output = Result<K>> + Send;

    /// Reads one object. Fails with [`StoreError::NotFound`].
    fn get<K: Object>(&self, namespace: &str, name: &str)
    -> impl Future<Output = Result<K>> + Send;

    /// Lists the objects of one namespace (or all namespaces with `None`) whose labels match
    /// `selector`.
    fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> impl Future<Output = Result<ObjectList<K>>> + Send;

    /// Replaces the object's metadata (labels, annotations, finalizers, ownerReferences) and
    /// spec; its `status` in `obj` is ignored. When `obj` has a `resourceVersion`, it must be
    /// the current one. Removing the last finalizer of a deleting object removes it.
    fn update<K: Object>(&self, namespace: &str, obj: &K)
    -> impl Future<Output = Result<K>> + Send;

    /// Replaces the object's `status`; everything else in `obj` is ignored. When `obj` has a
    /// `resourceVersion`, it must be the current one.
    fn update_status<K: Object>(
        &self,
        namespace: &str,
        obj: &K,
    ) -> impl Future<Output = Result<K>> + Send;

    /// Deletes an object, or starts its deletion when it has finalizers.
    fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> impl Future<Output = Result<Deleted<K>>> + Send;

    /// Watches the objects of one namespace (or all) matching `selector`, from just after
    /// `resource_version` (as returned by a list, a write or an event). An empty
    /// `resource_version` starts from the current state without replaying history.
    fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> impl Future<Output = Result<WatchStream<K>>> + Send;

    /// [`Store::watch`], each object as its JSON: what a server streaming to many watchers
    /// wants, since a backend may serialize each change once for all of them (the embedded
    /// store does; the default serializes per watcher).
    fn watch_raw<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> impl Future<Output = Result<RawWatchStream>> + Send {
        let typed = self.watch::<K>(namespace, selector, resource_version);
        async move {
            use futures::StreamExt as _;
            let stream = typed.await?;
            Ok(stream.map(|event| event.and_then(RawWatchEvent::of)).boxed())
        }
    }
}
