//! `SandboxClaim` (`sandboxclaims.agents.kruise.io`, short name `sbc`): claim sandboxes from a
//! SandboxSet pool.
//!
//! Defaults (`replicas: 1`, `claimTimeout: 1m`, `ttlAfterCompleted: 60m`, `createOnNoStock: true`,
//! `waitReadyTimeout: 30s`, `skipInitRuntime: false`) are CRD schema defaults, so the API server
//! fills them in; the Rust fields are not `Option` and the same defaults apply when
//! deserializing and in [`Default`], so an object that never went through an API server (the
//! embedded store, a test) reads the same. Durations stay Go duration strings, as written; the
//! accessor methods parse them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{CsiMountConfig, RuntimeConfig};
use crate::{ApiError, parse_go_duration, parse_go_duration_signed};

open_string_enum! {
    /// `status.phase` of a SandboxClaim.
    pub enum SandboxClaimPhase {
        /// Claiming sandboxes.
        Claiming => "Claiming",
        /// Done: all replicas claimed, the claim timed out, or the pool is missing.
        Completed => "Completed",
    }
}

/// Default of `spec.replicas`.
pub const DEFAULT_REPLICAS: i32 = 1;
/// Default of `spec.claimTimeout`.
pub const DEFAULT_CLAIM_TIMEOUT: &str = "1m";
/// Default of `spec.ttlAfterCompleted`.
pub const DEFAULT_TTL_AFTER_COMPLETED: &str = "60m";
/// Default of `spec.waitReadyTimeout`.
pub const DEFAULT_WAIT_READY_TIMEOUT: &str = "30s";

/// The desired state of a SandboxClaim.
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    singular = "sandboxclaim",
    shortname = "sbc",
    namespaced,
    status = "SandboxClaimStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "SandboxClaim is the Schema for the sandboxclaims API",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Template", type_ = "string", json_path = ".spec.templateName"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Claimed", type_ = "integer", json_path = ".status.claimedReplicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    /// The SandboxSet (same namespace) to claim from.
    pub template_name: String,
    /// How many sandboxes to claim. Immutable.
    #[serde(default = "default_replicas")]
    #[schemars(
        range(min = 1),
        extend("x-kubernetes-validations" = [{"message": "replicas is immutable", "rule": "self == oldSelf"}])
    )]
    pub replicas: i32,
    /// Set as `spec.shutdownTime` on every claimed sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// How long to keep claiming (Go duration); then the claim completes with what it has.
    #[serde(default = "default_claim_timeout")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "message": "claimTimeout must be at least 1 second",
        "rule": "duration(self) >= duration('1s')",
    }]))]
    pub claim_timeout: String,
    /// How long a completed claim lives (Go duration); negative means forever. Only the claim is
    /// deleted, never the sandboxes.
    #[serde(default = "default_ttl_after_completed")]
    pub ttl_after_completed: String,
    /// Labels added to claimed sandboxes (and their pod templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations added to claimed sandboxes (and, minus reserved prefixes, their pod templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Environment variables passed to the agent runtime's `/init`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// In-place changes applied to each claimed sandbox's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inplace_update: Option<InplaceUpdate>,
    /// CSI volumes mounted into each claimed sandbox, keyed by `mountPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["mountPath"]))]
    pub dynamic_volumes_mount: Option<Vec<CsiMountConfig>>,
    /// Runtime configuration passed with the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub runtimes: Option<Vec<RuntimeConfig>>,
    /// Keep sandboxes whose claim failed (label `agents.kruise.io/reserved-failed-sandbox`)
    /// instead of deleting them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_failed_sandbox: Option<bool>,
    /// Create a new sandbox when the pool has none available.
    #[serde(default = "default_true")]
    pub create_on_no_stock: bool,
    /// How long to wait for a claimed sandbox to become ready (Go duration).
    #[serde(default = "default_wait_ready_timeout")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "message": "waitReadyTimeout must be at least 1 second",
        "rule": "duration(self) >= duration('1s')",
    }]))]
    pub wait_ready_timeout: String,
    /// Skip the agent runtime's `/init` call.
    #[serde(default)]
    pub skip_init_runtime: bool,
}

impl Default for SandboxClaimSpec {
    fn default() -> Self {
        Self {
            template_name: String::new(),
            replicas: DEFAULT_REPLICAS,
            shutdown_time: None,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT.to_owned(),
            ttl_after_completed: DEFAULT_TTL_AFTER_COMPLETED.to_owned(),
            labels: None,
            annotations: None,
            env_vars: None,
            inplace_update: None,
            dynamic_volumes_mount: None,
            runtimes: None,
            reserve_failed_sandbox: None,
            create_on_no_stock: true,
            wait_ready_timeout: DEFAULT_WAIT_READY_TIMEOUT.to_owned(),
            skip_init_runtime: false,
        }
    }
}

