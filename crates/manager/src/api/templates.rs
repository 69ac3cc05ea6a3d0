//! Templates and snapshots: `GET /templates`, `GET /templates/{id}`, `DELETE /templates/{id}`,
//! `POST /sandboxes/{id}/snapshots`, `GET /snapshots`.
//!
//! # Model (the reference's)
//!
//! - A **template** is a SandboxSet (warm pool): `templateID` = its name. Teams see those of
//!   their namespace, the admin team all.
//! - A **snapshot** is a Checkpoint; its ID is the Checkpoint's `status.checkpointId`. Creating
//!   one writes a Checkpoint (`generateName: <sandbox>-`, annotations
//!   `init-runtime-request`, `owner`, `sandbox-id`; labels `owner`, `sandbox-name`; spec
//!   `sandboxName`, `podName`, `keepRunning`, `ttlAfterFinished`, `persistentContents`) and a
//!   SandboxTemplate of the same name owned by it (the sandbox's template, to clone from), then
//!   waits for the Checkpoint to succeed (the `x-e2b-kruise-snapshot-wait-success-seconds`
//!   header, default 50 s, within the SDKs' request timeout) and answers `201 {"snapshotID", "names"}`. A `name` in the body is
//!   kept as the annotation `agents.kruise.io/snapshot-name`: `names` holds it, `GET
//!   /snapshots?name=` filters by it, and a create may name the snapshot by it; `memory: false`
//!   keeps the files only (persistent contents `filesystem`).
//!
//! # Where this differs from the reference, and why
//!
//! - Without a checkpoint controller on this node ([`SnapshotConfig::enabled`] off, the default
//!   of the library; `oka serve` turns it on with a runtime, whose checkpoint controller is
//!   `oka_controller::checkpoint`), creating a snapshot answers 501 at once and writes nothing,
//!   instead of writing a Checkpoint nobody processes and failing after a minute.
//! - Creating a sandbox from a snapshot (`templateID` = a snapshot ID) is
//!   `ClaimEngine::create_from_snapshot` (`create.rs`): a claimed Sandbox from the snapshot's
//!   SandboxTemplate, annotated `agents.kruise.io/restore-from`, with the snapshot's envd
//!   access token (the restored agent runtime keeps it, as in the reference).
//! - A sandbox that runs as a Pod (the Pod runtime, on a cluster) has no node agent to
//!   checkpoint it: a snapshot of it (and a fork) answers 400 at once, naming the annotation
//!   that puts a sandbox on the node runtime ([`refuse_pod_sandbox`]), instead of a Checkpoint
//!   nobody takes.
//! - `DELETE /templates/{id}` of an unknown ID is 404 (the SDK's `False`), not 204; of a
//!   SandboxSet it is 400, not 401 (it is not an authentication failure).
//! - A snapshot that does not succeed in time is deleted (with its template) before the error
//!   is answered: nothing half-created is left behind.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use oka_api::checkpoint::CHECKPOINT_KIND;
use oka_api::quantity::Rounding;
use oka_api::{
    Checkpoint, CheckpointPhase, CheckpointSpec, Sandbox, SandboxSet, SandboxTemplate,
    SandboxTemplateSpec, annotations, labels,
};
use oka_store::{Preconditions, Selector, Store, StoreError, WatchEvent};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::models::template_resources;
use super::sandboxes::{Cursor, decode_cursor, encode_cursor, owned_sandbox};
use super::{ApiError, AppState, User};

/// The `envdVersion` templates report (the reference's constant).
pub const TEMPLATE_ENVD_VERSION: &str = "0.1.1";
/// The default wait for a snapshot to succeed: within the SDKs' 60 s request timeout.
pub const DEFAULT_SNAPSHOT_WAIT: Duration = Duration::from_secs(50);

/// Settings of snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotConfig {
    /// Whether a checkpoint controller processes Checkpoints on this node. Default false:
    /// creating a snapshot answers 501.
    pub enabled: bool,
    /// Whether the machine can take them right now (CRIU), asked at each snapshot and fork;
    /// `None`: always.
    pub gate: Option<SnapshotGate>,
}

