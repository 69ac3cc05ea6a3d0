//! The E2B template-build API, as the SDKs' `Template.build` calls it:
//!
//! | route | answer |
//! |---|---|
//! | `POST /v3/templates` | 202 `{templateID, buildID, public, names, tags, aliases}`: a build, waiting |
//! | `GET /templates/{id}/files/{hash}` | 201 `{present, url}`: whether a COPY's files are here, and a one-time upload link |
//! | `PUT /template-files/{token}` | 200: the archive stored (unauthenticated: the link's token is the credential) |
//! | `POST /v2/templates/{id}/builds/{build}` | 202: the build runs in the background |
//! | `GET /templates/{id}/builds/{build}/status` | 200 `{buildID, templateID, status, logEntries, logs, reason?}`, `logsOffset` paging (100 a page) |
//! | `POST /templates/tags`, `DELETE /templates/tags`, `GET /templates/{id}/tags` | the templates' tags |
//!
//! A template's ID is its name, and the name of its SandboxSet and SandboxTemplate in the
//! team's namespace (the admin key's team: `default`). A build runs through the
//! [`crate::templatebuild::TemplateBuilder`]; when it succeeds the SandboxTemplate is written
//! (or replaced) with the built image ([`plan::template_object`]) and the SandboxSet created
//! if missing, and the build is ready once the pool has a ready sandbox of the new template
//! ([`plan::rollout`]: a failed sandbox of it fails the build at once).
//! A build that fails, in the builder or while its sandboxes start, leaves the previous
//! template serving. One build of a template runs at a time (a second start: 409).
//!
//! The rules are pure in [`plan`]; the last part of a build is `publish.rs`, the tags
//! `tags.rs`. Builds' records, logs, tags and uploads live on disk ([`records`]); a build the previous
//! process left running is `error` with [`records::INTERRUPTED`].

pub mod plan;
mod publish;
pub mod records;
mod tags;

pub(crate) use self::tags::resolve_tagged;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use futures::StreamExt as _;
use http::StatusCode;
use jiff::Timestamp;
use oka_api::{SandboxSet, SandboxTemplate};
use oka_store::{Preconditions, Store, StoreError};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

use self::plan::{PlannedBase, PlannedStart};
use self::records::{BuildRecord, BuildStatus, Layout, Reason, TagRecord, Tags};
use super::sandboxes::parse_json;
use super::{ApiError, AppState, RequestContext, User};
use crate::templatebuild::{
    BuildFailure, BuildLog, BuildRequest, BuildStep, LogEntry, LogLevel, TemplateBuildConfig,
};

/// The answer of every build route where no builder is configured.
pub const NO_BUILDER: &str = "building templates through the E2B API is not enabled on this \
     oka manager: templates are SandboxSets (create one with kubectl or okactl)";

/// The namespace of the admin key's team.
const ADMIN_NAMESPACE: &str = "default";
/// The most log entries one status answer carries (the SDKs page until an empty answer).
const STATUS_PAGE: usize = 100;
/// How long an upload link stays valid.
const UPLOAD_LINK_TTL: Duration = Duration::from_secs(3600);
/// The path of uploads (outside the authenticated routes).
const UPLOAD_PATH: &str = "/template-files";

type AppStateRef<S> = State<Arc<AppState<S>>>;

/// The builds this manager serves: configuration, records, live logs, running builds, upload
/// links.
pub(crate) struct Builds {
    config: TemplateBuildConfig,
    layout: Layout,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Builds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builds").field("config", &self.config).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    /// Every build by ID.
    records: HashMap<String, BuildRecord>,
    /// Logs read or written since start, by build ID.
    logs: HashMap<String, BuildLog>,
    /// (namespace, template) with a build running.
    running: HashSet<(String, String)>,
    /// Tags by (namespace, template), read on first use.
    tags: HashMap<(String, String), Tags>,
    /// Upload links by token.
    uploads: HashMap<String, PendingUpload>,
}

struct PendingUpload {
    namespace: String,
    hash: String,
    expires: Instant,
}

