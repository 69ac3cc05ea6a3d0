//! Checkpoint and restore of a sandbox's process tree with CRIU, by running the `criu` binary.
//!
//! Hibernate = [`Criu::dump`] of the sandbox init (memory, processes, namespaces); wake =
//! [`Criu::restore`] into fresh namespaces on the same root filesystem. This module only builds
//! `criu` command lines, runs them and turns their outcome into typed reports and errors; it knows
//! nothing about sandbox state. It needs CRIU 4.2 or newer (`scripts/install-criu.sh`): older
//! versions cannot dump INET sockets on kernels ≥ 6.16, and Debian 12's 3.17 fails `criu check` on
//! our 6.18 kernel.
//!
//! All calls block (a dump or restore takes 0.1–1 s); from async code run them in
//! `tokio::task::spawn_blocking`.
//!
//! # Expected flow
//!
//! Creating a sandbox (the runtime's side, prerequisites for a dump to succeed):
//! 1. the sandbox init calls `setsid()` (CRIU refuses a tree whose session leader is outside its
//!    pid namespace; `--shell-job` is therefore never used);
//! 2. its stdio are pipes owned by the daemon, never host files (CRIU cannot reopen a file whose
//!    mount is outside the sandbox). Record the pipe keys ([`fd_key`], e.g. `pipe:[26397]`) of the
//!    sandbox-side ends; [`DumpReport::stdio`] also reports them as seen at dump time;
//! 3. every bind mount from the host into the sandbox (`/usr`, `/dev/null`, …) is listed as an
//!    [`ExternalMount`] with a stable key; the overlay root and the sandbox's own `proc`/`tmpfs`
//!    mounts need nothing.
//!
//! Hibernate:
//! 1. [`Criu::dump`] with the init's host pid and an empty images directory. CRIU freezes the tree,
//!    locks the sandbox network (nftables table inside the sandbox netns), writes the images and,
//!    unless [`DumpRequest::leave_running`], kills the tree with SIGKILL;
//! 2. the runtime reaps the init (it is the daemon's child, or the daemon is a subreaper) and may
//!    remove the sandbox cgroups and unmount the overlay; the writable (upper) layer must be kept
//!    unchanged until restore.
//!
//! Restore:
//! 1. mount the overlay again on the host (same lower/upper/work dirs) → `root`;
//! 2. create the cgroups the restored tree should live in (with their limits) and pass them as
//!    [`CgroupRoot`]s; create fresh stdio pipes and pass their sandbox-side ends as [`InheritFd`]s
//!    keyed by the old pipe keys;
//! 3. [`Criu::restore`]: CRIU creates new namespaces, the mount tree on top of `root` (tmpfs content
//!    comes from the images, external mounts are bound from their host `source`), the netns (lo,
//!    addresses, routes), the processes, and unlocks the network. With
//!    [`RestoreRequest::sibling`] (the default) the restored init is a **child of the calling
//!    process**; its host pid is in [`RestoreReport::pid`];
//! 4. the host-side overlay mount at `root` may then be lazily unmounted (`umount -l`): the
//!    sandbox's mount namespace keeps its own reference.
//!
//! # Guarantees
//!
//! - A successful [`Criu::dump`] without `leave_running` means the images are complete and the tree
//!   has been killed (not necessarily reaped yet: reaping is the parent's job).
//! - A failed dump leaves the tree as it was: running, network unlocked (tested with a dump refused
//!   for an established connection); exceptions: a frozen tree without `freeze_cgroup`, or `criu`
//!   killed mid-dump, see Caveats.
//! - A failed restore leaves no restored process behind (CRIU kills what it created; CRIU's
//!   behaviour, not exercised by our tests).
//! - Every [`CriuError::Failed`] carries the `Error`/`BUG` lines of CRIU's log (known harmless noise
//!   filtered out) and the log's path; the full log stays in the work directory.
//! - Restore only reads the images directory (its log and pid file go to the work directory).
//!
//! # Caveats
//!
//! - No incremental (pre-)dumps: our kernel lacks `CONFIG_MEM_SOFT_DIRTY` (`criu pre-dump` hits
//!   `BUG at criu/mem.c:46`). Every dump is full; image size ≈ resident memory.
//! - Established TCP connections make the dump fail unless [`TcpMode::Close`] or
//!   [`TcpMode::Established`] is chosen. A connection the *host* opened into the sandbox (setns
//!   socket) has its peer outside the tree: restore it closed ([`TcpMode::Close`]). Connections
//!   not yet accepted by the server also fail the dump unless [`DumpRequest::skip_in_flight`].
//! - [`NetworkLock::Nftables`] needs a CRIU built with libnftables (ours is; check with
//!   [`Criu::supports`]`("network_lock_nftables")`). [`NetworkLock::Iptables`] (CRIU's default)
//!   needs `iptables-restore` in the host, which we do not install. [`NetworkLock::Skip`] works
//!   everywhere but lets packets reach a half-dumped sandbox; only acceptable for loopback-only
//!   sandboxes. `criu restore` ignores `--network-lock` (it is never passed there).
//! - `--pidfile` is created with `O_EXCL`: a stale file makes the restore fail with `File exists`;
//!   [`Criu::restore`] removes it first.
//! - The restored pid namespace is new, so pid clashes with the (possibly still unreaped) original
//!   cannot happen; restoring into the *same* pid namespace while the original is a zombie fails
//!   with `Can't fork for N: File exists`.
//! - A tree frozen by the cgroup freezer (a paused sandbox) cannot be seized with ptrace: without
//!   [`DumpRequest::freeze_cgroup`] the dump fails after CRIU's 10 s collection timeout with
//!   `Unseizable non-zombie N found, state D` and the tree stays frozen. With it (v1 freezer
//!   directory), a frozen sandbox dumps normally and restores running. (v2 `cgroup.freeze` via
//!   `--freeze-cgroup` is supported by CRIU but not exercised here: our machines are hybrid.)
//! - With [`RestoreRequest::sibling`] the restored init is the caller's child but not a
//!   `std`/`tokio` `Child`: reap it with `waitpid`/a pidfd, or it stays a zombie after it exits.
//!   Without `sibling` it is reparented to the nearest `PR_SET_CHILD_SUBREAPER` ancestor or PID 1
//!   (which reaps slowly on our machines) when `criu` exits. A restore with `sibling` that fails
//!   after forking leaves its killed root task a zombie child of the caller that nothing else
//!   knows about; without `sibling`, `criu` reaps it (the local runtime restores without it and is
//!   a subreaper).
//! - After a failed restore, CRIU's `cgroupd` helper outlives `criu` briefly and is re-parented
//!   to the nearest subreaper. Every run here waits for and reaps such orphaned helpers that come
//!   to this process (children named like the binary that no call of this module waits for).
//! - If `criu` is killed (e.g. [`DumpRequest::timeout`]) in the middle of a dump, the tree is
//!   released by ptrace but the nftables lock table inside the sandbox netns may remain.
//! - CRIU logs `rlimit: Can't setup RLIMIT_NOFILE for self`, `iptables-save -V failed` and
//!   `Address already assigned` on success on our machines; they are filtered from error tails.
//!
//! # Measured
//!
//! criu 4.2.1 built by `scripts/install-criu.sh`, kernel 6.18, 2 vCPU VM shared with other builds,
//! images on ext4; sandbox = mnt+pid+net+uts+ipc namespaces, overlay root, tmpfs `/tmp`, `python3`
//! HTTP server; `tests/criu_primitive.rs`, wall time of the `criu` command, median (min–max) of
//! 14 runs (in 7 of them the 200 MB sandbox was frozen and dumped with `--freeze-cgroup`, in 7 the
//! 20 MB dump had `--tcp-close --skip-in-flight`; no visible difference):
//!
//! | python allocation | RSS | dump | restore | images |
//! |---|---|---|---|---|
//! | 20 MB | 38 MiB | 135 ms (113–183) | 130 ms (106–224) | 28.7 MiB |
//! | 200 MB | 218 MiB | 287 ms (210–752) | 247 ms (203–416) | 208.7 MiB |
//!
//! Images hold the anonymous memory (file-backed pages of `/usr` are not copied) plus tmpfs
//! contents.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Oldest CRIU that works on our kernels (INET sockets on kernels ≥ 6.16 need 4.2).
pub const MIN_VERSION: CriuVersion = CriuVersion { major: 4, minor: 2, patch: 0 };

