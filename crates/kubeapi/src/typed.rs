//! The bridge from JSON requests to the typed [`Store`]: each operation once, generic over the
//! kind, and [`dispatch!`] to pick the kind from its name at run time.

use oka_store::{Object, Preconditions, Selector, Store, StoreError};
use serde_json::Value;

/// Why a typed operation failed.
#[derive(Debug)]
pub enum OpError {
    /// The store refused.
    Store(StoreError),
    /// The body is not an object of this kind.
    Decode(String),
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

/// Result of a typed operation.
pub type OpResult<T> = Result<T, OpError>;

fn to_json<K: Object>(obj: &K) -> OpResult<Value> {
    serde_json::to_value(obj).map_err(|e| OpError::Store(StoreError::Internal(e.to_string())))
}

fn from_json<K: Object>(body: Value) -> OpResult<K> {
    serde_json::from_value(body).map_err(|e| OpError::Decode(e.to_string()))
}

/// Reads one object.
pub async fn get<K: Object, S: Store>(store: &S, ns: &str, name: &str) -> OpResult<Value> {
    to_json(&store.get::<K>(ns, name).await?)
}

/// Lists objects: the items and the resourceVersion of the list.
pub async fn list<K: Object, S: Store>(
    store: &S,
    ns: Option<&str>,
    selector: &Selector,
) -> OpResult<(Vec<Value>, String)> {
    let list = store.list::<K>(ns, selector).await?;
    let items = list.items.iter().map(|obj| to_json(obj.as_ref())).collect::<OpResult<_>>()?;
    Ok((items, list.resource_version))
}

/// Creates an object from its JSON.
pub async fn create<K: Object, S: Store>(store: &S, ns: &str, body: Value) -> OpResult<Value> {
    to_json(&store.create(ns, &from_json::<K>(body)?).await?)
}

/// Replaces an object's metadata and spec from its JSON (its `resourceVersion`, when set, must
/// be the current one).
pub async fn update<K: Object, S: Store>(store: &S, ns: &str, body: Value) -> OpResult<Value> {
    to_json(&store.update(ns, &from_json::<K>(body)?).await?)
}

/// Deletes an object; answers its last state (or, with finalizers, its deleting state).
pub async fn delete<K: Object, S: Store>(
    store: &S,
    ns: &str,
    name: &str,
    preconditions: &Preconditions,
) -> OpResult<Value> {
    to_json(store.delete::<K>(ns, name, preconditions).await?.object())
}

/// Calls `$op::<Kind, _>($args)` for the kind named `$kind` (`"SandboxSet"`); `$otherwise`
/// when no kind has that name.
macro_rules! dispatch {
    ($kind:expr, $op:ident ( $($arg:expr),* ), $otherwise:expr) => {
        match $kind {
            "Checkpoint" => $crate::typed::$op::<oka_api::Checkpoint, _>($($arg),*).await,
            "PoolAutoscaler" => $crate::typed::$op::<oka_api::PoolAutoscaler, _>($($arg),*).await,
            "Sandbox" => $crate::typed::$op::<oka_api::Sandbox, _>($($arg),*).await,
            "SandboxClaim" => $crate::typed::$op::<oka_api::SandboxClaim, _>($($arg),*).await,
            "SandboxSet" => $crate::typed::$op::<oka_api::SandboxSet, _>($($arg),*).await,
            "SandboxTemplate" => $crate::typed::$op::<oka_api::SandboxTemplate, _>($($arg),*).await,
            "SandboxUpdateOps" => $crate::typed::$op::<oka_api::SandboxUpdateOps, _>($($arg),*).await,
            "TrafficPolicy" => $crate::typed::$op::<oka_api::TrafficPolicy, _>($($arg),*).await,
            "GlobalTrafficPolicy" => $crate::typed::$op::<oka_store::Clustered<oka_api::GlobalTrafficPolicy>, _>($($arg),*).await,
            "Namespace" => $crate::typed::$op::<$crate::namespaces::NamespaceRecord, _>($($arg),*).await,
            "ConfigMap" => $crate::typed::$op::<k8s_openapi::api::core::v1::ConfigMap, _>($($arg),*).await,
            "Event" => $crate::typed::$op::<k8s_openapi::api::core::v1::Event, _>($($arg),*).await,
            "Secret" => $crate::typed::$op::<k8s_openapi::api::core::v1::Secret, _>($($arg),*).await,
            "Lease" => $crate::typed::$op::<k8s_openapi::api::coordination::v1::Lease, _>($($arg),*).await,
            _ => $otherwise,
        }
    };
}
pub(crate) use dispatch;

/// One watch event as JSON: its type (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`) and object.
pub type JsonEvent = OpResult<(&'static str, Value)>;

/// Watches objects from just after `resource_version`; each event's object is JSON, and a
/// bookmark's object carries only the kind and the resourceVersion, as on a cluster.
pub async fn watch<K: Object, S: Store>(
    store: &S,
    ns: Option<&str>,
    selector: &Selector,
    resource_version: &str,
) -> OpResult<futures::stream::BoxStream<'static, JsonEvent>> {
    use futures::StreamExt as _;
    use oka_store::WatchEvent;
    let stream = store.watch::<K>(ns, selector, resource_version).await?;
    Ok(stream
        .map(|item| match item? {
            WatchEvent::Added(obj) => Ok(("ADDED", to_json(obj.as_ref())?)),
            WatchEvent::Modified(obj) => Ok(("MODIFIED", to_json(obj.as_ref())?)),
            WatchEvent::Deleted(obj) => Ok(("DELETED", to_json(obj.as_ref())?)),
            WatchEvent::Bookmark(rv) => Ok((
                "BOOKMARK",
                serde_json::json!({
                    "kind": K::kind(&()),
                    "apiVersion": K::api_version(&()),
                    "metadata": {"resourceVersion": rv},
                }),
            )),
        })
        .boxed())
}

/// Replaces an object's status from its JSON (everything else in `body` is ignored).
pub async fn update_status<K: Object, S: Store>(
    store: &S,
    ns: &str,
    body: Value,
) -> OpResult<Value> {
    to_json(&store.update_status(ns, &from_json::<K>(body)?).await?)
}

/// What a create would answer (`dryRun=All`): the body decoded as the kind, its name free,
/// with the metadata the store would set; nothing is written.
pub async fn create_dry<K: Object, S: Store>(store: &S, ns: &str, body: Value) -> OpResult<Value> {
    let mut obj = from_json::<K>(body)?;
    let name = obj.meta().name.clone().unwrap_or_default();
    if name.is_empty() {
        let prefix = obj.meta().generate_name.clone().unwrap_or_default();
        if prefix.is_empty() {
            return Err(OpError::Store(StoreError::Invalid(
                "metadata.name: Required value: name or generateName is required".into(),
            )));
        }
        obj.meta_mut().name =
            Some(format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..5]));
    } else {
        match store.get::<K>(ns, &name).await {
            Ok(_) => {
                return Err(OpError::Store(StoreError::AlreadyExists {
                    kind: K::kind(&()).into_owned(),
                    namespace: ns.to_owned(),
                    name,
                }));
            }
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let meta = obj.meta_mut();
    meta.namespace = Some(ns.to_owned());
    meta.uid = Some(uuid::Uuid::new_v4().to_string());
    meta.generation = Some(1);
    meta.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
    to_json(&obj)
}

/// The current object, checked against the resourceVersion `body` names (when it names one).
async fn current_for<K: Object, S: Store>(store: &S, ns: &str, body: &Value) -> OpResult<K> {
    let name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let current = store.get::<K>(ns, name).await?;
    let wanted = body.pointer("/metadata/resourceVersion").and_then(Value::as_str);
    if let Some(wanted) = wanted.filter(|rv| !rv.is_empty())
        && current.meta().resource_version.as_deref() != Some(wanted)
    {
        return Err(OpError::Store(StoreError::Conflict {
            kind: K::kind(&()).into_owned(),
            namespace: ns.to_owned(),
            name: name.to_owned(),
            message: "the object has been modified".into(),
        }));
    }
    Ok(current)
}

/// What an update would answer (`dryRun=All`): `body`'s metadata and spec over the current
/// object's identity and status; nothing is written.
pub async fn update_dry<K: Object, S: Store>(store: &S, ns: &str, body: Value) -> OpResult<Value> {
    let current = current_for::<K, S>(store, ns, &body).await?;
    let mut next = body;
    let current = to_json(&current)?;
    for key in [
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "generation",
        "deletionTimestamp",
        "namespace",
    ] {
        let pointer = format!("/metadata/{key}");
        if let (Some(value), Some(meta)) =
            (current.pointer(&pointer), next.get_mut("metadata").and_then(Value::as_object_mut))
        {
            meta.insert(key.to_owned(), value.clone());
        }
    }
    if let Value::Object(map) = &mut next {
        match current.get("status") {
            Some(status) => map.insert("status".to_owned(), status.clone()),
            None => map.remove("status"),
        };
    }
    to_json(&from_json::<K>(next)?)
}

/// What a status update would answer (`dryRun=All`): the current object with `body`'s status.
pub async fn update_status_dry<K: Object, S: Store>(
    store: &S,
    ns: &str,
    body: Value,
) -> OpResult<Value> {
    let current = current_for::<K, S>(store, ns, &body).await?;
    let mut next = to_json(&current)?;
    if let Value::Object(map) = &mut next {
        match body.get("status") {
            Some(status) => map.insert("status".to_owned(), status.clone()),
            None => map.remove("status"),
        };
    }
    to_json(&from_json::<K>(next)?)
}

/// What a delete would answer (`dryRun=All`): the object, its preconditions checked.
pub async fn delete_dry<K: Object, S: Store>(
    store: &S,
    ns: &str,
    name: &str,
    preconditions: &Preconditions,
) -> OpResult<Value> {
    let current = store.get::<K>(ns, name).await?;
    let meta = current.meta();
    let stale = |want: &Option<String>, have: &Option<String>| want.is_some() && want != have;
    if stale(&preconditions.uid, &meta.uid)
        || stale(&preconditions.resource_version, &meta.resource_version)
    {
        return Err(OpError::Store(StoreError::Conflict {
            kind: K::kind(&()).into_owned(),
            namespace: ns.to_owned(),
            name: name.to_owned(),
            message: "a precondition does not hold".into(),
        }));
    }
    to_json(&current)
}

/// [`watch`], each object as the store's JSON (see [`Store::watch_raw`]).
pub async fn watch_raw<K: Object, S: Store>(
    store: &S,
    ns: Option<&str>,
    selector: &Selector,
    resource_version: &str,
) -> OpResult<oka_store::RawWatchStream> {
    Ok(store.watch_raw::<K>(ns, selector, resource_version).await?)
}
