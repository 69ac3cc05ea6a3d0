//! When a sandbox is gone for the gateway, so that it answers E2B's not-found 502.
//!
//! When a command stream or a file transfer breaks, the E2B SDKs send `GET /health` to the
//! sandbox through the gateway to tell a killed sandbox from a network failure: only a 502 whose
//! message says the sandbox "was not found" reads as killed (the Python SDK then raises
//! `SandboxNotRunningException`, "killed or reached its end of life"); "port is not open" or
//! "failed to reach" read as a running sandbox that cannot be reached. The same message on a
//! request itself (a file upload whose upstream died) reads the same way. So every answer
//! about a sandbox that was killed must be that one:
//!
//! - before forwarding, from the route table: a sandbox being deleted, handed back to its pool
//!   (killed with recycling on) or recycling is [`killed`], never dialed, never waited on;
//! - after a failure (the dial failed, or the connection broke before the response head):
//!   the route table follows the store's watch and may not have heard of the kill yet, so the
//!   store itself is asked ([`confirm`]); a sandbox that no longer [`serves`] the request makes
//!   the answer the not-found one.
//!
//! A stream that breaks after its response head went out is not answered at all: the client's
//! connection is closed without the body's end (see `fast` and hyper), which the SDKs read as
//! the transport failure that starts their health probe.

use std::sync::Arc;

use jiff::Timestamp;
use oka_api::{Sandbox, SandboxPhase, SandboxState, recycle_requested, sandbox_state};
use oka_store::Store;
use tracing::debug;

use crate::Inner;
use crate::error::Reject;
use crate::table::route_id;

/// The sandbox was killed: it is being deleted, or was handed back to its pool (the manager's
/// kill of a sandbox whose template recycles) and is recycling or about to. (Every request
/// asks: the cheap tests come first.)
pub fn killed(sandbox: &Sandbox) -> bool {
    sandbox.metadata.deletion_timestamp.is_some()
        || sandbox.phase() == Some(&SandboxPhase::Recycling)
        || recycle_requested(sandbox)
}

/// Whether `fresh` (the store's current object) still serves requests for `id` that were
/// routed to `routed`: the same object, still claimed under `id`, not killed and running.
pub fn serves(fresh: &Sandbox, routed: &Sandbox, id: &str, now: Timestamp) -> bool {
    fresh.metadata.uid == routed.metadata.uid
        && route_id(fresh).as_deref() == Some(id)
        && !killed(fresh)
        && sandbox_state(fresh, now).state == SandboxState::Running
}

/// The answer to a request for `id` that failed to reach `sandbox` with `reject`: the
/// not-found 502 when the store says the sandbox no longer [`serves`] it, else `reject`
/// itself. Only a closed port or an unreachable sandbox is looked at; a store that cannot be
/// read leaves `reject` as it is.
pub(crate) async fn confirm<S: Store>(
    inner: &Arc<Inner<S>>,
    sandbox: &Sandbox,
    reject: Reject,
) -> Reject {
    let id = match &reject {
        Reject::PortClosed { sandbox_id, .. } | Reject::Unreachable { sandbox_id, .. } => {
            sandbox_id.clone()
        }
        _ => return reject,
    };
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let name = sandbox.metadata.name.as_deref().unwrap_or_default();
    let gone = match inner.store.get::<Sandbox>(namespace, name).await {
        Ok(fresh) => !serves(&fresh, sandbox, &id, Timestamp::now()),
        Err(e) if e.is_not_found() => true,
        Err(e) => {
            debug!(sandbox = %id, error = %e, "reading the sandbox after a failed request");
            false
        }
    };
    if gone {
        debug!(sandbox = %id, refused = ?reject, "the sandbox was killed: not found");
        return Reject::NotFound { sandbox_id: id };
    }
    reject
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;
    use oka_api::{annotations, labels};

    use super::*;

    fn running(id: &str) -> oka_api::testing::SandboxBuilder {
        Sandbox::test()
            .name("sbx")
            .claimed()
            .label(labels::SANDBOX_ID, id)
            .phase(SandboxPhase::Running)
            .ready()
    }

    #[test]
    fn a_sandbox_is_killed_when_deleting_or_handed_back_to_its_pool() {
        let cases = [
            (running("a").build(), false),
            (running("a").deleting().build(), true),
            (
                running("a")
                    .annotation(annotations::CLEANUP_ENABLED, "true")
                    .annotation(annotations::CLEANUP, "true")
                    .build(),
                true,
            ),
            (running("a").annotation(annotations::CLEANUP_ENABLED, "true").build(), false),
            (running("a").phase(SandboxPhase::Recycling).build(), true),
        ];
        for (sandbox, want) in cases {
            assert_eq!(killed(&sandbox), want, "{sandbox:#?}");
        }
    }

    #[test]
    fn only_the_same_running_claimed_sandbox_still_serves() {
        let now = Timestamp::now();
        let routed = running("a").build();
        let mut recreated = running("a").build();
        recreated.metadata.uid = Some("another-uid".into());
        let cases = [
            ("the same", running("a").build(), true),
            ("deleting", running("a").deleting().build(), false),
            ("recreated under its name", recreated, false),
            ("claimed under another id", running("b").build(), false),
            ("paused", running("a").paused().build(), false),
            (
                "past its end",
                running("a").shutdown_at(now - SignedDuration::from_secs(1)).build(),
                false,
            ),
        ];
        for (what, fresh, want) in cases {
            assert_eq!(serves(&fresh, &routed, "a", now), want, "{what}");
        }
    }
}
