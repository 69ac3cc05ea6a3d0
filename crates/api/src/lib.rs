//! The `agents.kruise.io/v1alpha1` API of oka, compatible with OpenKruise Agents.
//!
//! One module per kind ([`sandbox`], [`sandboxset`], [`sandboxclaim`], [`sandboxtemplate`],
//! [`sandboxupdateops`], [`checkpoint`], [`poolautoscaler`]), each with its spec, status and
//! phase types; shared pieces in [`common`] and [`probes`]; the well-known strings in
//! [`labels`], [`annotations`], [`conditions`] and [`finalizers`]; the derived sandbox state in
//! [`state`]; CRD generation in [`crds`] / [`crds_yaml`]; PoolAutoscaler cron schedules in
//! [`cron`]. The rules several crates apply to these objects live beside them, one module each:
//! the public sandbox ID ([`public_id`]), the runtime ID ([`runtime_id`]), quantities
//! ([`quantity`]) and paused retention ([`retention`]).
//!
//! # Compatibility
//!
//! The JSON of these types is the public API. Field names, optionality, enums and defaults
//! follow the reference CRDs (OpenKruise Agents, commit `0b72c83a`), so existing YAML applies
//! unchanged; `tests/` checks the generated CRDs against the reference's field by field and
//! round-trips the reference samples.
//!
//! # Conventions
//!
//! - **Optional fields are `Option<T>`** and are omitted when `None`, so what was read is what
//!   is written back (an explicit `paused: false` stays). Accessors give the meaning of absence
//!   (`Sandbox::is_paused`, `CheckpointSpec::keeps_running`, ...).
//! - **Fields with a CRD schema default are not `Option`.** The API server fills them in; the
//!   same default is applied by serde when deserializing and by `Default`/constructors, so an
//!   object read from the embedded store, a file or a test looks exactly like one read from
//!   Kubernetes (e.g. `SandboxClaimSpec::replicas == 1`, `create_on_no_stock == true`).
//!   Defaults that the reference applies in a webhook or in controller code (SandboxSet
//!   `updateStrategy.maxUnavailable: 20%`, PoolAutoscaler windows) are *not* schema defaults;
//!   they are constants and accessor methods.
//! - **Durations are Go duration strings** kept as written; [`parse_go_duration`] gives them a
//!   value.
//! - **Enums are strings.** Spec enums with a schema `enum:` are closed Rust enums; every
//!   `status.phase` is an open enum with an `Other(String)` variant, because its schema is a plain
//!   string that another writer may extend.
//! - **Pod templates** (`spec.template`) are the typed `PodTemplateSpec`; PVC templates are
//!   [`common::PersistentVolumeClaimTemplate`]; patches (`SandboxUpdateOps.spec.patch`,
//!   `Checkpoint.status.podTemplateDelta`) are raw JSON. All four are schemaless in the CRD.
//! - **Conditions** are `metav1.Condition` lists keyed by `type`; see [`conditions`].

#[macro_use]
mod macros;

pub mod annotations;
pub mod checkpoint;
pub mod common;
pub mod conditions;
mod crd;
pub mod cron;
pub mod duration;
mod error;
pub mod finalizers;
pub mod fnv;
pub mod labels;
pub mod local_runtime;
pub mod poolautoscaler;
pub mod probes;
pub mod public_id;
pub mod quantity;
pub mod retention;
pub mod runtime_choice;
pub mod runtime_id;
pub mod sandbox;
pub mod sandboxclaim;
pub mod sandboxnode;
pub mod sandboxset;
pub mod sandboxtemplate;
pub mod sandboxupdateops;
mod schema;
pub mod startup_probe;
pub mod state;
pub mod strategic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trafficpolicy;

pub use checkpoint::{Checkpoint, CheckpointPhase, CheckpointSpec, CheckpointStatus};
pub use crd::{cluster_crds, crds, crds_yaml, try_crds_yaml};
pub use duration::{parse_go_duration, parse_go_duration_signed};
pub use error::ApiError;
pub use poolautoscaler::{PoolAutoscaler, PoolAutoscalerSpec, PoolAutoscalerStatus};
pub use sandbox::{Sandbox, SandboxPhase, SandboxSpec, SandboxStatus};
pub use sandboxclaim::{SandboxClaim, SandboxClaimPhase, SandboxClaimSpec, SandboxClaimStatus};
pub use sandboxnode::{SandboxNode, SandboxNodeSpec, SandboxNodeStatus};
pub use sandboxset::{SandboxSet, SandboxSetSpec, SandboxSetStatus};
pub use sandboxtemplate::{SandboxTemplate, SandboxTemplateSpec};
pub use sandboxupdateops::{
    SandboxUpdateOps, SandboxUpdateOpsPhase, SandboxUpdateOpsSpec, SandboxUpdateOpsStatus,
};
pub use state::{DerivedState, SandboxState, StateReason, recycle_requested, sandbox_state};
pub use trafficpolicy::{
    GlobalTrafficPolicy, GlobalTrafficPolicySpec, TrafficPolicy, TrafficPolicySpec,
    TrafficPolicyStatus,
};

/// The API group.
pub const GROUP: &str = "agents.kruise.io";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every kind: `agents.kruise.io/v1alpha1`.
pub const API_VERSION: &str = "agents.kruise.io/v1alpha1";
