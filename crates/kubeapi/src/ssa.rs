//! Server-side apply (`application/apply-patch+yaml`, `kubectl apply --server-side`): each
//! field manager owns the fields it applied, recorded in `metadata.managedFields` in the
//! `FieldsV1` form (`{"f:spec":{"f:replicas":{}}}`); an apply sets what it names, removes what
//! its manager applied before and no longer names (unless another manager owns it too), and
//! fails with a conflict when it would change a field another manager owns, unless forced,
//! which takes the field over. Writes that are not applies record the fields they change for
//! their `fieldManager` (operation `Update`), so an apply after `kubectl scale` conflicts as on
//! a cluster.
//!
//! Lists follow the schema: `x-kubernetes-list-type: map` lists merge item by item by their
//! keys (`k:{"name":"main"}`), `set` lists by value (`v:"a"`), other lists are atomic: owned
//! and replaced whole. Maps merge key by key.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// One step of a field path, as `FieldsV1` writes it: `f:name`, `k:{"name":"x"}`, `v:"x"`.
type Step = String;
/// A field: the steps from the object's root.
type Path = Vec<Step>;

/// The fields an object sets, as a `FieldsV1` tree.
pub fn fields_of(obj: &Value, schema: Option<&Value>) -> Map<String, Value> {
    let mut set = Map::new();
    let Value::Object(map) = obj else { return set };
    for (key, value) in map {
        match key.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                let mut meta = Map::new();
                for field in ["labels", "annotations"] {
                    if let Some(Value::Object(entries)) = value.get(field) {
                        let children: Map<String, Value> =
                            entries.keys().map(|k| (format!("f:{k}"), json!({}))).collect();
                        if !children.is_empty() {
                            meta.insert(format!("f:{field}"), Value::Object(children));
                        }
                    }
                }
                if !meta.is_empty() {
                    set.insert("f:metadata".into(), Value::Object(meta));
                }
            }
            _ => {
                let child = property(schema, key);
                set.insert(format!("f:{key}"), Value::Object(node_fields(value, child)));
            }
        }
    }
    set
}

fn property<'a>(schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    let schema = schema?;
    schema
        .pointer(&format!("/properties/{}", key.replace('~', "~0").replace('/', "~1")))
        .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
}

/// The fields under one value: a map's keys, a keyed or set list's items; nothing for a scalar
/// or an atomic list (the value itself is the field).
fn node_fields(value: &Value, schema: Option<&Value>) -> Map<String, Value> {
    let mut set = Map::new();
    match value {
        Value::Object(map)
            if schema.is_none_or(|s| {
                s.get("x-kubernetes-map-type").and_then(Value::as_str) != Some("atomic")
            }) =>
        {
            for (key, child) in map {
                set.insert(
                    format!("f:{key}"),
                    Value::Object(node_fields(child, property(schema, key))),
                );
            }
        }
        Value::Array(items) => {
            let items_schema = schema.and_then(|s| s.get("items"));
            match list_type(schema) {
                ListType::Map(keys) => {
                    for item in items {
                        let mut children = node_fields(item, items_schema);
                        children.insert(".".into(), json!({}));
                        set.insert(format!("k:{}", item_key(item, &keys)), Value::Object(children));
                    }
                }
                ListType::Set => {
                    for item in items {
                        set.insert(format!("v:{item}"), json!({}));
                    }
                }
                ListType::Atomic => {}
            }
        }
        _ => {}
    }
    set
}

enum ListType {
    Map(Vec<String>),
    Set,
    Atomic,
}

fn list_type(schema: Option<&Value>) -> ListType {
    let Some(schema) = schema else { return ListType::Atomic };
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => ListType::Map(
            schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect(),
        ),
        Some("set") => ListType::Set,
        _ => ListType::Atomic,
    }
}

/// A keyed list item's key, as `FieldsV1` writes it: `{"name":"main"}`.
fn item_key(item: &Value, keys: &[String]) -> String {
    let key: Map<String, Value> =
        keys.iter().filter_map(|k| Some((k.clone(), item.get(k)?.clone()))).collect();
    Value::Object(key).to_string()
}

/// Every leaf field of a set (a field with no children, or one marked `.`), as paths.
pub fn leaves(set: &Map<String, Value>) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    collect(set, &mut Vec::new(), &mut out);
    out
}

