//! The per-sandbox state file: the write-ahead record of everything a sandbox owns.
//!
//! Layout under the state directory:
//!
//! ```text
//! <state>/lock                     held (flock) by the one LocalRuntime using this directory
//! <state>/templates/default-v1/    the default template root (built once)
//! <state>/sandboxes/<id>/state.json
//! <state>/sandboxes/<id>/upper/    the writable layer
//! <state>/sandboxes/<id>/work/     overlayfs work directory
//! <state>/sandboxes/<id>/rootfs/   mount point of the overlay (inside the sandbox's namespace; on
//!                                  the host only while a restore runs)
//! <state>/sandboxes/<id>/checkpoint/          CRIU's work directory (logs, pid file) while the
//!                                             sandbox is being hibernated, is hibernated, or is
//!                                             being restored
//! <state>/sandboxes/<id>/checkpoint/images/   the CRIU images
//! <state>/sandboxes/<id>/checkpoint.spent-*/  spent checkpoints being removed in the background
//! ```
//!
//! Invariants:
//! - a resource (directory, cgroup, host mount) appears in the record, and the record is on disk,
//!   *before* the resource is created; it leaves the record only after it is removed. So after a
//!   crash at any instruction, the record names a superset of what exists, and cleanup can remove
//!   every leftover (removing something that does not exist is a no-op);
//! - a sandbox directory without a readable `state.json` holds nothing but directories created in
//!   it, and cleanup removes it whole;
//! - writes are atomic: write `state.json.tmp`, fsync it, rename it over `state.json`, fsync the
//!   directory.
//!
//! Assumptions: the state directory is on a local file system where `rename` within a directory
//! is atomic and `fsync` makes data durable (ext4, xfs, btrfs, tmpfs for tests).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cgroup::CgroupPaths;
use oka_runtime_api::{SandboxId, SandboxSpec};

/// The version of the state file format.
pub const STATE_VERSION: u32 = 1;

const STATE_FILE: &str = "state.json";
const STATE_TMP: &str = "state.json.tmp";

/// Why reading or writing a state file failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file system call failed.
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
    /// The file is not a state record we understand.
    #[error("state file {path}: {source}")]
    Corrupt {
        /// The path.
        path: PathBuf,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by a newer format.
    #[error("state file {path}: version {version} is newer than this runtime's {STATE_VERSION}")]
    Version {
        /// The path.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
}

/// Shorthand to attach an operation and path to an I/O error.
pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StateError {
    let path = path.to_owned();
    move |source| StateError::Io { op, path, source }
}

/// Where a sandbox's state lives in its record's lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Directories are being made; nothing runs. A crash here means the create never finished.
    Creating,
    /// Processes are being started (cgroups exist, the init may run, not ready yet).
    Starting,
    /// The init reported ready (the sandbox may be frozen: the freezer is the source of truth for
    /// paused, so pausing needs no state write).
    Running,
    /// No processes; the writable layer is kept.
    Stopped,
    /// Processes checkpointed to disk; the writable layer and images are kept.
    Hibernated,
    /// Being removed; a crash here means the delete must be finished.
    Deleting,
}

/// A host resource owned by a sandbox, removed by cleanup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    /// A directory, removed recursively.
    Dir(PathBuf),
    /// A mount in the host's mount namespace (for example an overlay mounted for CRIU restore),
    /// detached.
    HostMount(PathBuf),
    /// The host end of an outbound sandbox's veth pair (deleting it deletes the pair).
    Veth(String),
}

/// The host paths of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPaths {
    /// `<state>/sandboxes/<id>`.
    pub dir: PathBuf,
    /// The writable layer.
    pub upper: PathBuf,
    /// The overlay work directory.
    pub work: PathBuf,
    /// The overlay mount point.
    pub rootfs: PathBuf,
}

impl SandboxPaths {
    /// The paths for a sandbox directory.
    pub fn new(dir: PathBuf) -> Self {
        Self { upper: dir.join("upper"), work: dir.join("work"), rootfs: dir.join("rootfs"), dir }
    }

    /// CRIU's work directory for this sandbox's checkpoint.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint")
    }
}

/// A host bind mount inside a sandbox, which CRIU must be told about (`--external mnt[...]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalMount {
    /// Path inside the sandbox.
    pub target: PathBuf,
    /// Host path bound there.
    pub source: PathBuf,
}

