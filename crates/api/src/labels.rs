//! Well-known label keys (and a few of their values), exactly as the reference writes them.

/// Origin pool (SandboxSet name) of a sandbox; kept after a claim, required for reuse.
pub const SANDBOX_POOL: &str = "agents.kruise.io/sandbox-pool";
/// The SandboxTemplate a pool sandbox was built from (`templateRef` name, else the pool's name).
pub const SANDBOX_TEMPLATE: &str = "agents.kruise.io/sandbox-template";
/// Claim state: `"false"` in the pool, `"true"` once claimed (also a printer column).
pub const SANDBOX_CLAIMED: &str = "agents.kruise.io/sandbox-claimed";
/// Name of the SandboxClaim that claimed the sandbox; removed on reuse.
pub const CLAIM_NAME: &str = "agents.kruise.io/claim-name";
/// The pool's `status.updateRevision` when the sandbox was created.
pub const TEMPLATE_HASH: &str = "agents.kruise.io/template-hash";
/// `"true"` on a sandbox kept after a failed claim, for debugging.
pub const RESERVED_FAILED_SANDBOX: &str = "agents.kruise.io/reserved-failed-sandbox";
/// The sandbox's name, on its pod template (TrafficPolicy selector) and on Checkpoints.
pub const SANDBOX_NAME: &str = "agents.kruise.io/sandbox-name";
/// `"true"`/`"false"`: whether the sandbox may reach the internet (GlobalTrafficPolicy selector).
pub const ALLOW_INTERNET_ACCESS: &str = "agents.kruise.io/allow-internet-access";
/// The authoritative short sandbox ID (else the legacy `<namespace>--<name>`). Claims may not set
/// it.
pub const SANDBOX_ID: &str = "agents.kruise.io/sandbox-id";
/// The SandboxUpdateOps upgrading the sandbox.
pub const UPDATE_OPS: &str = "agents.kruise.io/update-ops";
/// `"true"` when the sandbox's upgrade failed.
pub const UPGRADE_FAILED: &str = "agents.kruise.io/upgrade-failed";
/// The sandbox revision a pod was built from (pod label).
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// Marks pods created by the sandbox controller (label and annotation); value [`CREATED_BY_SANDBOX`].
pub const CREATED_BY: &str = "agents.kruise.io/created-by";
/// The value of [`CREATED_BY`].
pub const CREATED_BY_SANDBOX: &str = "sandbox";
/// The claim owner (claim UID or API user), on the pod template of a claimed sandbox.
pub const OWNER: &str = "agents.kruise.io/owner";
/// A Checkpoint's contents (sorted, `-`-joined) or a legacy type (`pod-info`, `upgrade`).
pub const CHECKPOINT_TYPE: &str = "agents.kruise.io/checkpoint-type";
/// Mirror of a Checkpoint's ID.
pub const CHECKPOINT_ID: &str = "agents.kruise.io/checkpoint-id";
/// oka extension: the SandboxNode a sandbox (or a Checkpoint, by its sandbox) is placed on,
/// on a cluster whose sandboxes run on oka's node agents; set once, by the placement.
pub const NODE_NAME: &str = "agents.kruise.io/node-name";

/// The owning Sandbox's `metadata.uid`, on its Pod (TrafficPolicies select Pods by it: a uid
/// always fits a label value, a sandbox name may not).
pub const SANDBOX_UID: &str = "agents.kruise.io/sandbox-uid";

/// The usual value of boolean labels.
pub const TRUE: &str = "true";
/// The usual value of boolean labels.
pub const FALSE: &str = "false";
