//! The HTTPS server of the webhooks: `POST <path>` with an `AdmissionReview`, answered by
//! [`crate::review`] with what it needs read from the store first.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use oka_api::{PoolAutoscaler, Sandbox, SandboxUpdateOps};
use oka_kubeapi::tls::{ReloadableCert, Tls, TlsListener};
use oka_store::{Object, Selector, Store};
use serde_json::Value;
use tracing::{debug, warn};

use crate::WebhookError;
use crate::metrics::AdmissionMetrics;
use crate::review::{self, Facts, Lookup, Review, Settings, WebhookPath};

/// The largest review accepted (the API server's objects are at most 3 MiB; a review of an
/// update holds two).
const BODY_LIMIT: usize = 8 * 1024 * 1024;

struct Shared<S> {
    store: S,
    settings: Settings,
    metrics: AdmissionMetrics,
}

/// The router of every webhook path, reading what the rules need from `store`, recording each
/// review answered into `metrics`.
pub fn router<S: Store>(store: S, settings: Settings, metrics: AdmissionMetrics) -> Router {
    let shared = Arc::new(Shared { store, settings, metrics });
    let mut router = Router::new();
    for path in WebhookPath::ALL {
        router = router.route(
            path.as_str(),
            axum::routing::post(move |state: State<Arc<Shared<S>>>, body: Bytes| {
                handle(path, state, body)
            }),
        );
    }
    router.layer(DefaultBodyLimit::max(BODY_LIMIT)).with_state(shared)
}

/// Serves `router` over TLS with whatever certificate `cert` holds, on `listener`, until
/// `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cert: Arc<ReloadableCert>,
    router: Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), WebhookError> {
    let tls = Tls::reloadable(cert)?;
    let listener = TlsListener::new(listener, &tls).map_err(WebhookError::Io)?;
    axum::serve(listener, router).with_graceful_shutdown(stop).await.map_err(WebhookError::Io)
}

async fn handle<S: Store>(
    path: WebhookPath,
    State(shared): State<Arc<Shared<S>>>,
    body: Bytes,
) -> Response {
    let parsed = serde_json::from_slice::<Value>(&body)
        .map_err(|e| e.to_string())
        .and_then(|v| Review::parse(&v).map_err(|e| e.to_string()));
    let review = match parsed {
        Ok(review) => review,
        Err(message) => {
            debug!(path = path.as_str(), %message, "webhook: not a review");
            return json(StatusCode::BAD_REQUEST, &review::bad_request(&message));
        }
    };
    let started = std::time::Instant::now();
    let mut facts = Facts::default();
    for lookup in review::lookups(path, &review, &shared.settings) {
        if let Err(error) = fetch(&shared.store, &lookup, &mut facts).await {
            // Without what the rule reads it cannot decide: the API server applies the
            // webhook's failure policy.
            warn!(path = path.as_str(), %error, "webhook: cannot read what the rule needs");
            return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
        }
    }
    let answer = review::answer(path, &review, &facts, &shared.settings);
    let allowed = answer.pointer("/response/allowed") == Some(&Value::Bool(true));
    shared.metrics.record(path.as_str(), review.operation_name(), allowed, started.elapsed());
    json(StatusCode::OK, &answer)
}

fn json(code: StatusCode, value: &Value) -> Response {
    (code, [(axum::http::header::CONTENT_TYPE, "application/json")], value.to_string())
        .into_response()
}

/// Reads one [`Lookup`] into `facts`; a missing object is left absent.
async fn fetch<S: Store>(
    store: &S,
    lookup: &Lookup,
    facts: &mut Facts,
) -> Result<(), WebhookError> {
    match lookup {
        Lookup::UpdateOps { namespace } => {
            facts.update_ops = list::<S, SandboxUpdateOps>(store, namespace).await?;
        }
        Lookup::PoolAutoscalers { namespace } => {
            facts.pool_autoscalers = list::<S, PoolAutoscaler>(store, namespace).await?;
        }
        Lookup::Pod { namespace, name } => {
            facts.pod = get::<S, Pod>(store, namespace, name).await?
        }
        Lookup::Sandbox { namespace, name } => {
            facts.sandbox = get::<S, Sandbox>(store, namespace, name).await?;
        }
    }
    Ok(())
}

async fn list<S: Store, K: Object>(store: &S, namespace: &str) -> Result<Vec<Value>, WebhookError> {
    let list = store.list::<K>(Some(namespace), &Selector::everything()).await?;
    list.items.iter().map(|o| serde_json::to_value(&**o).map_err(WebhookError::from)).collect()
}

async fn get<S: Store, K: Object>(
    store: &S,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, WebhookError> {
    match store.get::<K>(namespace, name).await {
        Ok(object) => Ok(Some(serde_json::to_value(&object)?)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}
