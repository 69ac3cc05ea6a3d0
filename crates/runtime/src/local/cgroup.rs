//! Sandbox cgroups on cgroup v1, v2, or the hybrid of both.
//!
//! Each sandbox gets one cgroup per hierarchy it uses, at `<own>/<name>/<id>` where `<own>` is
//! the runtime process's own cgroup in that hierarchy (from `/proc/self/cgroup`) and `<name>` the
//! runtime's cgroup name. Creating under our own path, not at the hierarchy root, is required
//! where the process is confined (on our machines the memory cgroup is nested) and keeps
//! sandboxes accounted to the service that runs them.
//!
//! Controllers are taken per controller from where they are: a v1 hierarchy mounted with it, else
//! the unified (v2) hierarchy if it lists it in `cgroup.controllers`. On our machines (hybrid:
//! every controller on v1, only `hugetlb` on the unified mount) everything is v1; on pure v2
//! machines everything is v2. Freezing uses the v1 freezer when mounted, else `cgroup.freeze`.
//!
//! Invariants:
//! - the `<own>/<name>` parent belongs to one runtime (one state directory); anything under it
//!   that the state files do not name is a leftover and may be removed;
//! - a sandbox cgroup path is recorded in the state file before `mkdir`.
//!
//! Assumptions: cgroup file systems are mounted where `/proc/self/mountinfo` says; on pure v2,
//! our own cgroup may have to hand our process to a `supervisor` leaf to enable controllers for
//! children (the "no internal processes" rule, cgroups(7)); that is done once at detection.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use oka_runtime_api::{ResourceLimits, ResourceUsage};

/// A cgroup controller the runtime uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Controller {
    /// CPU bandwidth (quota).
    Cpu,
    /// CPU accounting (v1 only; part of `cpu` on v2).
    Cpuacct,
    /// Memory limit and accounting.
    Memory,
    /// Process count limit.
    Pids,
    /// Freezing (v1 only; built into every v2 cgroup).
    Freezer,
}

impl Controller {
    const ALL: [Controller; 5] = [
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Memory,
        Controller::Pids,
        Controller::Freezer,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cpuacct => "cpuacct",
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Freezer => "freezer",
        }
    }
}

/// Why a cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The cgroup file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A required controller is mounted nowhere.
    #[error("no cgroup hierarchy offers the {0} controller")]
    MissingController(&'static str),
    /// A state did not settle in time.
    #[error("{path}: {what} did not happen within {timeout:?}")]
    Timeout {
        /// The cgroup.
        path: PathBuf,
        /// What was awaited.
        what: &'static str,
        /// How long we waited.
        timeout: Duration,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_owned();
    move |source| CgroupError::Io { op, path, source }
}

/// A sandbox's CPU weight relative to the other sandboxes (see [`CgroupPaths::set_cpu_priority`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuPriority {
    /// The smallest weight: runs when nothing else wants the CPU.
    Background,
    /// The default weight (cgroup v1 `cpu.shares` 1024, v2 `cpu.weight` 100).
    Normal,
}

/// The cgroup directories of one sandbox, as recorded in its state file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupPaths {
    /// v1 hierarchies used, with the sandbox's directory in each.
    pub v1: Vec<(Controller, PathBuf)>,
    /// The sandbox's directory in the unified hierarchy, if used.
    pub v2: Option<PathBuf>,
    /// Controllers served by the unified directory.
    pub v2_controllers: Vec<Controller>,
}

impl CgroupPaths {
    /// Every directory, in creation order.
    pub fn dirs(&self) -> Vec<&Path> {
        self.v1.iter().map(|(_, p)| p.as_path()).chain(self.v2.as_deref()).collect()
    }

    fn v1_dir(&self, c: Controller) -> Option<&Path> {
        self.v1.iter().find(|(k, _)| *k == c).map(|(_, p)| p.as_path())
    }

    fn v2_has(&self, c: Controller) -> Option<&Path> {
        self.v2.as_deref().filter(|_| self.v2_controllers.contains(&c))
    }

