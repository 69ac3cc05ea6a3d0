//! `ensure`: create a sandbox if absent, start it if stopped.
//!
//! Expected flow of a create (each state write happens before the resources it names exist):
//! 1. write the record (phase `Creating`, resource: the sandbox directory); make `upper`, `work`,
//!    `rootfs`; write `/etc/hostname` and `/etc/hosts` into the fresh writable layer;
//!    an outbound sandbox also takes its subnet slot (recorded in this first write) and gets an
//!    `/etc/resolv.conf` with the host's nameservers; a remapped one (user namespace) gets its
//!    writable layer and work directory owned by its mapped root, and its sandbox directory
//!    made traversable by it;
//! 2. start: write the record (phase `Starting`, instance with its cgroup paths and, if outbound,
//!    its veth's host end); make the cgroups and write the limits; `clone3` the init into new
//!    namespaces (a user namespace too, if remapped: its cgroups are delegated to the mapped root
//!    and the child waits for its id maps); move it into the cgroups; if outbound, create the
//!    veth pair into its network namespace (`network.rs`); send the setup and start plans; wait
//!    for `Mounted` then `Ready`;
//! 3. write the record (phase `Running`, the init's pid and start time) and start watching the
//!    init's pidfd.
//!
//! On failure in 2, the init is killed and the instance released; a sandbox that had never run is
//! then removed entirely (nothing half-created is left), one that had run is left stopped.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rustix::process::Signal;
use tokio::io::AsyncBufReadExt;

use super::cgroup::CpuPriority;
use super::inspect::{refresh, release_instance, remove_all, status};
use super::reaper::ExitWatch;
use super::rootfs::{prepare_fresh_upper, setup_plan};
use super::spawn::{IdMap, Spawned, spawn_init_with};
use super::state::{
    ExternalMount, InstanceRecord, Phase, Resource, STATE_VERSION, SandboxPaths, SandboxRecord,
};
use super::volumes;
use super::{
    Inner, Live, LocalError, SlotGuard, background, blocking, from_cgroup, from_state, network,
    procfs,
};
use crate::init::protocol::{BindPlan, EnvdPlan, FromInit, STARTUP_CHECK_STEP, StartPlan, ToInit};
use crate::init::{ENVD_PATH, ENVD_PORT};
use oka_runtime_api::{
    NetworkMode, Operation, RuntimeError, SandboxSpec, SandboxState, SandboxStatus, SpecError,
    UserNamespace,
};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub(super) async fn ensure(
    inner: &Arc<Inner>,
    spec: &SandboxSpec,
) -> Result<SandboxStatus, RuntimeError> {
    spec.validate()?;
    if spec.argv().is_empty() && inner.config.envd_binary.is_none() {
        return Err(SpecError::EmptyCommand.into());
    }
    if let Some(controller) = inner.cgroups.missing_for(&spec.resources) {
        return Err(RuntimeError::Unsupported {
            operation: Operation::Ensure,
            reason: format!(
                "the {controller} limit needs the {controller} cgroup controller, which this \
                 runtime's cgroup hierarchy does not offer"
            ),
        });
    }
    let Some(guard) = inner.lock(&spec.id, true).await else {
        return Err(LocalError::Task("slot vanished while creating it".into()).into());
    };
    let mut guard = refresh(inner, guard).await?;
    // New contents of a ConfigMap's or Secret's files are taken at the next start, as the
    // kubelet takes them when a container restarts: the stopped sandbox's record takes the spec.
    if let Some(record) = guard.record.as_mut()
        && record.spec != *spec
        && record.phase == Phase::Stopped
        && same_but_file_contents(&record.spec, spec)
    {
        let mut updated = record.clone();
        updated.spec = spec.clone();
        let inner2 = inner.clone();
        *record = background(move || inner2.store.write(&updated).map(|()| updated))
            .await?
            .map_err(from_state)?;
    }
    let guard = match &guard.record {
        Some(record)
            if record.phase == Phase::Running && same_but_file_contents(&record.spec, spec) =>
        {
            guard
        }
        None => match with_start_turn(inner, create(inner, guard, spec.clone())).await {
            Ok(guard) => guard,
            Err(e) => {
                // Nothing was left behind; do not keep an empty slot for the id either.
                if let Some(mut guard) = inner.lock(&spec.id, false).await
                    && guard.record.is_none()
                {
                    inner.retire(&spec.id, &mut guard);
                }
                return Err(e);
            }
        },
        Some(record) if record.spec != *spec => {
            return Err(RuntimeError::SpecMismatch(spec.id.clone()));
        }
        Some(record) => match record.phase {
            Phase::Running => guard,
            Phase::Stopped => with_start_turn(inner, start(inner, guard)).await?,
            Phase::Hibernated => {
                return Err(RuntimeError::InvalidState {
                    id: spec.id.clone(),
                    state: SandboxState::Hibernated,
                    operation: Operation::Ensure,
                });
            }
            Phase::Creating | Phase::Starting | Phase::Deleting => {
                return Err(RuntimeError::InvalidState {
                    id: spec.id.clone(),
                    state: SandboxState::Stopped,
                    operation: Operation::Ensure,
                });
            }
        },
    };
    let id = spec.id.clone();
    blocking(move || status(&id, &guard)).await
}

