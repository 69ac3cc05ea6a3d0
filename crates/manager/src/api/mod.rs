//! The E2B-compatible REST API (axum).
//!
//! [`app`] builds the router. Every route is served at its plain path and under `/kruise/api`
//! (the reference's "customized" prefix):
//!
//! | route | answer |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | 201 `Sandbox` (claimed from the warm pool named by `templateID`; an empty pool creates one, [`crate::create`]; a snapshot ID: a new sandbox restored from it, `ClaimEngine::create_from_snapshot`) |
//! | `GET /v2/sandboxes`, `GET /sandboxes` | 200 `[ListedSandbox]`, newest first, `X-Next-Token` when more |
//! | `GET /sandboxes/{id}` | 200 `SandboxDetail` |
//! | `DELETE /sandboxes/{id}` | 204 (recyclable sandboxes go back to their pool) |
//! | `POST /sandboxes/{id}/timeout` | 204 (may shorten) |
//! | `POST /sandboxes/{id}/refreshes` | 204 (end time only extended, to now + `duration`) |
//! | `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect` | 200 (running; end time only extended), 201 (paused: resumed) |
//! | `POST /sandboxes/{id}/pause` | 204 once paused; 409 already paused ([`lifecycle`]) |
//! | `POST /sandboxes/{id}/traffic-access-token` | 200 `{"trafficAccessToken", "trafficAccessTokenExpiration"}`: a new token replacing the sandbox's ([`traffic_token`]) |
//! | `POST /sandboxes/{id}/resume` | 201 `Sandbox` once running; 409 not paused |
//! | `POST /sandboxes/{id}/fork` | 201 `[SandboxForkResult]`: new sandboxes from a snapshot of the running one ([`fork`]) |
//! | `GET /sandboxes/{id}/metrics` | 200 `[SandboxMetric]`: the agent runtime's current sample |
//! | `POST /sandboxes/{id}/snapshots`, `GET /snapshots` | 201 `SnapshotInfo`, 200 `[SnapshotInfo]` ([`templates`]) |
//! | `GET /templates`, `GET /templates/{id}`, `DELETE /templates/{id}` | the SandboxSets; delete removes a snapshot, or a built template ([`builds`]) |
//! | `GET /api-keys`, `POST /api-keys`, `DELETE /api-keys/{id}`, `GET /api-keys/compatible`, `GET /teams` | keys and teams ([`keys`]) |
//! | `GET /templates/aliases/{alias}` | 200 `{"templateID", "public"}` of a SandboxSet the caller sees ([`templates`]) |
//! | `PUT /sandboxes/{id}/network` | 204 once the new `allowOut`/`denyOut` are in force (`crate::egress`); 400 naming a bad entry; 501 where they cannot be |
//! | `POST /v3/templates`, `GET /templates/{id}/files/{hash}`, `PUT /template-files/{token}`, `POST /v2/templates/{id}/builds/{build}`, `GET /templates/{id}/builds/{build}/status`, tags | E2B template builds ([`builds`]), when a builder is configured; else 501 |
//! | older template-build versions, volumes, secrets, logs | 501 naming what is not supported |
//! | `GET /health` | 204 (unauthenticated) |
//! | `GET /openapi.yaml` | 200: [`OPENAPI`], this API's description (unauthenticated) |
//!
//! # Conventions
//!
//! - Authentication: `X-API-Key`: the admin key from configuration ([`auth`]) or a stored key
//!   ([`keys`]); 401 `Invalid API Key`. A team is a namespace: a team's keys see its
//!   namespace's pools and sandboxes, the admin team everything.
//! - Errors: one [`ApiError`], rendered once as `{"code","message","request_id"}`; unknown
//!   routes 404, wrong methods 405, malformed JSON 400, all in that format.
//! - `Idempotency-Key` on a create (`[a-z0-9-]{1,255}`): a retried create by the same key
//!   answers the sandbox the first one claimed (recorded on it as
//!   `agents.kruise.io/idempotency-key`, so it holds across restarts); a duplicate arriving
//!   while the first still runs waits for it.
//! - `X-Request-ID`: the caller's value is kept, else 32 random hex digits; echoed on every
//!   response.
//! - `domain` in responses: the configured one, else derived from the request's `Host` as the
//!   reference does (plain paths strip one leading `api.`; `/kruise` paths keep the host).
//!
//! # Where this differs from the reference, and why
//!
//! - Malformed JSON is 400, not 500; a bad `/timeout` value is 400, not 500 (client mistakes
//!   get 4xx). A sandbox that is not running still answers 500 on `/timeout`, which old SDKs
//!   rely on.
//! - A drained pool answers 503 with `Retry-After` at once (the SDKs retry 503), where the
//!   reference retries for up to minutes and then answers 500.
//! - A sandbox past its shutdown time is 404, never `state: "dead"` (which the SDK rejects).
//! - List metadata filters match the metadata the API shows (labels and annotations), not
//!   annotations only.

