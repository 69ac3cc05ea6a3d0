//! What tracing needs from the controllers: a store that tells a reconcile's span it wrote.
//!
//! Each reconcile runs in a `controller.Reconcile` span ([`oka_telemetry::reconcile`], started
//! by the runner in [`crate::controller`]); a span whose reconcile wrote nothing is dropped at
//! export. A controller's store is wrapped in [`MarkWrites`], so every write verb (create,
//! update, status update, delete) marks the current reconcile at call time; reads never do.
//! Without tracing the mark is a task-local lookup that finds nothing.

use oka_store::{Deleted, Object, ObjectList, Preconditions, Result, Selector, Store, WatchStream};
use oka_telemetry::reconcile::mark_write;

/// A [`Store`] that marks the current reconcile's span as having written on each write.
#[derive(Debug, Clone)]
pub struct MarkWrites<S>(pub S);

impl<S: Store> Store for MarkWrites<S> {
    async fn create<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        mark_write();
        self.0.create(namespace, obj).await
    }

    async fn get<K: Object>(&self, namespace: &str, name: &str) -> Result<K> {
        self.0.get(namespace, name).await
    }

    async fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Result<ObjectList<K>> {
        self.0.list(namespace, selector).await
    }

    async fn update<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        mark_write();
        self.0.update(namespace, obj).await
    }

    async fn update_status<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        mark_write();
        self.0.update_status(namespace, obj).await
    }

    async fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted<K>> {
        mark_write();
        self.0.delete(namespace, name, preconditions).await
    }

    async fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<WatchStream<K>> {
        self.0.watch(namespace, selector, resource_version).await
    }

    async fn watch_raw<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<oka_store::RawWatchStream> {
        self.0.watch_raw::<K>(namespace, selector, resource_version).await
    }
}
