//! Opening the runtime: re-adopt live sandboxes, clean up after dead ones.
//!
//! Expected flow ([`open`]):
//! 1. check we are root and the paths are usable; create the state directory (0700) and take an
//!    exclusive `flock` on `<state>/lock` (a second runtime on the same directory fails fast);
//! 2. become a child subreaper (see `reaper.rs`);
//! 3. detect the cgroup layout and make this runtime's parent cgroups; build the default template
//!    root if missing;
//! 4. for every sandbox directory, by its record's phase:
//!    - no readable record: remove the directory (it can only hold directories we made);
//!    - `Creating`, or `Starting` of a sandbox that never ran: the create never finished; remove
//!      everything it recorded;
//!    - `Deleting`: finish the delete;
//!    - `Starting` of a sandbox that ran before: kill what started, release it, record `Stopped`;
//!    - `Running`: if the recorded init is alive with the recorded start time, adopt it (open a
//!      pidfd, re-check the start time, watch it; paused or not is whatever the freezer says); otherwise its
//!      processes died while nobody watched: release the instance, record `Stopped`;
//!    - `Running` with a checkpoint being written (a hibernate was interrupted): first wait while
//!      an orphaned `criu` still traces the init; then adopt it as above if it runs (dropping the
//!      partial checkpoint), else record `Hibernated` if the dump completed, else `Stopped`;
//!    - `Stopped`, `Hibernated`: keep (release an instance if one is recorded: the leftovers of an
//!      interrupted restore);
//!    - in every kept sandbox directory: remove the spent checkpoints (`checkpoint.spent-*`) whose
//!      removal in the background a crash interrupted;
//! 5. remove cgroups under our parents that no record claims (kill their processes first);
//! 6. if no kept sandbox holds an outbound lease, delete this runtime's NAT table (named in
//!    `<state>/nftables-table` while it may exist, see `network.rs`).
//!
//! Guarantees: after `open`, every record on disk describes something that exists, and nothing
//! the runtime created for a sandbox it no longer knows remains.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::fs::FlockOperation;
use rustix::process::{Pid, PidfdFlags};

use super::cgroup::CgroupLayout;
use super::hibernate::{
    discard_checkpoint, dump_completed, remove_spent_checkpoints, wait_for_orphaned_dump,
};
use super::inspect::{release_instance, remove_all};
use super::reaper::{ExitWatch, become_subreaper};
use super::rootfs::{check_layer_path, ensure_default_template};
use super::state::{Phase, SandboxRecord, StateStore, remove_dir_all_if_exists};
use super::{
    Inner, Live, LocalConfig, LocalError, LocalRuntime, Slot, blocking, from_cgroup, from_state,
    network, procfs,
};
use oka_runtime_api::{RuntimeError, SandboxId};

/// A record kept after recovery, with its live init if it was adopted.
struct Recovered {
    record: SandboxRecord,
    adopted: Option<std::os::fd::OwnedFd>,
}

pub(super) async fn open(config: LocalConfig) -> Result<LocalRuntime, RuntimeError> {
    match super::spawn::raise_open_files_limit() {
        Ok(Some((from, to))) => {
            tracing::info!(from, to, "raised the open files limit (sandboxes keep the old one)");
        }
        Ok(None) => {}
        Err(error) => tracing::warn!(%error, "cannot raise the open files limit"),
    }
    let handle = tokio::runtime::Handle::current();
    let (mut inner, recovered) = blocking(move || open_blocking(config)).await??;
    let _enter = handle.enter();
    let mut slots = BTreeMap::new();
    for Recovered { record, adopted } in recovered {
        let live = match adopted {
            Some(pidfd) => {
                let watch_fd = pidfd.try_clone().map_err(|source| LocalError::Io {
                    op: "dup pidfd",
                    path: record.paths.dir.clone(),
                    source,
                })?;
                let exit = ExitWatch::start(watch_fd).map_err(|source| LocalError::Io {
                    op: "watch pidfd",
                    path: record.paths.dir.clone(),
                    source,
                })?;
                Some(Live { pidfd, exit })
            }
            None => None,
        };
        let id = record.id().clone();
        let slot = Slot { record: Some(record), live, last_exit: None, removed: false };
        slots.insert(id, Arc::new(tokio::sync::Mutex::new(slot)));
    }
    inner.slots = Mutex::new(slots);
    let inner = Arc::new(inner);
    super::egress::spawn_refresh(&inner);
    Ok(LocalRuntime { inner })
}

