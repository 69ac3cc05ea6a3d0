//! What a runtime is asked to run: [`SandboxSpec`] and its parts.
//!
//! The spec is the resolved first container of a Sandbox's pod template (command, args, env,
//! working directory, resources) plus the choices that belong to the sandbox itself (root
//! filesystem, hostname, id). It knows nothing about Kubernetes types: a converter elsewhere maps a
//! `PodTemplateSpec` to it.
//!
//! Invariants:
//! - a [`SandboxId`] is always a safe single path component (checked in its constructor), so it
//!   can name state directories and cgroups directly;
//! - [`SandboxSpec::validate`] is the one place that decides whether a spec can be run; runtimes
//!   call it before touching the system.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::volume::{
    HostPathKind, Medium, Mount, MountSource, Security, VolumeFile, capability_number,
};

/// The longest sandbox id we accept; it is used as a cgroup and directory name.
pub const MAX_ID_LEN: usize = 128;

/// The identity of a sandbox instance, unique within one runtime.
///
/// Made of ASCII letters, digits, `.`, `_` and `-`, 1 to [`MAX_ID_LEN`] characters, not starting
/// with `.` or `-`, so it is always a safe path component.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    /// Checks `id` and wraps it.
    pub fn new(id: impl Into<String>) -> Result<Self, SpecError> {
        let id = id.into();
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let ok = !id.is_empty()
            && id.len() <= MAX_ID_LEN
            && id.chars().all(valid_char)
            && !id.starts_with(['.', '-']);
        if ok { Ok(Self(id)) } else { Err(SpecError::InvalidId(id)) }
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for SandboxId {
    type Error = SpecError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<SandboxId> for String {
    fn from(value: SandboxId) -> Self {
        value.0
    }
}

/// Everything a runtime needs to create one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The sandbox's identity; `ensure` is idempotent on it.
    pub id: SandboxId,
    /// The hostname seen inside the sandbox (its own UTS namespace).
    pub hostname: String,
    /// Which root filesystem sits below the sandbox's writable layer.
    pub root: RootFs,
    /// The process the sandbox init starts and supervises.
    pub process: ProcessSpec,
    /// CPU, memory and PID limits; `None` fields mean unlimited.
    pub resources: ResourceLimits,
    /// What network the sandbox gets.
    pub network: NetworkMode,
    /// Whether sandbox root is remapped to an unprivileged host id range.
    pub user_namespace: UserNamespace,
    /// Create the sandbox from this snapshot (see [`Runtime::snapshot`](crate::Runtime::snapshot)):
    /// its writable layer starts as a copy of the snapshot's and its processes are restored from
    /// the snapshot's images instead of starting `process`. Once created, the sandbox is like any
    /// other (a stopped one starts `process` again on its writable layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<SandboxId>,
    /// Volumes mounted into the sandbox, in order (a later one may sit inside an earlier one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// What the sandbox's processes may do beyond the runtime's defaults.
    #[serde(default, skip_serializing_if = "Security::is_default")]
    pub security: Security,
    /// Bandwidth limits of an outbound sandbox's traffic.
    #[serde(default, skip_serializing_if = "Bandwidth::is_unlimited")]
    pub bandwidth: Bandwidth,
}

/// Bandwidth limits of an outbound sandbox, in bits per second (Kubernetes' pod annotations
/// `kubernetes.io/egress-bandwidth` and `kubernetes.io/ingress-bandwidth`, as the CNI bandwidth
/// plugin reads them); `None` is unlimited. A loopback-only sandbox has no traffic to limit and
/// refuses limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    /// What the sandbox sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_bits_per_second: Option<u64>,
    /// What the sandbox receives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_bits_per_second: Option<u64>,
}

impl Bandwidth {
    /// Whether neither direction is limited.
    pub fn is_unlimited(&self) -> bool {
        self.egress_bits_per_second.is_none() && self.ingress_bits_per_second.is_none()
    }
}

