//! `Checkpoint` (`checkpoints.agents.kruise.io`, short name `cp`): a checkpoint of a sandbox
//! (its pod info, memory and/or filesystem), processed by an external checkpoint controller.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind, as written in ownerReferences.
pub const CHECKPOINT_KIND: &str = "Checkpoint";

/// `spec.persistentContents` value: the pod's info only.
pub const CONTENT_POD_INFO: &str = "podInfo";
/// `spec.persistentContents` value: memory.
pub const CONTENT_MEMORY: &str = "memory";
/// `spec.persistentContents` value: the filesystem.
pub const CONTENT_FILESYSTEM: &str = "filesystem";

/// Legacy `agents.kruise.io/checkpoint-type` label value for a pod-info-only checkpoint.
pub const LEGACY_TYPE_POD_INFO: &str = "pod-info";
/// Legacy `agents.kruise.io/checkpoint-type` label value for a filesystem (upgrade) checkpoint.
pub const LEGACY_TYPE_UPGRADE: &str = "upgrade";

open_string_enum! {
    /// `status.phase` of a Checkpoint.
    pub enum CheckpointPhase {
        /// Not started.
        Pending => "Pending",
        /// Being created.
        Creating => "Creating",
        /// Created.
        Succeeded => "Succeeded",
        /// Creation failed.
        Failed => "Failed",
        /// Being deleted.
        Terminating => "Terminating",
    }
}

/// The desired state of a Checkpoint.
// `printcolumn(...)` repeats `type_ = ...` by design; clippy's duplicated_attributes lint reads
// the kube attribute's nested lists as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "Checkpoint",
    plural = "checkpoints",
    singular = "checkpoint",
    shortname = "cp",
    namespaced,
    status = "CheckpointStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Checkpoint is the Schema for the checkpoints API",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// The sandbox to checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_name: Option<String>,
    /// The pod to checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Keep the sandbox running after the checkpoint; absent means true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_running: Option<bool>,
    /// What to checkpoint: `podInfo`, `memory`, `filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub persistent_contents: Option<Vec<String>>,
    /// How long a finished checkpoint is kept (`30s`, `30m`, `30d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_after_finished: Option<String>,
}

impl CheckpointSpec {
    /// Whether the sandbox keeps running (`keepRunning`, default true).
    pub fn keeps_running(&self) -> bool {
        self.keep_running.unwrap_or(true)
    }
}

/// The observed state of a Checkpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointStatus {
    /// The most recent `metadata.generation` the controller acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CheckpointPhase>,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The checkpoint's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
    /// When the checkpoint finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// A strategic merge patch to apply to the pod template when restoring. Schemaless in the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_fields")]
    pub pod_template_delta: Option<serde_json::Value>,
}