pub mod auth;
pub mod builds;
mod error;
pub mod fork;
pub mod key_compat;
pub mod keys;
pub mod lifecycle;
pub mod models;
mod sandboxes;
#[cfg(feature = "fuzzing")]
pub(crate) use sandboxes::{fuzz_create_body, fuzz_list_query};
pub mod templates;
pub mod timeouts;
pub mod traffic_token;
mod unsupported;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, StatusCode};
use oka_store::Store;

pub use self::auth::{ApiKey, AuthError, InvalidKeyFormat, User};
pub use self::error::{ApiError, ErrorBody};
use crate::claim::{ClaimConfig, ClaimEngine};
use crate::index::Index;
use crate::init::{NoopInitializer, SandboxInitializer};

/// The request-ID header.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The path prefix of the reference's customized API shape.
pub const KRUISE_PREFIX: &str = "/kruise/api";
/// oka's OpenAPI 3 description of this API (`crates/manager/openapi.yaml`): the operations it
/// serves with E2B's field names, types and formats. `tests/conformance.rs` of the `oka` crate
/// checks live answers against it.
pub const OPENAPI: &str = include_str!("../../openapi.yaml");

/// Settings of the API.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The admin API key.
    pub admin_key: ApiKey,
    /// The domain returned to clients; `None`: derived from each request's `Host`.
    pub domain: Option<String>,
    /// The shortest timeout a create, `/timeout`, `/connect` or `/resume` accepts, in seconds.
    /// Default 0, as E2B (the reference: 30).
    pub min_timeout_secs: i64,
    /// The longest timeout they accept, in seconds. Default 30 days.
    pub max_timeout_secs: i64,
    /// The `envdVersion` reported to SDKs (it gates SDK features). Default `0.6.13`.
    pub envd_version: String,
    /// `Retry-After` of a drained pool's 503, in seconds. Default 1.
    pub retry_after_secs: u64,
    /// The namespace of the API key store (Secret `e2b-key-store`). Default `sandbox-system`
    /// (the reference's system namespace).
    pub system_namespace: String,
    /// Create-on-no-stock: on by default, waits at most 60 s for the new sandbox.
    pub create: crate::create::CreateConfig,
    /// New sandboxes per second when a pool is empty (burst the same). Default 49.
    pub max_create_qps: u32,
    /// Snapshots: off (501) until a checkpoint controller runs.
    pub snapshots: templates::SnapshotConfig,
    /// Asked when a create names no pool: whether the template is one this process is still
    /// building (503 with `Retry-After` and how far it is) or failed to build. `None`: never.
    pub pending_templates: Option<templates::PendingTemplates>,
    /// On a cluster, the runtime of a sandbox neither annotated nor of the `oka-node` runtime
    /// class (`cluster.defaultRuntime`), so Pod sandboxes are told at once that they cannot be
    /// snapshotted or forked. `None` (the default, `oka serve`): every sandbox runs on the node
    /// runtime.
    pub cluster_default_runtime: Option<oka_api::runtime_choice::SandboxRuntime>,
    /// How long a traffic access token of `POST /sandboxes/{id}/traffic-access-token` is valid.
    /// Default 100 years (the reference's `--traffic-access-token-validity`).
    pub traffic_token_validity: std::time::Duration,
}

