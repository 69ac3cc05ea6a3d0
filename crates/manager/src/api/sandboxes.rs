//! The sandbox routes: create, list, describe, kill, timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderValue, StatusCode};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::{Sandbox, SandboxPhase, SandboxState, annotations, retention};
use oka_store::{Deleted, Preconditions, Store, StoreError};
use oka_telemetry::MANAGER;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::models::{self, ConnectRequest, NewSandboxRequest, SandboxJson, TimeoutRequest};
use super::timeouts::{DEFAULT_TIMEOUT_SECS, OnTimeout, PauseMemory, plan_lifecycle};
use super::{ApiError, AppState, RequestContext, User, response_domain};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::claim::{ClaimError, ClaimOptions, InplaceUpdate, PoolRef, truncate_to_second};
use crate::index::sandbox_id;

/// The prefix of the reference's metadata extensions.
pub const EXTENSION_PREFIX: &str = "e2b.agents.kruise.io/";

type AppStateRef<S> = State<Arc<AppState<S>>>;

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("Invalid request body: {e}")))
}

/// [`parse_json`] of a body the SDK may leave empty; an empty body is `T::default()`.
pub(super) fn parse_optional_json<T: serde::de::DeserializeOwned + Default>(
    body: &Bytes,
) -> Result<T, ApiError> {
    if body.is_empty() { Ok(T::default()) } else { parse_json(body) }
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'
}

/// A Kubernetes label value (or the name part of a qualified name, when non-empty).
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    value.is_empty()
        || (bytes.len() <= 63
            && bytes.iter().copied().all(is_name_char)
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric))
}

/// A Kubernetes qualified name: `[prefix/]name`, the prefix a DNS subdomain.
fn qualified_name_error(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if name.is_empty() || !is_label_value(name) {
        return Some(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character (at most 63 characters)",
        );
    }
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                let b = part.as_bytes();
                !b.is_empty()
                    && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
            });
        if !ok {
            return Some("prefix part must be a lowercase RFC 1123 subdomain");
        }
    }
    None
}

fn forbidden_prefix(key: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "Forbidden metadata key [{key}]: cannot contain prefixes: [e2b.agents.kruise.io/ agents.kruise.io/]"
    ))
}

/// What the create request's metadata turns into.
#[derive(Debug, PartialEq)]
struct ParsedMetadata {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    never_timeout: bool,
    skip_init_runtime: bool,
    /// `create-on-no-stock`: anything but `"false"` (the default) allows a new sandbox.
    create_on_no_stock: bool,
    /// `reserve-paused-sandbox-duration`: how long a paused sandbox is kept, as written.
    paused_retention: Option<(SignedDuration, String)>,
    /// `wait-ready-timeout-seconds`: the longest wait for a new sandbox (create-on-no-stock) or
    /// for a claimed one's in-place update.
    wait_ready: Option<std::time::Duration>,
    /// `image`: the first container's new image (an in-place update of the claimed sandbox).
    image: Option<String>,
    /// `cpu-request`: the first container's new CPU request.
    cpu_request: Option<Quantity>,
    /// `cpu-limit`: the first container's new CPU limit.
    cpu_limit: Option<Quantity>,
    /// A `cpu-request` or `cpu-limit` was a memory quantity (a binary suffix, `512Mi`).
    memory_asked: bool,
}

impl ParsedMetadata {
    /// The in-place update the extensions ask for, if any, awaited for at most `ready_timeout`.
    fn inplace_update(&self, ready_timeout: std::time::Duration) -> Option<InplaceUpdate> {
        (self.image.is_some() || self.cpu_request.is_some() || self.cpu_limit.is_some()).then(
            || InplaceUpdate {
                image: self.image.clone(),
                cpu_request: self.cpu_request.clone(),
                cpu_limit: self.cpu_limit.clone(),
                ready_timeout,
            },
        )
    }
}

/// Why `image` is not an image the `image` extension takes, if it is not: an absolute directory
/// path (what oka's local runtime runs as the root) or a Docker reference
/// (`[host[:port]/]path[:tag][@digest]`, lower-case path components).
fn image_error(image: &str) -> Option<&'static str> {
    if image.starts_with('/') {
        return None;
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let valid = digest.split_once(':').is_some_and(|(algorithm, hex)| {
            !algorithm.is_empty()
                && algorithm.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && hex.len() >= 32
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        });
        if !valid {
            return Some("invalid digest");
        }
    }
    let (name, tag) = match rest.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
        _ => (rest, None),
    };
    if let Some(tag) = tag {
        let valid = (1..=128).contains(&tag.len())
            && tag.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid {
            return Some("invalid tag format");
        }
    }
    if name.is_empty() {
        return Some("invalid reference format");
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // A first part with a dot, a port or `localhost` is a registry host.
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (host, port) = host.split_once(':').unwrap_or((host, "0"));
        if host.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.is_empty() {
            return Some("invalid reference format");
        }
    }
    let component = |part: &str| {
        let bytes = part.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(b))
            && bytes.first().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && bytes.last().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !parts.iter().all(|p| component(p)) {
        return Some("repository name must be lowercase");
    }
    None
}

