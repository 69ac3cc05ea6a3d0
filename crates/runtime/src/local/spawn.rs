//! Starting a sandbox init in new namespaces from a multi-threaded process.
//!
//! The runtime lives in a multi-threaded tokio process. After `fork`/`clone` there, the child is a
//! copy of one thread in an address space whose locks (allocator, stdio, tracing) may be held by
//! threads that no longer exist, so until it executes a new program the child may only make
//! async-signal-safe calls. We therefore:
//!
//! - prepare everything before cloning: the file descriptors (moved to numbers ≥ 10, close-on-exec,
//!   so they can be `dup2`ed onto 0..3 without clobbering each other) and the C strings of the
//!   program path, argv and envp;
//! - clone once, with all namespaces at once (the child *is* PID 1 of the new PID namespace, no
//!   intermediate process) and a pidfd (`CLONE_PIDFD`), so the runtime refers to the init
//!   without pid-reuse races;
//! - clone the way `posix_spawn` does (`CLONE_VM | CLONE_VFORK`, on a small stack of its own):
//!   the child borrows this address space until its `execve`, while the calling thread waits.
//!   A fork-like clone copies the page tables of the whole daemon and the `execve` tears the copy
//!   down again; with hundreds of sandboxes in the daemon's memory that was a quarter of the CPU
//!   a burst of claims used (each claim starts a replacement). Only with a user namespace does
//!   the child need the parent to act before it executes (write its id maps), which a waiting
//!   parent cannot do, so that case keeps a fork-like `clone3`;
//! - block every signal around the clone; the child resets every signal to its default
//!   disposition before it clears its mask, so no handler of the daemon ever runs in it and the
//!   init starts with a clean signal state, whatever the daemon's thread had blocked or ignored;
//! - in the child, call only `rt_sigaction`, `sigprocmask`, `prlimit64`, `dup2`, `close_range`,
//!   `execve` and `_exit` (system calls, no allocation), and with a user namespace first `read` (wait for the
//!   id maps), `setgroups`, `setresgid` and `setresuid` as raw syscalls ([`spawn_init_with`]).
//!
//! Invariants: the child holds exactly fds 0–3 when it executes the init (stdin `/dev/null`,
//! stdout and stderr pipes read by the runtime, the channel socket), whatever the runtime process
//! has open, and with every signal at its default disposition and none blocked, whatever the
//! daemon's thread had; the runtime closes its copies of the child's ends before returning, so the
//! channel reads end-of-file as soon as the init dies.
//!
//! Assumptions: Linux ≥ 5.9 (`clone3` with `CLONE_PIDFD`, `close_range`); root (new namespaces).
//!
//! Alternatives considered: `std::process::Command` with a `pre_exec` that calls `unshare` cannot
//! make the child itself PID 1 of a new PID namespace (`unshare(CLONE_NEWPID)` only affects later
//! children), so it needs a second fork (and `Command` forks, with the cost above).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::pipe::PipeFlags;

use crate::init::STAGE_SETUP;
use crate::init::protocol::{CHANNEL_FD, Channel};

