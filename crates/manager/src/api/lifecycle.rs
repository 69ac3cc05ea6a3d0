//! Pause and resume: `POST /sandboxes/{id}/pause`, `POST /sandboxes/{id}/resume`, and the
//! resume half of `connect`.
//!
//! # Expected flow
//!
//! - **Pause** (body `{"memory", "requireHealthyGuest"}`, both optional): a sandbox already
//!   paused is 409; one being paused is waited for like a new pause (204, E2B's idempotent
//!   answer); one that is not Running and Ready is 409 `not pausable`. With
//!   `requireHealthyGuest`, and always for a filesystem-only pause (`memory: false`), the
//!   agent runtime must answer first, else 503 and the sandbox runs on. A pause that would
//!   hibernate on a machine that cannot (the snapshot gate: no CRIU) is 501 naming the feature
//!   and how to turn it on, before anything is written. Then one
//!   compare-and-swap write sets `spec.paused` and the pause strategy of what `memory` asks for
//!   (first writer wins; with the paused retention, from the
//!   `x-e2b-kruise-reserve-paused-sandbox-duration` header, else the sandbox's
//!   `agents.kruise.io/reserve-paused-sandbox-duration`, else forever: an existing
//!   `shutdownTime` and `pauseTime` both become now + retention, as the reference writes them).
//!   Then the handler waits, driven by the index's watch, until the sandbox controller reports
//!   phase `Paused` with `SandboxPaused=True`, and answers 204; after [`PAUSE_WAIT`] it answers
//!   E2B's 202 "still in progress" instead (the SDKs' request timeout is 60 s). The write
//!   marks the pause `agents.kruise.io/paused-by: api` (replacing an auto-pause policy's
//!   marker): an explicit pause, which the gateway wakes only when the sandbox's
//!   `agents.kruise.io/auto-resume` is `true` and which the policy's resume rule (scope
//!   `PolicyPaused`) leaves alone.
//! - **Resume** (and `connect` on a paused sandbox): a sandbox still pausing is waited for
//!   first. With `memory: false` a sandbox paused with its memory drops it first (its pause
//!   deepens to `Stop`), so it starts afresh on its files. The first writer clears
//!   `spec.paused` and writes the new end time (the request's timeout within the API's bounds,
//!   else 300 s) and the pause strategy of its timeout pause in the same write, so the
//!   controller cannot re-pause it at once, and removes the `paused-by` marker (a user's
//!   resume of a policy-paused sandbox takes it back from the policy, as the gateway's wake
//!   does); the handler waits until the sandbox runs (Running
//!   and Ready, at most [`RESUME_WAIT`]), replays the recorded `/init`
//!   (`agents.kruise.io/init-runtime-request`) to the agent runtime, and answers.
//!
//! # Where this differs from the reference, and why
//!
//! - Pausing a paused sandbox is 409 (E2B's API; the SDK returns `False`), not the reference's
//!   idempotent 204; a pause or a resume of a sandbox being paused waits for that pause, as
//!   E2B's do.
//! - A pause that takes longer than [`PAUSE_WAIT`] answers 202 (E2B), not a 500 after a
//!   minute.
//! - `/resume` answers 201 with the sandbox (what SDK 1.x reads), not 204, and 409 when the
//!   sandbox is not paused; a bad timeout is 400, not 500.
//! - After a resume the manager replays `/init` itself (the reference leaves it to the
//!   controller): a sandbox paused by `Stop` restarts its agent runtime without its token.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::common::{PauseStrategy, PauseStrategyType};
use oka_api::conditions::sandbox::PAUSED;
use oka_api::{Sandbox, SandboxPhase, SandboxState, annotations, conditions, labels, retention};
use serde::Deserialize;
use tracing::{info, warn};

use super::models::{self, ResumeRequest};
use super::sandboxes::{
    EndPolicy, owned_sandbox, parse_optional_json, visible_to, with_end, write_with_retry,
};
use super::timeouts::PauseMemory;
use super::{ApiError, AppState, RequestContext, User, response_domain};
use crate::claim::truncate_to_second;
use crate::index::sandbox_id;
use oka_store::Store;

