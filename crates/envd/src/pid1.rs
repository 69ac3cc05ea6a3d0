//! Init mode: the daemon as PID 1 of a sandbox, doing the init's duties besides serving.
//!
//! In a local sandbox the runtime's init (`oka-init`) builds the root, binds the daemon's port,
//! starts the template's command and then executes `oka-envd --init` in its own place, so the
//! daemon *is* PID 1 (one process serves both roles; `oka_runtime::init::protocol::EnvdPlan`
//! describes the hand-over). It receives on its command line:
//!
//! - `--listen-fd N`: the bound, listening TCP socket;
//! - `--command-pid P --command-stdout O --command-stderr E`: the command, already running as our
//!   child in a session of its own, and the read ends of its output pipes.
//!
//! As a container's entrypoint (Kubernetes, later) it can instead start the command itself:
//! `oka-envd --init -- program args...` ([`spawn_command`]).
//!
//! Expected flow ([`supervise`]):
//! 1. [`adopt`]: take the handed-over descriptors (close-on-exec from now on, so processes we
//!    start never inherit them), lead a session unless we already do, become a child subreaper
//!    when not PID 1 (so the same mode works as a plain process: orphans of our trees come to us);
//! 2. install handlers for `SIGTERM`, `SIGINT`, `SIGHUP`, `SIGQUIT` and `SIGCHLD`, *then* unblock
//!    them: the init blocked them before the exec and the kernel kept them pending, so a signal
//!    sent during the hand-over is delivered now instead of lost (PID 1 gets no signal it has no
//!    handler for);
//! 3. relay the command's output to our own stdout and stderr (pipes owned by the runtime),
//!    dropping it when nobody reads, as the init did;
//! 4. reap: on every `SIGCHLD` (and once at the start: the command may have exited during the
//!    hand-over) wait for every zombie child that is not a process started through the API
//!    ([`crate::process::Processes::waited`]); those belong to their own waiters. That is why
//!    the reaper never calls `waitpid(-1)`: it would steal their exit statuses;
//! 5. forward `SIGTERM`, `SIGINT`, `SIGHUP`, `SIGQUIT` to the command's process group, and
//!    `SIGTERM` also to every process started through the API;
//! 6. when the command exits, relay what is left of its output (briefly: descendants may hold
//!    the pipes) and exit with its status (128 + signal if killed); as PID 1 that ends the
//!    sandbox. Without a command the daemon runs until `SIGTERM` and then exits with 0.
//!
//! Assumptions: Linux procfs (`/proc/<pid>/stat`) lists our children.

