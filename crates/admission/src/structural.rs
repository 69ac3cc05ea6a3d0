//! A CRD's structural schema applied to an object: pruning, defaulting and validation, with the
//! API server's paths (`spec.probes[0].name`) and messages.

use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Value};

use crate::errors::{FieldError, FieldErrorKind};

/// One kind's schema, with its patterns compiled.
#[derive(Debug, Clone)]
pub(crate) struct Schema {
    root: Value,
    patterns: HashMap<String, Regex>,
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// `additionalProperties` when it is a schema.
fn additional(schema: &Value) -> Option<&Value> {
    schema.get("additionalProperties").filter(|a| a.is_object())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

/// The name Kubernetes gives a JSON value's type in its messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(value: &Value, wanted: &str) -> bool {
    match (wanted, value) {
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        (wanted, value) => type_name(value) == wanted,
    }
}

/// The root's own fields, which every kind has: `metadata` is `ObjectMeta`, admitted apart.
const ROOT_META: &str = "metadata";

impl Schema {
    pub(crate) fn new(root: Value) -> Self {
        let mut patterns = HashMap::new();
        collect_patterns(&root, &mut patterns);
        Schema { root, patterns }
    }

    pub(crate) fn root(&self) -> &Value {
        &self.root
    }

    /// Removes the fields the schema does not declare, recording their paths.
    pub(crate) fn prune(&self, obj: &mut Value, unknown: &mut Vec<String>) {
        prune(obj, &self.root, "", unknown, true);
    }

    /// Fills absent fields that have a default.
    pub(crate) fn default(&self, obj: &mut Value) {
        default(obj, &self.root, true);
    }

    /// Records every way `obj` breaks the schema.
    pub(crate) fn validate(&self, obj: &Value, errors: &mut Vec<FieldError>) {
        self.check(obj, &self.root, "", errors, true);
    }

    fn check(
        &self,
        value: &Value,
        schema: &Value,
        path: &str,
        errors: &mut Vec<FieldError>,
        root: bool,
    ) {
        if value.is_null() {
            if !flag(schema, "nullable") && schema.get("type").is_some() {
                let wanted = schema["type"].as_str().unwrap_or_default();
                errors.push(FieldError::type_invalid(
                    path,
                    Value::from("null"),
                    format!("{path} in body must be of type {wanted}: \"null\""),
                ));
            }
            return;
        }
        if flag(schema, "x-kubernetes-int-or-string") {
            if !(has_type(value, "integer") || value.is_string()) {
                errors.push(FieldError::type_invalid(
                    path,
                    Value::from(type_name(value)),
                    format!(
                        "{path} in body must be of type integer or string: \"{}\"",
                        type_name(value)
                    ),
                ));
            }
            return;
        }
        if let Some(wanted) = schema.get("type").and_then(Value::as_str)
            && !has_type(value, wanted)
        {
            errors.push(FieldError::type_invalid(
                path,
                Value::from(type_name(value)),
                format!("{path} in body must be of type {wanted}: \"{}\"", type_name(value)),
            ));
            return;
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array)
            && !options.contains(value)
        {
            let supported: Vec<String> = options.iter().map(crate::render_value).collect();
            errors.push(FieldError::new(
                path,
                FieldErrorKind::NotSupported,
                value.clone(),
                format!("supported values: {}", supported.join(", ")),
            ));
        }
        match value {
            Value::String(text) => self.check_string(text, schema, path, errors),
            Value::Number(n) => {
                check_number(value, n.as_f64().unwrap_or(0.0), schema, path, errors)
            }
            Value::Array(items) => {
                check_array(value, items, schema, path, errors);
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(item, item_schema, &format!("{path}[{i}]"), errors, false);
                    }
                }
            }
            Value::Object(map) => {
                for required in
                    schema.get("required").and_then(Value::as_array).into_iter().flatten()
                {
                    if let Some(key) = required.as_str()
                        && !map.contains_key(key)
                    {
                        errors.push(FieldError::required(&join(path, key), ""));
                    }
                }
                let props = properties(schema);
                let extra = additional(schema);
                for (key, field) in map {
                    if root && key == ROOT_META {
                        continue;
                    }
                    if let Some(field_schema) = props.and_then(|p| p.get(key)) {
                        self.check(field, field_schema, &join(path, key), errors, false);
                    } else if let Some(field_schema) = extra {
                        self.check(field, field_schema, &format!("{path}[{key}]"), errors, false);
                    }
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
    }

    fn check_string(&self, text: &str, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
        let length = text.chars().count();
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
            && length as u64 > max
        {
            errors.push(FieldError::new(
                path,
                FieldErrorKind::TooLong,
                Value::Null,
                format!("may not be more than {max} bytes"),
            ));
        }
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
            && (length as u64) < min
        {
            errors.push(FieldError::invalid(
                path,
                Value::from(text),
                format!("{path} in body should be at least {min} chars long"),
            ));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
            && let Some(re) = self.patterns.get(pattern)
            && !re.is_match(text)
        {
            errors.push(FieldError::invalid(
                path,
                Value::from(text),
                format!("{path} in body should match '{pattern}'"),
            ));
        }
        if let Some(format) = schema.get("format").and_then(Value::as_str) {
            let ok = match format {
                "date-time" => text.parse::<jiff::Timestamp>().is_ok(),
                "duration" => is_go_duration(text),
                _ => true,
            };
            if !ok {
                errors.push(FieldError::type_invalid(
                    path,
                    Value::from(text),
                    format!("{path} in body must be of type {format}: \"{text}\""),
                ));
            }
        }
    }
}

/// Whether `text` is a Go duration (`300ms`, `1h30m`, `-1.5h`).
fn is_go_duration(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    if body == "0" {
        return true;
    }
    let mut rest = body;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .filter(|u| rest.starts_with(u))
            .max_by_key(|u| u.len());
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

fn check_number(value: &Value, n: f64, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    let render = |b: f64| if b.fract() == 0.0 { format!("{}", b as i64) } else { b.to_string() };
    if let Some(min) = bound("minimum") {
        let exclusive = flag(schema, "exclusiveMinimum");
        if n < min || (exclusive && n == min) {
            let relation = if exclusive { "greater than" } else { "greater than or equal to" };
            errors.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body should be {relation} {}", render(min)),
            ));
        }
    }
    if let Some(max) = bound("maximum") {
        let exclusive = flag(schema, "exclusiveMaximum");
        if n > max || (exclusive && n == max) {
            let relation = if exclusive { "less than" } else { "less than or equal to" };
            errors.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body should be {relation} {}", render(max)),
            ));
        }
    }
}

