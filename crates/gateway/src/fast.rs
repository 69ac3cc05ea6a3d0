//! The HTTP/1.1 relay: the gateway's path for plain HTTP/1.1 requests, in front of hyper.
//!
//! Through hyper, a proxied request passes two HTTP/1 state machines (the client's connection
//! and the upstream connection, two tasks that hand the message to each other over channels),
//! and its head is parsed into a `HeaderMap` and encoded again. Here a plain request is relayed
//! in its connection's own task: the head is parsed in place (httparse) and rewritten in one
//! pass into the upstream head, bodies are relayed as they arrive with their own framing
//! (`Content-Length`, or `chunked` passed through unchanged), and upstream connections are
//! pooled as raw streams. A small request costs one read and one write on each side.
//!
//! # Expected flow, per client connection
//!
//! 1. Read a request head. Anything but a plain HTTP/1.1 request goes to hyper with the bytes
//!    already read ([`Outcome::Handoff`]), which then serves the rest of the connection as it
//!    always did: HTTP/2 (its preface does not parse as HTTP/1), HTTP/1.0, `Upgrade`
//!    (WebSocket), `Expect`, transfer codings other than `chunked`, `Connection` options other
//!    than `close` and `keep-alive`, request targets that are not a path, heads that do not
//!    parse or pass 64 KiB.
//! 2. Route, find the running sandbox (waking it when allowed) and authenticate with
//!    the same functions as the hyper path ([`proxy::sandbox_for`]); a refusal is answered here
//!    with the same status and JSON ([`Reject`]).
//! 3. Upstream: an idle pooled connection of that sandbox port and epoch, else a new one
//!    ([`proxy::dial_stream`]). The head goes out with hop-by-hop headers and a verified
//!    traffic token removed and the `/kruise/{id}/{port}` prefix of path routing stripped.
//! 4. A body that has arrived whole goes out with the head, in one write; a larger or streamed
//!    body is relayed while the response is read, so an upstream that answers early (413) is
//!    heard. Interim `1xx` responses are relayed as they come.
//! 5. The response is relayed as it arrives. Both connections are kept when their framing
//!    allows; the upstream one goes back to the pool.
//!
//! # Guarantees
//!
//! - Bytes are forwarded as they are read, in both directions: streams are never buffered.
//! - A pooled connection that fails before any byte of a response arrived is replaced by a new
//!   one and the request sent again, when its body was sent whole from memory and either
//!   nothing could be written or the method is idempotent (a keep-alive race with the
//!   sandbox's idle close is then invisible to the client).
//! - A failure before the response head went out is answered with E2B's 502 (the not-found one
//!   when the sandbox was killed meanwhile, [`gone::confirm`]); after it, the client connection
//!   is closed (a truncated body is never passed off as complete).

use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use oka_metrics::DurationHistogram;
use oka_store::Store;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::Inner;
use crate::auth::{ACCESS_TOKEN_HEADER, Credentials};
use crate::error::{Reject, TRAFFIC_TOKEN_HEADER};
use crate::gone;
use crate::idle::{ByteMeter, IdleIo};
use crate::proxy::{self, PoolKey, Pooled};
use crate::route::{Target, route_with};

/// A request head larger than this goes to hyper (which answers 431).
const MAX_HEAD: usize = 64 * 1024;
/// Headers parsed in place; more go to hyper.
const MAX_HEADERS: usize = 100;
/// A request body up to this size that has arrived with its head is sent with it, in one
/// write, and can be sent again on a fresh connection.
const SMALL_BODY: usize = 64 * 1024;
/// Free space kept in a read buffer before each read.
const READ_SPACE: usize = 16 * 1024;
/// Free space kept in a body relay's buffer before each read.
const BODY_SPACE: usize = 64 * 1024;

/// A client connection.
pub(crate) type Downstream = IdleIo<TcpStream>;

/// How the relay left a client connection.
pub(crate) enum Outcome {
    /// Done: closed by either side, failed, or shut down.
    Done,
    /// Hyper serves the rest of the connection; these bytes were read from it already.
    Handoff(Downstream, BytesMut),
}

/// An upstream connection of the relay.
pub(crate) struct RawUpstream(IdleIo<TcpStream>);

impl RawUpstream {
    /// An upstream connection closed after `idle_timeout` without traffic, counting its bytes
    /// into `meter`.
    pub(crate) fn new(
        stream: TcpStream,
        idle_timeout: std::time::Duration,
        meter: ByteMeter,
    ) -> Self {
        Self(IdleIo::metered(stream, idle_timeout, meter))
    }
}