use crate::state::AppState;
use rustix::process::{Pid, Signal, WaitOptions};
use std::io;
use std::os::fd::{BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::time::Duration;
use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{SignalKind, signal};

/// How long output is still relayed after the command exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

/// The command handed over by the init.
#[derive(Debug)]
pub struct Command {
    /// Its pid (our child).
    pub pid: Pid,
    /// Read end of its stdout pipe.
    pub stdout: OwnedFd,
    /// Read end of its stderr pipe.
    pub stderr: OwnedFd,
}

/// Why init mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum Pid1Error {
    /// A handed-over descriptor is not open.
    #[error("{what} descriptor {fd}: {source}")]
    Descriptor {
        /// Which one.
        what: &'static str,
        /// Its number.
        fd: RawFd,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The command pid is not a valid pid.
    #[error("invalid command pid {0}")]
    Pid(i32),
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Takes ownership of a handed-over descriptor and makes it close-on-exec.
///
/// # Safety
///
/// `fd` must be a descriptor nothing else in this process owns (one inherited across `execve`).
pub unsafe fn take_fd(what: &'static str, fd: RawFd) -> Result<OwnedFd, Pid1Error> {
    let err = |source: io::Error| Pid1Error::Descriptor { what, fd, source };
    if fd < 3 {
        return Err(err(io::ErrorKind::InvalidInput.into()));
    }
    // SAFETY: borrowed only for this check; fcntl fails with EBADF if `fd` is not open.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::CLOEXEC).map_err(|e| err(e.into()))?;
    // SAFETY: open (checked above) and, per the contract, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The command from its pid and output descriptors.
///
/// # Safety
///
/// As [`take_fd`] for `stdout` and `stderr`.
pub unsafe fn adopt_command(pid: i32, stdout: RawFd, stderr: RawFd) -> Result<Command, Pid1Error> {
    let pid = Pid::from_raw(pid).ok_or(Pid1Error::Pid(pid))?;
    // SAFETY: forwarded contract.
    let stdout = unsafe { take_fd("command stdout", stdout)? };
    // SAFETY: forwarded contract.
    let stderr = unsafe { take_fd("command stderr", stderr)? };
    Ok(Command { pid, stdout, stderr })
}

/// Starts `argv` as the command (when the daemon is a container's entrypoint rather than handed
/// a running command): in a session of its own, stdin `/dev/null`, stdout and stderr piped to us,
/// with our environment and working directory.
pub fn spawn_command(argv: &[String]) -> Result<Command, Pid1Error> {
    use std::os::unix::process::CommandExt as _;
    let Some((program, args)) = argv.split_first() else {
        return Err(Pid1Error::Sys {
            op: "start the command",
            source: io::ErrorKind::InvalidInput.into(),
        });
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: setsid and pthread_sigmask are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            // We block the signals we handle until `supervise` runs; the command must not
            // inherit that, or the SIGTERM we forward to it would wait forever.
            clear_sigmask()
        });
    }
    let sys = |source: io::Error| Pid1Error::Sys { op: "start the command", source };
    let mut child = cmd.spawn().map_err(sys)?;
    let pid = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
    let (Some(pid), Some(stdout), Some(stderr)) = (pid, child.stdout.take(), child.stderr.take())
    else {
        return Err(sys(io::ErrorKind::InvalidData.into()));
    };
    // The child is reaped by the reaper, not by `std`: dropping `child` neither waits nor kills.
    drop(child);
    Ok(Command { pid, stdout: stdout.into(), stderr: stderr.into() })
}

/// Prepares this process for init mode before any thread or runtime exists: leads a session
/// (unless it already does), makes itself not dumpable and, when not PID 1, becomes a child
/// subreaper.
///
/// Not dumpable: no process of the sandbox without `CAP_SYS_PTRACE`, its root included, may
/// attach to the daemon or read its memory, environment or descriptors through `/proc` (the
/// sandbox's filter allows `ptrace`, as Docker's does, for debuggers of the sandbox's own
/// programs). The flag is the process's own: what it starts is dumpable again after `execve`.
pub fn adopt() -> Result<(), Pid1Error> {
    // EPERM: already a process group leader (the init called setsid before handing over).
    let _ = rustix::process::setsid();
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| Pid1Error::Sys { op: "make the daemon not dumpable", source: e.into() })?;
    if rustix::process::getpid() != Pid::INIT {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .map_err(|e| Pid1Error::Sys { op: "become a child subreaper", source: e.into() })?;
    }
    Ok(())
}

/// The signals init mode handles.
const HANDLED: [libc::c_int; 5] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGCHLD];

