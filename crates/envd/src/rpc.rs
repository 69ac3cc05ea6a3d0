//! Routing of `POST /process.Process/{method}` and `POST /filesystem.Filesystem/{method}` to the
//! method implementations, with the Connect framing of [`crate::connect`].

use crate::connect::{
    self, CallMeta, Code, ConnectError, Kind, Msg, Sink, client_stream, decode_single, read_body,
    serve_stream, stream_error_response, unary_response,
};
use crate::process::{Spawn, Subscription};
use crate::proto::{
    self, Empty, EventResponse, ListResponse, SelectorRequest, SendInputRequest, SendSignalRequest,
    StartRequest, StreamInputRequest, UpdateRequest, process_input::Input, stream_input_request,
};
use crate::state::AppState;
use crate::users::User;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use base64::Engine as _;
use futures::StreamExt as _;
use http::{HeaderMap, StatusCode};

/// Context of one call.
pub struct Call {
    /// Shared state.
    pub state: AppState,
    /// Connect headers.
    pub meta: CallMeta,
    /// The user named by `Authorization: Basic`, if any.
    pub basic_user: Option<String>,
}

impl Call {
    /// The operation user (Basic auth, else the default); unknown → `unauthenticated`.
    pub fn user(&self) -> Result<User, ConnectError> {
        self.state.user(self.basic_user.as_deref()).map_err(|name| {
            ConnectError::new(Code::Unauthenticated, format!("invalid username: '{name}'"))
        })
    }
}

/// The user in `Authorization: Basic base64(user:password)`.
pub fn basic_user(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, b64) = v.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let s = String::from_utf8(raw).ok()?;
    let user = s.split_once(':').map_or(s.as_str(), |(u, _)| u);
    (!user.is_empty()).then(|| user.to_owned())
}

fn unknown_method(service: &str, method: &str) -> Response {
    let mut r =
        ConnectError::new(Code::Unimplemented, format!("{service}.{method} is not implemented"))
            .into_unary_response();
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}

async fn unary<Req, Res, F, Fut>(call: Call, body: Body, f: F) -> Response
where
    Req: Msg,
    Res: Msg,
    F: FnOnce(Call, Req) -> Fut,
    Fut: Future<Output = Result<Res, ConnectError>>,
{
    let codec = call.meta.codec;
    let timeout = call.meta.timeout;
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(e) => return e.into_unary_response(),
    };
    let req = match codec.decode::<Req>(&bytes) {
        Ok(r) => r,
        Err(e) => return e.into_unary_response(),
    };
    let fut = f(call, req);
    let res = match timeout {
        Some(t) => tokio::time::timeout(t, fut).await.unwrap_or_else(|_| {
            Err(ConnectError::new(Code::DeadlineExceeded, "the operation timed out"))
        }),
        None => fut.await,
    };
    match res {
        Ok(m) => unary_response(codec, &m),
        Err(e) => e.into_unary_response(),
    }
}

async fn server_stream<Req, Res, F, Fut>(call: Call, body: Body, deadline: bool, f: F) -> Response
where
    Req: Msg,
    Res: Msg,
    F: FnOnce(Call, Req, Sink<Res>) -> Fut,
    Fut: Future<Output = Result<(), ConnectError>> + Send + 'static,
{
    let codec = call.meta.codec;
    let timeout = call.meta.timeout.filter(|_| deadline);
    let req = match read_body(body).await.and_then(|b| decode_single::<Req>(codec, &b)) {
        Ok(r) => r,
        Err(e) => return stream_error_response(codec, e),
    };
    serve_stream(codec, move |sink| {
        let fut = f(call, req, sink);
        async move {
            match timeout {
                Some(t) => tokio::time::timeout(t, fut).await.unwrap_or_else(|_| {
                    Err(ConnectError::new(Code::DeadlineExceeded, "the operation timed out"))
                }),
                None => fut.await,
            }
        }
    })
}