impl Pooled for RawUpstream {
    /// A pooled connection that became readable was closed by the sandbox (or sent bytes
    /// nobody asked for). The readiness is the reactor's: no system call while it is idle.
    fn is_closed(&self) -> bool {
        let mut byte = [0u8; 1];
        !matches!(self.0.get_ref().try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn is_ready(&self) -> bool {
        true
    }
}

/// How a message's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`, up to the last chunk and the trailers.
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

/// What the relay needs of a parsed request; the upstream head is in [`Conn::out`].
#[derive(Debug)]
struct RequestHead {
    /// Bytes of the head in [`Conn::buf`].
    len: usize,
    target: Target,
    framing: Framing,
    /// The client asked to close after this request.
    close: bool,
    /// `HEAD`: the response has no body whatever its headers say.
    is_head: bool,
    /// An idempotent method: may be sent again when a pooled connection dies under it.
    idempotent: bool,
    /// The traffic token's value and where its line is in [`Conn::out`].
    token: Option<(Vec<u8>, Range<usize>)>,
    /// Where the `x-access-token` value is in [`Conn::out`].
    access_token: Option<Range<usize>>,
}

enum Parse {
    /// More bytes are needed.
    Partial,
    /// Not a request for this path: hand the connection to hyper.
    Handoff,
    Request(RequestHead),
    /// A request that names no sandbox port: answer, then skip its body (`Framing`) or close.
    Reject(Reject, usize, Framing, bool),
}

/// Buffers of one client connection, reused by each of its requests.
struct Conn {
    /// Bytes read from the client and not relayed yet.
    buf: BytesMut,
    /// The upstream request head, and a small body after it.
    out: Vec<u8>,
    /// Bytes read from upstream and not relayed yet.
    rbuf: BytesMut,
    /// The response head for the client, and the first body bytes after it.
    rout: Vec<u8>,
}

fn header_is(name: &str, lowercase: &str) -> bool {
    name.len() == lowercase.len() && name.eq_ignore_ascii_case(lowercase)
}

/// Headers that describe one hop: never forwarded. `Transfer-Encoding` is not here: bodies
/// keep their framing, so it stays true on the next hop.
fn is_hop_by_hop(name: &str) -> bool {
    const NAMES: [&str; 7] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
    ];
    NAMES.iter().any(|n| header_is(name, n)) || header_is(name, "upgrade")
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |i| i + 1);
    &bytes[start..end]
}

fn parse_length(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// Parses a request head at the start of `buf`, writing the upstream head into `out`.
fn parse_request(buf: &[u8], out: &mut Vec<u8>, domain: &str) -> Parse {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parse::Partial,
        Ok(httparse::Status::Partial) | Err(_) => return Parse::Handoff,
    };
    let (Some(method), Some(path), Some(1)) = (request.method, request.path, request.version)
    else {
        return Parse::Handoff;
    };
    if !path.starts_with('/') || method == "CONNECT" {
        return Parse::Handoff;
    }
    let mut host = None;
    let mut length = None;
    let mut chunked = false;
    let mut close = false;
    for h in request.headers.iter() {
        let name = h.name;
        if header_is(name, "host") {
            match (host, std::str::from_utf8(h.value)) {
                (None, Ok(value)) => host = Some(value),
                _ => return Parse::Handoff,
            }
        } else if header_is(name, "content-length") {
            match (length, parse_length(h.value)) {
                (None, Some(n)) => length = Some(n),
                (Some(a), Some(b)) if a == b => {}
                _ => return Parse::Handoff,
            }
        } else if header_is(name, "transfer-encoding") {
            if chunked || !trim(h.value).eq_ignore_ascii_case(b"chunked") {
                return Parse::Handoff;
            }
            chunked = true;
        } else if header_is(name, "connection") {
            for option in h.value.split(|b| *b == b',').map(trim) {
                if option.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !(option.is_empty() || option.eq_ignore_ascii_case(b"keep-alive")) {
                    return Parse::Handoff;
                }
            }
        } else if header_is(name, "upgrade") || header_is(name, "expect") {
            return Parse::Handoff;
        }
    }
    let framing = match (chunked, length) {
        (true, Some(_)) => return Parse::Handoff,
        (true, None) => Framing::Chunked,
        (false, Some(0) | None) => Framing::Empty,
        (false, Some(n)) => Framing::Length(n),
    };
    let Some(host) = host else { return Parse::Handoff };
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| header_is(h.name, name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    let target = match route_with(host, Some(path), header, domain) {
        Ok(target) => target,
        // Not a sandbox's: the gateway's own health paths are answered on hyper's path.
        Err(_) if oka_metrics::health::is_health_path(path) => return Parse::Handoff,
        Err(e) => return Parse::Reject(Reject::BadRequest(e.to_string()), len, framing, close),
    };

    out.clear();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.path.as_ref().map_or(path, |p| p.as_str()).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut token = None;
    let mut access_token = None;
    for h in request.headers.iter() {
        if is_hop_by_hop(h.name) {
            continue;
        }
        let start = out.len();
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        let value = out.len();
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
        if token.is_none() && header_is(h.name, TRAFFIC_TOKEN_HEADER) {
            token = Some((h.value.to_vec(), start..out.len()));
        } else if access_token.is_none() && header_is(h.name, ACCESS_TOKEN_HEADER) {
            access_token = Some(value..value + h.value.len());
        }
    }
    out.extend_from_slice(b"\r\n");
    Parse::Request(RequestHead {
        len,
        target,
        framing,
        close,
        is_head: method == "HEAD",
        idempotent: matches!(method, "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE"),
        token,
        access_token,
    })
}

/// What the relay needs of a parsed response; the client's head is in [`Conn::rout`].
struct ResponseHead {
    len: usize,
    /// A `1xx` response other than 101: more heads follow.
    interim: bool,
    framing: Framing,
    /// The upstream connection cannot take another request.
    upstream_closes: bool,
}

/// Why a response cannot be relayed.
#[derive(Debug)]
enum Malformed {
    Head,
    Switching,
    Chunk,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Malformed::Head => "malformed response head",
            Malformed::Switching => "101 Switching Protocols to a request without Upgrade",
            Malformed::Chunk => "malformed chunked body",
        })
    }
}