impl Builds {
    /// Opens the builds' directory, recording builds a previous process left running as failed.
    pub(crate) fn open(config: TemplateBuildConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(&config.dir)?;
        let layout = Layout::new(&config.dir);
        let mut inner = Inner::default();
        for mut record in layout.load_records()? {
            if record.status == BuildStatus::Building {
                // Appended to what the build wrote before the stop.
                let log =
                    BuildLog::persistent(Vec::new(), records::open_log(&layout.log(&record))?);
                log.error(records::INTERRUPTED);
                record.status = BuildStatus::Error;
                record.reason = Some(Reason { message: records::INTERRUPTED.into(), step: None });
                record.finished_at = Some(Timestamp::now());
                records::write_json(&layout.record(&record), &record)?;
                drop(log);
                tracing::warn!(
                    template = %record.template_id,
                    build = %record.build_id,
                    "a template build was interrupted by the previous process's end"
                );
            }
            inner.records.insert(record.build_id.clone(), record);
        }
        Ok(Self { config, layout, inner: Mutex::new(inner) })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn save(&self, record: &BuildRecord) -> Result<(), ApiError> {
        records::write_json(&self.layout.record(record), record)
            .map_err(|e| ApiError::Internal(format!("cannot record the template build: {e}")))
    }

    /// The build `build_id` of `template` in `namespace`, or 404.
    fn record(
        &self,
        namespace: &str,
        template: &str,
        build_id: &str,
    ) -> Result<BuildRecord, ApiError> {
        self.lock()
            .records
            .get(build_id)
            .filter(|r| r.namespace == namespace && r.template_id == template)
            .cloned()
            .ok_or_else(|| {
                ApiError::NotFound(format!("Build {build_id} of template {template} not found"))
            })
    }

    /// 409 while a build of `template` runs (one at a time: the SDK user hears it at once
    /// rather than after uploading the build's files).
    fn check_idle(&self, namespace: &str, template: &str) -> Result<(), ApiError> {
        if self.lock().running.contains(&(namespace.to_owned(), template.to_owned())) {
            return Err(busy(template));
        }
        Ok(())
    }

    /// Whether `template` has any build in `namespace`.
    fn knows(&self, namespace: &str, template: &str) -> bool {
        self.lock().records.values().any(|r| r.namespace == namespace && r.template_id == template)
    }

    /// The log of a build: the live one of a waiting or running build (kept, appending to its
    /// file), else a finished build's entries read back from its file (not kept: no file stays
    /// open per finished build).
    fn log(&self, record: &BuildRecord) -> Result<BuildLog, ApiError> {
        if let Some(log) = self.lock().logs.get(&record.build_id) {
            return Ok(log.clone());
        }
        let path = self.layout.log(record);
        if matches!(record.status, BuildStatus::Ready | BuildStatus::Error) {
            return records::read_log(&path)
                .map(BuildLog::from_entries)
                .map_err(|e| ApiError::Internal(format!("cannot read the build's log: {e}")));
        }
        let log = records::read_log(&path)
            .and_then(|entries| Ok(BuildLog::persistent(entries, records::open_log(&path)?)))
            .map_err(|e| ApiError::Internal(format!("cannot read the build's log: {e}")))?;
        Ok(self.lock().logs.entry(record.build_id.clone()).or_insert(log).clone())
    }

    /// Runs `f` on the tags of a template, read from disk on first use; saves them after.
    fn with_tags<T>(
        &self,
        namespace: &str,
        template: &str,
        f: impl FnOnce(&mut Tags) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut inner = self.lock();
        let key = (namespace.to_owned(), template.to_owned());
        if !inner.tags.contains_key(&key) {
            let tags = self
                .layout
                .load_tags(namespace, template)
                .map_err(|e| ApiError::Internal(format!("cannot read the template's tags: {e}")))?;
            inner.tags.insert(key.clone(), tags);
        }
        let tags = inner.tags.entry(key).or_default();
        let before = tags.clone();
        let answer = f(tags)?;
        if *tags != before {
            records::write_json(&self.layout.tags(namespace, template), &*tags).map_err(|e| {
                ApiError::Internal(format!("cannot record the template's tags: {e}"))
            })?;
        }
        Ok(answer)
    }
}

/// The builds, or 501 when none are served here or the builder cannot run.
fn builds<S>(state: &AppState<S>) -> Result<&Arc<Builds>, ApiError> {
    state.template_builds.as_ref().ok_or_else(|| ApiError::NotImplemented(NO_BUILDER.into()))
}

/// The 409 of a second build of a template while one runs.
fn busy(template: &str) -> ApiError {
    ApiError::Conflict(format!(
        "a build of template {template} is running: wait for it to finish, then build again"
    ))
}

fn available(builds: &Builds) -> Result<(), ApiError> {
    builds.config.builder.available().map_err(ApiError::NotImplemented)
}

fn namespace_of(user: &User) -> String {
    user.namespace.clone().unwrap_or_else(|| ADMIN_NAMESPACE.to_owned())
}

fn bad_request(message: String) -> ApiError {
    ApiError::BadRequest(message)
}

/// The authenticated routes (merged into the API's router).
pub(super) fn router<S: Store>() -> Router<Arc<AppState<S>>> {
    Router::new()
        .route("/v3/templates", post(request_template::<S>))
        .route("/templates/{id}/files/{hash}", get(file_link::<S>))
        .route("/v2/templates/{id}/builds/{build}", post(start::<S>))
        .route("/templates/{id}/builds/{build}/status", get(status::<S>))
        .route(
            "/templates/{id}/builds/{build}/logs",
            get(|| async {
                ApiError::NotImplemented(
                    "build logs by cursor are not served by oka: read them from \
                     /templates/{id}/builds/{build}/status?logsOffset=N"
                        .into(),
                )
            }),
        )
        .route("/templates/tags", post(tags::assign_tags::<S>).delete(tags::remove_tags::<S>))
        .route("/templates/{id}/tags", get(tags::list_tags::<S>))
}

/// The unauthenticated upload route (its token is the credential).
pub(super) fn upload_router<S: Store>(state: Arc<AppState<S>>) -> Router {
    Router::new().route(&format!("{UPLOAD_PATH}/{{token}}"), put(upload::<S>)).with_state(state)
}

/// `POST /v3/templates`.
#[derive(Debug, Serialize)]
struct TemplateResponse {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

async fn request_template<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let builds = builds(&state)?;
    available(builds)?;
    let request: plan::TemplateRequest = parse_json(&body)?;
    if let Some(team) = request.team_id.as_deref().filter(|t| *t != user.team) {
        return Err(ApiError::BadRequest(format!(
            "teamID {team:?}: oka builds templates in the API key's own team ({:?})",
            user.team
        )));
    }
    let planned = plan::plan_template(&request).map_err(bad_request)?;
    let namespace = namespace_of(&user);
    check_owner(&state, &namespace, &planned.name).await?;
    builds.check_idle(&namespace, &planned.name)?;
    let record = BuildRecord {
        build_id: uuid::Uuid::new_v4().to_string(),
        template_id: planned.name.clone(),
        namespace,
        status: BuildStatus::Waiting,
        reason: None,
        created_at: Timestamp::now(),
        started_at: None,
        finished_at: None,
        cpu_count: planned.cpu_count,
        memory_mb: planned.memory_mb,
        tags: planned.tags.clone(),
        image: None,
    };
    builds.save(&record)?;
    builds.lock().records.insert(record.build_id.clone(), record.clone());
    let response = TemplateResponse {
        template_id: planned.name.clone(),
        build_id: record.build_id,
        public: false,
        names: vec![planned.name.clone()],
        tags: planned.tags,
        aliases: vec![planned.name],
    };
    Ok((StatusCode::ACCEPTED, axum::Json(response)).into_response())
}

/// 409 when `name` is a SandboxSet or SandboxTemplate that template builds did not write (a
/// pool made with kubectl, or `oka serve`'s own): a build must never replace it.
async fn check_owner<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    let refuse = |kind: &str| {
        ApiError::Conflict(format!(
            "template {name:?} exists as a {kind} that was not made by a template build (made \
             with kubectl, okactl or by oka itself): a build will not replace it; choose \
             another name"
        ))
    };
    if let Some(set) = state.index.sandbox_set(Some(namespace), name)
        && !plan::written_by_builds(&set.metadata)
    {
        return Err(refuse("SandboxSet"));
    }
    match state.store.get::<SandboxTemplate>(namespace, name).await {
        Ok(template) if !plan::written_by_builds(&template.metadata) => {
            Err(refuse("SandboxTemplate"))
        }
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(ApiError::Internal(format!("cannot read the SandboxTemplate: {e}"))),
    }
}

