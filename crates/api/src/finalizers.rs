//! Finalizer names.

/// Added to a Sandbox on its first pause; removed when the pod is gone after deletion or after a
/// resume.
pub const SANDBOX: &str = "agents.kruise.io/sandbox";
/// Used by the (external) checkpoint controller on Checkpoints.
pub const CHECKPOINT: &str = "agents.kruise.io/checkpoint";
/// On a SandboxUpdateOps until its labels are cleaned off the sandboxes it touched.
pub const SANDBOX_UPDATE_OPS: &str = "agents.kruise.io/sandboxupdateops-protection";
