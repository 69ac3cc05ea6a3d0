//! The init's startup check: between starting the command and answering `Ready`.
//!
//! [`await_startup`] runs the plan's [`StartupCheck`] as the kubelet runs a `startupProbe`: the
//! first attempt `initialDelaySeconds` after the command started, then one every
//! `periodSeconds` (counted from the start of the previous one), each bounded by
//! `timeoutSeconds`, until the first success; `failureThreshold` failures in a row fail the
//! start. An `exec` attempt is forked like the command (its own session, the command's user,
//! environment and working directory; stdin `/dev/null`), its output kept for the failure
//! message, and its process group killed at the timeout; `tcpSocket` and `httpGet` attempts
//! connect from PID 1, which is in the sandbox's network namespace, to its loopback.
//!
//! Meanwhile the init keeps doing its supervisor's work: it relays the command's output (the
//! runtime's pipes do not block it: a write that would block is dropped), reaps every child, and
//! forwards the signals it forwards. A command that exits before the check passed ends the wait.
//!
//! Why in the init: `Ready` is the runtime's readiness signal (the runtime reports the sandbox
//! running, and the controllers ready, only once it arrives), the init is already in every
//! namespace of the sandbox, and it runs once per start of the command, never after a resume or
//! a restore (the init is past this point then).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use oka_runtime_api::{CheckAction, StartupCheck};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{Pid, WaitOptions};

use super::protocol::StartPlan;
use super::run::{Child, FORWARDED, SignalFd, spawn_command};

/// How much of an attempt's output the failure message keeps: its last lines, at most this
/// many bytes.
const OUTPUT_TAIL_BYTES: usize = 1024;
/// At most this many of the last output lines.
const OUTPUT_TAIL_LINES: usize = 10;

/// How the wait for the startup check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The check succeeded: the sandbox is ready.
    Passed,
    /// The check failed `failureThreshold` times: the message says the check, the attempt and
    /// the last failure (an exec check's exit code and the last lines of its output).
    Failed(String),
    /// The command ended before the check passed, with this status (128 + signal if killed).
    CommandExited(i32),
}

/// One exec attempt in flight.
struct Attempt {
    pid: Pid,
    pipes: [Option<OwnedFd>; 2],
    output: Vec<u8>,
    deadline: Instant,
    exit: Option<i32>,
    timed_out: bool,
}

impl Attempt {
    fn finished(&self, now: Instant) -> bool {
        // Output still held by a process the attempt left behind is not waited for past the
        // deadline.
        self.exit.is_some() && (self.pipes.iter().all(Option::is_none) || now >= self.deadline)
    }
}

/// Runs `check` until it passes, fails for good, or the command exits; see the module
/// documentation.
pub(super) fn await_startup(
    plan: &StartPlan,
    check: &StartupCheck,
    command: &Child,
    signals: &SignalFd,
) -> Verdict {
    set_stdio_nonblocking(true);
    let verdict = run_checks(plan, check, command, signals);
    set_stdio_nonblocking(false);
    verdict
}