impl ManagerConfig {
    /// The accepted timeouts.
    pub fn timeouts(&self) -> timeouts::TimeoutBounds {
        timeouts::TimeoutBounds { min: self.min_timeout_secs, max: self.max_timeout_secs }
    }

    /// Defaults around an admin key.
    pub fn new(admin_key: ApiKey) -> Self {
        Self {
            admin_key,
            domain: None,
            min_timeout_secs: 0,
            max_timeout_secs: 2_592_000,
            envd_version: "0.6.13".into(),
            retry_after_secs: 1,
            system_namespace: "sandbox-system".into(),
            create: crate::create::CreateConfig::default(),
            max_create_qps: ClaimConfig::default().max_create_qps,
            snapshots: templates::SnapshotConfig::default(),
            pending_templates: None,
            cluster_default_runtime: None,
            traffic_token_validity: std::time::Duration::from_secs(876_000 * 3600),
        }
    }
}

/// What the handlers share.
pub struct AppState<S> {
    /// The store.
    pub store: S,
    /// The index the engine and the lookups read.
    pub index: Arc<Index>,
    /// The claim engine.
    pub engine: Arc<ClaimEngine<S>>,
    /// Settings.
    pub config: ManagerConfig,
    /// Where `/init` goes.
    pub initializer: Arc<dyn SandboxInitializer>,
    /// API keys and teams (also the quota's list of limited keys).
    pub keys: Arc<keys::KeyStore<S>>,
    /// (owner, `Idempotency-Key`) of the creates running now.
    pub(crate) creating: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// The gateway's routes, which a create waits for; none without a gateway.
    pub routes: Option<Arc<dyn RouteWaiter>>,
    /// The manager's series (registered by the assembly; unregistered ones record unseen).
    pub metrics: Arc<crate::metrics::ManagerMetrics>,
    /// Where egress policies are enforced; `None`: network rules are refused (501).
    pub egress: Option<Arc<dyn crate::egress::EgressApplier>>,
    /// Template builds; `None`: the build routes answer 501.
    pub(crate) template_builds: Option<Arc<builds::Builds>>,
    /// The traffic-token refreshes in flight, by sandbox: concurrent callers share one.
    pub(crate) traffic_tokens: traffic_token::Flights,
}

/// Where the sandboxes' traffic is routed (the gateway). Its routes follow the store's watch, a
/// moment behind the claim's write, so a create answers only once its sandbox is routed: the
/// client's first request through the gateway (the SDK's first command) then finds it.
pub trait RouteWaiter: Send + Sync + 'static {
    /// Resolves once a sandbox is routed under `sandbox_id`, or after `timeout`; whether it is.
    fn wait_routed<'a>(
        &'a self,
        sandbox_id: &'a str,
        timeout: std::time::Duration,
    ) -> futures::future::BoxFuture<'a, bool>;

    /// Resolves once the route of `sandbox_id` is at `resource_version` or newer, or after
    /// `timeout`; whether it is. A refreshed traffic token waits for it, so that the token
    /// passes the gateway as soon as it is answered. By default: at once.
    fn wait_version<'a>(
        &'a self,
        sandbox_id: &'a str,
        resource_version: &'a str,
        timeout: std::time::Duration,
    ) -> futures::future::BoxFuture<'a, bool> {
        let _ = (sandbox_id, resource_version, timeout);
        Box::pin(async { true })
    }
}

impl<S> std::fmt::Debug for AppState<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<S: Store> AppState<S> {
    /// A state over `store` and its `index`, with the no-op initializer.
    pub fn new(store: S, index: Arc<Index>, config: ManagerConfig) -> Self {
        let claim = ClaimConfig { max_create_qps: config.max_create_qps, ..ClaimConfig::default() };
        let engine = Arc::new(ClaimEngine::new(store.clone(), Arc::clone(&index), claim));
        let keys = Arc::new(keys::KeyStore::new(
            store.clone(),
            config.system_namespace.clone(),
            config.admin_key.clone(),
        ));
        Self {
            keys,
            store,
            index,
            engine,
            config,
            initializer: Arc::new(NoopInitializer),
            creating: std::sync::Mutex::default(),
            routes: None,
            metrics: Arc::default(),
            egress: None,
            template_builds: None,
            traffic_tokens: traffic_token::Flights::default(),
        }
    }