fn collect(set: &Map<String, Value>, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    for (step, child) in set {
        if step == "." {
            continue;
        }
        prefix.push(step.clone());
        match child.as_object() {
            Some(children) if children.keys().any(|k| k != ".") => collect(children, prefix, out),
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
    }
}

/// The set of `paths`, as a `FieldsV1` tree.
pub fn set_of(paths: &BTreeSet<Path>) -> Map<String, Value> {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for (i, step) in path.iter().enumerate() {
            let entry = node.entry(step.clone()).or_insert_with(|| json!({}));
            if step.starts_with("k:")
                && i + 1 < path.len()
                && let Value::Object(children) = entry
            {
                children.insert(".".into(), json!({}));
            }
            let Value::Object(next) = entry else { break };
            node = next;
        }
    }
    root
}

/// The value at `path` in `obj`.
pub fn value_at<'a>(obj: &'a Value, path: &[Step]) -> Option<&'a Value> {
    let mut at = obj;
    for step in path {
        at = match step.split_once(':') {
            Some(("f", key)) => at.get(key)?,
            Some(("k", key)) => {
                let key: Map<String, Value> = serde_json::from_str(key).ok()?;
                at.as_array()?
                    .iter()
                    .find(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)))?
            }
            Some(("v", value)) => {
                let value: Value = serde_json::from_str(value).ok()?;
                at.as_array()?.iter().find(|item| **item == value)?
            }
            _ => return None,
        };
    }
    Some(at)
}

/// Removes the field at `path` from `obj` (a map key, a keyed or set list item).
fn remove_at(obj: &mut Value, path: &[Step]) {
    let Some((last, init)) = path.split_last() else { return };
    let mut at = obj;
    for step in init {
        let next = match step.split_once(':') {
            Some(("f", key)) => at.get_mut(key),
            Some(("k", key)) => {
                let Ok(key) = serde_json::from_str::<Map<String, Value>>(key) else { return };
                at.as_array_mut().and_then(|items| {
                    items.iter_mut().find(|i| key.iter().all(|(k, v)| i.get(k) == Some(v)))
                })
            }
            _ => None,
        };
        let Some(next) = next else { return };
        at = next;
    }
    match last.split_once(':') {
        Some(("f", key)) => {
            if let Some(map) = at.as_object_mut() {
                map.remove(key);
            }
        }
        Some(("k", key)) => {
            if let (Ok(key), Some(items)) =
                (serde_json::from_str::<Map<String, Value>>(key), at.as_array_mut())
            {
                items.retain(|i| !key.iter().all(|(k, v)| i.get(k) == Some(v)));
            }
        }
        Some(("v", value)) => {
            if let (Ok(value), Some(items)) =
                (serde_json::from_str::<Value>(value), at.as_array_mut())
            {
                items.retain(|i| *i != value);
            }
        }
        _ => {}
    }
}

/// Merges the applied configuration `applied` into `live`, as apply does: maps key by key,
/// keyed lists item by item, set lists by value, anything else replaced.
fn merge(live: &mut Value, applied: &Value, schema: Option<&Value>) {
    match (live, applied) {
        (Value::Object(live), Value::Object(applied)) => {
            for (key, value) in applied {
                let child = property(schema, key);
                match live.get_mut(key) {
                    Some(existing) if !value.is_null() => merge(existing, value, child),
                    _ => {
                        live.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(live), Value::Array(applied)) => match list_type(schema) {
            ListType::Map(keys) => {
                let items_schema = schema.and_then(|s| s.get("items"));
                for item in applied {
                    let key = item_key(item, &keys);
                    match live.iter_mut().find(|l| item_key(l, &keys) == key) {
                        Some(existing) => merge(existing, item, items_schema),
                        None => live.push(item.clone()),
                    }
                }
            }
            ListType::Set => {
                for item in applied {
                    if !live.contains(item) {
                        live.push(item.clone());
                    }
                }
            }
            ListType::Atomic => *live = applied.clone(),
        },
        (live, applied) => *live = applied.clone(),
    }
}

/// A `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Manager {
    /// `manager`.
    pub name: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `apiVersion`.
    pub api_version: String,
    /// The fields it owns.
    pub fields: BTreeSet<Path>,
    /// When it last changed them.
    pub time: String,
}

impl Manager {
    fn describe(&self) -> String {
        if self.operation == "Update" {
            format!("{:?} using {}", self.name, self.api_version)
        } else {
            format!("{:?}", self.name)
        }
    }
}

/// The managers recorded in `obj`'s `metadata.managedFields`.
pub fn managers(obj: &Value) -> Vec<Manager> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|entry| Manager {
            name: entry.get("manager").and_then(Value::as_str).unwrap_or_default().to_owned(),
            time: entry.get("time").and_then(Value::as_str).unwrap_or_default().to_owned(),
            operation: entry
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            api_version: entry
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            fields: entry
                .get("fieldsV1")
                .and_then(Value::as_object)
                .map(leaves)
                .unwrap_or_default(),
        })
        .collect()
}

