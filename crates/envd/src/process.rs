//! `process.Process`: starting, listing, attaching to, feeding and signalling processes
//! (e2b-protocol.md §3.3, §3.6).
//!
//! Each process has one output pump task that reads stdout/stderr (or the PTY master) in chunks of at
//! most 32 KiB and hands every chunk to each attached stream (per-subscriber bounded channels, so a
//! slow client slows the process like a full pipe would). A stream that goes away only unsubscribes:
//! the process keeps running and can be re-attached with `Connect` by pid or tag. Exits are kept for
//! [`RETAIN_EXITED`] so a late `Connect` still sees the end event.

use crate::connect::{ConnectError, Sink};
use crate::proto::process_event::{DataEvent, EndEvent, Event, StartEvent, data_event::Output};
use crate::proto::{
    Empty, EventResponse, ProcessConfig, ProcessEvent, ProcessInfo, ProcessSelector,
    process_selector::Selector,
};
use crate::pty::PtyMaster;
use crate::users::User;
use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

/// How long exited processes stay visible to `Connect`.
pub const RETAIN_EXITED: Duration = Duration::from_secs(30);
/// Largest stdout/stderr chunk.
pub const CHUNK: usize = 32 * 1024;
/// Largest PTY chunk.
pub const PTY_CHUNK: usize = 16 * 1024;
/// How long output is still drained after the process exited (descendants may hold the pipes).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

/// One output or exit notification for attached streams.
#[derive(Clone, Debug)]
enum Note {
    Data(Output),
    End(EndEvent),
}

/// Where input goes.
enum Input {
    None,
    Pipe(ChildStdin),
    Pty,
}

struct Subs {
    senders: Vec<mpsc::Sender<Note>>,
    end: Option<(EndEvent, Instant)>,
}

/// A started process.
pub struct Proc {
    pid: u32,
    tag: Option<String>,
    config: ProcessConfig,
    input: tokio::sync::Mutex<Input>,
    pty: Option<Arc<PtyMaster>>,
    subs: Mutex<Subs>,
}

/// Attaching to a process gave either a live feed or its retained end.
enum Attach {
    Live(mpsc::Receiver<Note>),
    Ended(EndEvent),
}

impl Proc {
    fn attach(&self) -> Attach {
        let mut s = match self.subs.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        if let Some((end, _)) = &s.end {
            return Attach::Ended(end.clone());
        }
        let (tx, rx) = mpsc::channel(64);
        s.senders.push(tx);
        Attach::Live(rx)
    }

    fn ended(&self) -> Option<Instant> {
        self.subs.lock().ok().and_then(|s| s.end.as_ref().map(|(_, t)| *t))
    }

    async fn publish(&self, out: Output) {
        let senders = match self.subs.lock() {
            Ok(s) => s.senders.clone(),
            Err(_) => return,
        };
        let mut gone = false;
        for tx in &senders {
            gone |= tx.send(Note::Data(out.clone())).await.is_err();
        }
        if gone && let Ok(mut s) = self.subs.lock() {
            s.senders.retain(|tx| !tx.is_closed());
        }
    }

    async fn finish(&self, end: EndEvent) {
        let senders = match self.subs.lock() {
            Ok(mut s) => {
                s.end = Some((end.clone(), Instant::now()));
                std::mem::take(&mut s.senders)
            }
            Err(_) => return,
        };
        for tx in senders {
            let _ = tx.send(Note::End(end.clone())).await;
        }
    }
}

/// The process table.
#[derive(Default)]
pub struct Processes {
    procs: Mutex<HashMap<u32, Arc<Proc>>>,
    /// Pids of started processes not yet waited for: their exit statuses belong to their
    /// waiters, never to the init mode's reaper ([`crate::pid1`]). Held while a process is
    /// spawned and recorded, and while the reaper scans, so the reaper never sees one of them
    /// before it is recorded.
    waited: Arc<Mutex<HashSet<u32>>>,
    /// Reset `oom_score_adj` to 0 in started processes (set in init mode: PID 1 is protected
    /// from the OOM killer, its processes must not inherit that).
    reset_oom_score: AtomicBool,
}