/// The quantity of the CPU extension `key` (`cpu-request`, `cpu-limit`): a positive Kubernetes
/// quantity; `Ok(None)` for a memory quantity (a binary suffix), which the create refuses after
/// parsing, as the reference does.
fn cpu_quantity(key: &str, value: &str) -> Result<Option<Quantity>, ApiError> {
    let Ok(number) = oka_api::quantity::parse(value) else {
        return Err(ApiError::BadRequest(format!(
            "Bad extension param: invalid quantity for {key} [{value}]: quantities must match the \
             regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )));
    };
    if !number.is_positive() {
        return Err(ApiError::BadRequest(format!(
            "Bad extension param: {key} must be a positive value, got [{value}]"
        )));
    }
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].iter().any(|s| value.trim().ends_with(s));
    Ok((!binary).then(|| Quantity(value.trim().to_owned())))
}

/// The create's metadata: the `e2b.agents.kruise.io/` extensions, `label:` keys (labels, which
/// must be valid labels), and the user's metadata (annotations; the keys that are not
/// Kubernetes qualified names together in [`annotations::E2B_METADATA`]). The reserved prefixes
/// are refused.
fn parse_metadata(metadata: BTreeMap<String, String>) -> Result<ParsedMetadata, ApiError> {
    let mut unqualified = BTreeMap::new();
    let mut parsed = ParsedMetadata {
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        never_timeout: false,
        skip_init_runtime: false,
        create_on_no_stock: true,
        paused_retention: None,
        wait_ready: None,
        image: None,
        cpu_request: None,
        cpu_limit: None,
        memory_asked: false,
    };
    for (key, value) in metadata {
        if let Some(extension) = key.strip_prefix(EXTENSION_PREFIX) {
            match extension {
                "never-timeout" => parsed.never_timeout = value == "true",
                "skip-init-runtime" => parsed.skip_init_runtime = value == "true",
                "create-on-no-stock" => parsed.create_on_no_stock = value != "false",
                "reserve-paused-sandbox-duration" => {
                    let retention = retention::parse(&value).ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "Bad extension param: invalid {key} {value:?}: use \"forever\" or a \
                             positive Go duration"
                        ))
                    })?;
                    parsed.paused_retention = Some((retention, value));
                }
                "wait-ready-timeout-seconds" | "claim-timeout-seconds" => {
                    let seconds = value.parse::<u64>().ok().filter(|s| *s > 0).ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "Bad extension param: {key} must be a positive integer, not {value:?}"
                        ))
                    })?;
                    // A claim never waits but for a new sandbox or an in-place update.
                    if extension == "wait-ready-timeout-seconds" {
                        parsed.wait_ready = Some(std::time::Duration::from_secs(seconds));
                    }
                }
                "image" => {
                    if let Some(why) = image_error(&value) {
                        return Err(ApiError::BadRequest(format!(
                            "Bad extension param: invalid image [{value}]: {why}"
                        )));
                    }
                    parsed.image = Some(value);
                }
                "cpu-request" | "cpu-limit" => {
                    let quantity = cpu_quantity(&key, &value)?;
                    parsed.memory_asked |= quantity.is_none();
                    if extension == "cpu-request" {
                        parsed.cpu_request = quantity;
                    } else {
                        parsed.cpu_limit = quantity;
                    }
                }
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "Bad extension param: {key} is not supported"
                    )));
                }
            }
        } else if let Some(label) = key.strip_prefix("label:") {
            if annotations::is_reserved(label) {
                return Err(forbidden_prefix(label));
            }
            if let Some(why) = qualified_name_error(label) {
                return Err(ApiError::BadRequest(format!(
                    "Unqualified metadata key [{key}]: {why}"
                )));
            }
            if !is_label_value(&value) {
                return Err(ApiError::BadRequest(format!(
                    "Bad extension param: invalid label value {value:?} for {key}"
                )));
            }
            parsed.labels.insert(label.to_owned(), value);
        } else if annotations::is_reserved(&key) {
            return Err(forbidden_prefix(&key));
        } else if qualified_name_error(&key).is_some() {
            // E2B takes any key; an annotation only a qualified name.
            unqualified.insert(key, value);
        } else {
            parsed.annotations.insert(key, value);
        }
    }
    if !unqualified.is_empty() {
        let json = serde_json::to_string(&unqualified)
            .map_err(|e| ApiError::Internal(format!("Failed to encode the metadata: {e}")))?;
        parsed.annotations.insert(annotations::E2B_METADATA.into(), json);
    }
    Ok(parsed)
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: claim from the warm pool `templateID`.
pub(super) async fn create<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    headers: http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Some(key) = headers.get("idempotency-key") else {
        return create_once(&state, &user, &context, &body, None).await;
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| {
            (1..=255).contains(&k.len())
                && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .ok_or_else(|| {
            ApiError::BadRequest("Invalid Idempotency-Key: must match [a-z0-9-]{1,255}".into())
        })?
        .to_owned();
    let slot = (user.id.clone(), key.clone());
    // One create per (owner, key) at a time; a duplicate waits, then finds the first's sandbox.
    let guard = loop {
        if let Some(existing) = state.index.by_idempotency_key(&user.id, &key) {
            let first = existing
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::index::IDEMPOTENCY_BODY_SHA256));
            if first.is_some_and(|hash| *hash != body_hash(&body)) {
                return Err(ApiError::Conflict(format!(
                    "Idempotency-Key {key} was used with another request body"
                )));
            }
            let domain = response_domain(&state.config, &context)?;
            let visible = models::visible_state(&existing, Timestamp::now()).ok_or_else(|| {
                ApiError::sandbox_not_found(&sandbox_id(&existing).unwrap_or_default())
            })?;
            let body = state.sandbox_json(&existing, visible, &domain, true);
            return Ok((StatusCode::CREATED, Json(body)).into_response());
        }
        if state
            .creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(slot.clone())
        {
            break Creating { state: &state, slot: slot.clone() };
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let result = create_once(&state, &user, &context, &body, Some(&key)).await;
    drop(guard);
    result
}

/// The SHA-256 of a create body, as recorded for its `Idempotency-Key`.
fn body_hash(body: &Bytes) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(body).iter().map(|b| format!("{b:02x}")).collect()
}

/// Removes an (owner, key) from the running creates when dropped.
struct Creating<'a, S> {
    state: &'a AppState<S>,
    slot: (String, String),
}

impl<S> Drop for Creating<'_, S> {
    fn drop(&mut self) {
        self.state
            .creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.slot);
    }
}

