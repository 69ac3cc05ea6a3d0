//! `list`: every sandbox the runtime knows, for re-adoption by the controllers.

use std::sync::Arc;

use super::inspect::{refresh, status};
use super::{Inner, blocking};
use crate::{RuntimeError, SandboxState, SandboxStatus};

pub(super) async fn list(inner: &Arc<Inner>) -> Result<Vec<SandboxStatus>, RuntimeError> {
    let ids: Vec<_> =
        inner.slots.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(guard) = inner.lock(&id, false).await else { continue };
        let guard = refresh(inner, guard).await?;
        let id2 = id.clone();
        let st = blocking(move || status(&id2, &guard)).await?;
        if st.state != SandboxState::Gone {
            out.push(st);
        }
    }
    Ok(out)
}
