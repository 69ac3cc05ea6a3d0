//! `connect`: a TCP connection to `127.0.0.1:port` inside a sandbox.
//!
//! A socket belongs to the network namespace it was created in, for life. One long-lived helper
//! thread, `oka-netns`, makes the sockets: for each request it enters the sandbox's network
//! namespace (`setns` on the init's pidfd, no pid-reuse race), creates a non-blocking socket
//! there, and returns to the host's namespace before it takes the next request. A thread that
//! could not return ends there, and the next request starts a new one, so no thread is ever left
//! in a foreign namespace to serve anything else (tokio's workers never enter one). The connect
//! itself runs on tokio and the stream is returned to the caller. No address leaves the
//! sandbox's loopback.
//!
//! One thread for all connects, rather than one per connect: spawning and ending a thread cost
//! more than the two `setns` calls, and every claim's `/init` and every new gateway connection
//! to a sandbox comes through here.
//!
//! No network namespace is pinned on the host (no nsfs bind mount to leak): the init's pidfd is
//! the handle, and `setns(pidfd, CLONE_NEWNET)` cannot enter the wrong namespace after pid reuse.
//!
//! Invariant: the helper thread runs nothing but socket creation, and never starts a request
//! outside the host's network namespace.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::thread::{ThreadNameSpaceType, move_into_thread_name_spaces};
use tokio::net::{TcpSocket, TcpStream};

use super::inspect::{refresh, status};
use super::{Inner, LocalError};
use oka_runtime_api::{Operation, RuntimeError, SandboxId, SandboxState};

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
    socket.connect(addr).await.map_err(|source| {
        if source.kind() == std::io::ErrorKind::ConnectionRefused {
            RuntimeError::PortClosed { id: id.clone(), port }
        } else {
            sandbox_err("connect to 127.0.0.1 in sandbox")(source)
        }
    })
}

/// A request to the helper thread: the pidfd whose network namespace the socket is for, and
/// where the socket (or the error) goes.
type Job = (OwnedFd, tokio::sync::oneshot::Sender<std::io::Result<OwnedFd>>);

/// The helper thread's queue; `None` until the first connect, or after the thread ended.
static HELPER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

/// Creates a non-blocking TCP socket in the network namespace of the process behind `pidfd`,
/// on the helper thread (started on first use, and again if it ended).
async fn socket_in_namespace(pidfd: OwnedFd) -> std::io::Result<OwnedFd> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let mut helper = HELPER.lock().unwrap_or_else(PoisonError::into_inner);
        let job = match helper.as_ref() {
            Some(queue) => queue.send((pidfd, tx)).err().map(|mpsc::SendError(job)| job),
            None => Some((pidfd, tx)),
        };
        if let Some(job) = job {
            let (queue, jobs) = mpsc::channel::<Job>();
            std::thread::Builder::new().name("oka-netns".into()).spawn(move || serve(&jobs))?;
            // The receiver lives until the thread ends: this send cannot fail.
            let _ = queue.send(job);
            *helper = Some(queue);
        }
    }
    rx.await.map_err(|_| std::io::Error::other("the namespace helper thread ended"))?
}

/// The helper thread: serves jobs until the queue closes or it cannot return to the host's
/// network namespace (then it ends; the jobs still queued are answered by their dropped
/// senders).
fn serve(jobs: &mpsc::Receiver<Job>) {
    let host = match rustix::fs::open(
        "/proc/thread-self/ns/net",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(host) => host,
        Err(error) => {
            tracing::warn!(%error, "cannot open the host's network namespace");
            return;
        }
    };
    while let Ok((pidfd, reply)) = jobs.recv() {
        let socket = socket_in(&pidfd);
        let back = move_into_thread_name_spaces(host.as_fd(), ThreadNameSpaceType::NETWORK);
        let _ = reply.send(socket.map_err(std::io::Error::from));
        if let Err(error) = back {
            tracing::error!(%error, "cannot return to the host's network namespace; the helper thread ends");
            return;
        }
    }
}

/// Enters the network namespace of the process behind `pidfd` and creates a socket there.
fn socket_in(pidfd: &OwnedFd) -> Result<OwnedFd, rustix::io::Errno> {
    move_into_thread_name_spaces(pidfd.as_fd(), ThreadNameSpaceType::NETWORK)?;
    rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
}
