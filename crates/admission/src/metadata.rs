//! `metadata` as the API server admits it for a custom resource: the fields of `ObjectMeta`
//! only, a name that is a DNS-1123 subdomain, labels and annotations with valid keys and
//! values.

use serde_json::{Map, Value};

use crate::FieldError;
use crate::Operation;

/// The fields of `ObjectMeta`.
const OBJECT_META: [&str; 15] = [
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "managedFields",
    "name",
    "namespace",
    "ownerReferences",
    "resourceVersion",
    "selfLink",
    "uid",
];

const SUBDOMAIN: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const NAME_PART: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, one label of a subdomain.
fn is_dns_label(part: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = part.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            ok(first) && ok(last) && bytes.iter().all(|&b| ok(b) || b == b'-')
        }
        _ => false,
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_name_part(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Removes the fields `ObjectMeta` does not have, recording their paths.
pub(crate) fn prune(obj: &mut Value, unknown: &mut Vec<String>) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    meta.retain(|key, _| {
        let known = OBJECT_META.contains(&key.as_str());
        if !known {
            unknown.push(format!("metadata.{key}"));
        }
        known
    });
}

/// Why `name` is not a DNS-1123 subdomain, as the API server says it.
pub(crate) fn subdomain_errors(name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if name.len() > 253 {
        errors.push("must be no more than 253 characters".to_owned());
    }
    if !name.split('.').all(is_dns_label) {
        errors.push(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character (e.g. \
             'example.com', regex used for validation is '{SUBDOMAIN}')"
        ));
    }
    errors
}

/// Why `key` is not a qualified name (`prefix/name`), as the API server says it.
pub(crate) fn qualified_name_errors(key: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errors.push("prefix part must be non-empty".to_owned());
        } else {
            errors.extend(subdomain_errors(prefix).into_iter().map(|e| format!("prefix part {e}")));
        }
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > 63 {
            errors.push("name part must be no more than 63 characters".to_owned());
        }
        if !is_name_part(name) {
            errors.push(format!(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
                 start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
                 '123-abc', regex used for validation is '{NAME_PART}')"
            ));
        }
    }
    errors
}

/// Why `value` is not a label value, as the API server says it.
pub(crate) fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_owned());
    }
    if !value.is_empty() && !is_name_part(value) {
        errors.push(format!(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  \
             or 'my_value',  or '12345', regex used for validation is '{LABEL_VALUE}')"
        ));
    }
    errors
}

/// The metadata's errors.
pub(crate) fn validate(obj: &Value, operation: Operation) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let text = |key: &str| meta.get(key).and_then(Value::as_str).unwrap_or_default();
    let name = text("name");
    if name.is_empty() {
        let generated = operation == Operation::Create && !text("generateName").is_empty();
        if !generated {
            errors.push(FieldError::required("metadata.name", "name or generateName is required"));
        }
    } else {
        for e in subdomain_errors(name) {
            errors.push(FieldError::invalid("metadata.name", Value::from(name), e));
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        errors.extend(labels_errors(labels, "metadata.labels"));
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        errors.extend(annotations_errors(annotations, "metadata.annotations"));
    }
    errors
}

/// A label map's errors at `path` (`ValidateLabels`): each key a qualified name, each value a
/// label value; both reported at the map's path, as the API server reports them.
pub(crate) fn labels_errors(labels: &Map<String, Value>, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in labels {
        for e in qualified_name_errors(key) {
            errors.push(FieldError::invalid(path, Value::from(key.as_str()), e));
        }
        match value.as_str() {
            Some(v) => {
                for e in label_value_errors(v) {
                    errors.push(FieldError::invalid(path, value.clone(), e));
                }
            }
            None => errors.push(FieldError::invalid(
                &format!("{path}[{key}]"),
                value.clone(),
                "a label value must be a string",
            )),
        }
    }
    errors
}

/// An annotation map's errors at `path` (`ValidateAnnotations`): each key, lowercased, a
/// qualified name, and all of them together at most 256 KiB.
pub(crate) fn annotations_errors(annotations: &Map<String, Value>, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut size = 0;
    for (key, value) in annotations {
        for e in qualified_name_errors(&key.to_lowercase()) {
            errors.push(FieldError::invalid(path, Value::from(key.as_str()), e));
        }
        size += key.len() + value.as_str().map_or(0, str::len);
    }
    if size > 256 * 1024 {
        errors.push(FieldError::new(
            path,
            crate::FieldErrorKind::TooLong,
            Value::Null,
            "must have at most 262144 bytes",
        ));
    }
    errors
}
