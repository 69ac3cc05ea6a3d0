//! `connect`: a TCP connection to `127.0.0.1:port` inside a sandbox.
//!
//! A socket belongs to the network namespace it was created in, for life. A short-lived helper
//! thread enters the sandbox's network namespace (`setns` on the init's pidfd, no pid-reuse race)
//! and creates a non-blocking socket there; the thread then exits, so no thread of the runtime is
//! ever left in a foreign namespace (tokio's workers never are). The connect itself runs on tokio
//! and the stream is returned to the caller. No address leaves the sandbox's loopback.
//!
//! No network namespace is pinned on the host (no nsfs bind mount to leak): the init's pidfd is
//! the handle, and `setns(pidfd, CLONE_NEWNET)` cannot enter the wrong namespace after pid reuse.
//!
//! Invariant: a thread that entered a sandbox's namespace never runs anything else.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::thread::{ThreadNameSpaceType, move_into_thread_name_spaces};
use tokio::net::{TcpSocket, TcpStream};

use super::inspect::{refresh, status};
use super::{Inner, LocalError};
use crate::{Operation, RuntimeError, SandboxId, SandboxState};

pub(super) async fn connect(
    inner: &Arc<Inner>,
    id: &SandboxId,
    port: u16,
) -> Result<TcpStream, RuntimeError> {
    let sandbox_err = |op: &'static str| {
        let id = id.clone();
        move |source: std::io::Error| -> RuntimeError {
            LocalError::Sandbox { id, op, source }.into()
        }
    };
    let pidfd = {
        let Some(guard) = inner.lock(id, false).await else {
            return Err(RuntimeError::NotFound(id.clone()));
        };
        let guard = refresh(inner, guard).await?;
        match &guard.live {
            Some(live) => live.pidfd.try_clone().map_err(sandbox_err("dup pidfd"))?,
            None => {
                let state = status(id, &guard).state;
                if state == SandboxState::Gone {
                    return Err(RuntimeError::NotFound(id.clone()));
                }
                return Err(RuntimeError::InvalidState {
                    id: id.clone(),
                    state,
                    operation: Operation::Connect,
                });
            }
        }
    };
    let socket = socket_in_namespace(pidfd)
        .await
        .map_err(sandbox_err("create socket in sandbox network"))?;
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    socket.connect(addr).await.map_err(sandbox_err("connect to 127.0.0.1 in sandbox"))
}

/// Creates a non-blocking TCP socket in the network namespace of the process behind `pidfd`.
async fn socket_in_namespace(pidfd: OwnedFd) -> std::io::Result<OwnedFd> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("oka-netns".into()).spawn(move || {
        let result = (|| {
            tracing::debug!("setns(pidfd, CLONE_NEWNET)");
            move_into_thread_name_spaces(pidfd.as_fd(), ThreadNameSpaceType::NETWORK)?;
            let fd = rustix::net::socket_with(
                AddressFamily::INET,
                SocketType::STREAM,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
                None,
            )?;
            Ok::<_, rustix::io::Errno>(fd)
        })();
        // The thread ends here, still in the sandbox's namespace; it is never reused.
        let _ = tx.send(result.map_err(std::io::Error::from));
    })?;
    rx.await.map_err(|_| std::io::Error::other("namespace helper thread died"))?
}