impl SandboxSpec {
    /// A spec for `id` running `command` (program then arguments) on the default root, with the
    /// id as hostname (truncated to a valid hostname), no limits and loopback-only networking.
    pub fn new(id: SandboxId, command: Vec<String>) -> Self {
        let hostname = default_hostname(&id);
        Self {
            id,
            hostname,
            root: RootFs::Default,
            process: ProcessSpec { command, ..ProcessSpec::default() },
            resources: ResourceLimits::default(),
            network: NetworkMode::Loopback,
            user_namespace: UserNamespace::Host,
            from_snapshot: None,
            mounts: Vec::new(),
            security: Security::default(),
            bandwidth: Bandwidth::default(),
        }
    }

    /// The full argument vector: `command` followed by `args`.
    pub fn argv(&self) -> Vec<String> {
        self.process.command.iter().chain(&self.process.args).cloned().collect()
    }

    /// Checks everything that can be checked without touching the system.
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_hostname(&self.hostname)?;
        if !self.bandwidth.is_unlimited() && self.network != NetworkMode::Outbound {
            return Err(SpecError::BandwidthWithoutNetwork);
        }
        let zero = |limit: Option<u64>| limit == Some(0);
        if zero(self.bandwidth.egress_bits_per_second)
            || zero(self.bandwidth.ingress_bits_per_second)
        {
            return Err(SpecError::ZeroBandwidth);
        }
        let argv = self.argv();
        // No command at all is valid: the sandbox then runs its agent runtime alone (a runtime
        // without one refuses it, see [`SpecError::EmptyCommand`]).
        if argv.first().is_some_and(String::is_empty) {
            return Err(SpecError::EmptyCommand);
        }
        if let Some(arg) = argv.iter().find(|a| a.contains('\0')) {
            return Err(SpecError::NulByte { what: "argument", value: arg.clone() });
        }
        for var in &self.process.env {
            if var.name.is_empty() || var.name.contains(['=', '\0']) {
                return Err(SpecError::InvalidEnvName(var.name.clone()));
            }
            if var.value.contains('\0') {
                return Err(SpecError::NulByte {
                    what: "environment value",
                    value: var.name.clone(),
                });
            }
        }
        if let Some(dir) = &self.process.working_dir
            && !dir.is_absolute()
        {
            return Err(SpecError::RelativePath { what: "working dir", path: dir.clone() });
        }
        match &self.root {
            RootFs::Default => {}
            RootFs::Directory(dir) => {
                if !dir.is_absolute() {
                    return Err(SpecError::RelativePath {
                        what: "root filesystem",
                        path: dir.clone(),
                    });
                }
            }
            RootFs::Layers(layers) => {
                if layers.is_empty() {
                    return Err(SpecError::NoLayers);
                }
                if layers.len() > MAX_LAYERS {
                    return Err(SpecError::TooManyLayers(layers.len()));
                }
                if let Some(layer) = layers.iter().find(|l| !l.is_absolute()) {
                    return Err(SpecError::RelativePath {
                        what: "root filesystem layer",
                        path: layer.clone(),
                    });
                }
            }
        }
        for mount in &self.mounts {
            mount.validate()?;
        }
        self.security.validate()?;
        let limits = &self.resources;
        if limits.cpu_millis == Some(0) {
            return Err(SpecError::Limit { what: "cpu", reason: "must be at least 1 millicpu" });
        }
        if limits.memory_bytes.is_some_and(|m| m < MIN_MEMORY_BYTES) {
            return Err(SpecError::Limit { what: "memory", reason: "must be at least 4 MiB" });
        }
        if let UserNamespace::Remapped { host_base, size } = self.user_namespace {
            if host_base == 0 {
                return Err(SpecError::IdMap("host_base 0 would map sandbox root to host root"));
            }
            if size == 0 || host_base.checked_add(size).is_none() {
                return Err(SpecError::IdMap("size must be at least 1 and end below 2^32"));
            }
        }
        if let Some(check) = &self.process.startup_check {
            check.validate()?;
        }
        if limits.pids.is_some_and(|p| p < MIN_PIDS) {
            return Err(SpecError::Limit {
                what: "pids",
                reason: "must be at least 2 (the init and the command)",
            });
        }
        Ok(())
    }
}