/// `GET /templates/{id}/files/{hash}`.
#[derive(Debug, Serialize)]
struct FileLink {
    present: bool,
    url: String,
}

async fn file_link<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    headers: http::HeaderMap,
    Path((id, hash)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let builds = builds(&state)?;
    plan::check_name(&id).map_err(bad_request)?;
    plan::check_files_hash(&hash).map_err(bad_request)?;
    let namespace = namespace_of(&user);
    if !builds.knows(&namespace, &id) {
        return Err(ApiError::NotFound(format!("Template not found: {id}")));
    }
    let present = tokio::fs::try_exists(builds.layout.upload(&namespace, &hash))
        .await
        .map_err(|e| ApiError::Internal(format!("cannot look for the uploaded files: {e}")))?;
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    {
        let mut inner = builds.lock();
        let now = Instant::now();
        inner.uploads.retain(|_, u| u.expires > now);
        inner.uploads.insert(
            token.clone(),
            PendingUpload { namespace, hash, expires: now + UPLOAD_LINK_TTL },
        );
    }
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|v| *v == "https" || *v == "http")
        .unwrap_or("http");
    let prefix = if context.customized { super::KRUISE_PREFIX } else { "" };
    let url = format!("{scheme}://{}{prefix}{UPLOAD_PATH}/{token}", context.host);
    Ok((StatusCode::CREATED, axum::Json(FileLink { present, url })).into_response())
}