/// `POST /process.Process/{method}`
pub async fn process(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let kind = match method.as_str() {
        "Start" | "Connect" => Kind::ServerStream,
        "StreamInput" => Kind::ClientStream,
        "List" | "SendInput" | "SendSignal" | "CloseStdin" | "Update" => Kind::Unary,
        _ => return unknown_method("process.Process", &method),
    };
    let meta = match connect::parse_meta(kind, &headers) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    let call = Call { state, meta, basic_user: basic_user(&headers) };
    match method.as_str() {
        "Start" => server_stream(call, body, false, start).await,
        "Connect" => server_stream(call, body, true, connect_process).await,
        "StreamInput" => stream_input(call, body).await,
        "List" => unary(call, body, list).await,
        "SendInput" => unary(call, body, send_input).await,
        "SendSignal" => unary(call, body, send_signal).await,
        "CloseStdin" => unary(call, body, close_stdin).await,
        _ => unary(call, body, update).await,
    }
}

/// `POST /filesystem.Filesystem/{method}`
pub async fn filesystem(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    use crate::fs;
    let kind = match method.as_str() {
        "WatchDir" => Kind::ServerStream,
        "Stat" | "MakeDir" | "Move" | "ListDir" | "Remove" | "CreateWatcher"
        | "GetWatcherEvents" | "RemoveWatcher" => Kind::Unary,
        _ => return unknown_method("filesystem.Filesystem", &method),
    };
    let meta = match connect::parse_meta(kind, &headers) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    let call = Call { state, meta, basic_user: basic_user(&headers) };
    match method.as_str() {
        "WatchDir" => server_stream(call, body, true, crate::watch::watch_dir).await,
        "Stat" => unary(call, body, fs::stat).await,
        "MakeDir" => unary(call, body, fs::make_dir).await,
        "Move" => unary(call, body, fs::move_entry).await,
        "ListDir" => unary(call, body, fs::list_dir).await,
        "Remove" => unary(call, body, fs::remove).await,
        "CreateWatcher" => unary(call, body, crate::watch::create_watcher).await,
        "GetWatcherEvents" => unary(call, body, crate::watch::get_watcher_events).await,
        _ => unary(call, body, crate::watch::remove_watcher).await,
    }
}

/// The environment of a new process (e2b-protocol.md §3.6): PATH, the container's env, the
/// user's HOME/USER/LOGNAME, the global vars of `/init`, then the request's.
fn process_env(
    state: &AppState,
    user: &User,
    request: &std::collections::HashMap<String, String>,
) -> std::collections::HashMap<String, String> {
    let mut env = std::collections::HashMap::new();
    let path = std::env::var("PATH")
        .unwrap_or_else(|_| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    env.insert("PATH".into(), path);
    env.extend(state.config().container_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert("HOME".into(), user.home.to_string_lossy().into_owned());
    env.insert("USER".into(), user.name.clone());
    env.insert("LOGNAME".into(), user.name.clone());
    env.extend(state.global_env());
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

async fn start(
    call: Call,
    req: StartRequest,
    sink: Sink<EventResponse>,
) -> Result<(), ConnectError> {
    let user = call.user()?;
    let config = req.process.ok_or_else(|| ConnectError::invalid("process config is required"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::invalid("process cmd is required"));
    }
    let init = call.state.init();
    let cwd = crate::users::resolve_path(
        config.cwd.as_deref().unwrap_or(""),
        &user,
        init.default_workdir.as_deref(),
    )
    .map_err(|e| ConnectError::invalid(e.to_string()))?;
    let pty = req.pty.map(|p| {
        let size = p.size.unwrap_or_default();
        let c = u16::try_from(size.cols).unwrap_or(u16::MAX);
        let r = u16::try_from(size.rows).unwrap_or(u16::MAX);
        (if c == 0 { 80 } else { c }, if r == 0 { 24 } else { r })
    });
    let env = process_env(&call.state, &user, &config.envs);
    let spawn =
        Spawn { config, pty, tag: req.tag, stdin: req.stdin.unwrap_or(true), user, cwd, env };
    let (proc, sub) = call.state.processes().start(spawn)?;
    // Connect-Timeout-Ms on Start is a process deadline: kill it then, even in the background.
    let mut deadline_hit = None;
    if let Some(t) = call.meta.timeout.filter(|t| !t.is_zero()) {
        let p = proc.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::time::sleep(t).await;
            if p.signal(rustix::process::Signal::KILL).is_ok() {
                tracing::info!(pid = p.pid(), "process deadline reached, killed");
                let _ = tx.send(());
            }
        });
        deadline_hit = Some(rx);
    }
    let keepalive = call.meta.keepalive;
    let forward = sub.forward(&sink, keepalive);
    match deadline_hit {
        None => forward.await,
        Some(rx) => {
            tokio::pin!(forward);
            tokio::select! {
                r = &mut forward => r,
                Ok(()) = rx => Err(ConnectError::new(Code::DeadlineExceeded, "the process deadline was reached")),
            }
        }
    }
}

async fn connect_process(
    call: Call,
    req: SelectorRequest,
    sink: Sink<EventResponse>,
) -> Result<(), ConnectError> {
    let proc = call.state.processes().find(req.process.as_ref())?;
    Subscription::attach(&proc).forward(&sink, call.meta.keepalive).await
}

async fn list(call: Call, _req: proto::ListRequest) -> Result<ListResponse, ConnectError> {
    Ok(ListResponse { processes: call.state.processes().list() })
}

async fn send_input(call: Call, req: SendInputRequest) -> Result<Empty, ConnectError> {
    let proc = call.state.processes().find(req.process.as_ref())?;
    match req.input.and_then(|i| i.input) {
        Some(Input::Stdin(d)) => proc.write_input(&d, false).await?,
        Some(Input::Pty(d)) => proc.write_input(&d, true).await?,
        None => {}
    }
    Ok(Empty {})
}

async fn send_signal(call: Call, req: SendSignalRequest) -> Result<Empty, ConnectError> {
    let proc = call.state.processes().find(req.process.as_ref())?;
    let sig = match proto::Signal::try_from(req.signal) {
        Ok(proto::Signal::Sigkill) => rustix::process::Signal::KILL,
        Ok(proto::Signal::Sigterm) => rustix::process::Signal::TERM,
        _ => {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!("invalid signal: {}", req.signal),
            ));
        }
    };
    proc.signal(sig)?;
    Ok(Empty {})
}

