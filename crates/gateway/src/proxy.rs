//! One request through the gateway: route, check access, wake, dial, forward, relay.
//!
//! # Expected flow
//!
//! 1. [`route`] names `(sandboxID, port)`; a malformed request gets 400.
//! 2. The route table (after its first list; 503 until then) gives the Sandbox; unknown or
//!    killed ([`gone::killed`]) ⇒ the not-found 502.
//! 3. Authentication by the gateway's mode ([`crate::auth`]), before any wake: unauthenticated
//!    traffic never resumes a sandbox.
//! 4. State: running ⇒ go on. Paused and [`may_wake`] ⇒ one resume write per sandbox (the
//!    first waiting request writes; others wait on the same resume), then wait, woken by the
//!    table's watch events, until it runs (504 after the wake timeout). Resuming (already
//!    unpaused) ⇒ wait the same way. Anything else ⇒ the not-found 502.
//! 5. Upstream: an idle pooled HTTP/1.1 connection to that sandbox port (pooled per sandbox
//!    UID, port and the time it last became Ready, so nothing survives a pause), else a fresh
//!    dial through the [`Dialer`](crate::Dialer). A pooled connection that fails before the request was
//!    written is replaced by a fresh one.
//! 6. The request is sent with hop-by-hop headers removed, the path prefix of path routing
//!    stripped, and the traffic token removed where [`crate::auth`] says; bodies stream both ways frame by frame,
//!    never buffered. An `Upgrade` request (WebSocket) goes on its own connection; on `101`
//!    both sides are upgraded and bytes are copied in both directions.
//! 7. A failure before the response head (dial, or the upstream connection broke) is answered
//!    with the not-found 502 when the store says the sandbox was killed meanwhile
//!    ([`gone::confirm`]), else with the failure's own 502.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use jiff::{SignedDuration, Timestamp};
use oka_api::{Sandbox, SandboxState, conditions, sandbox_state};
use oka_store::{Store, StoreError};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::Inner;
use crate::auth::{ACCESS_TOKEN_HEADER, AuthMode, Credentials};
use crate::dial::DialError;
use crate::error::{Body, Reject, TRAFFIC_TOKEN_HEADER};
use crate::gone;
use crate::idle::IdleIo;
use crate::route::{Target, route};
use crate::wake::{may_wake, resumed};

/// A hyper client connection to a sandbox port.
pub(crate) type Upstream = SendRequest<Incoming>;

/// Identity of an upstream connection's far end: sandbox UID, port, and the time the sandbox
/// last became Ready (a pause and resume starts a new epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolKey<'a> {
    uid: &'a str,
    port: u16,
    epoch: i64,
}

impl<'a> PoolKey<'a> {
    /// The key of `port` of `sandbox` as it is now.
    pub(crate) fn of(sandbox: &'a Sandbox, port: u16) -> Self {
        let epoch = sandbox
            .condition(conditions::sandbox::READY)
            .map_or(0, |c| c.last_transition_time.0.as_nanosecond() as i64);
        Self { uid: sandbox.metadata.uid.as_deref().unwrap_or_default(), port, epoch }
    }
}

/// An idle upstream connection as the [`Pool`] sees it.
pub(crate) trait Pooled {
    /// The far end closed it (or it is unusable): drop it.
    fn is_closed(&self) -> bool;
    /// It can take a request now.
    fn is_ready(&self) -> bool;
}

impl Pooled for Upstream {
    fn is_closed(&self) -> bool {
        SendRequest::is_closed(self)
    }

    fn is_ready(&self) -> bool {
        SendRequest::is_ready(self)
    }
}

/// The idle connections to one port of a sandbox, in one epoch.
struct PortIdle<C> {
    port: u16,
    epoch: i64,
    senders: Vec<C>,
}

/// Idle HTTP/1.1 connections to sandbox ports, by sandbox UID (looked up without allocating):
/// hyper's client connections for the hyper path, raw streams for the relay ([`crate::fast`]).
pub(crate) struct Pool<C> {
    idle: Mutex<HashMap<String, Vec<PortIdle<C>>, BuildHasherDefault<Fnv>>>,
}

impl<C> Default for Pool<C> {
    fn default() -> Self {
        Self { idle: Mutex::default() }
    }
}