/// `PUT /template-files/{token}`: the body, stored as the link's files.
async fn upload<S: Store>(
    State(state): AppStateRef<S>,
    Path(token): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let builds = builds(&state)?;
    let pending = {
        let mut inner = builds.lock();
        inner.uploads.remove(&token).filter(|u| u.expires > Instant::now())
    };
    let Some(pending) = pending else {
        return Err(ApiError::Forbidden(
            "the upload link is unknown, used or expired: ask for a new one \
             (GET /templates/{id}/files/{hash})"
                .into(),
        ));
    };
    let dir = builds.layout.uploads(&pending.namespace);
    let internal = |e: std::io::Error| ApiError::Internal(format!("cannot store the upload: {e}"));
    tokio::fs::create_dir_all(&dir).await.map_err(internal)?;
    let partial = dir.join(format!(".{}.{}.partial", pending.hash, uuid::Uuid::new_v4().simple()));
    let written = write_body(&partial, body, builds.config.max_upload_bytes).await;
    if let Err(error) = written {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(error);
    }
    let target = builds.layout.upload(&pending.namespace, &pending.hash);
    if let Err(error) = tokio::fs::rename(&partial, &target).await {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(internal(error));
    }
    tracing::info!(hash = %pending.hash, namespace = %pending.namespace, "stored a template build's files");
    Ok(StatusCode::OK.into_response())
}

async fn write_body(path: &std::path::Path, body: Body, limit: u64) -> Result<(), ApiError> {
    let internal = |e: std::io::Error| ApiError::Internal(format!("cannot store the upload: {e}"));
    let mut file = tokio::fs::File::create(path).await.map_err(internal)?;
    let mut stream = body.into_data_stream();
    let mut size: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::BadRequest(format!("the upload was cut short: {e}")))?;
        size = size.saturating_add(chunk.len() as u64);
        if size > limit {
            return Err(ApiError::BadRequest(format!(
                "the upload is larger than the limit of {limit} bytes"
            )));
        }
        file.write_all(&chunk).await.map_err(internal)?;
    }
    file.sync_all().await.map_err(internal)?;
    Ok(())
}