fn open_blocking(config: LocalConfig) -> Result<(Inner, Vec<Recovered>), RuntimeError> {
    if !rustix::process::geteuid().is_root() {
        return Err(LocalError::NotRoot.into());
    }
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| -> RuntimeError { LocalError::Io { op, path, source }.into() }
    };
    if !config.init_binary.is_file() {
        return Err(io("find init binary", &config.init_binary)(
            std::io::ErrorKind::NotFound.into(),
        ));
    }
    let state_dir = &config.state_dir;
    check_layer_path(state_dir).map_err(LocalError::from)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(io("create directory", state_dir))?;
    let lock_path = state_dir.join("lock");
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(io("open", &lock_path))?;
    match rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(LocalError::Locked(state_dir.clone()).into());
        }
        Err(e) => return Err(io("lock", &lock_path)(e.into())),
    }
    become_subreaper().map_err(io("become child subreaper", Path::new("/proc/self")))?;
    let store = StateStore::open(state_dir).map_err(from_state)?;
    super::snapshot::remove_incomplete(state_dir)?;
    let cgroups = CgroupLayout::detect_with(&config.cgroup_name, config.cgroup_v2_only)
        .map_err(from_cgroup)?;
    let default_template =
        ensure_default_template(&state_dir.join("templates")).map_err(LocalError::from)?;

    // Sandboxes mount pinned copies, so replacing the binaries never breaks a restore.
    let bin_dir = state_dir.join("bin");
    let mut config = config;
    config.init_binary = super::binaries::pin(&config.init_binary, &bin_dir)
        .map_err(io("pin the init binary", &config.init_binary))?;
    if let Some(envd) = config.envd_binary.take() {
        let pinned =
            super::binaries::pin(&envd, &bin_dir).map_err(io("pin the envd binary", &envd))?;
        config.envd_binary = Some(pinned);
    }
    for (name, path) in &mut config.tools {
        let valid = !name.is_empty()
            && !matches!(name.as_str(), "." | ".." | "init" | "envd")
            && !name.contains(['/', '\0', ',', ':']);
        if !valid {
            return Err(LocalError::InvalidToolName(name.clone()).into());
        }
        *path = super::binaries::pin(path, &bin_dir).map_err(io("pin a tool binary", path))?;
    }

    if let Some(subnet) = network::recorded_subnet(&config.state_dir) {
        config.outbound_subnet = subnet;
    }
    let leases = network::Leases::new(config.outbound_subnet, &config.cgroup_name);
    let config_starts = config.max_parallel_starts.max(1);
    let inner = Inner {
        config,
        store,
        cgroups,
        default_template,
        leases,
        firewall: Mutex::new(Default::default()),
        slots: Mutex::new(BTreeMap::new()),
        criu: std::sync::OnceLock::new(),
        starts: tokio::sync::Semaphore::new(config_starts),
        checking: Mutex::default(),
        _lock: lock,
    };
    let mut recovered = Vec::new();
    for (dir, record) in inner.store.scan().map_err(from_state)? {
        let record = match record {
            Ok(r) if dir.file_name().and_then(|n| n.to_str()) == Some(r.id().as_str()) => r,
            Ok(_) | Err(_) => {
                tracing::warn!(?dir, "sandbox directory without a usable state file: removing it");
                remove_dir_all_if_exists(&dir).map_err(from_state)?;
                continue;
            }
        };
        if let Some(r) = recover(&inner, record)? {
            remove_spent_checkpoints(&r.record)?;
            if let Some(lease) = &r.record.network {
                inner.leases.adopt(lease);
            }
            recovered.push(r);
        }
    }
    if !inner.leases.any() {
        network::remove_nat(&inner.config.state_dir).map_err(LocalError::from)?;
    } else {
        // Re-adopted outbound sandboxes get their policies again (the table may be gone, or be
        // an older runtime's).
        for r in &recovered {
            if let Some(lease) = &r.record.network {
                let policy = r.record.egress.clone().unwrap_or_default();
                inner
                    .firewall_set(lease.index, &lease.host_if, &policy)
                    .map_err(LocalError::from)?;
            }
        }
    }
    let claimed: BTreeSet<String> = recovered
        .iter()
        .filter(|r| r.record.instance.is_some())
        .map(|r| r.record.id().as_str().to_owned())
        .collect();
    for name in inner.cgroups.children().difference(&claimed) {
        tracing::warn!(name, "cgroup no sandbox claims: removing it");
        let paths = inner.cgroups.paths_for(name);
        let timeout = inner.config.kill_timeout;
        paths.kill_all(timeout).map_err(from_cgroup)?;
        paths.remove(timeout).map_err(from_cgroup)?;
    }
    Ok((inner, recovered))
}