/// Parses a response head at the start of `buf` into `rout`; `None` when more bytes are
/// needed.
fn parse_response(
    buf: &[u8],
    rout: &mut Vec<u8>,
    is_head: bool,
    client_closes: bool,
) -> Result<Option<ResponseHead>, Malformed> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) | Err(_) => return Err(Malformed::Head),
    };
    // httparse takes any three digits; a status code is 100 to 999 (hyper's answer to anything
    // else is a 502 too), and a code below 100 would be written back as two digits.
    let (Some(version), Some(code @ 100..)) = (response.version, response.code) else {
        return Err(Malformed::Head);
    };
    if code == 101 {
        return Err(Malformed::Switching);
    }
    let interim = (100..200).contains(&code);
    let mut upstream_closes = version == 0;
    let mut length = None;
    let mut coding: Option<&[u8]> = None;
    let mut named = false;
    for h in response.headers.iter() {
        if header_is(h.name, "connection") {
            for option in h.value.split(|b| *b == b',').map(trim) {
                if option.eq_ignore_ascii_case(b"close") {
                    upstream_closes = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    upstream_closes &= version != 0;
                } else if !option.is_empty() {
                    named = true;
                }
            }
        } else if header_is(h.name, "content-length") {
            match (length, parse_length(h.value)) {
                (None, Some(n)) => length = Some(n),
                (Some(a), Some(b)) if a == b => {}
                _ => return Err(Malformed::Head),
            }
        } else if header_is(h.name, "transfer-encoding") {
            coding = Some(h.value);
        }
    }
    // The last coding decides: `chunked` there frames the body; any other, until close.
    let chunked = coding.map(|c| {
        c.rsplit(|b| *b == b',')
            .next()
            .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"))
    });
    let framing = if interim || is_head || code == 204 || code == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::UntilClose,
            (None, Some(0)) => Framing::Empty,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::UntilClose,
        }
    };
    let connection_values: Vec<&[u8]> = if named {
        response
            .headers
            .iter()
            .filter(|h| header_is(h.name, "connection"))
            .flat_map(|h| h.value.split(|b| *b == b','))
            .map(trim)
            .collect()
    } else {
        Vec::new()
    };
    rout.clear();
    rout.extend_from_slice(b"HTTP/1.1 ");
    rout.extend_from_slice(code.to_string().as_bytes());
    rout.push(b' ');
    rout.extend_from_slice(response.reason.unwrap_or_default().as_bytes());
    rout.extend_from_slice(b"\r\n");
    for h in response.headers.iter() {
        if is_hop_by_hop(h.name)
            || connection_values.iter().any(|v| v.eq_ignore_ascii_case(h.name.as_bytes()))
        {
            continue;
        }
        rout.extend_from_slice(h.name.as_bytes());
        rout.extend_from_slice(b": ");
        rout.extend_from_slice(h.value);
        rout.extend_from_slice(b"\r\n");
    }
    if !interim && (client_closes || framing == Framing::UntilClose) {
        rout.extend_from_slice(b"connection: close\r\n");
    }
    rout.extend_from_slice(b"\r\n");
    Ok(Some(ResponseHead { len, interim, framing, upstream_closes }))
}

/// Finds the end of a body in its bytes as they pass, without changing them.
#[derive(Debug)]
struct BodyEnd {
    framing: Framing,
    /// Bytes left of a `Content-Length` body or of the current chunk.
    left: u64,
    chunk: Chunk,
    digits: u8,
}

/// Where a chunked body's scan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    EndLf,
    Done,
}

impl BodyEnd {
    fn new(framing: Framing) -> Self {
        let left = if let Framing::Length(n) = framing { n } else { 0 };
        Self { framing, left, chunk: Chunk::Size, digits: 0 }
    }

    fn done(&self) -> bool {
        match self.framing {
            Framing::Empty => true,
            Framing::Length(_) => self.left == 0,
            Framing::Chunked => self.chunk == Chunk::Done,
            Framing::UntilClose => false,
        }
    }

    /// How many bytes at the start of `data` belong to the body.
    fn scan(&mut self, data: &[u8]) -> Result<usize, Malformed> {
        match self.framing {
            Framing::Empty => Ok(0),
            Framing::UntilClose => Ok(data.len()),
            Framing::Length(_) => {
                let n = self.left.min(data.len() as u64);
                self.left -= n;
                Ok(n as usize)
            }
            Framing::Chunked => self.scan_chunked(data),
        }
    }

