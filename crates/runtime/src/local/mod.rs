//! The local node runtime: sandboxes made of Linux namespaces, overlayfs, cgroups and the freezer
//! on this machine.
//!
//! A sandbox is a process tree in its own mount, PID, UTS, IPC, network and cgroup namespaces,
//! with an overlay root (template below, its own writable layer above), its own cgroups (CPU,
//! memory, PID limits; freezer), only `lo` as network (plus a veth pair and NAT when the spec
//! asks for outbound networking, `network.rs`), optionally a user namespace of its own (sandbox
//! root mapped to an unprivileged host range, `spawn.rs`), and our init ([`crate::init`]) as PID 1.
//!
//! Code map (one file per verb, as youki's `container_*.rs`):
//! - [`open`](LocalRuntime::open) in `adopt.rs`: lock the state directory, become a subreaper,
//!   re-adopt live sandboxes and clean up after dead ones;
//! - `ensure.rs` (create and start), `inspect.rs`, `list.rs`, `pause.rs`, `resume.rs`, `stop.rs`,
//!   `delete.rs`, `connect.rs`, `hibernate.rs` (hibernate and restore), `snapshot.rs` (snapshot
//!   a running sandbox, create sandboxes from a snapshot);
//! - `state.rs` (write-ahead state file), `cgroup.rs`, `rootfs.rs`, `spawn.rs` (`clone3`),
//!   `reaper.rs`, `procfs.rs`, `network.rs` (veth pair and NAT of outbound sandboxes),
//!   `egress.rs` (the firewall table: host isolation and each sandbox's egress policy),
//!   `features.rs` (the prober of the optional features: CRIU, `ip`/`nft`, Jupyter kernels).
//!
//! Invariants:
//! - operations on one sandbox are serialised by its slot's async mutex; the blocking kernel work
//!   of an operation runs on the blocking pool with the slot's guard moved into it, so a caller
//!   that stops waiting (cancellation) never interrupts an operation half-way;
//! - every host resource is in the sandbox's state file before it is created (see `state.rs`);
//! - a slot marked `removed` is out of the map; whoever locks it looks the id up again;
//! - the freezer is the only record of "paused": pausing writes no state file and keeps no flag;
//!   every answer about it (inspect, pause, resume, re-adoption) reads the freezer, so a cancelled
//!   or crashed operation can never leave a stale belief behind.
//!
//! Assumptions: the process runs as root (namespaces, mounts, cgroups); one runtime per state
//! directory (enforced with `flock`); the runtime's cgroup name (`LocalConfig::cgroup_name`) is
//! used by no other state directory.

mod adopt;
mod binaries;
pub mod cgroup;
mod connect;
pub mod criu;
mod delete;
pub mod egress;
mod ensure;
pub mod features;
mod hibernate;
mod inspect;
mod list;
pub mod network;
mod pause;
pub mod procfs;
pub mod reaper;
mod resume;
pub mod rootfs;
mod snapshot;
pub mod spawn;
pub mod state;
mod stop;
mod update;
pub mod volumes;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpStream;
use tokio::sync::OwnedMutexGuard;

use crate::init::protocol::ChannelError;
use oka_runtime_api::{ExitInfo, Runtime, RuntimeError, SandboxId, SandboxSpec, SandboxStatus};

use cgroup::{CgroupError, CgroupLayout};
use reaper::ExitWatch;
use rootfs::{RootfsError, Template};
use spawn::SpawnError;
use state::{SandboxRecord, StateError, StateStore};

pub use reaper::become_subreaper;

