//! `hibernate` and `restore`: checkpoint a sandbox's process tree with CRIU, free its memory, and
//! bring it back into fresh namespaces on the same root.
//!
//! The CRIU command lines are built by [`super::criu`]; this module decides what to dump and
//! restore, keeps the write-ahead record ([`CheckpointRecord`]) and adopts the restored init.
//!
//! # Expected flow
//!
//! Hibernate (a running or paused sandbox; a hibernated one is left as it is):
//! 1. record the checkpoint (its directory as a sandbox-lifetime resource, the host binds and the
//!    init's stdio pipe keys from the instance) and write the state file, *then* create
//!    `<dir>/checkpoint/` (work directory: logs) and `<dir>/checkpoint/images/`;
//! 2. `criu dump` of the init: nftables network lock inside the sandbox (skip if this CRIU lacks
//!    libnftables: sandboxes are loopback-only), connections closed (`--tcp-close`, the host's
//!    own setns connections have their peer outside the tree), connections not yet accepted
//!    dropped (`--skip-in-flight`), every host bind declared `--external mnt[<target>]:<key>`;
//!    a paused sandbox is dumped through its freezer cgroup (`--freeze-cgroup`); only the cgroup
//!    hierarchies the sandbox has cgroups of its own in are dumped (`--cgroup-dump-controller`:
//!    in the others it sits in the runtime's cgroup, often a hierarchy's root, whose whole tree
//!    CRIU would otherwise dump and re-create on restore, resurrecting other sandboxes' removed
//!    cgroups). CRIU then kills the tree with SIGKILL;
//! 3. record the checkpoint complete with the stdio pipe keys CRIU saw, phase `Hibernated`;
//! 4. wait for the init to exit and reap it (it is our child unless re-adopted); the slot's exit
//!    watcher is dropped without recording an exit, so the kill is not a crash;
//! 5. remove the instance's cgroups (memory is freed with the processes; a hibernated sandbox
//!    owns no cgroup, like a stopped one) and record no instance.
//!
//! Restore (a hibernated sandbox; a running or paused one is left as it is):
//! 1. record an instance (its cgroup paths and the host overlay mount as a resource) with the phase
//!    still `Hibernated`, *then* make the cgroups with the spec's limits and mount the overlay
//!    (same lower, upper and work directories) at `<dir>/rootfs` on the host, private;
//! 2. make one fresh pipe per distinct stdio pipe key of the checkpoint; `criu restore -d` with
//!    `--root` the host overlay, `mnt[<key>]:<host path>` for each bind, `--inherit-fd
//!    fd[N]:<old key>` for each pipe's write end, `--cgroup-root <hierarchy>:<path>` for each
//!    hierarchy, and `--tcp-close`. CRIU makes new namespaces, so pids cannot clash with anything.
//!    The restored init is `criu`'s child and becomes ours when `criu` exits (the runtime is a
//!    child subreaper, see `reaper.rs`); not `--restore-sibling`, because then a restore that
//!    fails leaves its killed tasks as our zombies, which only `criu` knows;
//! 3. open a pidfd for the restored init (our child: its pid cannot be reused before we reap it)
//!    and start its exit watcher; detach the host overlay mount (the sandbox's mount namespace
//!    keeps its own reference); an outbound sandbox's veth pair was recreated by CRIU
//!    (`--external veth[eth0]:<host end>`, the host end recorded as an instance resource in 1):
//!    if the images hold another address than the lease's (a clone's images are its source's),
//!    move `eth0` to the lease's address and route; make sure the sandbox's egress chain is in
//!    the firewall (a no-op unless it is a clone's first start); address and raise its host end;
//! 4. record phase `Running` with the new pid, start time and stdio pipe keys and no checkpoint
//!    (re-adoption after a runtime restart works as for any sandbox); read the new pipes' read
//!    ends like a fresh sandbox's output; rename the spent checkpoint directory to
//!    `checkpoint.spent-*` and delete it in the background (off the restore's latency).
//!
//! # Guarantees
//!
//! - The state file names the checkpoint directory before it exists and the host overlay mount
//!   and cgroups of a restore before they exist; `open` cleans up after a crash at any point:
//!   - during a dump: if the init still runs, it is re-adopted and the partial checkpoint removed
//!     (a dump still running in an orphaned `criu` is waited for first: the init is traced);
//!     if it is gone and CRIU's `stats-dump` file exists, the dump completed: `Hibernated`;
//!   - during a restore: whatever was restored is killed, the host mount detached and the cgroups
//!     removed; the sandbox is `Hibernated` with its checkpoint intact (restore only reads it).
//! - A failed dump leaves the sandbox as it was (running or paused; CRIU unfreezes and unlocks
//!   the network on failure), its partial images removed and the log kept in the work directory.
//! - A failed restore leaves the sandbox hibernated: no restored process (and no zombie: CRIU's
//!   orphaned helpers are reaped by [`super::criu`]), no host mount, no cgroup.
//! - Errors from CRIU are [`LocalError::Criu`] with the `Error` lines of CRIU's log and its path;
//!   no CRIU binary (or one older than 4.2) is [`RuntimeError::Unsupported`].
//! - `delete` of a hibernated sandbox removes the images with the sandbox directory; `stop` of a
//!   hibernated sandbox discards the checkpoint and leaves it stopped; `ensure`, `pause`,
//!   `resume` and `connect` answer [`RuntimeError::InvalidState`] until it is restored.
//!
//! # Caveats
//!
//! - Every dump is a full dump (no soft-dirty tracking on our kernel): the images are about the
//!   size of the sandbox's anonymous memory plus its tmpfs contents.
//! - Established connections are restored closed: clients see a reset and reconnect.
//! - If the runtime is killed during a restore after CRIU brought the tree back, the restored
//!   processes may have run briefly (and written to the writable layer) before the next `open`
//!   kills them and the sandbox is hibernated again from the older memory image.
//! - If `criu` itself is killed during a dump (the timeout, or by hand), the nftables table that
//!   locks the sandbox's network may stay inside its namespace; the sandbox is then running but
//!   unreachable until deleted.
//! - The init binary (or, in a sandbox whose PID 1 is the agent runtime daemon, `oka-envd`) is
//!   mapped by the restored init: replacing the file the runtime was configured with between a
//!   dump and its restore may make the restore fail.
//! - CRIU reads every process's rlimits with `prlimit(2)`, which for a process of another uid
//!   needs `CAP_SYS_RESOURCE`: on hosts that withhold it (some containers), a
//!   sandbox with a process running as `user` (uid 1000) cannot be dumped (`Can't get rlimit`).
//! - CRIU probes the kernel at every start unless it can keep its cache in `/run/criu.kdat`,
//!   which it only does on a tmpfs `/run` (systemd hosts have one; without it the probe
//!   costs about 40 ms per dump and per restore).
//! - On cgroup v2, restore passes `--cgroup-root` without a controller on a pure v2 host and as
//!   `unified:` beside v1 hierarchies; `tests/cgroup_v2.rs` exercises the latter (the unified-only
//!   mode on hybrid hosts), a paused sandbox dumped through v2 `--freeze-cgroup` included.
//! - Sandboxes in a user namespace: CRIU dumps and recreates the namespace with its id maps;
//!   the host overlay for `--root` is mounted with `userxattr` like the sandbox's own, and the
//!   new cgroups are delegated to the mapped root again; `tests/userns.rs`.
//! - Outbound sandboxes: `eth0` is dumped with the namespace, the host end dies with it, and
//!   restore recreates the pair (`--external veth[eth0]:<host end>`); `tests/network.rs`.
//!
//! Alternatives considered: keeping the cgroups through hibernation would save two `mkdir`s per
//! restore but leave every hibernated sandbox holding kernel objects and its cgroup name claimed,
//! and "cgroups exist only while processes run" keeps re-adoption and leftover cleanup simple.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::mount::{MountPropagationFlags, UnmountFlags};
use rustix::pipe::PipeFlags;
use rustix::process::{Pid, PidfdFlags, Signal};

