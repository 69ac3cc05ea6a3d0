//! Jupyter kernels: kernelspec discovery, starting a kernel process, and a client that executes
//! code on it over shell (DEALER), iopub (SUB) and control (DEALER) sockets.

use crate::wire::{Message, Session, WireError};
use crate::zmtp::{Socket, SocketType, ZmtpError};
use bytes::Bytes;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long an interrupted execution may take to stop before the kernel counts as unresponsive.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
const TAIL_BYTES: usize = 4096;

/// Errors of kernel discovery, start-up and execution.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No kernelspec (and no fallback) serves the language.
    #[error(
        "no Jupyter kernel for language '{language}' is installed in this sandbox{hint} \
         (the code-interpreter feature; on `oka serve`, `sudo scripts/install-kernels.sh` \
         installs every kernel of E2B's code-interpreter template)"
    )]
    NoKernel {
        /// The language asked for.
        language: String,
        /// How to install one (starts with ": ").
        hint: String,
    },
    /// The kernel command could not be started.
    #[error("cannot start the {language} kernel ({argv0}): {source}")]
    Spawn {
        /// The kernel's language.
        language: String,
        /// The program.
        argv0: String,
        /// Why.
        source: std::io::Error,
    },
    /// The kernel process exited while starting.
    #[error(
        "the {language} kernel exited while starting ({status}); its output ends with:\n{tail}"
    )]
    Exited {
        /// The kernel's language.
        language: String,
        /// The exit status.
        status: String,
        /// The end of its stderr/stdout.
        tail: String,
    },
    /// The kernel did not become ready in time.
    #[error("the {language} kernel did not answer within {secs} s; its output ends with:\n{tail}")]
    StartTimeout {
        /// The kernel's language.
        language: String,
        /// The timeout.
        secs: u64,
        /// The end of its stderr/stdout.
        tail: String,
    },
    /// The kernel's connection closed (the process died) during a request.
    #[error("the kernel died ({reason}); its output ends with:\n{tail}")]
    Died {
        /// The socket error.
        reason: String,
        /// The end of its stderr/stdout.
        tail: String,
    },
    /// An interrupted execution did not stop within [`INTERRUPT_GRACE`].
    #[error("the kernel did not stop after an interrupt")]
    Unresponsive,
    /// Local i/o (the connection file, the process).
    #[error("kernel i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The ZMTP layer failed.
    #[error(transparent)]
    Zmtp(#[from] ZmtpError),
    /// A message could not be encoded.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// How a kernel wants to be interrupted (`interrupt_mode` in kernel.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptMode {
    /// SIGINT to the kernel's process group.
    Signal,
    /// An `interrupt_request` on the control socket.
    Message,
}

/// A kernelspec (`kernels/<name>/kernel.json`).
#[derive(Debug, Clone)]
pub struct KernelSpec {
    /// The directory name.
    pub name: String,
    /// The command; `{connection_file}` and `{resource_dir}` are substituted.
    pub argv: Vec<String>,
    /// The kernel's language as kernel.json spells it.
    pub language: String,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// How to interrupt it.
    pub interrupt_mode: InterruptMode,
    /// The spec's directory.
    pub resource_dir: PathBuf,
}

/// How long [`Kernel::execute`] waits for more outputs after a Deno kernel's idle status.
pub const DENO_SETTLE: Duration = Duration::from_millis(50);

impl KernelSpec {
    /// How long a cell's outputs may trail its `idle` status. Deno's kernel (2.x) publishes a
    /// cell's streams and results concurrently with its status, so in about half of the runs
    /// they come after `idle` (measured up to 0.2 ms after it on an idle machine, more under
    /// load): an execution of a Deno kernel ends only once no output of it came for
    /// [`DENO_SETTLE`]. Kernels that keep Jupyter's order (outputs before `idle`) need none.
    pub fn settle(&self) -> Duration {
        let deno =
            self.argv.first().and_then(|a| Path::new(a).file_name()) == Some("deno".as_ref());
        if deno { DENO_SETTLE } else { Duration::ZERO }
    }
}

