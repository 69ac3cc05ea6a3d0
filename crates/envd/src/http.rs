//! The plain HTTP endpoints (e2b-protocol.md §3.5) and the access-token check (§3.2).

use crate::state::{AppState, ENVD_VERSION};
use crate::users::User;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use sha2::Digest as _;
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

/// Size of the chunks files are read and written in.
const FILE_CHUNK: usize = 512 * 1024;
/// Chunks in flight between the socket and the blocking file thread, per transfer.
const FILE_CHANNEL: usize = 4;

/// A failure of a plain endpoint; becomes `{"code":<status>,"message":…}` once, in `into_response`.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// 400: bad path, a directory, unsupported content type, bad metadata.
    #[error("{0}")]
    BadRequest(String),
    /// 401: auth failure or unknown user.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: the path does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 406: no acceptable encoding.
    #[error("{0}")]
    NotAcceptable(String),
    /// 416: the `Range` does not overlap the file (whose size is given).
    #[error("{message}")]
    RangeNotSatisfiable {
        /// What was wrong.
        message: String,
        /// The file's size, for `Content-Range: bytes */<size>`.
        size: u64,
    },
    /// 507: no space left.
    #[error("{0}")]
    NoSpace(String),
    /// 500: anything else (logged, details not sent).
    #[error("{0}")]
    Internal(String),
}

impl HttpError {
    fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            Self::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub(crate) fn io(e: &std::io::Error, path: &Path) -> Self {
        match e.kind() {
            std::io::ErrorKind::NotFound => {
                Self::NotFound(format!("path '{}' does not exist", path.display()))
            }
            std::io::ErrorKind::StorageFull => {
                Self::NoSpace(format!("not enough disk space to write '{}'", path.display()))
            }
            std::io::ErrorKind::PermissionDenied => {
                Self::Unauthorized(format!("permission denied: '{}'", path.display()))
            }
            std::io::ErrorKind::IsADirectory => {
                Self::BadRequest(format!("path '{}' is a directory", path.display()))
            }
            std::io::ErrorKind::NotADirectory => {
                Self::BadRequest(format!("a parent of '{}' is not a directory", path.display()))
            }
            _ => Self::Internal(format!("{}: {e}", path.display())),
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match &self {
            Self::Internal(m) => {
                tracing::error!(error = %m, "request failed");
                "internal error".to_owned()
            }
            other => {
                tracing::debug!(%status, error = %other, "request refused");
                other.to_string()
            }
        };
        let mut r = json_response(
            status,
            &serde_json::json!({ "code": status.as_u16(), "message": message }),
        );
        if let Self::RangeNotSatisfiable { size, .. } = &self
            && let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}"))
        {
            r.headers_mut().insert(header::CONTENT_RANGE, v);
        }
        r
    }
}

pub(crate) fn json_response(status: StatusCode, v: &serde_json::Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    r
}

fn token_ok(headers: &HeaderMap, token: &str) -> bool {
    headers.get("x-access-token").is_some_and(|v| constant_time_eq(v.as_bytes(), token.as_bytes()))
}

/// Compares without an early exit on the first differing byte.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Middleware: once `/init` set a token, everything but `/health`, `/files` and `/init` needs it.
pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let exempt = matches!(
        (req.method(), path),
        (&Method::GET, "/health")
            | (&Method::GET | &Method::POST, "/files")
            | (&Method::POST, "/init")
    );
    if !exempt
        && let Some(token) = state.init().access_token
        && !token_ok(req.headers(), &token)
    {
        return HttpError::Unauthorized(
            "unauthorized access, please provide a valid access token or method signing if supported"
                .into(),
        )
        .into_response();
    }
    next.run(req).await
}

/// `GET /health`
pub async fn health() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct InitBody {
    env_vars: Option<HashMap<String, String>>,
    access_token: Option<String>,
    default_user: Option<String>,
    default_workdir: Option<String>,
}