use super::criu::{
    self, CgroupRoot, Criu, CriuError, DumpRequest, InheritFd, NetworkLock, RestoreRequest, TcpMode,
};
use super::ensure::{drain, wait_exit};
use super::inspect::{refresh, release_instance, status};
use super::reaper::ExitWatch;
use super::state::{
    CheckpointRecord, ExternalMount, InstanceRecord, Phase, Resource, SandboxRecord,
    remove_dir_all_if_exists,
};
use super::{
    Inner, Live, LocalError, SlotGuard, blocking, from_cgroup, from_state, network, procfs,
};
use crate::init::protocol::OverlayPlan;
use crate::init::setup::mount_overlay;
use crate::init::syscalls::LinuxSyscalls;
use oka_runtime_api::{Operation, RuntimeError, SandboxId, SandboxState, SandboxStatus};

/// CRIU's file in the work directory that only a successful dump writes (after killing the tree).
const DUMP_STATS: &str = "stats-dump";

/// Name prefix of spent checkpoint directories awaiting removal, in the sandbox directory.
const SPENT_PREFIX: &str = "checkpoint.spent-";

/// The `criu` binary and how it locks a sandbox's network, found once per runtime.
#[derive(Debug, Clone)]
pub(super) struct CriuSetup {
    pub(super) criu: Criu,
    pub(super) network_lock: NetworkLock,
}

