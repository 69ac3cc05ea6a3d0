//! The HTTP API that `e2b_code_interpreter` speaks on port 49999 (e2b-protocol.md §4):
//! `POST /execute` (a streamed NDJSON answer), `POST/GET /contexts`,
//! `POST /contexts/{id}/restart`, `DELETE /contexts/{id}` and `GET /health`.
//!
//! Every context owns one kernel behind an async lock, so executions on a context run one at a
//! time, in arrival order. Each language has a default context, created on first use (python's at
//! start-up); default contexts are not listed.

use crate::kernel::{self, Event, Kernel, KernelError, KernelSpec, Launch};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The account kernels run as.
#[derive(Debug, Clone)]
pub struct KernelUser {
    /// The user name (`USER`, `LOGNAME`).
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home (`HOME`).
    pub home: PathBuf,
}

/// Server configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// envd's base URL, for `GET /envs` (global env vars and the access-token check).
    pub envd_url: String,
    /// Who kernels run as; `None` is the server's own user.
    pub kernel_user: Option<KernelUser>,
    /// The working directory of contexts that do not name one.
    pub default_cwd: PathBuf,
    /// How long a kernel may take to start.
    pub start_timeout: Duration,
    /// Start the default python kernel at once (a warm sandbox then has it ready).
    pub eager_python: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            envd_url: "http://127.0.0.1:49983".into(),
            kernel_user: None,
            default_cwd: std::env::var_os("HOME").map_or_else(|| "/".into(), PathBuf::from),
            start_timeout: Duration::from_secs(60),
            eager_python: true,
        }
    }
}

struct Context {
    id: String,
    language: String,
    cwd: PathBuf,
    /// The context's own env vars: over the sandbox's, under a call's.
    envs: BTreeMap<String, String>,
    spec: KernelSpec,
    /// The running kernel's pid (0 if none), readable without the lock so restart and delete can
    /// kill a busy kernel.
    pid: AtomicI32,
    kernel: Arc<tokio::sync::Mutex<Option<Kernel>>>,
}

impl Context {
    fn json(&self) -> Value {
        json!({"id": self.id, "language": self.language, "cwd": self.cwd.to_string_lossy()})
    }