/// FNV-1a: the pool's keys are UIDs the store generated, not chosen by clients, so a hash
/// without flooding resistance is safe, and it is several times cheaper than SipHash on them.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Past this many sandboxes, a check-in sweeps sandboxes with no open idle connection.
const POOL_SWEEP_AT: usize = 1024;

impl<C: Pooled> Pool<C> {
    /// An idle connection to `key`'s sandbox port, ready for a request.
    pub(crate) fn checkout(&self, key: PoolKey<'_>) -> Option<C> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let ports = idle.get_mut(key.uid)?;
        let i = ports.iter().position(|p| p.port == key.port && p.epoch == key.epoch)?;
        let list = &mut ports[i].senders;
        list.retain(|s| !s.is_closed());
        // A connection still relaying its last response body is not ready yet. An emptied
        // entry stays for the next check-in (which would otherwise allocate it again); the
        // sweep removes it if none comes.
        list.iter().position(C::is_ready).map(|j| list.swap_remove(j))
    }

    /// Drops every idle connection the far end closed, and the entries left empty. A socket
    /// opened in a sandbox's network namespace keeps that namespace alive until it is closed,
    /// so the connections of deleted sandboxes must not wait for a next request.
    pub(crate) fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        sweep(&mut idle);
    }

    /// Keeps `sender` for the next request to `key` (at most `max` per sandbox port).
    pub(crate) fn checkin(&self, key: PoolKey<'_>, sender: C, max: usize) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() >= POOL_SWEEP_AT {
            sweep(&mut idle);
        }
        let ports = match idle.get_mut(key.uid) {
            Some(ports) => ports,
            None => idle.entry(key.uid.to_owned()).or_default(),
        };
        // Connections of another epoch lead to a sandbox instance that is gone.
        ports.retain(|p| p.epoch == key.epoch);
        match ports.iter_mut().find(|p| p.port == key.port) {
            Some(p) if p.senders.len() < max => p.senders.push(sender),
            Some(_) => {}
            None if max > 0 => {
                ports.push(PortIdle { port: key.port, epoch: key.epoch, senders: vec![sender] })
            }
            None => {}
        }
    }
}

/// [`Pool::sweep`] on the map itself.
fn sweep<C: Pooled, S>(idle: &mut HashMap<String, Vec<PortIdle<C>>, S>) {
    idle.retain(|_, ports| {
        ports.retain_mut(|p| {
            p.senders.retain(|s| !s.is_closed());
            !p.senders.is_empty()
        });
        !ports.is_empty()
    });
}