async fn create_once<S: Store>(
    state: &AppState<S>,
    user: &User,
    context: &RequestContext,
    body: &Bytes,
    idempotency_key: Option<&str>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let mut request: NewSandboxRequest = parse_json(body)?;
    if let Some(name) = super::builds::resolve_tagged(state, user, &request.template_id)? {
        request.template_id = name;
    }
    if let Some(field) = request.unsupported() {
        return Err(ApiError::BadRequest(format!(
            "{field} is not supported by oka yet: leave it out of the create"
        )));
    }
    let egress = plan_create_egress(state, &request)?;
    let mut metadata = parse_metadata(request.metadata.unwrap_or_default())?;
    if let Some(key) = idempotency_key {
        metadata.annotations.insert(crate::index::IDEMPOTENCY_KEY.into(), key.into());
        metadata.annotations.insert(crate::index::IDEMPOTENCY_BODY_SHA256.into(), body_hash(body));
    }
    let internet = if request.allow_internet_access == Some(false) { "false" } else { "true" };
    metadata.labels.insert(oka_api::labels::ALLOW_INTERNET_ACCESS.into(), internet.into());
    let lifecycle =
        plan_lifecycle(request.auto_pause, request.auto_pause_memory, request.auto_resume)?;
    // Written explicitly, so the gateway need not guess who paused the sandbox: only
    // `autoResume: {enabled: true}` lets traffic wake it, as in E2B.
    let auto_resume = if lifecycle.auto_resume { "true" } else { "false" };
    metadata.annotations.insert(annotations::AUTO_RESUME.into(), auto_resume.into());
    let files_only = lifecycle.on_timeout == OnTimeout::Pause(PauseMemory::Filesystem);
    if files_only {
        metadata
            .annotations
            .insert(annotations::AUTO_PAUSE_MEMORY.into(), PauseMemory::Filesystem.as_str().into());
    }
    // `network.allowPublicTraffic: false`: the gateway requires a traffic access token, shown
    // once in this answer and stored only as its SHA-256.
    let traffic_token = request
        .network
        .as_ref()
        .is_some_and(|n| n.allow_public_traffic == Some(false))
        .then(|| uuid::Uuid::new_v4().to_string());
    if let Some(token) = &traffic_token {
        metadata.annotations.insert(annotations::ENABLE_JWT_AUTH.into(), "true".into());
        metadata.annotations.insert(
            annotations::TRAFFIC_ACCESS_TOKEN_SHA256.into(),
            crate::api::keys::key_hash(token),
        );
    }
    let (retention, retention_text) = metadata
        .paused_retention
        .clone()
        .unwrap_or((retention::FOREVER, annotations::RESERVE_FOREVER.to_owned()));
    let auto_pause = matches!(lifecycle.on_timeout, OnTimeout::Pause(_));
    if auto_pause || metadata.paused_retention.is_some() {
        metadata
            .annotations
            .insert(annotations::RESERVE_PAUSED_SANDBOX_DURATION.into(), retention_text);
    }
    let timeout = state.config.timeouts().create(request.timeout)?;
    if metadata.memory_asked {
        return Err(ApiError::BadRequest("memory inplace update is not supported".into()));
    }
    let domain = response_domain(&state.config, context)?;
    let set = state
        .index
        .sandbox_set(user.namespace.as_deref(), &request.template_id)
        .filter(|_| !request.template_id.is_empty());
    // Not a pool: a snapshot (clone).
    let checkpoint = match &set {
        None if !request.template_id.is_empty() => {
            super::templates::find_checkpoint(state, user, &request.template_id).await?
        }
        _ => None,
    };
    if set.is_none() && checkpoint.is_none() {
        if let Some(pending) = &state.config.pending_templates {
            pending.check(&request.template_id)?;
        }
        return Err(ApiError::BadRequest("Template or Checkpoint not found".into()));
    }
    let mut create = state.config.create.clone();
    if let Some(wait) = metadata.wait_ready {
        create.ready_timeout = create.ready_timeout.min(wait);
    }
    let inplace_update = metadata.inplace_update(create.ready_timeout);
    // A clone restores its processes from the snapshot: there is no image to change under
    // them (the reference refuses the image; oka the CPU values too, rather than drop them).
    if set.is_none() && inplace_update.is_some() {
        return Err(ApiError::BadRequest("InplaceUpdate is not supported for clone".into()));
    }
    let now = Timestamp::now();
    let end = now + SignedDuration::from_secs(timeout);
    let (pause_time, shutdown_time) = match (metadata.never_timeout, auto_pause) {
        (true, _) => (None, None),
        (false, true) => {
            let pause = truncate_to_second(end);
            (Some(pause), Some(pause.saturating_add(retention).unwrap_or(Timestamp::MAX)))
        }
        (false, _) => (None, Some(end)),
    };
    let env_vars = request.env_vars.unwrap_or_default();
    // A clone's restored agent runtime accepts only the snapshot's token.
    let access_token = checkpoint
        .as_deref()
        .and_then(crate::create::snapshot_access_token)
        .or_else(|| (!metadata.skip_init_runtime).then(|| uuid::Uuid::new_v4().to_string()));
    let options = ClaimOptions {
        shutdown_time,
        pause_time,
        labels: metadata.labels,
        annotations: metadata.annotations,
        env_vars,
        access_token: access_token.clone(),
        pause_strategy: files_only
            .then(|| PauseMemory::Filesystem.strategy(None).unwrap_or_default()),
        inplace_update,
        quota: user.quota.clone(),
        ..ClaimOptions::default()
    };
    // A sandbox made for this create (no stock, or a snapshot) starts its clock once it runs.
    let mut fresh = false;
    let claimed = match (&set, &checkpoint) {
        (Some(set), _) => {
            let pool = PoolRef::new(
                set.metadata.namespace.clone().unwrap_or_default(),
                set.metadata.name.clone().unwrap_or_default(),
            );
            let later = ends_after_start(&options, create.ready_timeout);
            let no_stock = (state.config.create.enabled && metadata.create_on_no_stock)
                .then_some((&create, &later));
            let claim = state.engine.claim_or_create(&pool, &user.id, &options, no_stock);
            let span_attributes =
                vec![oka_telemetry::Attribute::new("sandbox.namespace", pool.namespace.clone())];
            oka_telemetry::in_span(MANAGER, "manager.ClaimSandbox", span_attributes, claim)
                .await
                .map(|(claimed, new)| {
                    fresh = new;
                    claimed
                })
        }
        (None, Some(checkpoint)) => {
            fresh = true;
            let later = ends_after_start(&options, create.ready_timeout);
            let clone = state.engine.create_from_snapshot(checkpoint, &user.id, &later, &create);
            let checkpoint_id = checkpoint.status.as_ref().and_then(|s| s.checkpoint_id.clone());
            let span_attributes = vec![oka_telemetry::Attribute::new(
                "clone.checkpoint_id",
                checkpoint_id.unwrap_or_default(),
            )];
            oka_telemetry::in_span(MANAGER, "manager.CloneSandbox", span_attributes, clone).await
        }
        (None, None) => {
            return Err(ApiError::BadRequest("Template or Checkpoint not found".into()));
        }
    };
    let pool_namespace = set
        .as_ref()
        .and_then(|s| s.metadata.namespace.clone())
        .or_else(|| checkpoint.as_ref().and_then(|c| c.metadata.namespace.clone()))
        .unwrap_or_default();
    let outcome = claimed.as_ref().ok().map(|c| (fresh, c.attempts));
    state.metrics.claimed(&pool_namespace, outcome, started.elapsed());
    let claimed = claimed.map_err(|e| match e {
        ClaimError::PoolExhausted { .. }
        | ClaimError::TooManyConflicts { .. }
        | ClaimError::RateLimited { .. } => ApiError::PoolExhausted {
            message: format!("{e}"),
            retry_after_secs: state.config.retry_after_secs,
        },
        ClaimError::CreateFailed { .. } | ClaimError::NotReady { .. } => {
            ApiError::Internal(format!("Failed to create sandbox: {e}"))
        }
        // The store takes no writes for now (a full disk, a lost API server): retry later.
        ClaimError::Store(error @ oka_store::StoreError::Unavailable(_)) => {
            ApiError::PoolExhausted {
                message: format!("Failed to claim sandbox: {error}"),
                retry_after_secs: state.config.retry_after_secs,
            }
        }
        ClaimError::Store(error) => ApiError::Internal(format!("Failed to claim sandbox: {error}")),
        ClaimError::Quota(error) => quota_error(error),
    })?;
    let mut claimed = claimed;
    // A pool member's in-place update is awaited (a new sandbox was made with it).
    if let (Some(update), false) = (&options.inplace_update, fresh) {
        let pool = PoolRef::new(
            claimed.sandbox.metadata.namespace.clone().unwrap_or_default(),
            request.template_id.clone(),
        );
        let sandbox = Arc::clone(&claimed.sandbox);
        claimed =
            match state.engine.await_inplace_update(&pool, claimed, update.ready_timeout).await {
                Ok(updated) => updated,
                Err(error) => {
                    warn!(%error, "the in-place update did not complete; deleting the sandbox");
                    let cleaned = delete_sandbox(state, &sandbox).await.is_ok();
                    return Err(ApiError::Internal(format!(
                        "Failed to create sandbox: {error}; clean up sandbox: {cleaned}"
                    )));
                }
            };
    }
    if fresh {
        claimed.sandbox = start_clock(state, &claimed, timeout).await?;
    }
    let claim_done = started.elapsed();
    if let Some(token) = &access_token
        && let Err(error) = oka_telemetry::in_span(
            MANAGER,
            "manager.InitRuntime",
            vec![oka_telemetry::Attribute::new(
                "sandbox.name",
                claimed.sandbox.metadata.name.clone().unwrap_or_default(),
            )],
            state.initializer.init(&claimed.sandbox, &options.env_vars, token),
        )
        .await
    {
        warn!(sandbox = %claimed.sandbox_id, %error, "init failed; deleting the sandbox");
        let cleaned = delete_sandbox(state, &claimed.sandbox).await.is_ok();
        return Err(ApiError::Internal(format!(
            "Failed to initialise sandbox: {error}; clean up sandbox: {cleaned}"
        )));
    }
    if let (Some(network), Some(applier)) = (&egress, &state.egress)
        && let Err(error) = write_network_policy(
            state,
            applier.as_ref(),
            &claimed.sandbox,
            &claimed.sandbox_id,
            network,
        )
        .await
    {
        warn!(sandbox = %claimed.sandbox_id, %error, "egress policy failed; deleting the sandbox");
        let cleaned = delete_sandbox(state, &claimed.sandbox).await.is_ok();
        let resource = format!(
            "{}/{}",
            claimed.sandbox.metadata.namespace.as_deref().unwrap_or_default(),
            claimed.sandbox.metadata.name.as_deref().unwrap_or_default()
        );
        return Err(ApiError::Internal(format!(
            "failed to create network policy: {error}; clean up sandbox: {cleaned}; \
             sandboxResource={resource}"
        )));
    }
    let init_done = started.elapsed();
    let route_wait = std::time::Instant::now();
    if let Some(routes) = &state.routes
        && !oka_telemetry::in_span(
            MANAGER,
            "proxy.syncRoute",
            vec![oka_telemetry::Attribute::new("route.id", claimed.sandbox_id.clone())],
            async {
                let routed = routes.wait_routed(&claimed.sandbox_id, ROUTE_WAIT).await;
                state.metrics.route_synced(&pool_namespace, routed, route_wait.elapsed());
                Ok::<_, std::convert::Infallible>(routed)
            },
        )
        .await
        .unwrap_or(true)
    {
        warn!(sandbox = %claimed.sandbox_id, "the gateway does not route the new sandbox yet; answering anyway");
    }
    let mut body = state.sandbox_json(&claimed.sandbox, SandboxState::Running, &domain, true);
    body.traffic_access_token = traffic_token;
    body.network = egress.as_ref().and_then(NetworkOptions::rules);
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    response
        .headers_mut()
        .insert("server-timing", server_timing(claim_done, init_done, started.elapsed()));
    Ok(response)
}