impl Inner {
    /// The checked `criu` binary, or [`RuntimeError::Unsupported`] for `operation` without one.
    /// Blocking (runs `criu --version` and a feature check the first time).
    pub(super) fn criu(&self, operation: Operation) -> Result<CriuSetup, RuntimeError> {
        if let Some(setup) = self.criu.get() {
            return Ok(setup.clone());
        }
        // The reason names the feature and how to turn it on (the one rule: `features.rs`).
        let unsupported = |e: CriuError, tried: Option<&std::path::Path>| {
            let reason = super::features::criu_off(&e, tried).to_string();
            RuntimeError::Unsupported { operation, reason }
        };
        let criu = match &self.config.criu_binary {
            Some(binary) => Criu::new(binary),
            None => Criu::locate().map_err(|e| unsupported(e, None))?,
        };
        let version = criu.version().map_err(|e| unsupported(e, Some(criu.binary())))?;
        if version < criu::MIN_VERSION {
            let binary = criu.binary().to_owned();
            return Err(unsupported(CriuError::TooOld { binary, found: version }, None));
        }
        let network_lock = match criu.supports("network_lock_nftables") {
            Ok(true) => NetworkLock::Nftables,
            // Sandboxes are loopback-only: nothing outside can send them packets mid-dump.
            _ => NetworkLock::Skip,
        };
        tracing::debug!(binary = %criu.binary().display(), %version, ?network_lock, "criu found");
        Ok(self.criu.get_or_init(|| CriuSetup { criu, network_lock }).clone())
    }
}

pub(super) async fn hibernate(inner: &Arc<Inner>, id: &SandboxId) -> Result<(), RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    let guard = refresh(inner, guard).await?;
    let (inner2, id2) = (inner.clone(), id.clone());
    blocking(move || hibernate_blocking(&inner2, &id2, guard)).await?
}