#[derive(serde::Deserialize)]
struct KernelJson {
    argv: Vec<String>,
    #[serde(default)]
    language: String,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    interrupt_mode: Option<String>,
}

/// The directories searched for `kernels/*/kernel.json`, in priority order: `$JUPYTER_PATH`, then
/// `<home>/.local/share/jupyter` for each of `homes`, then `/usr/local/share/jupyter` and
/// `/usr/share/jupyter`.
pub fn search_path(homes: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("JUPYTER_PATH")
        .map(|p| std::env::split_paths(&p).filter(|p| !p.as_os_str().is_empty()).collect())
        .unwrap_or_default();
    for h in homes {
        dirs.push(h.join(".local/share/jupyter"));
    }
    dirs.push("/usr/local/share/jupyter".into());
    dirs.push("/usr/share/jupyter".into());
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// Every kernelspec under `dirs`; a name found in an earlier directory hides later ones.
pub fn discover(dirs: &[PathBuf]) -> Vec<KernelSpec> {
    let mut out: Vec<KernelSpec> = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d.join("kernels")) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for dir in entries {
            let name =
                dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if out.iter().any(|s| s.name == name) {
                continue;
            }
            let file = dir.join("kernel.json");
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            match serde_json::from_str::<KernelJson>(&text) {
                Ok(k) if !k.argv.is_empty() => out.push(KernelSpec {
                    name,
                    argv: k.argv,
                    language: k.language,
                    env: k.env,
                    interrupt_mode: if k.interrupt_mode.as_deref() == Some("message") {
                        InterruptMode::Message
                    } else {
                        InterruptMode::Signal
                    },
                    resource_dir: dir,
                }),
                Ok(_) => tracing::warn!(file = %file.display(), "kernelspec has an empty argv"),
                Err(e) => tracing::warn!(file = %file.display(), "bad kernelspec: {e}"),
            }
        }
    }
    out
}

/// The canonical name of an E2B language (`None` or empty is python; `js` is javascript, `ts`
/// typescript; others lowercased).
pub fn normalize_language(language: Option<&str>) -> String {
    let l = language.unwrap_or("").trim().to_ascii_lowercase();
    match l.as_str() {
        "" | "python3" => "python".into(),
        "js" | "node" => "javascript".into(),
        "ts" => "typescript".into(),
        _ => l,
    }
}

/// The kernelspec that serves `language` (canonical name): one whose `language` matches; for
/// python the one named `python3` first.
pub fn find_spec<'a>(specs: &'a [KernelSpec], language: &str) -> Option<&'a KernelSpec> {
    let matches = |s: &&KernelSpec| normalize_language(Some(&s.language)) == language;
    if language == "python"
        && let Some(s) = specs.iter().filter(matches).find(|s| s.name == "python3")
    {
        return Some(s);
    }
    specs.iter().find(matches)
}