    /// Makes the directories and writes the limits. Existing directories are reused (a retry
    /// after a crash).
    pub fn create(&self, limits: &ResourceLimits) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            match fs::create_dir(dir) {
                Ok(()) => tracing::debug!(?dir, "cgroup created"),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("create cgroup", dir)(e)),
            }
        }
        if let Some(millis) = limits.cpu_millis {
            let period: u64 = 100_000;
            let quota = (millis * period / 1000).max(1000);
            if let Some(dir) = self.v1_dir(Controller::Cpu) {
                write(&dir.join("cpu.cfs_period_us"), &period.to_string())?;
                write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
            } else if let Some(dir) = self.v2_has(Controller::Cpu) {
                write(&dir.join("cpu.max"), &format!("{quota} {period}"))?;
            } else {
                return Err(CgroupError::MissingController("cpu"));
            }
        }
        if let Some(bytes) = limits.memory_bytes {
            if let Some(dir) = self.v1_dir(Controller::Memory) {
                write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                // Swap off: memory+swap may not exceed memory (only with swap accounting on).
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &bytes.to_string())?;
                }
                let _ = write(&dir.join("memory.swappiness"), "0");
            } else if let Some(dir) = self.v2_has(Controller::Memory) {
                write(&dir.join("memory.max"), &bytes.to_string())?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
            } else {
                return Err(CgroupError::MissingController("memory"));
            }
        }
        if let Some(pids) = limits.pids {
            let dir = self.v1_dir(Controller::Pids).or_else(|| self.v2_has(Controller::Pids));
            let Some(dir) = dir else { return Err(CgroupError::MissingController("pids")) };
            write(&dir.join("pids.max"), &pids.to_string())?;
        }
        Ok(())
    }

    /// Changes the limits of a running sandbox from `old` to `new`: a limit given is written as
    /// [`CgroupPaths::create`] writes it, a limit dropped is lifted (`max`).
    pub fn update(&self, old: &ResourceLimits, new: &ResourceLimits) -> Result<(), CgroupError> {
        // cgroup v1 keeps memory ≤ memory+swap at every write: a raise goes to memory+swap
        // first, a cut to memory first.
        if let (Some(bytes), Some(dir)) = (new.memory_bytes, self.v1_dir(Controller::Memory)) {
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            // From no limit, the new one is a cut.
            let raise = old.memory_bytes.is_some_and(|o| bytes > o);
            if raise && memsw.exists() {
                write(&memsw, &bytes.to_string())?;
            }
        }
        self.create(new)?;
        if old.cpu_millis.is_some() && new.cpu_millis.is_none() {
            if let Some(dir) = self.v1_dir(Controller::Cpu) {
                write(&dir.join("cpu.cfs_quota_us"), "-1")?;
            } else if let Some(dir) = self.v2_has(Controller::Cpu) {
                write(&dir.join("cpu.max"), "max 100000")?;
            }
        }
        if old.memory_bytes.is_some() && new.memory_bytes.is_none() {
            if let Some(dir) = self.v1_dir(Controller::Memory) {
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, "-1")?;
                }
                write(&dir.join("memory.limit_in_bytes"), "-1")?;
            } else if let Some(dir) = self.v2_has(Controller::Memory) {
                write(&dir.join("memory.max"), "max")?;
            }
        }
        if old.pids.is_some() && new.pids.is_none() {
            let dir = self.v1_dir(Controller::Pids).or_else(|| self.v2_has(Controller::Pids));
            if let Some(dir) = dir {
                write(&dir.join("pids.max"), "max")?;
            }
        }
        Ok(())
    }

    /// Sets the sandbox's CPU weight among its siblings: [`CpuPriority::Background`] while it
    /// starts, so a burst of new pool sandboxes leaves the CPU to sandboxes already serving
    /// (their claim's `/init`, their users' commands); [`CpuPriority::Normal`] once it runs.
    /// Limits (`cpu.max`) are unaffected. A host without a CPU controller has nothing to set.
    pub fn set_cpu_priority(&self, priority: CpuPriority) -> Result<(), CgroupError> {
        if let Some(dir) = self.v1_dir(Controller::Cpu) {
            let shares = match priority {
                CpuPriority::Background => "2",
                CpuPriority::Normal => "1024",
            };
            write(&dir.join("cpu.shares"), shares)
        } else if let Some(dir) = self.v2_has(Controller::Cpu) {
            let weight = match priority {
                CpuPriority::Background => "1",
                CpuPriority::Normal => "100",
            };
            write(&dir.join("cpu.weight"), weight)
        } else {
            Ok(())
        }
    }

    /// Delegates the cgroups to host uid and gid `id` (a remapped sandbox's root), as
    /// cgroups(7) describes: the directories and the files that create children and move
    /// processes, never the limit files, so the sandbox can organise its processes below its
    /// cgroup but not raise its own limits.
    pub fn delegate(&self, id: u32) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            std::os::unix::fs::chown(dir, Some(id), Some(id)).map_err(io_err("chown", dir))?;
            for file in ["cgroup.procs", "cgroup.threads", "cgroup.subtree_control", "tasks"] {
                let path = dir.join(file);
                match std::os::unix::fs::chown(&path, Some(id), Some(id)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("chown", &path)(e)),
                }
            }
        }
        Ok(())
    }

    /// Moves process `pid` (and its future children) into every directory.
    pub fn add_process(&self, pid: i32) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Freezes every process and waits until the kernel reports the cgroup frozen.
    pub fn freeze(&self, timeout: Duration) -> Result<(), CgroupError> {
        self.set_frozen(true, timeout)
    }

    /// Thaws every process and waits until the kernel reports the cgroup thawed.
    pub fn thaw(&self, timeout: Duration) -> Result<(), CgroupError> {
        self.set_frozen(false, timeout)
    }

    fn set_frozen(&self, frozen: bool, timeout: Duration) -> Result<(), CgroupError> {
        if let Some(dir) = self.v1_dir(Controller::Freezer) {
            let state = dir.join("freezer.state");
            if !frozen {
                write(&state, "THAWED")?;
                return poll_until(
                    &state,
                    "thaw",
                    timeout,
                    || Ok(read(&state)?.trim() == "THAWED"),
                );
            }
            // The v1 freezer can stay FREEZING while tasks fork: writing FROZEN again retries
            // the tasks that escaped, and an occasional short thaw lets a fork in flight finish
            // (the same approach as runc's fs freezer).
            let mut attempt = 0u32;
            poll_until(&state, "freeze", timeout, || {
                attempt += 1;
                if attempt.is_multiple_of(50) {
                    write(&state, "THAWED")?;
                    std::thread::sleep(Duration::from_millis(1));
                }
                write(&state, "FROZEN")?;
                Ok(read(&state)?.trim() == "FROZEN")
            })
        } else if let Some(dir) = &self.v2 {
            write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
            let events = dir.join("cgroup.events");
            let want = if frozen { "frozen 1" } else { "frozen 0" };
            let what = if frozen { "freeze" } else { "thaw" };
            poll_until(&events, what, timeout, || {
                Ok(read(&events)?.lines().any(|l| l.trim() == want))
            })
        } else {
            Err(CgroupError::MissingController("freezer"))
        }
    }

    /// The directory that freezes the sandbox: the v1 freezer cgroup, else the unified one (what
    /// CRIU's `--freeze-cgroup` takes).
    pub fn freezer_dir(&self) -> Option<&Path> {
        self.v1_dir(Controller::Freezer).or(self.v2.as_deref())
    }

    /// Whether the cgroup is frozen (or freezing).
    pub fn is_frozen(&self) -> Result<bool, CgroupError> {
        if let Some(dir) = self.v1_dir(Controller::Freezer) {
            Ok(read(&dir.join("freezer.state"))?.trim() != "THAWED")
        } else if let Some(dir) = &self.v2 {
            Ok(read(&dir.join("cgroup.freeze"))?.trim() == "1")
        } else {
            Ok(false)
        }
    }

    /// The pids in the cgroups (host pid namespace); missing directories count as empty.
    pub fn processes(&self) -> Result<BTreeSet<i32>, CgroupError> {
        let mut pids = BTreeSet::new();
        for dir in self.dirs() {
            let procs = dir.join("cgroup.procs");
            match fs::read_to_string(&procs) {
                Ok(s) => pids.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("read", &procs)(e)),
            }
        }
        Ok(pids)
    }

    /// Kills every process in the cgroups and waits until they are gone: `cgroup.kill` where the
    /// kernel has it, else freeze, SIGKILL each listed process, thaw (a frozen cgroup cannot fork,
    /// so the list is complete), repeated until empty.
    pub fn kill_all(&self, timeout: Duration) -> Result<(), CgroupError> {
        let start = Instant::now();
        if let Some(kill) = self.v2.as_ref().map(|d| d.join("cgroup.kill")).filter(|k| k.exists()) {
            write(&kill, "1")?;
        } else if self.dirs().iter().all(|d| d.exists()) {
            let frozen = self.freeze(timeout).is_ok();
            for pid in self.processes()? {
                // SAFETY: plain kill(2); a pid that already exited yields ESRCH, which is fine.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if frozen {
                self.thaw(timeout)?;
            }
        }
        let anchor = self.dirs().first().map(|d| d.to_path_buf()).unwrap_or_default();
        poll_until(
            &anchor,
            "exit of every process",
            timeout.saturating_sub(start.elapsed()),
            || Ok(self.processes()?.is_empty()),
        )
    }

    /// Removes the directories; missing ones are fine. Retries while the kernel still reports
    /// them busy (processes finishing their exit).
    pub fn remove(&self, timeout: Duration) -> Result<(), CgroupError> {
        for dir in self.dirs().into_iter().rev() {
            poll_until(dir, "cgroup removal", timeout, || match fs::remove_dir(dir) {
                Ok(()) => {
                    tracing::debug!(?dir, "cgroup removed");
                    Ok(true)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
                Err(e) => Err(io_err("remove cgroup", dir)(e)),
            })?;
        }
        Ok(())
    }

    /// Memory, pids and CPU usage, where the layout offers them.
    pub fn usage(&self, limits: ResourceLimits) -> ResourceUsage {
        let num = |p: PathBuf| read(&p).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let memory_bytes = self
            .v1_dir(Controller::Memory)
            .and_then(|d| num(d.join("memory.usage_in_bytes")))
            .or_else(|| {
                self.v2_has(Controller::Memory).and_then(|d| num(d.join("memory.current")))
            });
        let pids = self
            .v1_dir(Controller::Pids)
            .or_else(|| self.v2_has(Controller::Pids))
            .and_then(|d| num(d.join("pids.current")));
        let cpu = self
            .v1_dir(Controller::Cpuacct)
            .and_then(|d| num(d.join("cpuacct.usage")))
            .map(Duration::from_nanos)
            .or_else(|| {
                let stat = read(&self.v2.as_ref()?.join("cpu.stat")).ok()?;
                let usec = stat.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
                usec.trim().parse().ok().map(Duration::from_micros)
            });
        ResourceUsage { memory_bytes, pids, cpu, limits }
    }
}