/// Headers that describe one hop and are not forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most messages have none: one pass over the names instead of a lookup per name.
    if !keep_upgrade
        && !headers.keys().any(|name| name == header::UPGRADE || HOP_BY_HOP.contains(name))
    {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .filter(|name| !(keep_upgrade && name == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

fn is_upgrade<B>(request: &Request<B>) -> bool {
    request.headers().contains_key(header::UPGRADE)
        && request
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The authentication of a request for `sandbox` ([`crate::auth::authorize`] with the
/// gateway's mode and verifier); `Ok(true)` when the traffic token is to be removed.
fn authorize<S: Store>(
    inner: &Inner<S>,
    sandbox: &Sandbox,
    sandbox_id: &str,
    credentials: Credentials<'_>,
) -> Result<bool, Reject> {
    let mode = inner.config.auth;
    let verifier = if mode == AuthMode::Jwt { inner.jwt.current() } else { None };
    crate::auth::authorize(
        mode,
        sandbox,
        sandbox_id,
        credentials,
        verifier.as_deref(),
        Timestamp::now(),
    )
}

/// Serves one request.
///
/// The request's span is at debug level: `oka serve` logs at info, where a span per request
/// would cost more than the rest of the gateway's own work on a small request.
pub(crate) async fn handle<S: Store>(
    inner: Arc<Inner<S>>,
    request: Request<Incoming>,
) -> Response<Body> {
    let span = tracing::debug_span!(
        "gateway",
        sandbox = tracing::field::Empty,
        port = tracing::field::Empty,
        status = tracing::field::Empty,
        latency_us = tracing::field::Empty,
    );
    if span.is_disabled() {
        return proxy(&inner, request, &span).await.unwrap_or_else(|reject| reject.response());
    }
    let started = Instant::now();
    let response =
        tracing::Instrument::instrument(proxy(&inner, request, &span), span.clone()).await;
    let response = response.unwrap_or_else(|reject| reject.response());
    span.record("status", response.status().as_u16());
    span.record("latency_us", started.elapsed().as_micros() as u64);
    span.in_scope(|| debug!("request done"));
    response
}

async fn proxy<S: Store>(
    inner: &Arc<Inner<S>>,
    mut request: Request<Incoming>,
    span: &tracing::Span,
) -> Result<Response<Body>, Reject> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default();
    inner.metrics.hyper_requests.inc();
    let target = match route(
        host,
        request.uri().path_and_query(),
        request.headers(),
        &inner.config.domain,
    ) {
        Ok(target) => target,
        Err(e) => {
            let health = inner.health.get().and_then(|h| h.answer(request.uri().path()));
            return match health {
                Some((status, body)) => Err(Reject::Health { status, body }),
                None => Err(Reject::BadRequest(e.to_string())),
            };
        }
    };
    if !span.is_disabled() {
        span.record("sandbox", target.sandbox_id.as_str());
        span.record("port", target.port);
    }
    let headers = request.headers();
    let credentials = Credentials {
        traffic_token: headers.get(TRAFFIC_TOKEN_HEADER).map(HeaderValue::as_bytes),
        access_token: headers.get(ACCESS_TOKEN_HEADER).map(HeaderValue::as_bytes),
    };
    let (sandbox, strip_token) = sandbox_for(inner, &target, credentials).await?;
    if strip_token {
        request.headers_mut().remove(TRAFFIC_TOKEN_HEADER);
    }
    match forward(inner, &sandbox, &target, request).await {
        Ok(response) => Ok(response),
        Err(reject) => Err(gone::confirm(inner, &sandbox, reject).await),
    }
}

/// The running sandbox a request for `target` goes to, once the route table has been listed:
/// a paused one is woken when allowed (the request waits for it), and the request's
/// `credentials` are checked by the gateway's auth mode ([`crate::auth`]). The flag is true
/// when the traffic token is to be removed before forwarding.
pub(crate) async fn sandbox_for<S: Store>(
    inner: &Arc<Inner<S>>,
    target: &Target,
    credentials: Credentials<'_>,
) -> Result<(Arc<Sandbox>, bool), Reject> {
    if !inner.table.is_ready()
        && tokio::time::timeout(inner.config.ready_timeout, inner.table.wait_ready()).await.is_err()
    {
        return Err(Reject::NotReady);
    }
    let routed = inner.table.get(&target.sandbox_id);
    if routed.is_some() {
        // Every request to a known sandbox is activity, also one that must wake it.
        inner.activity.touch(&target.sandbox_id, target.port);
    }
    let sandbox = match routed {
        // The common case, without the wait's state in this future.
        Some(sandbox)
            if sandbox_state(&sandbox, Timestamp::now()).state == SandboxState::Running
                && !gone::killed(&sandbox) =>
        {
            sandbox
        }
        _ => Box::pin(running_sandbox(inner, target, credentials)).await?,
    };
    let strip_token = match authorize(inner, &sandbox, &target.sandbox_id, credentials) {
        Ok(strip) => strip,
        Err(reject) if may_be_newer_token(inner, &sandbox, credentials, &reject) => {
            Box::pin(authorize_when_updated(inner, target, credentials, &sandbox, reject)).await?
        }
        Err(reject) => return Err(reject),
    };
    Ok((sandbox, strip_token))
}

/// Whether a refused traffic token may be one the route table has not seen yet: the sandbox has
/// an opaque token (oka's), the request carries another, and the gateway is one that waits for
/// the watch's lag ([`crate::GatewayConfig::unknown_wait`]: on a cluster the manager that
/// refreshed the token is another process, which cannot wait for this gateway's table).
fn may_be_newer_token<S: Store>(
    inner: &Inner<S>,
    sandbox: &Sandbox,
    credentials: Credentials<'_>,
    reject: &Reject,
) -> bool {
    !inner.config.unknown_wait.is_zero()
        && credentials.traffic_token.is_some()
        && matches!(reject, Reject::TokenInvalid { .. } | Reject::TrafficTokenInvalid { .. })
        && sandbox
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(oka_api::annotations::TRAFFIC_ACCESS_TOKEN_SHA256))
}

/// Authenticates again on each newer version of the sandbox the table brings, for at most
/// [`crate::GatewayConfig::unknown_wait`]; the first refusal when none passes.
async fn authorize_when_updated<S: Store>(
    inner: &Arc<Inner<S>>,
    target: &Target,
    credentials: Credentials<'_>,
    seen: &Sandbox,
    refused: Reject,
) -> Result<bool, Reject> {
    let id = &target.sandbox_id;
    let mut changes = inner.table.subscribe();
    let deadline = Instant::now() + inner.config.unknown_wait;
    let mut version = seen.metadata.resource_version.clone();
    loop {
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return Err(refused),
        }
        let Some(current) = inner.table.get(id) else { return Err(refused) };
        if current.metadata.uid != seen.metadata.uid {
            return Err(refused);
        }
        if current.metadata.resource_version == version {
            continue;
        }
        version.clone_from(&current.metadata.resource_version);
        if let Ok(strip) = authorize(inner, &current, id, credentials) {
            return Ok(strip);
        }
    }
}

/// The sandbox of `target` once it runs: waits for a resume (and starts one) when allowed.
async fn running_sandbox<S: Store>(
    inner: &Arc<Inner<S>>,
    target: &Target,
    credentials: Credentials<'_>,
) -> Result<Arc<Sandbox>, Reject> {
    let id = &target.sandbox_id;
    let not_found = || Reject::NotFound { sandbox_id: id.clone() };
    let mut changes = inner.table.subscribe();
    let mut deadline: Option<Instant> = None;
    let mut resume_started = false;
    let mut waited_unknown = inner.config.unknown_wait.is_zero();
    loop {
        let sandbox = match inner.table.get(id) {
            Some(sandbox) => sandbox,
            None if !waited_unknown => {
                // Created elsewhere a moment ago: the watch may not have brought it yet.
                waited_unknown = true;
                if inner.table.wait_routed(id, inner.config.unknown_wait).await {
                    continue;
                }
                return Err(not_found());
            }
            None => return Err(not_found()),
        };
        if gone::killed(&sandbox) {
            return Err(not_found());
        }
        let now = Timestamp::now();
        match sandbox_state(&sandbox, now).state {
            SandboxState::Running => return Ok(sandbox),
            SandboxState::Paused => {
                if deadline.is_none() {
                    // Unauthenticated traffic must not wake a sandbox.
                    authorize(inner, &sandbox, id, credentials)?;
                }
                if sandbox.is_paused() {
                    if !may_wake(&sandbox, now) {
                        return Err(not_found());
                    }
                    if !resume_started {
                        resume_started = true;
                        // Boxed: the store write's future is large.
                        Box::pin(start_resume(inner, id, &sandbox)).await?;
                    }
                }
            }
            _ => return Err(not_found()),
        }
        let wait = inner.config.wake_timeout;
        let deadline = *deadline.get_or_insert_with(|| Instant::now() + wait);
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => {
                warn!(sandbox = %id, "the sandbox did not resume in time");
                return Err(Reject::WakeTimeout { sandbox_id: id.clone(), waited: wait });
            }
        }
    }
}

/// Removes the sandbox from the in-flight resumes when the resuming request is done.
struct Resuming<'a> {
    set: &'a Mutex<std::collections::HashSet<String>>,
    id: String,
}