/// `POST /v2/templates/{id}/builds/{build}`.
async fn start<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path((id, build_id)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let builds = Arc::clone(builds(&state)?);
    available(&builds)?;
    let namespace = namespace_of(&user);
    let mut record = builds.record(&namespace, &id, &build_id)?;
    let request: plan::StartRequest = parse_json(&body)?;
    let planned = plan::plan_start(&request).map_err(bad_request)?;
    if record.status != BuildStatus::Waiting {
        return Err(ApiError::Conflict(format!(
            "build {build_id} of template {id} was already started (it is {}); request a new \
             build (POST /v3/templates)",
            serde_json::to_value(record.status).unwrap_or_default().as_str().unwrap_or_default()
        )));
    }
    let build_request = resolve(&state, &builds, &record, &planned).await?;
    {
        let mut inner = builds.lock();
        let key = (namespace.clone(), id.clone());
        if inner.running.contains(&key) {
            return Err(busy(&id));
        }
        if inner.records.get(&build_id).is_some_and(|r| r.status != BuildStatus::Waiting) {
            return Err(ApiError::Conflict(format!("build {build_id} was already started")));
        }
        inner.running.insert(key);
        record.status = BuildStatus::Building;
        record.started_at = Some(Timestamp::now());
        inner.records.insert(build_id.clone(), record.clone());
    }
    let log = match builds.save(&record).and_then(|()| builds.log(&record)) {
        Ok(log) => log,
        Err(error) => {
            finish(&builds, &record, Err(BuildFailure::new(error.to_string())), None);
            return Err(error);
        }
    };
    tokio::spawn(run(Arc::clone(&state), builds, record, build_request, log));
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The builder's request: the base template resolved to its image, each COPY to its upload.
async fn resolve<S: Store>(
    state: &AppState<S>,
    builds: &Builds,
    record: &BuildRecord,
    planned: &PlannedStart,
) -> Result<BuildRequest, ApiError> {
    let template_image = match &planned.base {
        PlannedBase::Template(name) => {
            let set = state.index.sandbox_set(Some(&record.namespace), name).or_else(|| {
                // `base` is oka's own template, wherever oka serve keeps it.
                (name == "base").then(|| state.index.sandbox_set(None, name)).flatten()
            });
            let Some(set) = set else {
                // One oka serve is still building (its default templates) answers as such.
                if let Some(pending) = &state.config.pending_templates {
                    pending.check(name)?;
                }
                return Err(ApiError::BadRequest(format!(
                    "fromTemplate: template {name:?} not found"
                )));
            };
            let image = state.index.with_pod_template(
                set.metadata.namespace.as_deref(),
                set.spec.template.as_ref(),
                set.spec.template_ref.as_ref(),
                |pod| {
                    pod.map(|pod| {
                        pod.spec
                            .as_ref()
                            .and_then(|s| s.containers.first())
                            .and_then(|c| c.image.clone())
                    })
                },
            );
            let Some(image) = image else {
                return Err(ApiError::BadRequest(format!(
                    "fromTemplate: the pod template of template {name:?} is not known yet"
                )));
            };
            image
        }
        PlannedBase::Image { .. } => None,
    };
    let mut steps = Vec::with_capacity(planned.steps.len());
    for (index, step) in planned.steps.iter().enumerate() {
        let files = match &step.files_hash {
            Some(hash) => {
                let path = builds.layout.upload(&record.namespace, hash);
                let present = tokio::fs::try_exists(&path).await.unwrap_or(false);
                if !present {
                    return Err(ApiError::BadRequest(format!(
                        "step {} (COPY {}): its files (hash {hash}) were never uploaded: \
                         upload them first (GET /templates/{}/files/{hash})",
                        index + 1,
                        step.args.first().map(String::as_str).unwrap_or_default(),
                        record.template_id
                    )));
                }
                Some(path)
            }
            None => None,
        };
        steps.push(BuildStep {
            kind: step.kind.clone(),
            args: step.args.clone(),
            files,
            force: step.force,
        });
    }
    Ok(BuildRequest {
        template_id: record.template_id.clone(),
        build_id: record.build_id.clone(),
        namespace: record.namespace.clone(),
        base: plan::build_base(&planned.base, template_image),
        steps,
        start_cmd: planned.start_cmd.clone(),
        ready_cmd: planned.ready_cmd.clone(),
        force: planned.force,
        cpu_count: record.cpu_count,
        memory_mb: record.memory_mb,
    })
}

/// Runs one build to its end: the builder, then the template and its pool.
async fn run<S: Store>(
    state: Arc<AppState<S>>,
    builds: Arc<Builds>,
    record: BuildRecord,
    request: BuildRequest,
    log: BuildLog,
) {
    log.info(format!("Building template {} (build {})", record.template_id, record.build_id));
    let builder = Arc::clone(&builds.config.builder);
    let (task_request, task_log) = (request.clone(), log.clone());
    // Its own task, so a builder that panics fails the build instead of leaving it running.
    let built = tokio::spawn(async move { builder.build(task_request, task_log).await })
        .await
        .unwrap_or_else(|e| Err(BuildFailure::new(format!("the template builder crashed: {e}"))));
    let result = match built {
        Ok(output) => {
            log.info(format!("Built image {}; starting the template's sandboxes", output.image));
            publish::publish(&state, &builds, &request, &output).await.map(|()| output)
        }
        Err(failure) => Err(failure),
    };
    match &result {
        Ok(_) => log.info(format!(
            "Template {} is ready: create sandboxes from it by its name",
            record.template_id
        )),
        Err(failure) => log.error(format!("Build failed: {}", failure.message)),
    }
    let image = result.as_ref().ok().map(|o| o.image.clone());
    finish(&builds, &record, result.map(|_| ()), image);
}

/// Records a build's end, tags it when it succeeded, and frees its template for the next.
fn finish(
    builds: &Builds,
    record: &BuildRecord,
    result: Result<(), BuildFailure>,
    image: Option<String>,
) {
    let mut record = record.clone();
    let now = Timestamp::now();
    record.finished_at = Some(now);
    record.image = image;
    match result {
        Ok(()) => {
            record.status = BuildStatus::Ready;
            let assigned = builds.with_tags(&record.namespace, &record.template_id, |tags| {
                for tag in &record.tags {
                    tags.insert(
                        tag.clone(),
                        TagRecord { build_id: record.build_id.clone(), created_at: now },
                    );
                }
                Ok(())
            });
            if let Err(error) = assigned {
                tracing::warn!(%error, build = %record.build_id, "cannot tag a finished build");
            }
        }
        Err(failure) => {
            record.status = BuildStatus::Error;
            record.reason = Some(Reason { message: failure.message, step: failure.step });
        }
    }
    if let Err(error) = builds.save(&record) {
        tracing::warn!(%error, build = %record.build_id, "cannot record a finished build");
    }
    let (namespace, template) = (record.namespace.clone(), record.template_id.clone());
    {
        let mut inner = builds.lock();
        inner.running.remove(&(namespace.clone(), template.clone()));
        // Its log is on file, whole: later reads come from there.
        inner.logs.remove(&record.build_id);
        inner.records.insert(record.build_id.clone(), record);
    }
    forget_old_builds(builds, &namespace, &template);
}

/// Forgets the finished builds of a template beyond [`records::KEPT_BUILDS`] (never a tagged
/// one): their records and logs.
fn forget_old_builds(builds: &Builds, namespace: &str, template: &str) {
    let tags = builds.with_tags(namespace, template, |tags| Ok(tags.clone())).unwrap_or_default();
    let tagged: HashSet<&str> = tags.values().map(|t| t.build_id.as_str()).collect();
    let forgotten: Vec<BuildRecord> = {
        let mut inner = builds.lock();
        let of_template = inner
            .records
            .values()
            .filter(|r| r.namespace == namespace && r.template_id == template);
        let ids: Vec<String> =
            records::builds_to_forget(of_template, &tagged, records::KEPT_BUILDS)
                .into_iter()
                .map(|r| r.build_id.clone())
                .collect();
        ids.iter().filter_map(|id| inner.records.remove(id)).collect()
    };
    for record in forgotten {
        for path in [builds.layout.record(&record), builds.layout.log(&record)] {
            if let Err(error) = std::fs::remove_file(&path)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(%error, path = %path.display(), "cannot remove an old build's file");
            }
        }
    }
}

