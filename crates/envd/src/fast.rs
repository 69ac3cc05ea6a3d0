//! The zero-copy path of large `/files` transfers over HTTP/1.1, in front of hyper.
//!
//! Every accepted connection starts here: its request heads are read and parsed (`httparse`), and
//! two kinds of request are served directly between the socket and the file:
//!
//! - an octet-stream `POST /files` with a `Content-Length` (how the SDKs upload large files): the
//!   body goes socket → pipe → file with `splice(2)`, so it is never copied into the daemon;
//! - a plain `GET /files` (no `Range`, no gzip): the file is mapped into memory a window at a
//!   time and written to the socket from a blocking thread, so the kernel copies the page cache
//!   straight into the socket (see [`send_file`] for why not `sendfile(2)`).
//!
//! The control plane's `POST /init` (one per claim, with a small body that arrives with its head)
//! is answered here too, by the router's own handler (its refusals included): it then costs no
//! handover to hyper, and the connection stays on this path for the `/files` requests that may
//! follow on it.
//!
//! Everything else (every other request, HTTP/2, chunked or gzipped bodies, ranges, `Expect`,
//! `Connection` options) goes to hyper and the axum router with the bytes already read, and hyper
//! keeps the connection from then on. So the router stays the one place where every endpoint is
//! defined, and where every error is answered: a fast-path request whose checks (auth, user, path,
//! opening the file) fail is handed to hyper as it came, nothing of its body read, and gets the
//! answer it always got. Only what happens after the checks passed is answered here (the success,
//! and failures while the bytes move), with the same status, headers and JSON as the router's.
//!
//! # Invariants
//!
//! - A request is served here only if the router would have served it the same way: the checks
//!   are the router's own functions ([`crate::http`]), and any doubt hands it over.
//! - Bytes read from a connection are either consumed by a request served here or handed to hyper
//!   in order, before anything else of the socket.
//! - The socket and file work runs on blocking threads (a slow disk or client never stalls the
//!   runtime thread), each with its own duplicate of the socket's descriptor.

use crate::http::{self as files, HttpError};
use crate::state::AppState;
use axum::response::{IntoResponse as _, Response};
use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body_util::BodyExt as _;
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, AsRawFd as _, OwnedFd};
use rustix::io::Errno;
use rustix::pipe::SpliceFlags;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// Longest request head served here; longer ones go to hyper (which has its own limit).
const MAX_HEAD: usize = 16 * 1024;
/// Most header lines of a request served here.
const MAX_HEADERS: usize = 64;
/// Size asked for the pipe of a spliced upload (the kernel's default limit for it is 1 MiB).
const PIPE_SIZE: usize = 1 << 20;
/// Buffer of a download.
const FILE_BUF: usize = 1 << 20;
/// A transfer whose peer neither sends nor takes a byte for this long is given up.
const STALL_TIMEOUT: Duration = Duration::from_secs(300);