/// Environment variable naming the `criu` binary to use, before `PATH` is searched.
pub const CRIU_ENV: &str = "OKA_CRIU";

/// Places searched after `PATH` (where `scripts/install-criu.sh` installs, then distro paths).
const FALLBACK_BINARIES: &[&str] =
    &["/usr/local/sbin/criu", "/usr/local/bin/criu", "/usr/sbin/criu"];

/// Log lines CRIU prints with `Error` on successful runs on our machines.
const HARMLESS_ERRORS: &[&str] = &[
    "RLIMIT_NOFILE",
    "tables-save -V failed",
    "tables-restore -V failed",
    "tables-legacy-save -V failed",
    "tables-legacy-restore -V failed",
    "execvp(\"iptables",
    "execvp(\"ip6tables",
    "Address already assigned",
    "address already assigned",
];

/// How many error lines of the log an error keeps.
const ERROR_TAIL_LINES: usize = 8;

/// A CRIU version, from `criu --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CriuVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level (0 when `criu --version` prints none).
    pub patch: u32,
}

impl fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl CriuVersion {
    /// Parses the output of `criu --version` (`Version: 4.2.1`, optionally followed by `GitID:`).
    pub fn parse(output: &str) -> Option<Self> {
        let line = output.lines().find_map(|l| l.trim().strip_prefix("Version:"))?;
        let mut parts = line.trim().split('.').map(|p| p.trim().parse::<u32>());
        let major = parts.next()?.ok()?;
        let minor = parts.next()?.ok()?;
        let patch = match parts.next() {
            Some(p) => p.ok()?,
            None => 0,
        };
        Some(Self { major, minor, patch })
    }
}

/// What `criu` was asked to do, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `criu dump`.
    Dump,
    /// `criu restore`.
    Restore,
    /// `criu check`.
    Check,
    /// `criu --version`.
    Version,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Dump => "dump",
            Self::Restore => "restore",
            Self::Check => "check",
            Self::Version => "--version",
        })
    }
}