/// Supervises `command` (if any) and the processes of `state` as described in the module doc.
/// Must be called inside a current-thread tokio runtime before anything spawns threads. Returns
/// the exit code the daemon must exit with; the caller exits without waiting for anything else.
pub async fn supervise(state: AppState, command: Option<Command>) -> Result<i32, Pid1Error> {
    let sys = |op: &'static str| move |source: io::Error| Pid1Error::Sys { op, source };
    let mut term = signal(SignalKind::terminate()).map_err(sys("handle SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(sys("handle SIGINT"))?;
    let mut hup = signal(SignalKind::hangup()).map_err(sys("handle SIGHUP"))?;
    let mut quit = signal(SignalKind::quit()).map_err(sys("handle SIGQUIT"))?;
    let mut child = signal(SignalKind::child()).map_err(sys("handle SIGCHLD"))?;
    unblock_handled().map_err(sys("unblock signals"))?;
    state.processes().reset_oom_score_in_children();

    let me = rustix::process::getpid();
    let Some(command) = command else {
        loop {
            tokio::select! {
                _ = term.recv() => {
                    state.processes().signal_all(Signal::TERM);
                    return Ok(0);
                }
                _ = int.recv() => {}
                _ = hup.recv() => {}
                _ = quit.recv() => {}
                _ = child.recv() => {}
            }
            reap(me, &state, None);
        }
    };
    let Command { pid, stdout, stderr } = command;
    let mut relays = tokio::task::JoinSet::new();
    for (from, to) in [(stdout, 1), (stderr, 2)] {
        match tokio::net::unix::pipe::Receiver::from_owned_fd(from) {
            Ok(pipe) => {
                relays.spawn(relay(pipe, to));
            }
            Err(e) => tracing::warn!(error = %e, "cannot relay the command's output"),
        }
    }
    let code = loop {
        if let Some(code) = reap(me, &state, Some(pid)) {
            break code;
        }
        let forward = tokio::select! {
            _ = term.recv() => {
                state.processes().signal_all(Signal::TERM);
                Some(Signal::TERM)
            }
            _ = int.recv() => Some(Signal::INT),
            _ = hup.recv() => Some(Signal::HUP),
            _ = quit.recv() => Some(Signal::QUIT),
            _ = child.recv() => None,
        };
        if let Some(sig) = forward {
            // The command leads its own session and process group.
            let _ = rustix::process::kill_process_group(pid, sig);
        }
    };
    let drain = async { while relays.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await.is_err() {
        relays.abort_all();
    }
    Ok(code)
}

/// Blocks the signals init mode handles until [`supervise`] has installed its handlers, so none
/// is lost (the sandbox init has blocked them already when it hands over; a daemon started as a
/// container's entrypoint calls this first). Processes started later get an empty mask.
pub fn block_handled() -> Result<(), Pid1Error> {
    sigmask(libc::SIG_BLOCK).map_err(|source| Pid1Error::Sys { op: "block signals", source })
}

/// Unblocks [`HANDLED`] in this thread (the init blocked them before executing us).
fn unblock_handled() -> io::Result<()> {
    sigmask(libc::SIG_UNBLOCK)
}

/// Unblocks every signal in this thread: for a child between fork and exec, which inherits our
/// mask (std leaves it as it is). Async-signal-safe.
pub(crate) fn clear_sigmask() -> io::Result<()> {
    set_mask(libc::SIG_SETMASK, &[])
}

/// Blocks or unblocks (`how`) [`HANDLED`] in this thread.
fn sigmask(how: libc::c_int) -> io::Result<()> {
    set_mask(how, &HANDLED)
}

/// `pthread_sigmask(how, signals)`. Async-signal-safe.
fn set_mask(how: libc::c_int, signals: &[libc::c_int]) -> io::Result<()> {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset and pthread_sigmask only read it.
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Copies the command's output to our fd `to`, dropping what `to` cannot take at once (the
/// runtime may be gone, or not reading).
async fn relay(mut from: tokio::net::unix::pipe::Receiver, to: RawFd) {
    // SAFETY: fds 1 and 2 stay open for the daemon's whole life.
    let out = unsafe { BorrowedFd::borrow_raw(to) };
    let _ = rustix::io::ioctl_fionbio(out, true);
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            match rustix::io::write(out, rest) {
                Ok(0) | Err(_) => break,
                Ok(k) => rest = &rest[k..],
            }
        }
    }
}

/// Waits for every zombie child except the processes started through the API; returns the
/// command's exit code once it is among them.
pub fn reap(me: Pid, state: &AppState, command: Option<Pid>) -> Option<i32> {
    let waited = state.processes().waited();
    let mut code = None;
    for pid in zombie_children(me) {
        if u32::try_from(pid.as_raw_nonzero().get()).is_ok_and(|p| waited.contains(&p)) {
            continue;
        }
        if let Ok(Some((_, status))) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG)
            && Some(pid) == command
        {
            let c = status
                .exit_status()
                .or_else(|| status.terminating_signal().map(|s| 128 + s))
                .unwrap_or(1);
            code = Some(c);
        }
    }
    code
}

/// The pids of this process's children that are zombies, from `/proc/<pid>/stat`.
fn zombie_children(me: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    let me = me.as_raw_nonzero().get();
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if let Some((state, ppid)) = parse_stat(&stat)
            && state == 'Z'
            && ppid == me
            && let Some(pid) = Pid::from_raw(pid)
        {
            out.push(pid);
        }
    }
    out
}

/// The state and parent pid of a `/proc/<pid>/stat` line (`pid (comm) S ppid ...`; `comm` may
/// hold spaces and parentheses, so fields are counted from the last `)`).
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Exits the process at once with `code` (as PID 1, the kernel then ends the sandbox's other
/// processes).
pub fn exit(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stderr().flush();
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        assert_eq!(parse_stat("42 (sleep) Z 1 42 42 0 -1"), Some(('Z', 1)));
        assert_eq!(parse_stat("7 (a) b (c)) S 3 7 7"), Some(('S', 3)));
        assert_eq!(parse_stat("garbage"), None);
    }
}
