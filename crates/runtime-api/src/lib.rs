//! The Runtime seam: what the controllers, the gateway and the manager ask of a place that runs
//! sandboxes, and nothing of how one does it.
//!
//! A [`Runtime`] ensures, inspects, pauses, resumes, hibernates, restores, stops and deletes sandbox
//! instances, snapshots them and clones new ones from snapshots, lists them for re-adoption, and
//! opens connections to their ports. The controllers are written once against this trait; the
//! local runtime (`oka-runtime`'s `LocalRuntime`: Linux namespaces, overlayfs, cgroups and the
//! freezer on the machine itself) implements it, and a Kubernetes Pod implementation can sit
//! beside it later. This crate is the trait, its input ([`SandboxSpec`]), its answers
//! ([`SandboxStatus`], [`UpdateOutcome`], [`SnapshotInfo`]), its typed error ([`RuntimeError`],
//! with [`RuntimeError::PortClosed`] for callers that answer a closed port differently) and
//! [`metrics::Metered`], which times any runtime; it is split from the implementation the way
//! youki splits `libcontainer` from its command line, so its users never compile, link or see
//! an implementation.
//!
//! Architecture invariants:
//! - this crate depends on nothing of ours and makes no system call of its own (no `libc`, no
//!   `rustix`); its input is a [`SandboxSpec`], not a Kubernetes type;
//! - an implementation's own failures reach callers as [`RuntimeError::Backend`], opaque: a
//!   caller that must act on a failure gets a variant of its own here, never a downcast;
//! - every operation is idempotent and level-triggered: calling it again after a crash or a
//!   timeout converges on the same state (`ensure` twice is one sandbox, `delete` of a gone
//!   sandbox succeeds).
//!
//! Assumptions: callers serialise nothing themselves; operations on one sandbox are serialised
//! inside the runtime, operations on different sandboxes run in parallel.

pub mod egress;
pub mod error;
pub mod features;
pub mod metrics;
pub mod spec;
pub mod startup;
pub mod volume;

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

pub use egress::{
    Cidr, Destination, EgressAction, EgressError, EgressPolicy, EgressRule, Protocol,
};
pub use error::RuntimeError;
pub use spec::{
    Bandwidth, EnvVar, MAX_LAYERS, NetworkMode, ProcessSpec, ResourceLimits, RootFs, SandboxId,
    SandboxSpec, SpecError, User, UserNamespace,
};
pub use startup::{CheckAction, StartupCheck};
pub use volume::{HostPathKind, Medium, Mount, MountSource, Seccomp, Security, VolumeFile};