/// Errors of this module. Messages are lower-case without a trailing period.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    /// No `criu` binary was found.
    #[error(
        "criu binary not found (set {CRIU_ENV}, or install criu >= {MIN_VERSION} with scripts/install-criu.sh)"
    )]
    NotFound,
    /// The binary could not be started.
    #[error("cannot run {}: {source}", binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The binary is older than [`MIN_VERSION`].
    #[error("{} is criu {found}, need {MIN_VERSION} or newer (scripts/install-criu.sh)", binary.display())]
    TooOld {
        /// The binary.
        binary: PathBuf,
        /// Its version.
        found: CriuVersion,
    },
    /// `criu --version` printed something unexpected.
    #[error("cannot parse the version of {} from {output:?}", binary.display())]
    BadVersion {
        /// The binary.
        binary: PathBuf,
        /// What it printed.
        output: String,
    },
    /// The request is inconsistent; nothing was run.
    #[error("invalid criu {action} request: {reason}")]
    InvalidRequest {
        /// What was requested.
        action: Action,
        /// Why it is invalid.
        reason: String,
    },
    /// `criu` ran and failed.
    #[error("criu {action} failed ({status}): {}", summary(errors))]
    Failed {
        /// What was requested.
        action: Action,
        /// Its exit status.
        status: ExitStatus,
        /// The `Error`/`BUG` lines of its log (or of its stderr when the log has none), last ones.
        errors: Vec<String>,
        /// The full log.
        log: PathBuf,
    },
    /// `criu` did not finish in time and was killed.
    #[error("criu {action} timed out after {timeout:?} (log: {})", log.display())]
    Timeout {
        /// What was requested.
        action: Action,
        /// The limit.
        timeout: Duration,
        /// The full log.
        log: PathBuf,
    },
    /// A file system operation around the run failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn summary(errors: &[String]) -> String {
    if errors.is_empty() { "no error lines in its log".to_owned() } else { errors.join(" | ") }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> CriuError {
    let context = context.into();
    move |source| CriuError::Io { context, source }
}

/// A bind mount from the host into the sandbox, which CRIU must treat as external.
///
/// Dump uses `--external mnt[<mountpoint>]:<key>`, restore `--external mnt[<key>]:<source>`. Keep
/// the same list in the sandbox's state for both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalMount {
    /// Stable name of the mount in the images (`[A-Za-z0-9_.-]+`).
    pub key: String,
    /// Where it is mounted, as seen inside the sandbox (e.g. `/dev/null`, `/usr`).
    pub mountpoint: PathBuf,
    /// What to bind there on restore, a host path (e.g. `/dev/null`, `/usr`).
    pub source: PathBuf,
}

impl ExternalMount {
    /// An external mount whose host source is the same path as its sandbox mountpoint.
    pub fn same_path(key: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self { key: key.into(), mountpoint: path.clone(), source: path }
    }
}

/// How CRIU keeps the sandbox network quiet while dumping (`--network-lock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkLock {
    /// An nftables table inside the sandbox netns (needs CRIU built with libnftables; works here).
    #[default]
    Nftables,
    /// `iptables-restore` rules (CRIU's own default; needs `iptables` on the host).
    Iptables,
    /// No locking: acceptable only for loopback-only sandboxes.
    Skip,
}

impl NetworkLock {
    fn as_arg(self) -> &'static str {
        match self {
            Self::Nftables => "nftables",
            Self::Iptables => "iptables",
            Self::Skip => "skip",
        }
    }
}

/// What to do with established TCP connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TcpMode {
    /// Fail the dump if there is one (CRIU's default).
    #[default]
    Refuse,
    /// Checkpoint them and restore them established (`--tcp-established`): both ends must be in
    /// the tree or the peer must survive unchanged.
    Established,
    /// Do not dump their state; restore them closed (`--tcp-close`). Right for connections the
    /// host opened into the sandbox.
    Close,
}

impl TcpMode {
    fn arg(self) -> Option<&'static str> {
        match self {
            Self::Refuse => None,
            Self::Established => Some("--tcp-established"),
            Self::Close => Some("--tcp-close"),
        }
    }
}

/// `--manage-cgroups` mode (see `criu --help`); `None` in a request leaves CRIU's default (`soft`:
/// restore into the recorded cgroups, creating missing ones, without changing existing ones'
/// limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManageCgroups {
    /// Do not dump or restore cgroup properties.
    None,
    /// Properties only.
    Props,
    /// CRIU's default.
    Soft,
    /// Restore all properties.
    Full,
    /// Fail if the cgroup tree differs.
    Strict,
    /// Ignore cgroups entirely: the restored tree stays in `criu`'s own cgroups.
    Ignore,
}

impl ManageCgroups {
    fn as_arg(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Props => "props",
            Self::Soft => "soft",
            Self::Full => "full",
            Self::Strict => "strict",
            Self::Ignore => "ignore",
        }
    }
}

/// `--cgroup-root [controller:]path` on restore: the dumped tree's cgroup (per controller) is
/// replaced by `path`, so the restored processes land in (and below) `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    /// Controller as named in `/proc/self/cgroup` (`memory`, `cpu,cpuacct`, `pids`, …);
    /// `None` = every controller not named otherwise (the only form on pure cgroup v2).
    pub controller: Option<String>,
    /// Path inside that hierarchy (as in `/proc/<pid>/cgroup`, e.g. `/oka/sbx-1`).
    pub path: PathBuf,
}

/// A file descriptor handed to `criu restore` to stand for a resource of the dumped tree
/// (`--inherit-fd fd[N]:<key>`), e.g. a fresh stdio pipe for the old one.
#[derive(Debug)]
pub struct InheritFd {
    /// The descriptor (the sandbox's end). Closed in the caller when the restore returns.
    pub fd: OwnedFd,
    /// What it replaces, as reported by [`fd_key`] at creation or [`DumpReport::stdio`]
    /// (e.g. `pipe:[26397]`).
    pub key: String,
}