/// E2B's network options of a create or a `PUT /sandboxes/{id}/network`, checked.
#[derive(Debug, Clone)]
pub(super) struct NetworkOptions {
    internet: bool,
    allow_out: Vec<String>,
    deny_out: Vec<String>,
}

impl NetworkOptions {
    /// The options, or 400 naming a bad entry.
    fn checked(
        internet: bool,
        allow_out: &[String],
        deny_out: &[String],
    ) -> Result<Self, ApiError> {
        crate::egress::plan_traffic_policy("", internet, allow_out, deny_out)
            .map_err(ApiError::BadRequest)?;
        Ok(Self { internet, allow_out: allow_out.to_vec(), deny_out: deny_out.to_vec() })
    }

    /// The entries as the create's answer shows them (as given); `None` when there are none.
    fn rules(&self) -> Option<models::NetworkRules> {
        (!self.allow_out.is_empty() || !self.deny_out.is_empty()).then(|| models::NetworkRules {
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        })
    }

    fn spec(&self, sandbox: &Sandbox) -> Result<oka_api::TrafficPolicySpec, String> {
        let name = sandbox.metadata.name.as_deref().unwrap_or_default();
        crate::egress::plan_traffic_policy(name, self.internet, &self.allow_out, &self.deny_out)
    }
}

/// The TrafficPolicy of E2B's network options on `sandbox`, when the manager wrote one.
async fn network_policy<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
) -> Result<Option<oka_api::TrafficPolicy>, StoreError> {
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
    let listed = state
        .store
        .list::<oka_api::TrafficPolicy>(Some(namespace), &oka_store::Selector::everything())
        .await?;
    Ok(listed
        .items
        .into_iter()
        .find(|p| crate::egress::is_policy_of(p, sandbox))
        .map(|p| p.as_ref().clone()))
}

/// Writes (creates, or updates) the TrafficPolicy of `network` for `sandbox`, then has the
/// sandbox's egress policy in force through `applier`.
async fn write_network_policy<S: Store>(
    state: &AppState<S>,
    applier: &dyn crate::egress::EgressApplier,
    sandbox: &Sandbox,
    sandbox_id: &str,
    network: &NetworkOptions,
) -> Result<(), String> {
    let spec = network.spec(sandbox)?;
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let mut written = None;
    for _ in 0..3 {
        let attempt = match network_policy(state, sandbox).await.map_err(|e| e.to_string())? {
            Some(mut policy) => {
                policy.spec = spec.clone();
                state.store.update(&namespace, &policy).await
            }
            None => {
                let policy = crate::egress::traffic_policy_for(sandbox, sandbox_id, spec.clone());
                state.store.create(&namespace, &policy).await
            }
        };
        match attempt {
            Ok(policy) => {
                written = Some(policy);
                break;
            }
            Err(StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let written = written.ok_or_else(|| "too many concurrent updates".to_owned())?;
    applier.apply(sandbox, &written).await
}

/// The `network` `GET /sandboxes/{id}` shows: the allow and reject entries of the sandbox's
/// TrafficPolicy, else (a sandbox created before the manager wrote TrafficPolicies) the
/// annotation `e2b.agents.kruise.io/network`.
pub(super) async fn network_rules_of<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
) -> Option<models::NetworkRules> {
    match network_policy(state, sandbox).await {
        Ok(Some(policy)) => {
            let (allow_out, deny_out) = crate::egress::network_of(&policy.spec);
            (!allow_out.is_empty() || !deny_out.is_empty())
                .then_some(models::NetworkRules { allow_out, deny_out })
        }
        Ok(None) | Err(_) => sandbox
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(models::NETWORK_RULES))
            .and_then(|j| serde_json::from_str(j).ok()),
    }
}

/// The network options a create asks for (`None`: the template's network as it is), checked
/// before anything is claimed: bad entries are 400 naming the entry, and `allowOut`/`denyOut`
/// where policies cannot be enforced are 501 naming the missing feature.
/// `allow_internet_access: false` alone never fails: where policies cannot be enforced no
/// sandbox has outbound networking (nftables missing), or, with no applier at all (Pods on a
/// cluster), the label `agents.kruise.io/allow-internet-access` is for the cluster's own
/// policies, as in the reference.
fn plan_create_egress<S>(
    state: &AppState<S>,
    request: &NewSandboxRequest,
) -> Result<Option<NetworkOptions>, ApiError> {
    let network = request.network.as_ref();
    let allow_out = network.and_then(|n| n.allow_out.as_deref()).unwrap_or_default();
    let deny_out = network.and_then(|n| n.deny_out.as_deref()).unwrap_or_default();
    if !crate::egress::asks_for_policy(request.allow_internet_access, allow_out, deny_out) {
        return Ok(None);
    }
    let internet = request.allow_internet_access != Some(false);
    let options = NetworkOptions::checked(internet, allow_out, deny_out)?;
    if allow_out.is_empty() && deny_out.is_empty() {
        let enforced = state.egress.as_ref().is_some_and(|a| a.available().is_ok());
        return Ok(enforced.then_some(options));
    }
    egress_applier(state)?;
    Ok(Some(options))
}

/// The applier, if egress policies can be enforced here; else 501 saying why.
pub(super) fn egress_applier<S>(
    state: &AppState<S>,
) -> Result<&Arc<dyn crate::egress::EgressApplier>, ApiError> {
    let applier = state.egress.as_ref().ok_or_else(|| {
        ApiError::NotImplemented(
            "network rules (allow_internet_access: false, allowOut, denyOut) are not supported \
             where this manager's sandboxes run"
                .into(),
        )
    })?;
    applier.available().map_err(ApiError::NotImplemented)?;
    Ok(applier)
}

/// The answer to a quota failure: 403 `QuotaExceeded: api-key quota exceeded` for a refusal.
pub(super) fn quota_error(error: crate::quota::QuotaError) -> ApiError {
    match error {
        crate::quota::QuotaError::Exceeded => ApiError::Forbidden(error.to_string()),
        other => ApiError::Internal(format!("Failed to claim sandbox: {other}")),
    }
}

/// `options` with its end times (if any) moved `wait` later: a sandbox made for its caller
/// (no stock, a snapshot, a fork) must not time out while it starts; once it runs,
/// [`start_clock`] sets them from then. Should the manager stop in between, the sandbox ends at
/// most `wait` late.
pub(super) fn ends_after_start(options: &ClaimOptions, wait: std::time::Duration) -> ClaimOptions {
    let wait = SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX);
    let later = |t: Option<Timestamp>| t.map(|t| t.saturating_add(wait).unwrap_or(Timestamp::MAX));
    ClaimOptions {
        shutdown_time: later(options.shutdown_time),
        pause_time: later(options.pause_time),
        ..options.clone()
    }
}

