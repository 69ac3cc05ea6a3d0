//! `SandboxUpdateOps` (`sandboxupdateops.agents.kruise.io`, short name `suo`): upgrade a batch of
//! claimed sandboxes by patching their pod template.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{SandboxLifecycle, UpgradePolicyType};

open_string_enum! {
    /// `status.phase` of a SandboxUpdateOps.
    pub enum SandboxUpdateOpsPhase {
        /// Not started.
        Pending => "Pending",
        /// Upgrading sandboxes.
        Updating => "Updating",
        /// Every selected sandbox was upgraded.
        Completed => "Completed",
        /// Done, and at least one sandbox failed to upgrade.
        Failed => "Failed",
    }
}

closed_string_enum! {
    /// A sandbox state a SandboxUpdateOps may select (`spec.stateFilter.states[]`).
    pub enum SandboxUpdateOpsState {
        /// Running sandboxes.
        Running => "Running",
        /// Paused sandboxes (upgraded in two phases: resume, then patch).
        Paused => "Paused",
    }
}

/// The desired state of a SandboxUpdateOps.
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "SandboxUpdateOps",
    plural = "sandboxupdateops",
    singular = "sandboxupdateops",
    shortname = "suo",
    namespaced,
    status = "SandboxUpdateOpsStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "SandboxUpdateOps is the Schema for the sandboxupdateops API",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Total", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedReplicas"),
    printcolumn(name = "Updating", type_ = "integer", json_path = ".status.updatingReplicas"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failedReplicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxUpdateOpsSpec {
    /// Selects the sandboxes (same namespace) to upgrade.
    #[schemars(schema_with = "crate::schema::label_selector")]
    pub selector: LabelSelector,
    /// How the selected sandboxes are upgraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<SandboxUpdateOpsStrategy>,
    /// A strategic merge patch applied to each sandbox's pod template (may carry `$patch`
    /// directives). Schemaless in the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub patch: Option<serde_json::Value>,
    /// Upgrade hooks set on each sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    /// Stop starting new upgrades.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Which sandbox states are selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_filter: Option<SandboxStateFilter>,
}

impl SandboxUpdateOpsSpec {
    /// The states to select: `stateFilter.states`, or `[Running]` when empty or absent.
    pub fn selected_states(&self) -> Vec<SandboxUpdateOpsState> {
        match self.state_filter.as_ref().and_then(|f| f.states.as_deref()) {
            Some(states) if !states.is_empty() => states.to_vec(),
            _ => vec![SandboxUpdateOpsState::Running],
        }
    }

    /// The upgrade type: `updateStrategy.type`, or `Recreate` when absent.
    pub fn upgrade_type(&self) -> UpgradePolicyType {
        self.update_strategy.as_ref().and_then(|s| s.type_).unwrap_or(UpgradePolicyType::Recreate)
    }
}

/// `spec.updateStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxUpdateOpsStrategy {
    /// The upgrade type; absent means `Recreate`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<UpgradePolicyType>,
    /// How many sandboxes may be upgrading (or failed) at once: a count or a percentage of the
    /// selected total, rounded up; absent means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// `spec.stateFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStateFilter {
    /// The states to select; empty means `[Running]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub states: Option<Vec<SandboxUpdateOpsState>>,
}

/// The observed state of a SandboxUpdateOps.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxUpdateOpsStatus {
    /// The most recent `metadata.generation` the controller acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SandboxUpdateOpsPhase>,
    /// Selected sandboxes: updated + failed + updating + not yet started.
    pub replicas: i32,
    /// Sandboxes upgraded successfully.
    pub updated_replicas: i32,
    /// Sandboxes whose upgrade failed.
    pub failed_replicas: i32,
    /// Sandboxes being upgraded.
    pub updating_replicas: i32,
    /// Conditions (the reference never writes any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
}