/// Whether `a` and `b` differ at most in the contents (and the list) of their files volumes.
fn same_but_file_contents(a: &SandboxSpec, b: &SandboxSpec) -> bool {
    let without = |spec: &SandboxSpec| {
        let mut spec = spec.clone();
        for mount in &mut spec.mounts {
            if let oka_runtime_api::MountSource::Files { files, .. } = &mut mount.source {
                files.clear();
            }
        }
        spec
    };
    without(a) == without(b)
}

/// Runs `starting` once a turn to start a sandbox is free (see
/// [`LocalConfig::max_parallel_starts`](super::LocalConfig::max_parallel_starts)).
async fn with_start_turn<T>(
    inner: &Arc<Inner>,
    starting: impl std::future::Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    // The semaphore is never closed, so a permit always comes.
    let _turn = inner.starts.acquire().await.map_err(|e| LocalError::Task(e.to_string()))?;
    starting.await
}

async fn create(
    inner: &Arc<Inner>,
    mut guard: SlotGuard,
    spec: SandboxSpec,
) -> Result<SlotGuard, RuntimeError> {
    let inner2 = inner.clone();
    guard = background(move || -> Result<SlotGuard, RuntimeError> {
        let template = inner2.template_for(&spec.root).map_err(LocalError::from)?;
        let paths = SandboxPaths::new(inner2.store.sandbox_dir(&spec.id));
        let network = match spec.network {
            NetworkMode::Loopback => None,
            NetworkMode::Outbound => Some(inner2.leases.take().map_err(LocalError::from)?),
        };
        let mut record = SandboxRecord {
            version: STATE_VERSION,
            spec,
            phase: Phase::Creating,
            created: false,
            paths: paths.clone(),
            lower: template.lower.clone(),
            resources: vec![Resource::Dir(paths.dir.clone())],
            instance: None,
            checkpoint: None,
            network,
            egress: None,
        };
        if let Err(e) = inner2.store.write(&record) {
            if let Some(lease) = &record.network {
                inner2.leases.release(lease);
            }
            return Err(from_state(e));
        }
        let made = make_dirs(&paths, &record);
        if let Err(e) = made {
            let _ = remove_all(&inner2, &mut record);
            return Err(e);
        }
        record.phase = Phase::Stopped;
        guard.record = Some(record);
        Ok(guard)
    })
    .await??;
    start(inner, guard).await
}

fn make_dirs(paths: &SandboxPaths, record: &SandboxRecord) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    for (dir, mode) in [(&paths.upper, 0o755), (&paths.work, 0o700), (&paths.rootfs, 0o755)] {
        std::fs::DirBuilder::new().mode(mode).create(dir).map_err(|source| LocalError::Io {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
    }
    prepare_fresh_upper(&paths.upper, &record.lower, &record.spec.hostname)
        .map_err(LocalError::from)?;
    if record.network.is_some() {
        network::write_resolv_conf(&paths.upper).map_err(LocalError::from)?;
    }
    if let UserNamespace::Remapped { host_base, .. } = record.spec.user_namespace {
        // Sandbox root is host `host_base`: it must own its writable layer (and overlayfs its
        // work directory), or it could not write anywhere in its root.
        chown_tree(&paths.upper, host_base)?;
        chown_tree(&paths.work, host_base)?;
        // The overlay is mounted by sandbox root, whose lookups need to traverse the state
        // directory: `sandboxes/` and the state directory become traversable (0711, not
        // listable), the sandbox's own directory only by its group (`host_base`, 0710).
        let err = |op: &'static str, path: &std::path::Path| {
            let path = path.to_owned();
            move |source| -> RuntimeError { LocalError::Io { op, path, source }.into() }
        };
        use std::os::unix::fs::PermissionsExt;
        for dir in paths.dir.ancestors().skip(1).take(2) {
            let mode = std::fs::metadata(dir).map_err(err("stat", dir))?.permissions().mode();
            if mode & 0o001 == 0 {
                let perms = std::fs::Permissions::from_mode((mode & 0o7777) | 0o111);
                std::fs::set_permissions(dir, perms).map_err(err("chmod", dir))?;
            }
        }
        std::os::unix::fs::chown(&paths.dir, Some(0), Some(host_base))
            .map_err(err("chown", &paths.dir))?;
        std::fs::set_permissions(&paths.dir, std::fs::Permissions::from_mode(0o710))
            .map_err(err("chmod", &paths.dir))?;
    }
    Ok(())
}