/// Sets the end of the just started sandbox `claimed` to `timeout` seconds from now (see
/// [`ends_after_start`]); nothing for one that never times out.
pub(super) async fn start_clock<S: Store>(
    state: &AppState<S>,
    claimed: &crate::claim::ClaimedSandbox,
    timeout: i64,
) -> Result<Arc<Sandbox>, ApiError> {
    let sandbox = Arc::clone(&claimed.sandbox);
    write_with_retry(state, &claimed.sandbox_id, sandbox, "start the sandbox's clock", |s| {
        with_end(s, timeout, EndPolicy::Always)
    })
    .await
}

/// How long a create waits for the gateway to route its sandbox before it answers anyway (the
/// route normally follows within a millisecond or two of the claim).
pub(super) const ROUTE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The `Server-Timing` header of a create: the claim (from the request's parsing to the
/// claimed sandbox), envd's `/init`, the wait for the gateway's route, and the handler's total,
/// in milliseconds. `claim` and `init_done` are the elapsed times at the end of each step.
fn server_timing(
    claim: std::time::Duration,
    init_done: std::time::Duration,
    total: std::time::Duration,
) -> HeaderValue {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let init = init_done.saturating_sub(claim);
    let route = total.saturating_sub(init_done);
    let value = format!(
        "claim;dur={:.3}, init;dur={:.3}, route;dur={:.3}, total;dur={:.3}",
        ms(claim),
        ms(init),
        ms(route),
        ms(total)
    );
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("total"))
}

/// Whether `user` may see the claimed `sandbox`: the admin team sees every sandbox an API key
/// claimed, another team those in its namespace; one handed back to its pool is gone for all.
pub(super) fn visible_to(user: &User, sandbox: &Sandbox) -> bool {
    let notes = sandbox.metadata.annotations.as_ref();
    let note = |key| notes.and_then(|a| a.get(key)).map(String::as_str);
    let in_team = match user.namespace.as_deref() {
        None => note(annotations::OWNER).is_some_and(|o| !o.is_empty()),
        Some(ns) => sandbox.metadata.namespace.as_deref() == Some(ns),
    };
    in_team
        && note(annotations::CLEANUP) != Some("true")
        && note(annotations::REUSE) != Some("true")
}

/// The caller's viewable sandbox `id`, or the anti-enumeration 404.
pub(super) fn owned_sandbox<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
) -> Result<(Arc<Sandbox>, SandboxState), ApiError> {
    let not_found = || ApiError::sandbox_not_found(id);
    let sandbox = state.index.by_id(id).ok_or_else(not_found)?;
    if !visible_to(user, &sandbox) {
        return Err(not_found());
    }
    let state = models::visible_state(&sandbox, Timestamp::now()).ok_or_else(not_found)?;
    Ok((sandbox, state))
}

