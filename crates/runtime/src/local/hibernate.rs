//! `hibernate` and `restore`: checkpoint a sandbox's process tree with CRIU and bring it back.
//!
//! Not wired yet: the CRIU primitives are in [`super::criu`]. Both verbs already check that the
//! sandbox exists and is in a state where they apply, then answer
//! [`RuntimeError::Unsupported`], so callers can be written against the final signatures.
//!
//! Verified by hand on this layout (criu 4.2.1, a sandbox made by `ensure` running
//! `python3 -m http.server`): `criu dump --leave-running --network-lock skip --tcp-close` with
//! `--external mnt[<target>]:<key>` for every [`ExternalMount`](super::state::ExternalMount) of
//! the instance and `--external <pipe>` for its two
//! [`stdio_pipes`](super::state::InstanceRecord::stdio_pipes) succeeded (9.7 MiB of images);
//! `criu restore -d --root <overlay mounted on the host>` with `--external mnt[<key>]:<source>` and
//! `--inherit-fd fd[N]:<pipe>` brought back `oka-init run` and the server, which answered HTTP
//! 200 through its network namespace with its hostname intact. What the sandbox provides for it:
//! the init leads its own session, executes from inside the root (`/.oka/init`), holds no host
//! file (stdin is reopened inside), and closes its channel to the runtime once ready.
//!
//! Planned flow: hibernate = `criu dump` of the init (with `freeze_cgroup` when paused), images
//! under the sandbox directory (recorded as a resource before they are written), keep the
//! writable layer, release the instance, phase `Hibernated`; restore = mount the overlay on the
//! host (recorded as a `HostMount` before mounting), make the cgroups, `criu restore` into fresh
//! namespaces with new stdio pipes inherited under the old pipe keys, adopt the restored init
//! (pidfd; it is our child with `sibling`, or re-parented to us as the subreaper), detach the host
//! overlay mount, phase `Running`.

use std::sync::Arc;

use super::inspect::{refresh, status};
use super::{Inner, blocking};
use crate::{Operation, RuntimeError, SandboxId, SandboxState, SandboxStatus};

const NOT_YET: &str = "checkpoint and restore with CRIU are not implemented yet";

pub(super) async fn hibernate(inner: &Arc<Inner>, id: &SandboxId) -> Result<(), RuntimeError> {
    match current_state(inner, id).await? {
        SandboxState::Gone => Err(RuntimeError::NotFound(id.clone())),
        SandboxState::Hibernated => Ok(()),
        SandboxState::Running | SandboxState::Paused => Err(RuntimeError::Unsupported {
            operation: Operation::Hibernate,
            reason: NOT_YET.into(),
        }),
        state @ SandboxState::Stopped => Err(RuntimeError::InvalidState {
            id: id.clone(),
            state,
            operation: Operation::Hibernate,
        }),
    }
}

pub(super) async fn restore(
    inner: &Arc<Inner>,
    id: &SandboxId,
) -> Result<SandboxStatus, RuntimeError> {
    match current_state(inner, id).await? {
        SandboxState::Gone => Err(RuntimeError::NotFound(id.clone())),
        SandboxState::Hibernated => {
            Err(RuntimeError::Unsupported { operation: Operation::Restore, reason: NOT_YET.into() })
        }
        state => {
            Err(RuntimeError::InvalidState { id: id.clone(), state, operation: Operation::Restore })
        }
    }
}

async fn current_state(inner: &Arc<Inner>, id: &SandboxId) -> Result<SandboxState, RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else { return Ok(SandboxState::Gone) };
    let guard = refresh(inner, guard).await?;
    let id = id.clone();
    blocking(move || status(&id, &guard).state).await
}
