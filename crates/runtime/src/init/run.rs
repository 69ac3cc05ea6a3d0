//! The init's run stage: PID 1 of the sandbox, executed from inside its root.
//!
//! Expected flow ([`run`]):
//! 1. read [`ToInit::Start`] from the channel;
//! 2. shrink the capability bounding set and the process's sets to [`KEPT_CAPABILITIES`] (root in
//!    a sandbox without a user namespace must not mount, load modules, read raw devices or open
//!    files by handle), or to the plan's set (a template's `capabilities.add`/`drop`); set
//!    `no_new_privs` when the plan says so (`allowPrivilegeEscalation: false`); install the
//!    system call filter ([`super::seccomp`]) unless the plan says not to: before the
//!    capabilities are dropped without `no_new_privs` (installing one takes CAP_SYS_ADMIN
//!    then), after `no_new_privs` with it. All of them hold for every process of the sandbox,
//!    the agent runtime daemon's included;
//! 3. block the signals it handles and read them from a `signalfd`, so no handler runs and nothing
//!    is async-signal-unsafe;
//! 4. fork the command (this process is single-threaded, so `fork` is safe): the child starts a
//!    new session, gets `/dev/null` as stdin and pipes to the init as stdout and stderr, changes
//!    directory and user, and executes the program; a close-on-exec pipe tells the init whether the
//!    exec happened;
//! 5. with a startup check in the plan, wait until it passes ([`super::startup`]; a check that
//!    fails, or a command that exits first, is `Failed` and ends the sandbox);
//!    answer [`FromInit::Ready`] (or `Failed`) and close the channel;
//! 6. loop: reap every child (orphans included) on `SIGCHLD`; forward `SIGTERM`, `SIGINT`,
//!    `SIGHUP` and `SIGQUIT` to the command's process group; relay the command's output to the
//!    init's own stdout and stderr (pipes owned by the runtime), dropping it when nobody reads;
//! 7. when the command exits, exit with its status (128 + signal if killed): the kernel then ends
//!    every other process of the PID namespace.
//!
//! With [`StartPlan::envd`] set, steps 4–7 change: before forking the command the init checks
//! that the daemon's binary can be executed and binds its port (so a failure is reported as
//! `Failed` with nothing started, and once `Ready` is sent connections queue in the backlog);
//! after `Ready` it executes the daemon in place (same pid, signals still blocked and pending)
//! with the listening socket and the command's pid and output pipes, and the daemon does step 6
//! and 7 from then on (`oka_envd::pid1`). If that exec fails, the init logs it, closes the port
//! and supervises the command itself.
//!
//! Without a command (only valid with [`StartPlan::envd`]) nothing is forked: the init answers
//! `Ready` and executes the daemon, which is then the sandbox's only process; if that exec fails
//! the init exits with 127.
//!
//! Why a relay instead of handing the runtime's pipes to the command: the runtime may die and be
//! restarted at any time, closing its pipe ends. The command writing to a broken pipe would get
//! `SIGPIPE`; the init ignores `SIGPIPE` and drops the bytes instead, so the command never notices.

use std::ffi::CString;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::process::{Pid, WaitOptions};
use rustix::thread::CapabilitySet;

use super::protocol::{Channel, EnvdPlan, FromInit, STARTUP_CHECK_STEP, StartPlan, ToInit};
use super::startup::Verdict;

