//! `PoolAutoscaler` (`poolautoscalers.agents.kruise.io`, short name `pas`): scales a SandboxSet
//! through its scale subresource, on a cron schedule or to keep a target of available sandboxes.
//!
//! An oka extension (seed-extensions §1); the reference has only a design document. Cron and
//! capacity policies are mutually exclusive; with neither, the autoscaler only enforces
//! `minReplicas..=maxReplicas`. Schema defaults (`scaleTargetRef.apiVersion`, `minReplicas: 0`,
//! `suspend: false`) also apply when deserializing; the stabilization-window and tolerance
//! defaults are the controller's (see the accessors), as for a HorizontalPodAutoscaler.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandboxset::SANDBOX_SET_KIND;

/// Default scale-up stabilization window, in seconds.
pub const DEFAULT_SCALE_UP_STABILIZATION_WINDOW_SECONDS: i32 = 0;
/// Default scale-down stabilization window, in seconds.
pub const DEFAULT_SCALE_DOWN_STABILIZATION_WINDOW_SECONDS: i32 = 300;
/// Default tolerance of a capacity policy (the controller's `--pool-autoscaler-default-tolerance`).
pub const DEFAULT_TOLERANCE: &str = "10%";
/// Maximum number of cron policies.
pub const MAX_CRON_POLICIES: usize = 10;

/// The desired state of a PoolAutoscaler.
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "PoolAutoscaler",
    plural = "poolautoscalers",
    singular = "poolautoscaler",
    shortname = "pas",
    namespaced,
    status = "PoolAutoscalerStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "PoolAutoscaler scales a SandboxSet through its scale subresource",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.scaleTargetRef.name"),
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.minReplicas"),
    printcolumn(name = "Max", type_ = "integer", json_path = ".spec.maxReplicas"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.currentReplicas"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredReplicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.currentCapacity.available"
    ),
    printcolumn(name = "Suspended", type_ = "boolean", json_path = ".status.suspended"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.minReplicas <= self.maxReplicas",
        "message": "minReplicas must be less than or equal to maxReplicas",
    },
    {
        "rule": "!(has(self.cronPolicies) && size(self.cronPolicies) > 0 && has(self.capacityPolicy))",
        "message": "cron and capacity policies are mutually exclusive",
    },
]))]
pub struct PoolAutoscalerSpec {
    /// The SandboxSet to scale (same namespace).
    pub scale_target_ref: ScaleTargetRef,
    /// Upper bound of the target's `spec.replicas`.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Lower bound of the target's `spec.replicas`.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// Set `spec.replicas` at cron-scheduled instants; the latest due fire wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 10),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub cron_policies: Option<Vec<CronScalingPolicy>>,
    /// Keep a target number of available (unclaimed, ready) sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_policy: Option<CapacityPolicy>,
    /// Stop acting on the target (bounds included).
    #[serde(default)]
    pub suspend: bool,
}

/// `spec.scaleTargetRef`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.kind == 'SandboxSet'", "message": "kind must be SandboxSet"},
    {
        "rule": "self.apiVersion.startsWith('agents.kruise.io/')",
        "message": "apiVersion must be in group agents.kruise.io",
    },
]))]
pub struct ScaleTargetRef {
    /// API version of the target.
    #[serde(default = "default_target_api_version")]
    pub api_version: String,
    /// Kind of the target; must be `SandboxSet`.
    pub kind: String,
    /// Name of the target.
    #[schemars(length(min = 1))]
    pub name: String,
}

impl ScaleTargetRef {
    /// A reference to the SandboxSet `name`.
    pub fn sandbox_set(name: impl Into<String>) -> Self {
        Self {
            api_version: crate::API_VERSION.to_owned(),
            kind: SANDBOX_SET_KIND.to_owned(),
            name: name.into(),
        }
    }
}

impl Default for ScaleTargetRef {
    fn default() -> Self {
        Self::sandbox_set("")
    }
}

fn default_target_api_version() -> String {
    crate::API_VERSION.to_owned()
}

/// One entry of `spec.cronPolicies`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CronScalingPolicy {
    /// Name of the policy (a DNS-1123 label), unique in the list.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// IANA time zone of the schedule (e.g. `Asia/Shanghai`); absent means the controller's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub time_zone: Option<String>,
    /// Five-field cron expression (`minute hour day-of-month month day-of-week`) or one of
    /// `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`.
    pub schedule: String,
    /// The `spec.replicas` to set when the schedule fires (clamped to the bounds).
    #[schemars(range(min = 0))]
    pub target_replicas: i32,
}