impl SnapshotConfig {
    /// 501 with the gate's reason (which names the missing feature and how to turn it on)
    /// when snapshots cannot be taken on this machine right now.
    pub(super) fn check_available(&self) -> Result<(), ApiError> {
        match &self.gate {
            Some(gate) => (gate.0)().map_err(ApiError::NotImplemented),
            None => Ok(()),
        }
    }
}

/// A question asked before each snapshot or fork: `Ok` when the machine can take one now,
/// else why not. It is asked each time because the answer can change while the process runs
/// (a feature installed in the background).
#[derive(Clone)]
pub struct SnapshotGate(Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl SnapshotGate {
    /// A gate that asks `available`.
    pub fn new(available: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> Self {
        SnapshotGate(Arc::new(available))
    }
}

impl std::fmt::Debug for SnapshotGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotGate")
    }
}

impl PartialEq for SnapshotGate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SnapshotGate {}

/// Why a template that has no pool yet cannot be created from: asked by the create path when
/// the template ID names no pool and no snapshot, so a template still being built on this
/// machine (`oka serve`'s default templates on their first start) is answered as such.
#[derive(Clone)]
pub struct PendingTemplates(Arc<PendingQuestion>);

/// The question [`PendingTemplates`] asks: a template ID's pending state, if any.
type PendingQuestion = dyn Fn(&str) -> Option<PendingTemplate> + Send + Sync;

/// A template that is not there yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingTemplate {
    /// Being built: 503 with `Retry-After: retry_after_secs` and `message`.
    Building {
        /// What the client is told (how far the build is).
        message: String,
        /// When to ask again, in seconds.
        retry_after_secs: u64,
    },
    /// Its build failed: 503 with `message` (why, and what to do).
    Failed(String),
}

impl PendingTemplates {
    /// Asks `pending` with a template ID.
    pub fn new(pending: impl Fn(&str) -> Option<PendingTemplate> + Send + Sync + 'static) -> Self {
        PendingTemplates(Arc::new(pending))
    }

    /// The error for `template_id`, when it is pending.
    pub(super) fn check(&self, template_id: &str) -> Result<(), ApiError> {
        match (self.0)(template_id) {
            None => Ok(()),
            Some(PendingTemplate::Building { message, retry_after_secs }) => {
                Err(ApiError::PoolExhausted { message, retry_after_secs })
            }
            Some(PendingTemplate::Failed(message)) => Err(ApiError::Unavailable(message)),
        }
    }
}

impl std::fmt::Debug for PendingTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingTemplates")
    }
}

impl PartialEq for PendingTemplates {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PendingTemplates {}

type AppStateRef<S> = State<Arc<AppState<S>>>;

/// `TemplateInfo` (and, with `builds`, `Template`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateJson {
    /// The SandboxSet's name.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Its one build: a UUID ([`build_id`]).
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// CPUs of the first container.
    #[serde(rename = "cpuCount")]
    pub cpu_count: i64,
    /// Memory MiB of the first container.
    #[serde(rename = "memoryMB")]
    pub memory_mb: i64,
    /// Disk MiB of the first container.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: i64,
    /// Always true.
    pub public: bool,
    /// `[name]`.
    pub aliases: Vec<String>,
    /// `[name]`.
    pub names: Vec<String>,
    /// The SandboxSet's creation time.
    #[serde(rename = "createdAt")]
    pub created_at: String,
    /// The same.
    #[serde(rename = "updatedAt")]
    pub updated_at: String,
    /// Always null.
    #[serde(rename = "createdBy")]
    pub created_by: Option<String>,
    /// Always null.
    #[serde(rename = "lastSpawnedAt")]
    pub last_spawned_at: Option<String>,
    /// Always 0.
    #[serde(rename = "spawnCount")]
    pub spawn_count: i64,
    /// Always 1.
    #[serde(rename = "buildCount")]
    pub build_count: i64,
    /// [`TEMPLATE_ENVD_VERSION`].
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// `ready`, or `deleting`.
    #[serde(rename = "buildStatus")]
    pub build_status: String,
    /// `Template` only: one build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builds: Option<Vec<serde_json::Value>>,
}