/// `PUT /sandboxes/{id}/network`: `{"allowOut": [...], "denyOut": [...]}` replaces the
/// sandbox's egress rules (its `allow_internet_access` of the create, the label
/// `agents.kruise.io/allow-internet-access`, stays the default); 204 once they are in force,
/// 400 naming a bad entry, 404 for a sandbox the caller does not have, 501 where policies
/// cannot be enforced. `allow_internet_access` in the body is ignored, as the reference does.
pub(super) async fn update_network<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (sandbox, _) = owned_sandbox(&state, &user, &id)?;
    let request: models::NetworkRequest = parse_json(&body)?;
    let internet = sandbox
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(oka_api::labels::ALLOW_INTERNET_ACCESS))
        .is_none_or(|v| v != "false");
    let network = NetworkOptions::checked(
        internet,
        request.allow_out.as_deref().unwrap_or_default(),
        request.deny_out.as_deref().unwrap_or_default(),
    )?;
    let applier = egress_applier(&state)?;
    write_network_policy(&state, applier.as_ref(), &sandbox, &id, &network).await.map_err(|e| {
        ApiError::Internal(format!("Failed to update the network of sandbox {id}: {e}"))
    })?;
    // A sandbox from before TrafficPolicies: its annotation is superseded by the policy.
    write_with_retry(&state, &id, sandbox, "record the network rules", |s| {
        let notes = s.metadata.annotations.as_ref()?;
        notes.get(models::NETWORK_RULES)?;
        let mut s = s.clone();
        s.metadata.annotations.get_or_insert_with(Default::default).remove(models::NETWORK_RULES);
        Some(s)
    })
    .await?;
    info!(sandbox = %id, "egress policy replaced");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}`.
pub(super) async fn describe<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    Path(id): Path<String>,
) -> Result<Json<SandboxJson>, ApiError> {
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    let domain = response_domain(&state.config, &context)?;
    let mut json = state.sandbox_json(&sandbox, visible, &domain, true);
    json.network = network_rules_of(&state, &sandbox).await;
    Ok(Json(json))
}

/// Deletes (or, when recyclable, hands back to its pool) a sandbox, and updates the index.
pub(super) async fn delete_sandbox<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
) -> Result<(), StoreError> {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let notes = sandbox.metadata.annotations.as_ref();
    let enabled = |key| notes.and_then(|a| a.get(key)).is_some_and(|v| v == "true");
    let recyclable = (enabled(annotations::CLEANUP_ENABLED) || enabled(annotations::REUSE_ENABLED))
        && sandbox.phase() == Some(&SandboxPhase::Running);
    if recyclable {
        // Its next holder starts without this holder's network rules (the controller makes
        // the sandbox's egress policy follow).
        if let Ok(Some(policy)) = network_policy(state, sandbox).await {
            let policy_name = policy.metadata.name.clone().unwrap_or_default();
            let _ = state
                .store
                .delete::<oka_api::TrafficPolicy>(
                    &namespace,
                    &policy_name,
                    &Preconditions::default(),
                )
                .await;
        }
        // The controller writes the sandbox too (its status): on a conflict, mark the
        // current version.
        let mut current = sandbox.clone();
        for attempt in 1.. {
            let mut marked = current.clone();
            marked
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(annotations::CLEANUP.into(), "true".into());
            oka_telemetry::context::inject(&mut marked.metadata);
            match state.store.update(&namespace, &marked).await {
                Ok(written) => {
                    state.index.apply_sandbox(Arc::new(written));
                    info!(sandbox = %name, "sandbox handed back to its pool");
                    return Ok(());
                }
                Err(StoreError::Conflict { .. }) if attempt < 5 => {
                    current = state.store.get::<Sandbox>(&namespace, &name).await?;
                    if current.metadata.uid != sandbox.metadata.uid {
                        return Err(StoreError::NotFound {
                            kind: "Sandbox".into(),
                            namespace: namespace.clone(),
                            name: name.clone(),
                        });
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }
    // The deletion's trace: recorded on the sandbox first, so the controller's finalizing
    // reconciles join it (best effort: the delete goes on whatever this write answers).
    if oka_telemetry::context::current_traceparent().is_some() {
        let mut traced = sandbox.clone();
        oka_telemetry::context::inject(&mut traced.metadata);
        let _ = state.store.update(&namespace, &traced).await;
    }
    let preconditions = Preconditions { uid: sandbox.metadata.uid.clone(), resource_version: None };
    match state.store.delete::<Sandbox>(&namespace, &name, &preconditions).await {
        Ok(Deleted::Gone(last)) => state.index.forget_sandbox(&last),
        Ok(Deleted::Finalizing(last)) => state.index.apply_sandbox(Arc::new(last)),
        Err(StoreError::NotFound { .. }) => state.index.forget_sandbox(sandbox),
        Err(error) => return Err(error),
    }
    info!(sandbox = %name, "sandbox deleted");
    Ok(())
}

/// `DELETE /sandboxes/{id}`: 204.
pub(super) async fn kill<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (sandbox, _) = owned_sandbox(&state, &user, &id)?;
    let attributes = vec![oka_telemetry::Attribute::new(
        "sandbox.name",
        sandbox.metadata.name.clone().unwrap_or_default(),
    )];
    let delete = delete_sandbox(&state, &sandbox);
    oka_telemetry::in_span(MANAGER, "manager.DeleteSandbox", attributes, delete).await.map_err(
        |e| {
            ApiError::Internal(format!(
                "Failed to delete sandbox: {e}; sandboxResource={}/{}",
                sandbox.metadata.namespace.as_deref().unwrap_or_default(),
                sandbox.metadata.name.as_deref().unwrap_or_default()
            ))
        },
    )?;
    // The reference's release after an accepted delete: a limited caller's own sandbox, with a
    // lock; bounded, detached from this request, errors only logged (anti-drift repairs).
    if user.quota.is_some()
        && let Some(quota) = state.engine.quota()
        && let Some((owner, lock)) = crate::quota::model::owner_and_lock(&sandbox)
        && owner == user.id
    {
        quota.release_detached(owner, lock, crate::quota::RELEASE_BOUND).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// How a timeout write treats the current end time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EndPolicy {
    /// Set it (may shorten): `/timeout`.
    Always,
    /// Only move it later: `/connect` on a running sandbox.
    ExtendOnly,
}

/// The sandbox with its end moved to `now + timeout` (keeping auto-pause mode), or `None`
/// when nothing changes (never-timeout, or an extend-only write that would shorten).
pub(super) fn with_end(sandbox: &Sandbox, timeout: i64, policy: EndPolicy) -> Option<Sandbox> {
    if sandbox.spec.shutdown_time.is_none() && sandbox.spec.pause_time.is_none() {
        return None; // never-timeout
    }
    let end = truncate_to_second(Timestamp::now() + SignedDuration::from_secs(timeout));
    let current = sandbox.spec.pause_time.as_ref().or(sandbox.spec.shutdown_time.as_ref());
    if policy == EndPolicy::ExtendOnly && current.is_some_and(|c| c.0 >= end) {
        return None;
    }
    let mut updated = sandbox.clone();
    if updated.spec.pause_time.is_some() {
        updated.spec.pause_time = Some(Time(end));
        updated.spec.shutdown_time =
            Some(Time(end.saturating_add(retention::FOREVER).unwrap_or(Timestamp::MAX)));
    } else {
        updated.spec.shutdown_time = Some(Time(end));
    }
    Some(updated)
}

/// Writes `change(sandbox)` with the sandbox's resourceVersion as precondition, re-reading
/// and re-deciding on a conflict (three times at most). `change` returning `None` means
/// nothing to write. Returns the sandbox as it ends up.
pub(super) async fn write_with_retry<S: Store>(
    state: &AppState<S>,
    id: &str,
    mut sandbox: Arc<Sandbox>,
    what: &str,
    change: impl Fn(&Sandbox) -> Option<Sandbox>,
) -> Result<Arc<Sandbox>, ApiError> {
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let internal = |e: StoreError| ApiError::Internal(format!("Failed to {what}: {e}"));
    for _ in 0..3 {
        let Some(mut updated) = change(&sandbox) else { return Ok(sandbox) };
        oka_telemetry::context::inject(&mut updated.metadata);
        match state.store.update(&namespace, &updated).await {
            Ok(written) => {
                let written = Arc::new(written);
                state.index.apply_sandbox(Arc::clone(&written));
                return Ok(written);
            }
            Err(StoreError::Conflict { .. }) => {
                sandbox =
                    Arc::new(state.store.get::<Sandbox>(&namespace, &name).await.map_err(|e| {
                        if e.is_not_found() { ApiError::sandbox_not_found(id) } else { internal(e) }
                    })?);
            }
            Err(StoreError::NotFound { .. }) => return Err(ApiError::sandbox_not_found(id)),
            Err(e) => return Err(internal(e)),
        }
    }
    Err(ApiError::Internal(format!("Failed to {what}: too many concurrent updates")))
}

/// `POST /sandboxes/{id}/timeout`: a new end time `now + timeout`, shorter or longer.
pub(super) async fn set_timeout<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let request: TimeoutRequest = parse_json(&body)?;
    state.config.timeouts().check(request.timeout)?;
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    if visible != SandboxState::Running {
        return Err(ApiError::NotRunning(format!(
            "Failed to set sandbox timeout: sandbox {id} is paused; connect to resume it"
        )));
    }
    write_with_retry(&state, &id, sandbox, "set sandbox timeout", |s| {
        with_end(s, request.timeout, EndPolicy::Always)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/refreshes` `{"duration"}` (E2B; 0..3600 s, default 0): the end