/// How long a pause waits for the controller to report the sandbox paused: within the SDKs'
/// 60 s request timeout, so the answer reaches the caller.
pub const PAUSE_WAIT: Duration = Duration::from_secs(50);
/// How long a resume waits for the sandbox to run again (within the SDKs' request timeout too).
pub const RESUME_WAIT: Duration = Duration::from_secs(50);
/// The header that overrides the paused retention of one pause.
pub const RESERVE_PAUSED_HEADER: &str = "x-e2b-kruise-reserve-paused-sandbox-duration";

type AppStateRef<S> = State<Arc<AppState<S>>>;

/// Whether the controller reports the sandbox paused: phase Paused and `SandboxPaused=True`.
pub fn is_paused_done(sandbox: &Sandbox) -> bool {
    sandbox.phase() == Some(&SandboxPhase::Paused)
        && sandbox.condition(PAUSED).is_some_and(conditions::is_true)
}

/// Whether the sandbox runs: not paused, phase Running and Ready.
pub fn is_running(sandbox: &Sandbox) -> bool {
    !sandbox.is_paused() && sandbox.phase() == Some(&SandboxPhase::Running) && sandbox.is_ready()
}

/// `POST /sandboxes/{id}/pause` (body `{"memory": bool}`, optional): 204 once paused; 409
/// when already paused or not pausable.
pub(super) async fn pause<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let attributes = vec![oka_telemetry::Attribute::new("sandbox.id", id.clone())];
    let pause = pause_sandbox(&state, &user, id, &headers, &body);
    oka_telemetry::in_span(oka_telemetry::MANAGER, "manager.PauseSandbox", attributes, pause).await
}