    /// Records into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::ManagerMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Replaces the initializer.
    #[must_use]
    pub fn with_initializer(mut self, initializer: Arc<dyn SandboxInitializer>) -> Self {
        self.initializer = initializer;
        self
    }

    /// Enforces API-key quotas through `quota` (creates are admitted, kills release) and starts
    /// the driver that keeps it true to the store (the event path and the periodic anti-drift
    /// pass, [`crate::quota::antidrift`]); the driver's task ends when aborted. Without this,
    /// quotas are recorded but not enforced.
    pub fn start_quota(
        &self,
        quota: Arc<crate::quota::Quota>,
        config: crate::quota::AntiDriftConfig,
    ) -> (Arc<crate::quota::AntiDrift>, tokio::task::JoinHandle<()>) {
        self.engine.set_quota(Arc::clone(&quota));
        let subjects = Arc::clone(&self.keys) as Arc<dyn crate::quota::QuotaSubjects>;
        let driver = crate::quota::AntiDrift::new(quota, Arc::clone(&self.index), subjects, config);
        let task = driver.spawn();
        (driver, task)
    }

    /// Enforces the E2B network options (`allow_internet_access`, `allowOut`, `denyOut`,
    /// `PUT /sandboxes/{id}/network`) through `egress`.
    #[must_use]
    pub fn with_egress(mut self, egress: Arc<dyn crate::egress::EgressApplier>) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Serves the E2B template-build API through `config.builder`, keeping uploads, build
    /// records and logs under `config.dir`; builds the previous process left running are
    /// recorded as failed.
    ///
    /// # Errors
    ///
    /// `config.dir` cannot be made or read.
    pub fn with_template_builds(
        mut self,
        config: crate::templatebuild::TemplateBuildConfig,
    ) -> std::io::Result<Self> {
        self.template_builds = Some(Arc::new(builds::Builds::open(config)?));
        Ok(self)
    }

    /// Makes creates wait for their sandbox's route in `routes` before they answer.
    #[must_use]
    pub fn with_routes(mut self, routes: Arc<dyn RouteWaiter>) -> Self {
        self.routes = Some(routes);
        self
    }
}

impl<S> AppState<S> {
    /// The API's JSON of `sandbox`, shown in `visible` state; `token`: with its
    /// `envdAccessToken`. Its resources are its pod template's: its own, else the
    /// SandboxTemplate's it references (the default pool's sandboxes reference theirs).
    pub(crate) fn sandbox_json(
        &self,
        sandbox: &oka_api::Sandbox,
        visible: oka_api::SandboxState,
        domain: &str,
        token: bool,
    ) -> models::SandboxJson {
        let resources = self.index.with_pod_template(
            sandbox.metadata.namespace.as_deref(),
            sandbox.spec.template.as_ref(),
            sandbox.spec.template_ref.as_ref(),
            models::template_resources,
        );
        models::sandbox_json(sandbox, visible, domain, &self.config.envd_version, token, resources)
    }
}

/// Facts about the request the handlers need, set by the outermost middleware.
#[derive(Debug, Clone)]
pub(crate) struct RequestContext {
    /// The path starts with `/kruise` (the customized shape).
    pub customized: bool,
    /// `Host` (or the URI's authority).
    pub host: String,
}

