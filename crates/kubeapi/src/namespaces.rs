//! Namespaces, as the API server and its namespace controller keep them.
//!
//! # Rules
//!
//! - A Namespace is an object of its own: created, labelled, listed, watched and deleted like
//!   any other. The store holds namespaced kinds only, so a Namespace is kept as a
//!   [`NamespaceRecord`] filed under its own name (the layout stores have always had; the other
//!   cluster-scoped kinds are `oka_store::Clustered`, under one reserved namespace, and
//!   [`crate::resources::Resource::filed_under`] says which is which); clients never see that
//!   filing.
//! - A new Namespace is `Active`, with the `kubernetes.io/metadata.name` label and the
//!   `kubernetes` finalizer in its spec, as the API server writes them.
//! - An object is created only in a namespace that exists (404 `namespaces "x" not found`
//!   otherwise) and is not being deleted (403, "being terminated"), as on a cluster. A
//!   namespace that holds objects but has no Namespace (objects written by `oka serve` itself,
//!   or before Namespaces were kept) exists: its Namespace is written when it is first needed,
//!   and at startup for every such namespace. A team's namespace exists while the team has an
//!   API key: it is written when the key is first used here.
//! - Deleting a Namespace marks it `Terminating` (the `kubernetes` finalizer holds it), deletes
//!   every object in it (each with its own finalizers honoured), then removes it. A stopped
//!   server finishes such deletions when it starts again.
//! - `default`, `kube-system` and `kube-public` cannot be deleted; they, `kube-node-lease` and
//!   the platform's own namespaces ([`crate::KubeApiConfig::namespaces`]) always exist.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use oka_store::{Preconditions, Selector, Store, StoreError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

use crate::KubeApi;
use crate::resources::Resource;
use crate::status::ApiStatus;

/// The namespaces that always exist.
pub const SYSTEM: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
/// The namespaces that cannot be deleted.
const UNDELETABLE: [&str; 3] = ["default", "kube-system", "kube-public"];
/// The finalizer that holds a deleting Namespace until it is empty.
pub const FINALIZER: &str = "kubernetes";
/// How often a deleting Namespace looks whether it is empty yet.
const EMPTY_POLL: Duration = Duration::from_millis(200);

/// A Namespace as the store keeps it: filed under its own name, served without one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NamespaceRecord(pub Namespace);

impl k8s_openapi::Resource for NamespaceRecord {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Namespace";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "namespaces";
    type Scope = NamespaceResourceScope;
}

impl k8s_openapi::Metadata for NamespaceRecord {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl Serialize for NamespaceRecord {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Clients see a cluster-scoped object; the store files it under its own name again on
        // every write.
        let mut namespace = self.0.clone();
        namespace.metadata.namespace = None;
        namespace.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for NamespaceRecord {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Namespace::deserialize(deserializer).map(NamespaceRecord)
    }
}

/// What a new Namespace gets from the API server: its name label, the `kubernetes` finalizer
/// in its spec, phase `Active`.
pub fn defaults(body: &mut Value, name: &str) {
    crate::merge_patch(
        body,
        &json!({
            "metadata": {"labels": {"kubernetes.io/metadata.name": name}},
            "status": {"phase": "Active"},
        }),
    );
    if body.pointer("/spec/finalizers").is_none() {
        crate::merge_patch(body, &json!({"spec": {"finalizers": [FINALIZER]}}));
    }
}

/// The name checks of a Namespace: an RFC 1123 label.
pub fn name_errors(name: &str) -> Option<String> {
    let label = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!label).then(|| {
        format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    })
}

