//! The seam where a claimed sandbox's agent runtime is initialised.
//!
//! After the claim write and before the `201`, the create handler calls
//! [`SandboxInitializer::init`] with the sandbox, the caller's `envVars` and the fresh access
//! token; a resume replays the recorded request. [`EnvdInitializer`] is the reference's
//! `POST http://<sandbox>:49983/init {"envVars", "accessToken"}` (short per-attempt timeout,
//! bounded retries), over a connection from an [`EnvdConnector`] (the node runtime's port
//! connector). [`NoopInitializer`] does nothing: the access token and env vars are then only
//! recorded on the sandbox (`agents.kruise.io/init-runtime-request`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use oka_api::Sandbox;
use tokio::net::TcpStream;
use tracing::debug;

use crate::index::Index;

/// Why initialising a sandbox failed; the create fails with 500 and the sandbox is deleted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot initialise the sandbox's agent runtime: {0}")]
pub struct InitError(pub String);

/// The JSON of `agents.kruise.io/init-runtime-request`: what a claim sent to `/init`, kept
/// so it can be sent again to new processes of the sandbox.
#[derive(serde::Deserialize)]
struct RecordedInit {
    #[serde(rename = "envVars", default)]
    env_vars: BTreeMap<String, String>,
    #[serde(rename = "accessToken", default)]
    access_token: String,
}

/// Sends `sandbox`'s recorded `/init` request again (after a resume that started its
/// processes anew, or a restart); a sandbox without one (never claimed) needs nothing.
///
/// # Errors
///
/// [`InitError`] when the agent runtime does not take it.
pub async fn replay_recorded(
    initializer: &dyn SandboxInitializer,
    sandbox: &Sandbox,
) -> Result<(), InitError> {
    let Some(recorded) = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(oka_api::annotations::INIT_RUNTIME_REQUEST))
        .and_then(|json| serde_json::from_str::<RecordedInit>(json).ok())
        .filter(|r| !r.access_token.is_empty())
    else {
        return Ok(());
    };
    initializer.init(sandbox, &recorded.env_vars, &recorded.access_token).await
}

/// Initialises the agent runtime of a freshly claimed sandbox.
pub trait SandboxInitializer: Send + Sync + 'static {
    /// Sends `env_vars` and `access_token` to the sandbox's agent runtime and returns once it
    /// answered. Must be idempotent: a retried create may call it again.
    fn init<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        env_vars: &'a BTreeMap<String, String>,
        access_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>>;

    /// [`init`](Self::init) for an agent runtime that holds `held_token` now (a sandbox
    /// restored from a snapshot holds the snapshot's): the request proves it knows
    /// `held_token`, and the runtime accepts only `access_token` from then on. Idempotent as
    /// `init`: a runtime that already took `access_token` accepts the same request again. The
    /// default calls `init`.
    fn init_replacing<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        env_vars: &'a BTreeMap<String, String>,
        access_token: &'a str,
        _held_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>> {
        self.init(sandbox, env_vars, access_token)
    }

    /// The agent runtime's current metrics (envd's `GET /metrics` JSON), asked with
    /// `access_token`; `Ok(None)` when there is no agent runtime to ask (the default).
    fn metrics<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _access_token: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<serde_json::Value>, InitError>> {
        Box::pin(async { Ok(None) })
    }

    /// Called with the claim candidates of every pool whenever they change (see
    /// [`keep_pools_prepared`]): work done here for a candidate is work its claim does not do.
    /// The envd initializer opens each candidate's connection. Best effort: a failure here only
    /// leaves the work to the claim. The default does nothing.
    fn prepare<'a>(&'a self, _candidates: &'a [Arc<Sandbox>]) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The initializer used until the agent runtime lands: does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopInitializer;

impl SandboxInitializer for NoopInitializer {
    fn init<'a>(
        &'a self,
        _sandbox: &'a Sandbox,
        _env_vars: &'a BTreeMap<String, String>,
        _access_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The agent runtime's port (envd).
pub const ENVD_PORT: u16 = 49983;

/// Opens a TCP connection to a port inside a sandbox (the node runtime's `connect`: on one
/// machine a socket in the sandbox's network namespace; on Kubernetes the pod IP).
pub trait EnvdConnector: Send + Sync + 'static {
    /// A connection to `port` of `sandbox`.
    fn connect<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<tokio::net::TcpStream>>;