/// Input of [`Criu::dump`].
#[derive(Debug, Clone)]
pub struct DumpRequest {
    /// Host pid of the sandbox init (the root of the tree; pid 1 inside).
    pub pid: u32,
    /// Where the images go; created if missing; must not already hold a checkpoint.
    pub images_dir: PathBuf,
    /// Where the log (`dump.log`), stats and `criu`'s stdout/stderr go; default `images_dir`.
    pub work_dir: Option<PathBuf>,
    /// Keep the tree running after the dump (snapshot) instead of killing it.
    pub leave_running: bool,
    /// Host bind mounts inside the sandbox.
    pub external_mounts: Vec<ExternalMount>,
    /// Network locking method.
    pub network_lock: NetworkLock,
    /// Established TCP connections.
    pub tcp: TcpMode,
    /// Drop connections still in a listening socket's accept queue (`--skip-in-flight`); without
    /// it their presence fails the dump (`In-flight connection (l) for …`). Their clients see a
    /// reset. Recommended for hibernation of sandboxes that receive traffic.
    pub skip_in_flight: bool,
    /// Dump file locks (`--file-locks`).
    pub file_locks: bool,
    /// `--manage-cgroups` mode; `None` = CRIU's default.
    pub manage_cgroups: Option<ManageCgroups>,
    /// The sandbox's freezer cgroup directory (`--freeze-cgroup`, e.g.
    /// `/sys/fs/cgroup/freezer/<…>/sbx-1`): CRIU then stops the tree with the freezer instead of
    /// signals. Required when the sandbox may be paused (frozen) at dump time.
    pub freeze_cgroup: Option<PathBuf>,
    /// `-v` level (0–4); 2 (CRIU's default) logs errors and warnings, 4 is very verbose and slower.
    pub log_level: u8,
    /// Kill `criu` after this long.
    pub timeout: Option<Duration>,
    /// Further arguments, appended last.
    pub extra_args: Vec<OsString>,
}

impl DumpRequest {
    /// A dump of `pid` into `images_dir` with the defaults: kill after dump, nftables lock,
    /// refuse established TCP and in-flight connections, no file locks, CRIU's cgroup mode, no
    /// freezer, log level 2, no timeout.
    pub fn new(pid: u32, images_dir: impl Into<PathBuf>) -> Self {
        Self {
            pid,
            images_dir: images_dir.into(),
            work_dir: None,
            leave_running: false,
            external_mounts: Vec::new(),
            network_lock: NetworkLock::default(),
            tcp: TcpMode::default(),
            skip_in_flight: false,
            file_locks: false,
            manage_cgroups: None,
            freeze_cgroup: None,
            log_level: 2,
            timeout: None,
            extra_args: Vec::new(),
        }
    }

    fn work_dir(&self) -> &Path {
        self.work_dir.as_deref().unwrap_or(&self.images_dir)
    }

    /// The `criu` arguments of this request.
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        a.push("dump");
        a.push("--tree").push(self.pid.to_string());
        a.push("--images-dir").push(&self.images_dir);
        a.push("--work-dir").push(self.work_dir());
        a.push("--log-file").push("dump.log");
        a.push(format!("-v{}", self.log_level.min(4)));
        if self.leave_running {
            a.push("--leave-running");
        }
        a.push("--network-lock").push(self.network_lock.as_arg());
        if let Some(t) = self.tcp.arg() {
            a.push(t);
        }
        if self.skip_in_flight {
            a.push("--skip-in-flight");
        }
        if self.file_locks {
            a.push("--file-locks");
        }
        if let Some(m) = self.manage_cgroups {
            a.push(format!("--manage-cgroups={}", m.as_arg()));
        }
        if let Some(f) = &self.freeze_cgroup {
            a.push("--freeze-cgroup").push(f);
        }
        for m in &self.external_mounts {
            let mut v = OsString::from("mnt[");
            v.push(&m.mountpoint);
            v.push("]:");
            v.push(&m.key);
            a.push("--external").push(v);
        }
        a.0.extend(self.extra_args.iter().cloned());
        a.0
    }
}

/// Output of [`Criu::dump`].
#[derive(Debug, Clone)]
pub struct DumpReport {
    /// Wall time of `criu dump`.
    pub duration: Duration,
    /// Total size of the files in the images directory.
    pub image_bytes: u64,
    /// The log.
    pub log: PathBuf,
    /// Whether the tree was left running.
    pub leave_running: bool,
    /// What the init's fds 0, 1 and 2 pointed to just before the dump (`readlink`), e.g.
    /// `pipe:[26397]`: the keys for [`InheritFd`] on restore.
    pub stdio: Vec<(i32, String)>,
}

/// Input of [`Criu::restore`].
#[derive(Debug)]
pub struct RestoreRequest {
    /// The images of a successful dump.
    pub images_dir: PathBuf,
    /// Where the log (`restore.log`), pid file and `criu`'s stdout/stderr go; default
    /// `images_dir`. Must not be inside `root`.
    pub work_dir: Option<PathBuf>,
    /// The sandbox's root file system as mounted on the host now (the re-mounted overlay's merged
    /// dir); becomes `/` of the restored mount namespace.
    pub root: PathBuf,
    /// The same list as on dump (keys must match; `source` is used here).
    pub external_mounts: Vec<ExternalMount>,
    /// Descriptors standing for resources outside the tree (stdio pipes).
    pub inherit_fds: Vec<InheritFd>,
    /// Restore the root task as a child of the caller (`--restore-sibling`) rather than of the
    /// short-lived `criu` (where it would be reparented to a subreaper or PID 1). Default true.
    pub sibling: bool,
    /// Where CRIU writes the restored init's host pid; default `<work_dir>/restore.pid`. Removed
    /// before the run if present.
    pub pidfile: Option<PathBuf>,
    /// Cgroups to restore the tree into, per controller.
    pub cgroup_roots: Vec<CgroupRoot>,
    /// `--manage-cgroups` mode; `None` = CRIU's default (`soft`).
    pub manage_cgroups: Option<ManageCgroups>,
    /// Must match the dump.
    pub tcp: TcpMode,
    /// Must match the dump.
    pub file_locks: bool,
    /// `-v` level (0–4).
    pub log_level: u8,
    /// Kill `criu` after this long.
    pub timeout: Option<Duration>,
    /// Further arguments, appended last.
    pub extra_args: Vec<OsString>,
}