fn hibernate_blocking(
    inner: &Inner,
    id: &SandboxId,
    mut guard: SlotGuard,
) -> Result<(), RuntimeError> {
    let slot = &mut *guard;
    let has_live = slot.live.is_some();
    let Some(record) = slot.record.as_mut() else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    match (record.phase, has_live) {
        (Phase::Hibernated, _) => {
            // A hibernate that failed after its dump may have left the instance's cgroups.
            if record.instance.is_some() {
                release_instance(inner, record, Phase::Hibernated)?;
            }
            return Ok(());
        }
        (Phase::Running, true) => {}
        _ => {
            return Err(RuntimeError::InvalidState {
                id: id.clone(),
                state: SandboxState::Stopped,
                operation: Operation::Hibernate,
            });
        }
    }
    let setup = inner.criu(Operation::Hibernate)?;
    let t0 = Instant::now();
    let Some(instance) = record.instance.as_ref() else {
        return Err(LocalError::Task("running sandbox without an instance".into()).into());
    };
    let Some(pid) = instance.pid.and_then(|p| u32::try_from(p).ok()) else {
        return Err(LocalError::Task("running sandbox without an init pid".into()).into());
    };
    let frozen = instance.cgroup.is_frozen().map_err(from_cgroup)?;
    let freeze_cgroup =
        if frozen { instance.cgroup.freezer_dir().map(|p| p.to_path_buf()) } else { None };
    let dir = record.paths.checkpoint();
    let mut checkpoint = CheckpointRecord {
        dir: dir.clone(),
        images: dir.join("images"),
        complete: false,
        external_mounts: instance.external_mounts.clone(),
        stdio: [1, 2].into_iter().zip(instance.stdio_pipes.iter().cloned()).collect(),
        command_pid: instance.command_pid,
        image_bytes: None,
        sandbox_addr: record.network.as_ref().map(|l| l.sandbox_addr),
    };
    let resource = Resource::Dir(dir.clone());
    if !record.resources.contains(&resource) {
        record.resources.push(resource);
    }
    record.checkpoint = Some(checkpoint.clone());
    inner.store.write(record).map_err(from_state)?;

    // Images of an earlier failed attempt are of no use; its log goes with the next attempt.
    remove_dir_all_if_exists(&checkpoint.images).map_err(from_state)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|source| LocalError::Io { op: "create directory", path: dir.clone(), source })?;
    let mut req = DumpRequest::new(pid, &checkpoint.images);
    req.work_dir = Some(dir.clone());
    req.external_mounts = criu_mounts(&checkpoint.external_mounts);
    req.network_lock = setup.network_lock;
    req.tcp = TcpMode::Close;
    req.skip_in_flight = true;
    req.freeze_cgroup = freeze_cgroup;
    for controller in inner.cgroups.dump_controllers() {
        req.extra_args.push("--cgroup-dump-controller".into());
        req.extra_args.push(controller.into());
    }
    req.timeout = Some(inner.config.criu_timeout);
    tracing::debug!(%id, pid, frozen, images = %checkpoint.images.display(), "criu dump");
    // Dumping a tree frozen by cgroup v2's `cgroup.freeze` (`--freeze-cgroup`) has failed under
    // heavy load with a task CRIU could not seize ("Unseizable non-zombie ... state D"). CRIU
    // leaves the tree as it was, so that case falls back to thawing the sandbox and letting CRIU
    // stop the running tree itself, as it does for a running sandbox; a failure after that
    // freezes it again, so a paused sandbox stays paused.
    let mut dumped = setup.criu.dump(&req);
    let mut thawed = false;
    if let Err(error) = &dumped
        && req.freeze_cgroup.is_some()
        && is_unseizable(error)
    {
        tracing::info!(%id, %error, "criu could not seize the frozen tree; dumping it running");
        remove_dir_all_if_exists(&checkpoint.images).map_err(from_state)?;
        instance.cgroup.thaw(inner.config.kill_timeout).map_err(from_cgroup)?;
        thawed = true;
        req.freeze_cgroup = None;
        dumped = setup.criu.dump(&req);
    }
    if thawed
        && dumped.is_err()
        && let Err(e) = instance.cgroup.freeze(inner.config.kill_timeout)
    {
        tracing::warn!(%id, error = %e, "cannot freeze the sandbox again after a failed dump");
    }
    let report = match dumped {
        Ok(report) => report,
        Err(source) => {
            // CRIU resumes a tree it failed to dump and unlocks its network: the sandbox runs on.
            tracing::debug!(%id, error = %source, "criu dump failed, sandbox left running");
            let _ = remove_dir_all_if_exists(&checkpoint.images);
            record.checkpoint = None;
            if let Err(e) = inner.store.write(record) {
                tracing::warn!(%id, error = %e, "recording a failed dump");
            }
            return Err(LocalError::Criu { id: id.clone(), source }.into());
        }
    };
    let stdio: Vec<(i32, String)> = report
        .stdio
        .iter()
        .filter(|(fd, key)| matches!(fd, 1 | 2) && key.starts_with("pipe:"))
        .cloned()
        .collect();
    if stdio != checkpoint.stdio {
        tracing::debug!(%id, recorded = ?checkpoint.stdio, dumped = ?stdio, "init stdio differs from the record; using what CRIU saw");
    }
    checkpoint.stdio = stdio;
    checkpoint.complete = true;
    checkpoint.image_bytes = Some(report.image_bytes);
    record.checkpoint = Some(checkpoint);
    record.phase = Phase::Hibernated;
    inner.store.write(record).map_err(from_state)?;

    // CRIU killed the tree. The init must be gone (and reaped, when it is our child) before its
    // cgroups can go; its exit is the hibernation, not a crash, so no exit is recorded.
    if let Some(live) = slot.live.take()
        && !wait_exit(&live.pidfd, inner.config.kill_timeout)
    {
        tracing::warn!(%id, pid, "sandbox init still there after criu dump");
    }
    release_instance(inner, record, Phase::Hibernated)?;
    tracing::debug!(%id, dump = ?report.duration, total = ?t0.elapsed(), image_bytes = report.image_bytes, "sandbox hibernated");
    Ok(())
}