    /// Takes back a connection to `port` of `sandbox` after a complete exchange: idle, and fit
    /// for another HTTP/1.1 request (the gateway's first request to the sandbox can use it).
    /// The default closes it.
    fn release(&self, _sandbox: &Sandbox, _port: u16, _stream: tokio::net::TcpStream) {}
}

/// Settings of an [`EnvdInitializer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvdInitConfig {
    /// The most one attempt (connect, request, answer) may take. Default 2 s.
    pub attempt_timeout: Duration,
    /// How many attempts before giving up. Default 20.
    pub attempts: u32,
    /// The pause after the first failed attempt; doubled after each, up to 1 s. Default 20 ms.
    pub first_backoff: Duration,
}

impl Default for EnvdInitConfig {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(2),
            attempts: 20,
            first_backoff: Duration::from_millis(20),
        }
    }
}

/// The reference's runtime init: `POST /init` to the sandbox's envd (port [`ENVD_PORT`]) with
/// `{"envVars", "accessToken", "timestamp"}`, over a connection from an [`EnvdConnector`].
///
/// # Expected flow
///
/// 1. Connect through the connector and send the request (HTTP/1.1, `X-Access-Token` set to the
///    token too, so an envd that already holds this token accepts a replay after a resume).
/// 2. `204` (any 2xx): done.
/// 3. A connection failure, a timeout ([`EnvdInitConfig::attempt_timeout`]) or a 5xx: wait
///    ([`EnvdInitConfig::first_backoff`], doubling, at most 1 s) and try again, at most
///    [`EnvdInitConfig::attempts`] times in all (envd may still be starting).
/// 4. Another status (401: envd holds another token; 400: it refused the body): fail at once.
///
/// # Connections opened ahead of claims
///
/// [`SandboxInitializer::prepare`] opens a connection to the envd of each pool candidate and
/// parks it, so a claim's `/init` finds it open: the connect (through the sandbox's network
/// namespace) and envd's accept are then done while the pool fills, not while a caller waits.
/// The first attempt of an `init` takes its sandbox's parked connection, if any:
///
/// - one the peer already closed (envd restarted, the sandbox was hibernated and restored) is
///   dropped and a fresh connection is made at once;
/// - one that fails before an answer is followed at once, in the same attempt, by a fresh
///   connection (no backoff: `/init` is idempotent, and the fault was the old connection's).
///
/// A candidate whose connection cannot be opened is left alone for [`PREPARE_RETRY_AFTER`] (its
/// claim connects as it would have anyway). Parked connections of sandboxes that stopped being
/// candidates (claimed elsewhere, deleted) are closed by the next `prepare`. Each parked connection is one idle socket at each end;
/// envd keeps an idle connection open for as long as its peer does.
///
/// After a complete answer that leaves the connection open, it goes to
/// [`EnvdConnector::release`] rather than being closed (`oka serve` hands it to the gateway).
///
/// # Guarantees
///
/// - Bounded: at most `attempts × attempt_timeout` plus the pauses (about 60 s by default).
/// - Idempotent: the same request twice leaves envd in the same state.
/// - A parked connection is used by one request at most: taking it removes it.
pub struct EnvdInitializer<C> {
    connector: C,
    config: EnvdInitConfig,
    /// What `prepare` got for each candidate, by [`park_key`].
    parked: Mutex<HashMap<String, Parked>>,
}

/// What `prepare` got for a candidate.
enum Parked {
    /// An open connection to its envd.
    Open(TcpStream),
    /// Opening one failed at this time: not tried again for [`PREPARE_RETRY_AFTER`], so a
    /// sandbox that does not answer costs no connect per pass.
    Failed(tokio::time::Instant),
}

impl<C> std::fmt::Debug for EnvdInitializer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvdInitializer").field("config", &self.config).finish_non_exhaustive()
    }
}

/// How many connections a `prepare` opens at once.
const PREPARE_CONCURRENCY: usize = 8;