fn run_checks(
    plan: &StartPlan,
    check: &StartupCheck,
    command: &Child,
    signals: &SignalFd,
) -> Verdict {
    let period = Duration::from_secs(u64::from(check.period_seconds.max(1)));
    let timeout = Duration::from_secs(u64::from(check.timeout_seconds.max(1)));
    let threshold = check.failure_threshold.max(1);
    let mut next = Instant::now() + Duration::from_secs(u64::from(check.initial_delay_seconds));
    let mut failures = 0u32;
    let mut attempt: Option<Attempt> = None;
    let mut relays: [Option<(BorrowedFd<'_>, i32)>; 2] =
        [Some((command.stdout.as_fd(), 1)), Some((command.stderr.as_fd(), 2))];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let now = Instant::now();
        let mut outcome: Option<Result<(), String>> = None;
        if attempt.is_none() && now >= next {
            next = now + period;
            match &check.action {
                CheckAction::Exec { command: argv } => {
                    let attempt_plan = StartPlan {
                        argv: argv.clone(),
                        envd: None,
                        startup_check: None,
                        ..plan.clone()
                    };
                    match spawn_command(&attempt_plan) {
                        Ok(Child { pid, stdout, stderr }) => {
                            attempt = Some(Attempt {
                                pid,
                                pipes: [Some(stdout), Some(stderr)],
                                output: Vec::new(),
                                deadline: now + timeout,
                                exit: None,
                                timed_out: false,
                            });
                        }
                        Err(failure) => {
                            outcome = Some(Err(format!(
                                "{} could not run: {}: {}",
                                check.action, failure.step, failure.message
                            )));
                        }
                    }
                }
                CheckAction::TcpSocket { port } => {
                    outcome = Some(
                        tcp_check(*port, timeout)
                            .map_err(|e| format!("dial tcp 127.0.0.1:{port}: {e}")),
                    );
                }
                CheckAction::HttpGet { port, path } => {
                    outcome = Some(http_check(*port, path, timeout));
                }
            }
        }
        if let Some(a) = &attempt
            && a.finished(now)
        {
            outcome = Some(match (a.exit, a.timed_out) {
                (_, true) => Err(format!(
                    "{} timed out after {}s{}",
                    check.action,
                    timeout.as_secs(),
                    output_suffix(&a.output)
                )),
                (Some(0), false) => Ok(()),
                (code, false) => Err(format!(
                    "{} exited with code {}{}",
                    check.action,
                    code.unwrap_or(-1),
                    output_suffix(&a.output)
                )),
            });
            attempt = None;
        }
        match outcome {
            Some(Ok(())) => return Verdict::Passed,
            Some(Err(why)) => {
                failures += 1;
                if failures >= threshold {
                    return Verdict::Failed(format!(
                        "Startup probe failed: {why} (failure {failures} of {threshold})"
                    ));
                }
                continue;
            }
            None => {}
        }
        if let Some(a) = &mut attempt
            && now >= a.deadline
            && !a.timed_out
        {
            a.timed_out = true;
            // The attempt leads its own session and process group (it called setsid).
            // SAFETY: plain kill(2) of the attempt's process group.
            unsafe { libc::kill(-a.pid.as_raw_nonzero().get(), libc::SIGKILL) };
        }
        let wake = match &attempt {
            Some(a) if a.timed_out => now + Duration::from_millis(100),
            Some(a) => a.deadline,
            None => next,
        };
        let left = wake.saturating_duration_since(now);
        let Ok(poll_timeout) = Timespec::try_from(left) else {
            return Verdict::Failed("Startup probe failed: the init cannot wait".into());
        };
        let mut polls = vec![PollFd::new(&signals.fd, PollFlags::IN)];
        for (fd, _) in relays.iter().flatten() {
            polls.push(PollFd::new(fd, PollFlags::IN));
        }
        if let Some(a) = &attempt {
            for fd in a.pipes.iter().flatten() {
                polls.push(PollFd::new(fd, PollFlags::IN));
            }
        }
        match rustix::event::poll(&mut polls, Some(&poll_timeout)) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Verdict::Failed(format!("Startup probe failed: poll: {e}")),
        }
        drop(polls);
        for slot in relays.iter_mut() {
            if let Some((fd, out)) = slot
                && readable(*fd)
                && !relay_once(*fd, *out, &mut buf)
            {
                *slot = None;
            }
        }
        if let Some(a) = &mut attempt {
            for slot in a.pipes.iter_mut() {
                if let Some(fd) = slot
                    && readable(fd.as_fd())
                {
                    match rustix::io::read(&*fd, &mut buf) {
                        Ok(0) | Err(Errno::BADF) => *slot = None,
                        Ok(n) => keep_tail(&mut a.output, &buf[..n]),
                        Err(_) => {}
                    }
                }
            }
        }
        for signo in signals.read() {
            if signo == libc::SIGCHLD {
                while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
                    let code = status
                        .exit_status()
                        .or_else(|| status.terminating_signal().map(|s| 128 + s))
                        .unwrap_or(1);
                    if pid == command.pid {
                        for (fd, out) in relays.iter().flatten() {
                            while readable(*fd) && relay_once(*fd, *out, &mut buf) {}
                        }
                        return Verdict::CommandExited(code);
                    }
                    if let Some(a) = &mut attempt
                        && a.pid == pid
                    {
                        a.exit = Some(code);
                    }
                }
            } else if FORWARDED.contains(&signo) {
                // SAFETY: plain kill(2) of the command's process group.
                unsafe { libc::kill(-command.pid.as_raw_nonzero().get(), signo) };
            }
        }
    }
}

