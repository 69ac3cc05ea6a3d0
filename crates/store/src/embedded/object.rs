//! Objects as the embedded store holds them: the JSON value, its typed metadata (parsed once,
//! when the version is written or loaded), and a lazily filled cache of the typed object, so
//! that lists and watches cost an `Arc` clone rather than a deserialization.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::selector::Requirement;
use crate::{Object, RawObject, Selector, StoreError};

/// Top-level fields that are not part of an object's spec.
const NOT_SPEC: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];

/// How the store names a kind: its storage key and what it writes into `apiVersion`/`kind`.
#[derive(Debug, Clone)]
pub(crate) struct KindInfo {
    /// `plural.group` (`plural` for the core group), as Kubernetes names resources.
    pub key: Arc<str>,
    /// The kind, for messages and the `kind` field.
    pub kind: Arc<str>,
    /// `group/version`, for the `apiVersion` field.
    pub api_version: Arc<str>,
}

impl KindInfo {
    /// The names of `K`.
    pub fn of<K: Object>() -> Self {
        let group = K::group(&());
        let plural = K::plural(&());
        let key = if group.is_empty() { plural.into_owned() } else { format!("{plural}.{group}") };
        KindInfo {
            key: key.into(),
            kind: K::kind(&()).into_owned().into(),
            api_version: K::api_version(&()).into_owned().into(),
        }
    }