    fn kill(&self) {
        let pid = self.pid.swap(0, Ordering::SeqCst);
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

struct Inner {
    config: Config,
    contexts: Mutex<HashMap<String, Arc<Context>>>,
    defaults: Mutex<HashMap<String, Arc<Context>>>,
    accepted_token: Mutex<Option<String>>,
}

/// The server's shared state.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// An HTTP error answer: status and message, sent as `{"code","message"}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"code": self.0.as_u16(), "message": self.1}).to_string();
        (self.0, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

impl From<KernelError> for ApiError {
    fn from(e: KernelError) -> Self {
        let status = match e {
            KernelError::NoKernel { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

enum Envs {
    Got(BTreeMap<String, String>),
    Unauthorized,
    Unavailable,
}

impl AppState {
    /// New state; call [`AppState::warm_up`] to start the default python kernel.
    pub fn new(config: Config) -> Self {
        AppState(Arc::new(Inner {
            config,
            contexts: Mutex::default(),
            defaults: Mutex::default(),
            accepted_token: Mutex::default(),
        }))
    }

    fn launch(&self, cwd: &std::path::Path, env: &BTreeMap<String, String>) -> Launch {
        let u = self.0.config.kernel_user.as_ref();
        Launch {
            uid_gid: u.map(|u| (u.uid, u.gid)),
            home: u.map(|u| u.home.clone()),
            user: u.map(|u| u.name.clone()),
            cwd: cwd.to_path_buf(),
            start_timeout: self.0.config.start_timeout,
            env: env.clone(),
        }
    }

    async fn spec(&self, language: &str) -> Result<KernelSpec, KernelError> {
        let homes: Vec<PathBuf> = self
            .0
            .config
            .kernel_user
            .iter()
            .map(|u| u.home.clone())
            .chain(std::env::var_os("HOME").map(PathBuf::from))
            .collect();
        let specs = kernel::discover(&kernel::search_path(&homes));
        if let Some(s) = kernel::find_spec(&specs, language) {
            return Ok(s.clone());
        }
        if language == "python"
            && let Some(s) = kernel::python_fallback().await
        {
            return Ok(s);
        }
        Err(KernelError::NoKernel {
            language: language.to_owned(),
            hint: kernel::install_hint(language),
        })
    }

    fn new_context(
        &self,
        language: String,
        cwd: PathBuf,
        envs: BTreeMap<String, String>,
        spec: KernelSpec,
    ) -> Arc<Context> {
        Arc::new(Context {
            id: uuid::Uuid::new_v4().to_string(),
            language,
            cwd,
            envs,
            spec,
            pid: AtomicI32::new(0),
            kernel: Arc::default(),
        })
    }

    async fn default_context(&self, language: &str) -> Result<Arc<Context>, KernelError> {
        if let Some(c) = lock(&self.0.defaults).get(language) {
            return Ok(c.clone());
        }
        let spec = self.spec(language).await?;
        let cwd = self.0.config.default_cwd.clone();
        let c = self.new_context(language.to_owned(), cwd, BTreeMap::new(), spec);
        Ok(lock(&self.0.defaults).entry(language.to_owned()).or_insert(c).clone())
    }

    fn context(&self, id: &str) -> Option<Arc<Context>> {
        if let Some(c) = lock(&self.0.contexts).get(id) {
            return Some(c.clone());
        }
        lock(&self.0.defaults).values().find(|c| c.id == id).cloned()
    }

    /// Makes sure the locked kernel of `ctx` runs (starting or restarting it).
    async fn ensure_kernel(
        &self,
        ctx: &Context,
        slot: &mut Option<Kernel>,
    ) -> Result<(), KernelError> {
        if let Some(k) = slot
            && k.is_alive()
        {
            return Ok(());
        }
        if slot.take().is_some() {
            tracing::warn!(context = %ctx.id, "kernel is gone; starting a new one");
        }
        let mut k = Kernel::start(&ctx.spec, &self.launch(&ctx.cwd, &ctx.envs)).await?;
        ctx.pid.store(k.pid(), Ordering::SeqCst);
        if let Some(setup) = kernel::setup_snippet(&ctx.language) {
            k.run_silent(setup).await?;
        }
        *slot = Some(k);
        Ok(())
    }

    /// Starts the default python kernel in the background (logs when there is none).
    pub fn warm_up(&self) {
        let s = self.clone();
        tokio::spawn(async move {
            match s.default_context("python").await {
                Ok(ctx) => {
                    let mut g = ctx.kernel.lock().await;
                    if let Err(e) = s.ensure_kernel(&ctx, &mut g).await {
                        tracing::warn!("default python kernel did not start: {e}");
                    }
                }
                Err(e) => tracing::warn!("{e}"),
            }
        });
    }

    /// Kills every kernel.
    pub fn kill_all(&self) {
        for c in lock(&self.0.contexts).values().chain(lock(&self.0.defaults).values()) {
            c.kill();
        }
    }

    async fn fetch_envs(&self, token: Option<&str>) -> Envs {
        let url = format!("{}/envs", self.0.config.envd_url.trim_end_matches('/'));
        match tokio::time::timeout(Duration::from_secs(3), http_get(&url, token)).await {
            Ok(Ok((200, body))) => match serde_json::from_slice::<BTreeMap<String, Value>>(&body) {
                Ok(m) => Envs::Got(
                    m.into_iter()
                        .map(|(k, v)| match v {
                            Value::String(s) => (k, s),
                            v => (k, v.to_string()),
                        })
                        .collect(),
                ),
                Err(e) => {
                    tracing::warn!("envd /envs: bad JSON: {e}");
                    Envs::Unavailable
                }
            },
            Ok(Ok((401 | 403, _))) => Envs::Unauthorized,
            Ok(Ok((status, _))) => {
                tracing::warn!(status, "envd /envs answered an error");
                Envs::Unavailable
            }
            Ok(Err(e)) => {
                tracing::debug!("envd /envs unreachable: {e}");
                Envs::Unavailable
            }
            Err(_) => {
                tracing::warn!("envd /envs timed out");
                Envs::Unavailable
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A plain HTTP/1.1 GET; returns the status and body.
async fn http_get(
    url: &str,
    token: Option<&str>,
) -> Result<(u16, Bytes), Box<dyn std::error::Error + Send + Sync>> {
    use http_body_util::BodyExt;
    let uri: http::Uri = url.parse()?;
    let host = uri.host().ok_or("no host in the envd URL")?;
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(header::HOST, format!("{host}:{port}"));
    if let Some(t) = token {
        req = req.header("X-Access-Token", t);
    }
    let resp = send.send_request(req.body(http_body_util::Empty::<Bytes>::new())?).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// The router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}/restart", post(restart_context))
        .route("/contexts/{id}", delete(remove_context))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "not found".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError(StatusCode::METHOD_NOT_ALLOWED, "method not allowed".into())
        })
        .with_state(state)
}

/// Serves `app(state)` on `listener` until `shutdown` resolves, then kills every kernel.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt as _;
    // NDJSON lines are small writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY failed: {e}");
        }
    });
    let s = state.clone();
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            s.kill_all();
        })
        .await
}

async fn health() -> impl IntoResponse {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], "\"OK\"")
}

#[derive(serde::Deserialize)]
struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(serde::Deserialize, Default)]
struct CreateContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    /// The context's env vars (the SDKs send none; a raw client may).
    #[serde(default, alias = "env_vars")]
    envs: Option<BTreeMap<String, String>>,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("invalid request body: {e}")))
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// The NDJSON line of an event (the code-interpreter's output models).
pub fn event_json(ev: &Event) -> Value {
    match ev {
        Event::Stream { stderr, text, timestamp } => json!({
            "type": if *stderr { "stderr" } else { "stdout" },
            "text": text, "timestamp": timestamp,
        }),
        Event::Error { name, value, traceback } => {
            json!({"type": "error", "name": name, "value": value, "traceback": traceback.join("\n")})
        }
        Event::Result { main, data } => result_json(*main, data),
    }
}

