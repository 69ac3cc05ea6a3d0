//! Field errors as the Kubernetes API server words them (`k8s.io/apimachinery`'s
//! `field.Error`): a path such as `spec.probes[0].name`, a type, the bad value, a detail.

use serde_json::Value;

/// The type of a field error; its name starts the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`.
    Required,
    /// `Invalid value: <value>`.
    Invalid,
    /// `Invalid value: <value>` for a value of the wrong type or format (Go's `TypeInvalid`):
    /// worded as `Invalid`, but it keeps the `x-kubernetes-validations` rules from running,
    /// as they assume the schema's types.
    TypeInvalid,
    /// `Unsupported value: <value>`.
    NotSupported,
    /// `Forbidden`.
    Forbidden,
    /// `Too long`.
    TooLong,
    /// `Too many: <value>`.
    TooMany,
    /// `Duplicate value: <value>`.
    Duplicate,
    /// `Not found: <value>`: a reference to something that does not exist.
    NotFound,
}

/// One field that breaks the rules.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The field's path: `spec.replicas`, `spec.probes[0].name`, `metadata.labels[a]`.
    pub field: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// The bad value, for the kinds that show it.
    pub value: Value,
    /// The rest of the message.
    pub detail: String,
}

/// A value as Go's `field.Error` prints it: strings quoted, numbers and booleans bare.
pub fn render_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_owned(),
        other => other.to_string(),
    }
}

impl FieldError {
    pub(crate) fn new(
        field: &str,
        kind: FieldErrorKind,
        value: Value,
        detail: impl Into<String>,
    ) -> Self {
        FieldError { field: field.to_owned(), kind, value, detail: detail.into() }
    }

    /// `Required value`.
    pub fn required(field: &str, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Required, Value::Null, detail)
    }

    /// `Invalid value: <value>: <detail>`.
    pub fn invalid(field: &str, value: Value, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Invalid, value, detail)
    }

    /// `Invalid value: <value>: <detail>` for a value of the wrong type or format.
    pub fn type_invalid(field: &str, value: Value, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::TypeInvalid, value, detail)
    }

    /// Whether this error keeps the `x-kubernetes-validations` rules from running (the API
    /// server's `hasBlockingErr`): the rules assume the schema's types, required fields,
    /// enums and bounds hold.
    pub fn blocks_rules(&self) -> bool {
        matches!(
            self.kind,
            FieldErrorKind::NotSupported
                | FieldErrorKind::Required
                | FieldErrorKind::TooLong
                | FieldErrorKind::TooMany
                | FieldErrorKind::TypeInvalid
        )
    }

    /// `Forbidden: <detail>`.
    pub fn forbidden(field: &str, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Forbidden, Value::Null, detail)
    }

    /// The message after the path, as the API server prints it (`Invalid value: 5: ...`).
    pub fn body(&self) -> String {
        let (name, show_value) = match self.kind {
            FieldErrorKind::Required => ("Required value", false),
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => ("Invalid value", true),
            FieldErrorKind::NotSupported => ("Unsupported value", true),
            FieldErrorKind::Forbidden => ("Forbidden", false),
            FieldErrorKind::TooLong => ("Too long", false),
            FieldErrorKind::TooMany => ("Too many", true),
            FieldErrorKind::Duplicate => ("Duplicate value", true),
            FieldErrorKind::NotFound => ("Not found", true),
        };
        let mut body = name.to_owned();
        if show_value {
            body.push_str(": ");
            body.push_str(&render_value(&self.value));
        }
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }
}