/// How a [`LocalRuntime`] is set up.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Where state files, writable layers and the default template live. Must be on a local file
    /// system that supports overlayfs upper layers (ext4, xfs, tmpfs) and contain no `,` or `:`.
    pub state_dir: PathBuf,
    /// The `oka-init` binary (or a multi-call binary that runs [`crate::init::main`] when started
    /// as `oka-init`).
    pub init_binary: PathBuf,
    /// The agent runtime daemon (`oka-envd`). When set, every sandbox serves it on port
    /// [`ENVD_PORT`](crate::init::ENVD_PORT) and it is the sandbox's PID 1: the init hands over
    /// to it once the command runs (see [`crate::init::protocol::EnvdPlan`]). `None`: the init
    /// stays PID 1 and no daemon runs.
    pub envd_binary: Option<PathBuf>,
    /// Further binaries every sandbox gets read-only at `/.oka/<name>` (see [`tool_path`]), for
    /// example the code interpreter server a template names as its command. Names are single
    /// path components other than `init` and `envd`.
    pub tools: BTreeMap<String, PathBuf>,
    /// Name of this runtime's cgroup under the process's own cgroups. Must be unique per state
    /// directory: leftovers under it are removed when the runtime opens.
    pub cgroup_name: String,
    /// How long a sandbox may take from clone to its command running.
    pub ready_timeout: Duration,
    /// How long killed processes may take to disappear, and a freeze or thaw to settle.
    pub kill_timeout: Duration,
    /// How long one `criu dump` or `criu restore` may run before it is killed (a safety net
    /// against a hung CRIU; a dump of a few hundred megabytes takes well under a second).
    pub criu_timeout: Duration,
    /// The `criu` binary for hibernate and restore; `None` finds it as
    /// [`Criu::locate`](criu::Criu::locate) does (`$OKA_CRIU`, `PATH`, `/usr/local/sbin`, ...).
    pub criu_binary: Option<PathBuf>,
    /// The private IPv4 subnet outbound sandboxes get their addresses from, one `/30` each
    /// (default [`network::Subnet::DEFAULT`], `10.213.0.0/16`). Two runtimes on one machine
    /// need different subnets ([`network::claim_subnet`] picks one); a subnet recorded in the
    /// state directory (`outbound-subnet`) wins over this.
    pub outbound_subnet: network::Subnet,
    /// Use only the unified (cgroup v2) hierarchy, even where v1 controllers are mounted (the
    /// hybrid layout). Off by default; a pure v2 host gets v2 either way. Limits whose controller
    /// the unified hierarchy does not offer are then refused ([`RuntimeError::Unsupported`]).
    pub cgroup_v2_only: bool,
    /// How many sandboxes may be starting (created, or started again after a stop) at once;
    /// further starts wait their turn. Starting is CPU-bound (clone, mounts, exec of the init,
    /// envd and the command), so more at once than the machine has CPUs only makes every one
    /// slower, and with them everything else on the machine (claims of warm sandboxes). Default:
    /// the number of CPUs.
    pub max_parallel_starts: usize,
    /// A hosts file (the format of `/etc/hosts`) that domain names of egress rules are looked
    /// up in before the host's resolver; `None` uses the resolver alone (which reads
    /// `/etc/hosts` itself).
    pub egress_hosts: Option<PathBuf>,
}

impl LocalConfig {
    /// The environment variable [`LocalConfig::find_init_binary`] reads first.
    pub const INIT_ENV: &'static str = "OKA_INIT";

    /// Where the `oka-init` binary is: `$OKA_INIT` if set, else `oka-init` beside the running
    /// executable (where `cargo install` and release archives put it).
    pub fn find_init_binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(Self::INIT_ENV) {
            return Some(PathBuf::from(path));
        }
        let exe = std::env::current_exe().ok()?;
        let beside = exe.parent()?.join("oka-init");
        beside.is_file().then_some(beside)
    }

    /// The environment variable [`LocalConfig::find_envd_binary`] reads first.
    pub const ENVD_ENV: &'static str = "OKA_ENVD";

    /// Where the `oka-envd` binary is: `$OKA_ENVD` if set, else `oka-envd` beside the running
    /// executable (where cargo and release archives put it).
    pub fn find_envd_binary() -> Option<PathBuf> {
        Self::find_binary(Self::ENVD_ENV, "oka-envd")
    }

    /// Where a binary shipped with oka is: `$<env>` if set, else `name` beside the running
    /// executable (where cargo and release archives put it).
    pub fn find_binary(env: &str, name: &str) -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(env) {
            return Some(PathBuf::from(path));
        }
        let exe = std::env::current_exe().ok()?;
        let beside = exe.parent()?.join(name);
        beside.is_file().then_some(beside)
    }

    /// Defaults: no envd, cgroup name `oka`, 10 s ready timeout, 10 s kill timeout, 120 s CRIU timeout,
    /// `criu` found on the system, as many parallel starts as CPUs.
    pub fn new(state_dir: impl Into<PathBuf>, init_binary: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            init_binary: init_binary.into(),
            envd_binary: None,
            tools: BTreeMap::new(),
            cgroup_name: "oka".to_owned(),
            ready_timeout: Duration::from_secs(10),
            kill_timeout: Duration::from_secs(10),
            criu_timeout: Duration::from_secs(120),
            criu_binary: None,
            outbound_subnet: network::Subnet::DEFAULT,
            cgroup_v2_only: false,
            max_parallel_starts: std::thread::available_parallelism().map_or(2, |n| n.get()),
            egress_hosts: None,
        }
    }
}

