//! The host side of a sandbox's volumes: what is checked and made before each start, and the
//! setup stage's [`VolumePlan`]s.
//!
//! - `hostPath`: checked (or made) by its kind, as the kubelet checks it
//!   ([`check_host_path`]): `Directory`/`File` must exist as such, `DirectoryOrCreate` makes
//!   the directory (mode 0755, parents too), `FileOrCreate` an empty file (mode 0644, its parent
//!   must exist); the unchecked kind is left to the mount.
//! - `emptyDir` on disk: `<sandbox dir>/volumes/<name>`, made once (mode 0777, as the kubelet's)
//!   and kept across stops, pauses, hibernations and restarts of the runtime; removed with the
//!   sandbox. A remapped sandbox's root owns it.
//! - `emptyDir` in memory: a tmpfs the init mounts inside the sandbox at
//!   `/.oka/volumes/<name>` (charged to the sandbox's memory, dumped with its processes by
//!   CRIU), bound from there to each mount.
//! - files (a ConfigMap's or Secret's keys): written before each start into
//!   `<sandbox dir>/volumes/<name>`, emptied first (the spec is their one source), and mounted
//!   read-only.
//!
//! Every host source is bound by the init with its sub-path resolved inside it, so a symlink the
//! sandbox planted in an emptyDir cannot lead a later start outside the volume.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use oka_runtime_api::{HostPathKind, Medium, MountSource, UserNamespace};

use super::state::SandboxRecord;
use crate::init::protocol::{VolumePlan, VolumeSourcePlan};

/// Where a memory emptyDir's tmpfs is mounted inside the sandbox.
pub const STAGING: &str = "/.oka/volumes";

/// Why a volume could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A `hostPath`'s kind does not match what is there (the kubelet's words).
    #[error("hostPath type check failed: {path} is not a {expected}")]
    HostPathType {
        /// The host path.
        path: PathBuf,
        /// `directory` or `file`.
        expected: &'static str,
    },
    /// A file system call failed.
    #[error("volume {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> VolumeError {
    let path = path.to_owned();
    move |source| VolumeError::Io { op, path, source }
}

/// The directory of volume `name` of the sandbox whose directory is `sandbox_dir`.
pub fn volume_dir(sandbox_dir: &Path, name: &str) -> PathBuf {
    sandbox_dir.join("volumes").join(name)
}

/// Checks and makes what `record`'s mounts need on the host, and returns their plans in order.
pub fn prepare(record: &SandboxRecord) -> Result<Vec<VolumePlan>, VolumeError> {
    let mut plans = Vec::with_capacity(record.spec.mounts.len());
    let mut written: Vec<&str> = Vec::new();
    let owner = match record.spec.user_namespace {
        UserNamespace::Host => None,
        UserNamespace::Remapped { host_base, .. } => Some(host_base),
    };
    let fs_group = record.spec.security.fs_group;
    for mount in &record.spec.mounts {
        let (source, readonly) = match &mount.source {
            MountSource::HostPath { path, kind } => {
                check_host_path(path, *kind)?;
                (VolumeSourcePlan::Host(path.clone()), mount.read_only)
            }
            MountSource::EmptyDir { volume, medium: Medium::Disk } => {
                let dir = volume_dir(&record.paths.dir, volume);
                if !dir.is_dir() {
                    if let Some(parent) = dir.parent() {
                        make_dir(parent, 0o755)?;
                    }
                    make_dir(&dir, 0o777)?;
                    // The mode is exact whatever the umask; with an fsGroup, new files inherit
                    // its group (the setgid bit).
                    let mode = if fs_group.is_some() { 0o2777 } else { 0o777 };
                    fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                        .map_err(io_err("chmod", &dir))?;
                    let group = fs_group.map(|g| host_id(g, owner)).or(owner);
                    if owner.is_some() || group.is_some() {
                        std::os::unix::fs::chown(&dir, owner, group)
                            .map_err(io_err("chown", &dir))?;
                    }
                }
                (VolumeSourcePlan::Host(dir), mount.read_only)
            }
            MountSource::EmptyDir { volume, medium: Medium::Memory { size_bytes } } => {
                let size = size_bytes.or(record.spec.resources.memory_bytes);
                let staging = Path::new(STAGING).join(volume);
                (VolumeSourcePlan::Tmpfs { staging, size, gid: fs_group }, mount.read_only)
            }
            MountSource::Files { volume, files } => {
                let dir = volume_dir(&record.paths.dir, volume);
                if !written.contains(&volume.as_str()) {
                    write_files(&dir, files, fs_group.map(|g| host_id(g, owner)))?;
                    written.push(volume);
                }
                (VolumeSourcePlan::Host(dir), true)
            }
        };
        plans.push(VolumePlan {
            target: mount.target.clone(),
            source,
            sub_path: mount.sub_path.clone(),
            readonly,
        });
    }
    Ok(plans)
}