/// A connection handed to hyper: the bytes already read from it, then the socket.
pub struct Prefixed {
    prefix: Bytes,
    io: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The connections handed to hyper, as a listener for `axum::serve`.
pub struct Handoff {
    rx: mpsc::Receiver<(Prefixed, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for Handoff {
    type Io = Prefixed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Prefixed, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept loop is gone (shut down): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Serves `router` on `listener` with the fast path in front, until `stop` turns true; then waits
/// for the requests in progress (of hyper and of the fast path) to end.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    router: axum::Router,
    stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    let (to_hyper, rx) = mpsc::channel(64);
    // Fast-path connections hold a receiver each; `closed` resolves when all are gone.
    let (done_tx, done_rx) = watch::channel(());
    let mut hyper_stop = stop.clone();
    let hyper = axum::serve(Handoff { rx, local }, router).with_graceful_shutdown(async move {
        stopped(&mut hyper_stop).await;
    });
    let accept = accept(listener, state, to_hyper, stop, done_rx);
    let (served, ()) = tokio::join!(hyper.into_future(), accept);
    done_tx.closed().await;
    served
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Accepts connections until `stop`, each served by [`connection`] on its own task.
async fn accept(
    listener: TcpListener,
    state: AppState,
    to_hyper: mpsc::Sender<(Prefixed, SocketAddr)>,
    mut stop: watch::Receiver<bool>,
    done: watch::Receiver<()>,
) {
    loop {
        let (tcp, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // As axum's accept loop: errors of one connection are skipped, others (e.g.
                    // too many open files) are waited out.
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) {
                        tracing::error!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            () = stopped(&mut stop) => return,
        };
        // Small envelopes must leave at once: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY failed");
        }
        let conn = connection(tcp, addr, state.clone(), to_hyper.clone(), stop.clone());
        let done = done.clone();
        tokio::spawn(async move {
            conn.await;
            drop(done);
        });
    }
}

/// What became of a request read by [`connection`].
enum Outcome {
    /// Answered here; the connection can carry the next request.
    Served,
    /// Answered here (or not answerable), and the connection must close.
    Close,
    /// Not for the fast path: hyper gets the connection.
    NotOurs,
}

/// Serves the requests of one connection here while they are fast-path ones, then hands it over.
async fn connection(
    mut tcp: TcpStream,
    addr: SocketAddr,
    state: AppState,
    to_hyper: mpsc::Sender<(Prefixed, SocketAddr)>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let head = tokio::select! {
            h = read_head(&mut tcp, &mut buf) => h,
            // Between requests, a shutdown closes the connection (hyper does the same).
            () = stopped(&mut stop), if buf.is_empty() => return,
        };
        let head_len = match head {
            Ok(Head::Complete(n)) => n,
            Ok(Head::Other) => break,
            Ok(Head::Closed) | Err(_) => return,
        };
        match request(&mut tcp, &mut buf, head_len, &state).await {
            Outcome::Served => {}
            Outcome::Close => return,
            Outcome::NotOurs => break,
        }
    }
    let _ = to_hyper.send((Prefixed { prefix: buf.freeze(), io: tcp }, addr)).await;
}

/// What [`read_head`] found at the start of `buf`.
enum Head {
    /// A complete HTTP/1.x request head of this many bytes.
    Complete(usize),
    /// Something else (not HTTP/1, too long, cut off): for hyper.
    Other,
    /// The peer closed the connection before sending anything.
    Closed,
}

/// Reads into `buf` until it starts with a complete request head.
async fn read_head(tcp: &mut TcpStream, buf: &mut BytesMut) -> io::Result<Head> {
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            match httparse::Request::new(&mut headers).parse(buf) {
                Ok(httparse::Status::Complete(n)) => return Ok(Head::Complete(n)),
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
                _ => return Ok(Head::Other),
            }
        }
        buf.reserve(4096);
        if tcp.read_buf(buf).await? == 0 {
            return Ok(if buf.is_empty() { Head::Closed } else { Head::Other });
        }
    }
}

/// Serves the request whose head is the first `head_len` bytes of `buf` if it is a fast-path
/// one; its bytes are then removed from `buf`.
async fn request(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    head_len: usize,
    state: &AppState,
) -> Outcome {
    let Some(head) = classify(buf) else { return Outcome::NotOurs };
    match head.route {
        Route::Init => init_request(tcp, buf, head_len, head.body_len, state, head.map).await,
        Route::Upload => upload(tcp, buf, head_len, head.body_len, state, &head.map, &head.q).await,
        Route::Download => {
            download(tcp, buf, head_len, state, &head.map, head.query.as_deref()).await
        }
    }
}

/// Which fast-path request a head is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `POST /init`.
    Init,
    /// `POST /files`.
    Upload,
    /// `GET /files` without a body.
    Download,
}

/// A request head the fast path may serve, as its handlers take it.
#[derive(Debug)]
struct Classified {
    route: Route,
    q: files::FilesQuery,
    /// The raw query string.
    query: Option<String>,
    map: HeaderMap,
    body_len: u64,
}

