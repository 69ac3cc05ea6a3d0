//! The local node runtime: an implementation of `oka_runtime_api::Runtime` that makes each
//! sandbox out of Linux primitives on this machine, and the sandbox init that runs as PID 1 of
//! every sandbox.
//!
//! The seam itself (the `Runtime` trait, `SandboxSpec`, `RuntimeError`, the `Metered` wrapper)
//! is the `oka-runtime-api` crate, which callers depend on; only what builds a runtime (the
//! binary, reset, tests and benches) depends on this one. Nothing of the API crate is
//! re-exported here, so a caller cannot reach the seam through the implementation by accident.
//!
//! Architecture invariants:
//! - this crate depends on nothing of ours but `oka-runtime-api`; its input is a `SandboxSpec`,
//!   not a Kubernetes type;
//! - it is the only crate that makes namespace, mount and cgroup syscalls;
//! - its own failures reach callers as `RuntimeError::Backend` around a [`local::LocalError`],
//!   and a refused connect as `RuntimeError::PortClosed`.

pub mod init;
pub mod local;