/// The `buildID` of a pool's one build: a UUID, as E2B's build IDs are (SDKs and tools may
/// parse it), stable for the pool's life: its object's `uid`, else one derived from its name.
fn build_id(set: &SandboxSet) -> String {
    if let Some(uid) = set.metadata.uid.as_deref().and_then(|u| uuid::Uuid::parse_str(u).ok()) {
        return uid.to_string();
    }
    let key = format!(
        "{}/{}",
        set.metadata.namespace.as_deref().unwrap_or_default(),
        set.metadata.name.as_deref().unwrap_or_default()
    );
    let digest = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid().to_string()
}

fn template_json(index: &crate::Index, set: &SandboxSet, with_builds: bool) -> TemplateJson {
    let name = set.metadata.name.clone().unwrap_or_default();
    let build_id = build_id(set);
    let (cpu, memory, mut disk) = index.with_pod_template(
        set.metadata.namespace.as_deref(),
        set.spec.template.as_ref(),
        set.spec.template_ref.as_ref(),
        template_resources,
    );
    for claim in set.spec.volume_claim_templates.iter().flatten() {
        let storage = claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| oka_api::quantity::parse(&q.0).ok())
            .and_then(|q| q.in_units_of(super::models::MIB, Rounding::Down).ok())
            .and_then(|mib| i64::try_from(mib).ok());
        disk += storage.unwrap_or(0);
    }
    let created =
        set.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
    let status = if set.metadata.deletion_timestamp.is_some() { "deleting" } else { "ready" };
    let builds = with_builds.then(|| {
        vec![serde_json::json!({
            "buildID": build_id, "status": status, "createdAt": created, "updatedAt": created,
            "cpuCount": cpu, "memoryMB": memory, "finishedAt": created, "diskSizeMB": disk,
            "envdVersion": TEMPLATE_ENVD_VERSION,
        })]
    });
    TemplateJson {
        template_id: name.clone(),
        build_id,
        cpu_count: cpu,
        memory_mb: memory,
        disk_size_mb: disk,
        public: true,
        aliases: vec![name.clone()],
        names: vec![name],
        created_at: created.clone(),
        updated_at: created,
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        build_count: 1,
        envd_version: TEMPLATE_ENVD_VERSION.into(),
        build_status: status.into(),
        builds,
    }
}

/// `GET /templates`: the SandboxSets the caller's team sees.
pub(super) async fn list<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
) -> Json<Vec<TemplateJson>> {
    let sets = state.index.sandbox_sets(user.namespace.as_deref());
    Json(sets.iter().map(|set| template_json(&state.index, set, false)).collect())
}

/// `GET /templates/{id}`: 404 `Template not found: <id>`.
pub(super) async fn get<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<Json<TemplateJson>, ApiError> {
    let set = state
        .index
        .sandbox_set(user.namespace.as_deref(), &id)
        .ok_or_else(|| ApiError::NotFound(format!("Template not found: {id}")))?;
    Ok(Json(template_json(&state.index, &set, true)))
}

/// `GET /templates/aliases/{alias}` (the SDKs' `Template.exists`): 200
/// `{"templateID", "public"}` when the caller sees a SandboxSet or a snapshot of that name, else
/// 404.
pub(super) async fn alias<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(alias): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let set = state.index.sandbox_set(user.namespace.as_deref(), &alias);
    let found = match set {
        Some(_) => true,
        None => find_checkpoint(&state, &user, &alias).await?.is_some(),
    };
    if !found {
        return Err(ApiError::NotFound(format!("Template alias not found: {alias}")));
    }
    Ok(Json(serde_json::json!({"templateID": alias, "public": false})))
}

/// Whether the caller's team sees this checkpoint.
fn sees(user: &User, checkpoint: &Checkpoint) -> bool {
    // One being deleted is gone for the caller (its finalizer removes the images meanwhile).
    if checkpoint.metadata.deletion_timestamp.is_some() {
        return false;
    }
    match user.namespace.as_deref() {
        None => true,
        Some(ns) => checkpoint.metadata.namespace.as_deref() == Some(ns),
    }
}

