//! The one place where kube-rs errors and API server `Status` answers become [`StoreError`]s.
//!
//! | API server answer | `StoreError` |
//! |---|---|
//! | 404 with `details.name` (the object is missing) | `NotFound` (the namespace, when `details.kind` is `namespaces`) |
//! | 404 without `details.name` (the path is not served: CRD or subresource missing) | `Internal` |
//! | 409, reason `AlreadyExists` | `AlreadyExists` |
//! | 409, any other reason (stale resourceVersion, failed uid/resourceVersion precondition) | `Conflict` |
//! | 410 (`Gone` on a watch, `Expired` on a list) | `Gone` |
//! | 400, 422 and other 4xx (bad request, validation, too large) | `Invalid` |
//! | 401, 403 (credentials, RBAC) | `Internal` |
//! | 429, 502, 503, 504, 500 with reason `ServerTimeout`/`Timeout` | `Unavailable` |
//! | any other 5xx | `Internal` |
//! | a `Status` without a code (some watch `ERROR` events) | as the code its `reason` stands for |
//!
//! Transport failures (connection refused, reset, TLS, auth refresh, a broken event stream)
//! are `Unavailable`; an answer that does not decode as the expected type is `Internal`; a
//! request kube-rs refuses to build (empty name, unencodable path) is `Invalid`.

use kube::core::Status;

use crate::{Object, StoreError};

/// What a request was about, for the error messages.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// The kind, e.g. `Sandbox`.
    kind: String,
    /// `plural.version.group`, as kubectl names it, for messages about an unserved path.
    resource: String,
    /// The namespace, or empty for all namespaces.
    namespace: String,
    /// The object's name, or empty for a collection.
    name: String,
    /// The subresource the request went to, if any (`status`).
    subresource: Option<&'static str>,
    /// The resourceVersion a watch or list was asked to start from, reported by `Gone`.
    resource_version: String,
}

impl Target {
    /// One object of kind `K`.
    pub(super) fn object<K: Object>(namespace: &str, name: &str) -> Self {
        let (plural, version, group) = (K::plural(&()), K::version(&()), K::group(&()));
        let resource = if group.is_empty() {
            format!("{plural}.{version}")
        } else {
            format!("{plural}.{version}.{group}")
        };
        Target {
            kind: K::kind(&()).into_owned(),
            resource,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            subresource: None,
            resource_version: String::new(),
        }
    }

    /// The objects of kind `K` in one namespace or all of them.
    pub(super) fn collection<K: Object>(namespace: Option<&str>) -> Self {
        Target::object::<K>(namespace.unwrap_or_default(), "")
    }

    /// The same target, through a subresource.
    pub(super) fn subresource(mut self, subresource: &'static str) -> Self {
        self.subresource = Some(subresource);
        self
    }

    /// The same target, read from `resource_version` (reported when it has expired).
    pub(super) fn at_version(mut self, resource_version: &str) -> Self {
        resource_version.clone_into(&mut self.resource_version);
        self
    }

    /// Maps a kube-rs error.
    pub(super) fn error(&self, err: kube::Error) -> StoreError {
        match err {
            kube::Error::Api(status) => self.status(&status),
            kube::Error::BuildRequest(e) => {
                StoreError::Invalid(format!("{}: cannot build the request: {e}", self.what()))
            }
            kube::Error::SerdeError(e) => StoreError::Internal(format!(
                "{}: cannot decode the API server's answer: {e}",
                self.what()
            )),
            kube::Error::FromUtf8(e) => StoreError::Internal(format!(
                "{}: the API server's answer is not UTF-8: {e}",
                self.what()
            )),
            kube::Error::HyperError(_)
            | kube::Error::Service(_)
            | kube::Error::ReadEvents(_)
            | kube::Error::Auth(_)
            | kube::Error::ProxyProtocolUnsupported { .. }
            | kube::Error::ProxyProtocolDisabled { .. }
            | kube::Error::TlsRequired => StoreError::Unavailable(format!(
                "{}: cannot reach the API server: {}",
                self.what(),
                chain(&err)
            )),
            other => StoreError::Internal(format!("{}: {}", self.what(), chain(&other))),
        }
    }