    pub fn not_found(&self, namespace: &str, name: &str) -> StoreError {
        StoreError::NotFound {
            kind: self.kind.to_string(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    pub fn already_exists(&self, namespace: &str, name: &str) -> StoreError {
        StoreError::AlreadyExists {
            kind: self.kind.to_string(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    pub fn conflict(&self, namespace: &str, name: &str, message: impl Into<String>) -> StoreError {
        StoreError::Conflict {
            kind: self.kind.to_string(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: message.into(),
        }
    }
}

/// Where an object lives: kind key, namespace, name. Ordered in that order, which is also the
/// order in which the owner cascade visits the dependents of one owner.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjKey {
    pub kind: Arc<str>,
    pub namespace: String,
    pub name: String,
}

/// One version of one object. Immutable once built; shared by the index, the watch history
/// and readers.
///
/// `repr(C)` keeps the typed cache and the flat labels first, next to the `Arc`'s counters, so
/// that a list touches one cache line of each entry (and two small buffers to match a selector)
/// rather than chasing the pointers of a `BTreeMap` of `String`s.
#[repr(C)]
pub(crate) struct Entry {
    /// The typed object, deserialized on first use (an `Arc<K>` for the kind's Rust type).
    typed: OnceLock<Arc<dyn Any + Send + Sync>>,
    /// `metadata.labels`, flat, for selector matching.
    labels: Labels,
    pub key: ObjKey,
    /// The version's resourceVersion (also in `value.metadata.resourceVersion`).
    pub rv: u64,
    /// The whole object, as stored.
    pub value: Value,
    /// Its metadata, typed.
    pub meta: ObjectMeta,
    /// `metadata.ownerReferences[].uid`, sorted and deduplicated.
    pub owner_uids: Vec<String>,
    /// The object as JSON, serialized on first use and shared by every watcher.
    raw: OnceLock<Arc<RawObject>>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key)
            .field("rv", &self.rv)
            .finish_non_exhaustive()
    }
}

impl Entry {
    /// A version made of `meta` and the rest of the object (`body`: every top-level field but
    /// `metadata`). The writer has filled `meta` (namespace, name, resourceVersion).
    pub fn from_parts(
        kind: Arc<str>,
        mut meta: ObjectMeta,
        mut body: Map<String, Value>,
    ) -> Result<Entry, StoreError> {
        normalize(&mut meta);
        let meta_value = serde_json::to_value(&meta)
            .map_err(|e| StoreError::Internal(format!("cannot serialize metadata: {e}")))?;
        body.insert("metadata".into(), meta_value);
        Ok(Entry::with(kind, meta, Value::Object(body)))
    }

    /// A version read back from storage.
    pub fn from_value(kind: Arc<str>, value: Value) -> Result<Entry, StoreError> {
        let meta = match value.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m)
                .map_err(|e| StoreError::Internal(format!("stored metadata is malformed: {e}")))?,
            None => ObjectMeta::default(),
        };
        Ok(Entry::with(kind, meta, value))
    }

    fn with(kind: Arc<str>, meta: ObjectMeta, value: Value) -> Entry {
        let mut owner_uids: Vec<String> =
            meta.owner_references.iter().flatten().map(|r| r.uid.clone()).collect();
        owner_uids.sort();
        owner_uids.dedup();
        Entry {
            typed: OnceLock::new(),
            labels: Labels::new(meta.labels.as_ref()),
            key: ObjKey {
                kind,
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
            },
            rv: meta.resource_version.as_deref().and_then(|rv| rv.parse().ok()).unwrap_or_default(),
            owner_uids,
            meta,
            value,
            raw: OnceLock::new(),
        }
    }

    /// The object as JSON, serialized once and shared after that.
    pub fn raw(&self) -> Result<Arc<RawObject>, StoreError> {
        if let Some(raw) = self.raw.get() {
            return Ok(Arc::clone(raw));
        }
        let raw = Arc::new(self.raw_with_version(None)?);
        // A racing reader may have filled it first; both are equal.
        let _ = self.raw.set(Arc::clone(&raw));
        Ok(raw)
    }

    /// The object as JSON, with `metadata.resourceVersion` replaced by `rv` when given (a
    /// watcher's last view of an object that left its selector carries the change's version).
    pub fn raw_with_version(&self, rv: Option<u64>) -> Result<RawObject, StoreError> {
        let json = match rv {
            None => serde_json::to_vec(&self.value),
            Some(rv) => {
                let mut value = self.value.clone();
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
                }
                serde_json::to_vec(&value)
            }
        }
        .map_err(|e| StoreError::Internal(format!("cannot serialize a stored object: {e}")))?;
        Ok(RawObject {
            json,
            namespace: self.key.namespace.clone(),
            name: self.key.name.clone(),
            resource_version: rv.unwrap_or(self.rv).to_string(),
        })
    }

    /// The rest of the object: every top-level field but `metadata`.
    pub fn body(&self) -> Map<String, Value> {
        self.value
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| *k != "metadata")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The object's `status`, if it has one (a null status counts as none).
    pub fn status(&self) -> Option<&Value> {
        self.value.get("status").filter(|s| !s.is_null())
    }

    pub fn uid(&self) -> &str {
        self.meta.uid.as_deref().unwrap_or_default()
    }

    /// Whether the object's labels meet `selector`.
    pub fn matches(&self, selector: &Selector) -> bool {
        self.labels.matches(selector)
    }

    pub fn finalizers(&self) -> &[String] {
        self.meta.finalizers.as_deref().unwrap_or_default()
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn deleting(&self) -> bool {
        self.meta.deletion_timestamp.is_some()
    }

    /// The object as `K` if it is already deserialized.
    pub fn cached<K: Object>(&self) -> Option<Arc<K>> {
        self.typed.get().and_then(|any| Arc::clone(any).downcast::<K>().ok())
    }

    /// The object as `K`, deserialized once and shared after that.
    pub fn typed<K: Object>(&self) -> Result<Arc<K>, StoreError> {
        if let Some(k) = self.cached::<K>() {
            return Ok(k);
        }
        if self.typed.get().is_some() {
            // Another Rust type names the same kind: deserialize without caching.
            return self.deserialize::<K>().map(Arc::new);
        }
        let k = Arc::new(self.deserialize::<K>()?);
        // A racing reader may have filled the cache first; both values are equal.
        let _ = self.typed.set(Arc::clone(&k) as Arc<dyn Any + Send + Sync>);
        Ok(k)
    }

    fn deserialize<K: Object>(&self) -> Result<K, StoreError> {
        K::deserialize(&self.value).map_err(|e| {
            StoreError::Internal(format!(
                "stored {} {}/{} does not deserialize as {}: {e}",
                self.key.kind,
                self.key.namespace,
                self.key.name,
                std::any::type_name::<K>()
            ))
        })
    }
}

/// An object's labels in one buffer: `text` holds every key and value back to back, `spans`
/// the `(key start, value start, value end)` of each label, in key order.
#[derive(Debug, Default)]
struct Labels {
    text: Box<str>,
    spans: Box<[(u32, u32, u32)]>,
}

impl Labels {
    fn new(labels: Option<&BTreeMap<String, String>>) -> Labels {
        let Some(labels) = labels else { return Labels::default() };
        let mut text = String::new();
        let mut spans = Vec::with_capacity(labels.len());
        for (k, v) in labels {
            let start = text.len();
            text.push_str(k);
            let value = text.len();
            text.push_str(v);
            // Labels are short; a map past 4 GiB is not one an API server would accept.
            let offset = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            spans.push((offset(start), offset(value), offset(text.len())));
        }
        Labels { text: text.into(), spans: spans.into() }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.spans.iter().find_map(|&(k, v, end)| {
            let (k, v, end) = (k as usize, v as usize, end as usize);
            (self.text.get(k..v) == Some(key)).then(|| self.text.get(v..end)).flatten()
        })
    }

    /// [`Selector::matches`], on the flat labels.
    fn matches(&self, selector: &Selector) -> bool {
        selector.requirements().iter().all(|r| match r {
            Requirement::Equals(k, v) => self.get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => self.get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => self.get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => self.get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => self.get(k).is_some(),
            Requirement::DoesNotExist(k) => self.get(k).is_none(),
        })
    }
}

/// Empty lists and maps are stored as absent, as the Kubernetes API server (Go's `omitempty`)
/// does, so that `[]` and a missing field compare equal.
fn normalize(meta: &mut ObjectMeta) {
    if meta.labels.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.labels = None;
    }
    if meta.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.annotations = None;
    }
    if meta.finalizers.as_ref().is_some_and(Vec::is_empty) {
        meta.finalizers = None;
    }
    if meta.owner_references.as_ref().is_some_and(Vec::is_empty) {
        meta.owner_references = None;
    }
    if meta.managed_fields.as_ref().is_some_and(Vec::is_empty) {
        meta.managed_fields = None;
    }
    if meta.generate_name.as_ref().is_some_and(String::is_empty) {
        meta.generate_name = None;
    }
}

