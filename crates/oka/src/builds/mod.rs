//! E2B template builds on this machine: [`SandboxBuilder`], the manager's [`TemplateBuilder`]
//! over the local runtime and the image store.
//!
//! # Expected flow
//!
//! 1. Resolve the base: a registry image is pulled through the machine's image store (with the
//!    SDK's credentials); a template's `image` is its root directory (default templates built
//!    here) or an image, the stored one when there is one (built templates, default templates
//!    on an image), else pulled. A build whose base and steps (and copied archives) match an
//!    earlier successful one, without `force`, answers that build's image (`CACHED`).
//! 2. Start a build sandbox (`oka-build-<build id>`) on the base's layers, with outbound
//!    networking when the machine has it, running envd alone.
//! 3. Run the steps in order through envd (`plan.rs` says what each means), each announced as
//!    `Step i/n : …` and its output logged line by line; a failed `RUN` fails the build naming
//!    the step, the exit code and the last lines of output.
//! 4. Stop the sandbox and move its writable layer (overlay's upper directory: whiteouts and
//!    opaque directories already in the store's form) into the image store as one layer, less
//!    the files the runtime writes into every sandbox; record the image under
//!    `oka.local/<namespace>/<template>:<build id>` with the final env, working directory and
//!    user; delete the sandbox.
//!
//! # Guarantees
//!
//! - Nothing half made stays: whatever happens, the sandbox is deleted and the staged layer is
//!   either in the store or removed; a build past its time limit fails the same way.
//! - The image needs no network afterwards: `get` finds it, and `pull` answers it from the store.

pub mod envd;
pub mod plan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use oka_image::{ImageConfig, ImageStore, RegistryAuth};
use oka_manager::{
    BuildBase, BuildFailure, BuildLog, BuildOutput, BuildRequest, BuildStep, TemplateBuilder,
};
use oka_runtime_api::{NetworkMode, ResourceLimits, RootFs, Runtime, SandboxId, SandboxSpec};
use sha2::{Digest as _, Sha256};

use plan::{BuildState, Step};

/// How many lines of a failed command's output the failure quotes.
const FAILURE_LINES: usize = 10;

/// Files the runtime writes into every sandbox's writable layer; not part of a build's layer.
const RUNTIME_FILES: [&str; 4] = ["etc/hostname", "etc/hosts", "etc/resolv.conf", ".oka"];

/// How builds run here.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    /// Build sandboxes get outbound networking (`pip install` reaches the registries).
    pub outbound: bool,
    /// The most one build may take, base pull included.
    pub time_limit: Duration,
    /// The local runtime's state directory (`<state dir>/runtime`), where a sandbox's writable
    /// layer is `sandboxes/<id>/upper`.
    pub runtime_state: PathBuf,
    /// Where the build cache's index is kept (`<state dir>/template-build-cache.json`).
    pub cache_file: PathBuf,
    /// Why builds cannot run here (no agent runtime, no local runtime); `None`: they can.
    pub unavailable: Option<String>,
}

impl BuildSettings {
    /// `oka serve`'s: its runtime's state directory, outbound build sandboxes when
    /// `outbound`, and builds only when sandboxes run envd (`agent_runtime`).
    pub fn for_serve(config: &crate::config::Config, outbound: bool, agent_runtime: bool) -> Self {
        BuildSettings {
            outbound,
            time_limit: config.templates.build_time_limit,
            runtime_state: config.state_dir.join("runtime"),
            cache_file: config.state_dir.join("template-build-cache.json"),
            unavailable: (!agent_runtime).then(|| {
                "template builds run their steps through envd, and oka-envd was not found \
                 beside oka nor in $OKA_ENVD"
                    .to_string()
            }),
        }
    }
}

/// A builder that cannot build here, and says why.
pub struct Unavailable(pub String);

impl TemplateBuilder for Unavailable {
    fn available(&self) -> Result<(), String> {
        Err(self.0.clone())
    }

    fn build<'a>(
        &'a self,
        _request: BuildRequest,
        _log: BuildLog,
    ) -> BoxFuture<'a, Result<BuildOutput, BuildFailure>> {
        Box::pin(async move { Err(BuildFailure::new(self.0.clone())) })
    }
}

/// Builds E2B templates in sandboxes of the local runtime; see the module documentation.
pub struct SandboxBuilder {
    runtime: Arc<dyn Runtime>,
    images: ImageStore,
    settings: BuildSettings,
    cache: tokio::sync::Mutex<()>,
}

