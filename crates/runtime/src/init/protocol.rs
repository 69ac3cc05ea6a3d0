//! The typed protocol between the runtime (parent) and a sandbox init (child).
//!
//! Expected flow, over one `AF_UNIX` stream socket pair that the init receives as fd 3:
//!
//! 1. The parent clones the init into new namespaces, puts it in the sandbox's cgroups, then
//!    writes two frames at once: [`ToInit::Setup`] and [`ToInit::Start`].
//! 2. The init's setup stage reads exactly one frame (`Setup`), builds the root filesystem, pivots
//!    into it, answers [`FromInit::Mounted`] and re-executes itself from inside the root; the
//!    second frame waits in the socket buffer meanwhile.
//! 3. The init's run stage reads `Start`, starts the command, and answers [`FromInit::Ready`] once
//!    the command has been executed, or [`FromInit::Failed`] at the first error of any stage.
//! 4. The init closes its end (and, with [`StartPlan::envd`], executes the agent runtime daemon
//!    in its place, which never sees the channel). Nothing else is ever sent: a sandbox must hold no socket to the
//!    host (CRIU cannot checkpoint it), and the parent may die at any time.
//!
//! Frames are a little-endian `u32` length followed by that many bytes of JSON. Reads take exactly
//! the frame's bytes, never more, which is what lets two stages of one process share the socket.
//!
//! Guarantees: if the parent dies before step 3, the init reads end-of-file and exits, so a
//! half-started sandbox never outlives its creator unnoticed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use oka_runtime_api::spec::User;

/// The file descriptor on which a sandbox init finds its end of the channel.
pub const CHANNEL_FD: i32 = 3;

/// The largest frame accepted (a spec with a large environment stays far below it).
pub const MAX_FRAME: usize = 4 << 20;

/// A message from the runtime to a sandbox init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToInit {
    /// Build the root filesystem and pivot into it.
    Setup(SetupPlan),
    /// Start the command.
    Start(StartPlan),
}

/// How the setup stage builds the sandbox's root. Host paths are absolute paths as the init sees
/// them before `pivot_root`; sandbox paths are absolute paths inside the new root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupPlan {
    /// Host path where the overlay is mounted and which becomes `/`.
    pub rootfs: PathBuf,
    /// The overlay's layers.
    pub overlay: OverlayPlan,
    /// Host files and directories bind-mounted into the root (system directories, device nodes,
    /// the init binary, masks over sensitive `/proc` files), in order. Each is a mount CRIU must
    /// be told about with `--external`.
    pub binds: Vec<BindPlan>,
    /// The sandbox's hostname.
    pub hostname: String,
    /// Where the init binary is bind-mounted inside the root; the run stage executes from there so
    /// that no mapping of the sandbox's PID 1 points outside its root.
    pub init_path: PathBuf,
    /// Size of the `/tmp` tmpfs in bytes (`None`: the kernel default, half of RAM, still charged
    /// to the sandbox's memory limit).
    pub tmp_size: Option<u64>,
    /// The sandbox's volumes, mounted in order after the binds.
    #[serde(default)]
    pub volumes: Vec<VolumePlan>,
    /// Remount the root read-only once everything is mounted on it.
    #[serde(default)]
    pub read_only_root: bool,
}

/// One volume mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumePlan {
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
    /// What is mounted there.
    pub source: VolumeSourcePlan,
    /// A path inside the source, resolved inside it (a symlink there cannot lead out) and made
    /// as a directory when missing.
    pub sub_path: Option<PathBuf>,
    /// Mount read-only.
    pub readonly: bool,
}

/// Where a [`VolumePlan`]'s content is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSourcePlan {
    /// A host file or directory (as the init sees it before `pivot_root`), bound: a mount CRIU
    /// must be told about with `--external`.
    Host(PathBuf),
    /// A tmpfs of the sandbox, mounted once at `staging` (a sandbox path) by the first plan
    /// naming it, bound from there to each target.
    Tmpfs {
        /// Where the tmpfs itself is mounted inside the sandbox.
        staging: PathBuf,
        /// Its size in bytes (`None`: the kernel's default).
        size: Option<u64>,
        /// The group owning its root (`fsGroup`), with the setgid bit.
        #[serde(default)]
        gid: Option<u32>,
    },
}