/// An object split into its typed metadata and the rest (`body`).
pub(crate) fn split<K: Object>(obj: &K) -> Result<(ObjectMeta, Map<String, Value>), StoreError> {
    let value = serde_json::to_value(obj)
        .map_err(|e| StoreError::Invalid(format!("the object does not serialize to JSON: {e}")))?;
    let Value::Object(mut body) = value else {
        return Err(StoreError::Invalid("an object must serialize to a JSON object".into()));
    };
    body.remove("metadata");
    Ok((obj.meta().clone(), body))
}

/// Whether two bodies have different specs (every top-level field but apiVersion, kind,
/// metadata and status; a null field counts as absent).
pub(crate) fn spec_differs(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    // Compared in place, without copying either spec (this runs on every update).
    fn spec(m: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
        m.iter().filter(|(k, v)| !NOT_SPEC.contains(&k.as_str()) && !v.is_null())
    }
    spec(a).count() != spec(b).count() || spec(a).any(|(k, v)| b.get(k) != Some(v))
}

/// A DNS-1123 label: at most 63 lowercase alphanumerics or `-`, starting and ending with an
/// alphanumeric. Namespaces are labels.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels. Custom resource names
/// are subdomains.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Checks a namespace given to a store call.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), StoreError> {
    if is_dns_label(namespace) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "namespace `{namespace}` is not a valid namespace name (a DNS-1123 label: lowercase \
             alphanumerics and `-`, at most 63 characters)"
        )))
    }
}

/// Checks a name given to a store call that names an existing object.
pub(crate) fn check_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() {
        Err(StoreError::Invalid("metadata.name is required".into()))
    } else {
        Ok(())
    }
}

/// Checks that `meta.namespace`, when set, is `namespace`, and sets it.
pub(crate) fn bind_namespace(meta: &mut ObjectMeta, namespace: &str) -> Result<(), StoreError> {
    if let Some(own) = meta.namespace.as_deref().filter(|ns| !ns.is_empty())
        && own != namespace
    {
        return Err(StoreError::Invalid(format!(
            "the namespace of the object ({own}) does not match the namespace of the request \
             ({namespace})"
        )));
    }
    meta.namespace = Some(namespace.to_owned());
    Ok(())
}

/// The characters Kubernetes uses for `generateName` suffixes (no vowels, no look-alikes).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Kubernetes truncates a `generateName` prefix so that prefix + suffix fit a DNS label.
const MAX_GENERATE_PREFIX: usize = 63 - 5;

