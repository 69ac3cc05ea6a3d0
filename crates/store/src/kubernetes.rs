//! The Kubernetes backend: the [`Store`] trait over kube-rs [`Api`], so the API server is the
//! store.
//!
//! [`KubeStore`] is a thin mapping. Each call builds an `Api::<K>::namespaced` (or `Api::all`
//! for a list or watch across namespaces) on the shared [`Client`] and sends:
//!
//! | `Store` method | request |
//! |---|---|
//! | `create` | `POST .../namespaces/{ns}/{plural}?fieldManager=oka` |
//! | `get` | `GET .../namespaces/{ns}/{plural}/{name}` |
//! | `list` | `GET .../{plural}?labelSelector=...` |
//! | `update` | `PUT .../{plural}/{name}?fieldManager=oka` (`GET` first when `obj` has no resourceVersion) |
//! | `update_status` | `PUT .../{plural}/{name}/status?fieldManager=oka` (idem) |
//! | `delete` | `GET .../{plural}/{name}`, then `DELETE` with uid and resourceVersion preconditions |
//! | `watch` | `GET .../{plural}?watch=true&allowWatchBookmarks=true&resourceVersion=...` (a one-item `list` first when no version is given) |
//!
//! The API server applies the resourceVersion preconditions, bumps `generation`, ignores
//! `status` on the main resource and everything but `status` on the status subresource, keeps
//! objects with finalizers until they are emptied, and garbage-collects owned objects. Errors
//! are mapped in one place (the private `errors` module; table there): 404 → `NotFound`
//! (but a 404 for an unserved path, i.e. a missing CRD or subresource, → `Internal`),
//! 409 `AlreadyExists` → `AlreadyExists`, other 409 → `Conflict`, 410 → `Gone`, 400/422 →
//! `Invalid`, 429/503/504 and transport failures → `Unavailable`, other 5xx, 401 and 403 →
//! `Internal`. Every error names the kind, namespace and name it is about.
//!
//! # Where Kubernetes differs from the trait, and what this backend does about it
//!
//! - **Unconditional updates.** The trait allows `update`/`update_status` without a
//!   resourceVersion; the API server rejects that for custom resources (422, "must be specified
//!   for an update"). This backend reads the object, sends its current resourceVersion, and
//!   retries up to [`UNCONDITIONAL_ATTEMPTS`] times when another writer gets in between, so the
//!   caller gets last-writer-wins as promised. With a resourceVersion, one `PUT`, no retry.
//! - **Server-owned fields in an update.** The trait's `update` ignores `deletionTimestamp` and
//!   `deletionGracePeriodSeconds`; the API server rejects an update that sets or changes them
//!   (422, "field is immutable"). This backend sends them empty, and the server keeps its own.
//! - **A resourceVersion on create** is `Invalid` here, as in the embedded store; the API server
//!   would answer 500 ("resourceVersion should not be set on objects to be created").
//! - **The update that removes an object.** When an update empties the finalizers of an object
//!   being deleted, the API server removes it and answers with the state *before* the update,
//!   finalizers included. This backend returns that state with the finalizers the update left
//!   (none), at its last resourceVersion; the watch's `Deleted` event carries the removal's.
//! - **The last state on delete.** A custom resource deleted at once is answered with a
//!   `Status`, not the object. To return [`Deleted::Gone`] with the object's last state,
//!   `delete` reads the object first and deletes with that read's uid and resourceVersion as
//!   preconditions, so the state returned is exactly the one removed. When the caller gave no
//!   resourceVersion precondition and another writer changes the object in between, it reads
//!   and tries again (up to [`UNCONDITIONAL_ATTEMPTS`] times). A delete costs two requests.
//!   Kinds whose delete answers the object (Pods, with `ReturnDeletedObject`) get it as the
//!   server sent it: [`Deleted::Finalizing`] when it carries a `deletionTimestamp` (finalizers,
//!   or a Pod's grace period), [`Deleted::Gone`] otherwise.
//! - **Watch from "now".** The trait's empty resourceVersion means "from the current state,
//!   without replaying history"; the API server's means "replay every existing object as
//!   `ADDED` first". This backend lists one item to learn the current resourceVersion and
//!   watches from there.
//! - **Watch requests end.** The API server closes every watch after `timeoutSeconds` (290 s),
//!   without an error; the trait's stream ends only with an error. The stream re-sends the
//!   watch from the last delivered resourceVersion (see the private `watch` module), so it
//!   ends only with `Gone` (relist) or another error.
//! - **Status is ignored by `update`** only when the CRD enables the status subresource
//!   (`subresources: {status: {}}`, as every `agents.kruise.io` CRD does). Without it, `update`
//!   writes `status` too, and `update_status` fails with `Internal` (the path is not served).
//!   With it, the API server also drops `status` on `create`: a new object starts without one.
//! - **Generation on deletion.** The API server bumps `generation` when it sets
//!   `deletionTimestamp` (the spec did not change), so a `Finalizing` object's generation is
//!   one higher than before the delete.
//! - **Selector-filtered watches** report an object whose labels stop matching as `Deleted`
//!   (with its new state; it still exists) and one whose labels start matching as `Added`.
//! - **Where an expired version surfaces.** The watch cache usually accepts a watch from an
//!   expired resourceVersion and sends the 410 as the first `ERROR` line, so `Gone` arrives as
//!   the stream's first item; etcd-served watches answer HTTP 410 and `watch` itself fails.
//!   Callers must handle `Gone` in both places (they must anyway: history can expire while
//!   a watch runs).
//! - **Owner cascade** is the garbage collector's, in the background: dependents disappear
//!   shortly after their owner, not within the delete call, and an owner that is `Finalizing`
//!   does not cascade until it is gone.
//! - **`Gone::oldest`** is filled from the watch cache's message (`too old resource version:
//!   7 (12)` → `12`); when etcd itself reports the compaction the message has no number and
//!   `oldest` is empty.
//! - **resourceVersion** is opaque here: it is etcd's revision, not the embedded backend's
//!   dense counter. Compare versions for equality only.
//! - **Ordering of lists** is the API server's (namespace, then name); the items are sorted
//!   again to keep the trait's promise without relying on it.
//!
//! Every point below was checked against a real API server: the store's behaviour suite
//! (`tests/suite/`) runs on this backend against `apiextensions-apiserver` on etcd
//! (`tests/kube_apiserver.rs`), as it runs on the embedded store.
//!
//! # Caveats
//!
//! - `list` does not paginate: one request, all matching objects. Fine for the object counts a
//!   sandbox platform keeps per kind; use a watch-fed cache for very large collections.
//! - Writes carry `fieldManager=oka`, so `managedFields` show which fields oka owns.

