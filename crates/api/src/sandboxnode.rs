//! SandboxNode (oka extension): a machine whose node agent (`oka node`) runs sandboxes on a
//! cluster.
//!
//! The reference runs every sandbox as a Pod and has no such kind. oka's node agent runs
//! sandboxes with its local runtime instead (millisecond freeze pause, CRIU hibernation,
//! snapshots and clones on clusters too), so the controllers need to know which machines can
//! run them, how much room each has, and how to reach their sandboxes' ports: each node agent
//! writes one SandboxNode about itself, in the system namespace, and keeps it alive.
//!
//! - `spec` is the node agent's own description, written when it starts: where its relay
//!   listens, its capacity, whether new sandboxes may be placed on it. `metadata.labels` are
//!   what templates' `nodeSelector` and node affinity match.
//! - `status.heartbeatTime` is renewed every few seconds (see [`HEARTBEAT_INTERVAL_SECONDS`]);
//!   a node whose heartbeat stops changing for the grace period is lost, and its sandboxes
//!   fail (judged by the time the controller observed the last change, never by comparing
//!   another machine's clock with its own).
//!
//! A sandbox is placed on a node by the label [`NODE_NAME`](crate::labels::NODE_NAME), and stays
//! there for life.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How often a node agent renews its heartbeat, in seconds.
pub const HEARTBEAT_INTERVAL_SECONDS: u64 = 5;

/// How long a heartbeat may stand still before the node is lost, in seconds (the default;
/// the controller's setting).
pub const NODE_LOST_AFTER_SECONDS: u64 = 40;

/// A node agent's description of itself.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.kruise.io",
    version = "v1alpha1",
    kind = "SandboxNode",
    plural = "sandboxnodes",
    singular = "sandboxnode",
    shortname = "sbn",
    namespaced,
    status = "SandboxNodeStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "SandboxNode is a machine whose oka node agent runs sandboxes (oka extension)",
    printcolumn(name = "Relay", type_ = "string", json_path = ".spec.relayAddress"),
    printcolumn(name = "Sandboxes", type_ = "integer", json_path = ".status.sandboxes"),
    printcolumn(name = "Heartbeat", type_ = "date", json_path = ".status.heartbeatTime")
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNodeSpec {
    /// Where the node agent's relay listens (`host:port`): the gateway and the manager reach
    /// the ports of this node's sandboxes through it.
    pub relay_address: String,
    /// What the node offers sandboxes: `cpu`, `memory`, and `sandboxes` (how many at most).
    /// A resource not named is not limited.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub capacity: std::collections::BTreeMap<String, Quantity>,
    /// No new sandbox is placed on the node (its sandboxes keep running).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
}

/// What the node agent reports while it runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNodeStatus {
    /// The last heartbeat, renewed every [`HEARTBEAT_INTERVAL_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,
    /// The sandboxes the node's runtime holds.
    #[serde(default)]
    pub sandboxes: i32,
    /// The node agent's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The capacity key of the most sandboxes a node runs.
pub const CAPACITY_SANDBOXES: &str = "sandboxes";