/// Gives `dir` and everything in it (all made by the runtime, as root) to host uid and gid `id`.
fn chown_tree(dir: &std::path::Path, id: u32) -> Result<(), RuntimeError> {
    let err = |path: &std::path::Path| {
        let path = path.to_owned();
        move |source| -> RuntimeError { LocalError::Io { op: "chown", path, source }.into() }
    };
    std::os::unix::fs::lchown(dir, Some(id), Some(id)).map_err(err(dir))?;
    for entry in std::fs::read_dir(dir).map_err(err(dir))? {
        let path = entry.map_err(err(dir))?.path();
        if std::fs::symlink_metadata(&path).map_err(err(&path))?.is_dir() {
            chown_tree(&path, id)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(id), Some(id)).map_err(err(&path))?;
        }
    }
    Ok(())
}

/// What the blocking half of a start hands to the async half.
struct Started {
    pidfd: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Starts a stopped sandbox (the slot's record is in phase `Stopped`).
pub(super) async fn start(inner: &Arc<Inner>, guard: SlotGuard) -> Result<SlotGuard, RuntimeError> {
    let inner2 = inner.clone();
    let handle = tokio::runtime::Handle::current();
    let (mut guard, started) = background(move || start_blocking(&inner2, guard)).await??;
    let id = guard.record.as_ref().map(|r| r.id().clone());
    let _enter = handle.enter();
    let watch_fd = started.pidfd.try_clone().map_err(|source| LocalError::Io {
        op: "dup pidfd",
        path: PathBuf::new(),
        source,
    })?;
    let exit = ExitWatch::start(watch_fd).map_err(|source| LocalError::Io {
        op: "watch pidfd",
        path: PathBuf::new(),
        source,
    })?;
    if let Some(id) = id {
        drain(id.as_str().to_owned(), "stdout", started.stdout);
        drain(id.as_str().to_owned(), "stderr", started.stderr);
    }
    guard.live = Some(Live { pidfd: started.pidfd, exit });
    guard.last_exit = None;
    Ok(guard)
}

fn start_blocking(
    inner: &Inner,
    mut guard: SlotGuard,
) -> Result<(SlotGuard, Started), RuntimeError> {
    let Some(record) = guard.record.as_mut() else {
        return Err(LocalError::Task("start without a record".into()).into());
    };
    let cgroup = inner.cgroups.paths_for(record.id().as_str());
    record.phase = Phase::Starting;
    record.instance = Some(InstanceRecord {
        pid: None,
        start_time: None,
        started_at_ms: None,
        cgroup: cgroup.clone(),
        // The veth's host end is recorded before `launch` creates it.
        resources: record.network.iter().map(|l| Resource::Veth(l.host_if.clone())).collect(),
        external_mounts: vec![],
        command_pid: None,
        stdio_pipes: vec![],
    });
    inner.store.write(record).map_err(from_state)?;
    // A new instance starts at background CPU weight and gets the normal weight once its
    // command runs (in `launch`): starting sandboxes (a pool refilling behind a burst of
    // claims) never slow the ones already serving.
    let result = cgroup
        .create(&record.spec.resources)
        .and_then(|()| cgroup.set_cpu_priority(CpuPriority::Background))
        .and_then(|()| match record.spec.user_namespace {
            UserNamespace::Host => Ok(()),
            UserNamespace::Remapped { host_base, .. } => cgroup.delegate(host_base),
        })
        .map_err(from_cgroup)
        .and_then(|()| launch(inner, record));
    match result {
        Ok(started) => Ok((guard, started)),
        Err(e) => {
            tracing::debug!(id = %record.id(), error = %e, "start failed, releasing");
            let cleanup = if record.created {
                release_instance(inner, record, Phase::Stopped)
            } else {
                remove_all(inner, record)
            };
            if let Err(cleanup) = cleanup {
                tracing::warn!(id = %record.id(), error = %cleanup, "cleanup after failed start");
            } else if !record.created {
                guard.record = None;
            }
            Err(e)
        }
    }
}

/// Clones the init, hands it its plans, and waits until the command runs.
fn launch(inner: &Inner, record: &mut SandboxRecord) -> Result<Started, RuntimeError> {
    let id = record.id().clone();
    let sandbox_err = |op: &'static str| {
        let id = id.clone();
        move |source: std::io::Error| -> RuntimeError {
            LocalError::Sandbox { id, op, source }.into()
        }
    };
    let t0 = Instant::now();
    let volume_plans = volumes::prepare(record).map_err(LocalError::from)?;
    let Spawned { pid, pidfd, channel, stdout, stderr, stdio_keys } =
        spawn_init_with(&inner.config.init_binary, id_map(&record.spec.user_namespace))
            .map_err(LocalError::from)?;
    tracing::debug!(%id, pid, "sandbox init cloned");
    let result = (|| -> Result<(Vec<std::path::PathBuf>, Option<i32>), RuntimeError> {
        // The init should survive a memory limit its command hits. Lowering the score needs
        // CAP_SYS_RESOURCE, which some hosts (containers) withhold; without it the OOM killer
        // still prefers the biggest process, never the init's few hundred kilobytes.
        if let Err(e) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "-1000") {
            tracing::debug!(%id, error = %e, "cannot protect the sandbox init from the OOM killer");
        }
        let Some(instance) = record.instance.as_mut() else {
            return Err(LocalError::Task("launch without an instance".into()).into());
        };
        instance.cgroup.add_process(pid).map_err(from_cgroup)?;
        if let Some(lease) = &record.network {
            // Before the plans: the command finds its network up.
            let policy = record.egress.clone().unwrap_or_default();
            inner.firewall_set(lease.index, &lease.host_if, &policy).map_err(network_error)?;
            network::attach(lease, pid, pidfd.as_fd()).map_err(network_error)?;
            network::shape(lease, &record.spec.bandwidth).map_err(network_error)?;
            tracing::debug!(%id, elapsed = ?t0.elapsed(), "sandbox network attached");
        }
        let mut plan = setup_plan(record, &inner.template_of(record), &inner.config.init_binary);
        plan.volumes = volume_plans.clone();
        plan.read_only_root = record.spec.security.read_only_root;
        let mut start = start_plan(record);
        if let Some(envd) = &inner.config.envd_binary {
            plan.binds.push(BindPlan {
                source: envd.clone(),
                target: ENVD_PATH.into(),
                readonly: true,
                optional: false,
            });
            start.envd = Some(EnvdPlan { path: ENVD_PATH.into(), port: ENVD_PORT });
        }
        for (name, binary) in &inner.config.tools {
            plan.binds.push(BindPlan {
                source: binary.clone(),
                target: super::tool_path(name),
                readonly: true,
                optional: false,
            });
        }
        let channel_err =
            |source| -> RuntimeError { LocalError::Channel { id: id.clone(), source }.into() };
        channel.send(&ToInit::Setup(plan)).map_err(channel_err)?;
        // The init may fail and exit before this reaches it (a root it cannot run in): its
        // answer is in the channel all the same, so it is read before this send's error counts.
        let check = record.spec.process.startup_check.as_ref();
        let start_sent = channel.send(&ToInit::Start(start));
        let deadline = Some(t0 + inner.config.ready_timeout);
        let mounts = match channel.recv::<FromInit>(deadline).map_err(channel_err)? {
            FromInit::Mounted { external_mounts } => external_mounts,
            other => return Err(init_failure(&id, other)),
        };
        tracing::debug!(%id, elapsed = ?t0.elapsed(), "sandbox root mounted");
        // A startup check runs before `Ready`: the wait grows by its bound, and the command gets
        // the normal CPU weight now, so its start is not slowed into failing the check.
        let deadline = match check {
            Some(check) => {
                if let Some(instance) = record.instance.as_ref() {
                    instance.cgroup.set_cpu_priority(CpuPriority::Normal).map_err(from_cgroup)?;
                }
                if let Ok(pidfd) = pidfd.try_clone() {
                    let mut checking = inner.checking.lock().unwrap_or_else(|p| p.into_inner());
                    checking.insert(id.clone(), pidfd);
                }
                // A bound beyond any clock is no deadline.
                deadline.and_then(|d| d.checked_add(check.bound()))
            }
            None => deadline,
        };
        let answer = channel.recv::<FromInit>(deadline);
        if check.is_some() {
            inner.checking.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        }
        let command_pid = match (answer, start_sent) {
            (Ok(FromInit::Ready { pid }), _) => pid,
            (Ok(other), _) => return Err(init_failure(&id, other)),
            (Err(e), Ok(())) | (Err(_), Err(e)) => return Err(channel_err(e)),
        };
        if let Some(instance) = record.instance.as_ref() {
            instance.cgroup.set_cpu_priority(CpuPriority::Normal).map_err(from_cgroup)?;
        }
        Ok((mounts, command_pid))
    })();
    let (mounts, command_pid) = match result {
        Ok(v) => v,
        Err(e) => {
            // The cgroup kill in release_instance finds it too, but it may not be in the cgroups yet.
            let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::KILL);
            let _ = wait_exit(&pidfd, inner.config.kill_timeout);
            return Err(e);
        }
    };
    let start_time = procfs::start_time(pid).map_err(sandbox_err("read start time"))?;
    let template = inner.template_of(record);
    let external_mounts = mounts
        .into_iter()
        .map(|target| {
            let volume = volume_plans.iter().rev().find(|p| p.target == target);
            let source = volume
                .and_then(volumes::host_source)
                .or_else(|| {
                    template.binds.iter().find(|(_, t)| *t == target).map(|(h, _)| h.clone())
                })
                .unwrap_or_else(|| {
                    if target == std::path::Path::new(super::rootfs::INIT_PATH) {
                        inner.config.init_binary.clone()
                    } else if let Some(envd) = inner
                        .config
                        .envd_binary
                        .as_ref()
                        .filter(|_| target == std::path::Path::new(ENVD_PATH))
                    {
                        envd.clone()
                    } else if let Some(tool) = inner
                        .config
                        .tools
                        .iter()
                        .find(|(name, _)| target == super::tool_path(name))
                        .map(|(_, binary)| binary)
                    {
                        tool.clone()
                    } else if target.starts_with("/proc") {
                        "/dev/null".into()
                    } else {
                        target.clone()
                    }
                });
            ExternalMount { target, source }
        })
        .collect();
    if let Some(instance) = record.instance.as_mut() {
        instance.pid = Some(pid);
        instance.start_time = start_time;
        instance.started_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        instance.external_mounts = external_mounts;
        instance.command_pid = command_pid;
        instance.stdio_pipes = stdio_keys;
    }
    record.phase = Phase::Running;
    record.created = true;
    inner.store.write(record).map_err(from_state)?;
    tracing::debug!(%id, pid, elapsed = ?t0.elapsed(), "sandbox ready");
    Ok(Started { pidfd, stdout, stderr })
}