/// The API's router; see the [module documentation](self).
pub fn app<S: Store>(state: AppState<S>) -> Router {
    let state = Arc::new(state);
    let recording = crate::metrics::Recording {
        metrics: Arc::clone(&state.metrics),
        index: Arc::clone(&state.index),
        fallback: Arc::from(state.config.system_namespace.as_str()),
    };
    let routes = Router::new()
        .route("/sandboxes", post(sandboxes::create::<S>).get(sandboxes::list::<S>))
        .route("/v2/sandboxes", post(sandboxes::create::<S>).get(sandboxes::list::<S>))
        .route("/sandboxes/{id}", get(sandboxes::describe::<S>).delete(sandboxes::kill::<S>))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout::<S>))
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh::<S>))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect::<S>))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect::<S>))
        .route("/sandboxes/{id}/network", axum::routing::put(sandboxes::update_network::<S>))
        .route("/sandboxes/{id}/traffic-access-token", post(traffic_token::refresh::<S>))
        .route("/sandboxes/{id}/pause", post(lifecycle::pause::<S>))
        .route("/sandboxes/{id}/resume", post(lifecycle::resume::<S>))
        .route("/api-keys", get(keys::list::<S>).post(keys::create::<S>))
        .route("/api-keys/compatible", get(keys::compatible))
        .route("/api-keys/{id}", axum::routing::delete(keys::delete::<S>))
        .route("/teams", get(keys::teams::<S>))
        .route("/templates", get(templates::list::<S>))
        .route("/templates/{id}", get(templates::get::<S>).delete(templates::delete::<S>))
        .route("/sandboxes/{id}/snapshots", post(templates::create_snapshot::<S>))
        .route("/snapshots", get(templates::list_snapshots::<S>))
        .route("/sandboxes/{id}/metrics", get(templates::metrics::<S>))
        .route("/sandboxes/{id}/fork", post(fork::fork::<S>))
        .route("/templates/aliases/{alias}", get(templates::alias::<S>))
        .merge(unsupported::router::<S>())
        .merge(builds::router::<S>())
        .route_layer(middleware::from_fn_with_state(recording, crate::metrics::record))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), authenticate::<S>))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::clone(&state));
    // Uploads carry their link's token, not an API key (the SDKs send none).
    let routes = routes.merge(builds::upload_router(state));
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/openapi.yaml", get(openapi))
        .merge(routes.clone())
        .nest(KRUISE_PREFIX, routes)
        .fallback(not_found)
        .layer(middleware::from_fn(request_context))
}

/// `GET /openapi.yaml`.
async fn openapi() -> Response {
    ([(http::header::CONTENT_TYPE, "application/yaml")], OPENAPI).into_response()
}