/// `spec.capacityPolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityPolicy {
    /// Target number of available sandboxes: a count, or a percentage of `spec.replicas`.
    pub target_available: IntOrString,
    /// Dead zone around the target: a count or a percentage; absent means the controller's
    /// default (`--pool-autoscaler-default-tolerance`, `10%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<IntOrString>,
    /// Scale-up stabilization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingRules>,
    /// Scale-down stabilization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingRules>,
}

impl CapacityPolicy {
    /// The scale-up stabilization window (default 0 s).
    pub fn scale_up_window_seconds(&self) -> i32 {
        self.scale_up
            .as_ref()
            .and_then(|r| r.stabilization_window_seconds)
            .unwrap_or(DEFAULT_SCALE_UP_STABILIZATION_WINDOW_SECONDS)
    }

    /// The scale-down stabilization window (default 300 s).
    pub fn scale_down_window_seconds(&self) -> i32 {
        self.scale_down
            .as_ref()
            .and_then(|r| r.stabilization_window_seconds)
            .unwrap_or(DEFAULT_SCALE_DOWN_STABILIZATION_WINDOW_SECONDS)
    }

    /// The tolerance, or the given controller default when absent.
    pub fn tolerance_or(&self, default: IntOrString) -> IntOrString {
        self.tolerance.clone().unwrap_or(default)
    }
}

/// `capacityPolicy.scaleUp` / `capacityPolicy.scaleDown`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    /// Recommendations within this many seconds are considered (HPA-style stabilization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub stabilization_window_seconds: Option<i32>,
}

/// The observed state of a PoolAutoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAutoscalerStatus {
    /// The spec generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When this autoscaler last changed the target's `spec.replicas` (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// The target's `status.replicas` as last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_replicas: Option<i32>,
    /// The last computed (stabilized, clamped) replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Mirrors `spec.suspend` once acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,
    /// Per cron policy: what was applied and from when schedules are evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub applied_cron_policies: Option<Vec<AppliedCronPolicy>>,
    /// The target's capacity as last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_capacity: Option<CurrentCapacity>,
    /// A scale-up in flight (capacity mode): sandboxes this autoscaler added that are not yet
    /// ready, so they are not counted as demand again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_scale_up: Option<PendingScaleUp>,
    /// Conditions (`AbleToScale`, `ScalingActive`, `ScalingLimited`), one per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
}

/// One entry of `status.appliedCronPolicies`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedCronPolicy {
    /// The policy's name.
    pub name: String,
    /// The fire instant last applied (or superseded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// Schedules are evaluated after this instant: set when the policy (or its schedule or zone)
    /// is first seen and when the autoscaler is un-suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<Time>,
}

/// `status.currentCapacity`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentCapacity {
    /// The target's `status.availableReplicas` as last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i32>,
}

/// `status.pendingScaleUp`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingScaleUp {
    /// When the scale-up was written.
    pub start_time: Time,
    /// How many sandboxes it added.
    pub replicas: i32,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_apply_when_deserializing() {
        let spec: PoolAutoscalerSpec = serde_json::from_value(json!({
            "scaleTargetRef": {"kind": "SandboxSet", "name": "pool"},
            "maxReplicas": 10,
        }))
        .unwrap();
        assert_eq!(
            spec,
            PoolAutoscalerSpec {
                scale_target_ref: ScaleTargetRef::sandbox_set("pool"),
                max_replicas: 10,
                ..PoolAutoscalerSpec::default()
            }
        );
        assert_eq!(spec.min_replicas, 0);
        assert!(!spec.suspend);
    }

    #[test]
    fn window_defaults() {
        let policy = CapacityPolicy {
            target_available: IntOrString::Int(10),
            tolerance: None,
            scale_up: None,
            scale_down: Some(ScalingRules { stabilization_window_seconds: None }),
        };
        assert_eq!(policy.scale_up_window_seconds(), 0);
        assert_eq!(policy.scale_down_window_seconds(), 300);
        assert_eq!(
            policy.tolerance_or(IntOrString::String(DEFAULT_TOLERANCE.into())),
            IntOrString::String("10%".into())
        );
        let policy = CapacityPolicy {
            scale_down: Some(ScalingRules { stabilization_window_seconds: Some(0) }),
            ..policy
        };
        assert_eq!(policy.scale_down_window_seconds(), 0);
    }
}