/// A missing `ip` or `nft` is [`RuntimeError::Unsupported`] naming the feature and how to turn
/// it on; anything else is the runtime's error.
fn network_error(e: network::NetworkError) -> RuntimeError {
    match e {
        network::NetworkError::Spawn { tool, source }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            RuntimeError::Unsupported {
                operation: Operation::Ensure,
                reason: super::features::network_tool_off(tool).to_string(),
            }
        }
        e => LocalError::from(e).into(),
    }
}

/// The id map of a remapped sandbox.
fn id_map(user_ns: &UserNamespace) -> Option<IdMap> {
    match *user_ns {
        UserNamespace::Host => None,
        UserNamespace::Remapped { host_base, size } => Some(IdMap { host_base, size }),
    }
}

fn init_failure(id: &oka_runtime_api::SandboxId, msg: FromInit) -> RuntimeError {
    match msg {
        FromInit::Failed { step, message, spec_error: true } if step == STARTUP_CHECK_STEP => {
            RuntimeError::StartupCheckFailed { id: id.clone(), message }
        }
        FromInit::Failed { step, message, spec_error: true } => {
            RuntimeError::CommandFailed { id: id.clone(), message: format!("{step}: {message}") }
        }
        FromInit::Failed { step, message, spec_error: false } => {
            LocalError::InitFailed { id: id.clone(), step, message }.into()
        }
        other => LocalError::InitFailed {
            id: id.clone(),
            step: "answer".into(),
            message: format!("unexpected {other:?}"),
        }
        .into(),
    }
}