/// `POST /init`: token, default user and workdir, global env vars. Once a token is set, a new
/// `/init` must prove it knows it (header, or the same token in the body).
pub async fn init(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let b: InitBody = if body.iter().all(u8::is_ascii_whitespace) {
        InitBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::BadRequest(format!("invalid JSON: {e}")))?
    };
    if let Some(current) = state.init().access_token {
        let same = b
            .access_token
            .as_deref()
            .is_some_and(|t| constant_time_eq(t.as_bytes(), current.as_bytes()));
        if !same && !token_ok(&headers, &current) {
            return Err(HttpError::Unauthorized("access token mismatch".into()));
        }
    }
    if let Some(u) = b.default_user.as_deref().filter(|u| !u.is_empty())
        && crate::users::lookup(&state.config().passwd, u).is_none()
    {
        return Err(HttpError::BadRequest(format!("unknown default user '{u}'")));
    }
    state.set_init(|i| {
        i.access_token = b.access_token.filter(|t| !t.is_empty());
        if b.default_user.is_some() {
            i.default_user = b.default_user.filter(|u| !u.is_empty());
        }
        if b.default_workdir.is_some() {
            i.default_workdir = b.default_workdir.filter(|w| !w.is_empty());
        }
        if let Some(env) = b.env_vars {
            i.env_vars = env;
        }
    });
    tracing::info!("initialized by the control plane");
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert("x-envd-version", HeaderValue::from_static(ENVD_VERSION));
    Ok(r)
}

/// `GET /envs`
pub async fn envs(State(state): State<AppState>) -> Response {
    json_response(StatusCode::OK, &serde_json::json!(state.global_env()))
}

fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// `GET /metrics` (snake_case, consumed by the control plane).
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mem: HashMap<String, u64> = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_owned(), v.split_whitespace().next()?.parse::<u64>().ok()? * 1024))
        })
        .collect();
    let total = mem.get("MemTotal").copied().unwrap_or(0);
    let avail = mem.get("MemAvailable").copied().unwrap_or(0);
    let cache = mem.get("Cached").copied().unwrap_or(0);
    let used = total.saturating_sub(avail);
    let cpu_pct = match (cpu_times(), state.cpu_sample().lock()) {
        (Some(now), Ok(mut prev)) => {
            let pct = prev.map_or(0.0, |(b0, t0)| {
                let dt = now.1.saturating_sub(t0);
                if dt == 0 { 0.0 } else { now.0.saturating_sub(b0) as f64 * 100.0 / dt as f64 }
            });
            *prev = Some(now);
            pct
        }
        _ => 0.0,
    };
    let (disk_total, disk_used) = rustix::fs::statvfs("/")
        .map(|s| (s.f_blocks * s.f_frsize, (s.f_blocks - s.f_bfree) * s.f_frsize))
        .unwrap_or((0, 0));
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "ts": ts,
            "cpu_count": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "cpu_used_pct": (cpu_pct * 100.0).round() / 100.0,
            "mem_total": total, "mem_used": used, "mem_cache": cache,
            "mem_total_mib": total >> 20, "mem_used_mib": used >> 20,
            "disk_used": disk_used, "disk_total": disk_total,
        }),
    )
}

// ------------------------------------------------------------------------------------------------
// /files
// ------------------------------------------------------------------------------------------------

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query of a `/files` request.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FilesQuery {
    /// `path`
    pub path: Option<String>,
    /// `username`
    pub username: Option<String>,
    /// `signature` (`+` kept as is)
    pub signature: Option<String>,
    /// `signature_expiration`
    pub signature_expiration: Option<String>,
}

/// Parses the `/files` query.
pub fn parse_files_query(q: Option<&str>) -> FilesQuery {
    let mut out = FilesQuery::default();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match percent_decode(k, true).as_str() {
            "path" => out.path = Some(percent_decode(v, true)),
            "username" => out.username = Some(percent_decode(v, true)),
            "signature" => out.signature = Some(percent_decode(v, false)),
            "signature_expiration" => out.signature_expiration = Some(percent_decode(v, true)),
            _ => {}
        }
    }
    out
}