/// A place that runs sandboxes.
///
/// Every method is safe to call again after an error, a timeout or a crash of the caller.
/// Methods return when the operation has completed (for `ensure`: when the sandbox's init has
/// started the command).
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Creates the sandbox if it does not exist and starts it if it is stopped; returns its
    /// status. With [`SandboxSpec::from_snapshot`] a new sandbox is created from that snapshot
    /// (running, restored from its images into fresh namespaces and cgroups; a runtime without
    /// snapshots answers [`RuntimeError::Unsupported`]). Idempotent by `spec.id`: a running or
    /// paused sandbox is returned as it is. A
    /// different spec under an existing id is [`RuntimeError::SpecMismatch`].
    async fn ensure(&self, spec: &SandboxSpec) -> Result<SandboxStatus, RuntimeError>;

    /// The sandbox's current state; [`SandboxState::Gone`] if the runtime has no such sandbox.
    async fn inspect(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError>;

    /// Freezes every process of the sandbox; memory stays resident. A paused sandbox stays paused.
    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Thaws a paused sandbox. A running sandbox stays running.
    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Checkpoints the whole process tree (running or paused) to disk, keeps the writable layer,
    /// and ends the processes so their memory is freed. A hibernated sandbox stays hibernated;
    /// on failure the sandbox is left as it was.
    async fn hibernate(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Brings a hibernated sandbox back from its checkpoint into fresh namespaces with the same
    /// root, running; returns its status. A running or paused sandbox is returned as it is; on
    /// failure the sandbox stays hibernated.
    async fn restore(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError>;

    /// Ends the sandbox's processes (SIGTERM, then SIGKILL after `grace`) and keeps its writable
    /// layer, so a later `ensure` starts the command again on the same files. A hibernated
    /// sandbox's checkpoint is discarded.
    async fn stop(&self, id: &SandboxId, grace: Duration) -> Result<(), RuntimeError>;

    /// Removes the sandbox and everything it owns; processes are killed at once. Deleting a gone
    /// sandbox succeeds.
    async fn delete(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Every sandbox the runtime knows, including stopped and hibernated ones. Cheap enough to
    /// poll: the statuses carry no `usage` ([`Runtime::inspect`] has it).
    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError>;

    /// Opens a TCP connection to `127.0.0.1:port` inside the sandbox's network namespace. A port
    /// nothing listens on is [`RuntimeError::PortClosed`].
    async fn connect(&self, id: &SandboxId, port: u16) -> Result<TcpStream, RuntimeError>;

    /// Changes a sandbox to `spec` (same id) without restarting it, as far as that can be done
    /// live: today its resource limits (cgroup CPU, memory and PID limits, which apply at once).
    /// Returns what happened ([`UpdateOutcome`]); after [`UpdateOutcome::Updated`] the new spec
    /// is what a later `ensure` must give. A spec whose root filesystem differs (a container's
    /// new image) cannot change under running processes: [`UpdateOutcome::RestartRequired`],
    /// with nothing changed, and the caller restarts the sandbox on the new spec (delete, then
    /// `ensure`), as Kubernetes restarts a container whose image changed in place. A spec that
    /// differs in anything else is [`RuntimeError::Unsupported`], naming what differs, and
    /// changes nothing. The default answers [`RuntimeError::Unsupported`].
    async fn update(&self, spec: &SandboxSpec) -> Result<UpdateOutcome, RuntimeError> {
        let _ = spec;
        Err(RuntimeError::Unsupported {
            operation: Operation::Update,
            reason: "this runtime cannot change a sandbox in place".into(),
        })
    }

    /// Moves a running (or paused) sandbox onto `spec` (same id) with its processes kept: they
    /// are checkpointed (their memory with them), the root's lower layer and the limits become
    /// the new spec's, and they are restored on it, running. Only the root filesystem and the
    /// limits may differ: the processes are the old ones, so anything else is
    /// [`RuntimeError::Unsupported`], naming it, with nothing changed. A restore that fails on
    /// the new root is undone onto the old one. The default answers
    /// [`RuntimeError::Unsupported`].
    async fn checkpoint_restore(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let _ = spec;
        Err(RuntimeError::Unsupported {
            operation: Operation::Update,
            reason: "this runtime cannot move a sandbox onto a new root with its processes".into(),
        })
    }

    /// Checkpoints a running (or paused) sandbox's process tree and copies its writable layer
    /// into a snapshot named `name`; the sandbox goes on as it was. Idempotent by `name` for the
    /// same sandbox. The default answers [`RuntimeError::Unsupported`].
    async fn snapshot(
        &self,
        id: &SandboxId,
        name: &SnapshotName,
    ) -> Result<SnapshotInfo, RuntimeError> {
        let _ = (id, name);
        Err(RuntimeError::Unsupported {
            operation: Operation::Snapshot,
            reason: "this runtime has no snapshots".into(),
        })
    }

    /// Makes `policy` the egress policy of outbound sandbox `id` (see [`egress`]): it applies to
    /// new connections at once, is kept with the sandbox and applies again after a stop, a
    /// hibernation, a restart of the runtime's process and a restore. Idempotent. A
    /// loopback-only sandbox, which reaches nothing anyway, answers
    /// [`RuntimeError::Unsupported`]; so does a runtime without egress control (the default).
    async fn set_egress(&self, id: &SandboxId, policy: &EgressPolicy) -> Result<(), RuntimeError> {
        let _ = (id, policy);
        Err(RuntimeError::Unsupported {
            operation: Operation::Egress,
            reason: "this runtime cannot limit a sandbox's outbound connections".into(),
        })
    }

    /// Removes snapshot `name` (its images and writable layer). Removing a gone snapshot
    /// succeeds; sandboxes cloned from it are not affected.
    async fn delete_snapshot(&self, name: &SnapshotName) -> Result<(), RuntimeError> {
        let _ = name;
        Ok(())
    }
}

/// The name of a snapshot: checked like a [`SandboxId`] (a safe single path component).
pub type SnapshotName = SandboxId;

/// A snapshot a runtime holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: SnapshotName,
    /// The sandbox it was taken of.
    pub source: SandboxId,
    /// Where it lives (runtime-specific: the local runtime's snapshot directory).
    pub location: String,
    /// Size of the memory images, in bytes.
    pub image_bytes: u64,
    /// When it was taken.
    pub created_at: SystemTime,
}

/// What [`Runtime::update`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// The sandbox already has this spec: nothing changed.
    Unchanged,
    /// The spec changed live (resource limits); the processes run on.
    Updated,
    /// The change needs the sandbox's processes started again on the new spec (its root
    /// filesystem differs); nothing was changed. The reason says what differs.
    RestartRequired {
        /// What differs, for the caller's condition and log.
        reason: String,
    },
}

/// What a sandbox is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SandboxState {
    /// Its processes run.
    Running,
    /// Its processes are frozen; memory is resident.
    Paused,
    /// Its processes are checkpointed to disk and gone; the writable layer is kept.
    Hibernated,
    /// No processes; the writable layer is kept.
    Stopped,
    /// The runtime has no such sandbox.
    Gone,
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Hibernated => "hibernated",
            Self::Stopped => "stopped",
            Self::Gone => "gone",
        })
    }
}