/// Waits (blocking) until the process behind `pidfd` has exited; `false` on timeout.
pub(super) fn wait_exit(pidfd: &OwnedFd, timeout: std::time::Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(ts) = Timespec::try_from(left) else { return false };
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(n) if n > 0 => {
                // Reap it if it is ours (the watcher may not exist yet).
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(pidfd)),
                    rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
                );
                return true;
            }
            Ok(_) => return false,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
}

/// The run stage's plan: argv, environment with defaults, working directory, user.
fn start_plan(record: &SandboxRecord) -> StartPlan {
    let spec = &record.spec;
    let mut env: Vec<(String, String)> = Vec::new();
    for var in &spec.process.env {
        env.retain(|(k, _)| *k != var.name);
        env.push((var.name.clone(), var.value.clone()));
    }
    let has = |env: &[(String, String)], k: &str| env.iter().any(|(n, _)| n == k);
    if !has(&env, "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    if !has(&env, "HOME") {
        let uid = spec.process.user.map_or(0, |u| u.uid);
        env.push(("HOME".into(), home_of(uid, &record.lower)));
    }
    if !has(&env, "HOSTNAME") {
        env.push(("HOSTNAME".into(), spec.hostname.clone()));
    }
    StartPlan {
        argv: spec.argv(),
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        cwd: spec.process.working_dir.clone().unwrap_or_else(|| "/".into()),
        user: spec.process.user,
        envd: None,
        capabilities: capability_mask(&spec.security),
        no_new_privileges: spec.security.no_new_privileges,
        seccomp: spec.security.seccomp == oka_runtime_api::Seccomp::RuntimeDefault,
        groups: spec
            .process
            .supplementary_groups
            .iter()
            .copied()
            .chain(spec.security.fs_group)
            .collect(),
        startup_check: spec.process.startup_check.clone(),
    }
}