fn write_managers(obj: &mut Value, managers: &[Manager]) {
    let entries: Vec<Value> = managers
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            json!({
                "manager": m.name,
                "operation": m.operation,
                "apiVersion": m.api_version,
                "time": m.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": Value::Object(set_of(&m.fields)),
            })
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

/// A path as the API server prints it in a conflict: `.spec.replicas`,
/// `.spec.probes[name="alive"].periodSeconds`.
pub fn render(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step.split_once(':') {
            Some(("f", key)) => {
                out.push('.');
                out.push_str(key);
            }
            Some(("k", key)) => {
                let key: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
                let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("[{}]", parts.join(",")));
            }
            Some(("v", value)) => out.push_str(&format!("[={value}]")),
            _ => {}
        }
    }
    out
}

/// Fields an apply would change that other managers own.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflicts(pub Vec<(String, Path)>);

impl Conflicts {
    /// The API server's message: `Apply failed with 1 conflict: conflict with "a": .spec.x`.
    pub fn message(&self) -> String {
        let n = self.0.len();
        let body = match self.0.as_slice() {
            [(manager, path)] => format!("conflict with {manager}: {}", render(path)),
            many => {
                let mut lines = Vec::new();
                let mut names: Vec<&String> = many.iter().map(|(m, _)| m).collect();
                names.dedup();
                for name in names {
                    lines.push(format!("conflicts with {name}:"));
                    lines.extend(
                        many.iter()
                            .filter(|(m, _)| m == name)
                            .map(|(_, p)| format!("- {}", render(p))),
                    );
                }
                lines.join("\n")
            }
        };
        format!("Apply failed with {n} conflict{}: {body}", if n == 1 { "" } else { "s" })
    }

    /// The `Status` causes: one `FieldManagerConflict` per field.
    pub fn causes(&self) -> Vec<Value> {
        self.0
            .iter()
            .map(|(manager, path)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager}"), "field": render(path)})
            })
            .collect()
    }
}

