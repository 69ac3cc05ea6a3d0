//! Init mode (`oka-envd --init`) as a plain process: the same duties as PID 1 of a sandbox
//! (reaping orphans as a child subreaper, SIGTERM handling), with the listening socket handed
//! over as an inherited descriptor as the sandbox init does. Runs without root; the PID 1 case
//! itself is tested with real sandboxes in `oka-runtime`'s `envd_pid1.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `check` every few milliseconds until it returns `Some`, failing after `timeout`.
fn poll<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request; the whole raw answer (headers and body) as text.
fn request(port: u16, method: &str, path: &str, content_type: &str, body: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: envd\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `sh -c script` through `process.Process/Start` and reads the answer to its end.
fn run(port: u16, script: &str) -> String {
    let json = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let payload = serde_json::to_vec(&json).unwrap();
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(&payload);
    request(port, "POST", "/process.Process/Start", "application/connect+json", &body)
}

fn read_when(path: &Path) -> String {
    poll(&format!("{}", path.display()), Duration::from_secs(10), || {
        std::fs::read_to_string(path).ok().filter(|s| s.ends_with('\n'))
    })
}

/// Starts `oka-envd --init` with `args` on a listener handed over as fd 3, with a passwd file
/// whose `user` is the current user; returns the daemon and its port.
fn start_envd(dir: &Path, args: &[&str], stdout: Stdio) -> (std::process::Child, u16) {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let passwd = dir.join("passwd");
    let home = dir.display();
    std::fs::write(&passwd, format!("user:x:{uid}:{gid}::{home}:/bin/sh\n")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oka-envd"));
    cmd.args(["--init", "--listen-fd=3", "--passwd"])
        .arg(&passwd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::inherit());
    // SAFETY: dup2 and fcntl are async-signal-safe; they put the listener on fd 3 without
    // close-on-exec (dup2 onto itself would keep the flag).
    unsafe {
        cmd.pre_exec(move || {
            let rc = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(fd, 3) };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(listener);
    (child, port)
}

fn sigterm(child: &std::process::Child) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

#[test]
fn init_mode_reaps_orphans_and_ends_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = start_envd(dir.path(), &[], Stdio::null());

    let health = request(port, "GET", "/health", "text/plain", b"");
    assert!(health.starts_with("HTTP/1.1 204"), "{health}");

    // An orphan: its shell exits at once, so it is re-parented to the daemon (a child
    // subreaper in init mode), which must reap it when it exits.
    let orphan_file = dir.path().join("orphan");
    run(port, &format!("sleep 0.1 & echo $! > {}", orphan_file.display()));
    let orphan: u32 = read_when(&orphan_file).trim().parse().unwrap();
    let ppid = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
    };
    if let Some(parent) = ppid(orphan) {
        assert_eq!(parent, child.id(), "the orphan is re-parented to the daemon");
    }
    poll("the orphan to be reaped", Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{orphan}")).exists()).then_some(())
    });

    // A process started through the API gets the SIGTERM too; without a command the daemon then
    // exits with 0.
    let pid_file = dir.path().join("bg-pid");
    let script = format!("echo $$ > {}; exec sleep 1000", pid_file.display());
    let json = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let payload = serde_json::to_vec(&json).unwrap();
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(&payload);
    let bg = std::thread::spawn(move || {
        request(port, "POST", "/process.Process/Start", "application/connect+json", &body)
    });
    let bg_pid: u32 = read_when(&pid_file).trim().parse().unwrap();
    poll("the background process to be sleep", Duration::from_secs(10), || {
        let comm = std::fs::read_to_string(format!("/proc/{bg_pid}/comm")).ok()?;
        (comm == "sleep\n").then_some(())
    });
    sigterm(&child);
    let status = poll("the daemon to exit", Duration::from_secs(10), || child.try_wait().unwrap());
    assert_eq!(status.code(), Some(0));
    poll("the background process to end", Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{bg_pid}/stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
        matches!(state, None | Some("Z")).then_some(())
    });
    let _ = bg.join();
}

#[test]
fn as_an_entrypoint_it_starts_the_command_relays_its_output_and_exits_with_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let up = dir.path().join("up");
    let script = format!(
        "echo out; trap 'echo term; exit 7' TERM; echo up > {}; while :; do sleep 0.05; done",
        up.display()
    );
    let (mut child, port) =
        start_envd(dir.path(), &["--", "/bin/sh", "-c", &script], Stdio::piped());
    let health = request(port, "GET", "/health", "text/plain", b"");
    assert!(health.starts_with("HTTP/1.1 204"), "{health}");
    read_when(&up);
    sigterm(&child);
    let status = poll("the daemon to exit", Duration::from_secs(10), || child.try_wait().unwrap());
    assert_eq!(status.code(), Some(7), "the command's exit status");
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert_eq!(out, "out\nterm\n");

    let (mut child, _) = start_envd(dir.path(), &["--", "/bin/sh", "-c", "exit 3"], Stdio::null());
    let status = poll("the daemon to exit", Duration::from_secs(10), || child.try_wait().unwrap());
    assert_eq!(status.code(), Some(3));
}

#[test]
fn the_command_gets_the_forwarded_sigterm_even_when_it_does_not_reset_its_signal_mask() {
    // sleep neither traps nor unblocks signals (sh does): it ends on SIGTERM only if it was
    // started with SIGTERM unblocked, whatever the daemon had blocked for itself.
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = start_envd(dir.path(), &["--", "sleep", "1000"], Stdio::null());
    let health = request(port, "GET", "/health", "text/plain", b"");
    assert!(health.starts_with("HTTP/1.1 204"), "{health}");
    let sleep = poll("the command to start", Duration::from_secs(10), || {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).ok()?;
        children.split_whitespace().next()?.parse::<u32>().ok()
    });
    let status = std::fs::read_to_string(format!("/proc/{sleep}/status")).unwrap();
    let blocked = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).unwrap().trim();
    assert_eq!(blocked, "0000000000000000", "the command starts with no signal blocked");
    sigterm(&child);
    let status = poll("the daemon to exit", Duration::from_secs(10), || child.try_wait().unwrap());
    assert_eq!(status.code(), Some(128 + 15), "the command was ended by the SIGTERM");
}
