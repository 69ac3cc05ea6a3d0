//! `delete`: remove a sandbox and everything it owns.
//!
//! Expected flow: record phase `Deleting` (so a crash part-way is finished at the next open);
//! SIGKILL the init and thaw (no grace: callers wanting one call `stop` first); wait for it to be
//! reaped; kill stragglers and remove the cgroups; remove the directories; remove the state file
//! and the sandbox directory; take the slot out of the map.

use std::sync::Arc;
use std::time::Duration;

use super::inspect::remove_all;
use super::stop::end_processes;
use super::{Inner, blocking};
use oka_runtime_api::{RuntimeError, SandboxId};

pub(super) async fn delete(inner: &Arc<Inner>, id: &SandboxId) -> Result<(), RuntimeError> {
    inner.cancel_startup_check(id);
    let Some(guard) = inner.lock(id, false).await else { return Ok(()) };
    if guard.record.is_none() {
        return Ok(());
    }
    let guard = end_processes(inner, guard, Duration::ZERO).await?;
    let inner2 = inner.clone();
    let mut guard = blocking(move || {
        let mut guard = guard;
        if let Some(record) = guard.record.as_mut() {
            remove_all(&inner2, record)?;
        }
        guard.record = None;
        Ok::<_, RuntimeError>(guard)
    })
    .await??;
    inner.retire(id, &mut guard);
    tracing::debug!(%id, "sandbox deleted");
    Ok(())
}
