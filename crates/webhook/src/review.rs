//! One `AdmissionReview` (`admission.k8s.io/v1`, or `v1beta1`, which has the same shape) in,
//! one out: the rules of `oka-admission` answered as the reference's webhooks answer them
//! (controller-runtime's `admission.Response`). Pure: what a rule needs from the cluster (the
//! namespace's other SandboxUpdateOps or PoolAutoscalers, a Pod, a Sandbox) is asked for with
//! [`lookups`] and handed to [`answer`] as [`Facts`].
//!
//! The answers:
//!
//! - a mutating path answers `allowed` with a base64 `JSONPatch` (`patchType: JSONPatch`) when
//!   the defaults changed the object, and `allowed` alone otherwise;
//! - a validating path answers `allowed` (with the rules' `warnings`), or a denial with
//!   `status.code` 422 and `status.message` the field errors (`spec.replicas: Invalid value:
//!   -1: ...`, several as `[a, b]`), as `admission.Errored(422, errs.ToAggregate())` does. The
//!   API server adds `admission webhook "<name>" denied the request: ` itself, so the message
//!   carries no such prefix;
//! - `/validate-pod-delete` denies with `status.code` 403 and `reason: Forbidden`
//!   (`admission.Denied`);
//! - an object that cannot be read answers `status.code` 400.
//!
//! The answer echoes the request's `uid`, and the review's `apiVersion` and `kind`. A `dryRun`
//! request is answered as any other: no rule has side effects.

use std::collections::BTreeSet;

use base64::Engine as _;
use oka_admission::Operation;
use oka_admission::webhooks::{self, Denial};
use serde_json::{Value, json};

use crate::patch;

/// A webhook path the server answers, each the reference's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WebhookPath {
    /// `/default-sandboxset` (`md-sbs.kb.io`).
    DefaultSandboxSet,
    /// `/default-sandboxtemplate` (`md-sbt.kb.io`).
    DefaultSandboxTemplate,
    /// `/validate-sandboxset` (`v-sbs.kb.io`).
    ValidateSandboxSet,
    /// `/validate-sandboxtemplate` (`v-sbt.kb.io`).
    ValidateSandboxTemplate,
    /// `/validate-sandboxupdateops` (`v-suo.kb.io`).
    ValidateSandboxUpdateOps,
    /// `/validate-poolautoscaler` (`v-pas.kb.io`).
    ValidatePoolAutoscaler,
    /// `/validate-pod-delete` (`v-pod-delete.kb.io`, `v-pod-eviction.kb.io`).
    ValidatePodDelete,
}

impl WebhookPath {
    /// Every path.
    pub const ALL: [WebhookPath; 7] = [
        WebhookPath::DefaultSandboxSet,
        WebhookPath::DefaultSandboxTemplate,
        WebhookPath::ValidateSandboxSet,
        WebhookPath::ValidateSandboxTemplate,
        WebhookPath::ValidateSandboxUpdateOps,
        WebhookPath::ValidatePoolAutoscaler,
        WebhookPath::ValidatePodDelete,
    ];

    /// The HTTP path.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookPath::DefaultSandboxSet => "/default-sandboxset",
            WebhookPath::DefaultSandboxTemplate => "/default-sandboxtemplate",
            WebhookPath::ValidateSandboxSet => "/validate-sandboxset",
            WebhookPath::ValidateSandboxTemplate => "/validate-sandboxtemplate",
            WebhookPath::ValidateSandboxUpdateOps => "/validate-sandboxupdateops",
            WebhookPath::ValidatePoolAutoscaler => "/validate-poolautoscaler",
            WebhookPath::ValidatePodDelete => "/validate-pod-delete",
        }
    }

    /// The path of an HTTP path.
    pub fn parse(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == path)
    }

    /// The kind of `agents.kruise.io` object the path admits (none for the pod path).
    fn kind(self) -> &'static str {
        match self {
            WebhookPath::DefaultSandboxSet | WebhookPath::ValidateSandboxSet => "SandboxSet",
            WebhookPath::DefaultSandboxTemplate | WebhookPath::ValidateSandboxTemplate => {
                "SandboxTemplate"
            }
            WebhookPath::ValidateSandboxUpdateOps => "SandboxUpdateOps",
            WebhookPath::ValidatePoolAutoscaler => "PoolAutoscaler",
            WebhookPath::ValidatePodDelete => "Pod",
        }
    }
}

/// Who may delete or evict a sandbox's Pod while its Sandbox lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// User names (`system:serviceaccount:<ns>:<name>`) whose deletions and evictions are
    /// always allowed: the controller's own ServiceAccount.
    pub allowed_pod_deleters: BTreeSet<String>,
}