impl SandboxBuilder {
    /// A builder over `runtime` and `images`.
    pub fn new(runtime: Arc<dyn Runtime>, images: ImageStore, settings: BuildSettings) -> Self {
        Self { runtime, images, settings, cache: tokio::sync::Mutex::new(()) }
    }

    /// Deletes the build sandboxes an earlier process left (it stopped mid-build): their builds
    /// are over (the API marks them interrupted) and nothing else would ever remove them.
    pub async fn remove_leftovers(&self) {
        let Ok(listed) = self.runtime.list().await else { return };
        for status in listed.into_iter().filter(|s| s.id.as_str().starts_with(BUILD_PREFIX)) {
            let _ = self.runtime.stop(&status.id, Duration::ZERO).await;
            match self.runtime.delete(&status.id).await {
                Ok(()) => {
                    tracing::info!(id = %status.id, "removed a build sandbox an earlier run left")
                }
                Err(error) => {
                    tracing::warn!(id = %status.id, %error, "cannot remove a left build sandbox")
                }
            }
        }
    }
}

/// The name of every build sandbox starts with this, then the build id.
const BUILD_PREFIX: &str = "oka-build-";

impl TemplateBuilder for SandboxBuilder {
    fn available(&self) -> Result<(), String> {
        match &self.settings.unavailable {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    fn build<'a>(
        &'a self,
        request: BuildRequest,
        log: BuildLog,
    ) -> BoxFuture<'a, Result<BuildOutput, BuildFailure>> {
        Box::pin(async move {
            let started = Instant::now();
            log.info(format!(
                "[builder] Building template {} (build {})",
                request.template_id, request.build_id
            ));
            let id = SandboxId::new(format!("{BUILD_PREFIX}{}", request.build_id))
                .map_err(|e| BuildFailure::new(format!("build id: {e}")))?;
            let limit = self.settings.time_limit;
            let result = match tokio::time::timeout(limit, self.build_in(&id, &request, &log)).await
            {
                Ok(result) => result,
                Err(_) => Err(BuildFailure::new(format!(
                    "the build ran longer than its time limit of {} s",
                    limit.as_secs()
                ))),
            };
            // Whatever happened: no build sandbox stays.
            let _ = self.runtime.stop(&id, Duration::ZERO).await;
            if let Err(error) = self.runtime.delete(&id).await {
                tracing::warn!(%id, %error, "cannot delete a build sandbox");
            }
            match &result {
                Ok(output) => log.info(format!(
                    "[builder] Template {} built in {:.1} s: {}",
                    request.template_id,
                    started.elapsed().as_secs_f64(),
                    output.image
                )),
                Err(failure) => log.error(format!("[builder] Build failed: {}", failure.message)),
            }
            result
        })
    }
}

/// The base of a build, resolved.
struct Base {
    /// Lower directories, bottom first.
    layers: Vec<PathBuf>,
    /// Its run config.
    config: ImageConfig,
    /// What identifies its content, for the cache.
    identity: String,
}