/// [`pause`]'s work, in its span.
async fn pause_sandbox<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: String,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let request: PauseRequest = parse_optional_json(body)?;
    let memory = PauseMemory::from_flag(request.memory);
    let header_retention = match headers.get(RESERVE_PAUSED_HEADER) {
        None => None,
        Some(value) => {
            let text = value.to_str().unwrap_or_default().to_owned();
            retention::parse(&text).map(|d| (d, text.clone())).map(Some).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "Bad extension param: invalid {RESERVE_PAUSED_HEADER} {text:?}: use \
                     \"forever\" or a positive Go duration"
                ))
            })?
        }
    };
    let (sandbox, _) = owned_sandbox(state, user, &id)?;
    let resource = resource_of(&sandbox);
    let strategy = memory.strategy(memory_strategy(state, &sandbox).as_ref());
    if sandbox.phase() == Some(&SandboxPhase::Paused) {
        return Err(ApiError::Conflict(format!(
            "Failed to pause sandbox: Conflict: sandbox {id} is already paused; sandboxResource={resource}"
        )));
    }
    // A pause in progress: this request waits for it too (E2B's answer is the same 204).
    let pausing = sandbox.is_paused();
    if !pausing && (sandbox.phase() != Some(&SandboxPhase::Running) || !sandbox.is_ready()) {
        let reason = match sandbox.phase() {
            Some(SandboxPhase::Running) => "SandboxNotReady".to_owned(),
            Some(phase) => format!("SandboxIs{phase}"),
            None => "SandboxHasNoPhase".to_owned(),
        };
        return Err(ApiError::Conflict(format!(
            "Failed to pause sandbox: Conflict: sandbox is not pausable, reason: {reason}; sandboxResource={resource}"
        )));
    }
    // A hibernation this machine cannot make (no CRIU) is refused before anything is written,
    // so the sandbox keeps running rather than waiting on a pause that cannot happen.
    let hibernates =
        strategy.as_ref().and_then(|s| s.type_.as_ref()) == Some(&PauseStrategyType::Hibernate);
    if !pausing && hibernates {
        state.config.snapshots.check_available()?;
    }
    // A filesystem-only pause ends the processes, which the agent runtime must see through.
    if !pausing
        && (request.require_healthy_guest == Some(true) || memory == PauseMemory::Filesystem)
    {
        probe_guest(state, &sandbox, &id).await?;
    }
    let now = Timestamp::now();
    write_with_retry(state, &id, sandbox, "pause sandbox", |s| {
        // First writer wins: only the request that flips `spec.paused` writes the times.
        if s.is_paused() {
            return None;
        }
        let note = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::RESERVE_PAUSED_SANDBOX_DURATION));
        let (retention, text) = header_retention.clone().unwrap_or_else(|| {
            note.and_then(|t| retention::parse(t).map(|d| (d, t.clone())))
                .unwrap_or((retention::FOREVER, annotations::RESERVE_FOREVER.to_owned()))
        });
        let until = truncate_to_second(now.saturating_add(retention).unwrap_or(Timestamp::MAX));
        let mut paused = s.clone();
        paused.spec.paused = Some(true);
        paused.spec.pause_strategy.clone_from(&strategy);
        if paused.spec.shutdown_time.is_some() {
            paused.spec.shutdown_time = Some(Time(until));
        }
        if paused.spec.pause_time.is_some() {
            paused.spec.pause_time = Some(Time(until));
        }
        let notes = paused.metadata.annotations.get_or_insert_default();
        notes.insert(annotations::RESERVE_PAUSED_SANDBOX_DURATION.into(), text);
        // An explicit pause: the policy's marker gives way to the API's (see the module doc).
        notes.insert(annotations::PAUSED_BY.into(), annotations::PAUSED_BY_API.into());
        Some(paused)
    })
    .await?;
    match wait_for_sandbox(state, user, &id, PAUSE_WAIT, is_paused_done).await {
        Ok(_) => {}
        Err(WaitError::Gone) => return Err(ApiError::sandbox_not_found(&id)),
        // Still going: E2B's answer, which the SDKs count as done, so that the caller's own
        // request timeout never fires first.
        Err(WaitError::TimedOut) => {
            let body = serde_json::json!({"code": 202, "message": PAUSE_IN_PROGRESS});
            return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
        }
        Err(WaitError::Failed(why)) => {
            return Err(ApiError::Internal(format!(
                "Failed to pause sandbox: {why}; sandboxResource={resource}"
            )));
        }
    }
    info!(sandbox = %id, "sandbox paused");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The 202 of a pause that outlasts [`PAUSE_WAIT`] (E2B's words).
pub const PAUSE_IN_PROGRESS: &str =
    "Pause is still in progress. Check the sandbox info endpoint for the latest status.";

/// How long a pause waits for the agent runtime's answer before it refuses (503).
const GUEST_PROBE: Duration = Duration::from_secs(2);

/// 503 unless `sandbox`'s agent runtime answers within [`GUEST_PROBE`] (E2B's
/// `requireHealthyGuest`); a node without an agent runtime to ask passes.
async fn probe_guest<S: Store>(
    state: &AppState<S>,
    sandbox: &Sandbox,
    id: &str,
) -> Result<(), ApiError> {
    let token = models::access_token(sandbox);
    let probe = state.initializer.metrics(sandbox, token.as_deref());
    match tokio::time::timeout(GUEST_PROBE, probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => {
            warn!(sandbox = %id, %error, "the guest agent does not answer; pause refused");
            Err(ApiError::Unavailable(format!(
                "Sandbox '{id}' cannot be paused: its guest agent does not respond"
            )))
        }
        Err(_) => Err(ApiError::Unavailable(format!(
            "Sandbox '{id}' cannot be paused: its guest agent did not answer within {}s",
            GUEST_PROBE.as_secs()
        ))),
    }
}

/// The pause strategy that keeps `sandbox`'s memory: its pool's (none is a freeze; `Hibernate`
/// a checkpoint to disk), else, when the pool is gone, its own.
fn memory_strategy<S: Store>(state: &AppState<S>, sandbox: &Sandbox) -> Option<PauseStrategy> {
    let pool = sandbox.metadata.labels.as_ref().and_then(|l| l.get(labels::SANDBOX_POOL));
    match pool.and_then(|p| state.index.sandbox_set(sandbox.metadata.namespace.as_deref(), p)) {
        Some(set) => set.spec.pause_strategy.clone(),
        None => sandbox.spec.pause_strategy.clone(),
    }
}

/// The pause strategy of `sandbox`'s timeout pause, as its create chose it
/// (`agents.kruise.io/auto-pause-memory`).
fn timeout_strategy<S: Store>(state: &AppState<S>, sandbox: &Sandbox) -> Option<PauseStrategy> {
    let chosen = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::AUTO_PAUSE_MEMORY))
        .map(String::as_str);
    PauseMemory::parse(chosen).strategy(memory_strategy(state, sandbox).as_ref())
}