    fn scan_chunked(&mut self, data: &[u8]) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < data.len() && self.chunk != Chunk::Done {
            if self.chunk == Chunk::Data {
                let n = self.left.min((data.len() - i) as u64);
                self.left -= n;
                i += n as usize;
                if self.left == 0 {
                    self.chunk = Chunk::DataCr;
                }
                continue;
            }
            let b = data[i];
            i += 1;
            self.chunk = match (self.chunk, b) {
                (Chunk::Size, _) if b.is_ascii_hexdigit() => {
                    if self.digits == 15 {
                        return Err(Malformed::Chunk);
                    }
                    self.digits += 1;
                    let digit = (b as char).to_digit(16).unwrap_or_default();
                    self.left = self.left << 4 | u64::from(digit);
                    Chunk::Size
                }
                (Chunk::Size, b';' | b' ' | b'\t') if self.digits > 0 => Chunk::Extension,
                (Chunk::Size, b'\r') if self.digits > 0 => Chunk::SizeLf,
                (Chunk::Extension, b'\r') => Chunk::SizeLf,
                (Chunk::Extension, b'\n') => return Err(Malformed::Chunk),
                (Chunk::Extension, _) => Chunk::Extension,
                (Chunk::SizeLf, b'\n') => {
                    self.digits = 0;
                    if self.left == 0 { Chunk::TrailerStart } else { Chunk::Data }
                }
                (Chunk::DataCr, b'\r') => Chunk::DataLf,
                (Chunk::DataLf, b'\n') => Chunk::Size,
                (Chunk::TrailerStart, b'\r') => Chunk::EndLf,
                (Chunk::TrailerStart | Chunk::TrailerLine, b'\n') => Chunk::TrailerStart,
                (Chunk::TrailerStart | Chunk::TrailerLine, _) => Chunk::TrailerLine,
                (Chunk::EndLf, b'\n') => Chunk::Done,
                _ => return Err(Malformed::Chunk),
            };
        }
        Ok(i)
    }
}

/// Which side of a relay failed.
#[derive(Debug)]
enum BodyError {
    Read(io::Error),
    Write(io::Error),
    Malformed(Malformed),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Read(e) => write!(f, "reading the body: {e}"),
            BodyError::Write(e) => write!(f, "writing the body: {e}"),
            BodyError::Malformed(e) => e.fmt(f),
        }
    }
}

fn make_room(buf: &mut BytesMut, space: usize) {
    if buf.capacity() - buf.len() < space / 2 {
        buf.reserve(space);
    }
}

/// Relays a body of `framing`: first `head` (sent with the body bytes already in `buf`, in
/// one write), then the rest as it is read from `from`. Bytes after the body stay in `buf`.
async fn relay_body<R, W>(
    framing: Framing,
    head: &mut Vec<u8>,
    buf: &mut BytesMut,
    from: &mut R,
    to: &mut W,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut end = BodyEnd::new(framing);
    let n = end.scan(buf).map_err(BodyError::Malformed)?;
    head.extend_from_slice(&buf[..n]);
    buf.advance(n);
    if !head.is_empty() {
        to.write_all(head).await.map_err(BodyError::Write)?;
    }
    while !end.done() {
        make_room(buf, BODY_SPACE);
        if from.read_buf(buf).await.map_err(BodyError::Read)? == 0 {
            if framing == Framing::UntilClose {
                break;
            }
            return Err(BodyError::Read(io::ErrorKind::UnexpectedEof.into()));
        }
        let n = end.scan(buf).map_err(BodyError::Malformed)?;
        to.write_all(&buf[..n]).await.map_err(BodyError::Write)?;
        buf.advance(n);
    }
    Ok(())
}

/// How an exchange ended well: which connections may serve another request.
struct Kept {
    upstream: bool,
    client: bool,
}

/// How an exchange failed.
enum Failed {
    /// Before any response byte came, on a connection that may be replaced for another try:
    /// `sent` when the request may have reached the sandbox.
    Retry { error: io::Error, sent: bool },
    /// Before the response head went to the client: answer 502.
    Upstream(String),
    /// After: close the client connection.
    Client,
}

/// Reads response heads from `up`, relaying interim ones, then relays the final response
/// and its body to `down`. The time from `sent` (the request head written) to the first byte
/// read goes into `first_byte`.
async fn relay_response<U, D>(
    rbuf: &mut BytesMut,
    rout: &mut Vec<u8>,
    up: &mut U,
    down: &mut D,
    request: &RequestHead,
    (first_byte, sent): (&DurationHistogram, std::time::Instant),
) -> Result<Kept, Failed>
where
    U: AsyncRead + Unpin,
    D: AsyncWrite + Unpin,
{
    let mut received = false;
    loop {
        let head = loop {
            if !rbuf.is_empty() {
                match parse_response(rbuf, rout, request.is_head, request.close) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(e) => return Err(Failed::Upstream(e.to_string())),
                }
            }
            make_room(rbuf, READ_SPACE);
            match up.read_buf(rbuf).await {
                Ok(0) if !received => {
                    return Err(Failed::Retry {
                        error: io::ErrorKind::UnexpectedEof.into(),
                        sent: true,
                    });
                }
                Ok(0) => return Err(Failed::Upstream("the sandbox closed the connection".into())),
                Ok(_) => {
                    if !received {
                        first_byte.observe(sent.elapsed());
                    }
                    received = true;
                }
                Err(error) if !received => return Err(Failed::Retry { error, sent: true }),
                Err(error) => return Err(Failed::Upstream(error.to_string())),
            }
        };
        rbuf.advance(head.len);
        if head.interim {
            down.write_all(rout).await.map_err(|_| Failed::Client)?;
            continue;
        }
        return match relay_body(head.framing, rout, rbuf, up, down).await {
            Ok(()) => Ok(Kept {
                upstream: !head.upstream_closes
                    && head.framing != Framing::UntilClose
                    && rbuf.is_empty(),
                client: !request.close && head.framing != Framing::UntilClose,
            }),
            Err(error) => {
                tracing::debug!(%error, "response relay ended early");
                Err(Failed::Client)
            }
        };
    }
}