/// The layers of the root overlay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlayPlan {
    /// Read-only lower layers, uppermost first.
    pub lower: Vec<PathBuf>,
    /// The sandbox's writable layer.
    pub upper: PathBuf,
    /// Overlayfs work directory, on the same file system as `upper`.
    pub work: PathBuf,
    /// Keep overlayfs' own attributes in `user.overlay.*` (the `userxattr` option): needed when
    /// the overlay is mounted inside a user namespace, where `trusted.*` cannot be written.
    #[serde(default)]
    pub userxattr: bool,
}

/// One host path bind-mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindPlan {
    /// Host path (file or directory).
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
    /// Mount read-only.
    pub readonly: bool,
    /// Skip this bind when the target does not exist (masks); otherwise the mount point is
    /// created, as a file or directory like the source.
    pub optional: bool,
}

/// How the run stage starts the command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartPlan {
    /// Program and arguments; the program is looked up in `PATH` when it has no `/`. Empty
    /// only with [`StartPlan::envd`]: the daemon is then the sandbox's only process.
    pub argv: Vec<String>,
    /// Environment as `NAME=value` strings.
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
    /// User to run as; root when absent.
    pub user: Option<User>,
    /// Hand PID 1 over to the agent runtime daemon once the command runs; `None`: the init
    /// supervises the command itself.
    #[serde(default)]
    pub envd: Option<EnvdPlan>,
    /// The capability set (bounding, permitted, effective) as a bit mask; `None`: the
    /// runtime's default, [`KEPT_CAPABILITIES`](super::run::KEPT_CAPABILITIES).
    #[serde(default)]
    pub capabilities: Option<u64>,
    /// Set `PR_SET_NO_NEW_PRIVS` before starting anything.
    #[serde(default)]
    pub no_new_privileges: bool,
    /// Install the runtime's system call filter ([`super::seccomp`], keyed on the kept
    /// capabilities) before starting anything; a plan that does not say is filtered.
    #[serde(default = "filtered")]
    pub seccomp: bool,
    /// The command's supplementary groups besides its user's primary group.
    #[serde(default)]
    pub groups: Vec<u32>,
    /// What must succeed after the command started before [`FromInit::Ready`] is sent; a check
    /// that fails ends the command and is reported as [`FromInit::Failed`] (step
    /// [`STARTUP_CHECK_STEP`]).
    pub startup_check: Option<oka_runtime_api::StartupCheck>,
}

fn filtered() -> bool {
    true
}

/// The [`FromInit::Failed`] step of a start whose startup check failed.
pub const STARTUP_CHECK_STEP: &str = "startup probe";

/// How the run stage hands PID 1 over to the agent runtime daemon (`oka-envd`).
///
/// The init binds the daemon's port, starts the command, answers [`FromInit::Ready`] and then
/// executes the daemon in its own place (PID 1 stays PID 1), handing it the listening socket and
/// the command (pid and output pipes) on the command line. The daemon takes over every duty of
/// the run stage: reaping, signal forwarding, output relay, exiting with the command's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvdPlan {
    /// Sandbox path of the daemon's binary (bind-mounted read-only like the init's).
    pub path: PathBuf,
    /// TCP port the daemon serves on, on every address of the sandbox.
    pub port: u16,
}

/// A message from a sandbox init to the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromInit {
    /// The setup stage built the root and pivoted into it.
    Mounted {
        /// Sandbox paths of the host bind mounts actually made (optional ones may be skipped).
        external_mounts: Vec<PathBuf>,
    },
    /// The command runs (or, without a command, the daemon is about to be executed).
    Ready {
        /// The command's pid inside the sandbox's PID namespace; `None` without a command.
        pid: Option<i32>,
    },
    /// A stage failed; the init exits after sending this.
    Failed {
        /// Which step failed, for example `mount overlay` or `exec`.
        step: String,
        /// The error, with the path that failed.
        message: String,
        /// `true` when the failure is about the spec (command not found, bad working directory),
        /// `false` when it is about the system.
        spec_error: bool,
    },
}