/// The python kernel without a kernelspec: `python3 -m ipykernel_launcher` when `python3` (or
/// `/usr/bin/python3`) can import ipykernel.
pub async fn python_fallback() -> Option<KernelSpec> {
    for py in ["python3", "/usr/bin/python3"] {
        let ok = Command::new(py)
            .args(["-c", "import ipykernel"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if ok {
            return Some(KernelSpec {
                name: "python3".into(),
                argv: [py, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
                    .map(String::from)
                    .to_vec(),
                language: "python".into(),
                env: BTreeMap::new(),
                interrupt_mode: InterruptMode::Signal,
                resource_dir: PathBuf::new(),
            });
        }
    }
    None
}

/// How to install a kernel for a language (for [`KernelError::NoKernel`]).
pub fn install_hint(language: &str) -> String {
    match language {
        "python" => {
            ": install ipykernel, e.g. `apt install python3-ipykernel` or `pip install ipykernel`"
                .into()
        }
        "javascript" | "typescript" => {
            ": install Deno 2 and a kernelspec running `deno jupyter --kernel --conn {connection_file}` (scripts/install-kernels.sh does)".into()
        }
        "r" => ": install IRkernel, e.g. `apt install r-cran-irkernel`".into(),
        "bash" => ": install bash_kernel, e.g. `pip install bash_kernel && python3 -m bash_kernel.install`".into(),
        "java" => ": install a JDK and JJava, e.g. `pip install jjava`".into(),
        _ => ": install a Jupyter kernel whose kernel.json names this language".into(),
    }
}

/// Who the kernel runs as and where.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Switch to this uid/gid (only when we are root and it differs from ours).
    pub uid_gid: Option<(u32, u32)>,
    /// `HOME` for the kernel.
    pub home: Option<PathBuf>,
    /// `USER` and `LOGNAME` for the kernel.
    pub user: Option<String>,
    /// The working directory.
    pub cwd: PathBuf,
    /// How long the kernel may take to answer `kernel_info_request`.
    pub start_timeout: Duration,
    /// Environment of the kernel process (a context's own env vars), over the spec's.
    pub env: BTreeMap<String, String>,
}

/// One output of an execution.
#[derive(Debug, Clone)]
pub enum Event {
    /// `stream` on stdout (`stderr: false`) or stderr.
    Stream {
        /// Which stream.
        stderr: bool,
        /// The text.
        text: String,
        /// The message time, unix nanoseconds.
        timestamp: i64,
    },
    /// `execute_result` (`main: true`) or `display_data`: a mime bundle.
    Result {
        /// From `execute_result`.
        main: bool,
        /// mime type → value.
        data: Map<String, Value>,
    },
    /// `error`.
    Error {
        /// `ename`.
        name: String,
        /// `evalue`.
        value: String,
        /// The traceback lines.
        traceback: Vec<String>,
    },
}

/// The end of an execution.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The reply's `execution_count`.
    pub execution_count: Option<i64>,
    /// The reply's `status` (`ok`, `error`, `aborted`).
    pub status: String,
    /// We interrupted it because the receiver went away.
    pub interrupted: bool,
}

type Tail = Arc<Mutex<VecDeque<u8>>>;

/// A running kernel and our connections to it. Dropping it kills the kernel's process group.
pub struct Kernel {
    spec: KernelSpec,
    child: Child,
    pid: i32,
    shell: Socket,
    iopub: Socket,
    control: Socket,
    session: Session,
    tail: Tail,
    readers: Vec<tokio::task::JoinHandle<()>>,
    _dir: PrivateDir,
    /// The global env vars last applied to this kernel (envd `/envs`).
    pub applied_env: BTreeMap<String, String>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("spec", &self.spec.name).field("pid", &self.pid).finish()
    }
}

/// A 0700 temp directory, removed on drop.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn new(owner: Option<(u32, u32)>) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("oka-kernel-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let d = PrivateDir(path);
        if let Some((u, g)) = owner {
            std::os::unix::fs::chown(&d.0, Some(u), Some(g))?;
        }
        Ok(d)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

fn random_key() -> String {
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    let mut bytes = a.as_bytes().to_vec();
    bytes.extend_from_slice(b.as_bytes());
    crate::wire::hex(&bytes)
}

fn spawn_reader(
    r: impl AsyncRead + Unpin + Send + 'static,
    tail: Tail,
    pid: i32,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(r).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(pid, "kernel: {line}");
            if let Ok(mut t) = tail.lock() {
                t.extend(line.as_bytes());
                t.push_back(b'\n');
                while t.len() > TAIL_BYTES {
                    t.pop_front();
                }
            }
        }
    })
}