/// Reads what a client sends while its response is on its way, until it closes or fails (then
/// it has given up on the request), keeping the bytes (a pipelined request) in `buf`. Past
/// [`MAX_HEAD`] of them it stops reading, and so watching, until the response is done.
async fn client_gone<R: AsyncRead + Unpin>(from: &mut R, buf: &mut BytesMut) {
    while buf.len() < MAX_HEAD {
        make_room(buf, READ_SPACE);
        if !matches!(from.read_buf(buf).await, Ok(n) if n > 0) {
            return;
        }
    }
    std::future::pending().await
}

/// Relays a response (`receive`) while watching its client (`client`, bytes read into `buf`):
/// a client that goes away fails the exchange, so the upstream connection is closed rather
/// than left working for nobody. The sandbox's server hears that its client is gone (the code
/// interpreter interrupts the execution the SDK's timeout gave up on), as it would without the
/// gateway in between; nginx and Go's HTTP server treat a client's close the same way.
async fn watched<F, R>(receive: F, client: &mut R, buf: &mut BytesMut) -> Result<Kept, Failed>
where
    F: std::future::Future<Output = Result<Kept, Failed>>,
    R: AsyncRead + Unpin,
{
    tokio::select! {
        biased;
        received = receive => received,
        () = client_gone(client, buf) => {
            tracing::debug!("the client went away before its response ended");
            Err(Failed::Client)
        }
    }
}

/// Sends the request (head in `out`, with its body when `whole`, else the body from the
/// client) and relays the response, watching the client once its request is sent.
async fn exchange(
    conn: &mut Conn,
    down: &mut Downstream,
    up: &mut RawUpstream,
    request: &RequestHead,
    whole: bool,
    first_byte: &DurationHistogram,
) -> Result<Kept, Failed> {
    let Conn { buf, out, rbuf, rout } = conn;
    let up = &mut up.0;
    if let Err(error) = up.write_all(out).await {
        return Err(Failed::Retry { error, sent: false });
    }
    let timing = (first_byte, std::time::Instant::now());
    let (mut down_read, mut down_write) = tokio::io::split(&mut *down);
    if whole {
        let receive = relay_response(rbuf, rout, up, &mut down_write, request, timing);
        return watched(receive, &mut down_read, buf).await;
    }
    // A body still arriving: relayed while the response is read.
    let (mut up_read, mut up_write) = tokio::io::split(up);
    let mut none = Vec::new();
    // Boxed so that it can be dropped once done: the client's side is then watched.
    let mut send =
        Box::pin(relay_body(request.framing, &mut none, buf, &mut down_read, &mut up_write));
    let receive = relay_response(rbuf, rout, &mut up_read, &mut down_write, request, timing);
    tokio::pin!(receive);
    let (sent, received) = tokio::select! {
        sent = &mut send => {
            drop(send);
            let received = match sent {
                Ok(()) => watched(receive, &mut down_read, buf).await,
                Err(_) => receive.await,
            };
            (sent, received)
        }
        received = &mut receive => match received {
            // The sandbox is gone before it answered (killed under an upload, say): it is
            // answered now, not once the client has sent the rest of its body.
            Err(failed @ (Failed::Retry { .. } | Failed::Upstream(_))) => return Err(failed),
            received => (send.await, received),
        },
    };
    if let Err(error) = &sent {
        tracing::debug!(%error, "request body relay ended early");
    }
    match (sent, received) {
        (Ok(()), received) => received,
        // The client stopped sending: nothing more can be said to it on this connection.
        (Err(BodyError::Read(_) | BodyError::Malformed(_)), Ok(_)) => {
            Ok(Kept { upstream: false, client: false })
        }
        (Err(BodyError::Read(_) | BodyError::Malformed(_)), Err(_)) => Err(Failed::Client),
        // The sandbox stopped reading; its answer (an early 413, say) went out if it had one.
        (Err(BodyError::Write(_)), Ok(_)) => Ok(Kept { upstream: false, client: false }),
        (Err(BodyError::Write(error)), Err(Failed::Retry { .. })) => {
            Err(Failed::Upstream(error.to_string()))
        }
        (Err(BodyError::Write(_)), Err(failed)) => Err(failed),
    }
}

/// Writes `reject`'s answer as an HTTP/1.1 response into `out`.
fn reject_response(reject: &Reject, close: bool, out: &mut Vec<u8>) {
    let status = reject.status();
    let body = reject.body().to_string();
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or_default().as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
}

/// Answers `reject` and skips the request's body (`framing`, what is left of it: `UntilClose`
/// when that is not known), or closes when the body is not all here yet, after [`linger`].
/// `false` when the connection is done.
async fn answer(
    conn: &mut Conn,
    down: &mut Downstream,
    reject: &Reject,
    framing: Framing,
    close: bool,
) -> bool {
    let skip = match framing {
        Framing::Empty => Some(0),
        Framing::Length(n) if n <= conn.buf.len() as u64 => Some(n as usize),
        _ => None,
    };
    let close = close || skip.is_none();
    reject_response(reject, close, &mut conn.rout);
    if down.write_all(&conn.rout).await.is_err() {
        return false;
    }
    if close {
        if skip.is_none() {
            linger(down).await;
        }
        return false;
    }
    conn.buf.advance(skip.unwrap_or_default());
    true
}

