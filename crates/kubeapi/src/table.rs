//! The Table format (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`): the rows
//! `kubectl get` prints, built from each CRD's printer columns as the API server builds them
//! (a Name column first; `date` cells as ages; missing values as empty cells).

use jiff::Timestamp;
use serde_json::{Value, json};

/// One printer column of a CRD.
#[derive(Debug, Clone)]
pub struct Column {
    /// The header.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// An OpenAPI format hint.
    pub format: String,
    /// What the column shows.
    pub description: String,
    /// 0 for the default view; more shows only with `-o wide`.
    pub priority: i32,
    /// A simple JSONPath: `.a.b.c`, where `\.` is a dot inside a key.
    pub json_path: String,
    /// For the columns the API server computes (a core kind's `DATA`, an Event's `OBJECT`):
    /// the value from the whole object, instead of `json_path`.
    pub compute: Option<fn(&Value) -> Option<Value>>,
}

impl Column {
    /// The `Name` column every table starts with (`format: name`).
    pub fn name() -> Self {
        Column {
            name: "Name".into(),
            type_: "string".into(),
            format: "name".into(),
            description: "Name must be unique within a namespace. More info: http://kubernetes.io/docs/user-guide/identifiers#names".into(),
            priority: 0,
            json_path: ".metadata.name".into(),
            compute: None,
        }
    }
}

/// Which object each row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// Its metadata as a `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// The query parameter's value; anything unknown is the default.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// Evaluates a simple JSONPath (`.metadata.labels.agents\.kruise\.io/sandbox-claimed`) in `obj`.
pub fn eval_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    split_path(path).iter().try_fold(obj, |value, key| value.get(key.as_str()))
}

/// The keys of a simple JSONPath; `\.` is a literal dot.
pub fn split_path(path: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut key = String::new();
    let mut chars = path.trim_start_matches('.').chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.extend(chars.next()),
            '.' => keys.push(std::mem::take(&mut key)),
            c => key.push(c),
        }
    }
    keys.push(key);
    keys
}

/// A cell of `column` for `obj`: null when the path finds nothing.
fn cell(obj: &Value, column: &Column, now: Timestamp) -> Value {
    let computed = column.compute.and_then(|f| f(obj));
    let found = match &computed {
        Some(value) => Some(value),
        None if column.compute.is_some() => None,
        None => eval_path(obj, &column.json_path),
    };
    let Some(value) = found else { return Value::Null };
    match (column.type_.as_str(), value) {
        ("date", Value::String(text)) => match text.parse::<Timestamp>() {
            Ok(at) => Value::String(human_duration(now.duration_since(at))),
            Err(_) => value.clone(),
        },
        ("string", Value::String(_)) => value.clone(),
        ("string", value) => Value::String(value.to_string()),
        _ => value.clone(),
    }
}

/// An age as kubectl prints it (`k8s.io/apimachinery/pkg/util/duration.HumanDuration`).
pub fn human_duration(d: jiff::SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    let (minutes, hours) = (seconds / 60, seconds / 3600);
    let days = hours / 24;
    let years = days / 365;
    match () {
        () if seconds < 60 * 2 => format!("{seconds}s"),
        () if minutes < 10 => match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        },
        () if minutes < 60 * 3 => format!("{minutes}m"),
        () if hours < 8 => match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        },
        () if hours < 48 => format!("{hours}h"),
        () if hours < 24 * 8 => match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        },
        () if hours < 24 * 365 * 2 => format!("{days}d"),
        () if hours < 24 * 365 * 8 => match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        },
        () => format!("{years}y"),
    }
}

/// The `Table` of `objects` with `columns`, read at `resource_version`.
pub fn table(
    columns: &[Column],
    objects: &[Value],
    resource_version: &str,
    include: IncludeObject,
    now: Timestamp,
) -> Value {
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.type_,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let cells: Vec<Value> = columns.iter().map(|c| cell(obj, c, now)).collect();
            let mut row = json!({"cells": cells});
            let object = match include {
                IncludeObject::None => None,
                IncludeObject::Metadata => Some(json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
                })),
                IncludeObject::Object => Some(obj.clone()),
            };
            if let (Some(object), Value::Object(map)) = (object, &mut row) {
                map.insert("object".to_owned(), object);
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, type_: &str, path: &str) -> Column {
        Column {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: path.into(),
            compute: None,
        }
    }

    #[test]
    fn paths_follow_keys_and_escaped_dots() {
        let obj = json!({"metadata": {"labels": {"agents.kruise.io/sandbox-claimed": "true"}}});
        assert_eq!(
            eval_path(&obj, ".metadata.labels.agents\\.kruise\\.io/sandbox-claimed"),
            Some(&json!("true"))
        );
        assert_eq!(eval_path(&obj, ".status.phase"), None);
        assert_eq!(split_path(".a.b"), ["a", "b"]);
    }

    #[test]
    fn rows_have_the_name_then_the_crd_columns() {
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let columns = [
            Column::name(),
            column("Replicas", "integer", ".status.replicas"),
            column("Phase", "string", ".status.phase"),
            column("Age", "date", ".metadata.creationTimestamp"),
        ];
        let objects = [json!({
            "metadata": {"name": "base", "creationTimestamp": "2026-01-01T00:55:00Z"},
            "status": {"replicas": 2},
        })];
        let table = table(&columns, &objects, "7", IncludeObject::Metadata, now);
        let headers: Vec<_> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].clone())
            .collect();
        assert_eq!(headers, [json!("Name"), json!("Replicas"), json!("Phase"), json!("Age")]);
        assert_eq!(table["rows"][0]["cells"], json!(["base", 2, null, "5m"]));
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(table["rows"][0]["object"]["metadata"]["name"], "base");
        assert_eq!(table["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let age = |s: i64| human_duration(jiff::SignedDuration::from_secs(s));
        assert_eq!(age(5), "5s");
        assert_eq!(age(119), "119s");
        assert_eq!(age(150), "2m30s");
        assert_eq!(age(600), "10m");
        assert_eq!(age(3 * 3600 + 120), "3h2m");
        assert_eq!(age(10 * 3600), "10h");
        assert_eq!(age(3 * 86400 + 3600), "3d1h");
        assert_eq!(age(30 * 86400), "30d");
        assert_eq!(age(-5), "<invalid>");
    }
}