impl Kernel {
    /// Starts a kernel and waits until it answers `kernel_info_request` on shell and publishes on
    /// iopub (so our subscription is in place before the first execution).
    pub async fn start(spec: &KernelSpec, launch: &Launch) -> Result<Kernel, KernelError> {
        let root = rustix::process::geteuid().is_root();
        let me = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
        let switch = launch.uid_gid.filter(|&ug| root && ug != me);
        let dir = PrivateDir::new(switch)?;
        let ports = free_ports(5)?;
        let key = random_key();
        let conn = json!({
            "shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
            "control_port": ports[3], "hb_port": ports[4], "ip": "127.0.0.1",
            "key": key, "transport": "tcp", "signature_scheme": "hmac-sha256",
            "kernel_name": spec.name,
        });
        let file = dir.0.join("kernel.json");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f =
                std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&file)?;
            f.write_all(conn.to_string().as_bytes())?;
        }
        if let Some((u, g)) = switch {
            std::os::unix::fs::chown(&file, Some(u), Some(g))?;
        }
        let file_s = file.to_string_lossy().into_owned();
        let res = spec.resource_dir.to_string_lossy().into_owned();
        let argv: Vec<String> = spec
            .argv
            .iter()
            .map(|a| a.replace("{connection_file}", &file_s).replace("{resource_dir}", &res))
            .collect();
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(&spec.env)
            .current_dir(&launch.cwd)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(h) = &launch.home {
            cmd.env("HOME", h);
        }
        if let Some(u) = &launch.user {
            cmd.env("USER", u).env("LOGNAME", u);
        }
        cmd.envs(&launch.env);
        if let Some((u, g)) = switch {
            cmd.uid(u).gid(g);
        }
        let mut child = cmd.spawn().map_err(|source| KernelError::Spawn {
            language: spec.language.clone(),
            argv0: argv[0].clone(),
            source,
        })?;
        let pid = child.id().map_or(0, |p| p as i32);
        let tail: Tail = Arc::default();
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(spawn_reader(out, tail.clone(), pid));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(spawn_reader(err, tail.clone(), pid));
        }
        tracing::info!(pid, kernel = %spec.name, cwd = %launch.cwd.display(), "kernel starting");
        let deadline = Instant::now() + launch.start_timeout;
        let mut starting = Starting {
            spec,
            child: &mut child,
            tail: &tail,
            readers: &mut readers,
            deadline,
            timeout: launch.start_timeout,
        };
        let addr = |p: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
        let shell = starting.connect(addr(ports[0]), SocketType::Dealer).await?;
        let iopub = starting.connect(addr(ports[1]), SocketType::Sub).await?;
        let control = starting.connect(addr(ports[3]), SocketType::Dealer).await?;
        let mut k = Kernel {
            spec: spec.clone(),
            child,
            pid,
            shell,
            iopub,
            control,
            session: Session::new(key.into_bytes(), launch.user.clone().unwrap_or_default()),
            tail,
            readers,
            _dir: dir,
            applied_env: launch.env.clone(),
        };
        k.wait_ready(deadline, launch.start_timeout).await?;
        tracing::info!(pid, kernel = %spec.name, "kernel ready");
        Ok(k)
    }

    async fn wait_ready(
        &mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), KernelError> {
        let (mut reply, mut published) = (false, false);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while !(reply && published) {
            enum Step {
                Tick,
                Shell(Result<Vec<Bytes>, ZmtpError>),
                Iopub(Result<Vec<Bytes>, ZmtpError>),
                Timeout,
            }
            let step = tokio::select! {
                _ = tick.tick() => Step::Tick,
                r = self.shell.recv() => Step::Shell(r),
                r = self.iopub.recv() => Step::Iopub(r),
                _ = tokio::time::sleep_until(deadline) => Step::Timeout,
            };
            match step {
                Step::Tick => {
                    if let Some(status) = self.child.try_wait()? {
                        return Err(self.exited(status).await);
                    }
                    let m = self.session.request("kernel_info_request", json!({}));
                    self.shell.send(&self.session.encode(&m)?).await?;
                }
                Step::Shell(r) => {
                    let frames = self.or_died(r).await?;
                    if let Some(m) = self.decode(&frames)
                        && m.msg_type() == "kernel_info_reply"
                    {
                        reply = true;
                    }
                }
                Step::Iopub(r) => {
                    self.or_died(r).await?;
                    published = true;
                }
                Step::Timeout => {
                    return Err(KernelError::StartTimeout {
                        language: self.spec.language.clone(),
                        secs: timeout.as_secs(),
                        tail: self.tail(),
                    });
                }
            }
        }
        Ok(())
    }

    async fn exited(&mut self, status: std::process::ExitStatus) -> KernelError {
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
        }
        KernelError::Exited {
            language: self.spec.language.clone(),
            status: status.to_string(),
            tail: self.tail(),
        }
    }

    async fn or_died<T>(&mut self, r: Result<T, ZmtpError>) -> Result<T, KernelError> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
                // Give the process a moment to be reaped and its output to be read.
                let status = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
                if let Ok(Ok(status)) = status {
                    return Err(self.exited(status).await);
                }
                Err(KernelError::Died { reason: e.to_string(), tail: self.tail() })
            }
        }
    }

    fn tail(&self) -> String {
        self.tail
            .lock()
            .map(|t| String::from_utf8_lossy(&t.iter().copied().collect::<Vec<u8>>()).into_owned())
            .unwrap_or_default()
    }

    fn decode(&self, frames: &[Bytes]) -> Option<Message> {
        match self.session.decode(frames) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(pid = self.pid, "dropping kernel message: {e}");
                None
            }
        }
    }

    /// The kernel's spec.
    pub fn spec(&self) -> &KernelSpec {
        &self.spec
    }

    /// The kernel process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the kernel process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Interrupts the running execution (SIGINT to the process group, or `interrupt_request` on
    /// control for `interrupt_mode: message` kernels).
    pub async fn interrupt(&mut self) -> Result<(), KernelError> {
        tracing::info!(pid = self.pid, "interrupting kernel");
        match self.spec.interrupt_mode {
            InterruptMode::Signal => {
                if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
                    rustix::process::kill_process_group(pid, rustix::process::Signal::INT)
                        .map_err(std::io::Error::from)?;
                }
            }
            InterruptMode::Message => {
                let m = self.session.request("interrupt_request", json!({}));
                self.control.send(&self.session.encode(&m)?).await?;
            }
        }
        Ok(())
    }

    /// Executes `code`. Outputs go to `events` (if any); when `events` is closed before the end,
    /// the execution is interrupted and the rest of its output is dropped. Returns when the kernel
    /// is idle again and its `execute_reply` has arrived.
    pub async fn execute(
        &mut self,
        code: &str,
        silent: bool,
        events: Option<&mpsc::Sender<Event>>,
    ) -> Result<Outcome, KernelError> {
        let m = self.session.request(
            "execute_request",
            json!({
                "code": code, "silent": silent, "store_history": !silent,
                "user_expressions": {}, "allow_stdin": false,
                // We queue requests ourselves, so the kernel never has one to abort; with
                // `stop_on_error` it would abort the request that follows an error too quickly.
                "stop_on_error": false,
            }),
        );
        let id = m.header.msg_id.clone();
        self.shell.send(&self.session.encode(&m)?).await?;
        let mut idle = false;
        let mut reply: Option<Value> = None;
        // When the receiver goes away we interrupt, but only once the kernel runs our code
        // (`execute_input`: ipykernel's SIGINT handler is in place by then; a signal that lands
        // before that is lost or hits the kernel's loop), and again every second until it stops.
        let mut started = silent;
        let mut gone: Option<Instant> = None;
        let mut last_interrupt: Option<Instant> = None;
        let settle = if silent { Duration::ZERO } else { self.spec.settle() };
        let mut last_output = Instant::now();
        loop {
            let done = idle && reply.is_some();
            if done && settle.is_zero() {
                break;
            }
            enum Step {
                Shell(Result<Vec<Bytes>, ZmtpError>),
                Iopub(Result<Vec<Bytes>, ZmtpError>),
                Gone,
                Interrupt,
                Stuck,
                Settled,
            }
            let settled = async {
                if done {
                    tokio::time::sleep_until(last_output + settle).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let closed = async {
                match events {
                    Some(tx) if gone.is_none() => tx.closed().await,
                    _ => std::future::pending().await,
                }
            };
            let interrupt_at = match (gone, started) {
                (Some(_), true) => {
                    Some(last_interrupt.map_or_else(Instant::now, |t| t + Duration::from_secs(1)))
                }
                _ => None,
            };
            let interrupt = async {
                match interrupt_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let stuck = async {
                match gone {
                    Some(t) => tokio::time::sleep_until(t + INTERRUPT_GRACE).await,
                    None => std::future::pending().await,
                }
            };
            let step = tokio::select! {
                r = self.iopub.recv() => Step::Iopub(r),
                r = self.shell.recv() => Step::Shell(r),
                _ = closed => Step::Gone,
                _ = interrupt => Step::Interrupt,
                _ = stuck => Step::Stuck,
                _ = settled => Step::Settled,
            };
            match step {
                Step::Settled => break,
                Step::Gone => gone = Some(Instant::now()),
                Step::Interrupt => {
                    self.interrupt().await?;
                    last_interrupt = Some(Instant::now());
                }
                Step::Stuck => return Err(KernelError::Unresponsive),
                Step::Shell(r) => {
                    let frames = self.or_died(r).await?;
                    if let Some(m) = self.decode(&frames)
                        && m.parent_id() == Some(&id)
                        && m.msg_type() == "execute_reply"
                    {
                        reply = Some(m.content);
                    }
                }
                Step::Iopub(r) => {
                    let frames = self.or_died(r).await?;
                    let Some(m) = self.decode(&frames) else {
                        continue;
                    };
                    tracing::trace!(
                        msg_type = m.msg_type(),
                        ours = m.parent_id() == Some(&id),
                        idle,
                        reply = reply.is_some(),
                        "iopub"
                    );
                    if m.parent_id() != Some(&id) {
                        continue;
                    }
                    last_output = Instant::now();
                    match m.msg_type() {
                        "status" => {
                            if m.content.get("execution_state").and_then(Value::as_str)
                                == Some("idle")
                            {
                                idle = true;
                            }
                            continue;
                        }
                        "execute_input" => {
                            started = true;
                            continue;
                        }
                        _ => {}
                    }
                    let Some(ev) = to_event(&m) else {
                        continue;
                    };
                    if let Some(tx) = events
                        && gone.is_none()
                        && tx.send(ev).await.is_err()
                    {
                        gone = Some(Instant::now());
                    }
                }
            }
        }
        let reply = reply.unwrap_or_default();
        Ok(Outcome {
            execution_count: reply.get("execution_count").and_then(Value::as_i64),
            status: reply.get("status").and_then(Value::as_str).unwrap_or("ok").to_owned(),
            interrupted: gone.is_some(),
        })
    }

    /// Runs `code` silently (no history, no outputs); logs a failure.
    pub async fn run_silent(&mut self, code: &str) -> Result<(), KernelError> {
        let (tx, mut rx) = mpsc::channel(16);
        let drain = async {
            let mut errors = Vec::new();
            while let Some(ev) = rx.recv().await {
                if let Event::Error { name, value, .. } = ev {
                    errors.push(format!("{name}: {value}"));
                }
            }
            errors
        };
        let run = async {
            let r = self.execute(code, true, Some(&tx)).await;
            drop(tx);
            r
        };
        let (r, errors) = tokio::join!(run, drain);
        let outcome = r?;
        if outcome.status != "ok" || !errors.is_empty() {
            tracing::warn!(status = %outcome.status, ?errors, "kernel setup snippet failed");
        }
        Ok(())
    }

    /// Kills the kernel's process group and reaps it.
    pub async fn shutdown(mut self) {
        self.kill_group();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
    }

    fn kill_group(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.kill_group();
    }
}

struct Starting<'a> {
    spec: &'a KernelSpec,
    child: &'a mut Child,
    tail: &'a Tail,
    readers: &'a mut Vec<tokio::task::JoinHandle<()>>,
    deadline: Instant,
    timeout: Duration,
}

impl Starting<'_> {
    fn tail(&self) -> String {
        self.tail
            .lock()
            .map(|t| String::from_utf8_lossy(&t.iter().copied().collect::<Vec<u8>>()).into_owned())
            .unwrap_or_default()
    }

    /// Connects once the kernel listens, failing early if the process exits.
    async fn connect(&mut self, addr: SocketAddr, kind: SocketType) -> Result<Socket, KernelError> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                for r in self.readers.drain(..) {
                    let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
                }
                return Err(KernelError::Exited {
                    language: self.spec.language.clone(),
                    status: status.to_string(),
                    tail: self.tail(),
                });
            }
            if Instant::now() >= self.deadline {
                return Err(KernelError::StartTimeout {
                    language: self.spec.language.clone(),
                    secs: self.timeout.as_secs(),
                    tail: self.tail(),
                });
            }
            match tokio::time::timeout(Duration::from_secs(2), Socket::connect(addr, kind)).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(ZmtpError::Io(_))) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Err(e)) => return Err(e.into()),
            }
        }
    }
}