    /// Maps an API server `Status` (an error answer or a watch `ERROR` event).
    pub(super) fn status(&self, status: &Status) -> StoreError {
        let code = if status.code == 0 { code_for_reason(&status.reason) } else { status.code };
        let message = if status.message.is_empty() { &status.reason } else { &status.message };
        let details = status.details.as_ref();
        match code {
            404 => match details.filter(|d| !d.name.is_empty()) {
                Some(d) if d.kind == "namespaces" => StoreError::NotFound {
                    kind: "Namespace".to_owned(),
                    namespace: String::new(),
                    name: d.name.clone(),
                },
                Some(_) => StoreError::NotFound {
                    kind: self.kind.clone(),
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                },
                None => StoreError::Internal(format!(
                    "the API server does not serve {}{}: is its CustomResourceDefinition \
                     installed{}? ({message})",
                    self.resource,
                    self.subresource.map(|s| format!(" ({s} subresource)")).unwrap_or_default(),
                    if self.subresource.is_some() { " with this subresource enabled" } else { "" },
                )),
            },
            409 if status.reason == "AlreadyExists" => StoreError::AlreadyExists {
                kind: self.kind.clone(),
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            },
            409 => StoreError::Conflict {
                kind: self.kind.clone(),
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                message: message.clone(),
            },
            410 => StoreError::Gone {
                requested: self.resource_version.clone(),
                oldest: oldest_retained(message).unwrap_or_default(),
            },
            401 | 403 => StoreError::Internal(format!(
                "{}: the API server refused the request ({code} {}): {message}",
                self.what(),
                status.reason
            )),
            429 | 502..=504 => StoreError::Unavailable(format!(
                "{}: the API server is busy ({code} {}): {message}",
                self.what(),
                status.reason
            )),
            500 if matches!(status.reason.as_str(), "ServerTimeout" | "Timeout") => {
                StoreError::Unavailable(format!(
                    "{}: the API server timed out ({code} {}): {message}",
                    self.what(),
                    status.reason
                ))
            }
            400..=499 => StoreError::Invalid(format!("{}: {message}", self.what())),
            _ => StoreError::Internal(format!(
                "{}: the API server failed ({code} {}): {message}",
                self.what(),
                status.reason
            )),
        }
    }

    /// `Kind ns/name`, `Kind in ns` or `Kind in all namespaces`.
    fn what(&self) -> String {
        match (self.namespace.is_empty(), self.name.is_empty()) {
            (_, false) => format!("{} {}/{}", self.kind, self.namespace, self.name),
            (false, true) => format!("{} in namespace {}", self.kind, self.namespace),
            (true, true) => format!("{} in all namespaces", self.kind),
        }
    }
}

/// The HTTP code a `Status` reason stands for, for answers that carry a reason but no code.
fn code_for_reason(reason: &str) -> u16 {
    match reason {
        "BadRequest" => 400,
        "Unauthorized" => 401,
        "Forbidden" => 403,
        "NotFound" => 404,
        "MethodNotAllowed" => 405,
        "AlreadyExists" | "Conflict" => 409,
        "Gone" | "Expired" => 410,
        "RequestEntityTooLarge" => 413,
        "UnsupportedMediaType" => 415,
        "Invalid" => 422,
        "TooManyRequests" => 429,
        "ServiceUnavailable" => 503,
        "Timeout" | "ServerTimeout" => 504,
        _ => 500,
    }
}

/// The oldest resourceVersion a watch can start from, from the watch cache's 410 message
/// `too old resource version: <requested> (<oldest>)`. Etcd's own compaction message
/// carries no number.
fn oldest_retained(message: &str) -> Option<String> {
    let open = message.rfind('(')?;
    let close = open + message[open..].find(')')?;
    let number = message[open + 1..close].trim();
    (!number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())).then(|| number.to_owned())
}