/// Where this runtime's sandbox cgroups go, detected once.
#[derive(Clone, Debug)]
pub struct CgroupLayout {
    /// v1 controller → this runtime's parent directory in that hierarchy.
    v1: Vec<(Controller, PathBuf)>,
    /// This runtime's parent directory in the unified hierarchy, when used.
    v2: Option<PathBuf>,
    /// Controllers served by the unified hierarchy.
    v2_controllers: Vec<Controller>,
    /// Every hierarchy used, as `/proc/<pid>/cgroup` names it: the hierarchy's controllers
    /// (`memory`, `cpu,cpuacct`; `None` for the unified one) and this runtime's parent cgroup as a
    /// path inside it (`/process_api/e3d4/oka`). What CRIU's `--cgroup-root` wants.
    hierarchies: Vec<(Option<String>, PathBuf)>,
}

/// A sandbox's cgroup in one hierarchy, as `/proc/<pid>/cgroup` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HierarchyPath {
    /// The hierarchy's controllers, comma-separated (`memory`, `cpu,cpuacct`); `None` for the
    /// unified (v2) hierarchy.
    pub controllers: Option<String>,
    /// The cgroup's path inside the hierarchy (`/process_api/e3d4/oka/sbx-1`).
    pub path: PathBuf,
}

impl CgroupLayout {
    /// Detects the hierarchies from `/proc/self/mountinfo` and `/proc/self/cgroup`, and creates the
    /// parent directories `<own>/<name>` (enabling controllers on v2).
    pub fn detect(name: &str) -> Result<Self, CgroupError> {
        Self::detect_with(name, false)
    }