/// Reads the request head at the start of `buf`: `None` when it is not one the fast path
/// serves (a head that does not parse, another method or path, or options it does not
/// implement), which then goes to hyper as it came.
fn classify(buf: &[u8]) -> Option<Classified> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(buf), Ok(httparse::Status::Complete(_))) || req.version != Some(1) {
        return None;
    }
    let (Some(method), Some(target)) = (req.method, req.path) else { return None };
    let (path, query) = target.split_once('?').map_or((target, None), |(p, q)| (p, Some(q)));
    let route = match (method, path) {
        ("POST", "/init") => Route::Init,
        ("POST", "/files") => Route::Upload,
        ("GET", "/files") => Route::Download,
        _ => return None,
    };
    let q = files::parse_files_query(query);
    let query = query.map(str::to_owned);
    let mut map = HeaderMap::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let (Ok(k), Ok(v)) =
            (HeaderName::from_bytes(h.name.as_bytes()), HeaderValue::from_bytes(h.value))
        else {
            return None;
        };
        map.append(k, v);
    }
    // Requests with options the fast path does not implement go to hyper.
    let connection_ok = map
        .get_all(header::CONNECTION)
        .iter()
        .all(|v| v.to_str().is_ok_and(|v| v.trim().eq_ignore_ascii_case("keep-alive")));
    if !connection_ok
        || map.contains_key(header::TRANSFER_ENCODING)
        || map.contains_key(header::EXPECT)
        || map.contains_key(header::UPGRADE)
    {
        return None;
    }
    let body_len = content_length(&map)?;
    if route == Route::Download && body_len != 0 {
        return None;
    }
    Some(Classified { route, q, query, map, body_len })
}

/// The fuzz target's check of [`classify`] (the `fuzzing` feature): any bytes are either
/// handed over or read into a request whose length and options are the head's own.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_classify(buf: &[u8]) {
    let Some(head) = classify(buf) else { return };
    let announced = head.map.get(header::CONTENT_LENGTH);
    if let Some(value) = announced {
        let text = value.to_str().map(str::trim);
        assert_eq!(text.ok().and_then(|t| t.parse::<u64>().ok()), Some(head.body_len));
    } else {
        assert_eq!(head.body_len, 0);
    }
    assert!(!head.map.contains_key(header::TRANSFER_ENCODING));
    if head.route == Route::Download {
        assert_eq!(head.body_len, 0);
        let _ = files::accepts_gzip(&head.map);
    }
    let _ = (head.q, head.query);
}

