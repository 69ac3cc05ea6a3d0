//! `SandboxSet` (`sandboxsets.agents.kruise.io`, short name `sbs`): a warm pool of sandboxes.
//!
//! `spec.replicas` is the desired number of **unclaimed** sandboxes (creating + available). A
//! claim detaches a sandbox from the pool (removes the controller ownerRef) and the pool creates
//! a replacement. The scale subresource (`.spec.replicas`, `.status.replicas`,
//! `.status.selector`) lets `kubectl scale`, an HPA or a PoolAutoscaler drive it.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    PauseStrategy, PersistentVolumeClaimTemplate, RuntimeConfig, SandboxTemplateRef,
};
use crate::labels;
use crate::probes::{AutoPausePolicy, SandboxProbe};

/// The kind, as written in ownerReferences.
pub const SANDBOX_SET_KIND: &str = "SandboxSet";

/// The `updateStrategy.maxUnavailable` the reference's admission webhook defaults to.
pub const DEFAULT_UPDATE_MAX_UNAVAILABLE: &str = "20%";

/// The desired state of a SandboxSet.
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "SandboxSet",
    plural = "sandboxsets",
    singular = "sandboxset",
    shortname = "sbs",
    namespaced,
    status = "SandboxSetStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "SandboxSet is the Schema for the sandboxsets API: a warm pool of sandboxes",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.availableReplicas"),
    printcolumn(
        name = "UpdatedReplicas",
        type_ = "integer",
        json_path = ".status.updatedReplicas"
    ),
    printcolumn(
        name = "UpdatedAvailableReplicas",
        type_ = "integer",
        json_path = ".status.updatedAvailableReplicas"
    ),
    printcolumn(name = "UpdateRevision", type_ = "string", json_path = ".status.updateRevision"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::probes::add_policy_validations)]
pub struct SandboxSetSpec {
    /// Desired number of unclaimed sandboxes (creating and available).
    pub replicas: i32,
    /// How member sandboxes are paused; copied onto each created sandbox and part of the
    /// revision hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_strategy: Option<PauseStrategy>,
    /// What members keep across a pause: `ip`, `memory`, `filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub persistent_contents: Option<Vec<String>>,
    /// Runtimes (sidecars) injected into member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub runtimes: Option<Vec<RuntimeConfig>>,
    /// How members are created and deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_strategy: Option<SandboxSetScaleStrategy>,
    /// How members are replaced when the template changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<SandboxSetUpdateStrategy>,
    /// A SandboxTemplate (same namespace) to create members from. Mutually exclusive with
    /// `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<SandboxTemplateRef>,
    /// The pod template of members. Mutually exclusive with `templateRef`. Schemaless in the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub template: Option<PodTemplateSpec>,
    /// PVC templates for members. Schemaless in the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub volume_claim_templates: Option<Vec<PersistentVolumeClaimTemplate>>,
    /// Probes copied onto each member (oka extension; not part of the revision hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 8),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub probes: Option<Vec<SandboxProbe>>,
    /// Auto-pause policy copied onto each member (oka extension; not part of the revision hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_policy: Option<AutoPausePolicy>,
}

/// `spec.scaleStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSetScaleStrategy {
    /// Caps scale-up: at most this many (or this percentage of `replicas`, rounded up) members
    /// may be not yet available. Absent means no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// `spec.updateStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSetUpdateStrategy {
    /// How many available members may be replaced at once (count, or percentage of `replicas`
    /// rounded up). The reference's admission webhook defaults it to `20%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// The observed state of a SandboxSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSetStatus {
    /// The most recent `metadata.generation` the controller acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Creating + available members + creations not yet observed.
    pub replicas: i32,
    /// Members that are Ready and can be claimed.
    pub available_replicas: i32,
    /// The revision (hash) of the effective template spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<String>,
    /// The materialised SandboxTemplate of this revision, or `spec.templateRef.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// Members at `updateRevision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// Available members at `updateRevision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_available_replicas: Option<i32>,
    /// Conditions (the reference never writes any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
    /// The label selector of unclaimed members, as a string, for the scale subresource:
    /// `agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// The `status.selector` of the pool `name`:
/// `agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=<name>`.
pub fn pool_selector(name: &str) -> String {
    format!("{}=false,{}={name}", labels::SANDBOX_CLAIMED, labels::SANDBOX_POOL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_selector_matches_reference() {
        assert_eq!(
            pool_selector("code-interpreter"),
            "agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=code-interpreter"
        );
    }
}
