//! Volumes and the security settings of a sandbox: [`Mount`] and [`Security`], parts of a
//! [`SandboxSpec`](crate::SandboxSpec).
//!
//! A mount's source is one of what a pod template's volumes become: a host path (checked as the
//! kubelet checks a `hostPath`'s type), an empty directory (on disk in the sandbox's state, or a
//! tmpfs of a given size), or files the caller hands over with their content (a ConfigMap's or
//! Secret's keys, read by the caller: the runtime knows nothing of Kubernetes objects). All are
//! mounted inside the sandbox's mount namespace before its command starts.
//!
//! Invariants (checked by [`Mount::validate`]): targets are absolute and normal (no `..`), a
//! sub-path and every file path are relative and normal, so nothing can name a place outside
//! its volume.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::SpecError;

/// One volume mounted into the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Absolute path inside the sandbox; made (a directory, or a file for a file source) when
    /// missing.
    pub target: PathBuf,
    /// What is mounted.
    pub source: MountSource,
    /// A path inside the volume mounted instead of its root (made as a directory when missing,
    /// as the kubelet makes it); relative, without `..`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<PathBuf>,
    /// Mounted read-only: the sandbox cannot write through this mount.
    #[serde(default)]
    pub read_only: bool,
}

/// Where a mount's content comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountSource {
    /// A path of the host, bound into the sandbox.
    HostPath {
        /// Absolute host path.
        path: PathBuf,
        /// What must be there before the mount.
        kind: HostPathKind,
    },
    /// A directory that starts empty and lives as long as the sandbox (its stops, pauses and
    /// hibernations included); every mount of the same `volume` shares it.
    EmptyDir {
        /// The volume's name: unique within the spec's empty directories and files.
        volume: String,
        /// Where it is kept.
        medium: Medium,
    },
    /// Files written by the runtime into a directory of the sandbox's state, mounted
    /// read-only whatever [`Mount::read_only`] says (as the kubelet mounts ConfigMaps and
    /// Secrets).
    Files {
        /// The volume's name: unique within the spec's empty directories and files.
        volume: String,
        /// The files, with their content.
        files: Vec<VolumeFile>,
    },
}

impl MountSource {
    /// The volume's name, for the kinds that are volumes of the sandbox.
    pub fn volume(&self) -> Option<&str> {
        match self {
            Self::HostPath { .. } => None,
            Self::EmptyDir { volume, .. } | Self::Files { volume, .. } => Some(volume),
        }
    }
}

/// A `hostPath`'s type: what is checked (or made) before the mount, as the kubelet does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostPathKind {
    /// `""`: nothing is checked; a missing path fails the mount.
    #[default]
    Unchecked,
    /// `Directory`: a directory must exist.
    Directory,
    /// `DirectoryOrCreate`: made (mode 0755, parents too) when missing; else must be a directory.
    DirectoryOrCreate,
    /// `File`: a regular file must exist.
    File,
    /// `FileOrCreate`: made empty (mode 0644, not its parents) when missing; else must be a
    /// regular file.
    FileOrCreate,
}

/// Where an [`MountSource::EmptyDir`] is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Medium {
    /// A directory under the sandbox's state on the host's disk, without a size limit.
    #[default]
    Disk,
    /// A tmpfs inside the sandbox, charged to its memory, of at most `size_bytes` (`None`: the
    /// sandbox's memory limit, else the kernel's default of half the RAM).
    Memory {
        /// The tmpfs' size.
        size_bytes: Option<u64>,
    },
}

/// One file of a [`MountSource::Files`] volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeFile {
    /// Relative path inside the volume (directories above it are made, mode 0755).
    pub path: PathBuf,
    /// Permission bits (`0o644`); only the low 9 bits count.
    pub mode: u32,
    /// The bytes.
    pub content: Vec<u8>,
}

impl Mount {
    /// Checks the paths of this mount.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid =
            |reason: &'static str| SpecError::Mount { target: self.target.clone(), reason };
        if !self.target.is_absolute() || !is_normal(&self.target) {
            return Err(invalid("the mount path must be absolute, without '..'"));
        }
        if self.target == Path::new("/") {
            return Err(invalid("the root cannot be a mount path"));
        }
        if let Some(sub) = &self.sub_path
            && (sub.is_absolute() || !is_normal(sub) || sub.as_os_str().is_empty())
        {
            return Err(invalid("a sub-path must be relative, without '..'"));
        }
        match &self.source {
            MountSource::HostPath { path, .. } => {
                if !path.is_absolute() || !is_normal(path) {
                    return Err(invalid("a host path must be absolute, without '..'"));
                }
            }
            MountSource::EmptyDir { volume, .. } | MountSource::Files { volume, .. } => {
                let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
                if volume.is_empty() || !volume.chars().all(safe) || volume.starts_with('.') {
                    return Err(invalid("a volume name must be letters, digits, '-', '.', '_'"));
                }
            }
        }
        if let MountSource::Files { files, .. } = &self.source
            && files.iter().any(|f| f.path.is_absolute() || !is_normal(&f.path))
        {
            return Err(invalid("a file's path must be relative, without '..'"));
        }
        let nul = |p: &Path| p.as_os_str().as_encoded_bytes().contains(&0);
        if nul(&self.target) || self.sub_path.as_deref().is_some_and(nul) {
            return Err(invalid("a path contains a NUL byte"));
        }
        Ok(())
    }
}