/// The error and its sources, joined with `: `.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::response::StatusDetails;

    use super::*;

    fn status(code: u16, reason: &str, message: &str, name: Option<&str>) -> Status {
        Status {
            status: None,
            code,
            message: message.to_owned(),
            metadata: None,
            reason: reason.to_owned(),
            details: name.map(|n| StatusDetails {
                name: n.to_owned(),
                group: String::new(),
                kind: "configmaps".to_owned(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: 0,
            }),
        }
    }

    #[track_caller]
    fn check(code: u16, reason: &str, message: &str, name: Option<&str>, expected: &str) {
        let target = Target::object::<ConfigMap>("ns1", "c1").at_version("7");
        let err = target.status(&status(code, reason, message, name));
        let got = format!("{err:?}");
        assert!(got.starts_with(expected), "{code} {reason}: got {got}, expected {expected}…");
    }

    #[test]
    fn status_codes_map_to_store_errors() {
        check(404, "NotFound", "configmaps \"c1\" not found", Some("c1"), "NotFound");
        check(
            404,
            "NotFound",
            "the server could not find the requested resource",
            None,
            "Internal",
        );
        check(409, "AlreadyExists", "already exists", Some("c1"), "AlreadyExists");
        check(409, "Conflict", "the object has been modified", Some("c1"), "Conflict");
        check(410, "Expired", "too old resource version: 7 (12)", None, "Gone");
        check(400, "BadRequest", "namespace does not match", None, "Invalid");
        check(422, "Invalid", "spec.size: Invalid value", Some("c1"), "Invalid");
        check(413, "RequestEntityTooLarge", "too large", None, "Invalid");
        check(401, "Unauthorized", "Unauthorized", None, "Internal");
        check(403, "Forbidden", "cannot get configmaps", Some("c1"), "Internal");
        check(429, "TooManyRequests", "slow down", None, "Unavailable");
        check(500, "InternalError", "etcd exploded", None, "Internal");
        check(500, "ServerTimeout", "timed out", None, "Unavailable");
        check(503, "ServiceUnavailable", "shutting down", None, "Unavailable");
        check(504, "Timeout", "timed out", None, "Unavailable");
        // Watch ERROR events may carry a reason and no code.
        check(0, "Expired", "too old resource version: 7 (12)", None, "Gone");
        check(0, "Conflict", "stale", None, "Conflict");
        check(0, "Weird", "unknown", None, "Internal");
    }

    #[test]
    fn gone_reports_requested_and_oldest_versions() {
        let target = Target::collection::<ConfigMap>(Some("ns1")).at_version("7");
        let err = target.status(&status(410, "Expired", "too old resource version: 7 (12)", None));
        assert_eq!(err, StoreError::Gone { requested: "7".into(), oldest: "12".into() });
        // Etcd's compaction message has no number: the oldest is unknown.
        let err = target.status(&status(
            410,
            "Expired",
            "The resourceVersion for the provided watch is too old.",
            None,
        ));
        assert_eq!(err, StoreError::Gone { requested: "7".into(), oldest: String::new() });
    }

    #[test]
    fn missing_namespace_is_reported_as_the_namespace() {
        let mut answer = status(404, "NotFound", "namespaces \"ns1\" not found", Some("ns1"));
        if let Some(d) = answer.details.as_mut() {
            d.kind = "namespaces".to_owned();
        }
        let err = Target::object::<ConfigMap>("ns1", "c1").status(&answer);
        assert_eq!(
            err,
            StoreError::NotFound {
                kind: "Namespace".into(),
                namespace: String::new(),
                name: "ns1".into()
            }
        );
    }

    #[test]
    fn unserved_path_names_the_resource_and_subresource() {
        let err = Target::object::<ConfigMap>("ns1", "c1").subresource("status").status(&status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            None,
        ));
        let StoreError::Internal(message) = err else { panic!("expected Internal, got {err:?}") };
        assert!(message.contains("configmaps.v1 (status subresource)"), "{message}");
    }
}