/// Whether any object of a namespaced kind lives in `ns`.
async fn holds_objects<S: Store>(api: &KubeApi<S>, ns: &str) -> Result<bool, ApiStatus> {
    for r in api.resources.iter().filter(|r| r.namespaced) {
        let (items, _) =
            crate::handlers::typed_list(api, r, Some(ns), &Selector::everything()).await?;
        if !items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Writes the Namespace `name`, Active; one that exists already is left as it is.
async fn materialize<S: Store>(store: &S, name: &str) -> Result<(), StoreError> {
    let mut body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    defaults(&mut body, name);
    let record: NamespaceRecord =
        serde_json::from_value(body).map_err(|e| StoreError::Internal(e.to_string()))?;
    match store.create(name, &record).await {
        Ok(created) => activate(store, created).await.map(drop),
        Err(StoreError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes phase `Active` on a Namespace just created (a create writes no status).
pub(crate) async fn activate<S: Store>(
    store: &S,
    mut created: NamespaceRecord,
) -> Result<NamespaceRecord, StoreError> {
    let name = created.0.metadata.name.clone().unwrap_or_default();
    created.0.status.get_or_insert_with(Default::default).phase = Some("Active".to_owned());
    store.update_status(&name, &created).await
}

/// Makes sure namespace `ns` exists (a team's, when its key is used).
pub(crate) async fn ensure<S: Store>(store: &S, ns: &str) -> Result<(), StoreError> {
    match store.get::<NamespaceRecord>(ns, ns).await {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => materialize(store, ns).await,
        Err(e) => Err(e),
    }
}

/// Checks that objects may be created in `ns`: it exists (a namespace holding objects without
/// a Namespace gets one now) and is not being deleted. `r` and `name` are what is created, for
/// the error's wording.
pub(crate) async fn admit_content<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    name: &str,
) -> Result<(), ApiStatus> {
    match api.store.get::<NamespaceRecord>(ns, ns).await {
        Ok(record) if record.0.metadata.deletion_timestamp.is_some() => Err(ApiStatus::forbidden(
            format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                r.qualified()
            ),
            &r.group,
            &r.plural,
        )),
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => {
            let system = SYSTEM.contains(&ns) || api.config.namespaces.iter().any(|n| n == ns);
            if system || holds_objects(api, ns).await? {
                materialize(&api.store, ns)
                    .await
                    .map_err(|e| ApiStatus::from_store(&e, "namespaces", "Namespace", ns))?;
                return Ok(());
            }
            let e = StoreError::NotFound {
                kind: "Namespace".into(),
                namespace: String::new(),
                name: ns.to_owned(),
            };
            Err(ApiStatus::from_store(&e, "namespaces", "Namespace", ns))
        }
        Err(e) => Err(ApiStatus::from_store(&e, "namespaces", "Namespace", ns)),
    }
}

/// Refuses to delete the namespaces the system needs, as the API server's lifecycle admission
/// does.
pub fn admit_delete(name: &str) -> Result<(), ApiStatus> {
    if UNDELETABLE.contains(&name) {
        return Err(ApiStatus::forbidden(
            format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
            "",
            "namespaces",
        ));
    }
    Ok(())
}

/// Starts deleting Namespace `name`: the `kubernetes` finalizer holds it, phase `Terminating`;
/// then [`empty_and_remove`] runs in the background. Answers the deleting Namespace.
pub(crate) async fn delete<S: Store>(
    api: &Arc<KubeApi<S>>,
    name: &str,
    preconditions: &Preconditions,
) -> Result<Value, ApiStatus> {
    admit_delete(name)?;
    let not_found = |e: StoreError| ApiStatus::from_store(&e, "namespaces", "Namespace", name);
    let mut record = api.store.get::<NamespaceRecord>(name, name).await.map_err(not_found)?;
    if record.0.metadata.deletion_timestamp.is_none() {
        let finalizers = record.0.metadata.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|f| f == FINALIZER) {
            finalizers.push(FINALIZER.to_owned());
            record = api.store.update(name, &record).await.map_err(not_found)?;
        }
        let status = record.0.status.get_or_insert_with(Default::default);
        status.phase = Some("Terminating".to_owned());
        api.store.update_status(name, &record).await.map_err(not_found)?;
        let deleted = api
            .store
            .delete::<NamespaceRecord>(name, name, preconditions)
            .await
            .map_err(not_found)?;
        record = deleted.object().clone();
    }
    tokio::spawn(empty_and_remove(Arc::clone(api), name.to_owned()));
    serde_json::to_value(&record).map_err(|e| ApiStatus::internal(e.to_string()))
}

/// Deletes every object of namespace `name` until none is left, then lets its Namespace go.
async fn empty_and_remove<S: Store>(api: Arc<KubeApi<S>>, name: String) {
    loop {
        match empty_pass(&api, &name).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(namespace = %name, error = %e.message, "emptying a deleted namespace")
            }
        }
        tokio::time::sleep(EMPTY_POLL).await;
    }
    // The namespace is empty: drop the finalizer, and the store removes the Namespace.
    for _ in 0..10 {
        let Ok(mut record) = api.store.get::<NamespaceRecord>(&name, &name).await else { return };
        if let Some(finalizers) = record.0.metadata.finalizers.as_mut() {
            finalizers.retain(|f| f != FINALIZER);
        }
        match api.store.update(&name, &record).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => return,
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::warn!(namespace = %name, error = %e, "removing a deleted namespace");
                return;
            }
        }
    }
}