/// `POST /init` (the control plane's, once per claim), when its whole body has arrived with
/// its head: the router's own handler, answered here, so the connection stays on this path
/// (a connection the control plane opened ahead of the claim can go on to carry `/files`) and
/// the request skips the handover to hyper. A body still on its way, or larger than
/// [`MAX_HEAD`], goes to hyper with the connection.
async fn init_request(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    head_len: usize,
    body_len: u64,
    state: &AppState,
    map: HeaderMap,
) -> Outcome {
    let Some(end) = usize::try_from(body_len)
        .ok()
        .filter(|&len| len <= MAX_HEAD)
        .and_then(|len| head_len.checked_add(len))
        .filter(|&end| end <= buf.len())
    else {
        return Outcome::NotOurs;
    };
    let body = buf.split_to(end).split_off(head_len).freeze();
    let response = match files::init(axum::extract::State(state.clone()), map, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    answer(tcp, response, false).await
}

/// The request's body length: 0 without `Content-Length`, `None` if it is not one valid number.
fn content_length(map: &HeaderMap) -> Option<u64> {
    let mut values = map.get_all(header::CONTENT_LENGTH).iter();
    let Some(v) = values.next() else { return Some(0) };
    if values.next().is_some() {
        return None;
    }
    let v = v.to_str().ok()?.trim();
    if v.is_empty() || !v.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// An octet-stream `POST /files` with a known length: the checks, then the body spliced into the
/// file.
async fn upload(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    head_len: usize,
    len: u64,
    state: &AppState,
    map: &HeaderMap,
    q: &files::FilesQuery,
) -> Outcome {
    let mime = map
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase());
    let identity = match map.get(header::CONTENT_ENCODING) {
        None => true,
        Some(e) => e.to_str().is_ok_and(|e| e.eq_ignore_ascii_case("identity")),
    };
    if mime.as_deref() != Some("application/octet-stream") || !identity {
        return Outcome::NotOurs;
    }
    let Ok((path, user, metadata)) = files::check_octet_upload(state, map, q) else {
        return Outcome::NotOurs;
    };
    let p = path.clone();
    let Ok(file) = files::blocking(move || files::open_for_write(&p, &user)).await else {
        return Outcome::NotOurs;
    };
    // From here the request is ours: its head leaves the buffer, the body bytes already read go
    // to the file first, and what follows this body (a pipelined request) stays.
    buf.advance(head_len);
    let first = buf.split_to(buf.len().min(usize::try_from(len).unwrap_or(usize::MAX))).freeze();
    let sock = match dup(tcp) {
        Ok(s) => s,
        Err(e) => {
            let e = HttpError::Internal(format!("duplicating the socket: {e}"));
            return answer(tcp, e.into_response(), true).await;
        }
    };
    let rest = len - first.len() as u64;
    let copied = tokio::task::spawn_blocking(move || splice_body(&sock, &file, &first, rest))
        .await
        .unwrap_or_else(|e| Err(Moved::Write(io::Error::other(e))));
    let response = match copied {
        Ok(()) => match files::finish_written(&path, &metadata) {
            Ok(written) => files::json_response(StatusCode::OK, &serde_json::json!([written])),
            Err(e) => e.into_response(),
        },
        Err(Moved::Read(e)) => {
            HttpError::BadRequest(format!("failed to read request body: {e}")).into_response()
        }
        Err(Moved::Write(e)) => HttpError::io(&e, &path).into_response(),
    };
    // After a failure part of the body may still be on its way: the connection cannot go on.
    let close = response.status() != StatusCode::OK;
    answer(tcp, response, close).await
}

/// A failure while moving a body, by side.
enum Moved {
    /// Reading the socket (the client went away, stalled or sent less than announced).
    Read(io::Error),
    /// Writing the file.
    Write(io::Error),
}

/// Writes `first`, then `rest` more bytes of the socket, into `file` (blocking), in blocks
/// reserved first (see [`reserve`]); what a failed upload did not use is given back.
fn splice_body(sock: &OwnedFd, file: &std::fs::File, first: &[u8], rest: u64) -> Result<(), Moved> {
    reserve(file, first.len() as u64 + rest).map_err(Moved::Write)?;
    let moved = splice_reserved(sock, file, first, rest);
    if moved.is_err() {
        // KEEP_SIZE blocks past the end of the file stay allocated until a truncation.
        if let Ok(meta) = file.metadata() {
            let _ = file.set_len(meta.len());
        }
    }
    moved
}

/// Reserves `len` bytes of blocks for the (empty) file before its body arrives. A full disk
/// is then answered (507) at once instead of after the client has sent most of the body, and the
/// writes go into allocated blocks, which spares ext4 its per-page delayed allocation: ~12 % of
/// the daemon's CPU per MB. `KEEP_SIZE`: the size still grows only with what is written. A file
/// system without `fallocate` is written without the reservation.
fn reserve(file: &std::fs::File, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len) {
        Err(e @ (Errno::NOSPC | Errno::DQUOT | Errno::FBIG)) => Err(e.into()),
        _ => Ok(()),
    }
}

