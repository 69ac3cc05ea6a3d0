//! The seam between the manager's E2B template-build API and whatever builds templates: the
//! request the API hands over ([`BuildRequest`]), what a build answers ([`BuildOutput`],
//! [`BuildFailure`]), the log it writes as it goes ([`BuildLog`]) and the builder itself
//! ([`TemplateBuilder`]).
//!
//! The API ([`crate::api::builds`]) validates what the SDK sends, stores uploaded files, keeps each
//! build's record and log, and turns a successful build's [`BuildOutput`] into a SandboxTemplate
//! and a warm SandboxSet; the builder only runs the steps and says which image the result is.
//! Without a builder the build routes answer 501.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Where a build starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildBase {
    /// A registry image (`fromImage`), with the SDK's optional credentials (username, password).
    Image {
        /// The image reference as the SDK sent it.
        reference: String,
        /// `fromImageRegistry` of type `registry`: username and password.
        credentials: Option<(String, String)>,
    },
    /// An existing template (`fromTemplate`, and `fromImage` of exactly `e2bdev/base` or
    /// `e2bdev/base:latest`, which means oka's own `base` template): the `image` string of that
    /// template's pod template container (an absolute directory for the default templates
    /// built here, an image reference for built ones and for default templates on an image).
    Template {
        /// The template's name (its SandboxSet).
        name: String,
        /// Its pod template's first container's `image`; empty when the container names none
        /// (the runtime's default root).
        image: String,
    },
}

/// One step of the SDK's template, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStep {
    /// `RUN`, `COPY`, `ENV`, `WORKDIR` or `USER`, as the SDK sends it.
    pub kind: String,
    /// The step's arguments as the SDK sends them.
    pub args: Vec<String>,
    /// `COPY`: the uploaded archive (tar, gzip-compressed or not) of its `filesHash`.
    pub files: Option<PathBuf>,
    /// The SDK's per-step `force` (skip any cache from here on).
    pub force: bool,
}

/// One build, as the API accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRequest {
    /// The template's ID: its name, and the name of its SandboxSet.
    pub template_id: String,
    /// This build's ID (a UUID).
    pub build_id: String,
    /// The team's namespace, where the SandboxTemplate and SandboxSet are written.
    pub namespace: String,
    /// What the build starts from.
    pub base: BuildBase,
    /// The steps, in order.
    pub steps: Vec<BuildStep>,
    /// The template's start command, run when a sandbox starts.
    pub start_cmd: Option<String>,
    /// The command whose success says a started sandbox is ready.
    pub ready_cmd: Option<String>,
    /// The SDK's whole-build `force` (no cache at all).
    pub force: bool,
    /// `cpuCount` of the template request.
    pub cpu_count: Option<u32>,
    /// `memoryMB` of the template request.
    pub memory_mb: Option<u64>,
}

/// What a successful build made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOutput {
    /// What the template's pod template names as its container `image` (pulled with
    /// `imagePullPolicy: IfNotPresent`): a reference the node's image store holds without any
    /// network, whose image config carries the build's final ENV, WORKDIR and USER.
    pub image: String,
}

/// Why a build failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildFailure {
    /// What the SDK user reads.
    pub message: String,
    /// The step to blame as the SDKs number them: `"base"` (also `"0"`) for the base image,
    /// `"1"` for `steps[0]`, `"2"` for `steps[1]`, …, `"finalize"` for the start and ready
    /// commands; `None` when no step is to blame. The SDK shows the user's source line of it.
    pub step: Option<String>,
}

impl BuildFailure {
    /// A failure of `step` (see [`BuildFailure::step`]).
    pub fn at(step: impl Into<String>, message: impl Into<String>) -> Self {
        Self { message: message.into(), step: Some(step.into()) }
    }

    /// A failure of `steps[index]` (step `index + 1` as the SDKs number them).
    pub fn at_step(index: usize, message: impl Into<String>) -> Self {
        Self::at((index + 1).to_string(), message)
    }

    /// A failure no step is to blame for.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), step: None }
    }
}

/// The severity of a log entry (E2B's `LogLevel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Detail.
    Debug,
    /// Progress.
    Info,
    /// Something the user should know that does not fail the build.
    Warn,
    /// A failure.
    Error,
}

/// One log entry as the SDK reads it (E2B's `BuildLogEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// When it was written (RFC 3339).
    pub timestamp: jiff::Timestamp,
    /// Its severity.
    pub level: LogLevel,
    /// The text.
    pub message: String,
}

/// What a build says, in order, as the SDK's log entries. Cheap to clone; every clone appends
/// to the same log. The API keeps the entries in memory and, when it made the log with
/// [`BuildLog::persistent`], appends each as one JSON line to the build's log file, so offsets
/// keep working after a restart.
#[derive(Clone, Default)]
pub struct BuildLog {
    inner: Arc<LogInner>,
}

#[derive(Default)]
struct LogInner {
    entries: Mutex<Vec<LogEntry>>,
    file: Mutex<Option<std::fs::File>>,
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for BuildLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildLog").field("entries", &self.len()).finish_non_exhaustive()
    }
}