/// The capability set of `security` as a bit mask: the runtime's default set with the
/// additions, then without the drops (`ALL` is every capability); `None` for the default.
fn capability_mask(security: &oka_runtime_api::Security) -> Option<u64> {
    if security.add_capabilities.is_empty() && security.drop_capabilities.is_empty() {
        return None;
    }
    let bits = |names: &[String]| {
        names.iter().fold(0u64, |acc, name| {
            if name == "ALL" {
                u64::MAX
            } else {
                oka_runtime_api::spec::capability_number(name).map_or(acc, |n| acc | (1u64 << n))
            }
        })
    };
    let default = crate::init::run::KEPT_CAPABILITIES.bits();
    Some((default | bits(&security.add_capabilities)) & !bits(&security.drop_capabilities))
}

/// The home directory of `uid` from the lower layers' `/etc/passwd`, else `/` (root: `/root`).
fn home_of(uid: u32, lower: &[PathBuf]) -> String {
    for layer in lower {
        let Ok(passwd) = std::fs::read_to_string(layer.join("etc/passwd")) else { continue };
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() >= 6 && f[2].parse::<u32>().ok() == Some(uid) {
                return f[5].to_owned();
            }
        }
    }
    if uid == 0 { "/root".into() } else { "/".into() }
}

/// Logs a sandbox init's output line by line at debug level until it closes its end.
pub(super) fn drain(id: String, stream: &'static str, fd: OwnedFd) {
    let Ok(pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else { return };
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(sandbox = %id, stream, "{line}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use oka_runtime_api::{EnvVar, SandboxId, User};

    #[test]
    fn start_plan_fills_defaults_and_lets_later_env_entries_win() {
        let mut spec =
            SandboxSpec::new(SandboxId::new("s").unwrap(), vec!["sh".into(), "-c".into()]);
        spec.process.args = vec!["echo hi".into()];
        spec.process.env = vec![EnvVar::new("A", "1"), EnvVar::new("A", "2")];
        spec.process.user = Some(User::DEFAULT_USER);
        let record = SandboxRecord {
            version: STATE_VERSION,
            paths: SandboxPaths::new("/x".into()),
            spec,
            phase: Phase::Stopped,
            created: false,
            lower: vec![],
            resources: vec![],
            instance: None,
            checkpoint: None,
            network: None,
            egress: None,
        };
        let plan = start_plan(&record);
        assert_eq!(plan.argv, ["sh", "-c", "echo hi"]);
        assert_eq!(plan.env[0], "A=2");
        assert!(plan.env.iter().any(|e| e.starts_with("PATH=/usr/local/sbin")));
        assert!(plan.env.contains(&"HOME=/".to_owned()));
        assert_eq!(plan.cwd, PathBuf::from("/"));
    }
}