async fn not_found() -> ApiError {
    ApiError::NotFound("Not found".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn authenticate<S: Store>(
    axum::extract::State(state): axum::extract::State<Arc<AppState<S>>>,
    mut request: Request,
    next: Next,
) -> Response {
    match state.keys.authenticate(request.headers()).await {
        Ok(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

fn new_request_id() -> String {
    format!("{:032x}", uuid::Uuid::new_v4().as_u128())
}

async fn request_context(mut request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let traced = oka_telemetry::enabled();
    if traced && given.as_deref().is_some_and(|id| !oka_telemetry::request::valid_request_id(id)) {
        let id = given.unwrap_or_default();
        let refused = ApiError::BadRequest(oka_telemetry::request::INVALID_REQUEST_ID.into());
        let mut response =
            error::REQUEST_ID.scope(id.clone(), async { refused.into_response() }).await;
        if let Ok(value) = HeaderValue::from_str(&id) {
            response.headers_mut().insert(REQUEST_ID_HEADER, value);
        }
        return response;
    }
    let request_id = given.unwrap_or_else(new_request_id);
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let customized = request.uri().path().starts_with("/kruise");
    request.extensions_mut().insert(RequestContext { customized, host });
    let log_span = tracing::info_span!("request", request_id = %request_id);
    let mut response = if traced {
        // The request's root span: its trace ID is the request ID; named after the route.
        let method = request.method().to_string();
        let route =
            request.extensions().get::<axum::extract::MatchedPath>().map(|p| p.as_str().to_owned());
        let span = oka_telemetry::request::RequestSpan::start(&method, &request_id);
        let work = oka_telemetry::with_context(next.run(request), span.context());
        let work = tracing::Instrument::instrument(work, log_span);
        let response = error::REQUEST_ID.scope(request_id.clone(), work).await;
        let status = response.status();
        let failed = (status.is_client_error() || status.is_server_error()).then(|| {
            response.extensions().get::<error::ErrorMessage>().map_or_else(
                || status.canonical_reason().unwrap_or_default().to_owned(),
                |m| m.0.clone(),
            )
        });
        span.finish(&method, route.as_deref(), failed);
        response
    } else {
        error::REQUEST_ID
            .scope(request_id.clone(), tracing::Instrument::instrument(next.run(request), log_span))
            .await
    };
    if is_plain_error(&response) {
        response = json_error(response, &request_id).await;
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// An error answered by axum itself, not by an [`ApiError`]: a wrong method (no body), a path
/// segment that is not UTF-8 or a body over the size limit (plain text).
fn is_plain_error(response: &Response) -> bool {
    let status = response.status();
    let json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    (status.is_client_error() || status.is_server_error()) && !json
}

/// `response` as the API's error body, with its status and its text as the message: the SDKs
/// parse every error as `{code, message}`, and fail on anything else.
async fn json_error(response: Response, request_id: &str) -> Response {
    let status = response.status();
    let message = if status == StatusCode::METHOD_NOT_ALLOWED {
        ApiError::MethodNotAllowed.to_string()
    } else {
        let text = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&text).trim().to_owned();
        if text.is_empty() {
            status.canonical_reason().unwrap_or_default().to_owned()
        } else {
            text
        }
    };
    let body = ErrorBody { code: status.as_u16(), message, request_id: request_id.to_owned() };
    (status, axum::Json(body)).into_response()
}

/// The domain for sandbox addresses in responses (reference adapters, §3.8).
///
/// # Errors
///
/// 400 `cannot resolve sandbox domain: empty host` when nothing is left of the host.
pub(crate) fn response_domain(
    config: &ManagerConfig,
    context: &RequestContext,
) -> Result<String, ApiError> {
    if let Some(domain) = &config.domain {
        return Ok(domain.clone());
    }
    let empty = || ApiError::BadRequest("cannot resolve sandbox domain: empty host".into());
    let host = context.host.trim();
    // Split host[:port], IPv6-aware.
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or_else(empty)?;
        (format!("[{inside}]"), after.strip_prefix(':').map(str::to_owned))
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !name.contains(':') => (name.to_owned(), Some(port.to_owned())),
            _ => (host.to_owned(), None),
        }
    };
    let name = if context.customized {
        name.strip_suffix('.').unwrap_or(&name).to_owned()
    } else {
        let lower = name.to_ascii_lowercase();
        let lower = lower.strip_prefix("api.").unwrap_or(&lower);
        lower.strip_suffix('.').unwrap_or(lower).to_owned()
    };
    if name.is_empty() {
        return Err(empty());
    }
    Ok(match port {
        Some(port) if !port.is_empty() => format!("{name}:{port}"),
        _ => name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_from_host() {
        let config = ManagerConfig::new(ApiKey::generate().0);
        let check = |host: &str, customized: bool| {
            response_domain(&config, &RequestContext { customized, host: host.into() })
        };
        assert_eq!(check("api.Example.test", false).unwrap(), "example.test");
        assert_eq!(check("api.example.test.:3000", false).unwrap(), "example.test:3000");
        assert_eq!(check("localhost:3000", false).unwrap(), "localhost:3000");
        assert_eq!(check("api.Example.test", true).unwrap(), "api.Example.test");
        assert_eq!(check("[::1]:3000", false).unwrap(), "[::1]:3000");
        assert_eq!(
            check("", false).unwrap_err(),
            ApiError::BadRequest("cannot resolve sandbox domain: empty host".into())
        );
        let fixed = ManagerConfig { domain: Some("sbx.test".into()), ..config.clone() };
        let context = RequestContext { customized: false, host: String::new() };
        assert_eq!(response_domain(&fixed, &context).unwrap(), "sbx.test");
    }
}