/// `DELETE /templates/{id}` of a built template: its SandboxSet and SandboxTemplate, its build
/// records, logs and tags (uploads stay: they are shared by content). 409 while a build of it
/// runs; 501 where builds are not served.
pub(super) async fn delete_template<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
) -> Result<(), ApiError> {
    let builds = builds(state)?;
    let namespace = namespace_of(user);
    {
        let inner = builds.lock();
        if inner.running.contains(&(namespace.clone(), id.to_owned())) {
            return Err(ApiError::Conflict(format!(
                "a build of template {id} is running: wait for it to finish, then delete it"
            )));
        }
    }
    let internal = |e: StoreError| ApiError::Internal(format!("cannot delete template {id}: {e}"));
    for deleted in [
        state.store.delete::<SandboxSet>(&namespace, id, &Preconditions::default()).await.map(drop),
        state
            .store
            .delete::<SandboxTemplate>(&namespace, id, &Preconditions::default())
            .await
            .map(drop),
    ] {
        match deleted {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(internal(e)),
        }
    }
    let mut inner = builds.lock();
    inner.records.retain(|_, r| !(r.namespace == namespace && r.template_id == id));
    inner.tags.remove(&(namespace.clone(), id.to_owned()));
    match std::fs::remove_dir_all(builds.layout.template(&namespace, id)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ApiError::Internal(format!("cannot delete the builds of {id}: {e}"))),
    }
}