/// The capabilities root keeps inside a sandbox (Docker's default set without `MKNOD`).
pub const KEPT_CAPABILITIES: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::FSETID)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::SETPCAP)
    .union(CapabilitySet::NET_BIND_SERVICE)
    .union(CapabilitySet::NET_RAW)
    .union(CapabilitySet::SYS_CHROOT)
    .union(CapabilitySet::AUDIT_WRITE)
    .union(CapabilitySet::SETFCAP);

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Signals the init forwards to the command.
pub(super) const FORWARDED: [libc::c_int; 4] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Runs the sandbox: starts the command, reports, supervises. Returns the init's exit code.
pub fn run(channel: Channel) -> i32 {
    // The runtime gave us the host's /dev/null as stdin; a descriptor on a mount outside the
    // sandbox is one CRIU cannot checkpoint, so take the sandbox's own.
    if let Err(e) = reopen_stdin() {
        return report_failure(&channel, "reopen stdin", e.to_string(), false);
    }
    let plan = match channel.recv::<ToInit>(None) {
        Ok(ToInit::Start(plan)) => plan,
        Ok(other) => {
            return report_failure(
                &channel,
                "read start",
                format!("unexpected message {other:?}"),
                false,
            );
        }
        Err(e) => {
            // The runtime is gone; nobody will supervise this sandbox.
            eprintln!("oka-init: {e}");
            return 1;
        }
    };
    if let Err(e) = set_cloexec(channel.fd().as_raw_fd()) {
        return report_failure(&channel, "set close-on-exec", e.to_string(), false);
    }
    let kept = plan.capabilities.map_or(KEPT_CAPABILITIES, CapabilitySet::from_bits_retain);
    let filter = if plan.seccomp { super::seccomp::program(kept.bits()) } else { None };
    // Installing a filter takes `no_new_privs` or CAP_SYS_ADMIN. Without `no_new_privs` the
    // init installs it while it still has every capability (as runc does), so the filter
    // already holds for the capability calls that follow, which it allows; with it, as the
    // last step before anything is started.
    let install = |filter: &Option<Vec<super::seccomp::Instruction>>| match filter {
        Some(prog) => super::seccomp::install(prog),
        None => Ok(()),
    };
    if !plan.no_new_privileges
        && let Err(e) = install(&filter)
    {
        return report_failure(&channel, "install seccomp filter", e.to_string(), false);
    }
    if let Err(e) = drop_capabilities(kept) {
        return report_failure(&channel, "drop capabilities", e.to_string(), false);
    }
    if plan.no_new_privileges {
        if let Err(e) = rustix::thread::set_no_new_privs(true) {
            return report_failure(&channel, "set no_new_privs", e.to_string(), false);
        }
        if let Err(e) = install(&filter) {
            return report_failure(&channel, "install seccomp filter", e.to_string(), false);
        }
    }
    // Like the daemon that may take its place: no process of the sandbox without
    // CAP_SYS_PTRACE may attach to PID 1 or read its memory (its children are dumpable again
    // once they execute their programs).
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        return report_failure(&channel, "make the init not dumpable", e.to_string(), false);
    }
    let signals = match SignalFd::new() {
        Ok(s) => s,
        Err(e) => return report_failure(&channel, "signalfd", e.to_string(), false),
    };
    // The daemon's port is bound before the command starts and before `Ready`: once the runtime
    // hears `Ready`, connections to it queue in the backlog until the daemon accepts them.
    let envd = match &plan.envd {
        Some(envd) => match prepare_envd(envd) {
            Ok(listener) => Some((envd, listener)),
            Err((step, e)) => return report_failure(&channel, step, e.to_string(), false),
        },
        None => None,
    };
    // Without a command the daemon is the sandbox's only process; without either, nothing runs.
    if plan.argv.is_empty() && envd.is_none() {
        return report_failure(&channel, "exec", "empty command".into(), true);
    }
    let child = if plan.argv.is_empty() {
        None
    } else {
        match spawn_command(&plan) {
            Ok(c) => Some(c),
            Err(SpawnFailure { step, message, spec_error }) => {
                return report_failure(&channel, step, message, spec_error);
            }
        }
    };
    if let (Some(check), Some(command)) = (&plan.startup_check, &child) {
        let failure = match super::startup::await_startup(&plan, check, command, &signals) {
            Verdict::Passed => None,
            Verdict::Failed(message) => Some(message),
            Verdict::CommandExited(code) => {
                Some(format!("the command exited with code {code} before its startup probe passed"))
            }
        };
        if let Some(message) = failure {
            // The command's process group goes now; the rest of the sandbox when the init exits.
            // SAFETY: plain kill(2) of the command's process group.
            unsafe { libc::kill(-command.pid.as_raw_nonzero().get(), libc::SIGKILL) };
            return report_failure(&channel, STARTUP_CHECK_STEP, message, true);
        }
    }
    let pid = child.as_ref().map(|c| c.pid.as_raw_nonzero().get());
    if let Err(e) = channel.send(&FromInit::Ready { pid }) {
        eprintln!("oka-init: reporting readiness: {e}");
    }
    drop(channel);
    if let Some((envd, listener)) = envd {
        // Returns only if the daemon could not be executed; a command then keeps its init.
        let e = exec_envd(envd, &listener, child.as_ref(), &plan.env, &plan.cwd);
        let then = if child.is_some() {
            "supervising the command without it"
        } else {
            "there is no command to run"
        };
        eprintln!("oka-init: cannot execute {}: {e}; {then}", envd.path.display());
    }
    match child {
        Some(child) => supervise(child, signals),
        None => 127,
    }
}

