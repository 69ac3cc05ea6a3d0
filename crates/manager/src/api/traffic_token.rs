//! `POST /sandboxes/{id}/traffic-access-token`: a new traffic access token for a sandbox that
//! requires traffic auth (the reference's refresh route, `traffic_token.go`).
//!
//! # Expected flow
//!
//! 1. The sandbox is the caller's, as for every sandbox route (else 404 `Sandbox not found`),
//!    running or paused, and requires traffic auth (annotation
//!    `security.agents.kruise.io/enable-jwt-auth: "true"`, which E2B's
//!    `network.allowPublicTraffic: false` writes); else 409
//!    `Sandbox cannot refresh its traffic access token`.
//! 2. Concurrent refreshes of one sandbox (UID and ID) share one issuance ([`Flights`]), run in
//!    its own task so a caller that goes away does not cut it short.
//! 3. The token is a random UUID, as the reference's community provider issues, valid for
//!    `ManagerConfig::traffic_token_validity` (100 years by default). The sandbox keeps its
//!    SHA-256 and expiration (`security.agents.kruise.io/traffic-access-token-sha256`,
//!    `…-expiration`), written in one compare-and-swap update: **the new token replaces the
//!    previous one**, which stops passing the gateway at once (a refresh is also how a leaked
//!    token is revoked; the SDKs switch to the answer's token before their next request).
//! 4. The answer waits (at most 2 s) for the gateway's route table to hold the written version,
//!    so the token passes the gateway as soon as the caller has it; then 200
//!    `{"trafficAccessToken", "trafficAccessTokenExpiration"}` (RFC 3339, UTC, seconds).
//!
//! The gateway accepts the token in every auth mode (`oka_gateway::auth`); in `jwt` mode it
//! also accepts JWTs of the configured identity provider, which oka does not issue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::extract::{Extension, Path, State};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use jiff::{SignedDuration, Timestamp};
use oka_api::{Sandbox, SandboxState, annotations};
use oka_store::Store;
use serde::Serialize;

use super::auth::User;
use super::sandboxes::{ROUTE_WAIT, visible_to, write_with_retry};
use super::{ApiError, AppState, models};

/// The answer (the reference's `models.TrafficAccessToken`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrafficAccessToken {
    /// The token, sent by clients in `e2b-traffic-access-token`.
    #[serde(rename = "trafficAccessToken")]
    pub token: String,
    /// When it stops passing the gateway (RFC 3339, UTC, seconds).
    #[serde(rename = "trafficAccessTokenExpiration")]
    pub expiration: String,
}

type Flight = Shared<BoxFuture<'static, Result<TrafficAccessToken, ApiError>>>;

/// The refreshes in flight, keyed by sandbox UID and ID.
#[derive(Default)]
pub(crate) struct Flights(Mutex<HashMap<String, Flight>>);

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Flight>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

const NOT_FOUND: &str = "Sandbox not found";
const CONFLICT: &str = "Sandbox cannot refresh its traffic access token";

/// Why `sandbox` (the caller's) cannot have a token now, if it cannot (step 1).
fn refusal(sandbox: &Sandbox, now: Timestamp) -> Option<ApiError> {
    match models::visible_state(sandbox, now) {
        None => return Some(ApiError::NotFound(NOT_FOUND.into())),
        Some(SandboxState::Running | SandboxState::Paused) => {}
        Some(_) => return Some(ApiError::Conflict(CONFLICT.into())),
    }
    let required = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::ENABLE_JWT_AUTH))
        .is_some_and(|v| v == "true");
    (!required).then(|| ApiError::Conflict(CONFLICT.into()))
}

/// The sandbox with `token` as its traffic token until `expiration`.
fn with_token(sandbox: &Sandbox, token: &str, expiration: &str) -> Sandbox {
    let mut updated = sandbox.clone();
    let notes = updated.metadata.annotations.get_or_insert_with(Default::default);
    notes.insert(annotations::TRAFFIC_ACCESS_TOKEN_SHA256.into(), super::keys::key_hash(token));
    notes.insert(annotations::TRAFFIC_ACCESS_TOKEN_EXPIRATION.into(), expiration.into());
    updated
}