    /// [`detect`](Self::detect), or with `unified_only` the unified (v2) hierarchy alone even
    /// where v1 hierarchies are mounted (what a pure v2 host gets; on a hybrid host, to exercise
    /// the v2 code). Limits whose controller the unified hierarchy lacks are then refused per
    /// sandbox ([`missing_for`](Self::missing_for)) rather than at detection.
    pub fn detect_with(name: &str, unified_only: bool) -> Result<Self, CgroupError> {
        let mountinfo_path = Path::new("/proc/self/mountinfo");
        let cgroup_path = Path::new("/proc/self/cgroup");
        let mountinfo =
            fs::read_to_string(mountinfo_path).map_err(io_err("read", mountinfo_path))?;
        let own = fs::read_to_string(cgroup_path).map_err(io_err("read", cgroup_path))?;
        let controllers_of =
            |dir: &Path| fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        let layout = if unified_only {
            Self::plan_unified_only(name, &mountinfo, &own, controllers_of)?
        } else {
            Self::plan(name, &mountinfo, &own, controllers_of)?
        };
        layout.create_parents()?;
        Ok(layout)
    }

    /// The layout implied by a mountinfo and a `/proc/self/cgroup` text; `controllers_of` reads a
    /// unified cgroup's `cgroup.controllers`. Pure, for tests.
    pub fn plan(
        name: &str,
        mountinfo: &str,
        own: &str,
        controllers_of: impl Fn(&Path) -> String,
    ) -> Result<Self, CgroupError> {
        let layout = Self::plan_with(name, mountinfo, own, controllers_of, false)?;
        for must in [Controller::Memory, Controller::Pids] {
            if !layout.v1.iter().any(|(c, _)| *c == must) && !layout.v2_controllers.contains(&must)
            {
                return Err(CgroupError::MissingController(must.name()));
            }
        }
        Ok(layout)
    }