pub(super) async fn restore(
    inner: &Arc<Inner>,
    id: &SandboxId,
) -> Result<SandboxStatus, RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    let guard = refresh(inner, guard).await?;
    let (inner2, id2) = (inner.clone(), id.clone());
    let handle = tokio::runtime::Handle::current();
    blocking(move || {
        let _enter = handle.enter();
        let mut guard = guard;
        restore_blocking(&inner2, &id2, &mut guard)?;
        Ok(status(&id2, &guard))
    })
    .await?
}

/// What `criu restore` brought back.
struct Restored {
    pid: i32,
    pidfd: OwnedFd,
    start_time: Option<u64>,
    /// Read ends of the fresh stdio pipes, by stream name.
    readers: Vec<(&'static str, OwnedFd)>,
    /// CRIU's names of the fresh pipes, for the next hibernation.
    keys: Vec<String>,
}

/// Restores a hibernated sandbox; needs a tokio runtime context (the exit watcher).
pub(super) fn restore_blocking(
    inner: &Inner,
    id: &SandboxId,
    guard: &mut SlotGuard,
) -> Result<(), RuntimeError> {
    let slot = &mut **guard;
    let has_live = slot.live.is_some();
    let Some(record) = slot.record.as_mut() else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    match (record.phase, has_live) {
        (Phase::Running, true) => return Ok(()),
        (Phase::Hibernated, _) => {}
        _ => {
            return Err(RuntimeError::InvalidState {
                id: id.clone(),
                state: SandboxState::Stopped,
                operation: Operation::Restore,
            });
        }
    }
    let checkpoint = match &record.checkpoint {
        Some(c) if c.complete => c.clone(),
        _ => {
            let path = record.paths.checkpoint();
            let source =
                std::io::Error::new(std::io::ErrorKind::NotFound, "no complete checkpoint");
            return Err(LocalError::Io { op: "find checkpoint", path, source }.into());
        }
    };
    let setup = inner.criu(Operation::Restore)?;
    // Leftovers of a restore that failed half-way.
    if record.instance.is_some() {
        release_instance(inner, record, Phase::Hibernated)?;
    }
    let t0 = Instant::now();
    let cgroup = inner.cgroups.paths_for(id.as_str());
    let rootfs = record.paths.rootfs.clone();
    record.instance = Some(InstanceRecord {
        pid: None,
        start_time: None,
        started_at_ms: None,
        cgroup: cgroup.clone(),
        // CRIU recreates an outbound sandbox's veth pair under the recorded host-end name.
        resources: std::iter::once(Resource::HostMount(rootfs.clone()))
            .chain(record.network.iter().map(|l| Resource::Veth(l.host_if.clone())))
            .collect(),
        external_mounts: checkpoint.external_mounts.clone(),
        command_pid: checkpoint.command_pid,
        stdio_pipes: vec![],
    });
    inner.store.write(record).map_err(from_state)?;

    let restored = cgroup
        .create(&record.spec.resources)
        .and_then(|()| match record.spec.user_namespace {
            oka_runtime_api::UserNamespace::Host => Ok(()),
            oka_runtime_api::UserNamespace::Remapped { host_base, .. } => {
                cgroup.delegate(host_base)
            }
        })
        .map_err(from_cgroup)
        .and_then(|()| mount_root(record))
        .and_then(|()| run_restore(inner, id, &setup.criu, record, &checkpoint));
    let restored = match restored {
        Ok(r) => r,
        Err(e) => {
            undo_restore(inner, id, record, &checkpoint, None);
            return Err(e);
        }
    };
    let Restored { pid, pidfd, start_time, readers, keys } = restored;
    let finish = (|| -> Result<ExitWatch, RuntimeError> {
        let watch_fd = pidfd.try_clone().map_err(|source| LocalError::Sandbox {
            id: id.clone(),
            op: "dup pidfd",
            source,
        })?;
        let exit = ExitWatch::start(watch_fd).map_err(|source| LocalError::Sandbox {
            id: id.clone(),
            op: "watch pidfd",
            source,
        })?;
        // The sandbox's mount namespace holds its own reference to the overlay.
        tracing::debug!(%id, rootfs = %rootfs.display(), "umount -l host overlay");
        match rustix::mount::unmount(&rootfs, UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
            Err(e) => {
                let source = e.into();
                return Err(LocalError::Io { op: "unmount", path: rootfs.clone(), source }.into());
            }
        }
        if let Some(lease) = &record.network {
            // A clone's images hold its source's address; its own lease's goes on `eth0`
            // before the host end comes up, so no packet leaves with the source's address.
            if checkpoint.sandbox_addr != Some(lease.sandbox_addr) {
                network::readdress(lease, pidfd.as_fd()).map_err(LocalError::from)?;
            }
            // The sandbox's own chain (unchanged, and nothing written, for a hibernated one).
            let policy = record.egress.clone().unwrap_or_default();
            inner.firewall_set(lease.index, &lease.host_if, &policy).map_err(LocalError::from)?;
            network::configure_host_end(lease).map_err(LocalError::from)?;
            network::shape(lease, &record.spec.bandwidth).map_err(LocalError::from)?;
        }
        let Some(instance) = record.instance.as_mut() else {
            return Err(LocalError::Task("restore without an instance".into()).into());
        };
        instance.resources.retain(|r| !matches!(r, Resource::HostMount(_)));
        instance.pid = Some(pid);
        instance.start_time = start_time;
        instance.started_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        instance.stdio_pipes = keys;
        record.phase = Phase::Running;
        // The checkpoint is spent (its directory goes below, and stays a recorded resource).
        record.checkpoint = None;
        inner.store.write(record).map_err(from_state)?;
        Ok(exit)
    })();
    let exit = match finish {
        Ok(exit) => exit,
        Err(e) => {
            undo_restore(inner, id, record, &checkpoint, Some(&pidfd));
            return Err(e);
        }
    };
    for (stream, fd) in readers {
        drain(id.as_str().to_owned(), stream, fd);
    }
    slot.live = Some(Live { pidfd, exit });
    slot.last_exit = None;
    retire_checkpoint_dir(id, record);
    tracing::debug!(%id, pid, elapsed = ?t0.elapsed(), "sandbox restored");
    Ok(())
}

/// Moves a spent checkpoint directory out of the way and removes it on the blocking pool:
/// deleting images of hundreds of megabytes can take tens of milliseconds of I/O that nobody
/// needs to wait for. The moved directory stays inside the sandbox directory, so after a crash
/// `open` ([`remove_spent_checkpoints`]) or `delete` removes it. Needs a tokio runtime context.
fn retire_checkpoint_dir(id: &SandboxId, record: &SandboxRecord) {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let dir = record.paths.checkpoint();
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let spent = record.paths.dir.join(format!("{SPENT_PREFIX}{}-{n}", std::process::id()));
    match std::fs::rename(&dir, &spent) {
        Ok(()) => {
            let id = id.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = remove_dir_all_if_exists(&spent) {
                    tracing::warn!(%id, error = %e, "removing a spent checkpoint");
                }
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // Left in place: the next hibernate replaces the images, delete removes it.
        Err(e) => {
            tracing::warn!(%id, dir = %dir.display(), error = %e, "moving a spent checkpoint")
        }
    }
}

/// Removes the spent checkpoints a crash left in a sandbox directory. Blocking.
pub(super) fn remove_spent_checkpoints(record: &SandboxRecord) -> Result<(), RuntimeError> {
    let Ok(entries) = std::fs::read_dir(&record.paths.dir) else { return Ok(()) };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(SPENT_PREFIX) {
            remove_dir_all_if_exists(&entry.path()).map_err(from_state)?;
        }
    }
    Ok(())
}

/// Mounts the sandbox's overlay on the host at its `rootfs`, private (nothing propagates from it).
fn mount_root(record: &SandboxRecord) -> Result<(), RuntimeError> {
    let paths = &record.paths;
    let overlay = OverlayPlan {
        lower: record.lower.clone(),
        upper: paths.upper.clone(),
        work: paths.work.clone(),
        // A remapped sandbox's layer holds overlayfs' attributes as `user.overlay.*`.
        userxattr: record.spec.user_namespace != oka_runtime_api::UserNamespace::Host,
    };
    let io = |op: &'static str| {
        let path = paths.rootfs.clone();
        move |source| -> RuntimeError { LocalError::Io { op, path, source }.into() }
    };
    mount_overlay(&LinuxSyscalls, &paths.rootfs, &overlay).map_err(io("mount overlay"))?;
    tracing::debug!(rootfs = %paths.rootfs.display(), "mount --make-private");
    rustix::mount::mount_change(&paths.rootfs, MountPropagationFlags::PRIVATE)
        .map_err(|e| io("make mount private")(e.into()))
}