impl RestoreRequest {
    /// A detached restore of `images_dir` onto `root`, as a sibling, with CRIU's cgroup handling
    /// and log level 2.
    pub fn new(images_dir: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            images_dir: images_dir.into(),
            work_dir: None,
            root: root.into(),
            external_mounts: Vec::new(),
            inherit_fds: Vec::new(),
            sibling: true,
            pidfile: None,
            cgroup_roots: Vec::new(),
            manage_cgroups: None,
            tcp: TcpMode::default(),
            file_locks: false,
            log_level: 2,
            timeout: None,
            extra_args: Vec::new(),
        }
    }

    fn work_dir(&self) -> &Path {
        self.work_dir.as_deref().unwrap_or(&self.images_dir)
    }

    /// Where the restored init's pid will be written.
    pub fn pidfile(&self) -> PathBuf {
        self.pidfile.clone().unwrap_or_else(|| self.work_dir().join("restore.pid"))
    }

    /// The `criu` arguments of this request (inherited descriptors by their current numbers).
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        a.push("restore");
        a.push("--images-dir").push(&self.images_dir);
        a.push("--work-dir").push(self.work_dir());
        a.push("--log-file").push("restore.log");
        a.push(format!("-v{}", self.log_level.min(4)));
        a.push("--restore-detached");
        if self.sibling {
            a.push("--restore-sibling");
        }
        a.push("--pidfile").push(self.pidfile());
        a.push("--root").push(&self.root);
        if let Some(t) = self.tcp.arg() {
            a.push(t);
        }
        if self.file_locks {
            a.push("--file-locks");
        }
        if let Some(m) = self.manage_cgroups {
            a.push(format!("--manage-cgroups={}", m.as_arg()));
        }
        for c in &self.cgroup_roots {
            let mut v = OsString::new();
            if let Some(ctl) = &c.controller {
                v.push(ctl);
                v.push(":");
            }
            v.push(&c.path);
            a.push("--cgroup-root").push(v);
        }
        for m in &self.external_mounts {
            let mut v = OsString::from("mnt[");
            v.push(&m.key);
            v.push("]:");
            v.push(&m.source);
            a.push("--external").push(v);
        }
        for f in &self.inherit_fds {
            a.push("--inherit-fd").push(format!("fd[{}]:{}", f.fd.as_raw_fd(), f.key));
        }
        a.0.extend(self.extra_args.iter().cloned());
        a.0
    }
}

/// Output of [`Criu::restore`].
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Host pid of the restored sandbox init (a child of the caller when `sibling`).
    pub pid: u32,
    /// Wall time of `criu restore`.
    pub duration: Duration,
    /// The log.
    pub log: PathBuf,
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push(&mut self, s: impl AsRef<OsStr>) -> &mut Self {
        self.0.push(s.as_ref().to_owned());
        self
    }
}

/// A `criu` binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Criu {
    binary: PathBuf,
}

