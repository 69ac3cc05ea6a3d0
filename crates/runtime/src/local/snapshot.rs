//! `snapshot`, `delete_snapshot` and `create_from_snapshot`: checkpoint a running sandbox without
//! stopping it, and start new sandboxes from that checkpoint.
//!
//! Layout under the state directory:
//!
//! ```text
//! <state>/snapshots/<name>/snapshot.json   the record (written before anything else is made)
//! <state>/snapshots/<name>/images/         the CRIU images
//! <state>/snapshots/<name>/upper/          a copy of the sandbox's writable layer
//! <state>/snapshots/<name>/log/            CRIU's work directory (the dump log)
//! ```
//!
//! # Expected flow
//!
//! Snapshot (a running or paused sandbox, its slot locked throughout):
//! 1. create `<name>/` and write the record (`complete: false`), then `images/` and `log/`;
//! 2. freeze the sandbox (unless it is paused already), so its memory and its writable layer are
//!    taken at one instant;
//! 3. `criu dump --leave-running` through the freezer cgroup (`--freeze-cgroup`: CRIU leaves the
//!    cgroup in the state it found it, frozen), with the same options as hibernation;
//! 4. `cp -a` of the writable layer (ownership, modes, xattrs and overlayfs whiteouts kept) to
//!    `upper/`;
//! 5. thaw the sandbox if step 2 froze it; record the snapshot complete.
//!
//! On failure the sandbox is thawed (if we froze it) and the snapshot directory removed.
//!
//! Create from a snapshot (`ensure` of a new sandbox id whose spec has `from_snapshot`):
//! 1. refuse a spec whose network mode differs from the source's (the images hold `eth0` or not);
//!    an outbound clone takes a network lease of its own ([`super::network::Leases`]); write the
//!    new sandbox's record (phase `Creating`, the lease, its directory and checkpoint work
//!    directory as resources, the snapshot's lower layers), make `work/` and `rootfs/`, copy the
//!    snapshot's `upper/` to the sandbox's `upper/`;
//! 2. record it `Hibernated` with a complete checkpoint whose images are the snapshot's;
//! 3. the restore of hibernation (`hibernate.rs`) brings it up in fresh namespaces with the new
//!    sandbox's root and cgroups (`--cgroup-root` of the new id); the images are only read, so
//!    any number of clones restore from one snapshot, at once or later. An outbound clone's
//!    `eth0` comes back with the source's address (the checkpoint records it): the restore
//!    recreates the veth pair under the clone's host-end name, moves `eth0` to the clone's own
//!    address and default route, writes the clone's egress chain (its source's policy at the
//!    snapshot, until one of its own is set: a clone is never more open than its source) and
//!    only then raises the host end. The source's connections are
//!    closed in the clone (`--tcp-close`: a clone must not speak for its source's connections,
//!    and could not: its address differs); listeners on `0.0.0.0` or loopback keep listening.
//!
//! On failure the new sandbox is removed entirely.
//!
//! # Guarantees
//!
//! - A snapshot directory whose record is missing or not complete is removed by `open`.
//! - A clone whose create crashed before its restore (phase `Creating`) is removed by `open`; one
//!   that crashed during its restore is left hibernated (restore it, or delete it).
//!
//! # Caveats
//!
//! - Only sandboxes in the host user namespace can be snapshotted and cloned: a remapped one's
//!   layer holds its own ids.
//! - An outbound clone's processes see their address change under them: a socket bound to the
//!   source's address (not `0.0.0.0`) stays bound to an address the clone no longer has, and a
//!   program that cached its address keeps the old one.
//! - A clone keeps the original's hostname (the UTS namespace is restored from the images).
//! - Every snapshot is a full dump plus a full copy of the writable layer (no reflinks on ext4).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::criu::{DumpRequest, TcpMode};
use super::hibernate::{criu_mounts, restore_blocking};
use super::inspect::{refresh, remove_all, status};
use super::state::{
    CheckpointRecord, ExternalMount, Phase, Resource, STATE_VERSION, SandboxPaths, SandboxRecord,
    io_err, remove_dir_all_if_exists,
};
use super::{Inner, LocalError, SlotGuard, blocking, from_cgroup, from_state};
use oka_runtime_api::{
    NetworkMode, Operation, RuntimeError, SandboxId, SandboxSpec, SandboxStatus, SnapshotInfo,
    SnapshotName, UserNamespace,
};

const RECORD: &str = "snapshot.json";