impl SandboxClaimSpec {
    /// A spec claiming from `template_name` with every default.
    pub fn new(template_name: impl Into<String>) -> Self {
        Self { template_name: template_name.into(), ..Self::default() }
    }

    /// `claimTimeout` as a duration.
    ///
    /// # Errors
    ///
    /// When the string is not a non-negative Go duration.
    pub fn claim_timeout(&self) -> Result<Duration, ApiError> {
        parse_go_duration(&self.claim_timeout)
    }

    /// `waitReadyTimeout` as a duration.
    ///
    /// # Errors
    ///
    /// When the string is not a non-negative Go duration.
    pub fn wait_ready_timeout(&self) -> Result<Duration, ApiError> {
        parse_go_duration(&self.wait_ready_timeout)
    }

    /// `ttlAfterCompleted` as a duration; `None` when negative (keep the claim forever).
    ///
    /// # Errors
    ///
    /// When the string is not a Go duration.
    pub fn ttl_after_completed(&self) -> Result<Option<Duration>, ApiError> {
        let ttl = parse_go_duration_signed(&self.ttl_after_completed)?;
        Ok(if ttl.is_negative() { None } else { Some(ttl.unsigned_abs()) })
    }
}

fn default_replicas() -> i32 {
    DEFAULT_REPLICAS
}

fn default_claim_timeout() -> String {
    DEFAULT_CLAIM_TIMEOUT.to_owned()
}

fn default_ttl_after_completed() -> String {
    DEFAULT_TTL_AFTER_COMPLETED.to_owned()
}

fn default_wait_ready_timeout() -> String {
    DEFAULT_WAIT_READY_TIMEOUT.to_owned()
}

fn default_true() -> bool {
    true
}

/// `spec.inplaceUpdate`: changes applied in place to the first container of each claimed sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InplaceUpdate {
    /// New image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// New resources (CPU only, and only where the original value is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<InplaceUpdateResources>,
}

/// `spec.inplaceUpdate.resources`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InplaceUpdateResources {
    /// Resource limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity_map")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Resource requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity_map")]
    pub requests: Option<BTreeMap<String, Quantity>>,
}

/// The observed state of a SandboxClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    /// The most recent `metadata.generation` the controller acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The claim phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SandboxClaimPhase>,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How many sandboxes have been claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_replicas: Option<i32>,
    /// When claiming started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_start_time: Option<Time>,
    /// When the claim completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Conditions (`Completed`, `TimedOut`), one per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_apply_when_deserializing() {
        let spec: SandboxClaimSpec =
            serde_json::from_value(json!({"templateName": "pool"})).unwrap();
        assert_eq!(spec, SandboxClaimSpec::new("pool"));
        assert_eq!(spec.replicas, 1);
        assert!(spec.create_on_no_stock);
        assert_eq!(spec.claim_timeout(), Ok(Duration::from_secs(60)));
        assert_eq!(spec.wait_ready_timeout(), Ok(Duration::from_secs(30)));
        assert_eq!(spec.ttl_after_completed(), Ok(Some(Duration::from_secs(3600))));
    }

    #[test]
    fn negative_ttl_means_forever() {
        let spec =
            SandboxClaimSpec { ttl_after_completed: "-1s".into(), ..SandboxClaimSpec::new("p") };
        assert_eq!(spec.ttl_after_completed(), Ok(None));
        let spec = SandboxClaimSpec { ttl_after_completed: "0".into(), ..spec };
        assert_eq!(spec.ttl_after_completed(), Ok(Some(Duration::ZERO)));
        let spec = SandboxClaimSpec { ttl_after_completed: "1d".into(), ..spec };
        assert!(spec.ttl_after_completed().is_err());
    }

    #[test]
    fn explicit_values_win_over_defaults() {
        let spec: SandboxClaimSpec = serde_json::from_value(json!({
            "templateName": "pool",
            "replicas": 3,
            "createOnNoStock": false,
            "claimTimeout": "10m",
        }))
        .unwrap();
        assert_eq!(spec.replicas, 3);
        assert!(!spec.create_on_no_stock);
        assert_eq!(spec.claim_timeout(), Ok(Duration::from_secs(600)));
    }
}
