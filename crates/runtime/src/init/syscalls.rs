//! The syscalls the init's setup stage makes, behind a trait.
//!
//! [`LinuxSyscalls`] makes them; [`RecordingSyscalls`] records each call with its arguments so
//! unit tests can check "these mounts, in this order, with these flags" without root (the youki
//! `syscall/test.rs` habit).
//!
//! Invariant: every path inside the new root is resolved with [`Syscalls::resolve`], which walks
//! it with `openat2(RESOLVE_IN_ROOT)` so that a symlink planted in a sandbox's writable layer (say
//! `/tmp -> /etc`) resolves inside the root and can never make the setup create or mount anything
//! outside it. Mounts then target the resolved `O_PATH` descriptor through `/proc/self/fd/N`.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::protocol::OverlayPlan;

/// What to create when a mount point is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// An empty regular file.
    File,
}

/// A resolved path inside the new root, usable as a mount target while it lives.
#[derive(Debug)]
pub enum Target {
    /// An `O_PATH` descriptor, mounted on through `/proc/self/fd/N`.
    Fd(OwnedFd),
    /// A plain path (recording implementation).
    Path(PathBuf),
}

impl Target {
    /// The path to hand to `mount(2)`.
    pub fn mount_path(&self) -> PathBuf {
        match self {
            Self::Fd(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
            Self::Path(p) => p.clone(),
        }
    }
}

/// The kernel interface of the setup stage.
pub trait Syscalls {
    /// Makes every mount in this (new) mount namespace private, so nothing propagates to the host.
    fn make_mounts_private(&self) -> io::Result<()>;
    /// Mounts a file system (`source`, `fstype`, `flags`, `data` as in `mount(2)`).
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: &str,
    ) -> io::Result<()>;
    /// Mounts an overlay at `target` through the new mount API, one `lowerdir+` per lower layer
    /// (uppermost first, as `lowerdir=` lists them), so no option string limits their number or
    /// the length of their paths (Linux 6.8 and later).
    fn mount_overlay_by_layer(&self, target: &Path, overlay: &OverlayPlan) -> io::Result<()>;
    /// Bind-mounts `source` (a host path) on `target`.
    fn bind(&self, source: &Path, target: &Path) -> io::Result<()>;
    /// Makes the bind mount at `target` read-only.
    fn remount_readonly(&self, target: &Path) -> io::Result<()>;
    /// Resolves `path` (absolute, inside `root`) without leaving `root`, creating the last
    /// component as `create` if it is missing (parents as directories); `Ok(None)` if it is missing
    /// and `create` is `None`.
    fn resolve(&self, root: &Path, path: &Path, create: Option<Kind>)
    -> io::Result<Option<Target>>;
    /// Creates the symlink `path -> dest` inside `root` unless something exists there.
    fn symlink(&self, root: &Path, path: &Path, dest: &Path) -> io::Result<()>;
    /// Sets the UTS hostname.
    fn set_hostname(&self, name: &str) -> io::Result<()>;
    /// Brings the loopback interface up.
    fn loopback_up(&self) -> io::Result<()>;
    /// Enters a new cgroup namespace rooted at the current cgroups.
    fn unshare_cgroup_namespace(&self) -> io::Result<()>;
    /// Makes `new_root` the root of the mount namespace and detaches the old root.
    fn pivot_root(&self, new_root: &Path) -> io::Result<()>;
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSyscalls;

impl Syscalls for LinuxSyscalls {
    fn make_mounts_private(&self) -> io::Result<()> {
        tracing::debug!("mount --make-rprivate /");
        rustix::mount::mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        )?;
        Ok(())
    }

    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: &str,
    ) -> io::Result<()> {
        tracing::debug!(source, ?target, fstype, ?flags, data, "mount");
        let data = std::ffi::CString::new(data)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        rustix::mount::mount(source, target, fstype, flags, Some(data.as_c_str()))?;
        Ok(())
    }

    fn mount_overlay_by_layer(&self, target: &Path, overlay: &OverlayPlan) -> io::Result<()> {
        use rustix::mount::{
            FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, fsconfig_create,
            fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
        };
        tracing::debug!(?target, layers = overlay.lower.len(), "mount overlay layer by layer");
        let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
        for layer in &overlay.lower {
            fsconfig_set_string(&fs, "lowerdir+", layer.as_path())?;
        }
        fsconfig_set_string(&fs, "upperdir", overlay.upper.as_path())?;
        fsconfig_set_string(&fs, "workdir", overlay.work.as_path())?;
        if overlay.userxattr {
            fsconfig_set_flag(&fs, "userxattr")?;
        }
        fsconfig_create(&fs)?;
        let mnt = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())?;
        move_mount(&mnt, "", rustix::fs::CWD, target, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)?;
        Ok(())
    }

    fn bind(&self, source: &Path, target: &Path) -> io::Result<()> {
        tracing::debug!(?source, ?target, "bind mount");
        rustix::mount::mount_bind(source, target)?;
        Ok(())
    }

    fn remount_readonly(&self, target: &Path) -> io::Result<()> {
        tracing::debug!(?target, "remount read-only");
        rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")?;
        Ok(())
    }

    fn resolve(
        &self,
        root: &Path,
        path: &Path,
        create: Option<Kind>,
    ) -> io::Result<Option<Target>> {
        let root_fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let rel = relative(path)?;
        let open = |p: &Path, extra: OFlags| {
            rustix::fs::openat2(
                &root_fd,
                p,
                OFlags::PATH | OFlags::CLOEXEC | extra,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            )
        };
        match open(&rel, OFlags::empty()) {
            Ok(fd) => return Ok(Some(Target::Fd(fd))),
            Err(rustix::io::Errno::NOENT) if create.is_some() => {}
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        // Create each missing component, each time from a parent resolved inside the root.
        let mut parent = PathBuf::new();
        let components: Vec<&OsStr> = rel.iter().collect();
        for (i, name) in components.iter().enumerate() {
            let last = i + 1 == components.len();
            let dir = if parent.as_os_str().is_empty() {
                rustix::fs::openat2(
                    &root_fd,
                    ".",
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::IN_ROOT,
                )?
            } else {
                open(&parent, OFlags::DIRECTORY)?
            };
            let kind = if last { create.unwrap_or(Kind::Dir) } else { Kind::Dir };
            let made = match kind {
                Kind::Dir => rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(0o755)),
                Kind::File => rustix::fs::openat(
                    &dir,
                    *name,
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::WRONLY
                        | OFlags::CLOEXEC
                        | OFlags::NOFOLLOW,
                    Mode::from_raw_mode(0o644),
                )
                .map(drop),
            };
            match made {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            parent.push(name);
        }
        Ok(Some(Target::Fd(open(&rel, OFlags::empty())?)))
    }

    fn symlink(&self, root: &Path, path: &Path, dest: &Path) -> io::Result<()> {
        let rel = relative(path)?;
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let Some(Target::Fd(dir)) =
            self.resolve(root, &Path::new("/").join(parent), Some(Kind::Dir))?
        else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        // An O_PATH descriptor can serve as the directory of *at calls.
        match rustix::fs::symlinkat(dest, dir.as_fd(), name) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn set_hostname(&self, name: &str) -> io::Result<()> {
        tracing::debug!(name, "sethostname");
        rustix::system::sethostname(name.as_bytes())?;
        Ok(())
    }

    fn loopback_up(&self) -> io::Result<()> {
        tracing::debug!("ip link set lo up");
        loopback_up()
    }

    fn unshare_cgroup_namespace(&self) -> io::Result<()> {
        tracing::debug!("unshare(CLONE_NEWCGROUP)");
        // SAFETY: CLONE_NEWCGROUP does not unshare the file descriptor table, the only flag whose
        // use `unshare_unsafe` warns about; the setup stage is single-threaded anyway.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }?;
        Ok(())
    }

    fn pivot_root(&self, new_root: &Path) -> io::Result<()> {
        tracing::debug!(?new_root, "pivot_root");
        // pivot_root(".", ".") stacks the old root on top of the new one; unmounting "." then
        // detaches the old root without needing a directory for it (pivot_root(2), NOTES).
        rustix::process::chdir(new_root)?;
        rustix::process::pivot_root(".", ".")?;
        rustix::mount::unmount(".", UnmountFlags::DETACH)?;
        rustix::process::chdir("/")?;
        Ok(())
    }
}

/// `path` without its leading `/`, refusing `..` and empty paths.
fn relative(path: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "path with '..'"));
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"));
    }
    Ok(out)
}

