//! What `oka serve` says about itself over HTTP: `/metrics` (the registry every component
//! registered into, OpenMetrics or the Prometheus text format as the scraper asks) and
//! `/healthz`, `/readyz`, `/livez`, merged into each listener's router.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use oka_metrics::Registry;
use oka_metrics::health::Health;
use oka_metrics::scrape::{self, Format};

/// `/healthz`, `/livez` and `/readyz` answered by `health`.
pub fn health_routes(health: Health) -> Router {
    let answer = |path: &'static str| {
        let health = health.clone();
        get(move || {
            let health = health.clone();
            async move {
                let (code, body) = health.answer(path).unwrap_or((404, String::new()));
                let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body)
            }
        })
    };
    Router::new()
        .route("/healthz", answer("/healthz"))
        .route("/livez", answer("/livez"))
        .route("/readyz", answer("/readyz"))
}

/// `/metrics` over `registry`, plus the health routes.
pub fn routes(registry: Arc<Registry>, health: Health) -> Router {
    Router::new().route("/metrics", get(metrics).with_state(registry)).merge(health_routes(health))
}

/// `GET /metrics`: encoded off the async workers (a scrape of ten thousand sandboxes takes
/// 70-90 ms of CPU and 6.4 MB: `cargo bench -p oka-controller --bench metrics`).
async fn metrics(State(registry): State<Arc<Registry>>, headers: HeaderMap) -> Response {
    let format =
        Format::negotiate(headers.get(header::ACCEPT).and_then(|value| value.to_str().ok()));
    match tokio::task::spawn_blocking(move || scrape::encode(&registry, format)).await {
        Ok(Ok(text)) => ([(header::CONTENT_TYPE, format.content_type())], text).into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics\n").into_response(),
    }
}