fn check_array(
    value: &Value,
    items: &[Value],
    schema: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        errors.push(FieldError::new(
            path,
            FieldErrorKind::TooMany,
            Value::from(items.len()),
            format!("must have at most {max} items"),
        ));
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        errors.push(FieldError::invalid(
            path,
            value.clone(),
            format!("{path} in body should have at least {min} items"),
        ));
    }
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            for (i, item) in items.iter().enumerate() {
                if items[..i].contains(item) {
                    errors.push(FieldError::new(
                        &format!("{path}[{i}]"),
                        FieldErrorKind::Duplicate,
                        item.clone(),
                        "",
                    ));
                }
            }
        }
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let key_of = |item: &Value| -> Map<String, Value> {
                keys.iter().filter_map(|k| Some(((*k).to_owned(), item.get(*k)?.clone()))).collect()
            };
            for (i, item) in items.iter().enumerate() {
                let key = key_of(item);
                if items[..i].iter().any(|other| key_of(other) == key) {
                    errors.push(FieldError::new(
                        &format!("{path}[{i}]"),
                        FieldErrorKind::Duplicate,
                        Value::Object(key),
                        "",
                    ));
                }
            }
        }
        _ => {}
    }
}

fn collect_patterns(schema: &Value, into: &mut HashMap<String, Regex>) {
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && let Ok(re) = Regex::new(pattern)
    {
        into.insert(pattern.to_owned(), re);
    }
    for child in children(schema) {
        collect_patterns(child, into);
    }
}

/// The schemas nested in `schema`.
fn children(schema: &Value) -> Vec<&Value> {
    let mut out: Vec<&Value> = properties(schema).into_iter().flat_map(|p| p.values()).collect();
    out.extend(schema.get("items"));
    out.extend(additional(schema));
    for key in ["anyOf", "allOf", "oneOf"] {
        out.extend(schema.get(key).and_then(Value::as_array).into_iter().flatten());
    }
    out
}

fn prune(value: &mut Value, schema: &Value, path: &str, unknown: &mut Vec<String>, root: bool) {
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(schema, "x-kubernetes-embedded-resource");
    match value {
        Value::Object(map) => {
            let props = properties(schema);
            let extra = additional(schema);
            let open = preserve
                || schema.get("additionalProperties").and_then(Value::as_bool) == Some(true);
            let mut remove = Vec::new();
            for (key, field) in map.iter_mut() {
                if root && key == ROOT_META {
                    continue;
                }
                if embedded && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(field_schema) = props.and_then(|p| p.get(key)) {
                    prune(field, field_schema, &join(path, key), unknown, false);
                } else if let Some(field_schema) = extra {
                    prune(field, field_schema, &format!("{path}[{key}]"), unknown, false);
                } else if !open {
                    remove.push(key.clone());
                }
            }
            for key in remove {
                map.remove(&key);
                unknown.push(join(path, &key));
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item, item_schema, &format!("{path}[{i}]"), unknown, false);
                }
            }
        }
        _ => {}
    }
}

fn default(value: &mut Value, schema: &Value, root: bool) {
    match value {
        Value::Object(map) => {
            if let Some(props) = properties(schema) {
                for (key, field_schema) in props {
                    if root && key == ROOT_META {
                        continue;
                    }
                    let absent =
                        map.get(key).is_none_or(|v| v.is_null() && !flag(field_schema, "nullable"));
                    if absent && let Some(d) = field_schema.get("default") {
                        map.insert(key.clone(), d.clone());
                    }
                    if let Some(field) = map.get_mut(key) {
                        default(field, field_schema, false);
                    }
                }
            }
            if let Some(field_schema) = additional(schema) {
                for field in map.values_mut() {
                    default(field, field_schema, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    default(item, item_schema, false);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        for ok in ["0", "1s", "10m", "1h30m", "1.5h", "300ms", "-2m"] {
            assert!(is_go_duration(ok), "{ok}");
        }
        for bad in ["", "1", "1d", "m", "1s2"] {
            assert!(!is_go_duration(bad), "{bad}");
        }
    }
}