async fn close_stdin(call: Call, req: SelectorRequest) -> Result<Empty, ConnectError> {
    call.state.processes().find(req.process.as_ref())?.close_stdin().await?;
    Ok(Empty {})
}

async fn update(call: Call, req: UpdateRequest) -> Result<Empty, ConnectError> {
    let proc = call.state.processes().find(req.process.as_ref())?;
    if let Some(size) = req.pty.and_then(|p| p.size) {
        proc.resize(size.cols, size.rows)?;
    }
    Ok(Empty {})
}

async fn stream_input(call: Call, body: Body) -> Response {
    let codec = call.meta.codec;
    let timeout = call.meta.timeout;
    let state = call.state.clone();
    let work = async move {
        let mut msgs = std::pin::pin!(client_stream::<StreamInputRequest>(codec, body));
        let mut proc = None;
        while let Some(msg) = msgs.next().await {
            match msg?.event {
                Some(stream_input_request::Event::Start(s)) => {
                    proc = Some(state.processes().find(s.process.as_ref())?);
                }
                Some(stream_input_request::Event::Data(d)) => {
                    let p = proc.as_ref().ok_or_else(|| {
                        ConnectError::invalid("the first StreamInput message must be start")
                    })?;
                    match d.input.and_then(|i| i.input) {
                        Some(Input::Stdin(b)) => p.write_input(&b, false).await?,
                        Some(Input::Pty(b)) => p.write_input(&b, true).await?,
                        None => {}
                    }
                }
                Some(stream_input_request::Event::Keepalive(_)) | None => {}
            }
        }
        Ok::<_, ConnectError>(())
    };
    let result = match timeout {
        Some(t) => tokio::time::timeout(t, work).await.unwrap_or_else(|_| {
            Err(ConnectError::new(Code::DeadlineExceeded, "the operation timed out"))
        }),
        None => work.await,
    };
    let frames = match &result {
        Ok(()) => {
            let mut b = connect::envelope(0, &codec.encode(&Empty {})).to_vec();
            b.extend_from_slice(&connect::end_envelope(Ok(())));
            b
        }
        Err(e) => connect::end_envelope(Err(e)).to_vec(),
    };
    let mut r = Response::new(Body::from(frames));
    let ct = if codec == connect::Codec::Json {
        "application/connect+json"
    } else {
        "application/connect+proto"
    };
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(ct));
    r
}