    /// The layout on the unified hierarchy alone, ignoring v1 mounts; controllers it lacks are
    /// not an error here (see [`missing_for`](Self::missing_for)). Pure, for tests.
    pub fn plan_unified_only(
        name: &str,
        mountinfo: &str,
        own: &str,
        controllers_of: impl Fn(&Path) -> String,
    ) -> Result<Self, CgroupError> {
        Self::plan_with(name, mountinfo, own, controllers_of, true)
    }

    /// The first controller `limits` need that this layout lacks, if any.
    pub fn missing_for(&self, limits: &ResourceLimits) -> Option<&'static str> {
        let has = |c: Controller| {
            self.v1.iter().any(|(k, _)| *k == c) || self.v2_controllers.contains(&c)
        };
        [
            (limits.cpu_millis.is_some(), Controller::Cpu),
            (limits.memory_bytes.is_some(), Controller::Memory),
            (limits.pids.is_some(), Controller::Pids),
        ]
        .into_iter()
        .find(|(wanted, c)| *wanted && !has(*c))
        .map(|(_, c)| c.name())
    }

    /// Whether sandboxes use only the unified (v2) hierarchy.
    pub fn is_unified_only(&self) -> bool {
        self.v1.is_empty() && self.v2.is_some()
    }

    fn plan_with(
        name: &str,
        mountinfo: &str,
        own: &str,
        controllers_of: impl Fn(&Path) -> String,
        unified_only: bool,
    ) -> Result<Self, CgroupError> {
        // (controllers, path) from /proc/self/cgroup; v2 is the line with an empty list.
        let own: Vec<(Vec<&str>, &str)> = own
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ':');
                let _id = it.next()?;
                let ctrls = it.next()?;
                let path = it.next()?;
                Some((ctrls.split(',').filter(|c| !c.is_empty()).collect(), path))
            })
            .collect();
        let mut v1_mounts: Vec<(Vec<String>, PathBuf, String)> = Vec::new();
        let mut v2_mount: Option<(PathBuf, String)> = None;
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else { continue };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let (Some(root), Some(mount_point), Some(fstype)) =
                (pre.get(3), pre.get(4), post.first())
            else {
                continue;
            };
            match *fstype {
                "cgroup" => {
                    let opts = post.get(2).copied().unwrap_or("");
                    let ctrls = opts.split(',').map(str::to_owned).collect();
                    v1_mounts.push((ctrls, PathBuf::from(unescape(mount_point)), unescape(root)));
                }
                "cgroup2" if v2_mount.is_none() => {
                    v2_mount = Some((PathBuf::from(unescape(mount_point)), unescape(root)));
                }
                _ => {}
            }
        }
        let join_own = |mount: &Path, mount_root: &str, own_path: &str| -> PathBuf {
            let rel = own_path.strip_prefix(mount_root).unwrap_or(own_path);
            let rel = rel.trim_start_matches('/');
            let mut dir = mount.to_path_buf();
            if !rel.is_empty() {
                dir.push(rel);
            }
            dir.join(name)
        };
        let v2_parent = v2_mount.as_ref().and_then(|(mount, root)| {
            let own_path = own.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| *p)?;
            Some(join_own(mount, root, own_path))
        });
        let v2_available: Vec<String> = v2_parent
            .as_ref()
            .and_then(|p| p.parent())
            .map(|own_dir| controllers_of(own_dir).split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();

        let in_hierarchy = |own_path: &str| Path::new("/").join(own_path).join(name);
        let mut v1 = Vec::new();
        let mut v2_controllers = Vec::new();
        let mut hierarchies: Vec<(Option<String>, PathBuf)> = Vec::new();
        for c in Controller::ALL {
            let mount = v1_mounts
                .iter()
                .filter(|_| !unified_only)
                .find(|(ctrls, _, _)| ctrls.iter().any(|x| x == c.name()));
            let own_line = own.iter().find(|(ctrls, _)| ctrls.contains(&c.name()));
            match (mount, own_line) {
                (Some((_, mount, root)), Some((ctrls, own_path))) => {
                    v1.push((c, join_own(mount, root, own_path)));
                    let hierarchy = Some(ctrls.join(","));
                    if !hierarchies.iter().any(|(h, _)| *h == hierarchy) {
                        hierarchies.push((hierarchy, in_hierarchy(own_path)));
                    }
                }
                _ => {
                    let on_v2 = match c {
                        Controller::Cpuacct | Controller::Freezer => false,
                        _ => v2_available.iter().any(|x| x == c.name()),
                    };
                    if on_v2 {
                        v2_controllers.push(c);
                    }
                }
            }
        }
        let need_v2 =
            !v2_controllers.is_empty() || !v1.iter().any(|(c, _)| *c == Controller::Freezer);
        let v2 = if need_v2 { v2_parent } else { None };
        if v2.is_some()
            && let Some((_, own_path)) = own.iter().find(|(c, _)| c.is_empty())
        {
            // CRIU's `--cgroup-root` without a controller applies to every hierarchy not named
            // otherwise: right on a pure v2 host, wrong beside v1 hierarchies the sandbox merely
            // inherits (a `cpuset` cgroup made there has no CPUs). CRIU calls v2 `unified`.
            let name = if v1_mounts.is_empty() { None } else { Some("unified".to_owned()) };
            hierarchies.push((name, in_hierarchy(own_path)));
        }
        if v2.is_none() && !v1.iter().any(|(c, _)| *c == Controller::Freezer) {
            return Err(CgroupError::MissingController("freezer"));
        }
        Ok(Self { v1, v2, v2_controllers, hierarchies })
    }

    fn create_parents(&self) -> Result<(), CgroupError> {
        for (_, dir) in &self.v1 {
            fs::create_dir_all(dir).map_err(io_err("create cgroup", dir))?;
        }
        if let Some(dir) = &self.v2 {
            fs::create_dir_all(dir).map_err(io_err("create cgroup", dir))?;
            if !self.v2_controllers.is_empty() {
                let enable: Vec<String> =
                    self.v2_controllers.iter().map(|c| format!("+{}", c.name())).collect();
                let enable = enable.join(" ");
                if let Some(own) = dir.parent() {
                    enable_controllers(own, &enable)?;
                }
                write(&dir.join("cgroup.subtree_control"), &enable)?;
            }
        }
        tracing::debug!(?self, "cgroup layout");
        Ok(())
    }

    /// The directories sandbox `id` gets.
    pub fn paths_for(&self, id: &str) -> CgroupPaths {
        CgroupPaths {
            v1: self.v1.iter().map(|(c, p)| (*c, p.join(id))).collect(),
            v2: self.v2.as_ref().map(|p| p.join(id)),
            v2_controllers: self.v2_controllers.clone(),
        }
    }

    /// Sandbox `id`'s cgroup in every hierarchy used, as paths inside the hierarchies (what
    /// `/proc/<pid>/cgroup` shows and CRIU's `--cgroup-root` takes).
    pub fn hierarchy_paths(&self, id: &str) -> Vec<HierarchyPath> {
        self.hierarchies
            .iter()
            .map(|(controllers, parent)| HierarchyPath {
                controllers: controllers.clone(),
                path: parent.join(id),
            })
            .collect()
    }

    /// The controllers CRIU should dump (`--cgroup-dump-controller`; CRIU names v2 by the empty
    /// string, as `/proc/self/cgroup` does): the hierarchies sandboxes have cgroups of their own
    /// in. Without the restriction CRIU
    /// dumps, for every other hierarchy, the whole tree below the cgroup the sandbox inherited
    /// (the runtime's own, often the root), and a restore re-creates every directory of it that
    /// has gone since, other sandboxes' and other programs' included.
    pub fn dump_controllers(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (name, _) in &self.hierarchies {
            let names: Vec<&str> = match name.as_deref() {
                Some("unified") => vec![""],
                Some(n) => n.split(',').collect(),
                None => vec![""],
            };
            for n in names {
                if !out.iter().any(|o| o == n) {
                    out.push(n.to_owned());
                }
            }
        }
        out
    }

    /// Removes this runtime's parent directories, each only if no sandbox cgroup is left in it
    /// (missing ones are fine). Returns whether none is left.
    pub fn remove_parents(&self) -> bool {
        let mut gone = true;
        for dir in self.v1.iter().map(|(_, p)| p).chain(self.v2.as_ref()) {
            match fs::remove_dir(dir) {
                Ok(()) => tracing::debug!(?dir, "runtime cgroup removed"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    tracing::debug!(?dir, %error, "runtime cgroup kept");
                    gone = false;
                }
            }
        }
        gone
    }

    /// Names of the sandbox cgroups that exist under this runtime's parents.
    pub fn children(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for dir in self.v1.iter().map(|(_, p)| p).chain(self.v2.as_ref()) {
            if let Ok(entries) = fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        out.insert(e.file_name().to_string_lossy().into_owned());
                    }
                }
            }
        }
        out
    }
}

