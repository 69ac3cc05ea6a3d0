//! The error every [`Runtime`](crate::Runtime) method returns.
//!
//! One variant per failure a caller can act on (not found, bad spec, wrong state, unsupported,
//! a closed port), plus the implementation's own error, boxed and opaque, as
//! [`RuntimeError::Backend`]: callers match variants, never an implementation's types. Messages
//! are lower case, carry the id or path that failed, and end without a period.

use std::error::Error;

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
    /// The sandbox's command started but its startup check ([`crate::StartupCheck`]) failed
    /// `failureThreshold` times, or the command ended before the check passed; the command was
    /// ended. The message is the kubelet's (`Startup probe failed: …`) with the check, its exit
    /// code and the last lines of its output.
    #[error("sandbox {id}: {message}")]
    StartupCheckFailed {
        /// Which sandbox.
        id: SandboxId,
        /// What the check said.
        message: String,
    },
    /// Nothing listens on the port inside the sandbox (the connection was refused): the
    /// sandbox runs, its server does not (yet). The gateway answers E2B's "port is not open".
    #[error("sandbox {id}: nothing listens on port {port} (connection refused)")]
    PortClosed {
        /// Which sandbox.
        id: SandboxId,
        /// The port dialed.
        port: u16,
    },
    /// The implementation failed to talk to what runs the sandboxes (for the local runtime the
    /// kernel or the file system); its own error is the source, opaque to callers.
    #[error(transparent)]
    Backend(Box<dyn Error + Send + Sync + 'static>),
}

impl RuntimeError {
    /// Whether trying the same call again later may succeed without changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::NotFound(_)
            | Self::InvalidSpec(_)
            | Self::SpecMismatch(_)
            | Self::Unsupported { .. }
            | Self::CommandFailed { .. }
            | Self::StartupCheckFailed { .. } => false,
            Self::InvalidState { .. } | Self::PortClosed { .. } | Self::Backend(_) => true,
        }
    }

    /// An implementation's own failure, as [`RuntimeError::Backend`].
    pub fn backend(error: impl Error + Send + Sync + 'static) -> Self {
        Self::Backend(Box::new(error))
    }

    /// The implementation's error inside a [`RuntimeError::Backend`], when it is an `E`: for the
    /// implementation's own tests and logs, not for callers of the trait.
    pub fn backend_error<E: Error + 'static>(&self) -> Option<&E> {
        match self {
            Self::Backend(error) => error.downcast_ref::<E>(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("kernel said no")]
    struct Kernel;

    #[test]
    fn backend_errors_stay_reachable_by_their_implementation() {
        let error = RuntimeError::backend(Kernel);
        assert!(error.backend_error::<Kernel>().is_some());
        assert!(error.backend_error::<std::io::Error>().is_none());
        assert_eq!(error.to_string(), "kernel said no");
        assert!(error.is_retryable());
    }

    #[test]
    fn a_closed_port_is_its_own_variant() {
        let id = SandboxId::new("s").expect("valid id");
        let error = RuntimeError::PortClosed { id, port: 8080 };
        assert!(error.is_retryable());
        assert!(error.backend_error::<Kernel>().is_none());
        assert_eq!(
            error.to_string(),
            "sandbox s: nothing listens on port 8080 (connection refused)"
        );
    }
}
