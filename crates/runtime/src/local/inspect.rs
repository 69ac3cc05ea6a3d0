//! `inspect`, and the bookkeeping every verb shares: noticing that an instance has ended,
//! releasing what it owned, and describing a slot as a [`SandboxStatus`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustix::mount::UnmountFlags;

use super::cgroup::CgroupPaths;
use super::state::{Phase, Resource, SandboxRecord, remove_dir_all_if_exists};
use super::{Inner, SlotGuard, blocking, from_cgroup, from_state};
use oka_runtime_api::{ResourceLimits, RuntimeError, SandboxId, SandboxState, SandboxStatus};

pub(super) async fn inspect(
    inner: &Arc<Inner>,
    id: &SandboxId,
) -> Result<SandboxStatus, RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else {
        return Ok(SandboxStatus::gone(id.clone()));
    };
    let guard = refresh(inner, guard).await?;
    let id = id.clone();
    let status = blocking(move || status(&id, &guard)).await?;
    Ok(status)
}

/// If the slot's instance has ended (its init exited), releases what it owned and records the
/// sandbox as stopped. The end of a hibernated sandbox's processes (killed by `criu dump`) is not
/// an exit: it stays hibernated and no exit is recorded.
pub(super) async fn refresh(
    inner: &Arc<Inner>,
    mut guard: SlotGuard,
) -> Result<SlotGuard, RuntimeError> {
    let exited = guard.live.as_ref().and_then(|l| l.exit.exited());
    let orphaned =
        guard.live.is_none() && guard.record.as_ref().is_some_and(|r| r.phase == Phase::Running);
    if exited.is_none() && !orphaned {
        return Ok(guard);
    }
    tracing::debug!(id = ?guard.record.as_ref().map(|r| r.id().clone()), ?exited, "sandbox processes ended");
    guard.live = None;
    let hibernated = guard.record.as_ref().is_some_and(|r| r.phase == Phase::Hibernated);
    if exited.is_some() && !hibernated {
        guard.last_exit = exited;
    }
    let phase = if hibernated { Phase::Hibernated } else { Phase::Stopped };
    let inner = inner.clone();
    blocking(move || {
        if let Some(record) = guard.record.as_mut() {
            release_instance(&inner, record, phase)?;
        }
        Ok(guard)
    })
    .await?
}

/// Kills whatever is left of the record's instance, removes its cgroups and host resources, and
/// writes the record in `phase` without an instance. Blocking.
pub(super) fn release_instance(
    inner: &Inner,
    record: &mut SandboxRecord,
    phase: Phase,
) -> Result<(), RuntimeError> {
    let timeout = inner.config.kill_timeout;
    if let Some(instance) = &record.instance {
        instance.cgroup.kill_all(timeout).map_err(from_cgroup)?;
        for resource in instance.resources.iter().rev() {
            remove_resource(resource)?;
        }
        instance.cgroup.remove(timeout).map_err(from_cgroup)?;
    }
    record.instance = None;
    record.phase = phase;
    inner.store.write(record).map_err(from_state)
}

/// Removes one recorded host resource; a resource that is already gone is fine.
pub(super) fn remove_resource(resource: &Resource) -> Result<(), RuntimeError> {
    match resource {
        Resource::Dir(path) => remove_dir_all_if_exists(path).map_err(from_state),
        Resource::HostMount(path) => match rustix::mount::unmount(path, UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => {
                Err(super::LocalError::Io { op: "unmount", path: path.clone(), source: e.into() }
                    .into())
            }
        },
        Resource::Veth(name) => {
            super::network::detach(name).map_err(|e| super::LocalError::Network(e).into())
        }
    }
}

/// Removes everything a record owns, then its state file and directory. Blocking.
pub(super) fn remove_all(inner: &Inner, record: &mut SandboxRecord) -> Result<(), RuntimeError> {
    if record.phase != Phase::Deleting {
        record.phase = Phase::Deleting;
        inner.store.write(record).map_err(from_state)?;
    }
    release_instance(inner, record, Phase::Deleting)?;
    for resource in record.resources.iter().rev() {
        remove_resource(resource)?;
    }
    inner.store.remove(&record.paths.dir).map_err(from_state)?;
    if let Some(lease) = &record.network {
        inner.leases.release(lease);
        // A sandbox that is gone must not keep a table alive; a failure here only leaves rules
        // for a link that no longer exists, removed with the next change or `open`.
        if let Err(e) = inner.firewall_forget(lease.index) {
            tracing::warn!(id = %record.id(), error = %e, "cannot update the firewall table");
        }
    }
    Ok(())
}

/// The status of a locked slot (reads the cgroup: frozen or not, usage). Blocking.
pub(super) fn status(id: &SandboxId, guard: &SlotGuard) -> SandboxStatus {
    let (status, running) = status_in_memory(id, guard);
    let limits = guard.record.as_ref().map(|r| r.spec.resources);
    with_cgroup(status, running, limits)
}

/// A slot's status from what the runtime holds in memory, without usage, and the cgroups of its
/// running instance: only their files tell whether it is frozen (then the sandbox is `Paused`,
/// not `Running`), see [`with_cgroup`].
pub(super) fn status_in_memory(
    id: &SandboxId,
    guard: &SlotGuard,
) -> (SandboxStatus, Option<CgroupPaths>) {
    let Some(record) = &guard.record else {
        return (
            SandboxStatus { last_exit: guard.last_exit, ..SandboxStatus::gone(id.clone()) },
            None,
        );
    };
    let state = match (record.phase, &guard.live) {
        (Phase::Running, Some(_)) => SandboxState::Running,
        (Phase::Hibernated, _) => SandboxState::Hibernated,
        _ => SandboxState::Stopped,
    };
    let instance = record.instance.as_ref().filter(|_| state == SandboxState::Running);
    let status = SandboxStatus {
        id: record.id().clone(),
        state,
        pid: instance.and_then(|i| i.pid).and_then(|p| u32::try_from(p).ok()),
        started_at: instance
            .and_then(|i| i.started_at_ms)
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        last_exit: guard.last_exit,
        usage: None,
        address: record
            .network
            .as_ref()
            .filter(|_| state != SandboxState::Stopped)
            .map(|lease| std::net::IpAddr::V4(lease.sandbox_addr)),
    };
    (status, instance.map(|i| i.cgroup.clone()))
}

/// Completes a [`status_in_memory`] from the running instance's cgroup files: `Paused` when it
/// is frozen, and its usage against `limits` when given. Blocking.
pub(super) fn with_cgroup(
    mut status: SandboxStatus,
    running: Option<CgroupPaths>,
    limits: Option<ResourceLimits>,
) -> SandboxStatus {
    if let Some(cgroup) = running {
        if cgroup.is_frozen().unwrap_or(false) {
            status.state = SandboxState::Paused;
        }
        status.usage = limits.map(|limits| cgroup.usage(limits));
    }
    status
}