use std::cmp::Ordering;
use std::fmt;

use either::Either;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchParams};
use kube::{Client, Resource};

use crate::{
    Deleted, Object, ObjectList, Preconditions, Result, Selector, Store, StoreError, WatchStream,
};

mod errors;
mod watch;

use errors::Target;

/// How many times `update`, `update_status` (without a resourceVersion) and `delete` (without a
/// resourceVersion precondition) read the object and try again when another writer changed it
/// between the read and the write. After that, the `Conflict` is returned.
pub const UNCONDITIONAL_ATTEMPTS: usize = 5;

/// The field manager recorded in `managedFields` for oka's writes.
pub const FIELD_MANAGER: &str = "oka";

/// The [`Store`] backed by a Kubernetes API server, through kube-rs.
///
/// Cheap to clone: clones share the [`Client`] and its connection pool.
#[derive(Clone)]
pub struct KubeStore {
    client: Client,
    /// `timeoutSeconds` of each watch request; `None` for kube-rs's default (290 s).
    watch_timeout: Option<u32>,
}

impl fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeStore")
            .field("default_namespace", &self.client.default_namespace())
            .field("watch_timeout", &self.watch_timeout)
            .finish_non_exhaustive()
    }
}

impl KubeStore {
    /// A store that sends every request through `client`.
    pub fn new(client: Client) -> Self {
        KubeStore { client, watch_timeout: None }
    }