/// The record of one snapshot, `<state>/snapshots/<name>/snapshot.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotRecord {
    version: u32,
    name: SnapshotName,
    source: SandboxId,
    /// Whether the images and the layer copy are complete.
    complete: bool,
    /// Lower layers of the source's overlay, uppermost first.
    lower: Vec<PathBuf>,
    external_mounts: Vec<ExternalMount>,
    stdio: Vec<(i32, String)>,
    command_pid: Option<i32>,
    image_bytes: u64,
    created_at_ms: u64,
    /// The source's `eth0` address if it was outbound (its clones must be outbound too: the
    /// images hold the link); `None` for a loopback-only source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source_addr: Option<Ipv4Addr>,
    /// The source's egress policy when the snapshot was taken: a clone starts under it, so it
    /// is never more open than its source until a policy of its own is set.
    #[serde(default)]
    source_egress: Option<oka_runtime_api::EgressPolicy>,
}

impl SnapshotRecord {
    fn info(&self, dir: &Path) -> SnapshotInfo {
        SnapshotInfo {
            name: self.name.clone(),
            source: self.source.clone(),
            location: dir.display().to_string(),
            image_bytes: self.image_bytes,
            created_at: UNIX_EPOCH + Duration::from_millis(self.created_at_ms),
        }
    }
}

fn snapshots_root(inner: &Inner) -> PathBuf {
    inner.config.state_dir.join("snapshots")
}

fn read_record(dir: &Path) -> Result<SnapshotRecord, RuntimeError> {
    let path = dir.join(RECORD);
    let body = std::fs::read(&path).map_err(|e| from_state(io_err("read", &path)(e)))?;
    serde_json::from_slice(&body).map_err(|source| {
        let source = std::io::Error::new(std::io::ErrorKind::InvalidData, source);
        LocalError::Io { op: "decode snapshot record", path, source }.into()
    })
}

fn write_record(dir: &Path, record: &SnapshotRecord) -> Result<(), RuntimeError> {
    use std::io::Write;
    let tmp = dir.join("snapshot.json.tmp");
    let body = serde_json::to_vec_pretty(record).map_err(|e| {
        let source = std::io::Error::other(e);
        LocalError::Io { op: "encode snapshot record", path: tmp.clone(), source }
    })?;
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(RECORD))?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|source| LocalError::Io { op: "write", path: tmp.clone(), source }.into())
}

fn mkdir(dir: &Path, mode: u32) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(|source| {
        LocalError::Io { op: "create directory", path: dir.to_owned(), source }.into()
    })
}

/// `cp -a from to` (`to` must not exist): ownership, modes, xattrs, device nodes (overlayfs
/// whiteouts) and hard links kept.
fn copy_tree(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg("--reflink=auto")
        .arg("--")
        .arg(from)
        .arg(to)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| LocalError::Io { op: "run cp", path: from.to_owned(), source })?;
    if out.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    let source = std::io::Error::other(format!("cp -a to {}: {message}", to.display()));
    Err(LocalError::Io { op: "copy writable layer", path: from.to_owned(), source }.into())
}

fn unsupported(operation: Operation, spec: &SandboxSpec) -> Option<RuntimeError> {
    let reason = if spec.user_namespace != UserNamespace::Host {
        "sandboxes in a user namespace cannot be snapshotted and cloned yet"
    } else if spec.mounts.iter().any(|m| {
        !matches!(
            m.source,
            oka_runtime_api::MountSource::EmptyDir {
                medium: oka_runtime_api::Medium::Memory { .. },
                ..
            }
        )
    }) {
        // A clone would bind the original's directories (or a host path) from the snapshot.
        "sandboxes with volumes other than memory emptyDirs cannot be snapshotted and cloned yet"
    } else {
        return None;
    };
    Some(RuntimeError::Unsupported { operation, reason: reason.into() })
}

/// Removes snapshot directories without a complete record (a crash during a snapshot). Blocking.
pub(super) fn remove_incomplete(state_dir: &Path) -> Result<(), RuntimeError> {
    let root = state_dir.join("snapshots");
    let Ok(entries) = std::fs::read_dir(&root) else { return Ok(()) };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !read_record(&dir).is_ok_and(|r| r.complete) {
            tracing::warn!(?dir, "incomplete snapshot: removing it");
            remove_dir_all_if_exists(&dir).map_err(from_state)?;
        }
    }
    Ok(())
}

pub(super) async fn snapshot(
    inner: &Arc<Inner>,
    id: &SandboxId,
    name: &SnapshotName,
) -> Result<SnapshotInfo, RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    let guard = refresh(inner, guard).await?;
    let (inner2, id2, name2) = (inner.clone(), id.clone(), name.clone());
    blocking(move || snapshot_blocking(&inner2, &id2, &name2, &guard)).await?
}