/// What to start.
pub struct Spawn {
    /// The request's process config.
    pub config: ProcessConfig,
    /// PTY size `(cols, rows)`, if a PTY was requested.
    pub pty: Option<(u16, u16)>,
    /// Tag.
    pub tag: Option<String>,
    /// Whether stdin is a pipe (`false` → /dev/null).
    pub stdin: bool,
    /// The user to run as.
    pub user: User,
    /// Resolved working directory.
    pub cwd: PathBuf,
    /// The full environment.
    pub env: HashMap<String, String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn not_found(sel: &ProcessSelector) -> ConnectError {
    match &sel.selector {
        Some(Selector::Pid(pid)) => {
            ConnectError::not_found(format!("process with pid {pid} not found"))
        }
        Some(Selector::Tag(tag)) => {
            ConnectError::not_found(format!("process with tag {tag} not found"))
        }
        None => ConnectError::invalid("process selector is required"),
    }
}

impl Processes {
    /// Makes started processes reset their `oom_score_adj` to 0 instead of inheriting the
    /// daemon's.
    pub fn reset_oom_score_in_children(&self) {
        self.reset_oom_score.store(true, Ordering::Relaxed);
    }

    /// The pids whose exit statuses are waited for by their own tasks; the reaper must leave
    /// them alone while it holds this guard.
    pub fn waited(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        lock(&self.waited)
    }

    /// Sends `sig` to the process group of every running process (each leads its own group).
    pub fn signal_all(&self, sig: rustix::process::Signal) {
        let pids: Vec<u32> =
            lock(&self.procs).values().filter(|p| p.ended().is_none()).map(|p| p.pid).collect();
        for pid in pids {
            if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
                let _ = rustix::process::kill_process_group(pid, sig);
            }
        }
    }

    fn purge(&self) {
        let now = Instant::now();
        lock(&self.procs)
            .retain(|_, p| p.ended().is_none_or(|t| now.duration_since(t) < RETAIN_EXITED));
    }

    /// Finds a process (running, or exited within [`RETAIN_EXITED`]).
    pub fn find(&self, sel: Option<&ProcessSelector>) -> Result<Arc<Proc>, ConnectError> {
        self.purge();
        let sel = sel.ok_or_else(|| ConnectError::invalid("process selector is required"))?;
        let procs = lock(&self.procs);
        let found = match &sel.selector {
            Some(Selector::Pid(pid)) => procs.get(pid).cloned(),
            Some(Selector::Tag(tag)) => procs
                .values()
                .filter(|p| p.tag.as_deref() == Some(tag.as_str()))
                .min_by_key(|p| p.ended().is_some())
                .cloned(),
            None => None,
        };
        found.ok_or_else(|| not_found(sel))
    }

