//! The refusal of what oka's own runtime cannot honour ([`oka_api::local_runtime`], the one
//! table) for objects whose pod template names that runtime: the annotation
//! `agents.kruise.io/runtime: node` on the object or its template, else `runtimeClassName:
//! oka-node` ([`oka_api::runtime_choice`]). A template that names neither may run as a Pod,
//! which honours all of it, so admission cannot know and lets it through; the sandbox
//! controller that runs it on oka's runtime refuses it there, with the same paths.

use oka_api::runtime_choice::{SandboxRuntime, sandbox_runtime};
use serde_json::Value;

use crate::FieldError;

/// The `Forbidden` errors of the pod template at `/spec/template` of `obj` (the paths start
/// with `spec.template.`) when it names oka's runtime; none otherwise, or when the template
/// does not decode (decoding reports that).
pub fn template_errors(obj: &Value) -> Vec<FieldError> {
    let Some(raw) = obj.pointer("/spec/template").filter(|t| !t.is_null()) else {
        return Vec::new();
    };
    let Ok(template) =
        serde_json::from_value::<k8s_openapi::api::core::v1::PodTemplateSpec>(raw.clone())
    else {
        return Vec::new();
    };
    let mut owner = oka_api::Sandbox::new("admission", oka_api::SandboxSpec::default());
    owner.metadata.annotations =
        obj.pointer("/metadata/annotations").and_then(|a| serde_json::from_value(a.clone()).ok());
    if sandbox_runtime(&owner, Some(&template), SandboxRuntime::Pod) != SandboxRuntime::Node {
        return Vec::new();
    }
    oka_api::local_runtime::unsupported_fields(&template)
        .into_iter()
        .map(|u| FieldError::forbidden(&format!("spec.template.{}", u.field), u.detail()))
        .collect()
}