impl Criu {
    /// Uses `binary` as is.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self { binary: binary.into() }
    }

    /// Finds `criu`: `$OKA_CRIU`, then `PATH`, then `/usr/local/sbin`, `/usr/local/bin`,
    /// `/usr/sbin`. Does not check the version (see [`Criu::check`]).
    pub fn locate() -> Result<Self, CriuError> {
        if let Some(p) = std::env::var_os(CRIU_ENV).filter(|p| !p.is_empty()) {
            return Ok(Self::new(p));
        }
        let on_path = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join("criu"));
        on_path
            .chain(FALLBACK_BINARIES.iter().map(PathBuf::from))
            .find(|p| is_executable(p))
            .map(Self::new)
            .ok_or(CriuError::NotFound)
    }

    /// The binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// `criu --version`.
    pub fn version(&self) -> Result<CriuVersion, CriuError> {
        let out = output_tracked(self.command().arg("--version").stdin(Stdio::null())).map_err(
            |source| {
                if source.kind() == io::ErrorKind::NotFound {
                    CriuError::NotFound
                } else {
                    CriuError::Spawn { binary: self.binary.clone(), source }
                }
            },
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        CriuVersion::parse(&text).ok_or_else(|| CriuError::BadVersion {
            binary: self.binary.clone(),
            output: format!("{}{}", text, String::from_utf8_lossy(&out.stderr)).trim().to_owned(),
        })
    }

    /// Checks the version is at least [`MIN_VERSION`] and `criu check` passes on this kernel.
    pub fn check(&self) -> Result<CriuVersion, CriuError> {
        let version = self.version()?;
        if version < MIN_VERSION {
            return Err(CriuError::TooOld { binary: self.binary.clone(), found: version });
        }
        let out = output_tracked(self.command().arg("check").stdin(Stdio::null()))
            .map_err(|source| CriuError::Spawn { binary: self.binary.clone(), source })?;
        if !out.status.success() {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return Err(CriuError::Failed {
                action: Action::Check,
                status: out.status,
                errors: error_lines(&text),
                log: PathBuf::new(),
            });
        }
        Ok(version)
    }

    /// `criu check --feature <name>` (e.g. `network_lock_nftables`).
    pub fn supports(&self, feature: &str) -> Result<bool, CriuError> {
        let out = output_tracked(
            self.command().args(["check", "--feature", feature]).stdin(Stdio::null()),
        )
        .map_err(|source| CriuError::Spawn { binary: self.binary.clone(), source })?;
        Ok(out.status.success())
    }

    /// Checkpoints the tree rooted at `req.pid`. See the module doc for prerequisites.
    pub fn dump(&self, req: &DumpRequest) -> Result<DumpReport, CriuError> {
        let invalid = |reason: String| CriuError::InvalidRequest { action: Action::Dump, reason };
        if req.pid <= 1 {
            return Err(invalid(format!("pid {} is not a sandbox init", req.pid)));
        }
        check_keys(Action::Dump, &req.external_mounts)?;
        let proc_dir = PathBuf::from(format!("/proc/{}", req.pid));
        if !proc_dir.exists() {
            return Err(invalid(format!("no process with pid {}", req.pid)));
        }
        fs::create_dir_all(&req.images_dir)
            .map_err(io_err(format!("create {}", req.images_dir.display())))?;
        if req.images_dir.join("inventory.img").exists() {
            return Err(invalid(format!(
                "{} already holds a checkpoint",
                req.images_dir.display()
            )));
        }
        let work = req.work_dir();
        fs::create_dir_all(work).map_err(io_err(format!("create {}", work.display())))?;
        let stdio = (0..3)
            .filter_map(|fd| {
                fs::read_link(proc_dir.join("fd").join(fd.to_string()))
                    .ok()
                    .map(|t| (fd, t.to_string_lossy().into_owned()))
            })
            .collect();

        let log = work.join("dump.log");
        let duration = self.run(Action::Dump, req.args(), work, &log, req.timeout, &[])?;
        let image_bytes = dir_size(&req.images_dir)
            .map_err(io_err(format!("size of {}", req.images_dir.display())))?;
        tracing::info!(
            pid = req.pid,
            ms = duration.as_millis() as u64,
            image_bytes,
            leave_running = req.leave_running,
            "criu dump done"
        );
        Ok(DumpReport { duration, image_bytes, log, leave_running: req.leave_running, stdio })
    }

    /// Restores a checkpoint into fresh namespaces on `req.root`. The inherited descriptors are
    /// closed in the caller when this returns.
    pub fn restore(&self, req: RestoreRequest) -> Result<RestoreReport, CriuError> {
        let invalid =
            |reason: String| CriuError::InvalidRequest { action: Action::Restore, reason };
        check_keys(Action::Restore, &req.external_mounts)?;
        if !req.images_dir.join("inventory.img").is_file() {
            return Err(invalid(format!("{} holds no checkpoint", req.images_dir.display())));
        }
        if !req.root.is_dir() {
            return Err(invalid(format!("root {} is not a directory", req.root.display())));
        }
        let work = req.work_dir().to_owned();
        fs::create_dir_all(&work).map_err(io_err(format!("create {}", work.display())))?;
        let pidfile = req.pidfile();
        match fs::remove_file(&pidfile) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove stale {}", pidfile.display()))(e)),
        }
        // Descriptors 0-2 of `criu` are replaced by the Command's stdio: move ours above.
        let mut inherit = Vec::with_capacity(req.inherit_fds.len());
        for f in req.inherit_fds {
            let fd = if f.fd.as_raw_fd() < 3 {
                f.fd.try_clone().map_err(io_err("duplicate an inherited descriptor"))?
            } else {
                f.fd
            };
            inherit.push(InheritFd { fd, key: f.key });
        }
        let req = RestoreRequest { inherit_fds: inherit, ..req };
        let raw: Vec<i32> = req.inherit_fds.iter().map(|f| f.fd.as_fd().as_raw_fd()).collect();

        let log = work.join("restore.log");
        let duration = self.run(Action::Restore, req.args(), &work, &log, req.timeout, &raw)?;
        let text =
            fs::read_to_string(&pidfile).map_err(io_err(format!("read {}", pidfile.display())))?;
        let pid = text.trim().parse::<u32>().map_err(|_| CriuError::Io {
            context: format!("parse {}", pidfile.display()),
            source: io::Error::new(io::ErrorKind::InvalidData, format!("{text:?} is not a pid")),
        })?;
        tracing::info!(pid, ms = duration.as_millis() as u64, "criu restore done");
        Ok(RestoreReport { pid, duration, log })
    }

    fn command(&self) -> Command {
        Command::new(&self.binary)
    }

    /// Waits for and reaps the helpers of finished `criu` runs that were re-parented to this
    /// process (a child subreaper): children with the binary's command name that no call here
    /// is waiting for. A failed restore leaves such a helper (CRIU's `cgroupd` exits after
    /// `criu` does). Gives up on helpers still running after `timeout`.
    fn reap_orphaned_helpers(&self, timeout: Duration) {
        let Some(comm) = self.binary.file_name().map(|n| {
            let n = n.as_encoded_bytes();
            String::from_utf8_lossy(&n[..n.len().min(15)]).into_owned()
        }) else {
            return;
        };
        let me = std::process::id() as i32;
        let orphans: Vec<i32> = {
            let waited = WAITED.lock().unwrap_or_else(PoisonError::into_inner);
            own_children()
                .into_iter()
                .filter(|pid| !waited.contains(pid) && is_child_named(*pid, me, &comm))
                .collect()
        };
        let deadline = Instant::now() + timeout;
        for pid in orphans {
            let Some(pidfd) = rustix::process::Pid::from_raw(pid).and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
            }) else {
                continue;
            };
            // The pidfd pins the process; it is still an orphaned helper of ours (a child's pid
            // is not reused before it is reaped, but it may have been reaped meanwhile).
            if !is_child_named(pid, me, &comm) {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let exited = rustix::event::Timespec::try_from(left).ok().is_some_and(|ts| {
                let mut fds = [rustix::event::PollFd::new(&pidfd, rustix::event::PollFlags::IN)];
                matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
            });
            if !exited {
                tracing::warn!(pid, "orphaned criu helper still running");
                continue;
            }
            let reaped = rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.as_fd()),
                rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
            );
            tracing::debug!(pid, ?reaped, "reaped an orphaned criu helper");
        }
    }

    /// Runs `criu args` in `work`, stdout/stderr to `<log>.out`, inheriting `inherit` fds.
    fn run(
        &self,
        action: Action,
        args: Vec<OsString>,
        work: &Path,
        log: &Path,
        timeout: Option<Duration>,
        inherit: &[i32],
    ) -> Result<Duration, CriuError> {
        let out_path = log.with_extension("out");
        let out = fs::File::create(&out_path)
            .map_err(io_err(format!("create {}", out_path.display())))?;
        let err = out.try_clone().map_err(io_err("duplicate the output file"))?;
        let mut cmd = self.command();
        cmd.args(&args).current_dir(work).stdin(Stdio::null()).stdout(out).stderr(err);
        if !inherit.is_empty() {
            let fds = inherit.to_vec();
            // SAFETY: the closure only calls fcntl(2), which is async-signal-safe, on descriptors
            // that stay open in the parent for the duration of the spawn; it does not allocate.
            unsafe {
                cmd.pre_exec(move || {
                    for &fd in &fds {
                        if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        tracing::debug!(binary = %self.binary.display(), ?args, "running criu");
        let start = Instant::now();
        let mut child = spawn_tracked(&mut cmd)
            .map_err(|source| CriuError::Spawn { binary: self.binary.clone(), source })?;
        let _tracked = Untrack(child.id());
        let status = match timeout {
            None => child.wait().map_err(io_err("wait for criu"))?,
            Some(limit) => {
                let mut pause = Duration::from_millis(1);
                loop {
                    if let Some(st) = child.try_wait().map_err(io_err("wait for criu"))? {
                        break st;
                    }
                    if start.elapsed() >= limit {
                        let _ = child.kill();
                        let _ = child.wait();
                        self.reap_orphaned_helpers(ORPHAN_TIMEOUT);
                        return Err(CriuError::Timeout { action, timeout: limit, log: log.into() });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
            }
        };
        let duration = start.elapsed();
        self.reap_orphaned_helpers(ORPHAN_TIMEOUT);
        if status.success() {
            return Ok(duration);
        }
        let mut errors = fs::read_to_string(log).map(|t| error_lines(&t)).unwrap_or_default();
        if errors.is_empty() {
            errors = fs::read_to_string(&out_path)
                .map(|t| {
                    let lines: Vec<String> =
                        t.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect();
                    lines[lines.len().saturating_sub(ERROR_TAIL_LINES)..].to_vec()
                })
                .unwrap_or_default();
        }
        tracing::warn!(%action, %status, log = %log.display(), ?errors, "criu failed");
        Err(CriuError::Failed { action, status, errors, log: log.into() })
    }
}

/// Pids of the `criu` processes started here that a call is waiting for: never taken for
/// orphaned helpers by [`Criu::reap_orphaned_helpers`].
static WAITED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// How long a run waits for the helpers `criu` left behind to exit.
const ORPHAN_TIMEOUT: Duration = Duration::from_secs(2);

/// Spawns `cmd` and registers it in [`WAITED`] (atomically with respect to the orphan scan).
fn spawn_tracked(cmd: &mut Command) -> io::Result<std::process::Child> {
    let mut waited = WAITED.lock().unwrap_or_else(PoisonError::into_inner);
    let child = cmd.spawn()?;
    waited.insert(child.id() as i32);
    Ok(child)
}

/// Takes a pid out of [`WAITED`] when dropped (after it was waited for).
struct Untrack(u32);

impl Drop for Untrack {
    fn drop(&mut self) {
        WAITED.lock().unwrap_or_else(PoisonError::into_inner).remove(&(self.0 as i32));
    }
}

/// `cmd.output()`, registered in [`WAITED`] while it runs.
fn output_tracked(cmd: &mut Command) -> io::Result<std::process::Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = spawn_tracked(cmd)?;
    let _tracked = Untrack(child.id());
    child.wait_with_output()
}

/// The children of every thread of this process.
fn own_children() -> Vec<i32> {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else { return vec![] };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// Whether `pid` is a child of process `parent` with command name `comm`.
fn is_child_named(pid: i32, parent: i32, comm: &str) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { return false };
    let ppid = stat[close + 1..].split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok());
    &stat[open + 1..close] == comm && ppid == Some(parent)
}

/// The last `Error`/`BUG` lines of a CRIU log, without known harmless ones.
pub fn error_lines(log: &str) -> Vec<String> {
    let lines: Vec<String> = log
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("Error") || l.contains("BUG"))
        .filter(|l| !HARMLESS_ERRORS.iter().any(|h| l.contains(h)))
        .map(str::to_owned)
        .collect();
    lines[lines.len().saturating_sub(ERROR_TAIL_LINES)..].to_vec()
}

/// The key CRIU uses for an open descriptor in `--inherit-fd`: `pipe:[<inode>]` for a pipe,
/// `socket:[<inode>]` for a socket, else the `/proc/self/fd` link target.
pub fn fd_key(fd: impl AsFd) -> io::Result<String> {
    let link = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    Ok(fs::read_link(link)?.to_string_lossy().into_owned())
}

/// `criu --version` of the located binary.
pub fn criu_version() -> Result<CriuVersion, CriuError> {
    Criu::locate()?.version()
}

/// [`Criu::check`] of the located binary.
pub fn check() -> Result<CriuVersion, CriuError> {
    Criu::locate()?.check()
}

/// [`Criu::dump`] with the located binary.
pub fn dump(req: &DumpRequest) -> Result<DumpReport, CriuError> {
    Criu::locate()?.dump(req)
}

/// [`Criu::restore`] with the located binary.
pub fn restore(req: RestoreRequest) -> Result<RestoreReport, CriuError> {
    Criu::locate()?.restore(req)
}

fn check_keys(action: Action, mounts: &[ExternalMount]) -> Result<(), CriuError> {
    for m in mounts {
        let ok = !m.key.is_empty()
            && m.key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            return Err(CriuError::InvalidRequest {
                action,
                reason: format!("external mount key {:?} must match [A-Za-z0-9_.-]+", m.key),
            });
        }
        if !m.mountpoint.is_absolute() || !m.source.is_absolute() {
            return Err(CriuError::InvalidRequest {
                action,
                reason: format!("external mount {:?} needs absolute paths", m.key),
            });
        }
    }
    Ok(())
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).map(|m| m.is_file() && m.mode() & 0o111 != 0).unwrap_or(false)
}

fn dir_size(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for e in fs::read_dir(dir)? {
        let m = e?.metadata()?;
        if m.is_file() {
            total += m.len();
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: Vec<OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn parses_versions() {
        let v = CriuVersion::parse("Version: 4.2.1\nGitID: v4.2.1\n").unwrap();
        assert_eq!(v, CriuVersion { major: 4, minor: 2, patch: 1 });
        assert!(v >= MIN_VERSION);
        let old = CriuVersion::parse("Version: 3.17\n").unwrap();
        assert_eq!(old.to_string(), "3.17.0");
        assert!(old < MIN_VERSION);
        assert_eq!(CriuVersion::parse("criu: unknown"), None);
    }

    #[test]
    fn dump_args() {
        let mut r = DumpRequest::new(4242, "/var/lib/oka/s1/img");
        r.work_dir = Some("/var/lib/oka/s1/work".into());
        r.external_mounts = vec![
            ExternalMount::same_path("usr", "/usr"),
            ExternalMount::same_path("dev-null", "/dev/null"),
        ];
        r.tcp = TcpMode::Close;
        r.skip_in_flight = true;
        r.manage_cgroups = Some(ManageCgroups::Soft);
        r.freeze_cgroup = Some("/sys/fs/cgroup/freezer/s1".into());
        assert_eq!(
            strs(r.args()).join(" "),
            "dump --tree 4242 --images-dir /var/lib/oka/s1/img --work-dir /var/lib/oka/s1/work \
             --log-file dump.log -v2 --network-lock nftables --tcp-close --skip-in-flight --manage-cgroups=soft \
             --freeze-cgroup /sys/fs/cgroup/freezer/s1 --external mnt[/usr]:usr --external mnt[/dev/null]:dev-null"
        );
    }

    #[test]
    fn restore_args() {
        let (r0, _w0) = pipe();
        let raw = r0.as_raw_fd();
        let mut r = RestoreRequest::new("/s/img", "/s/merged");
        r.external_mounts = vec![ExternalMount {
            key: "usr".into(),
            mountpoint: "/usr".into(),
            source: "/srv/usr".into(),
        }];
        r.cgroup_roots = vec![
            CgroupRoot { controller: Some("memory".into()), path: "/daemon/sbx".into() },
            CgroupRoot { controller: None, path: "/sbx".into() },
        ];
        r.inherit_fds = vec![InheritFd { fd: r0, key: "pipe:[123]".into() }];
        assert_eq!(
            strs(r.args()).join(" "),
            format!(
                "restore --images-dir /s/img --work-dir /s/img --log-file restore.log -v2 \
                 --restore-detached --restore-sibling --pidfile /s/img/restore.pid --root /s/merged \
                 --cgroup-root memory:/daemon/sbx --cgroup-root /sbx --external mnt[usr]:/srv/usr \
                 --inherit-fd fd[{raw}]:pipe:[123]"
            )
        );
    }

    #[test]
    fn error_lines_skip_noise_and_keep_the_tail() {
        let log = "\
(00.000) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.010) Warn  (compel/arch/x86/src/lib/infect.c:419): Will restore 1 with interrupted system call
(00.020) Error (criu/util.c:1723): iptables-save -V failed
(00.030) Error (criu/sk-inet.c:199): inet: Connected TCP socket, consider using --tcp-established option.
(00.040) Error (criu/cr-dump.c:1795): Dumping FAILED.";
        assert_eq!(
            error_lines(log),
            vec![
                "(00.030) Error (criu/sk-inet.c:199): inet: Connected TCP socket, consider using --tcp-established option.",
                "(00.040) Error (criu/cr-dump.c:1795): Dumping FAILED.",
            ]
        );
    }

    #[test]
    fn rejects_bad_keys() {
        let mut r = DumpRequest::new(4242, "/nonexistent");
        r.external_mounts = vec![ExternalMount::same_path("a]b", "/usr")];
        let e = Criu::new("/bin/false").dump(&r).unwrap_err();
        assert!(matches!(e, CriuError::InvalidRequest { .. }), "{e}");
        assert!(e.to_string().starts_with("invalid criu dump request: external mount key"), "{e}");
    }

    #[test]
    fn fd_key_of_a_pipe() {
        let (r, _w) = pipe();
        assert!(fd_key(&r).unwrap().starts_with("pipe:["));
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let (r, w) = std::io::pipe().unwrap();
        (r.into(), w.into())
    }
}