fn snapshot_blocking(
    inner: &Inner,
    id: &SandboxId,
    name: &SnapshotName,
    guard: &SlotGuard,
) -> Result<SnapshotInfo, RuntimeError> {
    let Some(record) = guard.record.as_ref() else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    if record.phase != Phase::Running || guard.live.is_none() {
        let state = status(id, guard).state;
        return Err(RuntimeError::InvalidState {
            id: id.clone(),
            state,
            operation: Operation::Snapshot,
        });
    }
    if let Some(e) = unsupported(Operation::Snapshot, &record.spec) {
        return Err(e);
    }
    let dir = snapshots_root(inner).join(name.as_str());
    match read_record(&dir) {
        Ok(existing) if existing.complete && existing.source == *id => {
            return Ok(existing.info(&dir));
        }
        Ok(existing) if existing.complete => {
            let source = std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("snapshot {name} exists, taken of {}", existing.source),
            );
            return Err(LocalError::Io { op: "create snapshot", path: dir, source }.into());
        }
        // An earlier attempt that did not finish.
        _ => remove_dir_all_if_exists(&dir).map_err(from_state)?,
    }
    let setup = inner.criu(Operation::Snapshot)?;
    let Some(instance) = record.instance.as_ref() else {
        return Err(LocalError::Task("running sandbox without an instance".into()).into());
    };
    let Some(pid) = instance.pid.and_then(|p| u32::try_from(p).ok()) else {
        return Err(LocalError::Task("running sandbox without an init pid".into()).into());
    };
    let created_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut snap = SnapshotRecord {
        version: STATE_VERSION,
        name: name.clone(),
        source: id.clone(),
        complete: false,
        lower: record.lower.clone(),
        external_mounts: instance.external_mounts.clone(),
        stdio: vec![],
        command_pid: instance.command_pid,
        image_bytes: 0,
        created_at_ms,
        source_addr: record.network.as_ref().map(|l| l.sandbox_addr),
        source_egress: record.egress.clone(),
    };
    mkdir(&snapshots_root(inner), 0o700)?;
    mkdir(&dir, 0o700)?;
    let result = (|| -> Result<(), RuntimeError> {
        write_record(&dir, &snap)?;
        let (images, log) = (dir.join("images"), dir.join("log"));
        mkdir(&images, 0o700)?;
        mkdir(&log, 0o700)?;
        let cgroup = &instance.cgroup;
        let timeout = inner.config.kill_timeout;
        let was_frozen = cgroup.is_frozen().map_err(from_cgroup)?;
        if !was_frozen {
            cgroup.freeze(timeout).map_err(from_cgroup)?;
        }
        let dumped = (|| -> Result<(), RuntimeError> {
            let mut req = DumpRequest::new(pid, &images);
            req.work_dir = Some(log.clone());
            req.leave_running = true;
            req.external_mounts = criu_mounts(&snap.external_mounts);
            req.network_lock = setup.network_lock;
            req.tcp = TcpMode::Close;
            req.skip_in_flight = true;
            req.freeze_cgroup = cgroup.freezer_dir().map(Path::to_path_buf);
            for controller in inner.cgroups.dump_controllers() {
                req.extra_args.push("--cgroup-dump-controller".into());
                req.extra_args.push(controller.into());
            }
            req.timeout = Some(inner.config.criu_timeout);
            tracing::debug!(%id, %name, pid, "criu dump --leave-running");
            let report = setup
                .criu
                .dump(&req)
                .map_err(|source| LocalError::Criu { id: id.clone(), source })?;
            snap.stdio = report
                .stdio
                .iter()
                .filter(|(fd, key)| matches!(fd, 1 | 2) && key.starts_with("pipe:"))
                .cloned()
                .collect();
            snap.image_bytes = report.image_bytes;
            copy_tree(&record.paths.upper, &dir.join("upper"))
        })();
        if !was_frozen {
            let thawed = cgroup.thaw(timeout).map_err(from_cgroup);
            dumped?;
            thawed?;
        } else {
            dumped?;
        }
        snap.complete = true;
        write_record(&dir, &snap)
    })();
    if let Err(e) = result {
        if let Err(e) = remove_dir_all_if_exists(&dir) {
            tracing::warn!(%id, %name, error = %e, "removing a failed snapshot");
        }
        return Err(e);
    }
    tracing::debug!(%id, %name, image_bytes = snap.image_bytes, "snapshot taken");
    Ok(snap.info(&dir))
}

pub(super) async fn delete_snapshot(
    inner: &Arc<Inner>,
    name: &SnapshotName,
) -> Result<(), RuntimeError> {
    let dir = snapshots_root(inner).join(name.as_str());
    blocking(move || remove_dir_all_if_exists(&dir).map_err(from_state)).await?
}

