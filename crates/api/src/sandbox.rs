//! `Sandbox` (`sandboxes.agents.kruise.io`, short name `sbx`): one sandbox, backed by one pod.
//!
//! A sandbox is created from an inline pod `template` or a `templateRef` to a SandboxTemplate. It
//! is either an unclaimed member of a SandboxSet pool (controller ownerRef to the SandboxSet) or
//! claimed (no controller ownerRef, label `agents.kruise.io/sandbox-claimed=true`). Its derived
//! state (creating/available/running/paused/dead) is [`crate::sandbox_state`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    PauseStrategy, PersistentVolumeClaimTemplate, RuntimeConfig, SandboxLifecycle,
    SandboxTemplateRef, UpgradePolicy,
};
use crate::conditions;
use crate::probes::{AutoPausePolicy, SandboxProbe};

open_string_enum! {
    /// `status.phase` of a Sandbox.
    pub enum SandboxPhase {
        /// Accepted; the pod is not running yet. An empty phase is treated as Pending by the
        /// controller.
        Pending => "Pending",
        /// The pod is running.
        Running => "Running",
        /// Paused (with the Stop strategy the pod is deleted).
        Paused => "Paused",
        /// Being resumed.
        Resuming => "Resuming",
        /// Being upgraded (recreated from a new template, with hooks).
        Upgrading => "Upgrading",
        /// The pod finished successfully; terminal.
        Succeeded => "Succeeded",
        /// The pod failed or disappeared; terminal.
        Failed => "Failed",
        /// Being returned to its pool (reuse).
        Recycling => "Recycling",
        /// Declared by the reference but never written by its controller.
        Terminating => "Terminating",
    }
}

/// The desired state of a Sandbox.
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "Sandbox",
    plural = "sandboxes",
    singular = "sandbox",
    shortname = "sbx",
    namespaced,
    status = "SandboxStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Sandbox is the Schema for the sandboxes API",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Claimed",
        type_ = "string",
        json_path = ".metadata.labels.agents\\.kruise\\.io/sandbox-claimed"
    ),
    printcolumn(name = "shutdown_time", type_ = "string", json_path = ".spec.shutdownTime"),
    printcolumn(name = "pause_time", type_ = "string", json_path = ".spec.pauseTime"),
    printcolumn(name = "RecycledCount", type_ = "integer", json_path = ".status.recycledCount"),
    printcolumn(name = "ReuseCount", type_ = "integer", json_path = ".status.reuseCount"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message")
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::probes::add_policy_validations)]
pub struct SandboxSpec {
    /// Whether the sandbox should be paused. The controller also sets it when `pauseTime` passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// How the sandbox is paused when `paused` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_strategy: Option<PauseStrategy>,
    /// What to keep across a pause: `ip`, `memory`, `filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub persistent_contents: Option<Vec<String>>,
    /// Absolute time at which the sandbox is deleted; a time in the past deletes it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// Runtimes (sidecars) injected into the sandbox pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub runtimes: Option<Vec<RuntimeConfig>>,
    /// Absolute time at which the sandbox is paused automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_time: Option<Time>,
    /// Hooks run around an upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    /// How template changes are applied; absent means in place only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<UpgradePolicy>,
    /// A SandboxTemplate (same namespace) to create the sandbox from. Mutually exclusive with
    /// `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<SandboxTemplateRef>,
    /// The pod template. Mutually exclusive with `templateRef`. Schemaless in the CRD: the API
    /// server neither validates nor prunes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub template: Option<PodTemplateSpec>,
    /// PVC templates; one PVC `<template name>-<sandbox name>` is created per entry. Schemaless in
    /// the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub volume_claim_templates: Option<Vec<PersistentVolumeClaimTemplate>>,
    /// Probes whose results are reported as `probe.agents.kruise.io/<name>` conditions (oka
    /// extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 8),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub probes: Option<Vec<SandboxProbe>>,
    /// Pause and resume the sandbox from probe conditions (oka extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_policy: Option<AutoPausePolicy>,
}

/// The observed state of a Sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// The most recent `metadata.generation` the controller acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The sandbox phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SandboxPhase>,
    /// A human-readable message about the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions (`Ready`, `SandboxPaused`, `SandboxResumed`, `InplaceUpdate`, `Upgrading`,
    /// `RuntimeInitialized`, `Recycling`, probe conditions, `AutoPaused`), one per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
    /// Facts about the sandbox's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_info: Option<PodInfo>,
    /// The node the sandbox runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The sandbox's IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_ip: Option<String>,
    /// The revision (hash) of `spec.template` the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<String>,
    /// How many times the sandbox was returned to its pool (the reference's counter; oka writes
    /// the same value as `reuseCount`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recycled_count: Option<i32>,
    /// How many times the sandbox was returned to its pool (oka's canonical counter, mirrored
    /// to `recycledCount`; readers take the larger of the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_count: Option<i32>,
}

/// `status.podInfo`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    /// Important pod annotations (never filled by the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Important pod labels (never filled by the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub labels: Option<BTreeMap<String, String>>,
    /// The node the pod is scheduled on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The pod's IP address.
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The pod's UID.
    #[serde(rename = "podUID", default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl SandboxStatus {
    /// How many times the sandbox was returned to its pool: the larger of `reuseCount` and
    /// `recycledCount`, so objects last written by the reference controller keep their count.
    pub fn reuse_count(&self) -> i32 {
        self.reuse_count.unwrap_or(0).max(self.recycled_count.unwrap_or(0))
    }

    /// Records the reuse counter in both `reuseCount` and `recycledCount`.
    pub fn set_reuse_count(&mut self, count: i32) {
        self.reuse_count = Some(count);
        self.recycled_count = Some(count);
    }

    /// The condition of this type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        conditions::find(self.conditions.as_deref().unwrap_or_default(), type_)
    }
}

impl Sandbox {
    /// `status.phase`, if the status and the phase are set.
    pub fn phase(&self) -> Option<&SandboxPhase> {
        self.status.as_ref().and_then(|s| s.phase.as_ref())
    }

    /// The status condition of this type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref().and_then(|s| s.condition(type_))
    }

    /// Whether the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.condition(conditions::sandbox::READY).is_some_and(conditions::is_true)
    }

    /// Whether `spec.paused` is true.
    pub fn is_paused(&self) -> bool {
        self.spec.paused == Some(true)
    }

    /// The controller ownerReference (the first one with `controller: true`), if any.
    pub fn controller_ref(&self) -> Option<&OwnerReference> {
        self.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true))
    }

    /// Whether the sandbox is an unclaimed pool member: its controller ownerReference is a
    /// `SandboxSet` of exactly `agents.kruise.io/v1alpha1`.
    pub fn is_controlled_by_sandbox_set(&self) -> bool {
        self.controller_ref().is_some_and(|r| {
            r.kind == crate::sandboxset::SANDBOX_SET_KIND && r.api_version == crate::API_VERSION
        })
    }

    /// How many times the sandbox was returned to its pool (see [`SandboxStatus::reuse_count`]).
    pub fn reuse_count(&self) -> i32 {
        self.status.as_ref().map_or(0, SandboxStatus::reuse_count)
    }
}