/// Applies `applied` (the manager's whole intent) to `live` for `manager`; answers the new
/// object, its `managedFields` updated, or the conflicts when not `force`d.
pub fn apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    api_version: &str,
    schema: Option<&Value>,
    force: bool,
    now: &str,
) -> Result<Value, Conflicts> {
    let mut managers = managers(live);
    let new_fields = leaves(&fields_of(applied, schema));
    let mut conflicts = Vec::new();
    for other in managers.iter().filter(|m| !(m.name == manager && m.operation == "Apply")) {
        for path in other.fields.intersection(&new_fields) {
            if value_at(live, path) != value_at(applied, path) {
                conflicts.push((other.describe(), path.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(Conflicts(conflicts));
    }
    let mut result = live.clone();
    // What this manager applied before and no longer names goes, unless another owns it.
    let previous = managers
        .iter()
        .find(|m| m.name == manager && m.operation == "Apply")
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    for path in previous.difference(&new_fields) {
        let shared = managers
            .iter()
            .any(|m| !(m.name == manager && m.operation == "Apply") && m.fields.contains(path));
        if !shared {
            remove_at(&mut result, path);
        }
    }
    merge(&mut result, applied, schema);
    if let Some(meta) = result.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    // Forced (or equal) fields belong to this manager alone from now on.
    for other in managers.iter_mut().filter(|m| !(m.name == manager && m.operation == "Apply")) {
        let changed: Vec<Path> = other
            .fields
            .intersection(&new_fields)
            .filter(|p| value_at(live, p) != value_at(applied, p))
            .cloned()
            .collect();
        for path in changed {
            other.fields.remove(&path);
        }
    }
    match managers.iter_mut().find(|m| m.name == manager && m.operation == "Apply") {
        Some(own) => {
            own.fields = new_fields;
            own.api_version = api_version.to_owned();
            own.time = now.to_owned();
        }
        None => managers.push(Manager {
            name: manager.to_owned(),
            operation: "Apply".into(),
            api_version: api_version.to_owned(),
            fields: new_fields,
            time: now.to_owned(),
        }),
    }
    write_managers(&mut result, &managers);
    Ok(result)
}

/// Records, in `new`'s `managedFields`, the fields a non-apply write by `manager` changed from
/// `old`: they become its (operation `Update`) and no one else's.
pub fn record_update(
    old: &Value,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    schema: Option<&Value>,
    now: &str,
) {
    let mut managers = managers(old);
    let before = leaves(&fields_of(old, schema));
    let after = leaves(&fields_of(new, schema));
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|p| !before.contains(*p) || value_at(old, p) != value_at(new, p))
        .cloned()
        .collect();
    let gone: BTreeSet<Path> = before.difference(&after).cloned().collect();
    for m in &mut managers {
        m.fields.retain(|p| !gone.contains(p));
        if !(m.name == manager && m.operation == "Update") {
            m.fields.retain(|p| !changed.contains(p));
        }
    }
    if !changed.is_empty() {
        match managers.iter_mut().find(|m| m.name == manager && m.operation == "Update") {
            Some(own) => {
                own.fields.extend(changed);
                own.time = now.to_owned();
            }
            None => managers.push(Manager {
                name: manager.to_owned(),
                operation: "Update".into(),
                api_version: api_version.to_owned(),
                fields: changed,
                time: now.to_owned(),
            }),
        }
    }
    write_managers(new, &managers);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"properties": {"spec": {"properties": {
            "replicas": {"type": "integer"},
            "probes": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                       "items": {"properties": {"name": {"type": "string"}, "periodSeconds": {"type": "integer"}}}},
            "args": {"type": "array", "items": {"type": "string"}},
        }}}})
    }

    #[test]
    fn fields_follow_the_schema() {
        let obj = json!({"apiVersion": "x", "metadata": {"name": "a", "labels": {"k": "v"}},
            "spec": {"replicas": 1, "probes": [{"name": "alive", "periodSeconds": 5}], "args": ["a"]}});
        let set = fields_of(&obj, Some(&schema()));
        assert_eq!(
            Value::Object(set.clone()),
            json!({"f:metadata": {"f:labels": {"f:k": {}}}, "f:spec": {
                "f:replicas": {}, "f:args": {},
                "f:probes": {"k:{\"name\":\"alive\"}": {".": {}, "f:name": {}, "f:periodSeconds": {}}},
            }})
        );
        let paths = leaves(&set);
        assert_eq!(Value::Object(set_of(&paths)), Value::Object(set));
        let path: Path = vec![
            "f:spec".into(),
            "f:probes".into(),
            "k:{\"name\":\"alive\"}".into(),
            "f:periodSeconds".into(),
        ];
        assert_eq!(value_at(&obj, &path), Some(&json!(5)));
        assert_eq!(render(&path), ".spec.probes[name=\"alive\"].periodSeconds");
    }

    #[test]
    fn applies_own_merge_remove_and_conflict() {
        let s = schema();
        let now = "2026-01-01T00:00:00Z";
        let base = json!({"metadata": {"name": "a"}, "spec": {}});
        let a1 = json!({"metadata": {"name": "a"}, "spec": {"replicas": 1, "args": ["x"]}});
        let live = apply(&base, &a1, "a", "v1", Some(&s), false, now).unwrap();
        assert_eq!(live["spec"], json!({"replicas": 1, "args": ["x"]}));
        // Another manager setting the same value shares it; another value conflicts.
        let b_same = json!({"metadata": {"name": "a"}, "spec": {"replicas": 1}});
        let shared = apply(&live, &b_same, "b", "v1", Some(&s), false, now).unwrap();
        let b_other = json!({"metadata": {"name": "a"}, "spec": {"replicas": 3}});
        let conflicts = apply(&shared, &b_other, "b", "v1", Some(&s), false, now).unwrap_err();
        assert_eq!(
            conflicts.message(),
            "Apply failed with 1 conflict: conflict with \"a\": .spec.replicas"
        );
        // Forced, it takes the field over.
        let forced = apply(&shared, &b_other, "b", "v1", Some(&s), true, now).unwrap();
        assert_eq!(forced["spec"]["replicas"], 3);
        let owners = managers(&forced);
        let a = owners.iter().find(|m| m.name == "a").unwrap();
        assert!(!a.fields.iter().any(|p| p.last().is_some_and(|l| l == "f:replicas")));
        // `a` drops args from its intent: they go, since no one else owns them.
        let a2 = json!({"metadata": {"name": "a"}, "spec": {}});
        let dropped = apply(&forced, &a2, "a", "v1", Some(&s), false, now).unwrap();
        assert_eq!(dropped["spec"], json!({"replicas": 3}));
    }

    #[test]
    fn an_update_owns_what_it_changed() {
        let s = schema();
        let now = "2026-01-01T00:00:00Z";
        let live = apply(
            &json!({"metadata": {}, "spec": {}}),
            &json!({"metadata": {}, "spec": {"replicas": 1}}),
            "a",
            "v1",
            Some(&s),
            false,
            now,
        )
        .unwrap();
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(&live, &mut scaled, "kubectl-scale", "v1", Some(&s), now);
        let again = json!({"metadata": {}, "spec": {"replicas": 2}});
        let conflict = apply(&scaled, &again, "a", "v1", Some(&s), false, now).unwrap_err();
        assert_eq!(
            conflict.message(),
            "Apply failed with 1 conflict: conflict with \"kubectl-scale\" using v1: .spec.replicas"
        );
    }
}