impl Drop for Resuming<'_> {
    fn drop(&mut self) {
        self.set.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// Writes `spec.paused: false` unless another request of this gateway is doing it.
async fn start_resume<S: Store>(
    inner: &Arc<Inner<S>>,
    id: &str,
    sandbox: &Sandbox,
) -> Result<(), Reject> {
    if !inner.resuming.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_owned()) {
        return Ok(());
    }
    let _guard = Resuming { set: &inner.resuming, id: id.to_owned() };
    let namespace = sandbox.metadata.namespace.clone().unwrap_or_default();
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let failed =
        |e: StoreError| Reject::WakeFailed { sandbox_id: id.to_owned(), reason: e.to_string() };
    let resume_timeout =
        SignedDuration::try_from(inner.config.resume_timeout).unwrap_or(SignedDuration::MAX);
    let mut current = sandbox.clone();
    for _ in 0..5 {
        let now = Timestamp::now();
        if current.metadata.uid != sandbox.metadata.uid || !may_wake(&current, now) {
            return Ok(());
        }
        let Some(update) = resumed(&current, now, resume_timeout) else { return Ok(()) };
        match inner.store.update(&namespace, &update).await {
            Ok(_) => {
                inner.metrics.wakes.inc();
                info!(sandbox = %id, "paused sandbox woken by a request");
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) => {
                current = match inner.store.get::<Sandbox>(&namespace, &name).await {
                    Ok(fresh) => fresh,
                    Err(e) if e.is_not_found() => {
                        return Err(Reject::NotFound { sandbox_id: id.to_owned() });
                    }
                    Err(e) => return Err(failed(e)),
                };
            }
            Err(e) if e.is_not_found() => {
                return Err(Reject::NotFound { sandbox_id: id.to_owned() });
            }
            Err(e) => return Err(failed(e)),
        }
    }
    Err(Reject::WakeFailed {
        sandbox_id: id.to_owned(),
        reason: "too many concurrent updates".into(),
    })
}