/// The `v1_` signature of a file URL (e2b-protocol.md §3.2).
pub fn file_signature(
    path: &str,
    op: &str,
    username: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let mut s = format!("{path}:{op}:{username}:{token}");
    if let Some(e) = expiration {
        s.push(':');
        s.push_str(e);
    }
    let digest = sha2::Sha256::digest(s.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

pub(crate) fn check_files_auth(
    state: &AppState,
    headers: &HeaderMap,
    q: &FilesQuery,
    op: &str,
) -> Result<(), HttpError> {
    let Some(token) = state.init().access_token else { return Ok(()) };
    if headers.contains_key("x-access-token") {
        return if token_ok(headers, &token) {
            Ok(())
        } else {
            Err(HttpError::Unauthorized("invalid access token".into()))
        };
    }
    let sig = q.signature.as_deref().ok_or_else(|| {
        HttpError::Unauthorized("missing signature query parameter or access token".into())
    })?;
    let exp = q.signature_expiration.as_deref().filter(|e| !e.is_empty());
    if let Some(e) = exp {
        let e: u64 = e
            .parse()
            .map_err(|_| HttpError::Unauthorized("invalid signature expiration".into()))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(u64::MAX);
        if e < now {
            return Err(HttpError::Unauthorized("signature is already expired".into()));
        }
    }
    let want = file_signature(
        q.path.as_deref().unwrap_or(""),
        op,
        q.username.as_deref().unwrap_or(""),
        &token,
        exp,
    );
    if constant_time_eq(sig.as_bytes(), want.as_bytes()) {
        Ok(())
    } else {
        Err(HttpError::Unauthorized("invalid signature".into()))
    }
}

pub(crate) fn files_user(state: &AppState, q: &FilesQuery) -> Result<User, HttpError> {
    state
        .user(q.username.as_deref())
        .map_err(|name| HttpError::Unauthorized(format!("error looking up user '{name}'")))
}

pub(crate) fn resolve_file(
    state: &AppState,
    user: &User,
    path: &str,
) -> Result<PathBuf, HttpError> {
    let init = state.init();
    crate::users::resolve_path(path, user, init.default_workdir.as_deref())
        .map_err(|e| HttpError::BadRequest(e.to_string()))
}

pub(crate) fn accepts_gzip(headers: &HeaderMap) -> Result<bool, HttpError> {
    let Some(v) = headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()) else {
        return Ok(false);
    };
    let mut gzip = false;
    let mut identity_refused = false;
    for item in v.split(',') {
        let mut parts = item.trim().split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .find_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.parse::<f32>().ok()))
            .unwrap_or(1.0);
        match coding.as_str() {
            "gzip" | "x-gzip" if q > 0.0 => gzip = true,
            "identity" | "*" if q == 0.0 => identity_refused = true,
            _ => {}
        }
    }
    if identity_refused && !gzip {
        return Err(HttpError::NotAcceptable(
            "no acceptable encoding; gzip and identity are supported".into(),
        ));
    }
    Ok(gzip)
}

/// How much of a file [`gzip_pays`] compresses to decide.
const GZIP_SAMPLE: usize = 16 * 1024;