fn timestamp_ns(date: &str) -> i64 {
    date.parse::<jiff::Timestamp>().unwrap_or_else(|_| jiff::Timestamp::now()).as_nanosecond()
        as i64
}

fn to_event(m: &Message) -> Option<Event> {
    let c = &m.content;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    match m.msg_type() {
        "stream" => Some(Event::Stream {
            stderr: c.get("name").and_then(Value::as_str) == Some("stderr"),
            text: s("text"),
            timestamp: timestamp_ns(&m.header.date),
        }),
        "execute_result" | "display_data" => Some(Event::Result {
            main: m.msg_type() == "execute_result",
            data: c.get("data").and_then(Value::as_object).cloned().unwrap_or_default(),
        }),
        "error" => Some(Event::Error {
            name: s("ename"),
            value: s("evalue"),
            traceback: c
                .get("traceback")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|l| l.as_str().map(String::from)).collect())
                .unwrap_or_default(),
        }),
        _ => None,
    }
}

/// Code every kernel of `language` runs (silently) once started, before anything else: for
/// python, the display formatters that produce E2B's `e2b/data` (a DataFrame's columns),
/// `e2b/chart` (a matplotlib figure's typed chart) and `application/json` for lists and dicts.
pub fn setup_snippet(language: &str) -> Option<&'static str> {
    match language {
        "python" => Some(include_str!("python_setup.py")),
        _ => None,
    }
}