/// time becomes `now + duration` if that is later; 204.
pub(super) async fn refresh<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    #[derive(Deserialize, Default)]
    struct RefreshRequest {
        #[serde(default)]
        duration: Option<i64>,
    }
    let request: RefreshRequest = parse_optional_json(&body)?;
    let duration = request.duration.unwrap_or(0);
    if !(0..=3600).contains(&duration) {
        return Err(ApiError::BadRequest("duration should between 0 and 3600".into()));
    }
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    if visible != SandboxState::Running {
        return Err(ApiError::NotRunning(format!(
            "Failed to refresh sandbox: sandbox {id} is paused; connect to resume it"
        )));
    }
    write_with_retry(&state, &id, sandbox, "refresh sandbox", |s| {
        with_end(s, duration, EndPolicy::ExtendOnly)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect`: 200 with the end time
/// only ever extended when the sandbox runs; 201 once a paused one has been resumed (the
/// first connect flips `spec.paused`, with the new end time in the same write; the sandbox
/// controller resumes it).
pub(super) async fn connect<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ConnectRequest = parse_optional_json(&body)?;
    if let Some(timeout) = request.timeout {
        state.config.timeouts().check(timeout)?;
    }
    let domain = response_domain(&state.config, &context)?;
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    let (sandbox, status) = if visible == SandboxState::Running {
        // As E2B: the end only ever moves later, to now + the timeout (300 s when absent).
        let timeout = request.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        let sandbox = write_with_retry(&state, &id, sandbox, "connect sandbox", |s| {
            with_end(s, timeout, EndPolicy::ExtendOnly)
        })
        .await?;
        (sandbox, StatusCode::OK)
    } else {
        let running = super::lifecycle::resume_sandbox(
            &state,
            &user,
            &id,
            sandbox,
            super::lifecycle::Resume {
                timeout: request.timeout,
                auto_pause: None,
                memory: PauseMemory::from_flag(request.memory),
            },
            ApiError::BadRequest,
        )
        .await?;
        (running, StatusCode::CREATED)
    };
    let body = state.sandbox_json(&sandbox, SandboxState::Running, &domain, true);
    Ok((status, Json(body)).into_response())
}

/// The list cursor: the last item's time (a sandbox's claim, a snapshot's creation) and ID.
/// Ordered by time, then ID, as the lists are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(super) struct Cursor {
    pub(super) key: Timestamp,
    pub(super) id: String,
}

pub(super) fn encode_cursor(cursor: &Cursor) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(cursor).unwrap_or_default())
}

pub(super) fn decode_cursor(token: &str) -> Result<Cursor, ApiError> {
    URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| ApiError::BadRequest(format!("Invalid next token: {token}")))
}

/// What a list asks for.
#[derive(Debug, PartialEq)]
struct ListQuery {
    states: BTreeSet<SandboxState>,
    metadata: BTreeMap<String, String>,
    limit: usize,
    after: Option<Cursor>,
    descending: bool,
    template: Option<String>,
    started_after: Option<Timestamp>,
}

/// A metadata filter's key or value: the SDKs percent-encode each once more before they
/// encode the whole `metadata` parameter (E2B's description: "each key and value must be URL
/// encoded"), so `a b` arrives as `a%20b`. A sequence that does not decode (a literal `%`)
/// stays as it is.
fn percent_decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map_or_else(|_| text.to_owned(), |decoded| decoded.into_owned())
}

fn parse_list_query(raw: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut query = ListQuery {
        states: BTreeSet::from([SandboxState::Running, SandboxState::Paused]),
        metadata: BTreeMap::new(),
        limit: 100,
        after: None,
        descending: true,
        template: None,
        started_after: None,
    };
    let mut add_filter = |key: String, value: String| {
        if annotations::is_reserved(&key) {
            return Err(ApiError::BadRequest(format!("Forbidden metadata key: {key}")));
        }
        query.metadata.insert(key, value);
        Ok(())
    };
    let mut rest = Vec::new();
    // `state=running,paused` or `state=running&state=paused`: the union.
    let mut states = BTreeSet::new();
    for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "metadata" => {
                for (k, v) in form_urlencoded::parse(value.as_bytes()) {
                    if k.is_empty() {
                        return Err(ApiError::BadRequest(format!(
                            "Invalid metadata format: {value}"
                        )));
                    }
                    add_filter(percent_decoded(&k), percent_decoded(&v))?;
                }
            }
            _ => rest.push((key.into_owned(), value.into_owned())),
        }
    }
    for (key, value) in rest {
        match key.as_str() {
            "state" => {
                for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    states.insert(match part {
                        "running" => SandboxState::Running,
                        "paused" => SandboxState::Paused,
                        other => {
                            return Err(ApiError::BadRequest(format!(
                                "Only 'running' and 'paused' state are supported, not: '{other}'"
                            )));
                        }
                    });
                }
            }
            "limit" => {
                query.limit =
                    value.parse::<usize>().ok().filter(|l| (1..=100).contains(l)).ok_or_else(
                        || {
                            ApiError::BadRequest(format!(
                                "Invalid limit: {value}, must be between 1 and 100"
                            ))
                        },
                    )?;
            }
            "nextToken" => {
                if !value.is_empty() {
                    query.after = Some(decode_cursor(&value)?);
                }
            }
            "order" => match value.as_str() {
                "asc" => query.descending = false,
                "desc" | "" => query.descending = true,
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "Invalid order: {value}, must be 'asc' or 'desc'"
                    )));
                }
            },
            "template" => query.template = Some(value).filter(|t| !t.is_empty()),
            "startedAfter" => {
                query.started_after =
                    Some(value.parse().map_err(|_| {
                        ApiError::BadRequest(format!("Invalid startedAfter: {value}"))
                    })?);
            }
            _ => add_filter(key, value)?,
        }
    }
    if !states.is_empty() {
        query.states = states;
    }
    Ok(query)
}

/// `GET /v2/sandboxes`, `GET /sandboxes`: the caller's running/paused sandboxes, newest first
/// by claim time then ID (`order=asc` for oldest first), `startedAfter` inclusive, `template`
/// by pool name, paginated with `nextToken` / `X-Next-Token`.
pub(super) async fn list<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = parse_list_query(raw.as_deref())?;
    let domain = response_domain(&state.config, &context)?;
    let now = Timestamp::now();
    let mut rows: Vec<(Cursor, SandboxJson)> = state
        .index
        .claimed(user.namespace.as_deref())
        .into_iter()
        .filter_map(|sandbox| {
            if !visible_to(&user, &sandbox) {
                return None;
            }
            let notes = sandbox.metadata.annotations.as_ref()?;
            let claimed_at: Timestamp = notes.get(annotations::CLAIM_TIMESTAMP)?.parse().ok()?;
            if query.started_after.is_some_and(|after| claimed_at < after) {
                return None;
            }
            let visible = models::visible_state(&sandbox, now)?;
            if !query.states.contains(&visible) {
                return None;
            }
            let json = state.sandbox_json(&sandbox, visible, &domain, false);
            if query.template.as_ref().is_some_and(|t| *t != json.template_id)
                || !query.metadata.iter().all(|(k, v)| json.metadata.get(k) == Some(v))
            {
                return None;
            }
            let cursor = Cursor { key: claimed_at, id: sandbox_id(&sandbox)? };
            Some((cursor, json))
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    if query.descending {
        rows.reverse();
    }
    if let Some(after) = &query.after {
        rows.retain(|(c, _)| if query.descending { c < after } else { c > after });
    }
    let more = rows.len() > query.limit;
    rows.truncate(query.limit);
    let next = more.then(|| rows.last().map(|(c, _)| encode_cursor(c))).flatten();
    let items: Vec<SandboxJson> = rows.into_iter().map(|(_, json)| json).collect();
    let mut response = Json(items).into_response();
    if let Some(token) = next
        && let Ok(value) = HeaderValue::from_str(&token)
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// The fuzz target's check of a create's body (the `fuzzing` feature): every rule a create
/// applies to its body before it claims, on any bytes, without a panic; the labels it would
/// write are labels a selector can name.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_create_body(body: &[u8]) {
    let Ok(request) = parse_json::<NewSandboxRequest>(&Bytes::copy_from_slice(body)) else {
        return;
    };
    let _ = request.unsupported();
    let network = request.network.as_ref();
    let allow_out = network.and_then(|n| n.allow_out.as_deref()).unwrap_or_default();
    let deny_out = network.and_then(|n| n.deny_out.as_deref()).unwrap_or_default();
    if crate::egress::asks_for_policy(request.allow_internet_access, allow_out, deny_out) {
        let internet = request.allow_internet_access != Some(false);
        if let Ok(options) = NetworkOptions::checked(internet, allow_out, deny_out) {
            let _ = options.rules();
        }
    }
    let _ = plan_lifecycle(request.auto_pause, request.auto_pause_memory, request.auto_resume);
    let bounds = super::timeouts::TimeoutBounds { min: 0, max: 30 * 24 * 3600 };
    if let Ok(timeout) = bounds.create(request.timeout) {
        assert!((bounds.min..=bounds.max).contains(&timeout));
    }
    if let Ok(parsed) = parse_metadata(request.metadata.unwrap_or_default()) {
        for (key, value) in &parsed.labels {
            let selector = format!("{key}={value}");
            assert!(
                selector.parse::<oka_store::Selector>().is_ok(),
                "a label the create writes is not a label: {selector:?}"
            );
        }
    }
}

/// The fuzz target's check of a list's query string (the `fuzzing` feature): no panic, and a
/// `nextToken` it reads is written back the same.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_list_query(raw: &str) {
    if let Ok(query) = parse_list_query(Some(raw)) {
        assert!((1..=100).contains(&query.limit));
        if let Some(after) = &query.after {
            let again = decode_cursor(&encode_cursor(after));
            assert_eq!(again.ok().as_ref(), Some(after), "the cursor does not round-trip");
        }
    }
    if let Ok(cursor) = decode_cursor(raw) {
        let again = decode_cursor(&encode_cursor(&cursor));
        assert_eq!(again.ok(), Some(cursor), "the cursor does not round-trip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_rules() {
        let parse = |pairs: &[(&str, &str)]| {
            parse_metadata(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect())
        };
        let ok = parse(&[
            ("userId", "1"),
            ("label:app", "demo"),
            ("e2b.agents.kruise.io/never-timeout", "true"),
            ("example.com/k", "v"),
        ])
        .unwrap();
        assert_eq!(ok.labels, BTreeMap::from([("app".into(), "demo".into())]));
        assert_eq!(ok.annotations.len(), 2);
        assert!(ok.never_timeout && !ok.skip_init_runtime);
        let err = |pairs: &[(&str, &str)]| parse(pairs).unwrap_err().to_string();
        assert_eq!(
            err(&[("agents.kruise.io/lock", "x")]),
            "Forbidden metadata key [agents.kruise.io/lock]: cannot contain prefixes: [e2b.agents.kruise.io/ agents.kruise.io/]"
        );
        // Keys annotations cannot hold are kept together, as E2B takes any key.
        let odd = parse(&[("bad key", "x"), ("-x", "y"), ("ok", "z")]).unwrap();
        assert_eq!(odd.annotations["ok"], "z");
        assert_eq!(odd.annotations[annotations::E2B_METADATA], r#"{"-x":"y","bad key":"x"}"#);
        assert!(err(&[("label:app", "bad value!")]).starts_with("Bad extension param: "));
        assert_eq!(
            err(&[("e2b.agents.kruise.io/csi-volume-name", "x")]),
            "Bad extension param: e2b.agents.kruise.io/csi-volume-name is not supported"
        );
    }

    #[test]
    fn in_place_update_extensions() {
        let parse = |pairs: &[(&str, &str)]| {
            parse_metadata(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect())
        };
        let wait = std::time::Duration::from_secs(9);
        let none = parse(&[("k", "v")]).unwrap();
        assert_eq!(none.inplace_update(wait), None, "nothing asked, nothing updated");
        let all = parse(&[
            ("e2b.agents.kruise.io/image", "/srv/roots/python"),
            ("e2b.agents.kruise.io/cpu-request", "500m"),
            ("e2b.agents.kruise.io/cpu-limit", "2"),
        ])
        .unwrap();
        assert!(all.annotations.is_empty(), "extensions are not metadata");
        assert_eq!(
            all.inplace_update(wait),
            Some(InplaceUpdate {
                image: Some("/srv/roots/python".into()),
                cpu_request: Some(Quantity("500m".into())),
                cpu_limit: Some(Quantity("2".into())),
                ready_timeout: wait,
            })
        );
        for image in ["python:3.12", "docker.io/library/python:3.12-slim", "localhost:5000/a/b"] {
            assert_eq!(
                parse(&[("e2b.agents.kruise.io/image", image)]).unwrap().image.unwrap(),
                image
            );
        }
        let err = |pairs: &[(&str, &str)]| parse(pairs).unwrap_err().to_string();
        assert_eq!(
            err(&[("e2b.agents.kruise.io/image", "Python")]),
            "Bad extension param: invalid image [Python]: repository name must be lowercase"
        );
        assert_eq!(
            err(&[("e2b.agents.kruise.io/cpu-limit", "lots")]),
            "Bad extension param: invalid quantity for e2b.agents.kruise.io/cpu-limit [lots]: \
             quantities must match the regular expression \
             '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
        assert_eq!(
            err(&[("e2b.agents.kruise.io/cpu-request", "0")]),
            "Bad extension param: e2b.agents.kruise.io/cpu-request must be a positive value, got [0]"
        );
        // A memory quantity parses, then the create refuses it (after the other checks, as the
        // reference orders them).
        let memory = parse(&[("e2b.agents.kruise.io/cpu-limit", "512Mi")]).unwrap();
        assert!(memory.memory_asked);
        assert_eq!(memory.cpu_limit, None);
    }

    #[test]
    fn list_query_rules() {
        let q =
            parse_list_query(Some("metadata=a%3D1%26b%3D2&state=paused&limit=5&order=desc&c=3"))
                .unwrap();
        assert_eq!(
            q.metadata,
            BTreeMap::from([
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
                ("c".into(), "3".into())
            ])
        );
        assert_eq!(q.states, BTreeSet::from([SandboxState::Paused]));
        let both = parse_list_query(Some("state=running&state=paused")).unwrap();
        assert_eq!(both.states, BTreeSet::from([SandboxState::Running, SandboxState::Paused]));
        assert_eq!((q.limit, q.descending), (5, true));
        let err = |raw| parse_list_query(Some(raw)).unwrap_err().to_string();
        assert_eq!(
            err("state=dead"),
            "Only 'running' and 'paused' state are supported, not: 'dead'"
        );
        assert_eq!(err("limit=0"), "Invalid limit: 0, must be between 1 and 100");
        assert_eq!(err("limit=101"), "Invalid limit: 101, must be between 1 and 100");
        assert_eq!(
            err("agents.kruise.io%2Flock=x"),
            "Forbidden metadata key: agents.kruise.io/lock"
        );
        assert_eq!(err("nextToken=%%%"), "Invalid next token: %%%");
        // The SDKs' metadata filters: each key and value percent-encoded (Python `quote`, JS
        // `encodeURIComponent`), joined as a form, and the form encoded as the parameter.
        let sdk_query = |pairs: &[(&str, &str)]| {
            let mut inner = form_urlencoded::Serializer::new(String::new());
            for (k, v) in pairs {
                inner.append_pair(k, v);
            }
            form_urlencoded::Serializer::new(String::new())
                .append_pair("metadata", &inner.finish())
                .finish()
        };
        let python = sdk_query(&[("a/b", "x%20y"), ("user", "%C3%A9")]);
        let js = sdk_query(&[("a%2Fb", "x%20y"), ("user", "%C3%A9")]);
        let plain = sdk_query(&[("a/b", "x y"), ("user", "é")]);
        let want =
            BTreeMap::from([("a/b".to_owned(), "x y".to_owned()), ("user".into(), "é".into())]);
        for raw in [python, js, plain] {
            assert_eq!(parse_list_query(Some(&raw)).unwrap().metadata, want, "{raw}");
        }
        let literal = parse_list_query(Some("metadata=k%3D100%25")).unwrap();
        assert_eq!(literal.metadata["k"], "100%", "a lone % stays");
        let cursor = Cursor { key: "2026-01-01T00:00:00.5Z".parse().unwrap(), id: "abc".into() };
        assert_eq!(decode_cursor(&encode_cursor(&cursor)).unwrap(), cursor);
    }
}
