//! The error every [`Runtime`](crate::Runtime) method returns.
//!
//! One variant per failure a caller can act on (not found, bad spec, wrong state, unsupported),
//! plus the implementation's own error folded in transparently. Messages are lower case, carry
//! the id or path that failed, and end without a period.

use crate::local::LocalError;
use crate::{Operation, SandboxId, SandboxState, SpecError};

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The runtime has no sandbox with this id.
    #[error("sandbox {0} not found")]
    NotFound(SandboxId),
    /// The spec cannot be run; fix the spec.
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(#[from] SpecError),
    /// The sandbox exists with a different spec; delete it first or use another id.
    #[error("sandbox {0} already exists with a different spec")]
    SpecMismatch(SandboxId),
    /// The operation does not apply in the sandbox's current state.
    #[error("sandbox {id} is {state}: cannot {operation}")]
    InvalidState {
        /// Which sandbox.
        id: SandboxId,
        /// Its state.
        state: SandboxState,
        /// What was asked.
        operation: Operation,
    },
    /// This runtime cannot do this (yet, or on this machine).
    #[error("{operation} is not supported: {reason}")]
    Unsupported {
        /// What was asked.
        operation: Operation,
        /// Why not, and what would make it work.
        reason: String,
    },
    /// The sandbox started but its command could not be run (missing program, bad working
    /// directory, unknown user): a problem with the spec or the root filesystem.
    #[error("sandbox {id} failed to start its command: {message}")]
    CommandFailed {
        /// Which sandbox.
        id: SandboxId,
        /// What the sandbox init reported.
        message: String,
    },
    /// The local runtime failed to talk to the kernel or the file system.
    #[error(transparent)]
    Local(#[from] LocalError),
}

impl RuntimeError {
    /// Whether trying the same call again later may succeed without changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::NotFound(_)
            | Self::InvalidSpec(_)
            | Self::SpecMismatch(_)
            | Self::Unsupported { .. }
            | Self::CommandFailed { .. } => false,
            Self::InvalidState { .. } | Self::Local(_) => true,
        }
    }
}