    /// Running processes.
    pub fn list(&self) -> Vec<ProcessInfo> {
        self.purge();
        let mut v: Vec<ProcessInfo> = lock(&self.procs)
            .values()
            .filter(|p| p.ended().is_none())
            .map(|p| ProcessInfo { config: Some(p.config.clone()), pid: p.pid, tag: p.tag.clone() })
            .collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// Starts a process; the returned stream is attached before any output is read.
    pub fn start(&self, s: Spawn) -> Result<(Arc<Proc>, Subscription), ConnectError> {
        if s.tag.as_deref() == Some("_system") {
            return Err(ConnectError::invalid("tag '_system' is reserved"));
        }
        if !s.cwd.is_dir() {
            return Err(ConnectError::invalid(format!("cwd '{}' does not exist", s.cwd.display())));
        }
        let mut cmd = tokio::process::Command::new(&s.config.cmd);
        cmd.args(&s.config.args).env_clear().envs(&s.env).current_dir(&s.cwd).kill_on_drop(false);
        let me = rustix::process::geteuid().as_raw();
        if me == 0 && (s.user.uid != 0 || s.user.gid != 0) {
            cmd.uid(s.user.uid).gid(s.user.gid);
        }
        let mut pty = None;
        if let Some((cols, rows)) = s.pty {
            let (master, slave) = crate::pty::open(cols, rows)
                .map_err(|e| ConnectError::internal(format!("failed to open a pty: {e}")))?;
            let dup = |fd: &rustix::fd::OwnedFd| {
                fd.try_clone().map_err(|e| ConnectError::internal(format!("dup pty: {e}")))
            };
            cmd.stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave));
            // SAFETY: only async-signal-safe syscalls (setsid, ioctl) run between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    rustix::process::setsid()?;
                    // SAFETY: fd 0 is the PTY slave installed by the spawn machinery just before.
                    let stdin = rustix::fd::BorrowedFd::borrow_raw(0);
                    rustix::process::ioctl_tiocsctty(stdin)?;
                    Ok(())
                });
            }
            pty = Some(Arc::new(master));
        } else {
            cmd.stdin(if s.stdin { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
        }
        if self.reset_oom_score.load(Ordering::Relaxed) {
            // SAFETY: only async-signal-safe syscalls (open, write, close) on a static path run
            // between fork and exec; nothing is allocated.
            unsafe {
                cmd.pre_exec(|| {
                    if let Ok(fd) = rustix::fs::open(
                        c"/proc/self/oom_score_adj",
                        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                    ) {
                        let _ = rustix::io::write(&fd, b"0");
                    }
                    Ok(())
                });
            }
        }
        let mut waited = lock(&self.waited);
        let mut child = cmd.spawn().map_err(|e| {
            ConnectError::invalid(format!("failed to start {:?}: {e}", s.config.cmd))
        })?;
        drop(cmd); // closes our copies of the PTY slave
        let pid = child.id().ok_or_else(|| ConnectError::internal("process vanished at start"))?;
        waited.insert(pid);
        drop(waited);
        let input = match (&pty, child.stdin.take()) {
            (Some(_), _) => Input::Pty,
            (None, Some(p)) => Input::Pipe(p),
            (None, None) => Input::None,
        };
        let proc = Arc::new(Proc {
            pid,
            tag: s.tag,
            config: s.config,
            input: tokio::sync::Mutex::new(input),
            pty: pty.clone(),
            subs: Mutex::new(Subs { senders: Vec::new(), end: None }),
        });
        let sub = match proc.attach() {
            Attach::Live(rx) => Subscription { pid, rx: Some(rx), end: None },
            Attach::Ended(e) => Subscription { pid, rx: None, end: Some(e) },
        };
        lock(&self.procs).insert(pid, proc.clone());
        tracing::info!(pid, cmd = %proc.config.cmd, "process started");
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let p = proc.clone();
        let waited_set = self.waited.clone();
        tokio::spawn(async move {
            let mut readers = tokio::task::JoinSet::new();
            if let Some(master) = pty {
                let p = p.clone();
                readers.spawn(async move {
                    let mut buf = vec![0u8; PTY_CHUNK];
                    while let Ok(n @ 1..) = master.read(&mut buf).await {
                        p.publish(Output::Pty(buf[..n].to_vec())).await;
                    }
                });
            }
            if let Some(o) = stdout {
                readers.spawn(pump(p.clone(), o, Output::Stdout));
            }
            if let Some(e) = stderr {
                readers.spawn(pump(p.clone(), e, Output::Stderr));
            }
            let status = child.wait().await;
            lock(&waited_set).remove(&p.pid);
            let drain = async { while readers.join_next().await.is_some() {} };
            if tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await.is_err() {
                readers.abort_all();
            }
            let end = match status {
                Ok(st) => end_event(st),
                Err(e) => EndEvent {
                    exit_code: -1,
                    status: "unknown".into(),
                    error: Some(e.to_string()),
                    ..Default::default()
                },
            };
            tracing::info!(pid = p.pid, status = %end.status, "process ended");
            p.finish(end).await;
        });
        Ok((proc, sub))
    }
}