/// A CRIU checkpoint of a sandbox: recorded before `criu dump` writes it, kept while the sandbox is
/// hibernated, and dropped once a restore has brought it back (or the sandbox is stopped).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// CRIU's work directory (`<dir>/checkpoint`: logs, stats, the restore pid file); a
    /// sandbox-lifetime [`Resource::Dir`] from before it is first created.
    pub dir: PathBuf,
    /// The images (`<dir>/checkpoint/images`).
    pub images: PathBuf,
    /// Whether `criu dump` succeeded: the images are complete and the processes are gone.
    pub complete: bool,
    /// Host binds inside the sandbox at dump time (`--external mnt[...]` on dump and restore).
    pub external_mounts: Vec<ExternalMount>,
    /// The init's descriptors that are pipes owned by the runtime, with CRIU's names for them
    /// (`(1, "pipe:[26397]")`): a restore hands fresh pipes in their place (`--inherit-fd`).
    pub stdio: Vec<(i32, String)>,
    /// The command's pid inside the sandbox (unchanged by a restore).
    pub command_pid: Option<i32>,
    /// Size of the images, once complete.
    pub image_bytes: Option<u64>,
    /// The address of `eth0` in the images (an outbound sandbox's). A restore whose lease has
    /// another address (a clone restores the images of the sandbox it was snapshotted from)
    /// moves `eth0` to the lease's address and route; `None` (no address recorded) does so too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_addr: Option<std::net::Ipv4Addr>,
}

/// The running processes of a sandbox and what they own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// Host pid of the init, once cloned.
    pub pid: Option<i32>,
    /// The init's start time in clock ticks since boot (`/proc/<pid>/stat` field 22): with the
    /// pid it identifies the process across pid reuse.
    pub start_time: Option<u64>,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_at_ms: Option<u64>,
    /// The cgroups, recorded before they are made.
    pub cgroup: CgroupPaths,
    /// Other host resources of this instance.
    pub resources: Vec<Resource>,
    /// Host binds inside the sandbox, as the init reported them.
    pub external_mounts: Vec<ExternalMount>,
    /// The command's pid inside the sandbox.
    pub command_pid: Option<i32>,
    /// CRIU's names (`pipe:[inode]`) of the init's stdout and stderr pipes.
    #[serde(default)]
    pub stdio_pipes: Vec<String>,
}

/// The state file's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Format version, [`STATE_VERSION`].
    pub version: u32,
    /// The spec the sandbox was created from.
    pub spec: SandboxSpec,
    /// Lifecycle phase.
    pub phase: Phase,
    /// Whether a create has completed (an `ensure` returned the sandbox running at least once).
    pub created: bool,
    /// Host paths.
    pub paths: SandboxPaths,
    /// Lower layers of the overlay, uppermost first.
    pub lower: Vec<PathBuf>,
    /// Sandbox-lifetime resources, in creation order.
    pub resources: Vec<Resource>,
    /// The current processes, if any.
    pub instance: Option<InstanceRecord>,
    /// The CRIU checkpoint, while one is being written or the sandbox is hibernated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointRecord>,
    /// The outbound subnet slot of an outbound sandbox, recorded before its first start and kept
    /// for the sandbox's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<super::network::NetworkLease>,
    /// The egress policy of an outbound sandbox, once one was set; `None` allows the internet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<oka_runtime_api::EgressPolicy>,
}

impl SandboxRecord {
    /// The sandbox's id.
    pub fn id(&self) -> &SandboxId {
        &self.spec.id
    }
}

/// A sandbox directory found by [`StateStore::scan`], with its record or why it has none.
pub type Scanned = (PathBuf, Result<SandboxRecord, StateError>);

/// Reads and writes state files under `<state>/sandboxes`.
#[derive(Debug, Clone)]
pub struct StateStore {
    root: PathBuf,
}

impl StateStore {
    /// A store rooted at `<state>/sandboxes` (created if missing, mode 0700).
    pub fn open(state_dir: &Path) -> Result<Self, StateError> {
        let root = state_dir.join("sandboxes");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(io_err("create directory", &root))?;
        Ok(Self { root })
    }

