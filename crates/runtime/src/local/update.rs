//! `update`: change a sandbox in place, as far as Linux lets a running sandbox change.
//!
//! Expected flow: lock the slot; a spec equal to the recorded one changes nothing; a spec that
//! differs only in its resource limits gets them written to the sandbox's cgroups (when it has
//! processes; a stopped or hibernated sandbox gets them when it starts again), then the record
//! takes the new spec, so the next `ensure` with it matches. Anything else that differs (the
//! command, environment, root, network, user namespace) cannot change under running processes
//! and is refused, naming the fields, with nothing changed.
//!
//! A memory limit below what the sandbox uses now is refused by the kernel; the limits already
//! written stay, the record does not change, and the error says why.

use std::sync::Arc;

use super::inspect::refresh;
use super::{Inner, blocking, from_cgroup, from_state};
use crate::{Operation, RuntimeError, SandboxSpec};

/// The fields of `new` that differ from `old` and cannot change in place.
pub(super) fn fixed_differences(old: &SandboxSpec, new: &SandboxSpec) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if old.process != new.process {
        fields.push("process (command, args, environment, working directory, user)");
    }
    if old.root != new.root {
        fields.push("root filesystem");
    }
    if old.hostname != new.hostname {
        fields.push("hostname");
    }
    if old.network != new.network {
        fields.push("network");
    }
    if old.user_namespace != new.user_namespace {
        fields.push("user namespace");
    }
    if old.from_snapshot != new.from_snapshot {
        fields.push("snapshot");
    }
    fields
}

pub(super) async fn update(inner: &Arc<Inner>, spec: &SandboxSpec) -> Result<bool, RuntimeError> {
    spec.validate()?;
    let Some(guard) = inner.lock(&spec.id, false).await else {
        return Err(RuntimeError::NotFound(spec.id.clone()));
    };
    let mut guard = refresh(inner, guard).await?;
    let Some(record) = guard.record.as_ref() else {
        return Err(RuntimeError::NotFound(spec.id.clone()));
    };
    if record.spec == *spec {
        return Ok(false);
    }
    let fixed = fixed_differences(&record.spec, spec);
    if !fixed.is_empty() {
        return Err(RuntimeError::Unsupported {
            operation: Operation::Update,
            reason: format!(
                "only resource limits change in place; this change also touches the {}",
                fixed.join(", ")
            ),
        });
    }
    if let Some(controller) = inner.cgroups.missing_for(&spec.resources) {
        return Err(RuntimeError::Unsupported {
            operation: Operation::Update,
            reason: format!(
                "the {controller} limit needs the {controller} cgroup controller, which this \
                 runtime's cgroup hierarchy does not offer"
            ),
        });
    }
    let new = spec.clone();
    let inner2 = Arc::clone(inner);
    blocking(move || -> Result<(), RuntimeError> {
        let Some(record) = guard.record.as_mut() else { return Ok(()) };
        if let Some(instance) = &record.instance {
            instance.cgroup.update(&record.spec.resources, &new.resources).map_err(from_cgroup)?;
        }
        record.spec = new;
        inner2.store.write(record).map_err(from_state)
    })
    .await??;
    tracing::debug!(id = %spec.id, "sandbox limits updated in place");
    Ok(true)
}