/// How long a candidate whose connection could not be opened is left alone by `prepare`.
pub const PREPARE_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The key of a sandbox's parked connection: its UID (a sandbox recreated under the same name is
/// another sandbox), else `namespace/name`.
fn park_key(sandbox: &Sandbox) -> Cow<'_, str> {
    match &sandbox.metadata.uid {
        Some(uid) if !uid.is_empty() => Cow::Borrowed(uid),
        _ => Cow::Owned(format!(
            "{}/{}",
            sandbox.metadata.namespace.as_deref().unwrap_or_default(),
            sandbox.metadata.name.as_deref().unwrap_or_default()
        )),
    }
}

/// Whether a parked connection may still carry a request: the peer has neither closed it nor
/// sent anything (envd never speaks first). Asks the socket without waiting; a connection that
/// passes and still fails is replaced by a fresh one anyway.
fn still_open(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte).now_or_never() {
        None => true,
        Some(Ok(_) | Err(_)) => false,
    }
}

impl<C: EnvdConnector> EnvdInitializer<C> {
    /// An initializer that reaches envd through `connector`.
    pub fn new(connector: C, config: EnvdInitConfig) -> Self {
        Self { connector, config, parked: Mutex::new(HashMap::new()) }
    }

    fn parked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Parked>> {
        // Nothing panics while holding the lock; a poisoned map is still consistent.
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many connections are parked (open, unused) now.
    pub fn parked_connections(&self) -> usize {
        self.parked().values().filter(|p| matches!(p, Parked::Open(_))).count()
    }

    /// Takes `sandbox`'s parked connection, if it has one that is still open.
    fn take_parked(&self, sandbox: &Sandbox) -> Option<TcpStream> {
        let Parked::Open(stream) = self.parked().remove(park_key(sandbox).as_ref())? else {
            return None;
        };
        if still_open(&stream) {
            Some(stream)
        } else {
            debug!(sandbox = ?sandbox.metadata.name, "the parked envd connection was closed");
            None
        }
    }

    /// One request to `sandbox`'s envd: over its parked connection if it has a live one (and,
    /// should that fail before an answer, at once over a fresh one), else over a fresh one.
    async fn request(&self, sandbox: &Sandbox, call: &Call<'_>) -> Result<Exchanged, String> {
        if let Some(stream) = self.take_parked(sandbox) {
            match exchange(stream, call).await {
                Ok(answer) => return Ok(answer),
                Err(why) => {
                    debug!(sandbox = ?sandbox.metadata.name, %why, "the parked envd connection failed; connecting afresh");
                }
            }
        }
        self.fresh(sandbox, call).await
    }

    /// One request to `sandbox`'s envd over a fresh connection.
    async fn fresh(&self, sandbox: &Sandbox, call: &Call<'_>) -> Result<Exchanged, String> {
        let stream = self
            .connector
            .connect(sandbox, ENVD_PORT)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        exchange(stream, call).await
    }

    /// Opens a connection to `sandbox`'s envd and parks it (see [`SandboxInitializer::prepare`]).
    async fn open_ahead(&self, sandbox: &Sandbox) {
        let connect = self.connector.connect(sandbox, ENVD_PORT);
        let parked = match tokio::time::timeout(self.config.attempt_timeout, connect).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                Parked::Open(stream)
            }
            Ok(Err(error)) => {
                debug!(sandbox = ?sandbox.metadata.name, %error, "cannot open an envd connection ahead of the claim");
                Parked::Failed(tokio::time::Instant::now())
            }
            Err(_) => {
                debug!(sandbox = ?sandbox.metadata.name, "opening an envd connection ahead of the claim timed out");
                Parked::Failed(tokio::time::Instant::now())
            }
        };
        self.parked().insert(park_key(sandbox).into_owned(), parked);
    }

    /// One `POST /init` with `body`, proving the token envd holds with `proof`.
    async fn attempt(&self, sandbox: &Sandbox, body: &[u8], proof: &str) -> Attempt {
        let call =
            Call { method: http::Method::POST, path: "/init", body, access_token: Some(proof) };
        match self.request(sandbox, &call).await {
            Err(why) => Attempt::Retry(why),
            Ok(Exchanged { status, reusable, .. }) if status.is_success() => {
                if let Some(stream) = reusable {
                    self.connector.release(sandbox, ENVD_PORT, stream);
                }
                Attempt::Done
            }
            Ok(Exchanged { status, body: text, .. }) => {
                let why = format!("envd answered {status}: {}", String::from_utf8_lossy(&text));
                if status.is_server_error() { Attempt::Retry(why) } else { Attempt::Fail(why) }
            }
        }
    }
}