/// Whether gzipping a download of `file` (`size` bytes) pays: its first [`GZIP_SAMPLE`] bytes,
/// compressed as the answer would be, must shrink by a tenth or more (blocking).
///
/// Clients accept gzip whether they want it or not (the Python SDK's HTTP client sends
/// `Accept-Encoding: gzip, deflate` on every read), and data that is compressed already
/// (archives, images, model weights) does not shrink: gzipping it made such downloads ~5x slower
/// (~190 MB/s of daemon CPU against ~900 MB/s plain, and the fast path) and a tiny file larger.
/// Answering with the identity encoding is always allowed, and the client sees the same bytes.
pub(crate) fn gzip_pays(file: &std::fs::File, size: u64) -> bool {
    use std::os::unix::fs::FileExt as _;
    let want = usize::try_from(size).unwrap_or(GZIP_SAMPLE).min(GZIP_SAMPLE);
    let mut sample = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match file.read_at(&mut sample[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // The read of the answer will meet the error and report it; compress or not.
            Err(_) => return false,
        }
    }
    if got == 0 {
        return false;
    }
    let mut enc =
        flate2::write::GzEncoder::new(Vec::with_capacity(got), flate2::Compression::fast());
    if enc.write_all(&sample[..got]).is_err() {
        return false;
    }
    enc.finish().is_ok_and(|packed| packed.len() * 10 <= got * 9)
}

/// Transfers at least this large give their buffers back to the kernel when they end.
const TRIM_AFTER: u64 = 8 << 20;

/// Returns the allocator's free memory to the kernel. A large transfer passes many MiB of chunk
/// buffers through the allocator; without this glibc keeps them, and an idle daemon would stay
/// at its high-water mark (e.g. 10–12 MB instead of 5 after one 100 MB upload).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs blocking file-system work on the blocking pool, not on the (single) runtime thread.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HttpError> + Send + 'static,
) -> Result<T, HttpError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| HttpError::Internal(format!("blocking task: {e}")))?
}

/// What a `Range` header asks of a file of a given size (RFC 9110 §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRequest {
    /// No usable `Range` (absent, another unit, several ranges, or malformed): the whole file, 200.
    Whole,
    /// The bytes `start..=end`, 206.
    Part {
        /// First byte.
        start: u64,
        /// Last byte (inclusive).
        end: u64,
    },
    /// The range does not overlap the file: 416.
    Unsatisfiable,
}

/// Resolves a `Range` header value against a file of `size` bytes. Only one `bytes` range is
/// served; several ranges are answered with the whole file, which the RFC allows.
pub fn parse_range(value: &str, size: u64) -> RangeRequest {
    let Some((unit, spec)) = value.trim().split_once('=') else { return RangeRequest::Whole };
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return RangeRequest::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else { return RangeRequest::Whole };
    let (a, b) = (a.trim(), b.trim());
    let num =
        |x: &str| x.bytes().all(|c| c.is_ascii_digit()).then(|| x.parse::<u64>().ok()).flatten();
    match (a.is_empty(), b.is_empty()) {
        // "-n": the last n bytes.
        (true, false) => match num(b) {
            None => RangeRequest::Whole,
            Some(0) => RangeRequest::Unsatisfiable,
            Some(_) if size == 0 => RangeRequest::Unsatisfiable,
            Some(n) => RangeRequest::Part { start: size.saturating_sub(n), end: size - 1 },
        },
        // "a-" or "a-b".
        (false, _) => {
            let Some(start) = num(a) else { return RangeRequest::Whole };
            let end = if b.is_empty() {
                u64::MAX
            } else {
                match num(b) {
                    Some(e) if e >= start => e,
                    _ => return RangeRequest::Whole,
                }
            };
            if start >= size {
                RangeRequest::Unsatisfiable
            } else {
                RangeRequest::Part { start, end: end.min(size - 1) }
            }
        }
        (true, true) => RangeRequest::Whole,
    }
}