impl SandboxBuilder {
    async fn build_in(
        &self,
        id: &SandboxId,
        request: &BuildRequest,
        log: &BuildLog,
    ) -> Result<BuildOutput, BuildFailure> {
        let steps: Vec<Step> = request
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| Step::parse(s).map_err(|e| BuildFailure::at(step_name(i), e.0)))
            .collect::<Result<_, _>>()?;
        let base = self.resolve_base(&request.base, log).await?;
        let hashes = file_hashes(&request.steps).await?;
        let key = plan::cache_key(&base.identity, &request.steps, &hashes);
        let cacheable = !request.force && !request.steps.iter().any(|s| s.force);
        if cacheable && let Some(image) = self.cached(&key).await {
            for (i, step) in request.steps.iter().enumerate() {
                log.info(format!("{} CACHED", plan::step_line(i + 1, request.steps.len(), step)));
            }
            return Ok(BuildOutput { image });
        }
        let mut spec = SandboxSpec::new(id.clone(), Vec::new());
        spec.root = RootFs::Layers(base.layers.clone());
        spec.network =
            if self.settings.outbound { NetworkMode::Outbound } else { NetworkMode::Loopback };
        spec.resources = ResourceLimits {
            cpu_millis: request.cpu_count.map(|c| u64::from(c.max(1)) * 1000),
            memory_bytes: request.memory_mb.map(|m| m.max(64) << 20),
            pids: None,
        };
        // A sandbox of an earlier attempt under the same id goes first.
        let _ = self.runtime.stop(id, Duration::ZERO).await;
        let _ = self.runtime.delete(id).await;
        self.runtime.ensure(&spec).await.map_err(|e| {
            BuildFailure::at("base", format!("cannot start the build sandbox: {e}"))
        })?;
        let has_user = has_account(&base.layers, "user");
        let mut state = BuildState::start(&base.config, has_user);
        let count = request.steps.len();
        for (i, (raw, step)) in request.steps.iter().zip(&steps).enumerate() {
            log.info(plan::step_line(i + 1, count, raw));
            self.run_step(id, i, raw, step, &mut state, log).await?;
        }
        log.info("[finalize] Capturing the template's filesystem");
        self.runtime.stop(id, Duration::from_secs(5)).await.map_err(|e| {
            BuildFailure::at("finalize", format!("cannot stop the build sandbox: {e}"))
        })?;
        let reference =
            oka_image::local_reference(&request.namespace, &request.template_id, &request.build_id);
        let upper = self.settings.runtime_state.join("sandboxes").join(id.as_str()).join("upper");
        let images = self.images.clone();
        let config = state.image_config(&base.config);
        let layers = base.layers.clone();
        let image_ref = reference.clone();
        tokio::task::spawn_blocking(move || capture(&images, &image_ref, &upper, &layers, config))
            .await
            .map_err(|e| BuildFailure::at("finalize", e.to_string()))?
            .map_err(|e| BuildFailure::at("finalize", e))?;
        // Even a forced build is what later unforced builds of the same steps can reuse.
        self.remember(&key, &reference).await;
        Ok(BuildOutput { image: reference })
    }

    async fn resolve_base(&self, base: &BuildBase, log: &BuildLog) -> Result<Base, BuildFailure> {
        let (reference, auth) = match base {
            BuildBase::Template { name, image } if Path::new(image).is_absolute() => {
                log.info(format!("[base] FROM template {name} ({image})"));
                let dir = PathBuf::from(image);
                if !dir.is_dir() {
                    return Err(BuildFailure::at(
                        "base",
                        format!("the root of template {name} ({image}) is not built yet"),
                    ));
                }
                return Ok(Base {
                    layers: vec![dir],
                    config: ImageConfig::default(),
                    identity: format!("dir:{image}"),
                });
            }
            BuildBase::Template { name, image } if image.is_empty() => {
                return Err(BuildFailure::at(
                    "base",
                    format!(
                        "template {name} runs on the runtime's default root (the host's system \
                         directories), which a template cannot be built on; build from an \
                         image or a template with a root of its own"
                    ),
                ));
            }
            BuildBase::Template { name, image } => {
                log.info(format!("[base] FROM template {name} ({image})"));
                // What the template's sandboxes run on, as stored here: a default template on
                // an image of a registry that wants credentials (its imagePullSecrets, which a
                // build does not hold) is built on without asking the registry again.
                if let Some(stored) = self.images.get(image) {
                    log.info(format!("[base] {image} is stored here ({})", stored.digest));
                    return Ok(Base {
                        identity: format!("image:{}", stored.digest),
                        layers: stored.layers,
                        config: stored.config,
                    });
                }
                (image.clone(), Vec::new())
            }
            BuildBase::Image { reference, credentials } => {
                log.info(format!("[base] FROM {reference}"));
                let auth = match (credentials, oka_image::Reference::parse(reference)) {
                    (Some((username, password)), Ok(parsed)) => vec![RegistryAuth {
                        registry: parsed.registry.clone(),
                        username: username.clone(),
                        password: password.clone(),
                    }],
                    _ => Vec::new(),
                };
                (reference.clone(), auth)
            }
        };
        let progress_log = log.clone();
        let image = self
            .images
            .pull(&reference, &auth, &move |p| {
                if !matches!(p, oka_image::PullProgress::LayerBytes { .. }) {
                    progress_log.info(format!("[base] {p}"));
                }
            })
            .await
            .map_err(|e| BuildFailure::at("base", e.to_string()))?;
        Ok(Base {
            identity: format!("image:{}", image.digest),
            layers: image.layers,
            config: image.config,
        })
    }

    async fn run_step(
        &self,
        id: &SandboxId,
        index: usize,
        raw: &BuildStep,
        step: &Step,
        state: &mut BuildState,
        log: &BuildLog,
    ) -> Result<(), BuildFailure> {
        let name = step_name(index);
        let fail = |message: String| BuildFailure::at(name.clone(), message);
        match step {
            Step::Run { command, user } => {
                let user = user.clone().unwrap_or_else(|| state.user.clone());
                let argv = vec!["/bin/bash".into(), "-l".into(), "-c".into(), command.clone()];
                let ended = self.exec(id, argv, &user, state, log).await.map_err(|e| fail(e.0))?;
                if ended.0.exit_code != 0 {
                    return Err(fail(format!(
                        "Step {} `{}` failed with exit code {}{}",
                        index + 1,
                        plan::describe(raw),
                        ended.0.exit_code,
                        tail(&ended.1)
                    )));
                }
            }
            Step::Copy { src, dest, user, mode } => {
                let Some(archive) = &raw.files else {
                    return Err(fail(format!("COPY {src}: no files were uploaded for this step")));
                };
                let target = format!("/tmp/.oka-build-copy-{index}.tar");
                envd::upload(self.runtime.as_ref(), id, &target, archive)
                    .await
                    .map_err(|e| fail(format!("COPY {src}: {}", e.0)))?;
                let owner = user.clone().unwrap_or_else(|| state.user.clone());
                let script = plan::copy_script(&target, src, &state.absolute(dest), &owner, *mode);
                let argv = vec!["/bin/bash".into(), "-c".into(), script];
                let ended = self.exec(id, argv, "root", state, log).await.map_err(|e| fail(e.0))?;
                if ended.0.exit_code != 0 {
                    return Err(fail(format!(
                        "Step {} `{}` failed with exit code {}{}",
                        index + 1,
                        plan::describe(raw),
                        ended.0.exit_code,
                        tail(&ended.1)
                    )));
                }
            }
            Step::Env(pairs) => {
                for (key, value) in pairs {
                    state.set_env(key, value);
                }
            }
            Step::Workdir(dir) => {
                let dir = state.absolute(dir);
                let argv =
                    vec!["/bin/sh".into(), "-c".into(), plan::workdir_script(&dir, &state.user)];
                let root_state = BuildState { workdir: "/".into(), ..state.clone() };
                let ended =
                    self.exec(id, argv, "root", &root_state, log).await.map_err(|e| fail(e.0))?;
                if ended.0.exit_code != 0 {
                    return Err(fail(format!("WORKDIR {dir}: cannot create it{}", tail(&ended.1))));
                }
                state.workdir = dir.clone();
                state.workdir_set = Some(dir);
            }
            Step::User(user) => {
                state.user = user.clone();
                state.user_set = Some(user.clone());
            }
        }
        Ok(())
    }

    /// Runs `argv` in the build sandbox as `user` with the state's env and working directory,
    /// each output line logged; the outcome and the output's last lines.
    async fn exec(
        &self,
        id: &SandboxId,
        argv: Vec<String>,
        user: &str,
        state: &BuildState,
        log: &BuildLog,
    ) -> Result<(envd::Ended, String), envd::EnvdError> {
        let command = envd::Command { argv, user, env: state.env_map(), cwd: &state.workdir };
        let mut recent: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let mut output = |line: &str| {
            log.info(line.to_string());
            recent.push_back(line.to_string());
            if recent.len() > FAILURE_LINES {
                recent.pop_front();
            }
        };
        let ended =
            envd::run(self.runtime.as_ref(), id, &command, self.settings.time_limit, &mut output)
                .await?;
        let recent: Vec<String> = recent.into_iter().collect();
        Ok((ended, plan::last_lines(&recent.join("\n"), FAILURE_LINES)))
    }

    async fn cached(&self, key: &str) -> Option<String> {
        let _guard = self.cache.lock().await;
        let bytes = tokio::fs::read(&self.settings.cache_file).await.ok()?;
        let index: BTreeMap<String, String> = serde_json::from_slice(&bytes).ok()?;
        let reference = index.get(key)?;
        self.images.get(reference).map(|_| reference.clone())
    }

    async fn remember(&self, key: &str, reference: &str) {
        let _guard = self.cache.lock().await;
        let mut index: BTreeMap<String, String> = tokio::fs::read(&self.settings.cache_file)
            .await
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        index.insert(key.to_string(), reference.to_string());
        let tmp = self.settings.cache_file.with_extension("json.tmp");
        let written = match serde_json::to_vec_pretty(&index) {
            Ok(json) => match tokio::fs::write(&tmp, json).await {
                Ok(()) => tokio::fs::rename(&tmp, &self.settings.cache_file).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(std::io::Error::other(e)),
        };
        if let Err(error) = written {
            tracing::warn!(%error, "cannot record a template build in the build cache");
        }
    }
}