/// Where the tool `name` of [`LocalConfig::tools`] is mounted inside every sandbox.
pub fn tool_path(name: &str) -> PathBuf {
    Path::new("/.oka").join(name)
}

/// Why the local runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// A cgroup operation failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// A root file system could not be prepared.
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// The init could not be cloned.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// An outbound sandbox's network could not be set up or removed.
    #[error(transparent)]
    Network(#[from] network::NetworkError),
    /// Talking to a sandbox init failed.
    #[error("sandbox {id}: {source}")]
    Channel {
        /// Which sandbox.
        id: SandboxId,
        /// The channel error.
        #[source]
        source: ChannelError,
    },
    /// A sandbox init reported a failure of the system (not of the spec).
    #[error("sandbox {id}: init failed to {step}: {message}")]
    InitFailed {
        /// Which sandbox.
        id: SandboxId,
        /// The step.
        step: String,
        /// The init's message.
        message: String,
    },
    /// `criu dump` or `criu restore` of a sandbox failed; the error carries the `Error` lines of
    /// CRIU's log and the log's path.
    #[error("sandbox {id}: {source}")]
    Criu {
        /// Which sandbox.
        id: SandboxId,
        /// CRIU's error.
        #[source]
        source: criu::CriuError,
    },
    /// A kernel call about one sandbox failed.
    #[error("sandbox {id}: {op}: {source}")]
    Sandbox {
        /// Which sandbox.
        id: SandboxId,
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A kernel or file system call of the runtime itself failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A volume could not be prepared.
    #[error(transparent)]
    Volume(#[from] volumes::VolumeError),
    /// Another runtime holds the state directory.
    #[error("state directory {0} is in use by another runtime")]
    Locked(PathBuf),
    /// The runtime must run as root.
    #[error("the local runtime needs root (namespaces, mounts and cgroups)")]
    NotRoot,
    /// A [`LocalConfig::tools`] name cannot be used.
    #[error("tool name {0:?} is not a single path component other than init and envd")]
    InvalidToolName(String),
    /// A blocking task of the runtime panicked or was cancelled.
    #[error("runtime task failed: {0}")]
    Task(String),
}

impl From<LocalError> for RuntimeError {
    fn from(error: LocalError) -> Self {
        RuntimeError::backend(error)
    }
}

fn from_state(e: StateError) -> RuntimeError {
    LocalError::from(e).into()
}

fn from_cgroup(e: CgroupError) -> RuntimeError {
    LocalError::from(e).into()
}

/// The local node runtime. Cheap to clone; clones share one set of sandboxes.
#[derive(Clone, Debug)]
pub struct LocalRuntime {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: LocalConfig,
    store: StateStore,
    cgroups: CgroupLayout,
    default_template: Template,
    /// The outbound subnet's slots in use.
    leases: network::Leases,
    /// The firewall table's content (see `egress.rs`).
    firewall: Mutex<egress::Firewall>,
    slots: Mutex<BTreeMap<SandboxId, Arc<tokio::sync::Mutex<Slot>>>>,
    /// The `criu` binary, once found and checked (see `hibernate.rs`).
    criu: std::sync::OnceLock<hibernate::CriuSetup>,
    /// Turns to start a sandbox ([`LocalConfig::max_parallel_starts`]).
    starts: tokio::sync::Semaphore,
    /// The inits of sandboxes whose start waits for their startup check, by id: a delete or a
    /// stop ends such a start at once instead of waiting for the check's verdict.
    checking: Mutex<BTreeMap<SandboxId, std::os::fd::OwnedFd>>,
    /// Holds the `flock` on `<state>/lock` for the runtime's life.
    _lock: std::fs::File,
}

/// What the runtime knows about one sandbox id.
#[derive(Debug, Default)]
struct Slot {
    /// The state file's content; `None` while being created for the first time.
    record: Option<SandboxRecord>,
    /// The running instance.
    live: Option<Live>,
    /// How the last instance ended.
    last_exit: Option<ExitInfo>,
    /// Set when the slot is taken out of the map by delete.
    removed: bool,
}

/// A running instance of a sandbox.
#[derive(Debug)]
struct Live {
    pidfd: OwnedFd,
    exit: ExitWatch,
}

type SlotGuard = OwnedMutexGuard<Slot>;

impl Inner {
    /// Locks the slot of `id`, creating an empty one if `create` (else `None` when unknown).
    async fn lock(&self, id: &SandboxId, create: bool) -> Option<SlotGuard> {
        loop {
            let slot = {
                let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
                match slots.get(id) {
                    Some(s) => s.clone(),
                    None if create => slots.entry(id.clone()).or_default().clone(),
                    None => return None,
                }
            };
            let guard = slot.lock_owned().await;
            if !guard.removed {
                return Some(guard);
            }
        }
    }

    /// Ends the start of `id` if it is waiting for its startup check (its init is killed, so
    /// the start fails and releases the sandbox); nothing otherwise.
    fn cancel_startup_check(&self, id: &SandboxId) {
        let checking = self.checking.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pidfd) = checking.get(id) {
            tracing::debug!(%id, "ending a start that waits for its startup check");
            let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
        }
    }

    /// Takes `guard`'s slot out of the map.
    fn retire(&self, id: &SandboxId, guard: &mut SlotGuard) {
        guard.removed = true;
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    /// The template a record's sandbox runs on.
    fn template_of(&self, record: &SandboxRecord) -> Template {
        let binds = match record.spec.root {
            oka_runtime_api::RootFs::Default => self.default_template.binds.clone(),
            oka_runtime_api::RootFs::Directory(_) | oka_runtime_api::RootFs::Layers(_) => vec![],
        };
        Template { lower: record.lower.clone(), binds }
    }

    /// The template a spec's root names: the default root, a root directory, or image layers.
    fn template_for(&self, root: &oka_runtime_api::RootFs) -> Result<Template, RootfsError> {
        match root {
            oka_runtime_api::RootFs::Default => Ok(self.default_template.clone()),
            oka_runtime_api::RootFs::Directory(dir) => Template::directory(dir),
            oka_runtime_api::RootFs::Layers(layers) => Template::layers(layers),
        }
    }
}

/// Runs blocking kernel work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| LocalError::Task(e.to_string()).into())
}

/// [`blocking`] at background priority: the thread runs `f` at nice 19 and is put back to its
/// own nice value afterwards. For the runtime's share of starting a sandbox (directories, the
/// state file, cgroups, the clone), which a pool refill does behind every claim: under load
/// the threads serving requests (a claim's `/init`, the API) get the CPU first; on an idle
/// machine it changes nothing. The sandbox's own processes start at background CPU weight for
/// the same reason (`start_blocking`).
async fn background<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RuntimeError> {
    blocking(move || {
        let _nice = Niced::enter();
        f()
    })
    .await
}

/// The calling thread at nice 19 until dropped.
struct Niced {
    /// The thread's nice value before.
    before: libc::c_int,
}

impl Niced {
    /// Nice value of background work: the lowest CFS weight short of `SCHED_IDLE`.
    const BACKGROUND: libc::c_int = 19;

    fn enter() -> Self {
        // SAFETY: getpriority/setpriority of this thread (`who` 0 is the calling thread on
        // Linux, where nice values are per thread); they touch no memory. getpriority may
        // legitimately return -1, so a failure only leaves the value unchanged.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        // SAFETY: as above.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, Self::BACKGROUND) };
        Self { before }
    }
}

impl Drop for Niced {
    fn drop(&mut self) {
        // SAFETY: as in `enter`. Going back up needs CAP_SYS_NICE, which the runtime (root) has.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, self.before) } != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "could not restore a runtime thread's priority after a sandbox start"
            );
        }
    }
}