/// The host path a host-sourced volume plan binds (its sub-path joined), for CRIU's
/// `--external` on restore; `None` for a tmpfs.
pub fn host_source(plan: &VolumePlan) -> Option<PathBuf> {
    match &plan.source {
        VolumeSourcePlan::Host(dir) => {
            Some(plan.sub_path.as_ref().map_or_else(|| dir.clone(), |sub| dir.join(sub)))
        }
        VolumeSourcePlan::Tmpfs { .. } => None,
    }
}

/// The kubelet's check of a `hostPath` of `kind`, making what the `...OrCreate` kinds make.
pub fn check_host_path(path: &Path, kind: HostPathKind) -> Result<(), VolumeError> {
    let meta = fs::metadata(path);
    match kind {
        HostPathKind::Unchecked => Ok(()),
        HostPathKind::Directory => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            _ => Err(VolumeError::HostPathType { path: path.to_owned(), expected: "directory" }),
        },
        HostPathKind::File => match meta {
            Ok(m) if m.is_file() => Ok(()),
            _ => Err(VolumeError::HostPathType { path: path.to_owned(), expected: "file" }),
        },
        HostPathKind::DirectoryOrCreate => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => {
                Err(VolumeError::HostPathType { path: path.to_owned(), expected: "directory" })
            }
            Err(_) => fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(path)
                .map_err(io_err("create directory", path)),
        },
        HostPathKind::FileOrCreate => match meta {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(VolumeError::HostPathType { path: path.to_owned(), expected: "file" }),
            Err(_) => fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(path)
                .map(drop)
                .map_err(io_err("create file", path)),
        },
    }
}

fn make_dir(dir: &Path, mode: u32) -> Result<(), VolumeError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(io_err("create directory", dir))
}

/// The host id of sandbox id `id` (a remapped sandbox's ids start at `base`).
fn host_id(id: u32, base: Option<u32>) -> u32 {
    base.map_or(id, |b| b.saturating_add(id))
}

/// Empties `dir` (made when missing) and writes `files` into it; with `group` (a host gid),
/// every file and directory is that group's and group-readable, as the kubelet sets an
/// fsGroup's read-only volume.
fn write_files(
    dir: &Path,
    files: &[oka_runtime_api::VolumeFile],
    group: Option<u32>,
) -> Result<(), VolumeError> {
    if dir.exists() {
        fs::remove_dir_all(dir).map_err(io_err("remove", dir))?;
    }
    make_dir(dir, 0o755)?;
    for file in files {
        let path = dir.join(&file.path);
        if let Some(parent) = path.parent() {
            make_dir(parent, 0o755)?;
        }
        fs::write(&path, &file.content).map_err(io_err("write", &path))?;
        let mode = file.mode & 0o777 | if group.is_some() { 0o440 } else { 0 };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &path))?;
        if group.is_some() {
            std::os::unix::fs::chown(&path, None, group).map_err(io_err("chown", &path))?;
        }
    }
    if group.is_some() {
        for entry in walk_dirs(dir) {
            std::os::unix::fs::chown(&entry, None, group).map_err(io_err("chown", &entry))?;
        }
    }
    Ok(())
}

/// `dir` and every directory below it (no symlinks: the runtime made them all).
fn walk_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_owned()];
    let mut i = 0;
    while let Some(current) = out.get(i).cloned() {
        for entry in fs::read_dir(&current).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(entry.path());
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_are_checked_and_made_as_the_kubelet_does() {
        let tmp = std::env::temp_dir().join(format!("oka-hostpath-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).unwrap();
        let file = tmp.join("f");
        fs::write(&file, "x").unwrap();
        assert!(check_host_path(&tmp, HostPathKind::Directory).is_ok());
        let e = check_host_path(&file, HostPathKind::Directory).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("hostPath type check failed: {} is not a directory", file.display())
        );
        assert!(check_host_path(&tmp.join("missing"), HostPathKind::File).is_err());
        assert!(check_host_path(&tmp.join("missing"), HostPathKind::Unchecked).is_ok());
        check_host_path(&tmp.join("a/b"), HostPathKind::DirectoryOrCreate).unwrap();
        assert!(tmp.join("a/b").is_dir());
        check_host_path(&tmp.join("new"), HostPathKind::FileOrCreate).unwrap();
        assert!(tmp.join("new").is_file());
        assert!(check_host_path(&tmp.join("no/parent"), HostPathKind::FileOrCreate).is_err());
        assert!(check_host_path(&tmp, HostPathKind::FileOrCreate).is_err());
        fs::remove_dir_all(&tmp).unwrap();
    }
}
