//! The E2B operations oka does not serve yet: each answers 501 with a message that names it,
//! so an SDK user reads "not supported" rather than a 404 the SDKs take for "sandbox not found"
//! (`update_network`) or "template does not exist" (`Template.exists`).
//!
//! Authentication still comes first: these routes sit behind the same key check as the rest.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::routing::{MethodRouter, any, put};
use oka_store::Store;

use super::sandboxes::owned_sandbox;
use super::{ApiError, AppState, User};

/// Templates are SandboxSets here, made with the Kubernetes API; the E2B build API is not served.
const TEMPLATE_BUILDS: &str = "building templates through the E2B API is not supported by oka: \
     templates are SandboxSets (create one with kubectl or okactl)";

fn answer<T: Clone + Send + Sync + 'static>(what: &'static str) -> MethodRouter<T> {
    any(move || async move { ApiError::NotImplemented(what.to_owned()) })
}

/// The routes, merged into the API's authenticated router.
pub(super) fn router<S: Store>() -> Router<Arc<AppState<S>>> {
    Router::new()
        .route("/v3/templates", answer(TEMPLATE_BUILDS))
        .route("/v2/templates", answer(TEMPLATE_BUILDS))
        .route("/v2/templates/{id}", answer(TEMPLATE_BUILDS))
        .route("/v2/templates/{id}/builds/{build}", answer(TEMPLATE_BUILDS))
        .route("/templates/{id}/builds/{build}", answer(TEMPLATE_BUILDS))
        .route("/templates/{id}/builds/{build}/status", answer(TEMPLATE_BUILDS))
        .route("/templates/{id}/builds/{build}/logs", answer(TEMPLATE_BUILDS))
        .route("/templates/{id}/files/{hash}", answer(TEMPLATE_BUILDS))
        .route("/templates/tags", answer(TEMPLATE_BUILDS))
        .route("/templates/{id}/tags", answer(TEMPLATE_BUILDS))
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
        .route("/sandboxes/{id}/network", put(update_network::<S>))
}

/// `PUT /sandboxes/{id}/network`: 404 for a sandbox the caller does not have, else 501: a
/// sandbox's network is its template's, fixed when it starts.
async fn update_network<S: Store>(
    State(state): State<Arc<AppState<S>>>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> ApiError {
    match owned_sandbox(&state, &user, &id) {
        Err(error) => error,
        Ok(_) => ApiError::NotImplemented(format!(
            "Failed to update the network of sandbox {id}: changing a running sandbox's network \
             is not supported by oka (its template's pod annotation agents.kruise.io/network \
             decides it at start)"
        )),
    }
}