async fn pump(p: Arc<Proc>, mut r: impl AsyncRead + Unpin, wrap: fn(Vec<u8>) -> Output) {
    let mut buf = vec![0u8; CHUNK];
    while let Ok(n @ 1..) = r.read(&mut buf).await {
        p.publish(wrap(buf[..n].to_vec())).await;
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        14 => "alarm clock".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// The end event of an exit status, worded like Go's `ProcessState.String()`.
pub fn end_event(st: ExitStatus) -> EndEvent {
    if let Some(code) = st.code() {
        let status = format!("exit status {code}");
        EndEvent {
            exit_code: code,
            exited: true,
            error: (code != 0).then(|| status.clone()),
            status,
        }
    } else {
        let sig = st.signal().unwrap_or(0);
        let status = format!("signal: {}", signal_name(sig));
        EndEvent { exit_code: -1, exited: false, error: Some(status.clone()), status }
    }
}

/// A stream's attachment to a process.
pub struct Subscription {
    pid: u32,
    rx: Option<mpsc::Receiver<Note>>,
    end: Option<EndEvent>,
}

fn event(e: Event) -> EventResponse {
    EventResponse { event: Some(ProcessEvent { event: Some(e) }) }
}

impl Subscription {
    /// Attaches to an existing process.
    pub fn attach(p: &Proc) -> Self {
        match p.attach() {
            Attach::Live(rx) => Self { pid: p.pid, rx: Some(rx), end: None },
            Attach::Ended(e) => Self { pid: p.pid, rx: None, end: Some(e) },
        }
    }

    /// Forwards start, data, keepalive and end events to `sink` until the end event or until the
    /// client goes away.
    pub async fn forward(
        mut self,
        sink: &Sink<EventResponse>,
        keepalive: Duration,
    ) -> Result<(), ConnectError> {
        let gone = |_| ConnectError::new(crate::connect::Code::Canceled, "client disconnected");
        sink.send(&event(Event::Start(StartEvent { pid: self.pid }))).await.map_err(gone)?;
        if let Some(end) = self.end.take() {
            sink.send(&event(Event::End(end))).await.map_err(gone)?;
            return Ok(());
        }
        let Some(mut rx) = self.rx.take() else { return Ok(()) };
        loop {
            let note = tokio::select! {
                n = tokio::time::timeout(keepalive, rx.recv()) => n,
                () = sink.closed() => return Ok(()),
            };
            match note {
                Err(_idle) => sink.send(&event(Event::Keepalive(Empty {}))).await.map_err(gone)?,
                Ok(Some(Note::Data(out))) => {
                    sink.send(&event(Event::Data(DataEvent { output: Some(out) })))
                        .await
                        .map_err(gone)?;
                }
                Ok(Some(Note::End(end))) => {
                    sink.send(&event(Event::End(end))).await.map_err(gone)?;
                    return Ok(());
                }
                Ok(None) => {
                    return Err(ConnectError::internal(
                        "process output ended without an end event",
                    ));
                }
            }
        }
    }
}

impl Proc {
    /// The pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` (only while running).
    pub fn signal(&self, sig: rustix::process::Signal) -> Result<(), ConnectError> {
        if self.ended().is_some() {
            return Err(ConnectError::not_found(format!(
                "process with pid {} not found",
                self.pid
            )));
        }
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX))
            .ok_or_else(|| ConnectError::internal("invalid pid"))?;
        rustix::process::kill_process(pid, sig)
            .map_err(|e| ConnectError::internal(format!("failed to send signal: {e}")))
    }

    /// Writes to stdin (`pty == false`) or to the terminal (`pty == true`).
    pub async fn write_input(&self, data: &[u8], pty: bool) -> Result<(), ConnectError> {
        let mut input = self.input.lock().await;
        match (&mut *input, pty) {
            (Input::Pipe(p), false) => p
                .write_all(data)
                .await
                .map_err(|e| ConnectError::internal(format!("failed to write to stdin: {e}"))),
            (Input::Pty, true) => match &self.pty {
                Some(m) => m
                    .write_all(data)
                    .await
                    .map_err(|e| ConnectError::internal(format!("failed to write to pty: {e}"))),
                None => Err(ConnectError::internal("pty not assigned to process")),
            },
            (Input::Pty, false) => {
                Err(ConnectError::internal("process uses a pty; send pty input"))
            }
            (_, true) => Err(ConnectError::internal("pty not assigned to process")),
            (Input::None, false) => Err(ConnectError::internal("stdin not enabled or closed")),
        }
    }

    /// Closes stdin (EOF for the process).
    pub async fn close_stdin(&self) -> Result<(), ConnectError> {
        let mut input = self.input.lock().await;
        match &*input {
            Input::Pty => {
                Err(ConnectError::invalid("cannot close stdin of a pty process; send Ctrl-D"))
            }
            _ => {
                *input = Input::None;
                Ok(())
            }
        }
    }

    /// Resizes the PTY.
    pub fn resize(&self, cols: u32, rows: u32) -> Result<(), ConnectError> {
        let m = self
            .pty
            .as_ref()
            .ok_or_else(|| ConnectError::internal("pty not assigned to process"))?;
        let c = u16::try_from(cols).map_err(|_| ConnectError::invalid("cols out of range"))?;
        let r = u16::try_from(rows).map_err(|_| ConnectError::invalid("rows out of range"))?;
        m.resize(c, r).map_err(|e| ConnectError::internal(format!("failed to resize pty: {e}")))
    }
}