/// Binds the daemon's port on every address of the sandbox and checks that its binary can be
/// executed (there, and with a dynamic loader the root has), so that nothing the init can check
/// fails after `Ready`.
fn prepare_envd(envd: &EnvdPlan) -> Result<TcpListener, (&'static str, io::Error)> {
    rustix::fs::access(&envd.path, rustix::fs::Access::EXEC_OK)
        .map_err(|e| ("find envd", io::Error::other(format!("{}: {e}", envd.path.display()))))?;
    if let Some(why) = super::elf::missing_loader(&envd.path) {
        return Err(("find envd", io::Error::other(why)));
    }
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], envd.port));
    // std sets SO_REUSEADDR and close-on-exec; the descriptor is made inheritable just before
    // the exec.
    TcpListener::bind(addr).map_err(|e| ("bind envd port", e))
}

/// Executes the daemon in place of the init (same pid), handing it the listening socket and the
/// command, if there is one, on the command line; returns only on failure. The blocked signals
/// stay blocked and pending across the exec, so none sent meanwhile is lost: the daemon unblocks
/// them once its handlers are installed. The daemon's environment is the container's (`env`,
/// with a default `PATH` when it names none), which it hands to every process it starts, as a
/// container's exec sees the container's env; a working directory other than `/` becomes its
/// processes' default one.
fn exec_envd(
    envd: &EnvdPlan,
    listener: &TcpListener,
    child: Option<&Child>,
    env: &[String],
    cwd: &Path,
) -> io::Error {
    let inherit = |fd: RawFd| {
        // SAFETY: `fd` is open for the whole call (owned by `listener` or `child`).
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
    };
    let mut fds = vec![listener.as_raw_fd()];
    let mut args =
        vec!["oka-envd".to_owned(), "--init".to_owned(), format!("--listen-fd={}", fds[0])];
    if let Some(child) = child {
        let (stdout, stderr) = (child.stdout.as_raw_fd(), child.stderr.as_raw_fd());
        fds.extend([stdout, stderr]);
        args.extend([
            format!("--command-pid={}", child.pid.as_raw_nonzero().get()),
            format!("--command-stdout={stdout}"),
            format!("--command-stderr={stderr}"),
        ]);
    }
    if cwd != Path::new("/") && !cwd.as_os_str().is_empty() {
        args.push(format!("--workdir={}", cwd.display()));
    }
    for &fd in &fds {
        if let Err(e) = inherit(fd) {
            return e.into();
        }
    }
    let Ok(path) = CString::new(envd.path.as_os_str().as_bytes()) else {
        return io::ErrorKind::InvalidInput.into();
    };
    let Ok(argv) = args.into_iter().map(CString::new).collect::<Result<Vec<_>, _>>() else {
        return io::ErrorKind::InvalidInput.into();
    };
    let default_path = format!("PATH={DEFAULT_PATH}");
    let has_path = env.iter().any(|e| e.starts_with("PATH="));
    let vars = env.iter().map(String::as_str).chain((!has_path).then_some(default_path.as_str()));
    let Ok(env) = vars.map(CString::new).collect::<Result<Vec<_>, _>>() else {
        return io::ErrorKind::InvalidInput.into();
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    // SAFETY: every pointer is a NUL-terminated string or the terminating null, alive for the call.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
    let err = io::Error::last_os_error();
    for fd in fds {
        // SAFETY: as above.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
    }
    err
}

fn reopen_stdin() -> io::Result<()> {
    let null =
        rustix::fs::open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, rustix::fs::Mode::empty())?;
    // SAFETY: both descriptors are open; dup2 onto 0 replaces stdin and clears close-on-exec.
    if unsafe { libc::dup2(null.as_raw_fd(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn report_failure(channel: &Channel, step: &str, message: String, spec_error: bool) -> i32 {
    let _ = channel.send(&FromInit::Failed { step: step.to_owned(), message, spec_error });
    1
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` is the channel socket, open for the whole call.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(())
}

/// Shrinks the bounding set and the process's sets to `kept` (capabilities the kernel does
/// not know are left out).
fn drop_capabilities(kept: CapabilitySet) -> io::Result<()> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .min(63);
    for cap in 0..=last {
        let set = CapabilitySet::from_bits_retain(1 << cap);
        if !kept.contains(set) {
            match rustix::thread::remove_capability_from_bounding_set(set) {
                Ok(()) | Err(Errno::INVAL) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let known = CapabilitySet::from_bits_retain(if last >= 63 {
        u64::MAX
    } else {
        (1u64 << (last + 1)) - 1
    });
    let kept = kept & known;
    let sets = rustix::thread::CapabilitySets {
        effective: kept,
        permitted: kept,
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, sets)?;
    Ok(())
}

/// A `signalfd` for the signals the init handles, with those signals blocked.
pub(super) struct SignalFd {
    pub(super) fd: OwnedFd,
}

impl SignalFd {
    fn new() -> io::Result<Self> {
        let mask = handled_mask();
        // SAFETY: `mask` is an initialised sigset; the old mask is not wanted.
        let rc = unsafe { libc::sigprocmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: ignoring SIGPIPE installs no handler code; writes to a closed pipe then fail
        // with EPIPE instead of killing the init.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        // SAFETY: `mask` is valid; -1 asks for a new descriptor, which we own from here.
        let fd = unsafe { libc::signalfd(-1, &mask, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by signalfd and is owned by nobody else.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// The pending signals, in arrival order.
    pub(super) fn read(&self) -> Vec<i32> {
        let mut out = Vec::new();
        let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        while let Ok(n) = rustix::io::read(&self.fd, &mut buf) {
            if n < buf.len() {
                break;
            }
            let signo = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            out.push(signo as i32);
        }
        out
    }
}

fn handled_mask() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset only touches it.
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
        for s in FORWARDED {
            libc::sigaddset(&mut mask, s);
        }
        mask
    }
}

pub(super) struct Child {
    pub(super) pid: Pid,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
}

pub(super) struct SpawnFailure {
    pub(super) step: &'static str,
    pub(super) message: String,
    spec_error: bool,
}

impl SpawnFailure {
    fn system(step: &'static str, e: impl std::fmt::Display) -> Self {
        Self { step, message: e.to_string(), spec_error: false }
    }
}

/// Steps of the child between fork and exec, reported through the status pipe.
#[derive(Clone, Copy)]
#[repr(u8)]
enum ChildStep {
    Stdio = 1,
    Chdir = 2,
    User = 3,
    Exec = 4,
}

pub(super) fn spawn_command(plan: &StartPlan) -> Result<Child, SpawnFailure> {
    let cstr = |s: &str| CString::new(s).map_err(|e| SpawnFailure::system("encode", e));
    let argv: Vec<CString> = plan.argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let env: Vec<CString> = plan.env.iter().map(|e| cstr(e)).collect::<Result<_, _>>()?;
    let Some(program) = plan.argv.first() else {
        return Err(SpawnFailure {
            step: "exec",
            message: "empty command".into(),
            spec_error: true,
        });
    };
    let path_var =
        plan.env.iter().rev().find_map(|e| e.strip_prefix("PATH=")).unwrap_or(DEFAULT_PATH);
    let candidates: Vec<CString> = if program.contains('/') {
        vec![cstr(program)?]
    } else {
        path_var
            .split(':')
            .map(|dir| if dir.is_empty() { "." } else { dir })
            .map(|dir| cstr(&format!("{dir}/{program}")))
            .collect::<Result<_, _>>()?
    };
    let cwd = CString::new(plan.cwd.as_os_str().as_bytes())
        .map_err(|e| SpawnFailure::system("encode", e))?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());

    let devnull =
        rustix::fs::open("/dev/null", OFlags::RDWR | OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| SpawnFailure::system("open /dev/null", e))?;
    let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnFailure::system("pipe", e))?;
    let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnFailure::system("pipe", e))?;
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnFailure::system("pipe", e))?;
    let unblock = handled_mask();
    // The primary group first, then the supplementary ones (allocated before the fork).
    let groups: Vec<libc::gid_t> = {
        let primary = plan.user.map_or(0, |u| u.gid);
        let mut groups = vec![primary];
        groups.extend(plan.groups.iter().copied().filter(|g| *g != primary));
        groups.dedup();
        if plan.user.is_none() && plan.groups.is_empty() { Vec::new() } else { groups }
    };

    // SAFETY: this process is single-threaded (the init never starts threads), so the child may
    // run any code; it still only makes plain syscalls before exec or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SpawnFailure::system("fork", io::Error::last_os_error()));
    }
    if pid == 0 {
        let fail = |step: ChildStep| -> ! {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let mut msg = [0u8; 5];
            msg[0] = step as u8;
            msg[1..].copy_from_slice(&errno.to_ne_bytes());
            let _ = rustix::io::write(&status_w, &msg);
            // SAFETY: _exit ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(127) }
        };
        // SAFETY: restoring the default disposition of SIGPIPE and unblocking the init's signals
        // touch only this child's signal state.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::sigprocmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut());
        }
        if rustix::process::setsid().is_err() {
            fail(ChildStep::Stdio);
        }
        for (src, dst) in [(devnull.as_raw_fd(), 0), (out_w.as_raw_fd(), 1), (err_w.as_raw_fd(), 2)]
        {
            // SAFETY: both descriptors are open; dup2 onto 0..2 clears close-on-exec there.
            if unsafe { libc::dup2(src, dst) } < 0 {
                fail(ChildStep::Stdio);
            }
        }
        // SAFETY: `cwd` is a valid C string.
        if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
            fail(ChildStep::Chdir);
        }
        if plan.user.is_some() || !groups.is_empty() {
            let user = plan.user.unwrap_or(oka_runtime_api::spec::User { uid: 0, gid: 0 });
            let gid = user.gid as libc::gid_t;
            // SAFETY: plain credential syscalls on this single-threaded child; `groups` (the
            // primary group first, made before the fork) outlives them.
            let ok = unsafe {
                libc::setgroups(groups.len(), groups.as_ptr()) == 0
                    && libc::setgid(gid) == 0
                    && libc::setuid(user.uid) == 0
            };
            if !ok {
                fail(ChildStep::User);
            }
        }
        let _ = std::fs::write("/proc/self/oom_score_adj", "0");
        let mut last_errno = libc::ENOENT;
        for path in &candidates {
            // SAFETY: `path`, `argv_ptrs` and `env_ptrs` are NUL-terminated and live until exec.
            unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOENT);
            // Like execvp: remember a permission error but keep looking.
            if (errno != libc::ENOENT && errno != libc::ENOTDIR) || last_errno == libc::ENOENT {
                last_errno = errno;
            }
        }
        // SAFETY: errno is thread-local; set it so `fail` reports the most telling error.
        unsafe { *libc::__errno_location() = last_errno };
        fail(ChildStep::Exec);
    }
    drop(status_w);
    drop(out_w);
    drop(err_w);
    // SAFETY: `pid` is the positive pid fork just returned.
    let pid = unsafe { Pid::from_raw_unchecked(pid) };
    let mut msg = [0u8; 5];
    let mut got = 0;
    while got < msg.len() {
        match rustix::io::read(&status_r, &mut msg[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(SpawnFailure::system("read exec status", e)),
        }
    }
    if got == 0 {
        return Ok(Child { pid, stdout: out_r, stderr: err_r });
    }
    // The child failed before exec and has exited; reap it.
    let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
    let errno = i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
    let err = io::Error::from_raw_os_error(errno);
    let (step, message) = match msg[0] {
        x if x == ChildStep::Stdio as u8 => ("set up stdio", format!("{err}")),
        x if x == ChildStep::Chdir as u8 => {
            ("chdir", format!("working dir {}: {err}", plan.cwd.display()))
        }
        x if x == ChildStep::User as u8 => ("set user", format!("{:?}: {err}", plan.user)),
        _ => ("exec", format!("{program}: {err}")),
    };
    let spec_error = step != "set up stdio";
    Err(SpawnFailure { step, message, spec_error })
}

fn supervise(child: Child, signals: SignalFd) -> i32 {
    let Child { pid, stdout, stderr } = child;
    for fd in [&stdout, &stderr] {
        let _ = rustix::io::ioctl_fionbio(fd, true);
    }
    for fd in [1, 2] {
        // SAFETY: fds 1 and 2 are the init's stdout and stderr, open for its whole life.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::ioctl_fionbio(fd, true);
    }
    let mut relays = [Some((stdout, 1)), Some((stderr, 2))];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut polls = vec![PollFd::new(&signals.fd, PollFlags::IN)];
        for (fd, _) in relays.iter().flatten() {
            polls.push(PollFd::new(fd, PollFlags::IN));
        }
        match rustix::event::poll(&mut polls, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => {
                eprintln!("oka-init: poll: {e}");
                return 1;
            }
        }
        drop(polls);
        for slot in relays.iter_mut() {
            if let Some((fd, out)) = slot
                && !relay(fd, *out, &mut buf)
            {
                *slot = None;
            }
        }
        for signo in signals.read() {
            if signo == libc::SIGCHLD {
                if let Some(code) = reap(pid) {
                    for (fd, out) in relays.iter().flatten() {
                        relay(fd, *out, &mut buf);
                    }
                    return code;
                }
            } else if FORWARDED.contains(&signo) {
                // The command leads its own session and process group (it called setsid).
                // SAFETY: plain kill(2) of the command's process group.
                unsafe { libc::kill(-pid.as_raw_nonzero().get(), signo) };
            }
        }
    }
}

/// Copies what is available from `from` to fd `to`, dropping it if `to` cannot take it. Returns
/// `false` at end of file.
fn relay(from: &OwnedFd, to: RawFd, buf: &mut [u8]) -> bool {
    loop {
        match rustix::io::read(from, &mut *buf) {
            Ok(0) => return false,
            Ok(n) => {
                // SAFETY: `to` is the init's stdout or stderr, open for its whole life.
                let out = unsafe { std::os::fd::BorrowedFd::borrow_raw(to) };
                let _ = rustix::io::write(out, &buf[..n]);
            }
            Err(Errno::AGAIN | Errno::INTR) => return true,
            Err(_) => return false,
        }
    }
}

/// Reaps every exited child; returns the init's exit code once the command is among them.
fn reap(command: Pid) -> Option<i32> {
    let mut result = None;
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => {
                if pid == command {
                    let code = status
                        .exit_status()
                        .or_else(|| status.terminating_signal().map(|s| 128 + s))
                        .unwrap_or(1);
                    result = Some(code);
                }
            }
            Ok(None) | Err(_) => return result,
        }
    }
}
