//! How the gateway reaches a port inside a sandbox: the [`Dialer`] seam.
//!
//! [`RuntimeDialer`] implements it with a [`Runtime`]'s `connect` (for the local runtime, a
//! socket opened inside the sandbox's network namespace); tests map sandboxes to loopback
//! listeners.

use std::io;
use std::sync::Arc;

use futures::future::BoxFuture;
use oka_api::Sandbox;
use oka_runtime_api::{Runtime, RuntimeError, SandboxId};
use tokio::net::TcpStream;

/// Why a dial failed; decides the answer the client gets.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// Nothing listens on the port (connection refused): E2B's "port is not open" 502.
    #[error("port {port} is not open")]
    PortClosed {
        /// The port dialed.
        port: u16,
    },
    /// The runtime has no instance for the sandbox: the "sandbox was not found" 502.
    #[error("the sandbox has no running instance: {0}")]
    SandboxGone(String),
    /// Anything else.
    #[error("dial failed: {0}")]
    Io(#[from] io::Error),
}

impl DialError {
    /// Classifies an IO error of a connect: refused means the port is closed.
    pub fn from_connect(port: u16, error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::ConnectionRefused {
            DialError::PortClosed { port }
        } else {
            DialError::Io(error)
        }
    }
}

/// Opens a TCP connection to a port of a running sandbox.
pub trait Dialer: Send + Sync + 'static {
    /// Connects to `port` inside `sandbox`.
    fn dial<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, Result<TcpStream, DialError>>;
}

/// Dials through a [`Runtime`]: `connect(runtime_id(sandbox), port)`.
///
/// The runtime's errors map to: no such instance, or one without processes (stopped,
/// hibernated) ⇒ [`DialError::SandboxGone`]; [`RuntimeError::PortClosed`] ⇒
/// [`DialError::PortClosed`]; anything else ⇒ [`DialError::Io`].
pub struct RuntimeDialer<R: ?Sized> {
    runtime: Arc<R>,
}

impl<R: ?Sized> RuntimeDialer<R> {
    /// A dialer over `runtime`.
    pub fn new(runtime: Arc<R>) -> Self {
        Self { runtime }
    }
}

impl<R: ?Sized> std::fmt::Debug for RuntimeDialer<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeDialer").finish_non_exhaustive()
    }
}

/// Classifies a runtime's connect error (see [`RuntimeDialer`]).
pub fn classify(port: u16, error: RuntimeError) -> DialError {
    match error {
        RuntimeError::NotFound(_) | RuntimeError::InvalidState { .. } => {
            DialError::SandboxGone(error.to_string())
        }
        RuntimeError::PortClosed { .. } => DialError::PortClosed { port },
        other => DialError::Io(io::Error::other(other.to_string())),
    }
}

impl<R: Runtime + ?Sized + 'static> Dialer for RuntimeDialer<R> {
    fn dial<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, Result<TcpStream, DialError>> {
        Box::pin(async move {
            let id = oka_api::runtime_id::runtime_id(sandbox)
                .map_err(|e| e.to_string())
                .and_then(|id| SandboxId::new(id).map_err(|e| e.to_string()))
                .map_err(DialError::SandboxGone)?;
            self.runtime.connect(&id, port).await.map_err(|e| classify(port, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `oka serve` holds its runtime as `Arc<dyn Runtime>`; that must make a dialer.
    #[allow(dead_code)]
    fn dialer_of_dyn_runtime(runtime: Arc<dyn Runtime>) -> Arc<dyn Dialer> {
        Arc::new(RuntimeDialer::new(runtime))
    }

    #[test]
    fn runtime_errors_are_classified() {
        let id = SandboxId::new("default--sbx").unwrap();
        assert!(matches!(
            classify(1, RuntimeError::NotFound(id.clone())),
            DialError::SandboxGone(_)
        ));
        assert!(matches!(
            classify(8080, RuntimeError::PortClosed { id: id.clone(), port: 8080 }),
            DialError::PortClosed { port: 8080 }
        ));
        // A backend's failure is no closed port, even when it wraps a refused connect: only the
        // runtime knows which of its calls was the dial.
        let backend = RuntimeError::backend(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(matches!(classify(8080, backend), DialError::Io(_)));
        assert!(matches!(
            DialError::from_connect(7, io::Error::from(io::ErrorKind::ConnectionRefused)),
            DialError::PortClosed { port: 7 }
        ));
        assert!(matches!(
            DialError::from_connect(7, io::Error::from(io::ErrorKind::TimedOut)),
            DialError::Io(_)
        ));
    }
}