/// The most layers a [`RootFs::Layers`] root may have: overlayfs stacks at most 500 lower
/// layers, and the runtime adds none of its own below an image.
pub const MAX_LAYERS: usize = 500;

/// The smallest memory limit accepted: below it even the init cannot start.
pub const MIN_MEMORY_BYTES: u64 = 4 << 20;
/// The smallest PID limit accepted: the init and the command.
pub const MIN_PIDS: u64 = 2;

fn default_hostname(id: &SandboxId) -> String {
    let mut name: String = id
        .as_str()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c.to_ascii_lowercase() } else { '-' })
        .take(63)
        .collect();
    while name.ends_with('-') {
        name.pop();
    }
    while name.starts_with('-') {
        name.remove(0);
    }
    if name.is_empty() { "sandbox".to_owned() } else { name }
}

fn validate_hostname(name: &str) -> Result<(), SpecError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 64 || !name.split('.').all(label_ok) {
        return Err(SpecError::InvalidHostname(name.to_owned()));
    }
    Ok(())
}

/// The process a sandbox runs: the resolved first container of the pod template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSpec {
    /// The entrypoint (`command` in a container); its first element is the program, looked up in
    /// the `PATH` of `env` (or a default `PATH`) inside the sandbox.
    pub command: Vec<String>,
    /// Arguments appended to `command`.
    pub args: Vec<String>,
    /// Environment variables, in order; later entries win.
    pub env: Vec<EnvVar>,
    /// The working directory inside the sandbox; `/` when absent.
    pub working_dir: Option<PathBuf>,
    /// The user the command runs as; root when absent.
    pub user: Option<User>,
    /// Groups the command is in besides the user's primary group (a pod's
    /// `supplementalGroups`); none when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supplementary_groups: Vec<u32>,
    /// What must succeed inside the sandbox after the command started before the sandbox is
    /// ready (a container's `startupProbe`); ready at once when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_check: Option<crate::startup::StartupCheck>,
}

/// One environment variable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    /// The variable's name: not empty, no `=` or NUL.
    pub name: String,
    /// The value: no NUL.
    pub value: String,
}

impl EnvVar {
    /// A variable `name=value`.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self { name: name.into(), value: value.into() }
    }
}

/// A numeric user and group inside the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

impl User {
    /// The default root's unprivileged account, `user` (1000:1000, home `/home/user`).
    pub const DEFAULT_USER: User = User { uid: 1000, gid: 1000 };
}

/// Limits applied through the sandbox's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// CPU quota in thousandths of a CPU (Kubernetes millicores); `1500` is one and a half CPUs.
    pub cpu_millis: Option<u64>,
    /// Memory limit in bytes; swap is disabled for the sandbox.
    pub memory_bytes: Option<u64>,
    /// Maximum number of processes and threads.
    pub pids: Option<u64>,
}

/// The root filesystem below a sandbox's writable layer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootFs {
    /// The runtime's default root: the host's system directories read-only plus a generated
    /// `/etc` with `root` and `user` accounts.
    #[default]
    Default,
    /// A root filesystem directory on the host (for example one made with debootstrap), used
    /// read-only as the lower layer.
    Directory(PathBuf),
    /// Read-only directories stacked as the overlay's lower layers, **bottom first** (an OCI
    /// image's unpacked layers, in the manifest's order, whiteouts already in overlayfs' form:
    /// a `0:0` character device hides a lower file, the `trusted.overlay.opaque` attribute a
    /// lower directory's content). Nothing of the host is added: the image is the whole root,
    /// apart from the per-sandbox `/etc/hostname`, `/etc/hosts` and (with outbound networking)
    /// `/etc/resolv.conf` the runtime writes into every writable layer.
    Layers(Vec<PathBuf>),
}