fn result_json(main: bool, data: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), "result".into());
    out.insert("is_main_result".into(), main.into());
    let mut extra = Map::new();
    for (mime, v) in data {
        let key = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            "e2b/data" => "data",
            "e2b/chart" => "chart",
            _ => {
                extra.insert(mime.clone(), v.clone());
                continue;
            }
        };
        let v = match (key, v) {
            // Like E2B's server: a repr'd string loses its outer quotes.
            ("text", Value::String(s))
                if s.len() >= 2 && s.starts_with('\'') && s.ends_with('\'') =>
            {
                Value::String(s[1..s.len() - 1].to_owned())
            }
            _ => v.clone(),
        };
        out.insert(key.into(), v);
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    Value::Object(out)
}

async fn execute(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ExecuteRequest = parse(&body)?;
    let ctx = match (&req.context_id, &req.language) {
        (Some(_), Some(_)) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "context_id and language are mutually exclusive".into(),
            ));
        }
        (Some(id), None) => s
            .context(id)
            .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("context {id} not found")))?,
        (None, lang) => s.default_context(&kernel::normalize_language(lang.as_deref())).await?,
    };
    let header_token =
        headers.get("x-access-token").and_then(|v| v.to_str().ok()).map(String::from);
    let token = header_token.clone().or_else(|| lock(&s.0.accepted_token).clone());
    let globals = match s.fetch_envs(token.as_deref()).await {
        Envs::Got(m) => {
            if header_token.is_some() {
                *lock(&s.0.accepted_token) = header_token;
            }
            Some(m)
        }
        Envs::Unauthorized if header_token.is_some() => {
            return Err(ApiError(StatusCode::UNAUTHORIZED, "invalid access token".into()));
        }
        Envs::Unauthorized | Envs::Unavailable => None,
    };
    let mut slot = ctx.kernel.clone().lock_owned().await;
    s.ensure_kernel(&ctx, &mut slot).await?;

    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let env_vars = req.env_vars.unwrap_or_default();
    tokio::spawn(async move {
        let Some(k) = slot.as_mut() else {
            return;
        };
        let language = ctx.language.clone();
        let base = globals.map(|mut g| {
            g.extend(ctx.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
            g
        });
        if let Err(e) = run(k, &language, &req.code, base, &env_vars, &tx).await {
            tracing::warn!(context = %ctx.id, "execution failed: {e}");
            let _ = tx
                .send(line(&json!({
                    "type": "error", "name": "KernelError", "value": e.to_string(), "traceback": "",
                })))
                .await;
            let _ = tx.send(line(&json!({"type": "unexpected_end_of_execution"}))).await;
            // The next execution starts a fresh kernel.
            if let Some(k) = slot.take() {
                ctx.pid.store(0, Ordering::SeqCst);
                k.shutdown().await;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream))
        .into_response())
}

/// One execution on a locked kernel: changes of the base env (the sandbox's env vars with the
/// context's over them), the request env, the code, the end lines, then the request env reverted
/// to the base.
async fn run(
    k: &mut Kernel,
    language: &str,
    code: &str,
    base: Option<BTreeMap<String, String>>,
    env_vars: &BTreeMap<String, String>,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), KernelError> {
    if let Some(g) = base {
        let set: BTreeMap<String, String> = g
            .iter()
            .filter(|(key, v)| k.applied_env.get(*key) != Some(*v))
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect();
        let unset: Vec<String> =
            k.applied_env.keys().filter(|key| !g.contains_key(*key)).cloned().collect();
        if let Some(snippet) = kernel::env_snippet(language, &set, &unset) {
            k.run_silent(&snippet).await?;
        }
        k.applied_env = g;
    }
    if let Some(snippet) = kernel::env_snippet(language, env_vars, &[]) {
        k.run_silent(&snippet).await?;
    }

    let (etx, mut erx) = mpsc::channel::<Event>(64);
    let forward = async {
        loop {
            tokio::select! {
                ev = erx.recv() => match ev {
                    Some(ev) => if tx.send(line(&event_json(&ev))).await.is_err() { break },
                    None => break,
                },
                _ = tx.closed() => break,
            }
        }
        // Dropping the receiver tells `execute` the client is gone (it then interrupts).
        drop(erx);
    };
    let exec = async {
        let r = k.execute(code, false, Some(&etx)).await;
        drop(etx);
        r
    };
    let (outcome, ()) = tokio::join!(exec, forward);
    let outcome = outcome?;
    if let Some(n) = outcome.execution_count {
        let _ = tx.send(line(&json!({"type": "number_of_executions", "execution_count": n}))).await;
    }
    let _ = tx.send(line(&json!({"type": "end_of_execution"}))).await;

    if !env_vars.is_empty() {
        // Back to the global value, or unset.
        let restore: BTreeMap<String, String> = env_vars
            .keys()
            .filter_map(|key| k.applied_env.get(key).map(|v| (key.clone(), v.clone())))
            .collect();
        let unset: Vec<String> =
            env_vars.keys().filter(|key| !k.applied_env.contains_key(*key)).cloned().collect();
        if let Some(snippet) = kernel::env_snippet(language, &restore, &unset) {
            k.run_silent(&snippet).await?;
        }
    }
    Ok(())
}

async fn create_context(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let req: CreateContext = if body.iter().all(u8::is_ascii_whitespace) {
        CreateContext::default()
    } else {
        parse(&body)?
    };
    let language = kernel::normalize_language(req.language.as_deref());
    let spec = s.spec(&language).await?;
    let cwd = req
        .cwd
        .filter(|c| !c.is_empty())
        .map_or_else(|| s.0.config.default_cwd.clone(), PathBuf::from);
    let ctx = s.new_context(language, cwd, req.envs.unwrap_or_default(), spec);
    {
        let mut slot = ctx.kernel.lock().await;
        s.ensure_kernel(&ctx, &mut slot).await?;
    }
    lock(&s.0.contexts).insert(ctx.id.clone(), ctx.clone());
    Ok(json_response(StatusCode::OK, &ctx.json()))
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

async fn list_contexts(State(s): State<AppState>) -> Response {
    let mut list: Vec<Arc<Context>> = lock(&s.0.contexts).values().cloned().collect();
    list.sort_by(|a, b| a.id.cmp(&b.id));
    let v: Vec<Value> = list.iter().map(|c| c.json()).collect();
    json_response(StatusCode::OK, &Value::Array(v))
}

async fn restart_context(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let ctx = s
        .context(&id)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("context {id} not found")))?;
    // Kill first, so a busy kernel releases its lock.
    ctx.kill();
    let mut slot = ctx.kernel.lock().await;
    if let Some(k) = slot.take() {
        k.shutdown().await;
    }
    s.ensure_kernel(&ctx, &mut slot).await?;
    Ok(json_response(StatusCode::OK, &json!({})))
}

async fn remove_context(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let ctx = lock(&s.0.contexts).remove(&id);
    let ctx = match ctx {
        Some(c) => c,
        None => {
            // A default context can be removed too; the next use of its language makes a new one.
            let mut d = lock(&s.0.defaults);
            let lang = d.iter().find(|(_, c)| c.id == id).map(|(l, _)| l.clone());
            lang.and_then(|l| d.remove(&l))
                .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("context {id} not found")))?
        }
    };
    ctx.kill();
    if let Some(k) = ctx.kernel.lock().await.take() {
        k.shutdown().await;
    }
    Ok(json_response(StatusCode::OK, &json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_bundles_map_to_result_fields() {
        let data: Map<String, Value> = serde_json::from_value(json!({
            "text/plain": "'abc'", "image/png": "iVBO", "application/json": {"a": 1},
            "application/vnd.custom": "x",
        }))
        .unwrap_or_default();
        let v = result_json(true, &data);
        assert_eq!(v["text"], "abc");
        assert_eq!(v["png"], "iVBO");
        assert_eq!(v["json"]["a"], 1);
        assert_eq!(v["extra"]["application/vnd.custom"], "x");
        assert_eq!(v["is_main_result"], true);
    }
}