/// The SDK's name of step `index` (0-based in the request): its index among the SDK's stack
/// traces, whose first is the base, so the first step is `"1"`.
fn step_name(index: usize) -> String {
    (index + 1).to_string()
}

fn tail(lines: &str) -> String {
    if lines.is_empty() { String::new() } else { format!(":\n{lines}") }
}

/// The SHA-256 of each step's uploaded archive.
async fn file_hashes(steps: &[BuildStep]) -> Result<Vec<Option<String>>, BuildFailure> {
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match &step.files {
            Some(path) => {
                let path = path.clone();
                let digest = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
                    use std::io::Read as _;
                    let mut hasher = Sha256::new();
                    let mut file = std::fs::File::open(path)?;
                    let mut buffer = vec![0u8; 256 * 1024];
                    loop {
                        let n = file.read(&mut buffer)?;
                        if n == 0 {
                            break;
                        }
                        hasher.update(&buffer[..n]);
                    }
                    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
                })
                .await
                .map_err(|e| BuildFailure::at(step_name(i), e.to_string()))?
                .map_err(|e| BuildFailure::at(step_name(i), format!("the uploaded files: {e}")))?;
                out.push(Some(digest));
            }
            None => out.push(None),
        }
    }
    Ok(out)
}

/// Whether the top-most `/etc/passwd` of `layers` (bottom first) has `name`.
fn has_account(layers: &[PathBuf], name: &str) -> bool {
    layers
        .iter()
        .rev()
        .find_map(|l| std::fs::read_to_string(l.join("etc/passwd")).ok())
        .is_some_and(|passwd| passwd.lines().any(|line| line.split(':').next() == Some(name)))
}