pub(super) async fn create_from_snapshot(
    inner: &Arc<Inner>,
    spec: &SandboxSpec,
    name: &SnapshotName,
) -> Result<SandboxStatus, RuntimeError> {
    spec.validate()?;
    if let Some(e) = unsupported(Operation::Clone, spec) {
        return Err(e);
    }
    let Some(guard) = inner.lock(&spec.id, true).await else {
        return Err(LocalError::Task("slot vanished while creating it".into()).into());
    };
    let guard = refresh(inner, guard).await?;
    if let Some(record) = &guard.record {
        if record.spec != *spec {
            return Err(RuntimeError::SpecMismatch(spec.id.clone()));
        }
        let phase = record.phase;
        drop(guard);
        // Made before: converge as for any sandbox.
        return match phase {
            Phase::Hibernated => super::hibernate::restore(inner, &spec.id).await,
            _ => super::ensure::ensure(inner, spec).await,
        };
    }
    let (inner2, spec2, name2) = (inner.clone(), spec.clone(), name.clone());
    let handle = tokio::runtime::Handle::current();
    blocking(move || {
        let _enter = handle.enter();
        let mut guard = guard;
        let result = clone_blocking(&inner2, &spec2, &name2, &mut guard);
        if result.is_err() {
            inner2.retire(&spec2.id, &mut guard);
        }
        result
    })
    .await?
}

/// Creates and restores a clone; on failure removes everything it made. Needs a tokio runtime
/// context (the exit watcher).
fn clone_blocking(
    inner: &Inner,
    spec: &SandboxSpec,
    name: &SnapshotName,
    guard: &mut SlotGuard,
) -> Result<SandboxStatus, RuntimeError> {
    let snap_dir = snapshots_root(inner).join(name.as_str());
    let snap = match read_record(&snap_dir) {
        Ok(s) if s.complete => s,
        _ => {
            let source = std::io::Error::new(std::io::ErrorKind::NotFound, "no such snapshot");
            return Err(LocalError::Io { op: "find snapshot", path: snap_dir, source }.into());
        }
    };
    let outbound = spec.network == NetworkMode::Outbound;
    if snap.source_addr.is_some() != outbound {
        let reason = if outbound {
            format!(
                "snapshot {name} was taken of a loopback-only sandbox: its clones cannot be outbound"
            )
        } else {
            format!(
                "snapshot {name} was taken of an outbound sandbox: its clones must be outbound too"
            )
        };
        return Err(RuntimeError::Unsupported { operation: Operation::Clone, reason });
    }
    let id = &spec.id;
    let paths = SandboxPaths::new(inner.store.sandbox_dir(id));
    // A clone is a new sandbox: a lease of its own, never its source's address.
    let network =
        if outbound { Some(inner.leases.take().map_err(LocalError::from)?) } else { None };
    let work_dir = paths.checkpoint();
    let mut record = SandboxRecord {
        version: STATE_VERSION,
        spec: spec.clone(),
        phase: Phase::Creating,
        created: false,
        paths: paths.clone(),
        lower: snap.lower.clone(),
        resources: vec![Resource::Dir(paths.dir.clone()), Resource::Dir(work_dir.clone())],
        instance: None,
        checkpoint: None,
        network,
        egress: snap.source_egress.clone(),
    };
    if let Err(e) = inner.store.write(&record) {
        if let Some(lease) = &record.network {
            inner.leases.release(lease);
        }
        return Err(from_state(e));
    }
    let made = (|| -> Result<(), RuntimeError> {
        mkdir(&paths.work, 0o700)?;
        mkdir(&paths.rootfs, 0o755)?;
        mkdir(&work_dir, 0o700)?;
        copy_tree(&snap_dir.join("upper"), &paths.upper)?;
        record.checkpoint = Some(CheckpointRecord {
            dir: work_dir.clone(),
            images: snap_dir.join("images"),
            complete: true,
            external_mounts: snap.external_mounts.clone(),
            stdio: snap.stdio.clone(),
            command_pid: snap.command_pid,
            image_bytes: Some(snap.image_bytes),
            sandbox_addr: snap.source_addr,
        });
        record.phase = Phase::Hibernated;
        inner.store.write(&record).map_err(from_state)
    })();
    if let Err(e) = made {
        let _ = remove_all(inner, &mut record);
        return Err(e);
    }
    guard.record = Some(record);
    if let Err(e) = restore_blocking(inner, id, guard) {
        if let Some(record) = guard.record.as_mut()
            && let Err(e) = remove_all(inner, record)
        {
            tracing::warn!(%id, error = %e, "removing a failed clone");
        }
        guard.record = None;
        return Err(e);
    }
    if let Some(record) = guard.record.as_mut() {
        record.created = true;
        inner.store.write(record).map_err(from_state)?;
    }
    tracing::debug!(%id, snapshot = %name, "sandbox created from snapshot");
    Ok(status(id, guard))
}