/// Enables `enable` in `own/cgroup.subtree_control`. If our own cgroup holds processes (the
/// kernel answers EBUSY), moves this process into an `own/supervisor` leaf first, as delegated
/// cgroups expect (cgroups(7), "no internal processes" rule).
fn enable_controllers(own: &Path, enable: &str) -> Result<(), CgroupError> {
    let control = own.join("cgroup.subtree_control");
    match write(&control, enable) {
        Ok(()) => Ok(()),
        Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
            let leaf = own.join("supervisor");
            fs::create_dir_all(&leaf).map_err(io_err("create cgroup", &leaf))?;
            for pid in fs::read_to_string(own.join("cgroup.procs")).unwrap_or_default().lines() {
                let _ = write(&leaf.join("cgroup.procs"), pid.trim());
            }
            write(&control, enable)
        }
        Err(e) => Err(e),
    }
}

/// Decodes the octal escapes mountinfo uses for spaces and friends.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    tracing::debug!(?path, value, "cgroup write");
    let mut f = fs::OpenOptions::new().write(true).open(path).map_err(io_err("open", path))?;
    f.write_all(value.as_bytes()).map_err(io_err("write", path))
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(io_err("read", path))
}

/// Polls `done` until it is true or `timeout` passes: 50 µs first, doubling up to 2 ms.
pub(crate) fn poll_until(
    path: &Path,
    what: &'static str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, CgroupError>,
) -> Result<(), CgroupError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CgroupError::Timeout { path: path.to_owned(), what, timeout });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_OWN: &str = "\
8:pids:/
6:freezer:/
4:memory:/process_api/e3d4
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn hybrid_layout_uses_v1_under_our_own_paths() {
        let layout =
            CgroupLayout::plan("oka", HYBRID_MOUNTINFO, HYBRID_OWN, |_| "hugetlb".into()).unwrap();
        let paths = layout.paths_for("s1");
        assert_eq!(
            paths.v1,
            [
                (Controller::Cpu, "/sys/fs/cgroup/cpu/oka/s1".into()),
                (Controller::Cpuacct, "/sys/fs/cgroup/cpuacct/oka/s1".into()),
                (Controller::Memory, "/sys/fs/cgroup/memory/process_api/e3d4/oka/s1".into()),
                (Controller::Pids, "/sys/fs/cgroup/pids/oka/s1".into()),
                (Controller::Freezer, "/sys/fs/cgroup/freezer/oka/s1".into()),
            ]
        );
        assert_eq!(paths.v2, None, "no unified node needed when v1 has everything");
        let h = |c: &str, p: &str| HierarchyPath { controllers: Some(c.into()), path: p.into() };
        assert_eq!(
            layout.hierarchy_paths("s1"),
            [
                h("cpu", "/oka/s1"),
                h("cpuacct", "/oka/s1"),
                h("memory", "/process_api/e3d4/oka/s1"),
                h("pids", "/oka/s1"),
                h("freezer", "/oka/s1"),
            ]
        );
        assert_eq!(paths.freezer_dir(), Some(Path::new("/sys/fs/cgroup/freezer/oka/s1")));
    }

    #[test]
    fn unified_only_on_a_hybrid_host_uses_the_v2_mount_and_refuses_missing_limits() {
        let layout = CgroupLayout::plan_unified_only("oka", HYBRID_MOUNTINFO, HYBRID_OWN, |_| {
            "hugetlb".into()
        })
        .unwrap();
        assert!(layout.is_unified_only());
        let paths = layout.paths_for("s1");
        assert!(paths.v1.is_empty());
        assert_eq!(paths.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified/oka/s1")));
        assert!(paths.v2_controllers.is_empty());
        assert_eq!(paths.freezer_dir(), paths.v2.as_deref());
        assert_eq!(
            layout.hierarchy_paths("s1"),
            [HierarchyPath { controllers: Some("unified".into()), path: "/oka/s1".into() }]
        );
        assert_eq!(layout.missing_for(&ResourceLimits::default()), None);
        let limits = ResourceLimits { pids: Some(64), ..Default::default() };
        assert_eq!(layout.missing_for(&limits), Some("pids"));
        // The default (per controller) plan of the same host needs none of that.
        let hybrid =
            CgroupLayout::plan("oka", HYBRID_MOUNTINFO, HYBRID_OWN, |_| "hugetlb".into()).unwrap();
        assert_eq!(hybrid.missing_for(&limits), None);
    }

    #[test]
    fn pure_v2_layout_puts_everything_in_one_directory() {
        let mountinfo = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = "0::/system.slice/oka.service\n";
        let layout = CgroupLayout::plan("oka", mountinfo, own, |dir| {
            assert_eq!(dir, Path::new("/sys/fs/cgroup/system.slice/oka.service"));
            "cpuset cpu io memory pids".into()
        })
        .unwrap();
        let paths = layout.paths_for("s1");
        assert!(paths.v1.is_empty());
        assert_eq!(
            paths.v2.as_deref(),
            Some(Path::new("/sys/fs/cgroup/system.slice/oka.service/oka/s1"))
        );
        assert_eq!(paths.v2_controllers, [Controller::Cpu, Controller::Memory, Controller::Pids]);
        assert_eq!(
            layout.hierarchy_paths("s1"),
            [HierarchyPath { controllers: None, path: "/system.slice/oka.service/oka/s1".into() }]
        );
        assert_eq!(paths.freezer_dir(), paths.v2.as_deref());
    }

    #[test]
    fn mount_roots_are_stripped_from_own_paths() {
        let mountinfo = "35 31 0:32 /outer /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                         36 31 0:33 / /sys/fs/cgroup/pids,freezer rw - cgroup cgroup rw,pids,freezer\n";
        let own = "4:memory:/outer/inner\n3:pids,freezer:/x\n";
        let layout = CgroupLayout::plan("oka", mountinfo, own, |_| String::new()).unwrap();
        let paths = layout.paths_for("s");
        assert_eq!(
            paths.v1_dir(Controller::Memory),
            Some(Path::new("/sys/fs/cgroup/memory/inner/oka/s"))
        );
        assert_eq!(
            paths.v1_dir(Controller::Freezer),
            Some(Path::new("/sys/fs/cgroup/pids,freezer/x/oka/s"))
        );
        // Co-mounted controllers are one hierarchy, named as /proc/self/cgroup names it.
        let names: Vec<Option<String>> =
            layout.hierarchy_paths("s").into_iter().map(|h| h.controllers).collect();
        assert_eq!(names, [Some("memory".to_owned()), Some("pids,freezer".to_owned())]);
        assert_eq!(layout.hierarchy_paths("s")[0].path, Path::new("/outer/inner/oka/s"));
    }

    #[test]
    fn missing_memory_controller_is_an_error() {
        let mountinfo = "37 31 0:34 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n";
        let err =
            CgroupLayout::plan("oka", mountinfo, "6:freezer:/\n", |_| String::new()).unwrap_err();
        assert!(matches!(err, CgroupError::MissingController("memory")));
    }

    /// The v2 freeze, kill and removal paths, exercised on the unified hierarchy (which every
    /// hybrid machine mounts, even with no controller on it).
    #[test]
    fn v2_freeze_thaw_kill_and_remove_work_on_the_unified_hierarchy() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED v2 cgroup test: needs root");
            return;
        }
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        let Some(mount) = mountinfo.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            post.starts_with("cgroup2 ").then(|| PathBuf::from(pre.split(' ').nth(4).unwrap()))
        }) else {
            eprintln!("SKIPPED v2 cgroup test: no cgroup2 mount");
            return;
        };
        let own_path =
            own.lines().find_map(|l| l.strip_prefix("0::")).unwrap().trim_start_matches('/');
        let parent = mount.join(own_path).join("oka-unit-v2");
        fs::create_dir_all(&parent).unwrap();
        let paths = CgroupPaths {
            v1: vec![],
            v2: Some(parent.join(std::process::id().to_string())),
            v2_controllers: vec![],
        };
        paths.create(&ResourceLimits::default()).unwrap();
        let mut child = std::process::Command::new("sleep").arg("100").spawn().unwrap();
        let pid = child.id() as i32;
        paths.add_process(pid).unwrap();
        assert_eq!(paths.processes().unwrap(), BTreeSet::from([pid]));

        paths.freeze(Duration::from_secs(5)).unwrap();
        assert!(paths.is_frozen().unwrap());
        paths.thaw(Duration::from_secs(5)).unwrap();
        assert!(!paths.is_frozen().unwrap());

        let reaper = std::thread::spawn(move || child.wait().unwrap());
        paths.kill_all(Duration::from_secs(5)).unwrap();
        assert!(!reaper.join().unwrap().success());
        paths.remove(Duration::from_secs(5)).unwrap();
        assert!(!paths.v2.as_ref().unwrap().exists());
        let _ = fs::remove_dir(&parent);
    }

    #[test]
    fn unescape_decodes_octal() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
    }
}