/// [`splice_body`] after the reservation.
fn splice_reserved(
    sock: &OwnedFd,
    file: &std::fs::File,
    first: &[u8],
    rest: u64,
) -> Result<(), Moved> {
    (&*file).write_all(first).map_err(Moved::Write)?;
    if rest == 0 {
        return Ok(());
    }
    let (pipe_r, pipe_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Moved::Write(e.into()))?;
    let _ = rustix::pipe::fcntl_setpipe_size(&pipe_w, PIPE_SIZE);
    let mut left = rest;
    let mut lowat = 1;
    // Set after a wait for the low mark timed out: the next wait is for any byte, so that a
    // client slower than the mark is still served (and only one that sends nothing stalls).
    let mut below_mark = false;
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(PIPE_SIZE).min(PIPE_SIZE);
        let n = match rustix::pipe::splice(
            sock,
            None,
            &pipe_w,
            None,
            want,
            SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
        ) {
            Ok(0) => {
                return Err(Moved::Read(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed before the end of the body",
                )));
            }
            Ok(n) => {
                below_mark = false;
                n
            }
            Err(Errno::AGAIN) => {
                let mark = if below_mark { 1 } else { want.min(LOWAT) };
                if mark != lowat {
                    lowat = mark;
                    set_rcvlowat(sock, lowat);
                }
                if lowat == 1 {
                    wait_for(sock, PollFlags::IN).map_err(Moved::Read)?;
                } else if !wait_within(sock, PollFlags::IN, LOWAT_WAIT).map_err(Moved::Read)? {
                    below_mark = true;
                }
                continue;
            }
            Err(Errno::INTR) => continue,
            Err(Errno::INVAL) if left == rest => {
                // No splice for this socket (not expected for TCP): copy through a buffer.
                return copy_body(sock, file, left);
            }
            Err(e) => return Err(Moved::Read(e.into())),
        };
        let mut in_pipe = n;
        while in_pipe > 0 {
            match rustix::pipe::splice(&pipe_r, None, file, None, in_pipe, SpliceFlags::MOVE) {
                Ok(0) => return Err(Moved::Write(io::ErrorKind::WriteZero.into())),
                Ok(k) => in_pipe -= k,
                Err(Errno::INTR) => {}
                Err(Errno::INVAL) => {
                    // The file system takes no splice: what is in the pipe, then the rest, by copy.
                    let mut pending = vec![0u8; in_pipe];
                    rustix::io::read(&pipe_r, &mut pending).map_err(|e| Moved::Write(e.into()))?;
                    (&*file).write_all(&pending).map_err(Moved::Write)?;
                    return copy_body(sock, file, left - n as u64);
                }
                Err(e) => return Err(Moved::Write(e.into())),
            }
        }
        left -= n as u64;
    }
    if lowat != 1 {
        // The connection goes on serving requests, which are read as soon as any byte is in.
        set_rcvlowat(sock, 1);
    }
    Ok(())
}

/// While a spliced upload waits for the socket, it is woken only when this much of the body
/// (or all that is left of it) has arrived: fewer, larger splices (~10 % less CPU per MB).
const LOWAT: usize = 256 * 1024;
/// How long a wait for [`LOWAT`] bytes lasts before the upload takes what has arrived.
const LOWAT_WAIT: Duration = Duration::from_millis(100);

/// Sets the socket's `SO_RCVLOWAT`. Best effort: without it, the loop only wakes more often.
fn set_rcvlowat(sock: &OwnedFd, bytes: usize) {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt reads an int of the size given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Copies `left` bytes of the (non-blocking) socket into `file` through a buffer (blocking).
fn copy_body(sock: &OwnedFd, file: &std::fs::File, mut left: u64) -> Result<(), Moved> {
    let mut buf = vec![0u8; 256 * 1024];
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(buf.len()).min(buf.len());
        match rustix::io::read(sock, &mut buf[..want]) {
            Ok(0) => {
                return Err(Moved::Read(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed before the end of the body",
                )));
            }
            Ok(n) => {
                (&*file).write_all(&buf[..n]).map_err(Moved::Write)?;
                left -= n as u64;
            }
            Err(Errno::AGAIN) => wait_for(sock, PollFlags::IN).map_err(Moved::Read)?,
            Err(Errno::INTR) => {}
            Err(e) => return Err(Moved::Read(e.into())),
        }
    }
    Ok(())
}