/// One pass over the namespace's objects, deleting each that is not deleting yet; whether it
/// was empty.
async fn empty_pass<S: Store>(api: &KubeApi<S>, ns: &str) -> Result<bool, ApiStatus> {
    let mut empty = true;
    for r in api.resources.iter().filter(|r| r.namespaced) {
        let (items, _) =
            crate::handlers::typed_list(api, r, Some(ns), &Selector::everything()).await?;
        for item in items {
            empty = false;
            if item.pointer("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let name = item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            match crate::handlers::typed_delete(api, r, ns, name).await {
                Ok(()) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(empty)
}

/// At startup: a Namespace for each system namespace and each namespace that holds objects,
/// and every deletion a stopped server left unfinished carried on.
pub(crate) async fn reconcile_at_start<S: Store>(api: Arc<KubeApi<S>>) {
    let mut names: std::collections::BTreeSet<String> =
        SYSTEM.iter().map(|s| (*s).to_owned()).collect();
    names.extend(api.config.namespaces.iter().cloned());
    for r in api.resources.iter().filter(|r| r.namespaced) {
        match crate::handlers::typed_list(&api, r, None, &Selector::everything()).await {
            Ok((items, _)) => names.extend(
                items
                    .iter()
                    .filter_map(|o| o.pointer("/metadata/namespace")?.as_str())
                    .map(str::to_owned),
            ),
            Err(e) => tracing::warn!(kind = %r.kind, error = %e.message, "listing namespaces"),
        }
    }
    for name in &names {
        if let Err(e) = materialize(&api.store, name).await {
            tracing::warn!(namespace = %name, error = %e, "writing a Namespace");
        }
    }
    if let Ok(list) = api.store.list::<NamespaceRecord>(None, &Selector::everything()).await {
        for record in list.items {
            if record.0.metadata.deletion_timestamp.is_some()
                && let Some(name) = record.0.metadata.name.clone()
            {
                tokio::spawn(empty_and_remove(Arc::clone(&api), name));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_served_without_the_namespace_it_is_filed_under() {
        let mut record = NamespaceRecord::default();
        record.0.metadata.name = Some("team-a".into());
        record.0.metadata.namespace = Some("team-a".into());
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["kind"], "Namespace");
        assert_eq!(json["apiVersion"], "v1");
        assert!(json["metadata"].get("namespace").is_none(), "{json}");
        let back: NamespaceRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back.0.metadata.name.as_deref(), Some("team-a"));
    }

    #[test]
    fn a_new_namespace_gets_what_the_api_server_writes() {
        let mut body = json!({"metadata": {"name": "team-a", "labels": {"x": "y"}}});
        defaults(&mut body, "team-a");
        assert_eq!(body["metadata"]["labels"]["kubernetes.io/metadata.name"], "team-a");
        assert_eq!(body["metadata"]["labels"]["x"], "y");
        assert_eq!(body["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(body["status"]["phase"], "Active");
    }

    #[test]
    fn names_are_rfc_1123_labels() {
        assert_eq!(name_errors("team-a"), None);
        assert!(name_errors("Team").is_some());
        assert!(name_errors("a.b").is_some());
        assert!(name_errors("-a").is_some());
        assert!(name_errors(&"a".repeat(64)).is_some());
    }

    #[test]
    fn the_system_namespaces_stay() {
        let e = admit_delete("default").unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "namespaces \"default\" is forbidden: this namespace may not be deleted"
        );
        assert!(admit_delete("team-a").is_ok());
    }
}