/// Runs `criu restore` for `record` with fresh stdio pipes; returns the adopted init.
fn run_restore(
    inner: &Inner,
    id: &SandboxId,
    criu: &Criu,
    record: &SandboxRecord,
    checkpoint: &CheckpointRecord,
) -> Result<Restored, RuntimeError> {
    let sandbox_err = |op: &'static str| {
        let id = id.clone();
        move |source: std::io::Error| -> RuntimeError {
            LocalError::Sandbox { id, op, source }.into()
        }
    };
    let mut inherit: Vec<InheritFd> = Vec::new();
    let mut readers = Vec::new();
    let mut keys = Vec::new();
    for (fd, key) in &checkpoint.stdio {
        // stdout and stderr on one pipe are one descriptor to CRIU.
        if inherit.iter().any(|i| i.key == *key) {
            continue;
        }
        let (r, w) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)
            .map_err(|e| sandbox_err("create stdio pipe")(e.into()))?;
        let st = rustix::fs::fstat(&w).map_err(|e| sandbox_err("stat stdio pipe")(e.into()))?;
        keys.push(format!("pipe:[{}]", st.st_ino));
        readers.push((if *fd == 2 { "stderr" } else { "stdout" }, r));
        inherit.push(InheritFd { fd: w, key: key.clone() });
    }
    let mut req = RestoreRequest::new(&checkpoint.images, &record.paths.rootfs);
    req.work_dir = Some(checkpoint.dir.clone());
    req.external_mounts = criu_mounts(&checkpoint.external_mounts);
    req.inherit_fds = inherit;
    req.cgroup_roots = inner
        .cgroups
        .hierarchy_paths(id.as_str())
        .into_iter()
        .map(|h| CgroupRoot { controller: h.controllers, path: h.path })
        .collect();
    if let Some(lease) = &record.network {
        // `eth0` is dumped with the namespace; its peer is recreated on the host under this name.
        req.extra_args.push(format!("veth[{}]:{}", network::SANDBOX_IF, lease.host_if).into());
        req.extra_args.insert(req.extra_args.len() - 1, "--external".into());
    }
    req.tcp = TcpMode::Close;
    req.sibling = false;
    req.timeout = Some(inner.config.criu_timeout);
    tracing::debug!(%id, images = %checkpoint.images.display(), "criu restore");
    let report = criu.restore(req).map_err(|source| LocalError::Criu { id: id.clone(), source })?;
    let pid = i32::try_from(report.pid)
        .map_err(|_| sandbox_err("read restored pid")(std::io::ErrorKind::InvalidData.into()))?;
    // `criu` has exited, so the restored init has been re-parented to us (a child subreaper): its
    // pid cannot be reused before we reap it, so opening a pidfd by pid is race-free.
    let pidfd = match Pid::from_raw(pid)
        .ok_or(rustix::io::Errno::SRCH)
        .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()))
    {
        Ok(fd) => fd,
        Err(e) => {
            // SAFETY: plain kill(2) and waitpid(2) of our own child, which nothing else reaps.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return Err(sandbox_err("pidfd_open restored init")(e.into()));
        }
    };
    let start_time = match procfs::start_time(pid) {
        Ok(t) => t,
        Err(e) => {
            let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::KILL);
            let _ = wait_exit(&pidfd, inner.config.kill_timeout);
            return Err(sandbox_err("read start time")(e));
        }
    };
    tracing::debug!(%id, pid, criu = ?report.duration, "criu restore done");
    Ok(Restored { pid, pidfd, start_time, readers, keys })
}