/// `GET …/status` query.
#[derive(Debug, Deserialize)]
struct StatusQuery {
    #[serde(default, rename = "logsOffset")]
    logs_offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    level: Option<LogLevel>,
}

/// `TemplateBuildInfo`.
#[derive(Debug, Serialize)]
struct StatusResponse {
    #[serde(rename = "buildID")]
    build_id: String,
    #[serde(rename = "templateID")]
    template_id: String,
    status: BuildStatus,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
    logs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<ReasonJson>,
}

#[derive(Debug, Serialize)]
struct ReasonJson {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
}

fn severity(level: LogLevel) -> u8 {
    match level {
        LogLevel::Debug => 0,
        LogLevel::Info => 1,
        LogLevel::Warn => 2,
        LogLevel::Error => 3,
    }
}

async fn status<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path((id, build_id)): Path<(String, String)>,
    Query(query): Query<StatusQuery>,
) -> Result<axum::Json<StatusResponse>, ApiError> {
    let builds = builds(&state)?;
    let record = builds.record(&namespace_of(&user), &id, &build_id)?;
    let log = builds.log(&record)?;
    let minimum = query.level.map_or(0, severity);
    let entries: Vec<LogEntry> =
        log.entries_from(0).into_iter().filter(|e| severity(e.level) >= minimum).collect();
    let limit = query.limit.unwrap_or(STATUS_PAGE).clamp(1, STATUS_PAGE);
    let page: Vec<LogEntry> =
        entries.iter().skip(query.logs_offset.unwrap_or(0)).take(limit).cloned().collect();
    let logs = page.iter().map(|e| format!("[{}] {}", e.timestamp, e.message)).collect();
    let reason = record.reason.map(|reason| ReasonJson {
        message: reason.message,
        step: reason.step,
        log_entries: entries.iter().filter(|e| e.level == LogLevel::Error).cloned().collect(),
    });
    Ok(axum::Json(StatusResponse {
        build_id: record.build_id,
        template_id: record.template_id,
        status: record.status,
        log_entries: page,
        logs,
        reason,
    }))
}
