//! The reaper: where the runtime's sandbox inits are waited for.
//!
//! The runtime process is a child subreaper ([`become_subreaper`], called by
//! [`LocalRuntime::open`](super::LocalRuntime::open)): any process of ours whose parent dies is
//! re-parented to us rather than to the host's PID 1, which on our machines reaps slowly (a killed
//! orphan stays a zombie ~1.7 s, see `runtime-feasibility.md` §1). That matters for inits we did
//! not clone ourselves: inits re-parented after a previous runtime process in our ancestry died,
//! and trees restored by `criu restore`, whose own process exits once the tree is running.
//!
//! Each known init has one watcher task ([`ExitWatch`]) waiting on its pidfd, which becomes
//! readable the moment the init exits; the task then reaps exactly that process with
//! `waitid(P_PIDFD, WNOHANG)` and publishes how it ended. Reaping by pidfd, never with
//! `waitpid(-1)`, leaves the exit statuses of other children of the process (a `criu` or
//! `std::process::Command` child elsewhere in the program) to their owners.
//!
//! Invariants: one watcher per live init; the watcher only reaps the process its pidfd names.
//!
//! Assumptions: pidfds (Linux ≥ 5.4 for poll, ≥ 5.4 for `waitid(P_PIDFD)`).
//!
//! Caveat: an orphan re-parented to us that is not a sandbox init is not reaped here; its
//! spawner's code must wait for it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::process::{WaitId, WaitIdOptions};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use oka_runtime_api::ExitInfo;

/// Makes the calling process a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`).
pub fn become_subreaper() -> io::Result<()> {
    tracing::debug!("prctl(PR_SET_CHILD_SUBREAPER)");
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
}

/// Watches one init; dropping it stops watching (but never kills anything).
#[derive(Debug)]
pub struct ExitWatch {
    rx: watch::Receiver<Option<ExitInfo>>,
    task: JoinHandle<()>,
}

impl ExitWatch {
    /// Starts watching the process behind `pidfd` (its own copy of the descriptor). Must be called
    /// inside a tokio runtime.
    pub fn start(pidfd: OwnedFd) -> io::Result<Self> {
        // SAFETY: the AsyncFd owns `pidfd` for its whole life and never exchanges it, so the raw
        // descriptor stays open and names the same pidfd until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable().await else {
                    let _ = tx.send(Some(ExitInfo::Unknown));
                    return;
                };
                match rustix::process::waitid(
                    WaitId::PidFd(fd.get_ref().as_fd()),
                    WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
                ) {
                    Ok(Some(status)) => {
                        let info = match (status.exit_status(), status.terminating_signal()) {
                            (Some(code), _) => ExitInfo::Code(code),
                            (None, Some(sig)) => ExitInfo::Signal(sig),
                            _ => ExitInfo::Unknown,
                        };
                        tracing::debug!(?info, "sandbox init reaped");
                        let _ = tx.send(Some(info));
                        return;
                    }
                    // Readable but not yet waitable: look again at the next wake-up.
                    Ok(None) => guard.clear_ready(),
                    // Not our child (re-adopted from a runtime that is not our ancestor): the
                    // pidfd being readable already means it exited; its parent reaps it.
                    Err(_) => {
                        let _ = tx.send(Some(ExitInfo::Unknown));
                        return;
                    }
                }
            }
        });
        Ok(Self { rx, task })
    }

    /// How the init ended, if it has.
    pub fn exited(&self) -> Option<ExitInfo> {
        *self.rx.borrow()
    }

    /// Waits until the init has exited and been reaped (if it was ours).
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.rx.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(ExitInfo::Unknown),
            Err(_) => ExitInfo::Unknown,
        }
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
