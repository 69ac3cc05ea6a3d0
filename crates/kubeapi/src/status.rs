//! Errors as the Kubernetes API server answers them: a `Status` object with its reason, code
//! and message, so clients print `Error from server (NotFound): ...` as they do on a cluster.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oka_store::StoreError;
use serde_json::{Value, json};

/// A failed request, rendered as a `meta/v1 Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ApiStatus {
    /// The HTTP status code.
    pub code: u16,
    /// The machine-readable reason (`NotFound`, `AlreadyExists`, `Conflict`, ...).
    pub reason: &'static str,
    /// The message clients print.
    pub message: String,
    /// `details`: the object's name, group and resource, when the error is about one.
    pub details: Option<Value>,
    /// `metadata.continue`: how to go on after an expired `continue` token.
    pub continue_token: Option<String>,
}

/// The reason a field error's cause carries, from the start of its message (`Forbidden: ...`).
fn cause_reason(message: &str) -> &'static str {
    const PREFIXES: [(&str, &str); 9] = [
        ("Forbidden", "FieldValueForbidden"),
        ("Invalid value", "FieldValueInvalid"),
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Not found", "FieldValueNotFound"),
        ("Internal error", "InternalError"),
    ];
    PREFIXES.iter().find(|(p, _)| message.starts_with(p)).map_or("FieldValueInvalid", |(_, r)| r)
}

impl ApiStatus {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiStatus { code, reason, message: message.into(), details: None, continue_token: None }
    }

    /// 422 Invalid: `causes` are `(field path, message)` pairs, each message starting with the
    /// API server's error type (`Required value`, `Invalid value: ...`, `Forbidden: ...`).
    pub fn invalid(kind: &str, group: &str, name: &str, causes: &[(&str, String)]) -> Self {
        let bodies: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let summary = match bodies.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let qualified = if group.is_empty() { kind.to_owned() } else { format!("{kind}.{group}") };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, m)| json!({"reason": cause_reason(m), "message": m, "field": f}))
            .collect();
        ApiStatus {
            details: Some(json!({"name": name, "group": group, "kind": kind, "causes": causes})),
            ..Self::new(422, "Invalid", format!("{qualified} \"{name}\" is invalid: {summary}"))
        }
    }

    /// 422 from an admission webhook's denial: the API server keeps the webhook's code and
    /// message and gives no reason, so kubectl prints `Error from server: admission webhook ...`.
    pub fn denied(message: String) -> Self {
        Self::new(422, "", message)
    }

    /// 409 for a server-side apply that would change fields other managers own.
    pub fn apply_conflict(message: String, causes: Vec<Value>) -> Self {
        ApiStatus {
            details: Some(json!({"causes": causes})),
            ..Self::new(409, "Conflict", message)
        }
    }

    /// 500: a failure of the server's own.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 410 Expired: a resourceVersion or `continue` token older than what is kept.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 504 Timeout: the request did not finish in the time it allowed.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// 504: a resourceVersion newer than the store's, as the API server answers one it has
    /// not reached.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        ApiStatus {
            details: Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            })),
            ..Self::new(
                504,
                "Timeout",
                format!("Too large resource version: {requested}, current: {current}"),
            )
        }
    }

    /// The same error, telling the client how to continue its list.
    pub fn with_continue(self, token: String) -> Self {
        ApiStatus { continue_token: Some(token), ..self }
    }

    /// 400: the request cannot be understood (bad body, bad selector, unsupported patch).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401: no or wrong bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403: the caller may not do this (RBAC's answer).
    pub fn forbidden(message: String, group: &str, resource: &str) -> Self {
        ApiStatus {
            details: Some(json!({"group": group, "kind": resource})),
            ..Self::new(403, "Forbidden", message)
        }
    }

    /// 404 for a path that names no resource.
    pub fn no_such_path() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }

    /// 405: the resource exists but does not take this verb.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415: a patch type this server does not apply, worded as the API server words it, with
    /// the types it takes.
    pub fn unsupported_patch_type(accepted: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 {accepted}"
            ),
        )
    }

    /// 422: a JSON patch that does not apply to the object.
    pub fn invalid_patch(message: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {message}"),
        )
    }

    /// The store's error about object `name` of `resource` (`sandboxsets.agents.kruise.io`)
    /// of kind `kind`, with the API server's message for it.
    pub fn from_store(e: &StoreError, resource: &str, kind: &str, name: &str) -> Self {
        let (group, plural) = match resource.split_once('.') {
            Some((plural, group)) => (group, plural),
            None => ("", resource),
        };
        let details = json!({"name": name, "group": group, "kind": plural});
        let status = match e {
            StoreError::NotFound { .. } => {
                Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
            }
            StoreError::AlreadyExists { .. } => {
                Self::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"))
            }
            StoreError::Conflict { .. } => Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource} \"{name}\": the object has been \
                     modified; please apply your changes to the latest version and try again"
                ),
            ),
            StoreError::Gone { .. } => Self::new(410, "Expired", e.to_string()),
            StoreError::Invalid(message) => Self::new(
                422,
                "Invalid",
                format!("{kind}.{group} \"{name}\" is invalid: {message}"),
            ),
            StoreError::Unavailable(_) => Self::new(503, "ServiceUnavailable", e.to_string()),
            StoreError::Internal(_) => Self::new(500, "InternalError", e.to_string()),
        };
        ApiStatus { details: Some(details), ..status }
    }

    /// The `Status` object.
    pub fn to_json(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": match &self.continue_token {
                Some(token) => json!({"continue": token}),
                None => json!({}),
            },
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty()
            && let Value::Object(map) = &mut status
        {
            map.remove("reason");
        }
        if let (Some(details), Value::Object(map)) = (&self.details, &mut status) {
            map.insert("details".to_owned(), details.clone());
        }
        status
    }
}

impl IntoResponse for ApiStatus {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        crate::json_response(code, &self.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_reads_as_on_a_cluster() {
        let e = StoreError::NotFound {
            kind: "SandboxSet".into(),
            namespace: "default".into(),
            name: "nope".into(),
        };
        let status =
            ApiStatus::from_store(&e, "sandboxsets.agents.kruise.io", "SandboxSet", "nope");
        assert_eq!(
            status.to_json(),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "sandboxsets.agents.kruise.io \"nope\" not found",
                "reason": "NotFound",
                "details": {"name": "nope", "group": "agents.kruise.io", "kind": "sandboxsets"},
                "code": 404
            })
        );
    }
}