impl LocalRuntime {
    /// Opens the runtime on `config.state_dir`: locks it, makes this process a child subreaper,
    /// detects the cgroup layout, builds the default template root if missing, re-adopts every
    /// sandbox whose init still runs, and cleans up after the others (see `adopt.rs`). Must be
    /// called inside a tokio runtime; fails if another runtime holds the directory.
    pub async fn open(config: LocalConfig) -> Result<Self, RuntimeError> {
        adopt::open(config).await
    }

    /// The configuration the runtime was opened with.
    pub fn config(&self) -> &LocalConfig {
        &self.inner.config
    }

    /// The default template root's directory (its lower layer).
    pub fn default_root(&self) -> &std::path::Path {
        self.inner
            .default_template
            .lower
            .first()
            .map_or(self.inner.config.state_dir.as_path(), |p| p.as_path())
    }

    /// Removes this runtime's own cgroups (its parent directory in each hierarchy), for a state
    /// directory that is going away: each only if no sandbox cgroup is left in it. Returns
    /// whether all are gone. Call it last: the runtime cannot start sandboxes without them
    /// (opening a runtime on the state directory makes them again).
    pub fn remove_cgroups(&self) -> bool {
        self.inner.cgroups.remove_parents()
    }

    /// The host paths of sandbox `id` (state directory, writable layer), if it exists.
    pub async fn paths(&self, id: &SandboxId) -> Option<state::SandboxPaths> {
        let guard = self.inner.lock(id, false).await?;
        guard.record.as_ref().map(|r| r.paths.clone())
    }