fn resource_of(sandbox: &Sandbox) -> String {
    format!(
        "{}/{}",
        sandbox.metadata.namespace.as_deref().unwrap_or_default(),
        sandbox.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Why waiting for a sandbox ended without the state.
enum WaitError {
    /// Deleted, or no longer the caller's.
    Gone,
    /// Not reached in time.
    TimedOut,
    /// The controller reported a failure (the text says which).
    Failed(String),
}

/// What the controller reported that ends a wait early: the sandbox ended, or its pause
/// (hibernation) failed. The controller keeps retrying a failed pause; the caller is told now
/// instead of after the whole wait.
fn failure(sandbox: &Sandbox) -> Option<String> {
    if let Some(phase @ (SandboxPhase::Failed | SandboxPhase::Succeeded)) = sandbox.phase() {
        let message = sandbox.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
        return Some(format!("the sandbox ended ({phase}): {message}"));
    }
    let paused = sandbox.condition(PAUSED)?;
    (paused.status == conditions::FALSE
        && paused.reason == conditions::sandbox::paused_reason::CHECKPOINT_FAILED)
        .then(|| format!("{}: {}", paused.reason, paused.message))
}

/// Waits (on the index's changes) until the caller's sandbox `id` satisfies `done`.
async fn wait_for_sandbox<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
    timeout: Duration,
    done: impl Fn(&Sandbox) -> bool,
) -> Result<Arc<Sandbox>, WaitError> {
    let outcome = state
        .index
        .wait_for(timeout, |index| match index.by_id(id) {
            None => Some(Err(WaitError::Gone)),
            Some(s) if !visible_to(user, &s) || s.metadata.deletion_timestamp.is_some() => {
                Some(Err(WaitError::Gone))
            }
            Some(s) if done(&s) => Some(Ok(s)),
            Some(s) => failure(&s).map(|why| Err(WaitError::Failed(why))),
        })
        .await;
    outcome.unwrap_or(Err(WaitError::TimedOut))
}

/// `POST /sandboxes/{id}/pause`'s body (E2B `SandboxPauseRequest`).
#[derive(Debug, Default, Deserialize)]
struct PauseRequest {
    /// Keep the memory (`true`, the default) or only the files.
    #[serde(default)]
    memory: Option<bool>,
    /// Refuse (503) rather than pause a sandbox whose agent runtime does not answer.
    #[serde(rename = "requireHealthyGuest", default)]
    require_healthy_guest: Option<bool>,
}

/// What a resume asks for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resume {
    /// Seconds until the resumed sandbox's end (300 when absent).
    pub timeout: Option<i64>,
    /// Switch the end to pause (`Some(true)`) or kill (`Some(false)`).
    pub auto_pause: Option<bool>,
    /// Carry on in memory, or start afresh on the files.
    pub memory: PauseMemory,
}

