//! [`ApiError`]: every failure of the REST API, turned into an HTTP response in one place.
//!
//! The body is the E2B/reference error JSON `{"code": <status>, "message": "...",
//! "request_id": "<id>"}`; the request ID is the one the request-context middleware chose
//! (the caller's `X-Request-ID`, or 32 fresh hex digits).

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use tracing::{error, warn};

use super::auth::AuthError;

tokio::task_local! {
    /// The request ID of the request being served (set by the request-context middleware).
    pub(crate) static REQUEST_ID: String;
}

/// A failure of the REST API; [`IntoResponse`] maps each variant to its status once.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// No or a wrong API key: 401.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The request is malformed or names something that does not exist: 400.
    #[error("{0}")]
    BadRequest(String),
    /// The sandbox or route does not exist, or is not the caller's: 404.
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not with this method: 405.
    #[error("Method not allowed")]
    MethodNotAllowed,
    /// The warm pool has no available sandbox right now: 503 with `Retry-After`.
    #[error("{message}")]
    PoolExhausted {
        /// What the client is told.
        message: String,
        /// The `Retry-After` header, in seconds.
        retry_after_secs: u64,
    },
    /// The request conflicts with the sandbox's state (pause of a paused sandbox, resume of a
    /// running one): 409.
    #[error("{0}")]
    Conflict(String),
    /// The caller may not do this (another team's key, the admin key): 403.
    #[error("{0}")]
    Forbidden(String),
    /// The sandbox exists but is not running (paused) where only a running one will do
    /// (`/timeout`, `/refreshes`): 404, as E2B answers, whose running sandboxes are the only
    /// ones these reach.
    #[error("{0}")]
    NotRunning(String),
    /// Valid, but this node cannot do it yet (snapshots without a checkpoint controller,
    /// cloning a snapshot): 501.
    #[error("{0}")]
    NotImplemented(String),
    /// The sandbox cannot do it now, and may later (its agent runtime does not answer): 503.
    #[error("{0}")]
    Unavailable(String),
    /// A fault on our side: 500, logged.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Auth(_) => StatusCode::UNAUTHORIZED,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PoolExhausted { .. } | ApiError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::NotRunning(_) => StatusCode::NOT_FOUND,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The reference's 404 for a sandbox that is missing or not the caller's (the two are
    /// not told apart, so IDs cannot be enumerated).
    pub fn sandbox_not_found(id: &str) -> Self {
        ApiError::NotFound(format!("Sandbox route not found, maybe it is crashed or killed: {id}"))
    }
}

/// The message of the error a response carries, for the request's span.
#[derive(Debug, Clone)]
pub(crate) struct ErrorMessage(pub String);

/// The error body.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// The HTTP status.
    pub code: u16,
    /// What went wrong.
    pub message: String,
    /// The request's ID.
    pub request_id: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = self.to_string();
        match &self {
            ApiError::Internal(_) => error!(%message, "request failed"),
            ApiError::NotRunning(_) | ApiError::PoolExhausted { .. } => {
                warn!(%message, "request refused");
            }
            _ => {}
        }
        let request_id = REQUEST_ID.try_with(Clone::clone).unwrap_or_default();
        let body = ErrorBody { code: status.as_u16(), message, request_id };
        let mut response = (status, Json(body.clone())).into_response();
        // The request's root span ends with this message as its error status.
        response.extensions_mut().insert(ErrorMessage(body.message));
        if let ApiError::PoolExhausted { retry_after_secs, .. } = self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}