/// Why the init could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Preparing descriptors failed.
    #[error("prepare sandbox init {what}: {source}")]
    Prepare {
        /// What was being prepared.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `clone3` failed.
    #[error("clone3 sandbox init {path}: {source}")]
    Clone {
        /// The init binary.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A freshly cloned init: blocked reading its channel until the runtime sends the setup plan.
#[derive(Debug)]
pub struct Spawned {
    /// Host pid.
    pub pid: i32,
    /// A pidfd for it.
    pub pidfd: OwnedFd,
    /// The runtime's end of the channel.
    pub channel: Channel,
    /// Read end of the init's stdout.
    pub stdout: OwnedFd,
    /// Read end of the init's stderr.
    pub stderr: OwnedFd,
    /// CRIU's names (`pipe:[inode]`) of the init's stdout and stderr pipes, which a restore must
    /// be handed again (`--inherit-fd`).
    pub stdio_keys: Vec<String>,
}

/// Namespaces every sandbox gets. The cgroup namespace is entered later by the init itself, once
/// it is in the sandbox's cgroups, so that the namespace is rooted there.
/// (A user namespace, when asked for, is added with `CLONE_NEWUSER`: every other namespace is
/// then owned by it.)
const NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC) as u64;

/// `struct clone_args` (linux/sched.h), version 2 (with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

fn prep(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> SpawnError {
    move |e| SpawnError::Prepare { what, source: e.into() }
}

/// Duplicates `fd` to a number ≥ 10, close-on-exec.
fn high(fd: &OwnedFd, what: &'static str) -> Result<OwnedFd, SpawnError> {
    rustix::io::fcntl_dupfd_cloexec(fd, 10).map_err(prep(what))
}

/// A user namespace for the init: sandbox ids `0..size` are host ids `host_base..host_base+size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// First host uid and gid.
    pub host_base: u32,
    /// Number of ids.
    pub size: u32,
}

/// Clones the init binary at `init` into new namespaces, running its setup stage.
pub fn spawn_init(init: &Path) -> Result<Spawned, SpawnError> {
    spawn_init_with(init, None)
}

/// [`spawn_init`], in a new user namespace too when `user_ns` is given.
///
/// With a user namespace the child must not execute the init before its id maps exist: an
/// `execve` by a uid the namespace does not map drops every capability. So the child first
/// blocks reading a pipe; the runtime writes `uid_map` and `gid_map` and then one byte; the child
/// drops the host root's supplementary groups and becomes the namespace's root
/// (`setresgid`/`setresuid(0)`, now host `host_base`), and only then executes the init, which thus
/// keeps all capabilities inside its namespaces and none outside.
pub fn spawn_init_with(init: &Path, user_ns: Option<IdMap>) -> Result<Spawned, SpawnError> {
    let (parent_end, child_end) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(prep("channel"))?;
    let (out_r, out_w) =
        rustix::pipe::pipe_with(PipeFlags::CLOEXEC).map_err(prep("stdout pipe"))?;
    let (err_r, err_w) =
        rustix::pipe::pipe_with(PipeFlags::CLOEXEC).map_err(prep("stderr pipe"))?;
    let devnull = rustix::fs::open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(prep("stdin"))?;
    let child_fds = [
        (high(&devnull, "stdin")?, 0),
        (high(&out_w, "stdout")?, 1),
        (high(&err_w, "stderr")?, 2),
        (high(&child_end, "channel")?, CHANNEL_FD),
    ];
    let stdio_keys = [&out_w, &err_w]
        .iter()
        .map(|fd| rustix::fs::fstat(fd).map(|st| format!("pipe:[{}]", st.st_ino)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(prep("stdio pipe identity"))?;
    drop((devnull, out_w, err_w, child_end));
    let (map_r, map_w) = match user_ns {
        Some(_) => {
            let (r, w) =
                rustix::pipe::pipe_with(PipeFlags::CLOEXEC).map_err(prep("id map pipe"))?;
            (Some(high(&r, "id map pipe")?), Some(w))
        }
        None => (None, None),
    };
    let map_fd: RawFd = map_r.as_ref().map_or(-1, |fd| fd.as_raw_fd());
    let raw_fds: [(RawFd, RawFd); 4] = child_fds.each_ref().map(|(fd, to)| (fd.as_raw_fd(), *to));

    let path = CString::new(init.as_os_str().as_bytes())
        .map_err(|e| SpawnError::Prepare { what: "init path", source: io::Error::other(e) })?;
    let stage = CString::new(STAGE_SETUP)
        .map_err(|e| SpawnError::Prepare { what: "argv", source: io::Error::other(e) })?;
    let argv = [c"oka-init".as_ptr(), stage.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];

    let mut pidfd: RawFd = -1;
    tracing::debug!(?init, user_ns = user_ns.is_some(), "clone sandbox init");
    let all = signal_set(libc::sigfillset);
    let mut old = signal_set(libc::sigemptyset);
    // SAFETY: both sets are initialised; this thread's mask is restored right after the clone.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) };
    let child = ChildArgs {
        map_fd,
        fds: raw_fds,
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        nofile: STARTING_NOFILE.get().copied(),
    };
    let rc = match user_ns {
        None => clone_vfork(&child, &mut pidfd),
        Some(_) => clone_fork(&child, &mut pidfd),
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: `old` is the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if rc < 0 {
        return Err(SpawnError::Clone { path: init.to_owned(), source: clone_error });
    }
    drop((child_fds, map_r));
    // SAFETY: with CLONE_PIDFD, the kernel stored a new pidfd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    if let (Some(map), Some(go)) = (user_ns, map_w) {
        let pid = rc as i32;
        let written = write_id_maps(pid, map)
            .and_then(|()| rustix::io::write(&go, b"1").map(|_| ()).map_err(std::io::Error::from));
        if let Err(source) = written {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
            // SAFETY: waitpid of our own child, which nothing else knows about yet.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            return Err(SpawnError::Prepare { what: "user namespace id maps", source });
        }
    }
    Ok(Spawned {
        pid: rc as i32,
        pidfd,
        channel: Channel::new(parent_end),
        stdout: out_r,
        stderr: err_r,
        stdio_keys,
    })
}

/// Writes `0 host_base size` to the child's `uid_map` and `gid_map`.
fn write_id_maps(pid: i32, map: IdMap) -> io::Result<()> {
    let line = format!("0 {} {}\n", map.host_base, map.size);
    for file in ["uid_map", "gid_map"] {
        tracing::debug!(pid, file, %line, "write id map");
        std::fs::write(format!("/proc/{pid}/{file}"), &line)?;
    }
    Ok(())
}

/// What the child needs to execute the init, prepared before the clone (the child allocates
/// nothing).
#[derive(Clone, Copy)]
struct ChildArgs {
    /// The read end of the id-map pipe, or -1 without a user namespace.
    map_fd: RawFd,
    /// Descriptors to move into place: `(from, to)`.
    fds: [(RawFd, RawFd); 4],
    /// NUL-terminated path of the init.
    path: *const libc::c_char,
    /// NULL-terminated argv.
    argv: *const *const libc::c_char,
    /// NULL-terminated envp.
    envp: *const *const libc::c_char,
    /// The open-files limit the init gets: the one the daemon started with, when it raised its
    /// own ([`raise_open_files_limit`]).
    nofile: Option<libc::rlimit64>,
}

/// The open-files limit this process started with, kept by [`raise_open_files_limit`] for the
/// sandboxes.
static STARTING_NOFILE: std::sync::OnceLock<libc::rlimit64> = std::sync::OnceLock::new();

/// When the hard limit is unlimited: the kernel's default `fs.nr_open`.
const NR_OPEN_DEFAULT: u64 = 1 << 20;

/// Raises this process's soft limit on open files to its hard limit (once; later calls do
/// nothing) and returns `(before, after)` when it changed. The daemon holds descriptors per
/// sandbox (its init's pidfd, connections into it), so the common default of 1,024 would stop a
/// pool at a few hundred sandboxes. Sandboxes still start with the limit the daemon started with:
/// the child of the clone puts it back before it executes the init.
pub fn raise_open_files_limit() -> io::Result<Option<(u64, u64)>> {
    let mut start = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit64 on this process, reading into a valid struct.
    if unsafe { libc::prlimit64(0, libc::RLIMIT_NOFILE, std::ptr::null(), &mut start) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if STARTING_NOFILE.set(start).is_err() {
        return Ok(None);
    }
    let target = if start.rlim_max == libc::RLIM64_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(NR_OPEN_DEFAULT)
    } else {
        start.rlim_max
    };
    if start.rlim_cur == libc::RLIM64_INFINITY || start.rlim_cur >= target {
        return Ok(None);
    }
    let raised = libc::rlimit64 { rlim_cur: target, rlim_max: start.rlim_max };
    // SAFETY: prlimit64 on this process with a valid struct.
    if unsafe { libc::prlimit64(0, libc::RLIMIT_NOFILE, &raised, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((start.rlim_cur, target)))
}

/// A signal set initialised by `init` (`sigemptyset` or `sigfillset`).
fn signal_set(init: unsafe extern "C" fn(*mut libc::sigset_t) -> libc::c_int) -> libc::sigset_t {
    // SAFETY: `init` initialises the zeroed set it is given.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        init(&mut set);
        set
    }
}

/// Bytes of the stack the child of [`clone_vfork`] runs on until its `execve`: it only makes
/// system calls.
const CHILD_STACK: usize = 64 * 1024;

/// Clones the child sharing this address space (`CLONE_VM | CLONE_VFORK`): returns once it has
/// executed the init (or exited), with its pid, or -1 and `errno`.
fn clone_vfork(child: &ChildArgs, pidfd: &mut RawFd) -> libc::c_int {
    extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `ChildArgs` the parent keeps alive while it waits (CLONE_VFORK).
        unsafe { child_exec(&*(arg as *const ChildArgs)) }
    }
    // 16-byte aligned; the parent's thread is suspended until the child no longer uses it.
    let mut stack = vec![0u128; CHILD_STACK / 16];
    // SAFETY: one past the end of `stack`, the top of a downward-growing stack.
    let top = unsafe { stack.as_mut_ptr().add(stack.len()) };
    let flags = (NAMESPACES as libc::c_int)
        | libc::CLONE_VM
        | libc::CLONE_VFORK
        | libc::CLONE_PIDFD
        | libc::SIGCHLD;
    // SAFETY: glibc's clone switches to `top` for the child and runs `entry`, which makes only
    // async-signal-safe calls and never returns; CLONE_VFORK suspends this thread until the
    // child's execve or exit, so `child` and `stack` outlive the child's use of them. With
    // CLONE_PIDFD the kernel stores the pidfd at the parent-tid pointer.
    unsafe {
        libc::clone(
            entry,
            top.cast(),
            flags,
            (child as *const ChildArgs).cast_mut().cast(),
            pidfd as *mut RawFd,
        )
    }
}

/// Clones the child into a new user namespace too, with a copy of this address space (fork
/// semantics, `clone3`), so that it can wait for its id maps: returns at once with its pid, or -1
/// and `errno`.
fn clone_fork(child: &ChildArgs, pidfd: &mut RawFd) -> libc::c_int {
    let mut args = CloneArgs {
        flags: NAMESPACES | libc::CLONE_NEWUSER as u64 | libc::CLONE_PIDFD as u64,
        pidfd: pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid clone_args of the size passed. Without CLONE_VM the child gets a
    // copy of this address space (a zero stack means "keep the current stack").
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if rc == 0 {
        // SAFETY: we are the child; `child` points into our copy of the address space.
        unsafe { child_exec(child) }
    }
    rc as libc::c_int
}

/// The child side of the clone: put the signal state back to defaults, wait for the id maps
/// (with a user namespace, `map_fd` ≥ 0) and become the namespace's root, move descriptors into
/// place and execute the init.
///
/// # Safety
///
/// Must only be called in the child of [`clone_vfork`] or [`clone_fork`], with every signal
/// blocked and valid NUL-terminated strings and NULL-terminated pointer arrays in `args`. Makes
/// only async-signal-safe calls and never returns.
unsafe fn child_exec(args: &ChildArgs) -> ! {
    let ChildArgs { map_fd, fds, path, argv, envp, nofile } = *args;
    // The init starts with every signal at its default disposition and none blocked, whatever
    // the daemon's thread had; and no handler of the daemon may run here (with CLONE_VM it would
    // run on the daemon's memory). So the dispositions (this child's own copy) are reset while
    // every signal is still blocked, and only then is the mask cleared.
    // The kernel's `struct sigaction` all zero is SIG_DFL with no flags. A raw system call, since
    // the C library refuses to touch the two real-time signals it reserves (32 and 33), which the
    // daemon's process may well have ignored.
    let default = [0u64; 4];
    for sig in 1..=64 {
        // SAFETY: rt_sigaction is a plain system call on this child's own dispositions (an
        // 8-byte signal set); SIGKILL and SIGSTOP just fail.
        unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, default.as_ptr(), 0usize, 8usize) };
    }
    // SAFETY: sigemptyset and sigprocmask are async-signal-safe; the set is on this stack.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &signal_set(libc::sigemptyset), std::ptr::null_mut())
    };
    if map_fd >= 0 {
        let mut byte = 0u8;
        // SAFETY: read and _exit are async-signal-safe; the id changes are raw syscalls on
        // purpose: glibc's wrappers broadcast them to every thread it believes exists, and after
        // a raw clone3 it still believes in the parent's threads (it would wait for them forever).
        unsafe {
            if libc::read(map_fd, (&mut byte as *mut u8).cast(), 1) != 1
                || libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
            {
                libc::_exit(124);
            }
        }
    }
    for (from, to) in fds {
        // SAFETY: `from` is open (≥ 10) and `to` is below 10, so no source is overwritten;
        // dup2 clears close-on-exec on `to`.
        if unsafe { libc::dup2(from, to) } < 0 {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(125) };
        }
    }
    if let Some(limit) = nofile {
        // SAFETY: prlimit64 is a plain system call; this child is its own process (no
        // CLONE_THREAD), so only its limit changes. A failure leaves the daemon's limit.
        unsafe {
            libc::syscall(
                libc::SYS_prlimit64,
                0,
                libc::RLIMIT_NOFILE,
                &limit as *const libc::rlimit64,
                std::ptr::null_mut::<libc::rlimit64>(),
            )
        };
    }
    // Nothing else of the runtime may leak into the sandbox, whatever its close-on-exec flag.
    // SAFETY: close_range is a plain syscall on descriptors of this child only.
    unsafe { libc::syscall(libc::SYS_close_range, CHANNEL_FD + 1, u32::MAX, 0) };
    // SAFETY: see the function's contract.
    unsafe { libc::execve(path, argv, envp) };
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(126) }
}