/// A new TCP connection to `target`'s port of `sandbox` (no delay set), or the answer that
/// says why there is none.
pub(crate) async fn dial_stream<S: Store>(
    inner: &Arc<Inner<S>>,
    sandbox: &Sandbox,
    target: &Target,
) -> Result<tokio::net::TcpStream, Reject> {
    let id = &target.sandbox_id;
    let dialed =
        tokio::time::timeout(inner.config.connect_timeout, inner.dialer.dial(sandbox, target.port))
            .await;
    let stream = match dialed {
        Ok(Ok(stream)) => stream,
        Ok(Err(DialError::PortClosed { port })) => {
            return Err(Reject::PortClosed { sandbox_id: id.clone(), port });
        }
        Ok(Err(DialError::SandboxGone(reason))) => {
            debug!(sandbox = %id, %reason, "dial: no instance");
            return Err(Reject::NotFound { sandbox_id: id.clone() });
        }
        Ok(Err(DialError::Io(e))) => {
            return Err(Reject::Unreachable { sandbox_id: id.clone(), reason: e.to_string() });
        }
        Err(_) => {
            return Err(Reject::Unreachable {
                sandbox_id: id.clone(),
                reason: format!("connect timed out after {:?}", inner.config.connect_timeout),
            });
        }
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

async fn dial<S: Store>(
    inner: &Arc<Inner<S>>,
    sandbox: &Sandbox,
    target: &Target,
    upgrades: bool,
) -> Result<Upstream, Reject> {
    let id = &target.sandbox_id;
    let stream = dial_stream(inner, sandbox, target).await?;
    let meter = inner.metrics.upstream_bytes.clone();
    let io = TokioIo::new(IdleIo::metered(stream, inner.config.idle_timeout, meter));
    let unreachable =
        |e: hyper::Error| Reject::Unreachable { sandbox_id: id.clone(), reason: e.to_string() };
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Incoming>(io)
        .await
        .map_err(unreachable)?;
    let sandbox_id = id.clone();
    if upgrades {
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                debug!(sandbox = %sandbox_id, %error, "upstream connection ended");
            }
        });
    } else {
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(sandbox = %sandbox_id, %error, "upstream connection ended");
            }
        });
    }
    Ok(sender)
}

/// The request as sent upstream: origin-form URI, hop-by-hop headers removed, a `Host`.
fn upstream_request(
    mut request: Request<Incoming>,
    path: Option<&PathAndQuery>,
    upgrade: bool,
) -> Request<Incoming> {
    let path = path
        .or_else(|| request.uri().path_and_query())
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if !request.headers().contains_key(header::HOST)
        && let Some(authority) = request.uri().authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        request.headers_mut().insert(header::HOST, host);
    }
    *request.uri_mut() = Uri::from(path);
    *request.version_mut() = http::Version::HTTP_11;
    strip_hop_by_hop(request.headers_mut(), upgrade);
    request
}

fn relay(mut response: Response<Incoming>, upgrade: bool) -> Response<Body> {
    strip_hop_by_hop(response.headers_mut(), upgrade);
    response.map(Either::Left)
}

