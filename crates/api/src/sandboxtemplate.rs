//! `SandboxTemplate` (`sandboxtemplates.agents.kruise.io`, short name `sbt`): a reusable sandbox
//! template, referenced by `spec.templateRef` of Sandboxes and SandboxSets.
//!
//! It has no status. SandboxSets materialise their inline templates as `<sbs>-<hash>` templates
//! they own; the snapshot flow creates templates named after (and owned by) a Checkpoint.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{PauseStrategy, PersistentVolumeClaimTemplate, RuntimeConfig};
use crate::probes::{AutoPausePolicy, SandboxProbe};

/// The kind, as written in ownerReferences and `templateRef.kind`.
pub const SANDBOX_TEMPLATE_KIND: &str = "SandboxTemplate";

/// The desired state of a SandboxTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    singular = "sandboxtemplate",
    shortname = "sbt",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "SandboxTemplate is the Schema for the sandboxtemplates API"
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::probes::add_policy_validations)]
pub struct SandboxTemplateSpec {
    /// The pod template. Schemaless in the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub template: Option<PodTemplateSpec>,
    /// PVC templates. Schemaless in the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub volume_claim_templates: Option<Vec<PersistentVolumeClaimTemplate>>,
    /// What to keep across a pause: `ip`, `memory`, `filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub persistent_contents: Option<Vec<String>>,
    /// Runtimes (sidecars) to inject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub runtimes: Option<Vec<RuntimeConfig>>,
    /// How sandboxes are paused (a referencing SandboxSet's own value wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_strategy: Option<PauseStrategy>,
    /// Probes for sandboxes created from this template (oka extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 8),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub probes: Option<Vec<SandboxProbe>>,
    /// Auto-pause policy for sandboxes created from this template (oka extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_policy: Option<AutoPausePolicy>,
}
