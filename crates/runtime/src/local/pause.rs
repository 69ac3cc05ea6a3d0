//! `pause`: freeze every process of a sandbox (the cgroup freezer); memory stays resident.
//!
//! Freezing writes no state file and keeps no flag: the freezer itself is the record (see the
//! module invariants), so a crash or a cancelled call between the freeze and any bookkeeping
//! loses nothing. Pausing a paused sandbox finds it frozen and does nothing.

use std::sync::Arc;

use super::cgroup::CgroupPaths;
use super::inspect::{refresh, status};
use super::{Inner, SlotGuard, blocking, from_cgroup};
use oka_runtime_api::{Operation, RuntimeError, SandboxId, SandboxState};

pub(super) async fn pause(inner: &Arc<Inner>, id: &SandboxId) -> Result<(), RuntimeError> {
    let cgroup = live_cgroup(inner, id, Operation::Pause).await?;
    let timeout = inner.config.kill_timeout;
    blocking(move || {
        if cgroup.is_frozen()? {
            return Ok(());
        }
        cgroup.freeze(timeout).inspect_err(|_| {
            // Never leave a half-frozen sandbox behind.
            let _ = cgroup.thaw(timeout);
        })
    })
    .await?
    .map_err(from_cgroup)?;
    tracing::debug!(%id, "sandbox paused");
    Ok(())
}

/// The cgroups of a sandbox that has processes, or the error `operation` reports otherwise.
pub(super) async fn live_cgroup(
    inner: &Arc<Inner>,
    id: &SandboxId,
    operation: Operation,
) -> Result<CgroupPaths, RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    let guard: SlotGuard = refresh(inner, guard).await?;
    let cgroup = guard
        .live
        .as_ref()
        .and(guard.record.as_ref())
        .and_then(|r| r.instance.as_ref())
        .map(|i| i.cgroup.clone());
    match cgroup {
        Some(cgroup) => Ok(cgroup),
        None => {
            let state = status(id, &guard).state;
            if state == SandboxState::Gone {
                return Err(RuntimeError::NotFound(id.clone()));
            }
            Err(RuntimeError::InvalidState { id: id.clone(), state, operation })
        }
    }
}