/// Streams `len` bytes of `file` from offset `start` (gzipped when asked) through a small
/// channel from a blocking thread. Each chunk is read straight into the buffer that goes out (no
/// zeroing, no copy), and the file reads overlap the socket writes.
fn stream_file(mut file: std::fs::File, start: u64, len: u64, gzip: bool) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(FILE_CHANNEL);
    tokio::task::spawn_blocking(move || {
        let send = |b: Result<Bytes, std::io::Error>| tx.blocking_send(b).is_ok();
        if start > 0
            && let Err(e) = std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))
        {
            send(Err(e));
            return;
        }
        let mut file = std::io::Read::take(file, len);
        let next = |file: &mut std::io::Take<std::fs::File>| -> std::io::Result<Option<Bytes>> {
            let want = usize::try_from(file.limit()).unwrap_or(FILE_CHUNK).min(FILE_CHUNK);
            if want == 0 {
                return Ok(None);
            }
            let mut v = Vec::with_capacity(want);
            // `take` stops the read at `want`, so this is one full-sized read, without zeroing.
            (&mut *file).take(want as u64).read_to_end(&mut v)?;
            Ok((!v.is_empty()).then(|| Bytes::from(v)))
        };
        if gzip {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            loop {
                match next(&mut file) {
                    Ok(None) => break,
                    Ok(Some(b)) => {
                        if let Err(e) = enc.write_all(&b) {
                            send(Err(e));
                            return;
                        }
                        let out = std::mem::take(enc.get_mut());
                        if !out.is_empty() && !send(Ok(Bytes::from(out))) {
                            return;
                        }
                    }
                    Err(e) => {
                        send(Err(e));
                        return;
                    }
                }
            }
            match enc.finish() {
                Ok(rest) => send(Ok(Bytes::from(rest))),
                Err(e) => send(Err(e)),
            };
        } else {
            loop {
                match next(&mut file) {
                    Ok(None) => return,
                    Ok(Some(b)) => {
                        if !send(Ok(b)) {
                            return;
                        }
                    }
                    Err(e) => {
                        send(Err(e));
                        return;
                    }
                }
            }
        }
    });
    let stream = futures::stream::unfold(rx, move |mut rx| async move {
        let next = rx.recv().await;
        if next.is_none() && len >= TRIM_AFTER {
            trim_heap();
        }
        next.map(|b| (b, rx))
    });
    Body::from_stream(stream)
}