    /// The outbound network slot of sandbox `id` (addresses, host-end link name), if it is an
    /// outbound sandbox.
    pub async fn network(&self, id: &SandboxId) -> Option<network::NetworkLease> {
        let guard = self.inner.lock(id, false).await?;
        guard.record.as_ref()?.network.clone()
    }

    /// The cgroup directories of sandbox `id` while it has processes.
    pub async fn cgroup_paths(&self, id: &SandboxId) -> Option<cgroup::CgroupPaths> {
        let guard = self.inner.lock(id, false).await?;
        guard.record.as_ref()?.instance.as_ref().map(|i| i.cgroup.clone())
    }
}

#[async_trait]
impl Runtime for LocalRuntime {
    async fn ensure(&self, spec: &SandboxSpec) -> Result<SandboxStatus, RuntimeError> {
        if let Some(name) = &spec.from_snapshot {
            return snapshot::create_from_snapshot(&self.inner, spec, name).await;
        }
        ensure::ensure(&self.inner, spec).await
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        inspect::inspect(&self.inner, id).await
    }

    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        pause::pause(&self.inner, id).await
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        resume::resume(&self.inner, id).await
    }

    async fn hibernate(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        hibernate::hibernate(&self.inner, id).await
    }

    async fn restore(&self, id: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        hibernate::restore(&self.inner, id).await
    }

    async fn stop(&self, id: &SandboxId, grace: Duration) -> Result<(), RuntimeError> {
        stop::stop(&self.inner, id, grace).await
    }

    async fn update(
        &self,
        spec: &SandboxSpec,
    ) -> Result<oka_runtime_api::UpdateOutcome, RuntimeError> {
        update::update(&self.inner, spec).await
    }

    async fn checkpoint_restore(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        update::checkpoint_restore(&self.inner, spec).await
    }

    async fn delete(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        delete::delete(&self.inner, id).await
    }

    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError> {
        list::list(&self.inner).await
    }

    async fn connect(&self, id: &SandboxId, port: u16) -> Result<TcpStream, RuntimeError> {
        connect::connect(&self.inner, id, port).await
    }

    async fn snapshot(
        &self,
        id: &SandboxId,
        name: &oka_runtime_api::SnapshotName,
    ) -> Result<oka_runtime_api::SnapshotInfo, RuntimeError> {
        snapshot::snapshot(&self.inner, id, name).await
    }

    async fn delete_snapshot(
        &self,
        name: &oka_runtime_api::SnapshotName,
    ) -> Result<(), RuntimeError> {
        snapshot::delete_snapshot(&self.inner, name).await
    }

    async fn set_egress(
        &self,
        id: &SandboxId,
        policy: &oka_runtime_api::EgressPolicy,
    ) -> Result<(), RuntimeError> {
        egress::set_egress(&self.inner, id, policy).await
    }
}