/// `prefix` followed by five random characters, as Kubernetes does for `generateName`.
pub(crate) fn generate_name(prefix: &str) -> String {
    let prefix = match prefix.char_indices().nth(MAX_GENERATE_PREFIX) {
        Some((i, _)) => &prefix[..i],
        None => prefix,
    };
    let random = uuid::Uuid::new_v4();
    let suffix: String = random.as_bytes()[..5]
        .iter()
        .map(|b| char::from(SUFFIX_ALPHABET[usize::from(*b) % SUFFIX_ALPHABET.len()]))
        .collect();
    format!("{prefix}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_follow_dns_rules() {
        assert!(is_dns_label("default"));
        assert!(is_dns_label("a-1"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("a/b"));
        assert!(!is_dns_subdomain(""));
    }

    #[test]
    fn generated_names_keep_the_prefix_and_fit_a_label() {
        let name = generate_name("pool-");
        assert!(name.starts_with("pool-") && name.len() == 10, "{name}");
        assert!(is_dns_subdomain(&name));
        let long = generate_name(&"x".repeat(100));
        assert_eq!(long.len(), 63);
    }

    #[test]
    fn spec_is_everything_but_the_envelope() {
        let body = |v: Value| v.as_object().cloned().unwrap();
        let a = body(json!({"apiVersion": "v1", "kind": "K", "spec": {"x": 1}}));
        let mut b = a.clone();
        b.insert("status".into(), json!({"phase": "Running"}));
        b.insert("extra".into(), Value::Null);
        assert!(!spec_differs(&a, &b));
        b.insert("spec".into(), json!({"x": 2}));
        assert!(spec_differs(&a, &b));
        let mut c = a.clone();
        c.insert("data".into(), json!("new top-level field"));
        assert!(spec_differs(&a, &c));
        assert!(spec_differs(&c, &a));
        // As many spec fields on both sides, but not the same ones.
        let d = body(json!({"apiVersion": "v1", "kind": "K", "data": {"x": 1}}));
        assert!(spec_differs(&a, &d));
        assert!(!spec_differs(&b, &b.clone()));
    }

    #[test]
    fn entry_reads_the_metadata_it_acts_on() {
        let v = json!({"metadata": {
            "name": "n", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
            "labels": {"a": "b"}, "finalizers": ["f"],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "K", "name": "b", "uid": "o2"},
                {"apiVersion": "v1", "kind": "K", "name": "a", "uid": "o1"},
                {"apiVersion": "v1", "kind": "K", "name": "b", "uid": "o2"}],
            "deletionTimestamp": "2024-01-01T00:00:00Z"}});
        let e = Entry::from_value("things.example.com".into(), v).unwrap();
        assert_eq!((e.key.namespace.as_str(), e.key.name.as_str(), e.rv), ("ns", "n", 42));
        assert_eq!(e.owner_uids, ["o1", "o2"]);
        assert_eq!(e.finalizers(), ["f"]);
        assert!(e.deleting());
        assert!(e.matches(&"a=b".parse().unwrap()));
        assert!(!e.matches(&"a!=b".parse().unwrap()));
    }

    proptest::proptest! {
        /// The flat labels match exactly as `Selector::matches` does on the map.
        #[test]
        fn flat_labels_match_as_the_selector_does(
            labels in proptest::collection::btree_map("[ab]{1,2}", "[xy]{0,1}", 0..4),
            requirements in proptest::collection::vec(
                (0..6u8, "[ab]{1,2}", proptest::collection::vec("[xy]{0,1}", 1..3)), 0..4),
        ) {
            let requirements = requirements.into_iter().map(|(op, k, vs)| match op {
                0 => Requirement::Equals(k, vs[0].clone()),
                1 => Requirement::NotEquals(k, vs[0].clone()),
                2 => Requirement::In(k, vs),
                3 => Requirement::NotIn(k, vs),
                4 => Requirement::Exists(k),
                _ => Requirement::DoesNotExist(k),
            }).collect();
            let selector = Selector::new(requirements);
            let flat = Labels::new(Some(&labels));
            proptest::prop_assert_eq!(flat.matches(&selector), selector.matches(Some(&labels)));
            proptest::prop_assert_eq!(
                Labels::new(None).matches(&selector),
                selector.matches(None)
            );
        }
    }

    #[test]
    fn empty_metadata_lists_are_stored_as_absent() {
        let meta = ObjectMeta {
            name: Some("n".into()),
            finalizers: Some(vec![]),
            labels: Some(BTreeMap::new()),
            ..ObjectMeta::default()
        };
        let e = Entry::from_parts("k".into(), meta, Map::new()).unwrap();
        assert_eq!(e.value, json!({"metadata": {"name": "n"}}));
    }
}