/// The checks of a `GET /files` (auth, user, path) and its file, opened: path, file and size.
pub(crate) async fn open_for_read(
    state: &AppState,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<(PathBuf, std::fs::File, u64), HttpError> {
    let q = parse_files_query(query);
    check_files_auth(state, headers, &q, "read")?;
    let user = files_user(state, &q)?;
    let path = resolve_file(state, &user, q.path.as_deref().unwrap_or(""))?;
    let p = path.clone();
    let (file, size) = blocking(move || {
        let file = std::fs::File::open(&p).map_err(|e| HttpError::io(&e, &p))?;
        let meta = file.metadata().map_err(|e| HttpError::io(&e, &p))?;
        if meta.is_dir() {
            return Err(HttpError::BadRequest(format!("path '{}' is a directory", p.display())));
        }
        Ok((file, meta.len()))
    })
    .await?;
    Ok((path, file, size))
}

/// The headers of a file's bytes in a `GET /files` answer (`len` bytes of it, or gzipped).
pub(crate) fn file_headers(h: &mut HeaderMap, path: &Path, len: u64, gzip: bool) {
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    let name = path.file_name().map(|n| n.to_string_lossy().replace('"', "")).unwrap_or_default();
    if let Ok(v) = HeaderValue::from_str(&format!("inline; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    } else {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
}

/// `GET /files?path=&username=&signature=&signature_expiration=`, with single `Range`s (206/416)
/// and gzip when `Accept-Encoding` allows it and the file compresses ([`gzip_pays`]; not for
/// ranges, which address the plain bytes).
pub async fn get_file(State(state): State<AppState>, req: Request) -> Result<Response, HttpError> {
    let (path, mut file, size) = open_for_read(&state, req.headers(), req.uri().query()).await?;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map_or(RangeRequest::Whole, |v| parse_range(v, size));
    let (status, start, len, gzip) = match range {
        RangeRequest::Whole => {
            let gzip = accepts_gzip(req.headers())? && {
                let (f, pays) = blocking(move || {
                    let pays = gzip_pays(&file, size);
                    Ok((file, pays))
                })
                .await?;
                file = f;
                pays
            };
            (StatusCode::OK, 0, size, gzip)
        }
        RangeRequest::Part { start, end } => {
            (StatusCode::PARTIAL_CONTENT, start, end - start + 1, false)
        }
        RangeRequest::Unsatisfiable => {
            return Err(HttpError::RangeNotSatisfiable {
                message: format!("range not satisfiable: '{}' has {size} bytes", path.display()),
                size,
            });
        }
    };
    let mut r = Response::new(stream_file(file, start, len, gzip));
    *r.status_mut() = status;
    file_headers(r.headers_mut(), &path, len, gzip);
    let h = r.headers_mut();
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    Ok(r)
}

/// One entry of the answer of `POST /files`.
#[derive(serde::Serialize)]
pub(crate) struct Written {
    path: String,
    name: String,
    r#type: &'static str,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    metadata: HashMap<String, String>,
}

/// The metadata of an upload's `X-Metadata-*` headers ([`crate::meta`]).
pub(crate) fn metadata_headers(headers: &HeaderMap) -> Result<HashMap<String, String>, HttpError> {
    crate::meta::from_headers(headers).map_err(|e| HttpError::BadRequest(e.to_string()))
}

/// Writes every buffer of `bufs`, with as few `writev` calls as the kernel allows.
fn write_all_vectored(out: &mut impl std::io::Write, bufs: &[Bytes]) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'_>> =
        bufs.iter().filter(|b| !b.is_empty()).map(|b| std::io::IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match out.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Streams `chunks` into `path` (created or truncated, owned by `user`), optionally gunzipping.
async fn write_file(
    path: PathBuf,
    user: User,
    gzip: bool,
    metadata: &HashMap<String, String>,
    mut chunks: impl futures::Stream<Item = Result<Bytes, HttpError>> + Unpin,
) -> Result<Written, HttpError> {
    // Off the runtime thread: truncating a large file, or a slow disk, must not stall every other
    // request and stream of the daemon.
    let p = path.clone();
    let file = blocking(move || open_for_write(&p, &user)).await?;
    // Body chunks (a few KiB to a few hundred KiB each) go to the writer thread in batches of about
    // FILE_CHUNK bytes, written with one vectored write each: few wake-ups, no copy.
    let (tx, mut rx) = mpsc::channel::<Vec<Bytes>>(FILE_CHANNEL);
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        if gzip {
            let mut out =
                flate2::write::GzDecoder::new(std::io::BufWriter::with_capacity(FILE_CHUNK, file));
            while let Some(batch) = rx.blocking_recv() {
                for b in &batch {
                    out.write_all(b)?;
                }
            }
            out.finish()?.flush()?;
        } else {
            let mut file = file;
            while let Some(batch) = rx.blocking_recv() {
                write_all_vectored(&mut file, &batch)?;
            }
        }
        Ok(())
    });
    let mut read_err = None;
    let mut batch = Vec::new();
    let mut batched = 0;
    let mut total = 0u64;
    loop {
        let chunk = chunks.next().await;
        let done = match chunk {
            Some(Ok(b)) => {
                batched += b.len();
                total += b.len() as u64;
                batch.push(b);
                false
            }
            Some(Err(e)) => {
                read_err = Some(e);
                true
            }
            None => true,
        };
        // (At most 256 buffers a batch: writev takes at most IOV_MAX = 1024.)
        if (done || batched >= FILE_CHUNK || batch.len() >= 256) && !batch.is_empty() {
            batched = 0;
            if tx.send(std::mem::take(&mut batch)).await.is_err() {
                break; // the writer failed; its error is reported below
            }
        }
        if done {
            break;
        }
    }
    drop(tx);
    let written = writer.await.map_err(|e| HttpError::Internal(format!("writer task: {e}")))?;
    if total >= TRIM_AFTER {
        trim_heap();
    }
    if let Some(e) = read_err {
        return Err(e);
    }
    written.map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            HttpError::BadRequest(format!("invalid gzip body: {e}"))
        }
        _ => HttpError::io(&e, &path),
    })?;
    finish_written(&path, metadata)
}

