//! `POST /sandboxes/{id}/fork`: new sandboxes that carry on from where a running one is.
//!
//! # Expected flow
//!
//! 1. The body is `{"timeout"?, "count"?}` (E2B's `SandboxForkRequest`): each fork lives
//!    `timeout` seconds (default [`DEFAULT_FORK_TIMEOUT_SECS`], E2B's) and `count` forks are
//!    made (1 to [`MAX_FORK_COUNT`]).
//! 2. The source must run: a paused one is 409 (resume it first), one that is not Running and
//!    Ready yet is 409 too.
//! 3. One snapshot of the source is taken with its memory, the source kept running
//!    (`keepRunning`; its processes are frozen for the dump only, its ID, token and end time are
//!    untouched): a Checkpoint and its SandboxTemplate, as `create_snapshot` writes them.
//! 4. Each fork is a new sandbox restored from that snapshot (`create_from_snapshot`): a fresh
//!    ID, its own end time, and the source's metadata, env vars, template and lifecycle. Its
//!    agent runtime comes back holding the source's access token; the fork's `/init` proves it
//!    and replaces it with a fresh token of its own
//!    ([`SandboxInitializer::init_replacing`](crate::init::SandboxInitializer::init_replacing)).
//!    The forks are made concurrently.
//! 5. The snapshot is deleted: the forks have their own copies of its files and memory.
//! 6. 201 with one entry per fork, in order: `{"sandbox": <Sandbox>}` or, for a fork that
//!    failed (it is deleted), `{"error": {"code", "message"}}`; `Server-Timing` splits the time
//!    into the snapshot and the restores.
//!
//! # Guarantees
//!
//! - The source keeps running throughout, and nothing of the fork is left behind when it fails
//!   (the snapshot is deleted whatever happens; a failed fork sandbox is deleted).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use jiff::{SignedDuration, Timestamp};
use oka_api::{Checkpoint, Sandbox, SandboxPhase, SandboxState, annotations, labels, retention};
use oka_store::Store;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::models::SandboxJson;
use super::sandboxes::{
    delete_sandbox, ends_after_start, owned_sandbox, parse_optional_json, start_clock,
};
use super::templates::{
    DEFAULT_SNAPSHOT_WAIT, delete_snapshot_objects, new_checkpoint, take_snapshot,
};
use super::{ApiError, AppState, RequestContext, User, response_domain};
use crate::claim::{ClaimError, ClaimOptions, truncate_to_second};

/// How long a fork lives when the request says nothing, seconds (E2B's default).
pub const DEFAULT_FORK_TIMEOUT_SECS: i64 = 15;
/// The most forks one request makes (E2B's limit).
pub const MAX_FORK_COUNT: i64 = 100;

type AppStateRef<S> = State<Arc<AppState<S>>>;

/// The body (E2B `SandboxForkRequest`).
#[derive(Debug, Default, Deserialize)]
struct ForkRequest {
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    count: Option<i64>,
}

/// One entry of the answer (E2B `SandboxForkResult`): exactly one of the two.
#[derive(Debug, Serialize)]
struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<SandboxJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ForkError>,
}

/// A failed fork, as E2B's `Error`.
#[derive(Debug, Serialize)]
struct ForkError {
    code: u16,
    message: String,
}

/// The keys of `agents.kruise.io/updated-metadata-in-claim`: what the source's claim added.
#[derive(Debug, Default, Deserialize)]
struct ClaimedKeys {
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default)]
    annotations: Vec<String>,
}

/// The JSON of `agents.kruise.io/init-runtime-request`.
#[derive(Debug, Default, Deserialize)]
struct InitRuntimeRequest {
    #[serde(rename = "envVars", default)]
    env_vars: BTreeMap<String, String>,
}

/// The claim annotations a fork must not inherit: its own create writes them afresh.
const NOT_INHERITED: &[&str] = &[
    crate::index::IDEMPOTENCY_KEY,
    crate::index::IDEMPOTENCY_BODY_SHA256,
    annotations::TRAFFIC_ACCESS_TOKEN_SHA256,
    // A fork's traffic token is its own, minted by the fork, without the source's expiration.
    annotations::TRAFFIC_ACCESS_TOKEN_EXPIRATION,
];