/// A plain `GET /files`: the checks, then the head and `sendfile` of the whole file.
async fn download(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    head_len: usize,
    state: &AppState,
    map: &HeaderMap,
    query: Option<&str>,
) -> Outcome {
    if map.contains_key(header::RANGE) {
        return Outcome::NotOurs;
    }
    let Ok(gzip_accepted) = files::accepts_gzip(map) else {
        return Outcome::NotOurs;
    };
    let Ok((path, file, size)) = files::open_for_read(state, map, query).await else {
        return Outcome::NotOurs;
    };
    // A file worth gzipping goes to the router, which compresses; the rest is sent as it is.
    let file = if gzip_accepted {
        match files::blocking(move || Ok((files::gzip_pays(&file, size), file))).await {
            Ok((false, file)) => file,
            _ => return Outcome::NotOurs,
        }
    } else {
        file
    };
    buf.advance(head_len);
    let mut head = HeaderMap::new();
    files::file_headers(&mut head, &path, size, false);
    if write_head(tcp, StatusCode::OK, &head, None, false).await.is_err() {
        return Outcome::Close;
    }
    let sock = match dup(tcp) {
        Ok(s) => s,
        Err(_) => return Outcome::Close,
    };
    let sent = tokio::task::spawn_blocking(move || send_file(&sock, &file, size))
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
    match sent {
        Ok(()) => Outcome::Served,
        Err(e) => {
            // The head promised `size` bytes: all that can be done is to close.
            tracing::debug!(path = %path.display(), error = %e, "download cut short");
            Outcome::Close
        }
    }
}

/// Sends `len` bytes of `file` from its start to the (non-blocking) socket (blocking), from
/// windows of the file mapped into memory: the kernel copies the page cache straight into the
/// socket, one copy fewer than reading into a buffer (−30 % of the daemon's CPU per MB, measured
/// with `cargo bench -p oka-envd`). A file that cannot be mapped (as some of `/sys`) is read
/// through a buffer instead. Neither `sendfile(2)` nor a splice file → pipe → socket is used:
/// both are slower on loopback than a copy (1500–1780 against 1720–2500 MB/s), as the many
/// page-sized fragments of their packets cost the receiver more than the copy they save here.
fn send_file(sock: &OwnedFd, file: &std::fs::File, len: u64) -> io::Result<()> {
    let mut sent = 0;
    while sent < len {
        let n = usize::try_from((len - sent).min(MAP_WINDOW)).unwrap_or(usize::MAX);
        match Mapped::new(file, sent, n) {
            Ok(window) => window.send(sock)?,
            Err(_) => return send_copied(sock, file, sent, len),
        }
        sent += n as u64;
    }
    Ok(())
}

/// The part of a file [`send_file`] maps at a time (8 MiB: larger windows were no faster).
const MAP_WINDOW: u64 = 8 << 20;

/// A read-only shared mapping of part of a file, unmapped on drop. Only the kernel reads it
/// (through `write`), never this process: a file cut short under the mapping makes that `write`
/// fail with `EFAULT`, where a read of the mapping here would raise `SIGBUS`. No Rust reference
/// to it is made either, since another process may change the bytes at any time.
struct Mapped {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl Mapped {
    fn new(file: &std::fs::File, offset: u64, len: usize) -> io::Result<Self> {
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh mapping at an address of the kernel's choice, aliasing nothing.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                file,
                offset,
            )
        }?;
        Ok(Self { ptr, len })
    }

    /// Writes the whole window to the (non-blocking) socket (blocking).
    fn send(&self, sock: &OwnedFd) -> io::Result<()> {
        // SAFETY: the mapping covers `len` bytes from `ptr` and lives as long as `self`.
        unsafe { write_range(sock, self.ptr.cast(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; nothing refers to it any more.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr, self.len) } {
            tracing::warn!(error = %e, "munmap of a download window failed");
        }
    }
}