impl std::fmt::Display for RootFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => f.write_str("the default root"),
            Self::Directory(dir) => write!(f, "{}", dir.display()),
            Self::Layers(layers) => match layers.last() {
                Some(top) => write!(f, "{} image layers (top {})", layers.len(), top.display()),
                None => f.write_str("an image of no layers"),
            },
        }
    }
}

/// The network a sandbox gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetworkMode {
    /// Its own network namespace with only `lo`, up. The host reaches its ports through the
    /// runtime's `connect`.
    #[default]
    Loopback,
    /// Loopback plus outbound access: a veth pair (`eth0` inside, with an address from the
    /// runtime's private subnet and a default route via the host end) and NAT on the host; the
    /// host's nameservers in `/etc/resolv.conf`.
    Outbound,
}

/// User namespace choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UserNamespace {
    /// No user namespace: sandbox root is host root with a reduced capability set.
    #[default]
    Host,
    /// A user namespace of its own: sandbox ids `0..size` are host ids
    /// `host_base..host_base+size` (uids and gids alike), so sandbox root has no privilege on the
    /// host. Its writable layer and cgroups are owned by `host_base`. The range is the spec's: a
    /// caller that gives every sandbox the same range (as [`UserNamespace::DEFAULT_REMAPPED`])
    /// keeps sandboxes apart from the host but not from each other's files, should one escape
    /// its mount namespace; distinct ranges per sandbox do both.
    ///
    /// Files of the template root (owned by host ids outside the range) appear as `nobody`
    /// inside and cannot be changed (no copy-up); new files anywhere in the writable layer and
    /// `/tmp` work. An idmapped lower layer would lift the first limit.
    Remapped {
        /// First host uid/gid of the range.
        host_base: u32,
        /// Number of ids mapped.
        size: u32,
    },
}

impl UserNamespace {
    /// The range the controllers use for a sandbox that asks for a user namespace: 65536 ids
    /// from host id 1000000 (clear of the usual `/etc/subuid` ranges, which start at 100000).
    pub const DEFAULT_REMAPPED: UserNamespace =
        UserNamespace::Remapped { host_base: 1_000_000, size: 65_536 };
}