/// Resumes the caller's paused `sandbox` (see the [module documentation](self)) with an end
/// time `timeout` seconds from now (300 when absent); `auto_pause`
/// switches the end to pause (`Some(true)`) or kill (`Some(false)`). Returns it running.
/// With `memory` [`PauseMemory::Filesystem`], a sandbox paused with its memory first drops it
/// ([`drop_memory`]) and then starts afresh on its files.
///
/// # Errors
///
/// `pausing` (the [`ApiError`] to answer when a pause in progress does not end within
/// [`PAUSE_WAIT`]: 400 for `connect`, as the reference, 409 for `/resume`), 404 when it goes
/// away, 500 when it does not run again within [`RESUME_WAIT`] or the agent runtime cannot be
/// re-initialised.
pub(super) async fn resume_sandbox<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
    sandbox: Arc<Sandbox>,
    resume: Resume,
    pausing: impl FnOnce(String) -> ApiError,
) -> Result<Arc<Sandbox>, ApiError> {
    let attributes = vec![oka_telemetry::Attribute::new("sandbox.id", id.to_owned())];
    let work = resume_sandbox_untraced(state, user, id, sandbox, resume, pausing);
    oka_telemetry::in_span(oka_telemetry::MANAGER, "manager.ResumeSandbox", attributes, work).await
}

/// [`resume_sandbox`]'s work, in its span.
async fn resume_sandbox_untraced<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
    sandbox: Arc<Sandbox>,
    resume: Resume,
    pausing: impl FnOnce(String) -> ApiError,
) -> Result<Arc<Sandbox>, ApiError> {
    let Resume { timeout, auto_pause, memory } = resume;
    let resource = resource_of(&sandbox);
    // A pause in progress is waited for, then undone (E2B waits too).
    let sandbox = if sandbox.is_paused() && sandbox.phase() == Some(&SandboxPhase::Running) {
        wait_for_sandbox(state, user, id, PAUSE_WAIT, is_paused_done).await.map_err(|e| match e {
            WaitError::Gone => ApiError::sandbox_not_found(id),
            WaitError::TimedOut | WaitError::Failed(_) => pausing(format!(
                "Failed to resume sandbox: Conflict: sandbox is not resumable, reason: SandboxIsPausing; sandboxResource={resource}"
            )),
        })?
    } else {
        sandbox
    };
    let timeout = state.config.timeouts().resume(timeout)?;
    let sandbox = match memory {
        PauseMemory::Filesystem if kept_memory(&sandbox) => {
            drop_memory(state, user, id, sandbox).await?
        }
        _ => sandbox,
    };
    let strategy = timeout_strategy(state, &sandbox);
    write_with_retry(state, id, sandbox, "resume sandbox", |s| {
        // First writer wins: only the request that clears `spec.paused` writes.
        s.is_paused().then(|| {
            let mut base = s.clone();
            match auto_pause {
                Some(true) if base.spec.pause_time.is_none() => {
                    base.spec.pause_time = Some(Time(Timestamp::now()));
                }
                Some(false) if base.spec.pause_time.is_some() => {
                    base.spec.pause_time = None;
                    base.spec.shutdown_time = Some(Time(Timestamp::now()));
                }
                _ => {}
            }
            let mut resumed =
                with_end(&base, timeout, EndPolicy::Always).unwrap_or_else(|| base.clone());
            resumed.spec.paused = Some(false);
            // The next timeout pause keeps what the create asked for, whatever this pause kept.
            resumed.spec.pause_strategy.clone_from(&strategy);
            // Whoever paused it, a user resumed it: no `paused-by` marker is left behind.
            if let Some(notes) = resumed.metadata.annotations.as_mut() {
                notes.remove(annotations::PAUSED_BY);
            }
            resumed
        })
    })
    .await?;
    let running =
        wait_for_sandbox(state, user, id, RESUME_WAIT, is_running).await.map_err(|e| match e {
            WaitError::Gone => ApiError::sandbox_not_found(id),
            WaitError::TimedOut => ApiError::Internal(format!(
                "Failed to resume sandbox: sandbox {id} did not run again within {}s; sandboxResource={resource}",
                RESUME_WAIT.as_secs()
            )),
            WaitError::Failed(why) => ApiError::Internal(format!(
                "Failed to resume sandbox: {why}; sandboxResource={resource}"
            )),
        })?;
    reinit(state, &running).await?;
    info!(sandbox = %id, "sandbox resumed");
    Ok(running)
}