fn checkpoint_id(checkpoint: &Checkpoint) -> Option<&str> {
    checkpoint.status.as_ref()?.checkpoint_id.as_deref().filter(|id| !id.is_empty())
}

/// The caller's Checkpoint whose `status.checkpointId` is `id`, else the newest one named `id`.
pub(super) async fn find_checkpoint<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
) -> Result<Option<Arc<Checkpoint>>, ApiError> {
    let list = state
        .store
        .list::<Checkpoint>(user.namespace.as_deref(), &Selector::everything())
        .await
        .map_err(|e| ApiError::Internal(format!("Failed to list snapshots: {e}")))?;
    let mut seen = list.items.into_iter().filter(|c| sees(user, c) && checkpoint_id(c).is_some());
    let (by_id, by_name): (Vec<_>, Vec<_>) = seen
        .by_ref()
        .filter(|c| checkpoint_id(c) == Some(id) || snapshot_name(c) == Some(id))
        .partition(|c| checkpoint_id(c) == Some(id));
    Ok(by_id.into_iter().next().or_else(|| {
        by_name.into_iter().max_by_key(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0))
    }))
}

/// `DELETE /templates/{id}`: deletes the snapshot `id` (its Checkpoint and SandboxTemplate).
pub(super) async fn delete<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if let Some(set) = state.index.sandbox_set(user.namespace.as_deref(), &id) {
        if super::builds::plan::written_by_builds(&set.metadata) {
            super::builds::delete_template(&state, &user, &id).await?;
            info!(template = %id, "built template deleted");
            return Ok(StatusCode::NO_CONTENT);
        }
        return Err(ApiError::BadRequest(format!(
            "Template {id} is a SandboxSet: deleting it through the E2B API is not supported"
        )));
    }
    let checkpoint = find_checkpoint(&state, &user, &id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("Template not found: {id}")))?;
    delete_snapshot_objects(&state, &checkpoint)
        .await
        .map_err(|e| ApiError::Internal(format!("Failed to delete snapshot {id}: {e}")))?;
    info!(snapshot = %id, "snapshot deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a Checkpoint and the SandboxTemplate of the same name (gone already is fine).
pub(super) async fn delete_snapshot_objects<S: Store>(
    state: &AppState<S>,
    checkpoint: &Checkpoint,
) -> Result<(), StoreError> {
    let namespace = checkpoint.metadata.namespace.clone().unwrap_or_default();
    let name = checkpoint.metadata.name.clone().unwrap_or_default();
    let none = Preconditions::default();
    for result in [
        state.store.delete::<SandboxTemplate>(&namespace, &name, &none).await.map(|_| ()),
        state.store.delete::<Checkpoint>(&namespace, &name, &none).await.map(|_| ()),
    ] {
        match result {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// `POST /sandboxes/{id}/snapshots` body.
#[derive(Debug, Default, Deserialize)]
struct SnapshotRequest {
    /// A name for the snapshot, by which a create may name it too.
    #[serde(default)]
    name: Option<String>,
    /// Keep the memory (`true`, the default) or only the files.
    #[serde(default)]
    memory: Option<bool>,
}

/// `SnapshotInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotJson {
    /// The Checkpoint's `status.checkpointId`.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// The snapshot's name, when it was given one (never null: E2B's description).
    pub names: Vec<String>,
}

impl SnapshotJson {
    fn of(checkpoint: &Checkpoint, snapshot_id: String) -> Self {
        Self {
            snapshot_id,
            names: snapshot_name(checkpoint).map(str::to_owned).into_iter().collect(),
        }
    }
}

/// The name a snapshot was given at its creation.
fn snapshot_name(checkpoint: &Checkpoint) -> Option<&str> {
    checkpoint.metadata.annotations.as_ref()?.get(annotations::SNAPSHOT_NAME).map(String::as_str)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

fn bad_extension(what: &str) -> ApiError {
    ApiError::BadRequest(format!("Bad extension param: {what}"))
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{"snapshotID", "names"}` once the Checkpoint
/// succeeded.
pub(super) async fn create_snapshot<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: SnapshotRequest = super::sandboxes::parse_optional_json(&body)?;
    let name = request.name.filter(|n| !n.is_empty());
    let keep_running = match header(&headers, "x-e2b-kruise-snapshot-keep-running") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => return Err(bad_extension(&format!("invalid keep-running {other:?}"))),
    };
    let ttl = match header(&headers, "x-e2b-kruise-snapshot-ttl") {
        None => None,
        Some(ttl) => {
            oka_api::parse_go_duration(ttl)
                .map_err(|e| bad_extension(&format!("invalid snapshot-ttl: {e}")))?;
            Some(ttl.to_owned())
        }
    };
    let contents = match header(&headers, "x-e2b-kruise-snapshot-persistent-contents") {
        None => None,
        Some(list) => {
            let items: Vec<String> = list.split(',').map(|p| p.trim().to_owned()).collect();
            if let Some(bad) =
                items.iter().find(|p| !["memory", "filesystem"].contains(&p.as_str()))
            {
                return Err(bad_extension(&format!("invalid persistent content {bad:?}")));
            }
            Some(items)
        }
    }
    .or_else(|| (request.memory == Some(false)).then(|| vec!["filesystem".to_owned()]));
    let wait = match header(&headers, "x-e2b-kruise-snapshot-wait-success-seconds") {
        None => DEFAULT_SNAPSHOT_WAIT,
        Some(text) => Duration::from_secs(
            text.parse::<u64>()
                .map_err(|_| bad_extension(&format!("invalid wait-success-seconds {text:?}")))?,
        ),
    };
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    if visible != oka_api::SandboxState::Running || sandbox.is_paused() {
        return Err(ApiError::BadRequest(format!("Sandbox {id} is not running")));
    }
    refuse_pod_sandbox(&state, &sandbox, &id, "snapshots")?;
    if !state.config.snapshots.enabled {
        return Err(ApiError::NotImplemented(format!(
            "Failed to create snapshot of sandbox {id}: no checkpoint controller runs on this node yet"
        )));
    }
    state.config.snapshots.check_available()?;
    let mut checkpoint = new_checkpoint(&sandbox, &user, &id, keep_running, ttl, contents);
    if let Some(name) = name {
        checkpoint
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::SNAPSHOT_NAME.into(), name);
    }
    let (done, snapshot_id) = take_snapshot(&state, &sandbox, &id, &checkpoint, wait).await?;
    let body = SnapshotJson::of(&done, snapshot_id);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// 400 when `sandbox` (public ID `id`) runs as a Pod (the rule of
/// [`oka_api::runtime_choice::sandbox_runtime`] with the cluster's default): `what` (snapshots,
/// forks) needs a node agent's checkpoint, which a Pod does not have. Nothing is written.
pub(super) fn refuse_pod_sandbox<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
    id: &str,
    what: &str,
) -> Result<(), ApiError> {
    use oka_api::runtime_choice::{SandboxRuntime, sandbox_runtime};
    let Some(default) = state.config.cluster_default_runtime else { return Ok(()) };
    let runtime = state.index.with_pod_template(
        sandbox.metadata.namespace.as_deref(),
        sandbox.spec.template.as_ref(),
        sandbox.spec.template_ref.as_ref(),
        |template| sandbox_runtime(sandbox, template, default),
    );
    if runtime != SandboxRuntime::Pod {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!(
        "sandbox {id} runs as a Pod: {what} need the node runtime (annotation {}: {})",
        annotations::RUNTIME,
        annotations::RUNTIME_NODE
    )))
}

/// Writes `checkpoint` of `sandbox` (public ID `id`) and the SandboxTemplate to clone it from,
/// and waits up to `wait` until the checkpoint controller took it; returns the Checkpoint and
/// its ID (the snapshot ID). A snapshot that fails or is late is deleted before the error is
/// answered: nothing half-created is left behind.
pub(super) async fn take_snapshot<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
    id: &str,
    checkpoint: &Checkpoint,
    wait: Duration,
) -> Result<(Arc<Checkpoint>, String), ApiError> {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let internal = |e: StoreError| ApiError::Internal(format!("Failed to create snapshot: {e}"));
    let mut checkpoint = checkpoint.clone();
    oka_telemetry::context::inject(&mut checkpoint.metadata);
    let created = state.store.create(&namespace, &checkpoint).await.map_err(internal)?;
    let outcome = async {
        let template = snapshot_template(state, sandbox, &created).await?;
        state.store.create(&namespace, &template).await?;
        wait_succeeded(state, &created, wait).await
    }
    .await;
    let done = match outcome {
        Ok(Ok(done)) => done,
        failed => {
            let why = match failed {
                Ok(Err(why)) => why,
                Err(error) => error.to_string(),
                Ok(Ok(_)) => String::new(),
            };
            warn!(sandbox = %id, %why, "snapshot failed; deleting its objects");
            if let Err(error) = delete_snapshot_objects(state, &created).await {
                warn!(sandbox = %id, %error, "cannot delete the failed snapshot's objects");
            }
            return Err(ApiError::Internal(format!("Failed to create snapshot: {why}")));
        }
    };
    let snapshot_id = checkpoint_id(&done).unwrap_or_default().to_owned();
    // Best effort: mirror the ID in a label.
    let mut labelled = (*done).clone();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::CHECKPOINT_ID.into(), snapshot_id.clone());
    if let Err(error) = state.store.update(&namespace, &labelled).await {
        warn!(%error, "cannot label the checkpoint with its ID");
    }
    info!(sandbox = %id, snapshot = %snapshot_id, "snapshot created");
    Ok((done, snapshot_id))
}

pub(super) fn new_checkpoint(
    sandbox: &Sandbox,
    user: &User,
    id: &str,
    keep_running: Option<bool>,
    ttl: Option<String>,
    contents: Option<Vec<String>>,
) -> Checkpoint {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let notes = sandbox.metadata.annotations.as_ref();
    let mut checkpoint_notes = std::collections::BTreeMap::from([
        (annotations::OWNER.to_owned(), user.id.clone()),
        (annotations::SANDBOX_ID.to_owned(), id.to_owned()),
    ]);
    if let Some(request) = notes.and_then(|a| a.get(annotations::INIT_RUNTIME_REQUEST)) {
        checkpoint_notes.insert(annotations::INIT_RUNTIME_REQUEST.into(), request.clone());
    }
    let mut checkpoint_labels = std::collections::BTreeMap::from([
        (labels::OWNER.to_owned(), user.id.clone()),
        (labels::SANDBOX_NAME.to_owned(), name.clone()),
    ]);
    // On a cluster of node agents, the snapshot is taken (and kept) on the sandbox's node.
    if let Some(node) = sandbox.metadata.labels.as_ref().and_then(|l| l.get(labels::NODE_NAME)) {
        checkpoint_labels.insert(labels::NODE_NAME.to_owned(), node.clone());
    }
    let mut checkpoint = Checkpoint::new(
        "",
        CheckpointSpec {
            sandbox_name: Some(name.clone()),
            pod_name: Some(name.clone()),
            keep_running,
            persistent_contents: contents.or_else(|| sandbox.spec.persistent_contents.clone()),
            ttl_after_finished: ttl,
        },
    );
    checkpoint.metadata = ObjectMeta {
        generate_name: Some(format!("{name}-")),
        namespace: sandbox.metadata.namespace.clone(),
        labels: Some(checkpoint_labels),
        annotations: Some(checkpoint_notes),
        ..ObjectMeta::default()
    };
    checkpoint
}

/// The SandboxTemplate a clone of the snapshot is made from: the sandbox's template, named
/// like the Checkpoint and owned by it.
async fn snapshot_template<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
    checkpoint: &Checkpoint,
) -> Result<SandboxTemplate, StoreError> {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let referenced = match &sandbox.spec.template_ref {
        Some(reference) => {
            Some(state.store.get::<SandboxTemplate>(&namespace, &reference.name).await?)
        }
        None => None,
    };
    let spec = &sandbox.spec;
    let from = referenced.as_ref().map(|t| &t.spec);
    let mut template = SandboxTemplate::new(
        checkpoint.metadata.name.as_deref().unwrap_or_default(),
        SandboxTemplateSpec {
            template: spec.template.clone().or_else(|| from.and_then(|t| t.template.clone())),
            volume_claim_templates: spec.volume_claim_templates.clone(),
            persistent_contents: spec.persistent_contents.clone(),
            runtimes: spec.runtimes.clone(),
            pause_strategy: spec.pause_strategy.clone(),
            probes: spec.probes.clone(),
            auto_pause_policy: spec.auto_pause_policy.clone(),
        },
    );
    template.metadata.namespace = Some(namespace);
    template.metadata.owner_references = Some(vec![OwnerReference {
        api_version: oka_api::API_VERSION.into(),
        kind: CHECKPOINT_KIND.into(),
        name: checkpoint.metadata.name.clone().unwrap_or_default(),
        uid: checkpoint.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    Ok(template)
}

/// Waits (on the store's watch) until the Checkpoint succeeded with an ID; `Err` with why when
/// it failed, went away or did not succeed within `wait`.
async fn wait_succeeded<S: Store>(
    state: &AppState<S>,
    checkpoint: &Checkpoint,
    wait: Duration,
) -> Result<Result<Arc<Checkpoint>, String>, StoreError> {
    let namespace = checkpoint.metadata.namespace.clone().unwrap_or_default();
    let name = checkpoint.metadata.name.clone().unwrap_or_default();
    let judge = |c: &Checkpoint| -> Option<Result<(), String>> {
        let status = c.status.as_ref()?;
        match status.phase.as_ref()? {
            CheckpointPhase::Succeeded if checkpoint_id(c).is_some() => Some(Ok(())),
            CheckpointPhase::Failed => Some(Err(format!(
                "checkpoint {name} failed: {}",
                status.message.clone().unwrap_or_default()
            ))),
            _ => None,
        }
    };
    let current = state.store.get::<Checkpoint>(&namespace, &name).await?;
    let version = current.metadata.resource_version.clone().unwrap_or_default();
    if let Some(verdict) = judge(&current) {
        return Ok(verdict.map(|()| Arc::new(current)));
    }
    let mut events = state
        .store
        .watch::<Checkpoint>(Some(&namespace), &Selector::everything(), &version)
        .await?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => {
                return Ok(Err(format!(
                    "checkpoint {name} did not succeed within {}s",
                    wait.as_secs()
                )));
            }
            Ok(None | Some(Err(_))) => {
                return Ok(Err(format!("the watch of checkpoint {name} ended")));
            }
            Ok(Some(Ok(WatchEvent::Added(c) | WatchEvent::Modified(c))))
                if c.metadata.name.as_deref() == Some(name.as_str()) =>
            {
                if let Some(verdict) = judge(&c) {
                    return Ok(verdict.map(|()| c));
                }
            }
            Ok(Some(Ok(WatchEvent::Deleted(c))))
                if c.metadata.name.as_deref() == Some(name.as_str()) =>
            {
                return Ok(Err(format!("checkpoint {name} was deleted")));
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// `GET /snapshots?limit=&nextToken=&sandboxID=`: the team's succeeded snapshots, oldest
/// first, paginated with `X-Next-Token`.
pub(super) async fn list_snapshots<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let mut limit = 100usize;
    let mut after = None;
    let mut sandbox = None;
    let mut name = None;
    for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "limit" => {
                limit = value.parse().ok().filter(|l| (1..=100).contains(l)).ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "Invalid limit: {value}, must be between 1 and 100"
                    ))
                })?;
            }
            "nextToken" if !value.is_empty() => after = Some(decode_cursor(&value)?),
            "sandboxID" if !value.is_empty() => sandbox = Some(value.into_owned()),
            "name" if !value.is_empty() => name = Some(value.into_owned()),
            _ => {}
        }
    }
    let list = state
        .store
        .list::<Checkpoint>(user.namespace.as_deref(), &Selector::everything())
        .await
        .map_err(|e| ApiError::Internal(format!("Failed to list snapshots: {e}")))?;
    let mut rows: Vec<(Cursor, SnapshotJson)> = list
        .items
        .iter()
        .filter(|c| sees(&user, c))
        .filter(|c| {
            sandbox.as_deref().is_none_or(|want| {
                c.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(annotations::SANDBOX_ID))
                    .map(String::as_str)
                    == Some(want)
            })
        })
        .filter(|c| name.as_deref().is_none_or(|want| snapshot_name(c) == Some(want)))
        .filter_map(|c| {
            let id = checkpoint_id(c)?.to_owned();
            let key = c.metadata.creation_timestamp.as_ref()?.0;
            let resource = format!(
                "{}/{}",
                c.metadata.namespace.as_deref().unwrap_or_default(),
                c.metadata.name.as_deref().unwrap_or_default()
            );
            Some((Cursor { key, id: resource }, SnapshotJson::of(c, id)))
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(after) = &after {
        rows.retain(|(c, _)| c > after);
    }
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = more.then(|| rows.last().map(|(c, _)| encode_cursor(c))).flatten();
    let items: Vec<SnapshotJson> = rows.into_iter().map(|(_, json)| json).collect();
    let mut response = Json(items).into_response();
    if let Some(token) = next
        && let Ok(value) = HeaderValue::from_str(&token)
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// `SandboxMetric`: one sample, byte units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxMetric {
    /// RFC 3339.
    pub timestamp: String,
    /// Unix seconds.
    #[serde(rename = "timestampUnix")]
    pub timestamp_unix: i64,
    /// CPUs.
    #[serde(rename = "cpuCount")]
    pub cpu_count: i64,
    /// CPU use, percent.
    #[serde(rename = "cpuUsedPct")]
    pub cpu_used_pct: f64,
    /// Memory used, bytes.
    #[serde(rename = "memUsed")]
    pub mem_used: i64,
    /// Memory total, bytes.
    #[serde(rename = "memTotal")]
    pub mem_total: i64,
    /// Page cache, bytes.
    #[serde(rename = "memCache")]
    pub mem_cache: i64,
    /// Disk used, bytes.
    #[serde(rename = "diskUsed")]
    pub disk_used: i64,
    /// Disk total, bytes.
    #[serde(rename = "diskTotal")]
    pub disk_total: i64,
}

/// envd's `/metrics` JSON as a [`SandboxMetric`].
fn metric_of(envd: &serde_json::Value) -> Option<SandboxMetric> {
    let int = |key: &str| envd.get(key).and_then(serde_json::Value::as_i64).unwrap_or(0);
    let ts = envd.get("ts").and_then(serde_json::Value::as_i64)?;
    Some(SandboxMetric {
        timestamp: jiff::Timestamp::from_second(ts).ok()?.to_string(),
        timestamp_unix: ts,
        cpu_count: int("cpu_count"),
        cpu_used_pct: envd.get("cpu_used_pct").and_then(serde_json::Value::as_f64).unwrap_or(0.0),
        mem_used: int("mem_used"),
        mem_total: int("mem_total"),
        mem_cache: int("mem_cache"),
        disk_used: int("disk_used"),
        disk_total: int("disk_total"),
    })
}

/// `GET /sandboxes/{id}/metrics`: the current sample from the sandbox's agent runtime (one
/// item) while it runs; `[]` when paused or when no agent runtime is wired (the no-op
/// initializer). `start`/`end` are accepted and not used: no history is kept.
pub(super) async fn metrics<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<Json<Vec<SandboxMetric>>, ApiError> {
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    if visible != oka_api::SandboxState::Running || sandbox.is_paused() {
        return Ok(Json(Vec::new()));
    }
    let token = super::models::access_token(&sandbox);
    let sample = state
        .initializer
        .metrics(&sandbox, token.as_deref())
        .await
        .map_err(|e| ApiError::Internal(format!("Failed to get sandbox metrics: {e}")))?;
    Ok(Json(sample.as_ref().and_then(metric_of).into_iter().collect()))
}