/// Creates or truncates the file an upload writes, with its missing parents, owned by `user`
/// (blocking).
pub(crate) fn open_for_write(p: &Path, user: &User) -> Result<std::fs::File, HttpError> {
    if p.is_dir() {
        return Err(HttpError::BadRequest(format!("path '{}' is a directory", p.display())));
    }
    if let Some(parent) = p.parent() {
        crate::fs::make_dirs_owned(parent, user).map_err(|e| HttpError::io(&e, parent))?;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)
        .map_err(|e| HttpError::io(&e, p))?;
    crate::fs::chown(p, user);
    Ok(file)
}

/// Makes `metadata` the whole metadata of a written file (a rewrite without metadata clears what
/// it had, [`crate::meta`]) and describes the file for the answer, with the metadata it now has.
/// A file system without user extended attributes keeps the file and drops the metadata, as E2B's
/// envd does; a full one answers 507.
pub(crate) fn finish_written(
    path: &Path,
    metadata: &HashMap<String, String>,
) -> Result<Written, HttpError> {
    match crate::meta::replace(path, metadata) {
        Ok(()) => {}
        Err(e) if crate::meta::unsupported(&e) => {
            tracing::warn!(path = %path.display(), error = %e, "no extended attributes here; metadata not kept");
        }
        Err(e)
            if e.kind() == std::io::ErrorKind::StorageFull
                || e.kind() == std::io::ErrorKind::QuotaExceeded =>
        {
            return Err(HttpError::NoSpace(format!(
                "not enough space for the metadata of '{}'",
                path.display()
            )));
        }
        Err(e) => return Err(HttpError::io(&e, path)),
    }
    Ok(Written {
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        path: path.to_string_lossy().into_owned(),
        r#type: "file",
        metadata: crate::meta::read(path),
    })
}

/// The checks of an octet-stream `POST /files` that come before its body: auth, user, metadata
/// and the target path. Gives the path, user and metadata.
pub(crate) fn check_octet_upload(
    state: &AppState,
    headers: &HeaderMap,
    q: &FilesQuery,
) -> Result<(PathBuf, User, HashMap<String, String>), HttpError> {
    check_files_auth(state, headers, q, "write")?;
    let user = files_user(state, q)?;
    let metadata = metadata_headers(headers)?;
    let target = q
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| HttpError::BadRequest("the path query parameter is required".into()))?;
    let path = resolve_file(state, &user, &target)?;
    Ok((path, user, metadata))
}