/// Something a rule reads from the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The SandboxUpdateOps of a namespace.
    UpdateOps {
        /// The namespace.
        namespace: String,
    },
    /// The PoolAutoscalers of a namespace.
    PoolAutoscalers {
        /// The namespace.
        namespace: String,
    },
    /// A Pod (the one an eviction names).
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A Sandbox (the one of a pod: same namespace and name).
    Sandbox {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// What [`lookups`] asked for, as found (JSON of each object; absent when not found).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// The namespace's SandboxUpdateOps.
    pub update_ops: Vec<Value>,
    /// The namespace's PoolAutoscalers.
    pub pool_autoscalers: Vec<Value>,
    /// The Pod, when it exists.
    pub pod: Option<Value>,
    /// The Sandbox, when it exists.
    pub sandbox: Option<Value>,
}

/// Why a body is not an `AdmissionReview` with a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an AdmissionReview request: {0}")]
pub struct NotAReview(pub &'static str);

/// The parts of an `AdmissionReview` request the rules read.
#[derive(Debug, Clone, PartialEq)]
pub struct Review {
    api_version: String,
    kind: String,
    uid: String,
    operation: String,
    sub_resource: String,
    name: String,
    namespace: String,
    username: String,
    object: Value,
    old_object: Value,
}

impl Review {
    /// Reads an `AdmissionReview` (its `request.uid` is required).
    pub fn parse(review: &Value) -> Result<Review, NotAReview> {
        let request =
            review.get("request").filter(|r| r.is_object()).ok_or(NotAReview("no request"))?;
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
        let uid = text(request.get("uid"));
        if uid.is_empty() {
            return Err(NotAReview("no request.uid"));
        }
        Ok(Review {
            api_version: review
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("admission.k8s.io/v1")
                .to_owned(),
            kind: review
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("AdmissionReview")
                .to_owned(),
            uid,
            operation: text(request.get("operation")),
            sub_resource: text(request.get("subResource")),
            name: text(request.get("name")),
            namespace: text(request.get("namespace")),
            username: text(request.pointer("/userInfo/username")),
            object: request.get("object").cloned().unwrap_or(Value::Null),
            old_object: request.get("oldObject").cloned().unwrap_or(Value::Null),
        })
    }

    /// The review's operation as the API server names it (`CREATE`, `UPDATE`, `DELETE`,
    /// `CONNECT`).
    pub fn operation_name(&self) -> &str {
        &self.operation
    }

    fn operation(&self) -> Option<Operation> {
        match self.operation.as_str() {
            "CREATE" => Some(Operation::Create),
            "UPDATE" => Some(Operation::Update),
            _ => None,
        }
    }

    /// The namespace of the object (the request's, else the object's own).
    fn namespace(&self) -> String {
        if !self.namespace.is_empty() {
            return self.namespace.clone();
        }
        text_at(&self.object, "/metadata/namespace").to_owned()
    }

    /// The pod a pod-delete request is about, when the request itself carries it.
    fn deleted_pod(&self) -> Option<&Value> {
        (self.operation == "DELETE").then_some(&self.old_object).filter(|p| p.is_object())
    }

    fn is_eviction(&self) -> bool {
        self.operation == "CREATE" && self.sub_resource == "eviction"
    }
}

/// What `path` needs to know besides the review to answer it.
pub fn lookups(path: WebhookPath, review: &Review, settings: &Settings) -> Vec<Lookup> {
    let namespace = review.namespace();
    match path {
        WebhookPath::ValidateSandboxUpdateOps if review.operation == "CREATE" => {
            vec![Lookup::UpdateOps { namespace }]
        }
        WebhookPath::ValidatePoolAutoscaler if review.operation().is_some() => {
            vec![Lookup::PoolAutoscalers { namespace }]
        }
        WebhookPath::ValidatePodDelete => {
            if settings.allowed_pod_deleters.contains(&review.username) {
                return Vec::new();
            }
            if let Some(pod) = review.deleted_pod() {
                let name = text_at(pod, "/metadata/name").to_owned();
                let namespace = match text_at(pod, "/metadata/namespace") {
                    "" => namespace,
                    ns => ns.to_owned(),
                };
                vec![Lookup::Sandbox { namespace, name }]
            } else if review.is_eviction() {
                vec![
                    Lookup::Pod { namespace: namespace.clone(), name: review.name.clone() },
                    Lookup::Sandbox { namespace, name: review.name.clone() },
                ]
            } else {
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

/// The webhook's verdict, before it is worded as a review.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Allowed, with a JSON patch when the object changed, and warnings.
    Allowed { patch: Option<Value>, warnings: Vec<String> },
    /// Refused with a code, an optional reason and a message.
    Refused { code: u16, reason: Option<&'static str>, message: String },
}

/// The `AdmissionReview` answering `review` on `path`, given the [`Facts`] its [`lookups`]
/// found.
pub fn answer(path: WebhookPath, review: &Review, facts: &Facts, settings: &Settings) -> Value {
    let verdict = decide(path, review, facts, settings);
    let mut response = json!({"uid": review.uid});
    match verdict {
        Verdict::Allowed { patch, warnings } => {
            response["allowed"] = Value::Bool(true);
            response["status"] = json!({"metadata": {}, "code": 200});
            if let Some(patch) = patch {
                let bytes = patch.to_string();
                response["patchType"] = Value::from("JSONPatch");
                response["patch"] =
                    Value::from(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
            if !warnings.is_empty() {
                response["warnings"] = Value::from(warnings);
            }
        }
        Verdict::Refused { code, reason, message } => {
            response["allowed"] = Value::Bool(false);
            let mut status = json!({"metadata": {}, "code": code, "message": message});
            if let Some(reason) = reason {
                status["reason"] = Value::from(reason);
            }
            response["status"] = status;
        }
    }
    json!({"apiVersion": review.api_version, "kind": review.kind, "response": response})
}

/// The answer to a body that is not a review at all (no `request.uid` to echo).
pub fn bad_request(message: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "",
            "allowed": false,
            "status": {"metadata": {}, "code": 400, "message": message},
        },
    })
}

fn decide(path: WebhookPath, review: &Review, facts: &Facts, settings: &Settings) -> Verdict {
    let allowed = Verdict::Allowed { patch: None, warnings: Vec::new() };
    if path == WebhookPath::ValidatePodDelete {
        return pod_delete(review, facts, settings);
    }
    let Some(operation) = review.operation() else { return allowed };
    if !review.object.is_object() {
        return Verdict::Refused {
            code: 400,
            reason: None,
            message: format!("there is no content to decode in {}", review.operation),
        };
    }
    let kind = path.kind();
    match path {
        WebhookPath::DefaultSandboxSet | WebhookPath::DefaultSandboxTemplate => {
            let mut object = review.object.clone();
            if !oka_admission::mutating::mutate(kind, operation, &mut object) {
                return allowed;
            }
            let ops = patch::diff(&review.object, &object);
            Verdict::Allowed {
                patch: (!ops.is_empty()).then_some(Value::Array(ops)),
                warnings: Vec::new(),
            }
        }
        _ => {
            let old = review.old_object.is_object().then_some(&review.old_object);
            let verdict = webhooks::validate(kind, operation, &review.object, old);
            if let Some(denial) = verdict.denial {
                return invalid(&denial);
            }
            let against_others = match (path, operation) {
                (WebhookPath::ValidateSandboxUpdateOps, Operation::Create) => {
                    webhooks::update_ops_against_others(&review.object, &facts.update_ops)
                }
                (WebhookPath::ValidatePoolAutoscaler, _) => {
                    webhooks::pool_autoscaler_against_others(
                        &review.object,
                        old,
                        &facts.pool_autoscalers,
                    )
                }
                _ => None,
            };
            match against_others {
                Some(denial) => invalid(&denial),
                None => Verdict::Allowed { patch: None, warnings: verdict.warnings },
            }
        }
    }
}

/// A validating webhook's denial: 422 with the field errors (the API server names the webhook).
fn invalid(denial: &Denial) -> Verdict {
    Verdict::Refused { code: 422, reason: None, message: denial.aggregate() }
}

/// The reference's pod deletion protection: a Pod that runs a live Sandbox is deleted or
/// evicted only through its Sandbox (or by the controller itself).
fn pod_delete(review: &Review, facts: &Facts, settings: &Settings) -> Verdict {
    let allowed = Verdict::Allowed { patch: None, warnings: Vec::new() };
    if settings.allowed_pod_deleters.contains(&review.username) {
        return allowed;
    }
    let pod = if review.operation == "DELETE" {
        match review.deleted_pod() {
            Some(pod) => pod,
            None => {
                return Verdict::Refused {
                    code: 400,
                    reason: None,
                    message: "there is no content to decode".into(),
                };
            }
        }
    } else if review.is_eviction() {
        match &facts.pod {
            Some(pod) => pod,
            None => return allowed,
        }
    } else {
        return allowed;
    };
    if !pod.pointer("/metadata/deletionTimestamp").is_none_or(Value::is_null) {
        return allowed;
    }
    if text_at(pod, &format!("/metadata/labels/{}", escape(oka_api::labels::CREATED_BY)))
        != oka_api::labels::CREATED_BY_SANDBOX
    {
        return allowed;
    }
    let owner = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| {
            text_at(r, "/kind") == "Sandbox"
                && text_at(r, "/apiVersion") == format!("{}/{}", oka_api::GROUP, oka_api::VERSION)
        });
    let Some(owner) = owner else { return allowed };
    let Some(sandbox) = &facts.sandbox else { return allowed };
    if text_at(sandbox, "/metadata/uid") != text_at(owner, "/uid") {
        return allowed;
    }
    if !sandbox.pointer("/metadata/deletionTimestamp").is_none_or(Value::is_null) {
        return allowed;
    }
    Verdict::Refused {
        code: 403,
        reason: Some("Forbidden"),
        message: format!(
            "cannot delete/evict pod {}/{}: corresponding sandbox exists. Please delete the sandbox instead",
            text_at(pod, "/metadata/namespace"),
            text_at(pod, "/metadata/name"),
        ),
    }
}

fn text_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// A JSON pointer token for `key`.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
