//! `list`: every sandbox the runtime knows, for re-adoption by the controllers and their
//! periodic look for changed instances.
//!
//! It runs every few seconds over every sandbox, so it reads as little as it can: under each
//! sandbox's lock only what is in memory, then, in one blocking pass over all of them, one
//! cgroup file per running sandbox (is it frozen?). Usage, a few files more per sandbox, is left
//! to `inspect`.

use std::sync::Arc;

use super::inspect::{refresh, status_in_memory, with_cgroup};
use super::{Inner, blocking};
use oka_runtime_api::{RuntimeError, SandboxState, SandboxStatus};

pub(super) async fn list(inner: &Arc<Inner>) -> Result<Vec<SandboxStatus>, RuntimeError> {
    let ids: Vec<_> =
        inner.slots.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
    let mut listed = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(guard) = inner.lock(&id, false).await else { continue };
        let guard = refresh(inner, guard).await?;
        let (status, running) = status_in_memory(&id, &guard);
        if status.state != SandboxState::Gone {
            listed.push((status, running));
        }
    }
    blocking(move || {
        listed.into_iter().map(|(status, running)| with_cgroup(status, running, None)).collect()
    })
    .await
}