/// `POST /files`: multipart (`file` parts) or octet-stream.
pub async fn post_file(State(state): State<AppState>, req: Request) -> Result<Response, HttpError> {
    let q = parse_files_query(req.uri().query());
    check_files_auth(&state, req.headers(), &q, "write")?;
    let user = files_user(&state, &q)?;
    let metadata = metadata_headers(req.headers())?;
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let gzip = match req.headers().get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        None => false,
        Some(e) if e.eq_ignore_ascii_case("identity") => false,
        Some(e) if e.eq_ignore_ascii_case("gzip") || e.eq_ignore_ascii_case("x-gzip") => true,
        Some(e) => {
            return Err(HttpError::BadRequest(format!("unsupported content encoding '{e}'")));
        }
    };
    let body_err =
        |e: axum::Error| HttpError::BadRequest(format!("failed to read request body: {e}"));
    let mut written = Vec::new();
    if mime == "multipart/form-data" {
        let boundary = multer::parse_boundary(&ct)
            .map_err(|e| HttpError::BadRequest(format!("bad multipart: {e}")))?;
        let mut mp = multer::Multipart::new(req.into_body().into_data_stream(), boundary);
        let mut seen = std::collections::HashSet::new();
        loop {
            let field = match mp.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Err(HttpError::BadRequest(format!("bad multipart body: {e}"))),
            };
            if field.name() != Some("file") {
                continue;
            }
            let target = match (&q.path, field.file_name()) {
                (Some(p), _) if !p.is_empty() => p.clone(),
                (_, Some(f)) if !f.is_empty() => f.to_owned(),
                _ => {
                    return Err(HttpError::BadRequest(
                        "a file part needs a path or a filename".into(),
                    ));
                }
            };
            let path = resolve_file(&state, &user, &target)?;
            if !seen.insert(path.clone()) {
                return Err(HttpError::BadRequest(format!(
                    "path '{}' is given more than once",
                    path.display()
                )));
            }
            let chunks = field
                .map(|c| c.map_err(|e| HttpError::BadRequest(format!("bad multipart body: {e}"))));
            written.push(write_file(path, user.clone(), gzip, &metadata, chunks).await?);
        }
        if written.is_empty() {
            return Err(HttpError::BadRequest("no file part in the multipart body".into()));
        }
    } else if mime == "application/octet-stream" {
        let target =
            q.path.clone().filter(|p| !p.is_empty()).ok_or_else(|| {
                HttpError::BadRequest("the path query parameter is required".into())
            })?;
        let path = resolve_file(&state, &user, &target)?;
        let chunks = req.into_body().into_data_stream().map(move |c| c.map_err(body_err));
        written.push(write_file(path, user, gzip, &metadata, chunks).await?);
    } else {
        return Err(HttpError::BadRequest(format!(
            "unsupported content type '{mime}'; use multipart/form-data or application/octet-stream"
        )));
    }
    Ok(json_response(StatusCode::OK, &serde_json::json!(written)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding_keeps_plus_in_signatures() {
        let q = parse_files_query(Some(
            "path=%2Ftmp%2Fa+b&username=root&signature=v1_a+b%2Bc&signature_expiration=9",
        ));
        assert_eq!(q.path.as_deref(), Some("/tmp/a b"));
        assert_eq!(q.username.as_deref(), Some("root"));
        assert_eq!(q.signature.as_deref(), Some("v1_a+b+c"));
        assert_eq!(q.signature_expiration.as_deref(), Some("9"));
        assert_eq!(parse_files_query(Some("path=%zz%2")).path.as_deref(), Some("%zz%2"));
    }

    #[test]
    fn signature_matches_the_sdk_formula() {
        // sha256("/tmp/a:read::tok") in standard base64 without padding.
        let s = file_signature("/tmp/a", "read", "", "tok", None);
        let digest = sha2::Sha256::digest(b"/tmp/a:read::tok");
        assert_eq!(
            s,
            format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
        );
        assert_ne!(s, file_signature("/tmp/a", "read", "", "tok", Some("1")));
    }

    #[test]
    fn ranges_resolve_like_rfc_9110() {
        use RangeRequest::{Part, Unsatisfiable, Whole};
        assert_eq!(parse_range("bytes=0-0", 10), Part { start: 0, end: 0 });
        assert_eq!(parse_range("bytes=2-", 10), Part { start: 2, end: 9 });
        assert_eq!(parse_range(" Bytes = 3 - 4 ", 10), Part { start: 3, end: 4 });
        assert_eq!(parse_range("bytes=-3", 10), Part { start: 7, end: 9 });
        assert_eq!(parse_range("bytes=-30", 10), Part { start: 0, end: 9 });
        assert_eq!(parse_range("bytes=5-100", 10), Part { start: 5, end: 9 });
        assert_eq!(parse_range("bytes=10-", 10), Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 10), Unsatisfiable);
        assert_eq!(parse_range("bytes=-1", 0), Unsatisfiable);
        assert_eq!(parse_range("bytes=0-", 0), Unsatisfiable);
        for v in
            ["", "bytes", "bytes=", "bytes=-", "bytes=a-1", "bytes=3-1", "bytes=+1-2", "lines=1-2"]
        {
            assert_eq!(parse_range(v, 10), Whole, "{v}");
        }
        assert_eq!(parse_range("bytes=0-1,3-4", 10), Whole);
    }
}
