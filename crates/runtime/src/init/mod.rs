//! The sandbox init: PID 1 of every local sandbox.
//!
//! One program in two stages, both entered through [`main`]:
//!
//! - `setup` ([`setup`]): executed by the runtime straight after `clone3` put it in the new
//!   namespaces, still seeing the host's mounts. It builds the root file system, pivots into it
//!   and executes the `run` stage from the copy of itself bind-mounted inside the root.
//! - `run` ([`run`]): starts the command and supervises it as PID 1 (reaping, signal forwarding,
//!   output relay).
//!
//! With an agent runtime daemon configured ([`protocol::EnvdPlan`]), the run stage instead binds
//! the daemon's port ([`ENVD_PORT`]), starts the command, reports `Ready` and executes the daemon
//! (`oka-envd --init`, bind-mounted at [`ENVD_PATH`]) in its own place: PID 1 is then the daemon,
//! which supervises the command it was handed and serves the E2B SDKs, one process for both.
//! A sandbox with the daemon may have no command at all: the daemon is then its only process.
//!
//! Why two stages and a re-exec: after `pivot_root`, a process started from a host path still maps
//! its executable and shared libraries from the detached old root. CRIU cannot checkpoint mappings
//! of files outside the sandbox's mount tree (`Can't lookup mount=… for fd=…`), so the long-lived
//! PID 1 is executed from inside the root. The cost is one `execve` (well under a millisecond).
//!
//! Why a separate program instead of code run between `clone` and `exec` in the runtime: the
//! runtime is a multi-threaded tokio process, where a cloned child may only make
//! async-signal-safe calls (no allocation, no locks) until it executes something. Mount setup in
//! that window would mean hand-written allocation-free code; a freshly executed single-threaded
//! program can use ordinary Rust, `fork` safely, and report errors as typed messages.
//!
//! The binary is `oka-init` in this crate; a multi-call binary may instead call [`main`] when
//! started under that name. Assumption: inside a root filesystem other than the default one, the
//! C library must be compatible with the one the binary was linked against (the `run` stage
//! executes with the sandbox's own `ld.so` and `libc`).
//!
//! Invariants: the init never starts a thread; it holds no host file after `pivot_root`; its
//! stdio are pipes owned by the runtime; a daemon it hands over to inherits exactly those, the
//! listening socket and the command's output pipes, with the init's signals still blocked.

pub mod elf;
pub mod protocol;
pub mod run;
pub mod seccomp;
pub mod setup;
pub mod startup;
pub mod syscalls;

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};

use protocol::{CHANNEL_FD, Channel, FromInit, ToInit};

/// Where the agent runtime daemon's binary is bind-mounted inside a sandbox that runs it.
pub const ENVD_PATH: &str = "/.oka/envd";
/// The port the agent runtime daemon serves on inside a sandbox (envd's).
pub const ENVD_PORT: u16 = 49983;

/// The argument that selects the setup stage.
pub const STAGE_SETUP: &str = "setup";
/// The argument that selects the run stage.
pub const STAGE_RUN: &str = "run";

/// The init's entry point; returns the process exit code.
pub fn main() -> i32 {
    let stage = std::env::args().nth(1);
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        eprintln!(
            "oka-init: the sandbox init of oka is started by the runtime as PID 1 of a sandbox, not by hand"
        );
        return 2;
    }
    if rustix::fs::fstat(borrowed_channel())
        .map(|st| st.st_mode & libc::S_IFMT != libc::S_IFSOCK)
        .unwrap_or(true)
    {
        eprintln!("oka-init: fd {CHANNEL_FD} is not the runtime's channel");
        return 2;
    }
    // SAFETY: fd 3 is the channel socket the runtime passed us (checked above) and nothing else in
    // this process owns it.
    let channel = Channel::new(unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) });
    match stage.as_deref() {
        Some(STAGE_SETUP) => setup_stage(channel),
        Some(STAGE_RUN) => run::run(channel),
        _ => {
            eprintln!("oka-init: unknown stage {stage:?}");
            2
        }
    }
}

fn borrowed_channel() -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: only used for fstat while fd 3 is open (or fails harmlessly with EBADF).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(CHANNEL_FD) }
}

fn setup_stage(channel: Channel) -> i32 {
    // Lead a session of our own, inside the sandbox's PID namespace: CRIU refuses a tree whose
    // session leader is outside it ("A session leader of N(1) is outside of its pid namespace"),
    // and no terminal or signal of the runtime's session reaches the sandbox.
    if let Err(e) = rustix::process::setsid() {
        let message = format!("setsid: {e}");
        let _ =
            channel.send(&FromInit::Failed { step: "setsid".into(), message, spec_error: false });
        return 1;
    }
    let plan = match channel.recv::<ToInit>(None) {
        Ok(ToInit::Setup(plan)) => plan,
        Ok(other) => {
            let message = format!("unexpected message {other:?}");
            let _ = channel.send(&FromInit::Failed {
                step: "read setup".into(),
                message,
                spec_error: false,
            });
            return 1;
        }
        Err(e) => {
            eprintln!("oka-init: {e}");
            return 1;
        }
    };
    let external_mounts = match setup::setup(&syscalls::LinuxSyscalls, &plan) {
        Ok(m) => m,
        Err(e) => {
            let _ = channel.send(&FromInit::Failed {
                step: e.step.into(),
                message: e.to_string(),
                spec_error: false,
            });
            return 1;
        }
    };
    if channel.send(&FromInit::Mounted { external_mounts }).is_err() {
        return 1;
    }
    let exec_err = exec_run_stage(&plan.init_path);
    // A file that is there but "not found": its loader is missing from the root.
    let message = (exec_err.kind() == std::io::ErrorKind::NotFound)
        .then(|| elf::missing_loader(&plan.init_path))
        .flatten()
        .unwrap_or_else(|| format!("{}: {exec_err}", plan.init_path.display()));
    let _ =
        channel.send(&FromInit::Failed { step: "exec init".into(), message, spec_error: false });
    1
}

/// Executes the run stage; returns only on failure. The channel (fd 3, not close-on-exec) is
/// inherited.
fn exec_run_stage(path: &std::path::Path) -> std::io::Error {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else {
        return std::io::ErrorKind::InvalidInput.into();
    };
    let argv = [c"oka-init".as_ptr(), c"run".as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    // SAFETY: every pointer is a NUL-terminated string or the terminating null, alive for the call.
    unsafe { libc::execve(cpath.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    std::io::Error::last_os_error()
}