/// Code that sets `set` and unsets `unset` in a kernel of `language`'s environment, or `None`
/// when the language has no known way (then env vars are not applied).
pub fn env_snippet(
    language: &str,
    set: &BTreeMap<String, String>,
    unset: &[String],
) -> Option<String> {
    if set.is_empty() && unset.is_empty() {
        return None;
    }
    let set_json = serde_json::to_string(set).ok()?;
    let unset_json = serde_json::to_string(unset).ok()?;
    Some(match language {
        // A JSON object of strings is a valid Python dict and JavaScript object literal.
        "python" => format!(
            "import os as __oka_os\n__oka_os.environ.update({set_json})\nfor __oka_k in {unset_json}:\n    __oka_os.environ.pop(__oka_k, None)\ndel __oka_os\n"
        ),
        // Deno's kernels (`Deno.env`; its `process.env` follows it), else Node's `process.env`;
        // in a block, so that nothing is declared in the user's scope.
        "javascript" | "typescript" => format!(
            "{{ const set = {set_json}, unset = {unset_json}; \
             if (globalThis.Deno) {{ for (const [k, v] of Object.entries(set)) Deno.env.set(k, v); for (const k of unset) Deno.env.delete(k); }} \
             else {{ Object.assign(process.env, set); for (const k of unset) delete process.env[k]; }} }}"
        ),
        "r" => {
            let mut s = String::new();
            for (k, v) in set {
                s.push_str(&format!(
                    "do.call(Sys.setenv, setNames(list({}), {}))\n",
                    serde_json::to_string(v).ok()?,
                    serde_json::to_string(k).ok()?
                ));
            }
            for k in unset {
                s.push_str(&format!("Sys.unsetenv({})\n", serde_json::to_string(k).ok()?));
            }
            s
        }
        "bash" => {
            let ok = |k: &str| {
                !k.is_empty()
                    && !k.starts_with(|c: char| c.is_ascii_digit())
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            let mut s = String::new();
            for (k, v) in set.iter().filter(|(k, _)| ok(k)) {
                s.push_str(&format!("export {k}='{}'\n", v.replace('\'', "'\\''")));
            }
            for k in unset.iter().filter(|k| ok(k)) {
                s.push_str(&format!("unset {k}\n"));
            }
            s
        }
        _ => return None,
    })
}

/// Reads `name`'s uid, gid and home from a passwd file.
pub fn lookup_user(passwd: &Path, name: &str) -> Option<(u32, u32, PathBuf)> {
    let text = std::fs::read_to_string(passwd).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() >= 6 && f[0] == name {
            Some((f[2].parse().ok()?, f[3].parse().ok()?, PathBuf::from(f[5])))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn languages_normalize() {
        assert_eq!(normalize_language(None), "python");
        assert_eq!(normalize_language(Some("JS")), "javascript");
        assert_eq!(normalize_language(Some("ts")), "typescript");
        assert_eq!(normalize_language(Some("R")), "r");
    }

    #[test]
    fn snippets_quote_values() {
        let set = BTreeMap::from([("A".to_string(), "it's \"x\"\n".to_string())]);
        let unset = vec!["B".to_string()];
        let py = env_snippet("python", &set, &unset).unwrap();
        assert!(py.contains(r#"{"A":"it's \"x\"\n"}"#), "{py}");
        let sh = env_snippet("bash", &set, &unset).unwrap();
        assert!(sh.contains("export A='it'\\''s \"x\"\n'"), "{sh}");
        assert!(env_snippet("python", &BTreeMap::new(), &[]).is_none());
        assert!(env_snippet("cobol", &set, &[]).is_none());
    }

    #[test]
    fn discovery_reads_specs_and_earlier_dirs_win() {
        let base = std::env::temp_dir().join(format!("oka-ks-{}", uuid::Uuid::new_v4()));
        for (d, lang) in [("a", "python"), ("b", "R")] {
            let k = base.join(d).join("kernels/k1");
            std::fs::create_dir_all(&k).unwrap();
            std::fs::write(
                k.join("kernel.json"),
                format!(r#"{{"argv":["x","{{connection_file}}"],"language":"{lang}","interrupt_mode":"message"}}"#),
            )
            .unwrap();
        }
        let specs = discover(&[base.join("a"), base.join("b")]);
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].language, "python");
        assert_eq!(specs[0].interrupt_mode, InterruptMode::Message);

        assert!(find_spec(&specs, "python").is_some());
        assert!(find_spec(&specs, "r").is_none());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn only_deno_kernels_wait_for_outputs_after_idle() {
        let spec = |argv0: &str| KernelSpec {
            name: "k".into(),
            argv: vec![argv0.into(), "{connection_file}".into()],
            language: "typescript".into(),
            env: BTreeMap::new(),
            interrupt_mode: InterruptMode::Message,
            resource_dir: PathBuf::new(),
        };
        assert_eq!(spec("/usr/local/bin/deno").settle(), DENO_SETTLE);
        assert_eq!(spec("deno").settle(), DENO_SETTLE);
        assert_eq!(spec("/usr/bin/python3").settle(), Duration::ZERO);
    }
}