/// After a failed restore: kill whatever was restored, detach the host mount, remove the cgroups,
/// and record the sandbox hibernated with its checkpoint. Never fails (logs instead).
fn undo_restore(
    inner: &Inner,
    id: &SandboxId,
    record: &mut SandboxRecord,
    checkpoint: &CheckpointRecord,
    pidfd: Option<&OwnedFd>,
) {
    if let Some(pidfd) = pidfd {
        let _ = rustix::process::pidfd_send_signal(pidfd, Signal::KILL);
    }
    record.phase = Phase::Hibernated;
    record.checkpoint = Some(checkpoint.clone());
    if let Err(e) = release_instance(inner, record, Phase::Hibernated) {
        tracing::warn!(%id, error = %e, "cleanup after a failed restore");
    }
    if let Some(pidfd) = pidfd
        && !wait_exit(pidfd, inner.config.kill_timeout)
    {
        tracing::warn!(%id, "restored init did not exit after SIGKILL");
    }
}

/// Removes the checkpoint (images and logs) of a sandbox that is no longer hibernated, and its
/// record. Blocking.
pub(super) fn discard_checkpoint(
    inner: &Inner,
    record: &mut SandboxRecord,
) -> Result<(), RuntimeError> {
    remove_dir_all_if_exists(&record.paths.checkpoint()).map_err(from_state)?;
    if record.checkpoint.take().is_some() {
        inner.store.write(record).map_err(from_state)?;
    }
    Ok(())
}