impl BuildLog {
    /// A log kept in memory only (tests, builders' own checks).
    pub fn new() -> Self {
        Self::default()
    }

    /// A log of `entries` kept in memory only (a finished build's, read back from its file).
    pub fn from_entries(entries: Vec<LogEntry>) -> Self {
        Self {
            inner: Arc::new(LogInner {
                entries: Mutex::new(entries),
                file: Mutex::new(None),
                changed: tokio::sync::Notify::new(),
            }),
        }
    }

    /// A log that starts with `entries` (read back from its file) and appends to `file`.
    pub fn persistent(entries: Vec<LogEntry>, file: std::fs::File) -> Self {
        Self {
            inner: Arc::new(LogInner {
                entries: Mutex::new(entries),
                file: Mutex::new(Some(file)),
                changed: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Appends an `info` entry.
    pub fn info(&self, message: impl Into<String>) {
        self.push(LogLevel::Info, message.into());
    }

    /// Appends a `warn` entry.
    pub fn warn(&self, message: impl Into<String>) {
        self.push(LogLevel::Warn, message.into());
    }

    /// Appends an `error` entry.
    pub fn error(&self, message: impl Into<String>) {
        self.push(LogLevel::Error, message.into());
    }

    /// Appends a `debug` entry.
    pub fn debug(&self, message: impl Into<String>) {
        self.push(LogLevel::Debug, message.into());
    }

    /// Appends an entry of `level`.
    pub fn push(&self, level: LogLevel, message: String) {
        let entry = LogEntry { timestamp: jiff::Timestamp::now(), level, message };
        if let Ok(mut file) = self.inner.file.lock()
            && let Some(out) = file.as_mut()
            && let Ok(mut line) = serde_json::to_vec(&entry)
        {
            line.push(b'\n');
            if let Err(error) = out.write_all(&line) {
                tracing::warn!(%error, "cannot append to a build's log file; the entry stays in memory");
                *file = None;
            }
        }
        if let Ok(mut entries) = self.inner.entries.lock() {
            entries.push(entry);
        }
        self.inner.changed.notify_waiters();
    }

    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.inner.entries.lock().map_or(0, |e| e.len())
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries from index `offset` on.
    pub fn entries_from(&self, offset: usize) -> Vec<LogEntry> {
        self.inner.entries.lock().map_or_else(
            |_| Vec::new(),
            |e| e.get(offset..).map(<[LogEntry]>::to_vec).unwrap_or_default(),
        )
    }

    /// Resolves at the next entry written after this call.
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }
}

/// Builds templates: runs a [`BuildRequest`]'s steps and says which image holds the result.
pub trait TemplateBuilder: Send + Sync + 'static {
    /// `Ok` when builds can run here; else the message naming what is missing (→ 501).
    fn available(&self) -> Result<(), String>;

    /// Runs `request`, writing what it does to `log`.
    fn build<'a>(
        &'a self,
        request: BuildRequest,
        log: BuildLog,
    ) -> BoxFuture<'a, Result<BuildOutput, BuildFailure>>;
}

/// How the manager serves template builds.
#[derive(Clone)]
pub struct TemplateBuildConfig {
    /// What runs the builds.
    pub builder: Arc<dyn TemplateBuilder>,
    /// Where uploads, build records and logs are kept (`<state dir>/template-builds`).
    pub dir: PathBuf,
    /// `replicas` of the SandboxSet a first successful build writes. Default 1.
    pub pool_replicas: i32,
    /// Annotations on every built template's pod template (e.g. `agents.kruise.io/network:
    /// outbound`, so built sandboxes get the network the default pool's have). Default none.
    pub pod_annotations: std::collections::BTreeMap<String, String>,
    /// The largest uploaded file (a `COPY`'s archive) accepted, in bytes. Default 4 GiB.
    pub max_upload_bytes: u64,
    /// How long a build waits, after writing its template, for a sandbox of it to be ready in
    /// the pool (its start command running and its ready command passing); past it the build
    /// fails and the previous template is put back. Default 5 minutes.
    pub ready_timeout: std::time::Duration,
}

impl std::fmt::Debug for TemplateBuildConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateBuildConfig")
            .field("dir", &self.dir)
            .field("pool_replicas", &self.pool_replicas)
            .field("pod_annotations", &self.pod_annotations)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("ready_timeout", &self.ready_timeout)
            .finish_non_exhaustive()
    }
}

impl TemplateBuildConfig {
    /// Builds through `builder`, keeping their files under `dir`, pools of one sandbox.
    pub fn new(builder: Arc<dyn TemplateBuilder>, dir: impl Into<PathBuf>) -> Self {
        Self {
            builder,
            dir: dir.into(),
            pool_replicas: 1,
            pod_annotations: std::collections::BTreeMap::new(),
            max_upload_bytes: 4 << 30,
            ready_timeout: std::time::Duration::from_secs(300),
        }
    }
}