/// How long [`linger`] waits for a client that is still sending.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Lets a client that is still sending its request body read the answer before the connection
/// closes. Closing a socket with unread input sends a reset, which can destroy the answer
/// before the client has read it (Node's fetch then reports only "fetch failed", and the E2B SDK
/// cannot tell that the sandbox was killed under its upload). So writing is shut down and what
/// the client sends is discarded until it closes, for at most [`LINGER`] (Go's HTTP server and
/// nginx do the same).
async fn linger(down: &mut Downstream) {
    let _ = down.shutdown().await;
    let mut sink = vec![0u8; READ_SPACE];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(down.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Relays plain HTTP/1.1 requests on a client connection until it closes, fails, shuts down
/// (`stop` turns true) or sends something for hyper.
pub(crate) async fn serve_connection<S: Store>(
    inner: &Arc<Inner<S>>,
    mut down: Downstream,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let mut conn = Conn {
        buf: BytesMut::with_capacity(READ_SPACE),
        out: Vec::with_capacity(1024),
        rbuf: BytesMut::new(),
        rout: Vec::with_capacity(1024),
    };
    loop {
        let request = loop {
            if !conn.buf.is_empty() {
                match parse_request(&conn.buf, &mut conn.out, &inner.config.domain) {
                    Parse::Partial => {}
                    Parse::Handoff => return Outcome::Handoff(down, conn.buf),
                    Parse::Request(request) => break request,
                    Parse::Reject(reject, len, framing, close) => {
                        conn.buf.advance(len);
                        if !answer(&mut conn, &mut down, &reject, framing, close).await {
                            return Outcome::Done;
                        }
                        continue;
                    }
                }
            }
            make_room(&mut conn.buf, READ_SPACE);
            let read = if conn.buf.is_empty() {
                // Between requests: a shutdown closes the connection.
                if *stop.borrow() {
                    return Outcome::Done;
                }
                tokio::select! {
                    biased;
                    read = down.read_buf(&mut conn.buf) => read,
                    _ = stop.changed() => return Outcome::Done,
                }
            } else {
                down.read_buf(&mut conn.buf).await
            };
            if !matches!(read, Ok(n) if n > 0) {
                return Outcome::Done;
            }
        };
        if !relay(inner, &mut conn, &mut down, request).await || *stop.borrow() {
            return Outcome::Done;
        }
    }
}

/// Relays one request; `false` when the client connection is done.
async fn relay<S: Store>(
    inner: &Arc<Inner<S>>,
    conn: &mut Conn,
    down: &mut Downstream,
    mut request: RequestHead,
) -> bool {
    inner.metrics.fast_requests.inc();
    let credentials = Credentials {
        traffic_token: request.token.as_ref().map(|(value, _)| value.as_slice()),
        access_token: request.access_token.clone().map(|range| &conn.out[range]),
    };
    let (sandbox, strip_token) = match proxy::sandbox_for(inner, &request.target, credentials).await
    {
        Ok(found) => found,
        Err(reject) => {
            conn.buf.advance(request.len);
            return answer(conn, down, &reject, request.framing, request.close).await;
        }
    };
    if strip_token && let Some((_, line)) = request.token.take() {
        conn.out.drain(line);
    }
    conn.buf.advance(request.len);
    // A body that is all here goes out with the head.
    let whole = match request.framing {
        Framing::Empty => true,
        Framing::Length(n) if n <= conn.buf.len() as u64 && n <= SMALL_BODY as u64 => {
            conn.out.extend_from_slice(&conn.buf[..n as usize]);
            conn.buf.advance(n as usize);
            true
        }
        _ => false,
    };
    let key = PoolKey::of(&sandbox, request.target.port);
    let max_idle = inner.config.max_idle_per_target;
    let mut pooled = inner.raw_pool.checkout(key);
    loop {
        let reused = pooled.is_some();
        let mut up = match pooled.take() {
            Some(up) => up,
            None => match proxy::dial_stream(inner, &sandbox, &request.target).await {
                Ok(stream) => RawUpstream::new(
                    stream,
                    inner.config.idle_timeout,
                    inner.metrics.upstream_bytes.clone(),
                ),
                Err(reject) => {
                    let reject = gone::confirm(inner, &sandbox, reject).await;
                    return answer(conn, down, &reject, rest(whole), request.close).await;
                }
            },
        };
        conn.rbuf.clear();
        match exchange(conn, down, &mut up, &request, whole, &inner.metrics.first_byte).await {
            Ok(kept) => {
                if kept.upstream {
                    inner.raw_pool.checkin(key, up, max_idle);
                }
                return kept.client;
            }
            Err(Failed::Retry { error, sent })
                if reused && whole && (!sent || request.idempotent) =>
            {
                tracing::debug!(sandbox = %request.target.sandbox_id, %error,
                    "a pooled connection failed; sending again on a new one");
                pooled = inner.raw_pool.checkout(key);
            }
            Err(Failed::Retry { error, .. }) => {
                let reject = unreachable(&request.target, error.to_string());
                let reject = gone::confirm(inner, &sandbox, reject).await;
                return answer(conn, down, &reject, rest(whole), request.close).await;
            }
            Err(Failed::Upstream(reason)) => {
                let reject = unreachable(&request.target, reason);
                let reject = gone::confirm(inner, &sandbox, reject).await;
                return answer(conn, down, &reject, rest(whole), request.close).await;
            }
            Err(Failed::Client) => return false,
        }
    }
}

/// What is left to skip of a request body that was sent `whole` with its head, or streamed
/// (then an unknown part of it is still on its way).
fn rest(whole: bool) -> Framing {
    if whole { Framing::Empty } else { Framing::UntilClose }
}

fn unreachable(target: &Target, reason: String) -> Reject {
    Reject::Unreachable { sandbox_id: target.sandbox_id.clone(), reason }
}

/// A stream whose first bytes were read already: they are read again first.
pub(crate) struct Rewind<T> {
    prefix: BytesMut,
    io: T,
}

impl<T> Rewind<T> {
    /// `io`, with `prefix` in front.
    pub(crate) fn new(io: T, prefix: BytesMut) -> Self {
        Self { prefix, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The fuzz targets' checks of the parsers above ([`crate::fuzzing`]).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_request_head(buf: &[u8], domain: &str) {
    let mut out = Vec::new();
    match parse_request(buf, &mut out, domain) {
        Parse::Request(head) => {
            assert!(head.len <= buf.len());
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut again = httparse::Request::new(&mut headers);
            let parsed = again.parse(&out);
            assert!(
                matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
                "the upstream head is not one request head: {parsed:?} {:?}",
                String::from_utf8_lossy(&out)
            );
            assert_eq!(again.version, Some(1));
            assert!(again.headers.iter().all(|h| !is_hop_by_hop(h.name)));
            let framed_by = |name: &str| again.headers.iter().any(|h| header_is(h.name, name));
            match head.framing {
                Framing::Chunked => assert!(framed_by("transfer-encoding")),
                Framing::Length(_) => assert!(framed_by("content-length")),
                Framing::Empty | Framing::UntilClose => {}
            }
            if let Some((value, range)) = head.token {
                let line = &out[range];
                let name = TRAFFIC_TOKEN_HEADER.as_bytes();
                assert!(line.len() > name.len() && line[..name.len()].eq_ignore_ascii_case(name));
                assert!(line.ends_with(b"\r\n") && line[..line.len() - 2].ends_with(&value));
            }
        }
        Parse::Reject(_, len, _, _) => assert!(len <= buf.len()),
        Parse::Partial => assert!(buf.len() < MAX_HEAD),
        Parse::Handoff => {}
    }
}

/// The fuzz targets' check of [`parse_response`].
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_response_head(buf: &[u8], is_head: bool, client_closes: bool) {
    let mut rout = Vec::new();
    let Ok(Some(head)) = parse_response(buf, &mut rout, is_head, client_closes) else { return };
    assert!(head.len <= buf.len());
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS + 1];
    let mut again = httparse::Response::new(&mut headers);
    let parsed = again.parse(&rout);
    assert!(
        matches!(parsed, Ok(httparse::Status::Complete(n)) if n == rout.len()),
        "the client's head is not one response head: {parsed:?} {:?}",
        String::from_utf8_lossy(&rout)
    );
    assert_eq!(again.version, Some(1));
    if is_head || head.interim {
        assert_eq!(head.framing, Framing::Empty);
    }
    let closes = again.headers.iter().any(|h| header_is(h.name, "connection"));
    assert_eq!(closes, !head.interim && (client_closes || head.framing == Framing::UntilClose));
}

/// The fuzz targets' check of [`BodyEnd`]: a chunked body's end and verdict do not depend on
/// how its bytes are split into reads.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_chunked(cuts: &[u8], data: &[u8]) {
    fn scan<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> Option<(usize, bool)> {
        let mut end = BodyEnd::new(Framing::Chunked);
        let mut total = 0;
        for piece in pieces {
            if end.done() {
                break;
            }
            let n = end.scan(piece).ok()?;
            assert!(n <= piece.len());
            total += n;
            if n < piece.len() {
                assert!(end.done(), "a scan stopped short of its bytes before the end");
                break;
            }
        }
        Some((total, end.done()))
    }
    let whole = scan(std::iter::once(data));
    let mut at = 0;
    let mut points = Vec::new();
    for &cut in cuts {
        at = (at + usize::from(cut)).min(data.len());
        points.push(at);
    }
    points.push(data.len());
    let mut from = 0;
    let pieces = points.iter().map(|&to| {
        let piece = &data[from..to];
        from = to;
        piece
    });
    assert_eq!(scan(pieces), whole, "the verdict depends on the split");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(head: &str) -> (RequestHead, String) {
        let mut out = Vec::new();
        match parse_request(head.as_bytes(), &mut out, "oka.test") {
            Parse::Request(request) => (request, String::from_utf8(out).unwrap()),
            Parse::Partial => panic!("partial: {head:?}"),
            Parse::Handoff => panic!("handed off: {head:?}"),
            Parse::Reject(reject, ..) => panic!("rejected: {reject:?}"),
        }
    }

    fn is_handoff(head: &str) -> bool {
        matches!(parse_request(head.as_bytes(), &mut Vec::new(), "oka.test"), Parse::Handoff)
    }

    #[test]
    fn a_plain_request_is_rewritten_without_hop_by_hop_headers() {
        let (request, out) = parsed(
            "GET /kruise/abc/8080/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\
             Keep-Alive: 5\r\nTE: trailers\r\nX-Access-Token: t\r\n\r\n",
        );
        assert_eq!(request.target.sandbox_id, "abc");
        assert_eq!(request.target.port, 8080);
        assert_eq!(request.framing, Framing::Empty);
        assert!(!request.close && request.idempotent && !request.is_head);
        assert_eq!(out, "GET /x?y=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Access-Token: t\r\n\r\n");
    }

    #[test]
    fn framing_close_and_the_token_line_are_found() {
        let (request, out) = parsed(
            "POST / HTTP/1.1\r\nHost: 49983-abc.oka.test\r\nContent-Length: 5\r\n\
             e2b-traffic-access-token: secret\r\nConnection: close\r\n\r\nhello",
        );
        assert_eq!(request.framing, Framing::Length(5));
        assert!(request.close && !request.idempotent);
        let (value, line) = request.token.unwrap();
        assert_eq!(value, b"secret");
        assert_eq!(&out[line], "e2b-traffic-access-token: secret\r\n");
        let (chunked, _) =
            parsed("POST / HTTP/1.1\r\nHost: 1-a.oka.test\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(chunked.framing, Framing::Chunked);
    }

    #[test]
    fn anything_but_a_plain_http11_request_goes_to_hyper() {
        for head in [
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: 1-a.oka.test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: 1-a.oka.test\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: 1-a.oka.test\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: 1-a.oka.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: 1-a.oka.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: 1-a.oka.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET http://1-a.oka.test/ HTTP/1.1\r\nHost: 1-a.oka.test\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: x-custom\r\nHost: 1-a.oka.test\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "NOT A REQUEST\r\n\r\n",
        ] {
            assert!(is_handoff(head), "{head:?}");
        }
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHost: 1-a.oka", &mut Vec::new(), ""),
            Parse::Partial
        ));
    }

    #[test]
    fn a_request_naming_no_sandbox_is_rejected_with_its_message() {
        let head = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: abc\r\n\r\n";
        match parse_request(head.as_bytes(), &mut Vec::new(), "") {
            Parse::Reject(reject, len, Framing::Empty, false) => {
                assert_eq!(reject.body()["message"], "Missing header: E2b-Sandbox-Port");
                assert_eq!(len, head.len());
            }
            _ => panic!("not rejected"),
        }
    }

    fn response(head: &str, is_head: bool, client_closes: bool) -> (ResponseHead, String) {
        let mut out = Vec::new();
        let parsed =
            parse_response(head.as_bytes(), &mut out, is_head, client_closes).unwrap().unwrap();
        (parsed, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_status_code_below_100_is_malformed() {
        // Found by the `gateway_response_head` fuzz target: `020` was relayed as `20`.
        for head in ["HTTP/1.1 020 OK\r\n\r\n", "HTTP/1.1 000 X\r\nContent-Length: 0\r\n\r\n"] {
            let parsed = parse_response(head.as_bytes(), &mut Vec::new(), false, false);
            assert!(matches!(parsed, Err(Malformed::Head)), "{head:?}");
        }
        let (_, out) = response("HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", false, false);
        assert!(out.starts_with("HTTP/1.1 999 Odd\r\n"), "{out}");
    }

    #[test]
    fn response_framing_and_connection_reuse() {
        let (r, out) = response(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n\r\n",
            false,
            false,
        );
        assert_eq!((r.framing, r.upstream_closes, r.interim), (Framing::Length(3), false, false));
        assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n");
        let (r, out) =
            response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false, true);
        assert_eq!(r.framing, Framing::Chunked);
        assert!(out.ends_with("connection: close\r\n\r\n"), "{out}");
        let (r, _) = response("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true, false);
        assert_eq!(r.framing, Framing::Empty);
        let (r, _) = response("HTTP/1.1 204 No Content\r\n\r\n", false, false);
        assert_eq!(r.framing, Framing::Empty);
        let (r, out) = response("HTTP/1.0 200 OK\r\n\r\n", false, false);
        assert_eq!((r.framing, r.upstream_closes), (Framing::UntilClose, true));
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && out.contains("connection: close"));
        let (r, _) = response("HTTP/1.1 100 Continue\r\n\r\n", false, false);
        assert!(r.interim);
        let (r, _) = response("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", false, false);
        assert_eq!((r.framing, r.upstream_closes), (Framing::UntilClose, true));
        assert!(
            parse_response(b"HTTP/1.1 101 Switching\r\n\r\n", &mut Vec::new(), false, false)
                .is_err()
        );
    }

    #[test]
    fn chunked_bodies_end_after_the_last_chunk_and_trailers_however_they_are_split() {
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut scan = BodyEnd::new(Framing::Chunked);
            let a = scan.scan(&body[..split]).unwrap();
            assert_eq!(a, split.min(end), "a prefix belongs to the body up to its end");
            let b = scan.scan(&body[split..]).unwrap();
            assert!(scan.done());
            assert_eq!(a + b, end, "split at {split}");
        }
        let mut bad = BodyEnd::new(Framing::Chunked);
        assert!(bad.scan(b"zz\r\n").is_err());
        let mut no_crlf = BodyEnd::new(Framing::Chunked);
        assert!(no_crlf.scan(b"1\r\naXX").is_err());
        let mut huge = BodyEnd::new(Framing::Chunked);
        assert!(huge.scan(b"ffffffffffffffffff\r\n").is_err());
    }

    #[test]
    fn lengths_parse_strictly() {
        assert_eq!(parse_length(b" 42 "), Some(42));
        assert_eq!(parse_length(b"+1"), None);
        assert_eq!(parse_length(b""), None);
        assert_eq!(parse_length(b"99999999999999999999"), None);
    }
}