/// Sets `IFF_UP` on `lo` with the `SIOCGIFFLAGS`/`SIOCSIFFLAGS` ioctls (netdevice(7)).
fn loopback_up() -> io::Result<()> {
    #[repr(C)]
    struct IfreqFlags {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    let mut req = IfreqFlags { name: [0; libc::IFNAMSIZ], flags: 0, _pad: [0; 22] };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: `req` is a properly sized, initialised `struct ifreq` (name + flags union member
    // padded to 40 bytes) that outlives both calls; the socket is a valid open descriptor.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    req.flags |= libc::IFF_UP as libc::c_short;
    // SAFETY: as above.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// [`Syscalls::make_mounts_private`].
    MakePrivate,
    /// [`Syscalls::mount`].
    Mount {
        /// Source.
        source: String,
        /// Target.
        target: PathBuf,
        /// File system type.
        fstype: String,
        /// Flags.
        flags: MountFlags,
        /// Data string.
        data: String,
    },
    /// [`Syscalls::mount_overlay_by_layer`].
    OverlayByLayer {
        /// Target.
        target: PathBuf,
        /// The overlay's layers.
        overlay: OverlayPlan,
    },
    /// [`Syscalls::bind`].
    Bind {
        /// Host source.
        source: PathBuf,
        /// Target.
        target: PathBuf,
    },
    /// [`Syscalls::remount_readonly`].
    RemountReadonly(PathBuf),
    /// [`Syscalls::resolve`].
    Resolve {
        /// Path inside the root.
        path: PathBuf,
        /// What to create.
        create: Option<Kind>,
    },
    /// [`Syscalls::symlink`].
    Symlink {
        /// Link path inside the root.
        path: PathBuf,
        /// Its content.
        dest: PathBuf,
    },
    /// [`Syscalls::set_hostname`].
    SetHostname(String),
    /// [`Syscalls::loopback_up`].
    LoopbackUp,
    /// [`Syscalls::unshare_cgroup_namespace`].
    UnshareCgroup,
    /// [`Syscalls::pivot_root`].
    PivotRoot(PathBuf),
}

/// Records every call and succeeds; paths listed in `missing` resolve to nothing.
#[derive(Debug, Default)]
pub struct RecordingSyscalls {
    /// The calls, in order.
    pub calls: RefCell<Vec<Call>>,
    /// Sandbox paths that do not exist (for optional mounts).
    pub missing: Vec<PathBuf>,
}

impl RecordingSyscalls {
    fn push(&self, call: Call) {
        self.calls.borrow_mut().push(call);
    }
}

impl Syscalls for RecordingSyscalls {
    fn make_mounts_private(&self) -> io::Result<()> {
        self.push(Call::MakePrivate);
        Ok(())
    }
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: &str,
    ) -> io::Result<()> {
        self.push(Call::Mount {
            source: source.into(),
            target: target.into(),
            fstype: fstype.into(),
            flags,
            data: data.into(),
        });
        Ok(())
    }
    fn mount_overlay_by_layer(&self, target: &Path, overlay: &OverlayPlan) -> io::Result<()> {
        self.push(Call::OverlayByLayer { target: target.into(), overlay: overlay.clone() });
        Ok(())
    }
    fn bind(&self, source: &Path, target: &Path) -> io::Result<()> {
        self.push(Call::Bind { source: source.into(), target: target.into() });
        Ok(())
    }
    fn remount_readonly(&self, target: &Path) -> io::Result<()> {
        self.push(Call::RemountReadonly(target.into()));
        Ok(())
    }
    fn resolve(
        &self,
        root: &Path,
        path: &Path,
        create: Option<Kind>,
    ) -> io::Result<Option<Target>> {
        self.push(Call::Resolve { path: path.into(), create });
        if create.is_none() && self.missing.iter().any(|m| m == path) {
            return Ok(None);
        }
        let rel = relative(path)?;
        Ok(Some(Target::Path(root.join(rel))))
    }
    fn symlink(&self, _root: &Path, path: &Path, dest: &Path) -> io::Result<()> {
        self.push(Call::Symlink { path: path.into(), dest: dest.into() });
        Ok(())
    }
    fn set_hostname(&self, name: &str) -> io::Result<()> {
        self.push(Call::SetHostname(name.into()));
        Ok(())
    }
    fn loopback_up(&self) -> io::Result<()> {
        self.push(Call::LoopbackUp);
        Ok(())
    }
    fn unshare_cgroup_namespace(&self) -> io::Result<()> {
        self.push(Call::UnshareCgroup);
        Ok(())
    }
    fn pivot_root(&self, new_root: &Path) -> io::Result<()> {
        self.push(Call::PivotRoot(new_root.into()));
        Ok(())
    }
}

/// Lossy display of an OS string, for messages.
pub(crate) fn display(p: &Path) -> String {
    String::from_utf8_lossy(p.as_os_str().as_bytes()).into_owned()
}
