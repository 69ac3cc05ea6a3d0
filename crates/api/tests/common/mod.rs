//! Shared helpers of the integration tests: fixture loading and schema walking.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// `crates/api/tests/<rel>`.
pub fn tests_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(rel)
}

/// The YAML files of a fixture directory, sorted by name.
pub fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(tests_dir(dir))
        .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every non-empty document of a multi-document YAML file, as JSON values.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            value
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Our generated CRDs as JSON, keyed by kind.
pub fn our_crds() -> BTreeMap<String, Value> {
    oka_api::crds()
        .into_iter()
        .map(|crd| (crd.spec.names.kind.clone(), serde_json::to_value(&crd).unwrap()))
        .collect()
}

/// The `openAPIV3Schema` of the single version of a CRD (as JSON).
pub fn root_schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

/// Calls `visit(path, node)` for every schema node: `.a.b` for properties, `[]` for array items,
/// `{}` for map values. The root is the empty path.
pub fn walk_schema<'a>(schema: &'a Value, path: &str, visit: &mut dyn FnMut(&str, &'a Value)) {
    visit(path, schema);
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            walk_schema(child, &format!("{path}.{name}"), visit);
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        walk_schema(items, &format!("{path}[]"), visit);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        walk_schema(values, &format!("{path}{{}}"), visit);
    }
}

/// Applies the schema's `default:`s to `value` the way the API server's structural defaulting
/// does: inside every object that is present, a missing property with a default gets it, then
/// defaulting continues into the (possibly just defaulted) children. Returns the schema paths
/// where a default was inserted.
pub fn apply_defaults(schema: &Value, value: &mut Value) -> Vec<String> {
    let mut applied = Vec::new();
    default_into(schema, value, "", &mut applied);
    applied
}

fn default_into(schema: &Value, value: &mut Value, path: &str, applied: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, child_schema) in properties {
                    let child_path = format!("{path}.{name}");
                    if !object.contains_key(name)
                        && let Some(default) = child_schema.get("default")
                    {
                        object.insert(name.clone(), default.clone());
                        applied.push(child_path.clone());
                    }
                    if let Some(child) = object.get_mut(name) {
                        default_into(child_schema, child, &child_path, applied);
                    }
                }
            }
            if let Some(values_schema) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for child in object.values_mut() {
                    default_into(values_schema, child, &format!("{path}{{}}"), applied);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for item in items {
                    default_into(item_schema, item, &format!("{path}[]"), applied);
                }
            }
        }
        _ => {}
    }
}

/// Every place where two JSON values differ, as `pointer: left vs right` lines.
pub fn json_diff(left: &Value, right: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_into(left, right, String::new(), &mut out);
    out
}

fn diff_into(left: &Value, right: &Value, pointer: String, out: &mut Vec<String>) {
    match (left, right) {
        (Value::Object(l), Value::Object(r)) => {
            for key in l.keys().chain(r.keys().filter(|k| !l.contains_key(*k))) {
                let child = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
                match (l.get(key), r.get(key)) {
                    (Some(a), Some(b)) => diff_into(a, b, child, out),
                    (a, b) => out.push(format!("{child}: {a:?} vs {b:?}")),
                }
            }
        }
        (Value::Array(l), Value::Array(r)) if l.len() == r.len() => {
            for (i, (a, b)) in l.iter().zip(r).enumerate() {
                diff_into(a, b, format!("{pointer}/{i}"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{pointer}: {a} vs {b}")),
        _ => {}
    }
}