    /// Asks the API server to end each watch request after `timeout` (1 s to 290 s; default
    /// 290 s). The stream [`Store::watch`] returns outlives the requests: it re-sends the watch
    /// from the last version it delivered. A shorter timeout suits a proxy that drops idle
    /// connections sooner, and lets tests see resumption without waiting minutes.
    #[must_use]
    pub fn with_watch_timeout(mut self, timeout: std::time::Duration) -> Self {
        let secs = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).clamp(1, 290);
        self.watch_timeout = Some(secs);
        self
    }

    /// The client this store uses, for calls the [`Store`] trait does not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The API for kind `K` in one namespace.
    fn namespaced<K: Object>(&self, namespace: &str) -> Result<Api<K>> {
        if namespace.is_empty() {
            return Err(StoreError::Invalid(format!("{}: a namespace is required", K::kind(&()))));
        }
        Ok(Api::namespaced(self.client.clone(), namespace))
    }

    /// The API for kind `K` in one namespace, or in all of them.
    fn scoped<K: Object>(&self, namespace: Option<&str>) -> Result<Api<K>> {
        match namespace {
            Some(ns) => self.namespaced(ns),
            None => Ok(Api::all(self.client.clone())),
        }
    }

    /// `PUT`s `obj` to the main resource or the status subresource. Without a resourceVersion
    /// in `obj`, reads the current one first and retries on conflict.
    async fn replace<K: Object>(&self, namespace: &str, obj: &K, status: bool) -> Result<K> {
        let name = name_of(obj, namespace)?;
        let api = self.namespaced::<K>(namespace)?;
        let mut target = Target::object::<K>(namespace, name);
        if status {
            target = target.subresource("status");
        }
        let pp = post_params();
        let put = |body: K| {
            let (api, pp) = (&api, &pp);
            async move {
                let written = if status {
                    api.replace_status(name, pp, &body).await
                } else {
                    api.replace(name, pp, &body).await
                };
                written.map(|answer| removed_by_update(answer, &body, status))
            }
        };
        // Only a delete starts a deletion: the server keeps its own deletion fields when the
        // body has none, and rejects an update that sets or changes them.
        let mut obj = obj.clone();
        obj.meta_mut().deletion_timestamp = None;
        obj.meta_mut().deletion_grace_period_seconds = None;

        if has_version(&obj) {
            return put(obj).await.map_err(|e| target.error(e));
        }
        let mut attempt = 1;
        loop {
            let current = api.get(name).await.map_err(|e| target.error(e))?;
            let mut body = obj.clone();
            body.meta_mut().resource_version = current.meta().resource_version.clone();
            match put(body).await.map_err(|e| target.error(e)) {
                Err(err) if err.is_conflict() && attempt < UNCONDITIONAL_ATTEMPTS => {
                    tracing::debug!(
                        kind = %K::kind(&()), namespace, name, attempt,
                        "unconditional write raced with another writer; retrying"
                    );
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

impl Store for KubeStore {
    async fn create<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        check_namespace(obj, namespace)?;
        if has_version(obj) {
            // The API server answers this with a 500; it is the caller's mistake.
            return Err(StoreError::Invalid(format!(
                "{} {}: metadata.resourceVersion must not be set on create",
                K::kind(&()),
                obj.meta().name.as_deref().unwrap_or_default(),
            )));
        }
        let api = self.namespaced::<K>(namespace)?;
        let meta = obj.meta();
        let name = meta.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| {
            // Show a generated name as its prefix and a star.
            meta.generate_name.as_deref().map(|g| format!("{g}*")).unwrap_or_default()
        });
        let target = Target::object::<K>(namespace, &name);
        api.create(&post_params(), obj).await.map_err(|e| target.error(e))
    }

    async fn get<K: Object>(&self, namespace: &str, name: &str) -> Result<K> {
        let api = self.namespaced::<K>(namespace)?;
        api.get(name).await.map_err(|e| Target::object::<K>(namespace, name).error(e))
    }

    async fn list<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Result<ObjectList<K>> {
        let api = self.scoped::<K>(namespace)?;
        let mut lp = ListParams::default();
        if !selector.is_everything() {
            lp = lp.labels(&selector.to_string());
        }
        let list = api.list(&lp).await.map_err(|e| Target::collection::<K>(namespace).error(e))?;
        let mut items = list.items;
        items.sort_by(by_namespace_and_name);
        Ok(ObjectList {
            items: items.into_iter().map(std::sync::Arc::new).collect(),
            resource_version: list.metadata.resource_version.unwrap_or_default(),
        })
    }

    async fn update<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.replace(namespace, obj, false).await
    }

    async fn update_status<K: Object>(&self, namespace: &str, obj: &K) -> Result<K> {
        self.replace(namespace, obj, true).await
    }

    async fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted<K>> {
        let api = self.namespaced::<K>(namespace)?;
        let target = Target::object::<K>(namespace, name);
        let mut attempt = 1;
        loop {
            // The read is the last state we return when the server answers with a Status.
            let current = api.get(name).await.map_err(|e| target.error(e))?;
            let current_uid = current.meta().uid.clone();
            // Retrying helps only when the conflict can be ours: the read went stale.
            let retryable = preconditions.resource_version.is_none()
                && preconditions.uid.as_ref().is_none_or(|uid| Some(uid) == current_uid.as_ref());
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: preconditions.uid.clone().or(current_uid),
                    resource_version: preconditions
                        .resource_version
                        .clone()
                        .or_else(|| current.meta().resource_version.clone()),
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &dp).await.map_err(|e| target.error(e)) {
                Ok(Either::Left(obj)) if obj.meta().deletion_timestamp.is_some() => {
                    return Ok(Deleted::Finalizing(obj));
                }
                Ok(Either::Left(obj)) => return Ok(Deleted::Gone(obj)),
                Ok(Either::Right(_status)) => return Ok(Deleted::Gone(current)),
                Err(err) if err.is_conflict() && retryable && attempt < UNCONDITIONAL_ATTEMPTS => {
                    tracing::debug!(
                        kind = %K::kind(&()), namespace, name, attempt,
                        "delete raced with a write; retrying"
                    );
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }

    async fn watch<K: Object>(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<WatchStream<K>> {
        let api = self.scoped::<K>(namespace)?;
        let target = Target::collection::<K>(namespace);
        let mut params = WatchParams::default();
        if let Some(secs) = self.watch_timeout {
            params = params.timeout(secs);
        }
        let mut lp = ListParams::default().limit(1);
        if !selector.is_everything() {
            params = params.labels(&selector.to_string());
            lp = lp.labels(&selector.to_string());
        }
        let resource_version = if resource_version.is_empty() {
            // "From now": the resourceVersion of a consistent read. Only the list's metadata is
            // needed; one item keeps the answer small.
            let list = api.list_metadata(&lp).await.map_err(|e| target.error(e))?;
            list.metadata.resource_version.filter(|rv| !rv.is_empty()).ok_or_else(|| {
                StoreError::Internal(format!(
                    "{}: the API server's list carries no resourceVersion",
                    K::kind(&())
                ))
            })?
        } else {
            resource_version.to_owned()
        };
        watch::start(api, params, resource_version, target).await
    }
}

/// The answer to an update, as the trait promises it. When an update empties the finalizers of
/// an object being deleted, the API server removes the object and answers with its state
/// *before* the update (still carrying the finalizers); that is returned with the finalizers
/// the update left (none). Its resourceVersion stays the one before the removal: the server
/// does not tell the removal's own.
fn removed_by_update<K: Object>(mut answer: K, body: &K, status: bool) -> K {
    let emptied = body.meta().finalizers.as_ref().is_none_or(Vec::is_empty);
    let deleting = answer.meta().deletion_timestamp.is_some();
    let answered_with_finalizers = answer.meta().finalizers.as_ref().is_some_and(|f| !f.is_empty());
    if !status && emptied && deleting && answered_with_finalizers {
        answer.meta_mut().finalizers.clone_from(&body.meta().finalizers);
    }
    answer
}

/// `POST`/`PUT` parameters: oka's field manager.
fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PostParams::default() }
}

/// Whether `obj` carries a resourceVersion to use as a precondition.
fn has_version<K: Resource>(obj: &K) -> bool {
    obj.meta().resource_version.as_deref().is_some_and(|rv| !rv.is_empty())
}

/// Rejects an object that names another namespace than the request.
fn check_namespace<K: Object>(obj: &K, namespace: &str) -> Result<()> {
    match obj.meta().namespace.as_deref() {
        Some(own) if !own.is_empty() && own != namespace => Err(StoreError::Invalid(format!(
            "{} {}: metadata.namespace `{own}` does not match the request's namespace `{namespace}`",
            K::kind(&()),
            obj.meta().name.as_deref().unwrap_or_default(),
        ))),
        _ => Ok(()),
    }
}

/// The name of an object to update, after checking its namespace.
fn name_of<'a, K: Object>(obj: &'a K, namespace: &str) -> Result<&'a str> {
    check_namespace(obj, namespace)?;
    obj.meta().name.as_deref().filter(|n| !n.is_empty()).ok_or_else(|| {
        StoreError::Invalid(format!(
            "{}: metadata.name is required to update an object",
            K::kind(&())
        ))
    })
}

/// Orders objects as the trait promises: by namespace, then name.
fn by_namespace_and_name<K: Resource>(a: &K, b: &K) -> Ordering {
    let key = |o: &K| (o.meta().namespace.clone(), o.meta().name.clone());
    key(a).cmp(&key(b))
}