/// The overlay xattrs that describe the build's own mount (the lower files copied up, the
/// upper directory's identity), not the content: removed from a captured layer, which keeps
/// whiteouts, `opaque` and `redirect`.
const OVERLAY_BOOKKEEPING: [&str; 5] = [
    "trusted.overlay.origin",
    "trusted.overlay.impure",
    "trusted.overlay.nlink",
    "trusted.overlay.uuid",
    "trusted.overlay.upper",
];

/// Removes [`OVERLAY_BOOKKEEPING`] xattrs under `dir`. Blocking.
fn strip_overlay_bookkeeping(dir: &Path) -> std::io::Result<()> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        for name in OVERLAY_BOOKKEEPING {
            match rustix::fs::lremovexattr(&path, name) {
                Ok(()) | Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if std::fs::symlink_metadata(&path)?.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Moves the stopped build sandbox's writable layer `upper` into the image store and records
/// the image `reference` on `base`. Blocking.
fn capture(
    images: &ImageStore,
    reference: &str,
    upper: &Path,
    base: &[PathBuf],
    config: ImageConfig,
) -> Result<(), String> {
    let staging = images.staging_dir("build").map_err(|e| e.to_string())?;
    let layer = staging.join("layer");
    let moved = match std::fs::rename(upper, &layer) {
        Ok(()) => Ok(()),
        // Another file system: a copy that keeps owners, modes and xattrs (whiteouts, opaque
        // directories).
        Err(_) => std::process::Command::new("cp")
            .arg("-a")
            .arg(upper)
            .arg(&layer)
            .status()
            .map_err(|e| format!("cannot copy the build's writable layer: {e}"))
            .and_then(|s| {
                if s.success() { Ok(()) } else { Err(format!("cp -a of the writable layer: {s}")) }
            }),
    };
    let result = moved.and_then(|()| {
        for file in RUNTIME_FILES {
            let path = layer.join(file);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?,
                Ok(_) => {
                    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?
                }
                Err(_) => {}
            }
        }
        strip_overlay_bookkeeping(&layer).map_err(|e| format!("{}: {e}", layer.display()))?;
        images
            .import_local(reference, base, Some(&layer), config)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let _ = std::fs::remove_dir_all(&staging);
    result
}