/// [`send_file`] for a file that cannot be mapped: bytes `from..len` through a buffer.
fn send_copied(sock: &OwnedFd, file: &std::fs::File, from: u64, len: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; FILE_BUF];
    let mut sent = from;
    while sent < len {
        let want = usize::try_from(len - sent).unwrap_or(usize::MAX).min(buf.len());
        let n = file.read_at(&mut buf[..want], sent)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file got shorter"));
        }
        write_socket(sock, &buf[..n])?;
        sent += n as u64;
    }
    Ok(())
}

/// Writes all of `data` to the (non-blocking) socket (blocking).
fn write_socket(sock: &OwnedFd, data: &[u8]) -> io::Result<()> {
    // SAFETY: a slice is readable for its whole length while it is borrowed.
    unsafe { write_range(sock, data.as_ptr(), data.len()) }
}

/// Writes the `len` bytes at `ptr` to the (non-blocking) socket (blocking). Only the kernel reads
/// them: a page of a mapped file cut short makes `write` fail with `EFAULT`, reported as
/// `UnexpectedEof` ("the file got shorter"), where a read here would raise `SIGBUS`.
///
/// # Safety
///
/// `ptr..ptr + len` is mapped for the whole call.
unsafe fn write_range(sock: &OwnedFd, ptr: *const u8, len: usize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: `ptr + done` lies inside the range the caller vouches for.
        let n = unsafe { libc::write(sock.as_raw_fd(), ptr.add(done).cast(), len - done) };
        if n >= 0 {
            done += n.unsigned_abs();
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) => wait_for(sock, PollFlags::OUT)?,
            Some(libc::EINTR) => {}
            Some(libc::EFAULT) => {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file got shorter"));
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// Waits until the socket is ready for `flags`, at most [`STALL_TIMEOUT`].
fn wait_for(sock: &OwnedFd, flags: PollFlags) -> io::Result<()> {
    if wait_within(sock, flags, STALL_TIMEOUT)? {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::TimedOut, "the peer stalled"))
    }
}

/// Waits until the socket is ready for `flags` (`true`), at most `timeout` (`false`).
fn wait_within(sock: &OwnedFd, flags: PollFlags, timeout: Duration) -> io::Result<bool> {
    let timeout = rustix::time::Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    loop {
        let mut fds = [PollFd::new(sock, flags)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Ok(false),
            // Readiness, a hang-up or an error: the next call says which.
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// A descriptor of the socket of its own, for a blocking thread.
fn dup(tcp: &TcpStream) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(tcp.as_fd(), 0)?)
}

/// Writes a response with a full body (as hyper would: `content-length` and `date` added).
async fn answer(tcp: &mut TcpStream, response: Response, close: bool) -> Outcome {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    // A 204 has neither a body nor a `Content-Length` (RFC 9110 §8.6).
    let body = (parts.status != StatusCode::NO_CONTENT).then_some((body.len(), &body[..]));
    match write_head(tcp, parts.status, &parts.headers, body, close).await {
        Ok(()) if !close => Outcome::Served,
        _ => Outcome::Close,
    }
}

/// Writes a response head (and a body, given with its length) in one write.
async fn write_head(
    tcp: &mut TcpStream,
    status: StatusCode,
    headers: &HeaderMap,
    body: Option<(usize, &[u8])>,
    close: bool,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(256 + body.map_or(0, |b| b.0));
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (k, v) in headers {
        out.extend_from_slice(k.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some((len, _)) = body {
        out.extend_from_slice(format!("content-length: {len}\r\n").as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    if let Some((_, b)) = body {
        out.extend_from_slice(b);
    }
    tcp.write_all(&out).await
}