/// Why a channel operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Reading or writing the socket failed.
    #[error("sandbox init channel: {0}")]
    Io(#[from] io::Error),
    /// The peer closed its end.
    #[error("sandbox init channel closed by the other side")]
    Closed,
    /// No frame arrived in time.
    #[error("sandbox init channel: no answer before the deadline")]
    Timeout,
    /// A frame was not valid JSON for the expected type.
    #[error("sandbox init channel: bad frame: {0}")]
    Decode(#[from] serde_json::Error),
    /// A frame's length is over [`MAX_FRAME`].
    #[error("sandbox init channel: frame of {0} bytes is too large")]
    TooLarge(usize),
}

/// One end of the parent/init channel.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// Wraps a connected stream socket.
    pub fn new(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// The underlying socket.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Sends one frame.
    pub fn send<T: Serialize>(&self, msg: &T) -> Result<(), ChannelError> {
        let body = serde_json::to_vec(msg)?;
        if body.len() > MAX_FRAME {
            return Err(ChannelError::TooLarge(body.len()));
        }
        let len = u32::try_from(body.len()).map_err(|_| ChannelError::TooLarge(body.len()))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&body);
        let mut rest = &frame[..];
        while !rest.is_empty() {
            match rustix::io::write(&self.fd, rest) {
                Ok(0) => return Err(ChannelError::Closed),
                Ok(n) => rest = &rest[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::PIPE) => return Err(ChannelError::Closed),
                Err(e) => return Err(ChannelError::Io(e.into())),
            }
        }
        Ok(())
    }

    /// Receives one frame, waiting until `deadline` (forever if `None`).
    pub fn recv<T: DeserializeOwned>(&self, deadline: Option<Instant>) -> Result<T, ChannelError> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len, deadline)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(ChannelError::TooLarge(len));
        }
        let mut body = vec![0u8; len];
        self.read_exact(&mut body, deadline)?;
        Ok(serde_json::from_slice(&body)?)
    }

    fn read_exact(
        &self,
        mut buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<(), ChannelError> {
        while !buf.is_empty() {
            if let Some(deadline) = deadline {
                self.wait_readable(deadline)?;
            }
            match rustix::io::read(&self.fd, &mut *buf) {
                Ok(0) => return Err(ChannelError::Closed),
                Ok(n) => buf = &mut buf[n..],
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(e) => return Err(ChannelError::Io(e.into())),
            }
        }
        Ok(())
    }

    fn wait_readable(&self, deadline: Instant) -> Result<(), ChannelError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ChannelError::Timeout);
            }
            let timeout = Timespec::try_from(left).map_err(|_| ChannelError::Timeout)?;
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(0) => {}
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(ChannelError::Io(e.into())),
            }
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
    use std::time::Duration;

    fn pair() -> (Channel, Channel) {
        let (a, b) =
            socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
                .unwrap();
        (Channel::new(a), Channel::new(b))
    }

    #[test]
    fn two_frames_sent_at_once_are_read_one_at_a_time() {
        let (parent, child) = pair();
        let start = StartPlan {
            argv: vec!["sh".into()],
            env: vec![],
            cwd: "/".into(),
            user: None,
            envd: Some(EnvdPlan { path: "/.oka/envd".into(), port: 49983 }),
            capabilities: None,
            no_new_privileges: false,
            seccomp: true,
            groups: vec![],
            startup_check: None,
        };
        parent.send(&ToInit::Start(start.clone())).unwrap();
        parent.send(&FromInit::Ready { pid: Some(2) }).unwrap();
        assert_eq!(child.recv::<ToInit>(None).unwrap(), ToInit::Start(start));
        let second: FromInit = child.recv(None).unwrap();
        assert_eq!(second, FromInit::Ready { pid: Some(2) });
    }

    #[test]
    fn recv_reports_timeout_and_closed() {
        let (parent, child) = pair();
        let deadline = Instant::now() + Duration::from_millis(20);
        assert!(matches!(child.recv::<FromInit>(Some(deadline)), Err(ChannelError::Timeout)));
        drop(parent);
        assert!(matches!(child.recv::<FromInit>(None), Err(ChannelError::Closed)));
    }
}