/// The body of envd's `POST /init`.
#[derive(serde::Serialize)]
struct InitBody<'a> {
    #[serde(rename = "envVars")]
    env_vars: &'a BTreeMap<String, String>,
    #[serde(rename = "accessToken")]
    access_token: &'a str,
    timestamp: String,
}

/// What one attempt ended with.
enum Attempt {
    Done,
    Retry(String),
    Fail(String),
}

/// One request to envd: method, path, JSON body and the access token to send.
struct Call<'a> {
    method: http::Method,
    path: &'a str,
    body: &'a [u8],
    access_token: Option<&'a str>,
}

/// What an [`exchange`] got: the answer, and the connection when it can carry another request.
struct Exchanged {
    status: http::StatusCode,
    body: axum::body::Bytes,
    reusable: Option<TcpStream>,
}

/// One HTTP/1.1 request to envd over `stream`: the answer, or why it failed before one (worth
/// retrying). The connection is driven in this task (no task is spawned), and taken back from
/// hyper after a complete answer that keeps it open.
async fn exchange(stream: TcpStream, call: &Call<'_>) -> Result<Exchanged, String> {
    use http_body_util::{BodyExt, Full};
    let (mut sender, mut connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    let mut request = http::Request::builder()
        .method(call.method.clone())
        .uri(call.path)
        .header(http::header::HOST, format!("localhost:{ENVD_PORT}"))
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = call.access_token {
        request = request.header("x-access-token", token);
    }
    let request =
        request.body(Full::new(bytes_of(call.body))).map_err(|e| format!("request: {e}"))?;
    // Owns the sender: it is dropped as soon as the answer is complete.
    let answer = async move {
        let response = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let keep_alive = !response
            .headers()
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let bytes =
            response.into_body().collect().await.map_err(|e| format!("response: {e}"))?.to_bytes();
        Ok::<_, String>((status, bytes, keep_alive))
    };
    tokio::pin!(answer);
    let driven = futures::future::poll_fn(|cx| connection.poll_without_shutdown(cx));
    let (status, body, keep_alive) = tokio::select! {
        biased;
        answered = &mut answer => answered?,
        // The connection ended first (closed, or failed): the answer, if any, is complete now.
        ended = driven => {
            let answered = answer.await;
            if let Err(error) = ended {
                debug!(%error, "the envd connection ended");
            }
            let (status, bytes, _) = answered?;
            return Ok(Exchanged { status, body: bytes, reusable: None });
        }
    };
    let parts = connection.into_parts();
    let reusable = (keep_alive && parts.read_buf.is_empty()).then(|| parts.io.into_inner());
    Ok(Exchanged { status, body, reusable })
}

fn bytes_of(body: &[u8]) -> axum::body::Bytes {
    axum::body::Bytes::copy_from_slice(body)
}

impl<C: EnvdConnector> EnvdInitializer<C> {
    /// `POST /init` with `access_token` and `env_vars`, the `X-Access-Token` header `proof`;
    /// retried as the [type documentation](EnvdInitializer) says.
    fn run_init<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        env_vars: &'a BTreeMap<String, String>,
        access_token: &'a str,
        proof: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>> {
        Box::pin(async move {
            let body =
                InitBody { env_vars, access_token, timestamp: jiff::Timestamp::now().to_string() };
            let body = serde_json::to_vec(&body).map_err(|e| InitError(e.to_string()))?;
            let mut backoff = self.config.first_backoff;
            let mut last = String::from("no attempt made");
            for number in 1..=self.config.attempts.max(1) {
                // A retry after an answer that was lost: envd holds `access_token` by now, and
                // accepts the same token in the body whatever the header says.
                let outcome = tokio::time::timeout(
                    self.config.attempt_timeout,
                    self.attempt(sandbox, &body, proof),
                )
                .await
                .unwrap_or_else(|_| {
                    Attempt::Retry(format!(
                        "no answer within {} ms",
                        self.config.attempt_timeout.as_millis()
                    ))
                });
                match outcome {
                    Attempt::Done => {
                        debug!(sandbox = ?sandbox.metadata.name, attempts = number, "envd initialised");
                        return Ok(());
                    }
                    Attempt::Fail(why) => return Err(InitError(format!("POST /init: {why}"))),
                    Attempt::Retry(why) => last = why,
                }
                if number < self.config.attempts {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
            Err(InitError(format!(
                "POST /init failed {} times; last: {last}",
                self.config.attempts.max(1)
            )))
        })
    }
}

impl<C: EnvdConnector> SandboxInitializer for EnvdInitializer<C> {
    fn init<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        env_vars: &'a BTreeMap<String, String>,
        access_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>> {
        self.run_init(sandbox, env_vars, access_token, access_token)
    }

    fn init_replacing<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        env_vars: &'a BTreeMap<String, String>,
        access_token: &'a str,
        held_token: &'a str,
    ) -> BoxFuture<'a, Result<(), InitError>> {
        self.run_init(sandbox, env_vars, access_token, held_token)
    }

    fn prepare<'a>(&'a self, candidates: &'a [Arc<Sandbox>]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let wanted: HashSet<Cow<'_, str>> = candidates.iter().map(|s| park_key(s)).collect();
            let now = tokio::time::Instant::now();
            let missing: Vec<&'a Arc<Sandbox>> = {
                let mut parked = self.parked();
                parked.retain(|key, got| {
                    wanted.contains(key.as_str())
                        && match got {
                            Parked::Open(_) => true,
                            Parked::Failed(at) => now.duration_since(*at) < PREPARE_RETRY_AFTER,
                        }
                });
                candidates.iter().filter(|s| !parked.contains_key(park_key(s).as_ref())).collect()
            };
            if missing.is_empty() {
                return;
            }
            let mut waiting = missing.into_iter();
            let mut opening = futures::stream::FuturesUnordered::new();
            loop {
                while opening.len() < PREPARE_CONCURRENCY {
                    let Some(sandbox) = waiting.next() else { break };
                    opening.push(self.open_ahead(sandbox));
                }
                if opening.next().await.is_none() {
                    return;
                }
            }
        })
    }

    fn metrics<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        access_token: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<serde_json::Value>, InitError>> {
        Box::pin(async move {
            let call =
                Call { method: http::Method::GET, path: "/metrics", body: &[], access_token };
            let asked = self.fresh(sandbox, &call);
            let Exchanged { status, body, reusable } =
                tokio::time::timeout(self.config.attempt_timeout, asked)
                    .await
                    .map_err(|_| InitError("GET /metrics: no answer in time".into()))?
                    .map_err(|why| InitError(format!("GET /metrics: {why}")))?;
            if let Some(stream) = reusable {
                self.connector.release(sandbox, ENVD_PORT, stream);
            }
            if !status.is_success() {
                return Err(InitError(format!("GET /metrics: envd answered {status}")));
            }
            serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| InitError(format!("GET /metrics: {e}")))
        })
    }
}

/// How long [`keep_pools_prepared`] lets changes gather before it prepares the candidates.
pub const PREPARE_COALESCE: Duration = Duration::from_millis(50);

/// Keeps `initializer` prepared for the claim candidates of every pool in `index`: after each
/// change of the candidates (gathered for [`PREPARE_COALESCE`]), calls
/// [`SandboxInitializer::prepare`] with all of them. Runs until the index is dropped.
pub async fn keep_pools_prepared(index: Weak<Index>, initializer: Arc<dyn SandboxInitializer>) {
    let Some(mut changes) = index.upgrade().map(|i| i.subscribe()) else { return };
    let mut prepared = None;
    loop {
        let candidates = {
            let Some(index) = index.upgrade() else { return };
            let (generation, candidates) = index.all_pool_members();
            (prepared != Some(generation)).then(|| {
                prepared = Some(generation);
                candidates
            })
        };
        if let Some(candidates) = candidates {
            initializer.prepare(&candidates).await;
        }
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(PREPARE_COALESCE).await;
        changes.mark_unchanged();
    }
}
