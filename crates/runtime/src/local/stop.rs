//! `stop`: end a sandbox's processes and keep its writable layer.
//!
//! Expected flow: SIGTERM to the init (which forwards it to the command's process group), thaw
//! if paused so the signal can be handled, wait up to the grace period; then SIGKILL (the kernel
//! ends the whole PID namespace with its init), thaw, wait; then release the cgroups and record
//! the sandbox stopped. Stopping a hibernated sandbox discards its checkpoint and records it
//! stopped.

use std::sync::Arc;
use std::time::Duration;

use rustix::process::Signal;

use super::hibernate::discard_checkpoint;
use super::inspect::{refresh, release_instance};
use super::state::Phase;
use super::{Inner, SlotGuard, blocking};
use oka_runtime_api::{RuntimeError, SandboxId};

pub(super) async fn stop(
    inner: &Arc<Inner>,
    id: &SandboxId,
    grace: Duration,
) -> Result<(), RuntimeError> {
    inner.cancel_startup_check(id);
    let Some(guard) = inner.lock(id, false).await else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    let guard = refresh(inner, guard).await?;
    if guard.record.is_none() {
        return Err(RuntimeError::NotFound(id.clone()));
    }
    let mut guard = end_processes(inner, guard, grace).await?;
    if guard.record.as_ref().is_some_and(|r| matches!(r.phase, Phase::Running | Phase::Hibernated))
    {
        let inner2 = inner.clone();
        blocking(move || match guard.record.as_mut() {
            Some(record) => {
                // A hibernated sandbox's checkpoint is discarded: a later ensure starts afresh.
                discard_checkpoint(&inner2, record)?;
                release_instance(&inner2, record, Phase::Stopped)
            }
            None => Ok(()),
        })
        .await??;
    }
    tracing::debug!(%id, "sandbox stopped");
    Ok(())
}

/// Ends the slot's live instance, if any: SIGTERM and `grace` first when `grace` is not zero,
/// then SIGKILL. Returns once the init has exited and been reaped.
pub(super) async fn end_processes(
    inner: &Arc<Inner>,
    mut guard: SlotGuard,
    grace: Duration,
) -> Result<SlotGuard, RuntimeError> {
    let cgroup = guard.record.as_ref().and_then(|r| r.instance.as_ref()).map(|i| i.cgroup.clone());
    let kill_timeout = inner.config.kill_timeout;
    let Some(live) = guard.live.as_mut() else { return Ok(guard) };
    let mut ended = false;
    if !grace.is_zero() {
        let _ = rustix::process::pidfd_send_signal(&live.pidfd, Signal::TERM);
        // A paused sandbox must run to handle the signal.
        if let Some(cg) = cgroup.clone() {
            let _ = blocking(move || cg.thaw(kill_timeout)).await?;
        }
        ended = tokio::time::timeout(grace, live.exit.wait()).await.is_ok();
    }
    if !ended {
        let _ = rustix::process::pidfd_send_signal(&live.pidfd, Signal::KILL);
        // A frozen process only dies once thawed.
        if let Some(cg) = cgroup {
            let _ = blocking(move || cg.thaw(kill_timeout)).await?;
        }
        if tokio::time::timeout(kill_timeout, live.exit.wait()).await.is_err() {
            tracing::warn!(timeout = ?kill_timeout, "sandbox init did not exit after SIGKILL");
        }
    }
    let exit = live.exit.exited();
    guard.live = None;
    guard.last_exit = exit.or(guard.last_exit);
    Ok(guard)
}