/// What a fork of `source` is claimed with (pure): the labels and annotations the source's
/// claim added (its user metadata and lifecycle), its template's name, its env vars, and an end
/// `timeout` seconds after `now` (a pause there when the source pauses at its end, kept as long
/// as the source's would be). The access token is left to the caller.
fn fork_options(source: &Sandbox, timeout: i64, now: Timestamp) -> ClaimOptions {
    let notes = source.metadata.annotations.clone().unwrap_or_default();
    let source_labels = source.metadata.labels.clone().unwrap_or_default();
    let keys: ClaimedKeys = notes
        .get(annotations::UPDATED_METADATA_IN_CLAIM)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    let mut labels: BTreeMap<String, String> = keys
        .labels
        .iter()
        .filter_map(|k| source_labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect();
    if let Some(pool) = source_labels.get(labels::SANDBOX_POOL) {
        labels.insert(labels::SANDBOX_POOL.into(), pool.clone());
    }
    let annotations: BTreeMap<String, String> = keys
        .annotations
        .iter()
        .filter(|k| !NOT_INHERITED.contains(&k.as_str()))
        .filter_map(|k| notes.get(k).map(|v| (k.clone(), v.clone())))
        .collect();
    let env_vars = notes
        .get(annotations::INIT_RUNTIME_REQUEST)
        .and_then(|json| serde_json::from_str::<InitRuntimeRequest>(json).ok())
        .unwrap_or_default()
        .env_vars;
    let end = truncate_to_second(now + SignedDuration::from_secs(timeout));
    let (pause_time, shutdown_time) = if source.spec.pause_time.is_some() {
        let retention = notes
            .get(annotations::RESERVE_PAUSED_SANDBOX_DURATION)
            .and_then(|r| retention::parse(r))
            .unwrap_or(retention::FOREVER);
        (Some(end), Some(end.saturating_add(retention).unwrap_or(Timestamp::MAX)))
    } else if source.spec.shutdown_time.is_none() {
        (None, None) // never-timeout
    } else {
        (None, Some(end))
    };
    ClaimOptions {
        shutdown_time,
        pause_time,
        labels,
        annotations,
        env_vars,
        access_token: None,
        pause_strategy: None,
        ..ClaimOptions::default()
    }
}

/// 400 unless the request is within E2B's bounds; the fork's timeout and count.
fn check_request(
    request: &ForkRequest,
    bounds: super::timeouts::TimeoutBounds,
) -> Result<(i64, usize), ApiError> {
    let timeout = bounds.check(request.timeout.unwrap_or(DEFAULT_FORK_TIMEOUT_SECS))?;
    let count = request.count.unwrap_or(1);
    if count < 1 {
        return Err(ApiError::BadRequest("Count must be at least 1".into()));
    }
    if count > MAX_FORK_COUNT {
        return Err(ApiError::BadRequest(format!("Count cannot be greater than {MAX_FORK_COUNT}")));
    }
    Ok((timeout, usize::try_from(count).unwrap_or(1)))
}

/// `POST /sandboxes/{id}/fork`; see the [module documentation](self).
pub(super) async fn fork<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ForkRequest = parse_optional_json(&body)?;
    let (timeout, count) = check_request(&request, state.config.timeouts())?;
    let domain = response_domain(&state.config, &context)?;
    let (source, visible) = owned_sandbox(&state, &user, &id)?;
    if visible == SandboxState::Paused || source.is_paused() {
        return Err(ApiError::Conflict(format!(
            "Sandbox '{id}' is paused and cannot be forked; resume it first"
        )));
    }
    if source.phase() != Some(&SandboxPhase::Running) || !source.is_ready() {
        return Err(ApiError::Conflict(format!(
            "Sandbox '{id}' cannot be forked while it is not ready"
        )));
    }
    super::templates::refuse_pod_sandbox(&state, &source, &id, "forks")?;
    if !state.config.snapshots.enabled {
        return Err(ApiError::NotImplemented(format!(
            "Failed to fork sandbox {id}: no checkpoint controller runs on this node"
        )));
    }
    state.config.snapshots.check_available()?;
    let started = std::time::Instant::now();
    let checkpoint =
        new_checkpoint(&source, &user, &id, Some(true), None, Some(vec!["memory".into()]));
    let (snapshot, snapshot_id) =
        take_snapshot(&state, &source, &id, &checkpoint, DEFAULT_SNAPSHOT_WAIT).await?;
    let snapshot_done = started.elapsed();
    let held_token = crate::create::snapshot_access_token(&snapshot);
    let mut options = fork_options(&source, timeout, Timestamp::now());
    options.quota = user.quota.clone();
    let forks = (0..count).map(|_| {
        one_fork(&state, &user, &snapshot, &options, timeout, held_token.as_deref(), &domain)
    });
    let results: Vec<ForkResult> = futures::future::join_all(forks).await;
    let forks_done = started.elapsed();
    if let Err(error) = delete_snapshot_objects(&state, &snapshot).await {
        warn!(sandbox = %id, snapshot = %snapshot_id, %error, "cannot delete the fork's snapshot");
    }
    let made = results.iter().filter(|r| r.sandbox.is_some()).count();
    info!(sandbox = %id, made, asked = count, "sandbox forked");
    let mut response = (StatusCode::CREATED, Json(results)).into_response();
    response.headers_mut().insert("server-timing", server_timing(snapshot_done, forks_done));
    Ok(response)
}

