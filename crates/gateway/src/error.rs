//! The answers the gateway gives itself (not relayed from a sandbox), as E2B's proxy words
//! them: a JSON object with `sandboxId`, `message` and `code`.
//!
//! | Case | Status | `message` |
//! |---|---|---|
//! | unknown, dead or paused (no wake) sandbox | 502 | `The sandbox was not found` |
//! | nothing listens on the port | 502 | `The sandbox is running but port is not open` (+ `port`) |
//! | the port could not be reached otherwise | 502 | `Failed to reach the sandbox: …` |
//! | wake on request timed out | 504 | `The sandbox did not resume within {n}s` |
//! | the resume write failed | 502 | `Failed to resume the sandbox: …` |
//! | oka's traffic token missing / wrong | 403 | E2B's `Sandbox is secured with traffic access token. …` |
//! | `accessToken` mode: `x-access-token` missing / wrong | 401 | `unauthorized: invalid or missing access token` |
//! | traffic JWT invalid | 403 | `forbidden: invalid or missing traffic access token` |
//! | traffic JWT for another sandbox | 403 | `forbidden: traffic access token does not match sandbox` |
//! | traffic auth required, no verifier (yet) | 503 | `service unavailable: traffic access token verifier is not ready` |
//! | routing headers or host malformed | 400 | `Missing header: …`, `Invalid host`, `Invalid sandbox port` |
//! | route table not listed yet | 503 | `The sandbox gateway is not ready` |
//!
//! The auth answers carry the reference's gateway messages exactly ([`crate::auth`]).
//!
//! A paused sandbox that may not be woken answers the not-found 502 because the SDKs read
//! only a 502 from `GET /health` as "not running" (`e2b-protocol.md` §7).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

/// The body of every response the gateway sends: relayed from upstream, or its own.
pub type Body = Either<Incoming, Full<Bytes>>;

/// The traffic access token header (E2B and the reference).
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// An answer of the gateway's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// Unknown, dead, or paused without wake.
    NotFound {
        /// The sandbox ID asked for.
        sandbox_id: String,
    },
    /// Nothing listens on the port.
    PortClosed {
        /// The sandbox ID.
        sandbox_id: String,
        /// The port.
        port: u16,
    },
    /// The port could not be reached for another reason.
    Unreachable {
        /// The sandbox ID.
        sandbox_id: String,
        /// Why.
        reason: String,
    },
    /// The sandbox did not run again in time.
    WakeTimeout {
        /// The sandbox ID.
        sandbox_id: String,
        /// How long the request waited.
        waited: std::time::Duration,
    },
    /// The resume write failed.
    WakeFailed {
        /// The sandbox ID.
        sandbox_id: String,
        /// Why.
        reason: String,
    },
    /// The traffic access token is required and absent.
    TokenMissing {
        /// The sandbox ID.
        sandbox_id: String,
    },
    /// The traffic access token does not match.
    TokenInvalid {
        /// The sandbox ID.
        sandbox_id: String,
    },
    /// `accessToken` mode: the agent runtime's access token is required and was not given.
    Unauthorized {
        /// The sandbox ID.
        sandbox_id: String,
    },
    /// The sandbox requires traffic auth and there is no JWT verifier (not configured, or not
    /// loaded yet).
    VerifierNotReady {
        /// The sandbox ID.
        sandbox_id: String,
    },
    /// The traffic JWT is missing or does not verify.
    TrafficTokenInvalid {
        /// The sandbox ID.
        sandbox_id: String,
    },
    /// The traffic JWT is for another sandbox (ID or UID).
    TrafficTokenMismatch {
        /// The sandbox ID.
        sandbox_id: String,
    },
    /// The request names no sandbox port.
    BadRequest(String),
    /// The route table has not been listed yet.
    NotReady,
    /// The gateway's own `/healthz` or `/readyz` answer.
    Health {
        /// The status code.
        status: u16,
        /// The text (`ok`, or the failing checks).
        body: String,
    },
}

impl Reject {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Reject::NotFound { .. }
            | Reject::PortClosed { .. }
            | Reject::Unreachable { .. }
            | Reject::WakeFailed { .. } => StatusCode::BAD_GATEWAY,
            Reject::WakeTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Reject::TokenMissing { .. }
            | Reject::TokenInvalid { .. }
            | Reject::TrafficTokenInvalid { .. }
            | Reject::TrafficTokenMismatch { .. } => StatusCode::FORBIDDEN,
            Reject::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Reject::VerifierNotReady { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Reject::BadRequest(_) => StatusCode::BAD_REQUEST,
            Reject::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Reject::Health { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        use serde_json::json;
        let code = self.status().as_u16();
        match self {
            Reject::NotFound { sandbox_id } => {
                json!({"sandboxId": sandbox_id, "message": "The sandbox was not found", "code": code})
            }
            Reject::PortClosed { sandbox_id, port } => json!({
                "sandboxId": sandbox_id,
                "message": "The sandbox is running but port is not open",
                "port": port,
                "code": code,
            }),
            Reject::Unreachable { sandbox_id, reason } => json!({
                "sandboxId": sandbox_id,
                "message": format!("Failed to reach the sandbox: {reason}"),
                "code": code,
            }),
            Reject::WakeTimeout { sandbox_id, waited } => json!({
                "sandboxId": sandbox_id,
                "message": format!("The sandbox did not resume within {}s", waited.as_secs_f64()),
                "code": code,
            }),
            Reject::WakeFailed { sandbox_id, reason } => json!({
                "sandboxId": sandbox_id,
                "message": format!("Failed to resume the sandbox: {reason}"),
                "code": code,
            }),
            Reject::TokenMissing { sandbox_id } => json!({
                "sandboxId": sandbox_id,
                "message": format!(
                    "Sandbox is secured with traffic access token. Token header '{TRAFFIC_TOKEN_HEADER}' is missing"
                ),
                "code": code,
            }),
            Reject::TokenInvalid { sandbox_id } => json!({
                "sandboxId": sandbox_id,
                "message": format!(
                    "Sandbox is secured with traffic access token. Provided token in header '{TRAFFIC_TOKEN_HEADER}' is invalid"
                ),
                "code": code,
            }),
            Reject::Unauthorized { sandbox_id } => json!({
                "sandboxId": sandbox_id,
                "message": "unauthorized: invalid or missing access token",
                "code": code,
            }),
            Reject::VerifierNotReady { sandbox_id } => json!({
                "sandboxId": sandbox_id,
                "message": "service unavailable: traffic access token verifier is not ready",
                "code": code,
            }),
            Reject::TrafficTokenInvalid { sandbox_id } => json!({
                "sandboxId": sandbox_id,
                "message": "forbidden: invalid or missing traffic access token",
                "code": code,
            }),
            Reject::TrafficTokenMismatch { sandbox_id } => json!({
                "sandboxId": sandbox_id,
                "message": "forbidden: traffic access token does not match sandbox",
                "code": code,
            }),
            Reject::BadRequest(message) => json!({"message": message, "code": code}),
            Reject::NotReady => {
                json!({"message": "The sandbox gateway is not ready", "code": code})
            }
            Reject::Health { body, .. } => json!({"message": body.trim_end(), "code": code}),
        }
    }

    /// The response.
    pub fn response(&self) -> Response<Body> {
        let body = Bytes::from(self.body().to_string());
        let mut response = Response::new(Either::Right(Full::new(body)));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        response
    }
}
