//! `resume`: thaw a paused sandbox. Resuming a running sandbox finds it thawed and does nothing.

use std::sync::Arc;

use super::pause::live_cgroup;
use super::{Inner, blocking, from_cgroup};
use oka_runtime_api::{Operation, RuntimeError, SandboxId};

pub(super) async fn resume(inner: &Arc<Inner>, id: &SandboxId) -> Result<(), RuntimeError> {
    let cgroup = live_cgroup(inner, id, Operation::Resume).await?;
    let timeout = inner.config.kill_timeout;
    blocking(move || if cgroup.is_frozen()? { cgroup.thaw(timeout) } else { Ok(()) })
        .await?
        .map_err(from_cgroup)?;
    tracing::debug!(%id, "sandbox resumed");
    Ok(())
}