fn is_normal(path: &Path) -> bool {
    path.components().all(|c| matches!(c, Component::Normal(_) | Component::RootDir))
}

/// What the sandbox's processes may do beyond (or short of) the runtime's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Security {
    /// The root overlay is mounted read-only (volumes, `/tmp`, `/dev/shm` stay writable).
    #[serde(default)]
    pub read_only_root: bool,
    /// Capabilities added to the runtime's default set, by name (`NET_ADMIN`, with or without
    /// `CAP_`; `ALL` is every one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_capabilities: Vec<String>,
    /// Capabilities removed from it, after the additions (`ALL` removes every one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_capabilities: Vec<String>,
    /// No process may gain privileges through `execve` (setuid programs, file capabilities):
    /// `PR_SET_NO_NEW_PRIVS`.
    #[serde(default)]
    pub no_new_privileges: bool,
    /// A pod's `fsGroup`: the group that owns the sandbox's volumes (an emptyDir group-writable
    /// with the setgid bit, files group-readable, as the kubelet sets them), and a supplementary
    /// group of the command. Host paths are left as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_group: Option<u32>,
    /// The system call filter of every process of the sandbox.
    #[serde(default, skip_serializing_if = "Seccomp::is_default")]
    pub seccomp: Seccomp,
}

/// The system call filter of a sandbox (a pod's `seccompProfile.type`).
///
/// The default is [`Seccomp::RuntimeDefault`], not Kubernetes' `Unconfined`: a sandbox runs
/// code nobody reviewed (an agent's), and a platform for that is expected to confine it by
/// default, as the reference's container runtimes and E2B's microVMs do; a template that needs
/// more asks for it (`Unconfined`, or the capability whose calls it needs, which opens them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Seccomp {
    /// Docker's default profile, keyed on the capabilities the sandbox keeps.
    #[default]
    RuntimeDefault,
    /// No filter: only capabilities and namespaces confine the sandbox.
    Unconfined,
}

impl Seccomp {
    /// Whether this is the default (for serialization).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Security {
    /// Whether this is the default (for serialization).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks that every capability name is known.
    pub fn validate(&self) -> Result<(), SpecError> {
        for name in self.add_capabilities.iter().chain(&self.drop_capabilities) {
            if name != "ALL" && capability_number(name).is_none() {
                return Err(SpecError::UnknownCapability(name.clone()));
            }
        }
        Ok(())
    }
}

/// Linux capability names, by number (`capability.h`).
pub const CAPABILITIES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The number of capability `name` (`NET_RAW` or `CAP_NET_RAW`, any case).
pub fn capability_number(name: &str) -> Option<u32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CAPABILITIES.iter().position(|c| *c == bare).and_then(|i| u32::try_from(i).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(target: &str, sub: Option<&str>) -> Mount {
        Mount {
            target: target.into(),
            source: MountSource::EmptyDir { volume: "v".into(), medium: Medium::Disk },
            sub_path: sub.map(PathBuf::from),
            read_only: false,
        }
    }

    #[test]
    fn mounts_cannot_name_a_place_outside_their_volume() {
        assert_eq!(mount("/data", Some("a/b")).validate(), Ok(()));
        for (target, sub) in [
            ("data", None),
            ("/a/../b", None),
            ("/", None),
            ("/d", Some("../x")),
            ("/d", Some("/x")),
        ] {
            assert!(mount(target, sub).validate().is_err(), "{target} {sub:?}");
        }
        let mut files = mount("/cfg", None);
        files.source = MountSource::Files {
            volume: "cfg".into(),
            files: vec![VolumeFile { path: "../escape".into(), mode: 0o644, content: vec![] }],
        };
        assert!(files.validate().is_err());
    }

    #[test]
    fn capabilities_are_known_by_name_with_or_without_prefix() {
        assert_eq!(capability_number("NET_RAW"), Some(13));
        assert_eq!(capability_number("cap_net_raw"), Some(13));
        assert_eq!(capability_number("CHECKPOINT_RESTORE"), Some(40));
        assert_eq!(capability_number("NET_RAWR"), None);
        let bad = Security { add_capabilities: vec!["FLY".into()], ..Security::default() };
        assert_eq!(bad.validate(), Err(SpecError::UnknownCapability("FLY".into())));
    }
}