    /// The directory of sandbox `id`.
    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.root.join(id.as_str())
    }

    /// Writes `record` atomically, creating the sandbox directory if needed.
    pub fn write(&self, record: &SandboxRecord) -> Result<(), StateError> {
        let dir = &record.paths.dir;
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create directory", dir)(e)),
        }
        let tmp = dir.join(STATE_TMP);
        let body = serde_json::to_vec_pretty(record)
            .map_err(|source| StateError::Corrupt { path: tmp.clone(), source })?;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.write_all(&body).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        drop(f);
        let path = dir.join(STATE_FILE);
        fs::rename(&tmp, &path).map_err(io_err("rename", &tmp))?;
        fsync_dir(dir)?;
        tracing::debug!(id = %record.id(), phase = ?record.phase, "state written");
        Ok(())
    }

    /// Reads the record in sandbox directory `dir`.
    pub fn read(&self, dir: &Path) -> Result<SandboxRecord, StateError> {
        let path = dir.join(STATE_FILE);
        let body = fs::read(&path).map_err(io_err("read", &path))?;
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let v: Version = serde_json::from_slice(&body)
            .map_err(|source| StateError::Corrupt { path: path.clone(), source })?;
        if v.version > STATE_VERSION {
            return Err(StateError::Version { path, version: v.version });
        }
        serde_json::from_slice(&body).map_err(|source| StateError::Corrupt { path, source })
    }

    /// Every sandbox directory, with its record or the reason it has none.
    pub fn scan(&self) -> Result<Vec<Scanned>, StateError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(io_err("read directory", &self.root))? {
            let entry = entry.map_err(io_err("read directory", &self.root))?;
            let dir = entry.path();
            if !entry.file_type().map_err(io_err("stat", &dir))?.is_dir() {
                continue;
            }
            let record = self.read(&dir);
            out.push((dir, record));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Removes the state file and then the (by now empty of resources) sandbox directory.
    pub fn remove(&self, dir: &Path) -> Result<(), StateError> {
        remove_dir_all_if_exists(dir)?;
        fsync_dir(&self.root)
    }
}

/// Removes `path` recursively; a missing path is success.
pub fn remove_dir_all_if_exists(path: &Path) -> Result<(), StateError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", path)(e)),
    }
}

fn fsync_dir(dir: &Path) -> Result<(), StateError> {
    let f = fs::File::open(dir).map_err(io_err("open", dir))?;
    f.sync_all().map_err(io_err("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::cgroup::CgroupPaths;

    fn record(store: &StateStore, id: &str) -> SandboxRecord {
        let id = SandboxId::new(id).unwrap();
        SandboxRecord {
            version: STATE_VERSION,
            paths: SandboxPaths::new(store.sandbox_dir(&id)),
            spec: SandboxSpec::new(id, vec!["true".into()]),
            phase: Phase::Creating,
            created: false,
            lower: vec!["/lower".into()],
            resources: vec![],
            instance: Some(InstanceRecord {
                pid: Some(42),
                start_time: Some(7),
                started_at_ms: None,
                cgroup: CgroupPaths::default(),
                resources: vec![],
                external_mounts: vec![],
                command_pid: None,
                stdio_pipes: vec![],
            }),
            checkpoint: None,
            network: None,
            egress: None,
        }
    }

    #[test]
    fn records_without_a_checkpoint_field_still_read() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::open(tmp.path()).unwrap();
        let mut rec = record(&store, "old");
        store.write(&rec).unwrap();
        let body = fs::read_to_string(rec.paths.dir.join(STATE_FILE)).unwrap();
        assert!(!body.contains("checkpoint"), "absent checkpoints are not written");
        rec.checkpoint = Some(CheckpointRecord {
            dir: rec.paths.checkpoint(),
            images: rec.paths.checkpoint().join("images"),
            complete: true,
            external_mounts: vec![ExternalMount { target: "/usr".into(), source: "/usr".into() }],
            stdio: vec![(1, "pipe:[1]".into()), (2, "pipe:[2]".into())],
            command_pid: Some(2),
            image_bytes: Some(4096),
            sandbox_addr: Some(std::net::Ipv4Addr::new(10, 213, 0, 2)),
        });
        store.write(&rec).unwrap();
        assert_eq!(store.read(&rec.paths.dir).unwrap(), rec);
    }

    #[test]
    fn write_then_read_round_trips_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::open(tmp.path()).unwrap();
        let rec = record(&store, "a");
        store.write(&rec).unwrap();
        assert_eq!(store.read(&rec.paths.dir).unwrap(), rec);
        assert!(!rec.paths.dir.join(STATE_TMP).exists());
    }

    #[test]
    fn scan_reports_directories_without_a_readable_record() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::open(tmp.path()).unwrap();
        store.write(&record(&store, "good")).unwrap();
        fs::create_dir(tmp.path().join("sandboxes/empty")).unwrap();
        let bad = tmp.path().join("sandboxes/bad");
        fs::create_dir(&bad).unwrap();
        fs::write(bad.join(STATE_FILE), b"{not json").unwrap();
        let scanned = store.scan().unwrap();
        let names: Vec<(String, bool)> = scanned
            .iter()
            .map(|(d, r)| (d.file_name().unwrap().to_string_lossy().into_owned(), r.is_ok()))
            .collect();
        assert_eq!(names, [("bad".into(), false), ("empty".into(), false), ("good".into(), true)]);
    }

    #[test]
    fn newer_versions_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::open(tmp.path()).unwrap();
        let mut rec = record(&store, "v");
        rec.version = STATE_VERSION + 1;
        store.write(&rec).unwrap();
        assert!(matches!(store.read(&rec.paths.dir), Err(StateError::Version { .. })));
    }
}