/// Whether `sandbox`'s pause kept its memory (frozen or hibernated): a resume that asks for
/// none must first end its processes.
fn kept_memory(sandbox: &Sandbox) -> bool {
    sandbox
        .condition(PAUSED)
        .is_none_or(|c| c.reason != conditions::sandbox::paused_reason::STOP_PAUSE_SUCCEED)
}

/// Turns the memory-keeping pause of `sandbox` into a filesystem-only one: the pause strategy
/// becomes `Stop`, and the controller ends the frozen (or discards the hibernated) processes;
/// returns the sandbox once it reports the deeper pause. Its files stay, so the resume that
/// follows starts it afresh on them (E2B's `on_resume="reboot"`).
async fn drop_memory<S: Store>(
    state: &AppState<S>,
    user: &User,
    id: &str,
    sandbox: Arc<Sandbox>,
) -> Result<Arc<Sandbox>, ApiError> {
    let resource = resource_of(&sandbox);
    let stop = PauseMemory::Filesystem.strategy(None);
    write_with_retry(state, id, sandbox, "resume sandbox", |s| {
        (s.is_paused() && s.spec.pause_strategy != stop).then(|| {
            let mut stopping = s.clone();
            stopping.spec.pause_strategy.clone_from(&stop);
            stopping
        })
    })
    .await?;
    wait_for_sandbox(state, user, id, PAUSE_WAIT, |s| is_paused_done(s) && !kept_memory(s))
        .await
        .map_err(|e| match e {
            WaitError::Gone => ApiError::sandbox_not_found(id),
            WaitError::TimedOut => ApiError::Internal(format!(
                "Failed to resume sandbox: sandbox {id} did not drop its memory within {}s; sandboxResource={resource}",
                PAUSE_WAIT.as_secs()
            )),
            WaitError::Failed(why) => ApiError::Internal(format!(
                "Failed to resume sandbox: {why}; sandboxResource={resource}"
            )),
        })
}

/// Replays the recorded `/init` to a resumed sandbox's agent runtime.
async fn reinit<S: Store>(state: &AppState<S>, sandbox: &Sandbox) -> Result<(), ApiError> {
    crate::init::replay_recorded(state.initializer.as_ref(), sandbox).await.map_err(|error| {
        warn!(sandbox = ?sandbox_id(sandbox), %error, "re-init after resume failed");
        ApiError::Internal(format!(
            "Failed to resume sandbox: {error}; sandboxResource={}",
            resource_of(sandbox)
        ))
    })
}

/// `POST /sandboxes/{id}/resume` (SDK 1.x): 201 with the sandbox once it runs; 409 when it is
/// not paused.
pub(super) async fn resume<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Extension(context): Extension<RequestContext>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ResumeRequest = parse_optional_json(&body)?;
    if let Some(timeout) = request.timeout {
        state.config.timeouts().check(timeout)?;
    }
    let domain = response_domain(&state.config, &context)?;
    let (sandbox, visible) = owned_sandbox(&state, &user, &id)?;
    if visible == SandboxState::Running && !sandbox.is_paused() {
        return Err(ApiError::Conflict(format!(
            "Failed to resume sandbox: Conflict: sandbox is not resumable, reason: SandboxIsRunning; sandboxResource={}",
            resource_of(&sandbox)
        )));
    }
    let running = resume_sandbox(
        &state,
        &user,
        &id,
        sandbox,
        Resume {
            timeout: request.timeout,
            auto_pause: request.auto_pause,
            memory: PauseMemory::from_flag(request.memory),
        },
        ApiError::Conflict,
    )
    .await?;
    let body = state.sandbox_json(&running, SandboxState::Running, &domain, true);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}
