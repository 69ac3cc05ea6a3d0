//! The E2B operations oka does not serve yet: each answers 501 with a message that names it,
//! so an SDK user reads "not supported" rather than a 404 the SDKs take for "template does not
//! exist" (`Template.exists`).
//!
//! Authentication still comes first: these routes sit behind the same key check as the rest.

use std::sync::Arc;

use axum::Router;
use axum::routing::{MethodRouter, any};
use oka_store::Store;

use super::{ApiError, AppState};

/// The template-build routes of E2B's older API versions; the SDKs' `Template.build` uses the
/// ones [`super::builds`] serves.
const OLD_TEMPLATE_BUILDS: &str = "this version of E2B's template-build API is not served by oka: \
     build with the SDK's Template.build (POST /v3/templates), or make a SandboxSet with kubectl \
     or okactl";

fn answer<T: Clone + Send + Sync + 'static>(what: &'static str) -> MethodRouter<T> {
    any(move || async move { ApiError::NotImplemented(what.to_owned()) })
}

/// The routes, merged into the API's authenticated router.
pub(super) fn router<S: Store>() -> Router<Arc<AppState<S>>> {
    Router::new()
        .route("/v2/templates", answer(OLD_TEMPLATE_BUILDS))
        .route("/v2/templates/{id}", answer(OLD_TEMPLATE_BUILDS))
        .route("/templates/{id}/builds/{build}", answer(OLD_TEMPLATE_BUILDS))
        .route("/volumes", answer("volumes are not supported by oka yet"))
        .route("/volumes/{id}", answer("volumes are not supported by oka yet"))
        .route("/volumecontent/{*rest}", answer("volumes are not supported by oka yet"))
        .route("/secrets", answer("secrets are not supported by oka yet"))
        .route("/secrets/{id}", answer("secrets are not supported by oka yet"))
        .route(
            "/sandboxes/metrics",
            answer("metrics of several sandboxes at once are not supported by oka yet"),
        )
        .route("/sandboxes/{id}/logs", answer("sandbox logs are not supported by oka yet"))
        .route("/v2/sandboxes/{id}/logs", answer("sandbox logs are not supported by oka yet"))
}