fn recover(inner: &Inner, mut record: SandboxRecord) -> Result<Option<Recovered>, RuntimeError> {
    let id: SandboxId = record.id().clone();
    match record.phase {
        Phase::Creating | Phase::Deleting => {
            tracing::info!(%id, phase = ?record.phase, "finishing interrupted create or delete: removing");
            remove_all(inner, &mut record)?;
            Ok(None)
        }
        Phase::Starting if !record.created => {
            tracing::info!(%id, "create interrupted while starting: removing");
            remove_all(inner, &mut record)?;
            Ok(None)
        }
        Phase::Starting => {
            release_instance(inner, &mut record, Phase::Stopped)?;
            Ok(Some(Recovered { record, adopted: None }))
        }
        Phase::Running => {
            if record.checkpoint.is_some() {
                // A hibernate was under way; its `criu` may outlive us and still be dumping.
                wait_for_orphaned_dump(&record, inner.config.criu_timeout);
            }
            match adopt(&record) {
                Some(adopted) => {
                    tracing::info!(%id, "re-adopted running sandbox");
                    discard_checkpoint(inner, &mut record)?;
                    Ok(Some(Recovered { record, adopted: Some(adopted) }))
                }
                None if dump_completed(&record) => {
                    tracing::info!(%id, "hibernate interrupted after its dump: hibernated");
                    if let Some(c) = record.checkpoint.as_mut() {
                        c.complete = true;
                    }
                    release_instance(inner, &mut record, Phase::Hibernated)?;
                    Ok(Some(Recovered { record, adopted: None }))
                }
                None => {
                    tracing::info!(%id, "sandbox processes ended while nobody watched: stopped");
                    discard_checkpoint(inner, &mut record)?;
                    release_instance(inner, &mut record, Phase::Stopped)?;
                    Ok(Some(Recovered { record, adopted: None }))
                }
            }
        }
        Phase::Stopped | Phase::Hibernated => {
            // A restore interrupted half-way: whatever it brought back is killed, its host mount
            // and cgroups removed; the checkpoint is intact (restore only reads it).
            if record.instance.is_some() {
                let phase = record.phase;
                release_instance(inner, &mut record, phase)?;
            }
            if record.phase == Phase::Stopped {
                discard_checkpoint(inner, &mut record)?;
            }
            Ok(Some(Recovered { record, adopted: None }))
        }
    }
}

/// A pidfd for the record's init if it still runs (same pid, same start time).
fn adopt(record: &SandboxRecord) -> Option<std::os::fd::OwnedFd> {
    let instance = record.instance.as_ref()?;
    let (pid, start) = (instance.pid?, instance.start_time?);
    if !procfs::is_same_process(pid, start) {
        return None;
    }
    let pidfd = rustix::process::pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
    // The pid could have been reused between the check and pidfd_open; the pidfd now pins
    // whatever process it names, so checking again settles it.
    if !procfs::is_same_process(pid, start) {
        return None;
    }
    Some(pidfd)
}