async fn forward<S: Store>(
    inner: &Arc<Inner<S>>,
    sandbox: &Sandbox,
    target: &Target,
    request: Request<Incoming>,
) -> Result<Response<Body>, Reject> {
    if is_upgrade(&request) {
        // Boxed: the upgrade's state stays out of every plain request's future.
        return Box::pin(forward_upgrade(inner, sandbox, target, request)).await;
    }
    let unreachable = |e: hyper::Error| Reject::Unreachable {
        sandbox_id: target.sandbox_id.clone(),
        reason: e.to_string(),
    };
    let key = PoolKey::of(sandbox, target.port);
    let mut request = upstream_request(request, target.path.as_ref(), false);
    let max_idle = inner.config.max_idle_per_target;
    while let Some(mut sender) = inner.pool.checkout(key) {
        let sent = Instant::now();
        match sender.try_send_request(request).await {
            Ok(response) => {
                inner.metrics.first_byte.observe(sent.elapsed());
                inner.pool.checkin(key, sender, max_idle);
                return Ok(relay(response, false));
            }
            Err(mut error) => match error.take_message() {
                // Not written: try another connection.
                Some(unsent) => request = unsent,
                None => return Err(unreachable(error.into_error())),
            },
        }
    }
    let mut sender = Box::pin(dial(inner, sandbox, target, false)).await?;
    let sent = Instant::now();
    let response = sender.send_request(request).await.map_err(unreachable)?;
    inner.metrics.first_byte.observe(sent.elapsed());
    inner.pool.checkin(key, sender, max_idle);
    Ok(relay(response, false))
}

/// An `Upgrade` request (WebSocket): its own upstream connection; on `101` both sides are
/// upgraded and bytes are copied both ways.
async fn forward_upgrade<S: Store>(
    inner: &Arc<Inner<S>>,
    sandbox: &Sandbox,
    target: &Target,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Reject> {
    let unreachable = |e: hyper::Error| Reject::Unreachable {
        sandbox_id: target.sandbox_id.clone(),
        reason: e.to_string(),
    };
    let downstream = hyper::upgrade::on(&mut request);
    let mut sender = dial(inner, sandbox, target, true).await?;
    let request = upstream_request(request, target.path.as_ref(), true);
    let sent = Instant::now();
    let mut response = sender.send_request(request).await.map_err(unreachable)?;
    inner.metrics.first_byte.observe(sent.elapsed());
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upstream = hyper::upgrade::on(&mut response);
        let sandbox_id = target.sandbox_id.clone();
        tokio::spawn(async move {
            match tokio::try_join!(downstream, upstream) {
                Ok((down, up)) => {
                    let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
                    if let Err(error) = tokio::io::copy_bidirectional(&mut down, &mut up).await {
                        debug!(sandbox = %sandbox_id, %error, "upgraded stream ended");
                    }
                }
                Err(error) => debug!(sandbox = %sandbox_id, %error, "upgrade failed"),
            }
        });
        let (parts, _) = response.into_parts();
        let mut response = Response::from_parts(parts, Either::Right(Full::new(Bytes::new())));
        strip_hop_by_hop(response.headers_mut(), true);
        return Ok(response);
    }
    Ok(relay(response, false))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// An idle connection whose far end a test closes.
    struct Fake(u8, Arc<AtomicBool>);

    impl Pooled for Fake {
        fn is_closed(&self) -> bool {
            self.1.load(Ordering::SeqCst)
        }

        fn is_ready(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_sweep_drops_closed_connections_and_emptied_sandboxes() {
        let pool = Pool::default();
        let key = |uid| PoolKey { uid, port: 49983, epoch: 1 };
        let closed = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicBool::new(false));
        pool.checkin(key("a"), Fake(1, Arc::clone(&closed)), 4);
        pool.checkin(key("a"), Fake(2, Arc::clone(&open)), 4);
        pool.checkin(key("b"), Fake(3, Arc::clone(&closed)), 4);
        closed.store(true, Ordering::SeqCst);
        pool.sweep();
        let idle = pool.idle.lock().unwrap();
        assert_eq!(idle.keys().collect::<Vec<_>>(), ["a"], "b had nothing open left");
        assert_eq!(idle["a"][0].senders.iter().map(|f| f.0).collect::<Vec<_>>(), [2]);
        drop(idle);
        assert_eq!(pool.checkout(key("a")).map(|f| f.0), Some(2));
        assert!(pool.checkout(key("b")).is_none());
    }
}