/// Whether the record's checkpoint was completely written by a `criu dump` that also ended the
/// processes (its `stats-dump` file exists), although the record does not say so yet.
/// Whether a dump failed because CRIU could not seize a task in time.
fn is_unseizable(error: &criu::CriuError) -> bool {
    match error {
        criu::CriuError::Failed { errors, .. } => errors
            .iter()
            .any(|line| line.contains("Unseizable") || line.contains("Timeout reached")),
        _ => false,
    }
}

pub(super) fn dump_completed(record: &SandboxRecord) -> bool {
    record.checkpoint.as_ref().is_some_and(|c| {
        c.complete
            || (c.images.join("inventory.img").is_file()
                && (c.dir.join(DUMP_STATS).is_file() || c.images.join(DUMP_STATS).is_file()))
    })
}

/// Waits until no `criu` traces the record's init any more (a dump interrupted by the runtime's
/// death goes on in an orphaned `criu`), or `timeout` passes.
pub(super) fn wait_for_orphaned_dump(record: &SandboxRecord, timeout: Duration) {
    let Some(pid) = record.instance.as_ref().and_then(|i| i.pid) else { return };
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    while procfs::tracer(pid).is_some_and(|t| t != 0) {
        if Instant::now() >= deadline {
            tracing::warn!(pid, "sandbox init still traced after {timeout:?}");
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// CRIU's `--external` names of a sandbox's host binds: unique, stable for one record, made of
/// `[A-Za-z0-9_.-]`.
pub(super) fn criu_mounts(mounts: &[ExternalMount]) -> Vec<criu::ExternalMount> {
    mounts
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let name: String = m
                .target
                .to_string_lossy()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-') { c } else { '_' })
                .collect();
            criu::ExternalMount {
                key: format!("m{i}{name}"),
                mountpoint: m.target.clone(),
                source: m.source.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_mount_keys_are_unique_and_valid() {
        let m = |t: &str, s: &str| ExternalMount { target: t.into(), source: s.into() };
        let keys: Vec<String> = criu_mounts(&[
            m("/dev/null", "/dev/null"),
            m("/usr", "/usr"),
            m("/.oka/init", "/work/target/debug/oka-init"),
            m("/a-b", "/x"),
            m("/a/b", "/y"),
        ])
        .into_iter()
        .map(|e| e.key)
        .collect();
        assert_eq!(keys, ["m0_dev_null", "m1_usr", "m2_.oka_init", "m3_a-b", "m4_a_b"]);
    }
}