/// Whether a read of `fd` returns at once (data, end of file or an error).
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut one = [PollFd::new(&fd, PollFlags::IN)];
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    matches!(rustix::event::poll(&mut one, Some(&zero)), Ok(n) if n > 0)
}

/// Copies one read of `from` to the init's fd `to`; `false` at end of file.
fn relay_once(from: BorrowedFd<'_>, to: i32, buf: &mut [u8]) -> bool {
    match rustix::io::read(from, &mut *buf) {
        Ok(0) => false,
        Ok(n) => {
            // SAFETY: `to` is the init's stdout or stderr, open for its whole life.
            let out = unsafe { BorrowedFd::borrow_raw(to) };
            let _ = rustix::io::write(out, &buf[..n]);
            true
        }
        Err(Errno::AGAIN | Errno::INTR) => true,
        Err(_) => false,
    }
}

/// Writes to the init's stdout and stderr never block while the check runs (the runtime reads
/// them only once the sandbox is ready); a daemon the init hands over to gets them as they were.
fn set_stdio_nonblocking(on: bool) {
    for fd in [1, 2] {
        // SAFETY: fds 1 and 2 are the init's stdout and stderr, open for its whole life.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::ioctl_fionbio(fd, on);
    }
}

fn keep_tail(output: &mut Vec<u8>, more: &[u8]) {
    output.extend_from_slice(more);
    if output.len() > 4 * OUTPUT_TAIL_BYTES {
        output.drain(..output.len() - OUTPUT_TAIL_BYTES);
    }
}

/// `: <the last lines of output>`, or nothing without output.
fn output_suffix(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(OUTPUT_TAIL_LINES)..].join("\n");
    let tail = match tail.char_indices().rev().nth(OUTPUT_TAIL_BYTES) {
        Some((cut, _)) => &tail[cut..],
        None => tail.as_str(),
    };
    if tail.is_empty() { String::new() } else { format!(": {tail}") }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn tcp_check(port: u16, timeout: Duration) -> std::io::Result<()> {
    TcpStream::connect_timeout(&loopback(port), timeout).map(drop)
}

/// A `GET` the way the kubelet sends it; a status from 200 to 399 passes.
fn http_check(port: u16, path: &str, timeout: Duration) -> Result<(), String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let fail = |e: std::io::Error| format!("Get \"{url}\": {e}");
    let mut stream = TcpStream::connect_timeout(&loopback(port), timeout).map_err(fail)?;
    stream.set_read_timeout(Some(timeout)).map_err(fail)?;
    stream.set_write_timeout(Some(timeout)).map_err(fail)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/1.33\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(fail)?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 512];
    while !head.contains(&b'\n') && head.len() < 4096 {
        match stream.read(&mut chunk).map_err(fail)? {
            0 => break,
            n => head.extend_from_slice(&chunk[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| line.starts_with("HTTP/"))
        .ok_or_else(|| format!("Get \"{url}\": not an HTTP response"))?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_message_keeps_the_last_lines() {
        let many: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let suffix = output_suffix(many.as_bytes());
        assert!(suffix.starts_with(": line 21\n"), "{suffix}");
        assert!(suffix.ends_with("line 30"));
        assert_eq!(output_suffix(b"\n\n"), "");
        let mut kept = Vec::new();
        keep_tail(&mut kept, &vec![b'x'; 10 * OUTPUT_TAIL_BYTES]);
        assert!(kept.len() <= 4 * OUTPUT_TAIL_BYTES);
    }
}
