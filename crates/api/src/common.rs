//! Types shared by several kinds: pause strategy, runtimes, template reference, upgrade hooks,
//! PVC templates and CSI mounts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ExecAction, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.persistentContents` value on a Sandbox/SandboxSet/SandboxTemplate: keep the IP.
pub const PERSISTENT_CONTENT_IP: &str = "ip";
/// `spec.persistentContents` value: keep memory.
pub const PERSISTENT_CONTENT_MEMORY: &str = "memory";
/// `spec.persistentContents` value: keep the filesystem.
pub const PERSISTENT_CONTENT_FILESYSTEM: &str = "filesystem";

/// `spec.runtimes[].name` of the agent runtime (envd) sidecar.
pub const RUNTIME_AGENT_RUNTIME: &str = "agent-runtime";
/// `spec.runtimes[].name` of the CSI sidecar.
pub const RUNTIME_CSI: &str = "csi";
/// `spec.runtimes[].name` of the traffic proxy sidecar.
pub const RUNTIME_TRAFFIC_PROXY: &str = "traffic-proxy";

/// The default of [`UpgradeAction::timeout_seconds`].
pub const DEFAULT_UPGRADE_ACTION_TIMEOUT_SECONDS: i32 = 60;

closed_string_enum! {
    /// How a sandbox is paused (`spec.pauseStrategy.type`).
    ///
    /// The reference controller ignores it and always stops (deletes the pod).
    pub enum PauseStrategyType {
        /// Stop the sandbox: its pod is deleted and recreated on resume.
        Stop => "Stop",
        /// Hibernate the sandbox, keeping its state on the medium of `hibernateStrategy`.
        Hibernate => "Hibernate",
    }
}

closed_string_enum! {
    /// How a claimed sandbox is upgraded when its template changes (`spec.upgradePolicy.type`,
    /// SandboxUpdateOps `spec.updateStrategy.type`).
    pub enum UpgradePolicyType {
        /// Recreate the pod from the new template.
        Recreate => "Recreate",
        /// Checkpoint the filesystem, recreate the pod, restore the checkpoint.
        CheckpointRestore => "CheckpointRestore",
    }
}

/// `spec.pauseStrategy`: how a sandbox is paused when `spec.paused` is true.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseStrategy {
    /// Selects the pause mechanism.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<PauseStrategyType>,
    /// Where hibernate state is kept. Only meaningful when `type` is `Hibernate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernate_strategy: Option<HibernateStrategy>,
}

/// `spec.pauseStrategy.hibernateStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HibernateStrategy {
    /// Selects the storage medium for hibernate state (the reference defines `Snapshot`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

impl HibernateStrategy {
    /// The one hibernate medium the reference defines.
    pub const SNAPSHOT: &str = "Snapshot";
}

/// One entry of `spec.runtimes`: a sidecar/runtime injected into the sandbox pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfig {
    /// The runtime's name: a key of the injection ConfigMap (`agent-runtime`, `csi`,
    /// `traffic-proxy`, ...).
    pub name: String,
}

impl RuntimeConfig {
    /// A runtime entry with this name.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// `spec.templateRef`: a SandboxTemplate in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateRef {
    /// Name of the SandboxTemplate.
    pub name: String,
    /// Kind of the referenced object (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// API version of the referenced object (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
}

/// `spec.lifecycle`: hooks run inside the sandbox around an upgrade.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycle {
    /// Runs before the upgrade, typically to back up workspace data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_upgrade: Option<UpgradeAction>,
    /// Runs after the upgrade, typically to restore workspace data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_upgrade: Option<UpgradeAction>,
}

/// One upgrade hook.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeAction {
    /// The command to run inside the sandbox through the agent runtime; the first element is the
    /// program, the rest are its arguments (for a script use `["/bin/bash", "-c", "..."]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::exec_action")]
    pub exec: Option<ExecAction>,
    /// Timeout of the hook in seconds.
    #[serde(default = "default_upgrade_action_timeout_seconds")]
    pub timeout_seconds: i32,
}

impl Default for UpgradeAction {
    fn default() -> Self {
        Self { exec: None, timeout_seconds: DEFAULT_UPGRADE_ACTION_TIMEOUT_SECONDS }
    }
}

fn default_upgrade_action_timeout_seconds() -> i32 {
    DEFAULT_UPGRADE_ACTION_TIMEOUT_SECONDS
}

/// `spec.upgradePolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePolicy {
    /// The upgrade policy. When absent, template changes are applied in place only.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<UpgradePolicyType>,
}

/// One entry of `spec.volumeClaimTemplates`: a PVC created per sandbox as
/// `<template name>-<sandbox name>`.
///
/// This is `corev1.PersistentVolumeClaim` as embedded in a Go struct: `apiVersion` and `kind` are
/// optional and omitted when empty. (k8s-openapi's `PersistentVolumeClaim` always writes them,
/// which would add two fields to every stored template.) Convert with [`From`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimTemplate {
    /// Usually absent; `v1` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Usually absent; `PersistentVolumeClaim` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The template's metadata; `name` names the volume.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The claim's spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PersistentVolumeClaimSpec>,
    /// Never meaningful in a template; kept so it round-trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PersistentVolumeClaimStatus>,
}

impl From<PersistentVolumeClaimTemplate> for PersistentVolumeClaim {
    fn from(t: PersistentVolumeClaimTemplate) -> Self {
        Self { metadata: t.metadata, spec: t.spec, status: t.status }
    }
}

impl From<PersistentVolumeClaim> for PersistentVolumeClaimTemplate {
    fn from(pvc: PersistentVolumeClaim) -> Self {
        Self {
            api_version: None,
            kind: None,
            metadata: pvc.metadata,
            spec: pvc.spec,
            status: pvc.status,
        }
    }
}

/// A CSI volume mounted into a claimed sandbox (SandboxClaim `spec.dynamicVolumesMount`, and the
/// JSON of the `e2b.agents.kruise.io/csi-volume-config` annotation).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CsiMountConfig {
    /// Identifier of the mount.
    #[serde(rename = "mountID", default, skip_serializing_if = "Option::is_none")]
    pub mount_id: Option<String>,
    /// Name of the PersistentVolume to mount.
    pub pv_name: String,
    /// Where to mount it inside the sandbox; the list key.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    /// Mount read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Extra CSI attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}