/// A snapshot of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxStatus {
    /// Which sandbox.
    pub id: SandboxId,
    /// What it is doing.
    pub state: SandboxState,
    /// The host pid of its init while it has processes.
    pub pid: Option<u32>,
    /// When its current processes were started.
    pub started_at: Option<SystemTime>,
    /// How its last processes ended, when they ended while this runtime watched.
    pub last_exit: Option<ExitInfo>,
    /// Resource usage while it has processes.
    pub usage: Option<ResourceUsage>,
    /// Its address on the host's network, when it has one of its own (outbound networking);
    /// `None` for a loopback-only sandbox.
    pub address: Option<std::net::IpAddr>,
}

impl SandboxStatus {
    /// The status of a sandbox the runtime does not have.
    pub fn gone(id: SandboxId) -> Self {
        Self {
            id,
            state: SandboxState::Gone,
            pid: None,
            started_at: None,
            last_exit: None,
            usage: None,
            address: None,
        }
    }
}

/// How a sandbox's init ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitInfo {
    /// It exited with this code (the init passes on its command's code, or 128 + signal).
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
    /// It ended, but not as our child (after re-adoption), so the status is unknown.
    Unknown,
}

/// Resource usage of a sandbox, read from its cgroup; fields the cgroup layout does not offer are
/// `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// Memory charged to the sandbox, in bytes.
    pub memory_bytes: Option<u64>,
    /// Number of processes and threads.
    pub pids: Option<u64>,
    /// CPU time consumed.
    pub cpu: Option<Duration>,
    /// The limits in force.
    pub limits: ResourceLimits,
}

/// The operations of [`Runtime`], for errors and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`Runtime::ensure`].
    Ensure,
    /// [`Runtime::inspect`].
    Inspect,
    /// [`Runtime::pause`].
    Pause,
    /// [`Runtime::resume`].
    Resume,
    /// [`Runtime::hibernate`].
    Hibernate,
    /// [`Runtime::restore`].
    Restore,
    /// [`Runtime::stop`].
    Stop,
    /// [`Runtime::delete`].
    Delete,
    /// [`Runtime::list`].
    List,
    /// [`Runtime::connect`].
    Connect,
    /// [`Runtime::snapshot`] and [`Runtime::delete_snapshot`].
    Snapshot,
    /// [`Runtime::ensure`] of a sandbox from a snapshot.
    Clone,
    /// [`Runtime::update`].
    Update,
    /// [`Runtime::set_egress`].
    Egress,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ensure => "ensure",
            Self::Inspect => "inspect",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Hibernate => "hibernate",
            Self::Restore => "restore",
            Self::Stop => "stop",
            Self::Delete => "delete",
            Self::List => "list",
            Self::Connect => "connect",
            Self::Snapshot => "snapshot",
            Self::Clone => "clone",
            Self::Update => "update",
            Self::Egress => "set egress policy",
        })
    }
}