/// Why a spec cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A loopback-only sandbox was given a bandwidth limit.
    #[error(
        "a bandwidth limit (kubernetes.io/egress-bandwidth, kubernetes.io/ingress-bandwidth) needs \
         an outbound sandbox: a loopback-only one has no traffic to limit (set the template \
         annotation agents.kruise.io/network: outbound, or drop the limit)"
    )]
    BandwidthWithoutNetwork,
    /// A bandwidth limit of zero.
    #[error("a bandwidth limit must be more than 0 bits per second")]
    ZeroBandwidth,
    /// The id is not a safe path component.
    #[error(
        "invalid sandbox id {0:?}: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
    )]
    InvalidId(String),
    /// The hostname is not a valid DNS name.
    #[error("invalid hostname {0:?}: use dot-separated labels of letters, digits and '-'")]
    InvalidHostname(String),
    /// Neither command nor args name a program, and there is no agent runtime to run instead
    /// (or the program's name is empty).
    #[error(
        "no command: the container needs a command or args naming a program (only a sandbox \
         with the agent runtime can do without)"
    )]
    EmptyCommand,
    /// A string that becomes a C string contains NUL.
    #[error("{what} {value:?} contains a NUL byte")]
    NulByte {
        /// What kind of string.
        what: &'static str,
        /// The offending value (or the variable's name).
        value: String,
    },
    /// An environment variable name is empty or contains `=`.
    #[error("invalid environment variable name {0:?}")]
    InvalidEnvName(String),
    /// A path that must be absolute is relative.
    #[error("{what} {path:?} must be an absolute path")]
    RelativePath {
        /// Which path.
        what: &'static str,
        /// The path given.
        path: PathBuf,
    },
    /// A layered root names no layer.
    #[error("a root of image layers needs at least one layer")]
    NoLayers,
    /// A layered root has more layers than overlayfs can stack.
    #[error("a root of {0} image layers exceeds overlayfs' limit of {MAX_LAYERS}")]
    TooManyLayers(usize),
    /// A user namespace's id range cannot be used.
    #[error("invalid user namespace id range: {0}")]
    IdMap(&'static str),
    /// A mount cannot be made safely.
    #[error("mount {target:?}: {reason}")]
    Mount {
        /// The mount's path in the sandbox.
        target: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// A capability name is not one of Linux's.
    #[error("unknown capability {0:?}")]
    UnknownCapability(String),
    /// A resource limit is out of range.
    #[error("invalid {what} limit: {reason}")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The startup check cannot be run.
    #[error("invalid startup check: {0}")]
    StartupCheck(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        SandboxId::new(s).unwrap()
    }

    #[test]
    fn ids_must_be_safe_path_components() {
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(SandboxId::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "sbx-1", "ns_name.v2", &"x".repeat(128)] {
            assert!(SandboxId::new(good).is_ok(), "{good:?} rejected");
        }
    }

    #[test]
    fn default_hostname_is_a_valid_hostname() {
        for raw in ["abc", "A_B.c", "x", "_-_", &"y".repeat(128)] {
            let spec = SandboxSpec::new(id(raw), vec!["true".into()]);
            spec.validate().unwrap();
        }
    }

    #[test]
    fn validate_rejects_what_cannot_run() {
        let base = SandboxSpec::new(id("s"), vec!["sh".into()]);
        let mut s = base.clone();
        s.process.command = vec![String::new()];
        assert_eq!(s.validate(), Err(SpecError::EmptyCommand));
        // No command at all is the agent runtime alone: valid here, refused by a runtime
        // without one.
        let mut s = base.clone();
        s.process.command.clear();
        assert_eq!(s.validate(), Ok(()));
        let mut s = base.clone();
        s.process.env.push(EnvVar::new("A=B", "c"));
        assert!(matches!(s.validate(), Err(SpecError::InvalidEnvName(_))));
        let mut s = base.clone();
        s.process.working_dir = Some("rel".into());
        assert!(matches!(s.validate(), Err(SpecError::RelativePath { .. })));
        let mut s = base.clone();
        s.root = RootFs::Layers(vec![]);
        assert_eq!(s.validate(), Err(SpecError::NoLayers));
        let mut s = base.clone();
        s.root = RootFs::Layers(vec!["/layers/a".into(), "layers/b".into()]);
        assert!(matches!(s.validate(), Err(SpecError::RelativePath { .. })));
        let mut s = base.clone();
        s.root = RootFs::Layers(vec!["/layers/a".into(); MAX_LAYERS + 1]);
        assert_eq!(s.validate(), Err(SpecError::TooManyLayers(MAX_LAYERS + 1)));
        let mut s = base.clone();
        s.root = RootFs::Layers(vec!["/layers/a".into(), "/layers/b".into()]);
        assert_eq!(s.validate(), Ok(()));
        let mut s = base.clone();
        s.resources.pids = Some(1);
        assert!(matches!(s.validate(), Err(SpecError::Limit { what: "pids", .. })));
        let mut s = base;
        s.hostname = "bad_host".into();
        assert!(matches!(s.validate(), Err(SpecError::InvalidHostname(_))));
    }

    #[test]
    fn args_only_spec_uses_args_as_argv() {
        let mut s = SandboxSpec::new(id("s"), vec![]);
        s.process.args = vec!["sleep".into(), "1".into()];
        s.validate().unwrap();
        assert_eq!(s.argv(), ["sleep", "1"]);
    }
}