/// `POST /sandboxes/{id}/traffic-access-token`; see the [module documentation](self).
pub(super) async fn refresh<S: Store>(
    State(state): State<Arc<AppState<S>>>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<Json<TrafficAccessToken>, ApiError> {
    let sandbox = state
        .index
        .by_id(&id)
        .filter(|s| visible_to(&user, s))
        .ok_or_else(|| ApiError::NotFound(NOT_FOUND.into()))?;
    if let Some(refused) = refusal(&sandbox, Timestamp::now()) {
        return Err(refused);
    }
    let key = format!("{}\0{id}", sandbox.metadata.uid.as_deref().unwrap_or_default());
    let flight = {
        let mut flights = state.traffic_tokens.lock();
        match flights.get(&key) {
            Some(flight) => flight.clone(),
            None => {
                let task =
                    tokio::spawn(issue(Arc::clone(&state), id.clone(), key.clone(), sandbox));
                let flight: Flight = async move {
                    task.await.unwrap_or_else(|e| {
                        Err(ApiError::Internal(format!(
                            "failed to issue traffic access token: {e}"
                        )))
                    })
                }
                .boxed()
                .shared();
                flights.insert(key, flight.clone());
                flight
            }
        }
    };
    flight.await.map(Json)
}

/// One issuance (steps 3 and 4); leaves the flights when done.
async fn issue<S: Store>(
    state: Arc<AppState<S>>,
    id: String,
    key: String,
    sandbox: Arc<Sandbox>,
) -> Result<TrafficAccessToken, ApiError> {
    let result = async {
        let token = uuid::Uuid::new_v4().to_string();
        let validity = SignedDuration::try_from(state.config.traffic_token_validity)
            .unwrap_or(SignedDuration::MAX);
        let now = Timestamp::now();
        let expiration = now
            .checked_add(validity)
            .unwrap_or(Timestamp::MAX)
            .round(jiff::Unit::Second)
            .unwrap_or(now)
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let uid = sandbox.metadata.uid.clone();
        let written = write_with_retry(&state, &id, sandbox, "refresh traffic access token", |s| {
            // A sandbox that changed meanwhile is checked again; a refused one is not written
            // (and is refused below).
            (s.metadata.uid == uid && refusal(s, Timestamp::now()).is_none())
                .then(|| with_token(s, &token, &expiration))
        })
        .await
        .map_err(|e| match e {
            ApiError::NotFound(_) => ApiError::NotFound(NOT_FOUND.into()),
            other => other,
        })?;
        let stored = written
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::TRAFFIC_ACCESS_TOKEN_SHA256));
        if stored.map(String::as_str) != Some(super::keys::key_hash(&token).as_str()) {
            return Err(refusal(&written, Timestamp::now())
                .unwrap_or_else(|| ApiError::NotFound(NOT_FOUND.into())));
        }
        if let (Some(routes), Some(version)) =
            (&state.routes, written.metadata.resource_version.as_deref())
            && !routes.wait_version(&id, version, ROUTE_WAIT).await
        {
            tracing::warn!(sandbox = %id, "the gateway does not route the refreshed token yet; answering anyway");
        }
        Ok(TrafficAccessToken { token, expiration })
    }
    .await;
    state.traffic_tokens.lock().remove(&key);
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use oka_api::SandboxPhase;

    use super::*;

    fn sandbox(phase: SandboxPhase, notes: &[(&str, &str)]) -> Sandbox {
        let running = phase == SandboxPhase::Running;
        let mut builder = Sandbox::test().name("s").claimed().phase(phase);
        if running {
            builder = builder.ready();
        }
        for (k, v) in notes {
            builder = builder.annotation(k, v);
        }
        builder.build()
    }

    #[test]
    fn only_running_or_paused_sandboxes_requiring_traffic_auth_get_a_token() {
        let now = Timestamp::now();
        let secured = [(annotations::ENABLE_JWT_AUTH, "true")];
        assert_eq!(refusal(&sandbox(SandboxPhase::Running, &secured), now), None);
        let open = refusal(&sandbox(SandboxPhase::Running, &[]), now);
        assert_eq!(open, Some(ApiError::Conflict(CONFLICT.into())));
        let almost =
            refusal(&sandbox(SandboxPhase::Running, &[(annotations::ENABLE_JWT_AUTH, "yes")]), now);
        assert_eq!(almost, Some(ApiError::Conflict(CONFLICT.into())));
        let pending = refusal(&sandbox(SandboxPhase::Pending, &secured), now);
        assert!(
            matches!(pending, Some(ApiError::Conflict(_) | ApiError::NotFound(_))),
            "{pending:?}"
        );
    }

    #[test]
    fn the_token_is_kept_as_its_hash_and_expiration() {
        let updated =
            with_token(&sandbox(SandboxPhase::Running, &[]), "tok", "2126-01-01T00:00:00Z");
        let notes = updated.metadata.annotations.unwrap();
        assert_eq!(
            notes[annotations::TRAFFIC_ACCESS_TOKEN_SHA256],
            super::super::keys::key_hash("tok")
        );
        assert_eq!(notes[annotations::TRAFFIC_ACCESS_TOKEN_EXPIRATION], "2126-01-01T00:00:00Z");
        assert!(!notes.values().any(|v| v == "tok"), "the token itself is never stored");
    }
}