/// The `Server-Timing` header of a fork: the snapshot, the forks' restores and `/init`s, and the
/// total until they ran (the snapshot's deletion follows), in milliseconds.
fn server_timing(snapshot: std::time::Duration, forks: std::time::Duration) -> HeaderValue {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let value = format!(
        "snapshot;dur={:.3}, restore;dur={:.3}, total;dur={:.3}",
        ms(snapshot),
        ms(forks.saturating_sub(snapshot)),
        ms(forks)
    );
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("total"))
}

/// One fork from `snapshot`: a new sandbox with a fresh access token (and traffic token when the
/// source needs one), running and routed, or why not.
async fn one_fork<S: Store>(
    state: &AppState<S>,
    user: &User,
    snapshot: &Checkpoint,
    options: &ClaimOptions,
    timeout: i64,
    held_token: Option<&str>,
    domain: &str,
) -> ForkResult {
    let failed = |error: ApiError| ForkResult {
        sandbox: None,
        error: Some(ForkError { code: error.status().as_u16(), message: error.to_string() }),
    };
    let mut options = options.clone();
    let token = uuid::Uuid::new_v4().to_string();
    options.access_token = Some(token.clone());
    let traffic_token = options
        .annotations
        .get(annotations::ENABLE_JWT_AUTH)
        .is_some_and(|v| v == "true")
        .then(|| uuid::Uuid::new_v4().to_string());
    if let Some(traffic) = &traffic_token {
        options.annotations.insert(
            annotations::TRAFFIC_ACCESS_TOKEN_SHA256.into(),
            crate::api::keys::key_hash(traffic),
        );
    }
    let later = ends_after_start(&options, state.config.create.ready_timeout);
    let mut claimed = match state
        .engine
        .create_from_snapshot(snapshot, &user.id, &later, &state.config.create)
        .await
    {
        Ok(claimed) => claimed,
        Err(
            error @ (ClaimError::PoolExhausted { .. }
            | ClaimError::TooManyConflicts { .. }
            | ClaimError::RateLimited { .. }),
        ) => {
            return failed(ApiError::PoolExhausted {
                message: format!("Failed to fork sandbox: {error}"),
                retry_after_secs: state.config.retry_after_secs,
            });
        }
        Err(ClaimError::Quota(error)) => return failed(super::sandboxes::quota_error(error)),
        Err(error) => {
            return failed(ApiError::Internal(format!("Failed to fork sandbox: {error}")));
        }
    };
    match start_clock(state, &claimed, timeout).await {
        Ok(sandbox) => claimed.sandbox = sandbox,
        Err(error) => return failed(error),
    }
    let proof = held_token.unwrap_or(&token);
    if let Err(error) =
        state.initializer.init_replacing(&claimed.sandbox, &options.env_vars, &token, proof).await
    {
        warn!(sandbox = %claimed.sandbox_id, %error, "fork init failed; deleting the fork");
        let cleaned = delete_sandbox(state, &claimed.sandbox).await.is_ok();
        return failed(ApiError::Internal(format!(
            "Failed to initialise the fork: {error}; clean up sandbox: {cleaned}"
        )));
    }
    if let Some(routes) = &state.routes {
        routes.wait_routed(&claimed.sandbox_id, super::sandboxes::ROUTE_WAIT).await;
    }
    let mut json = state.sandbox_json(&claimed.sandbox, SandboxState::Running, domain, true);
    json.traffic_access_token = traffic_token;
    ForkResult { sandbox: Some(json), error: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::timeouts::TimeoutBounds;

    fn now() -> Timestamp {
        Timestamp::from_second(1_767_225_600).unwrap()
    }

    #[test]
    fn request_bounds() {
        let bounds = TimeoutBounds { min: 0, max: 3600 };
        let check = |timeout, count| {
            check_request(&ForkRequest { timeout, count }, bounds).map_err(|e| e.to_string())
        };
        assert_eq!(check(None, None), Ok((15, 1)));
        assert_eq!(check(Some(60), Some(3)), Ok((60, 3)));
        assert_eq!(check(None, Some(100)), Ok((15, 100)));
        assert_eq!(check(None, Some(0)), Err("Count must be at least 1".into()));
        assert_eq!(check(None, Some(101)), Err("Count cannot be greater than 100".into()));
        assert_eq!(check(Some(3601), None), Err("timeout should between 0 and 3600".into()));
    }

    #[test]
    fn a_fork_inherits_the_claims_metadata_env_and_lifecycle_but_not_its_keys() {
        let claimed = serde_json::json!({"labels": ["app"], "annotations": [
            "userId", annotations::AUTO_RESUME, crate::index::IDEMPOTENCY_KEY,
            annotations::TRAFFIC_ACCESS_TOKEN_SHA256]});
        let source = Sandbox::test()
            .claimed()
            .label("app", "demo")
            .label(labels::SANDBOX_POOL, "base")
            .label("pool-only", "x")
            .annotation("userId", "7")
            .annotation(annotations::AUTO_RESUME, "true")
            .annotation(crate::index::IDEMPOTENCY_KEY, "k")
            .annotation(annotations::TRAFFIC_ACCESS_TOKEN_SHA256, "hash")
            .annotation(annotations::UPDATED_METADATA_IN_CLAIM, &claimed.to_string())
            .annotation(
                annotations::INIT_RUNTIME_REQUEST,
                r#"{"envVars":{"A":"1"},"accessToken":"old"}"#,
            )
            .pause_at(now())
            .build();
        let options = fork_options(&source, 60, now());
        assert_eq!(
            options.labels,
            BTreeMap::from([
                ("app".into(), "demo".into()),
                (labels::SANDBOX_POOL.into(), "base".into())
            ])
        );
        assert_eq!(
            options.annotations,
            BTreeMap::from([
                ("userId".into(), "7".into()),
                (annotations::AUTO_RESUME.into(), "true".into())
            ])
        );
        assert_eq!(options.env_vars, BTreeMap::from([("A".into(), "1".into())]));
        let end = now() + SignedDuration::from_secs(60);
        assert_eq!(options.pause_time, Some(end), "the source pauses at its end: so does the fork");
        assert!(options.shutdown_time.unwrap() > end + SignedDuration::from_hours(24 * 365));
        assert_eq!(options.access_token, None);
        // A source that is killed at its end: the fork too.
        let plain = Sandbox::test().claimed().shutdown_at(now()).build();
        let options = fork_options(&plain, 15, now());
        assert_eq!(
            (options.pause_time, options.shutdown_time),
            (None, Some(now() + SignedDuration::from_secs(15)))
        );
    }
}
