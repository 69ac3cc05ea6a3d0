//! The Connect protocol (connectrpc.com/docs/protocol) as the E2B SDKs speak it (e2b-protocol.md §3.1).
//!
//! - Unary: `application/json` or `application/proto` bodies, not enveloped; errors are an HTTP status
//!   plus `{"code","message"}` JSON.
//! - Streaming (server and client): `application/connect+json` or `application/connect+proto`; each
//!   message is an envelope `flags:u8 | len:u32be | payload`; the response always ends with one
//!   end-of-stream envelope (flag `0x02`, JSON `{}` or `{"error":{…}}`), and stream errors travel there
//!   with HTTP 200.
//! - `Connect-Timeout-Ms` is parsed here; what a deadline means is up to each method.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;
use tokio::sync::mpsc;

/// Largest accepted request message (and unary body), in bytes.
pub const MAX_MESSAGE: usize = 16 << 20;

/// Envelope flag: the payload is compressed.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: end of stream.
pub const FLAG_END: u8 = 0x02;

/// A Connect error code (the snake_case names of the protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// `canceled`
    Canceled,
    /// `unknown`
    Unknown,
    /// `invalid_argument`
    InvalidArgument,
    /// `deadline_exceeded`
    DeadlineExceeded,
    /// `not_found`
    NotFound,
    /// `already_exists`
    AlreadyExists,
    /// `permission_denied`
    PermissionDenied,
    /// `resource_exhausted`
    ResourceExhausted,
    /// `failed_precondition`
    FailedPrecondition,
    /// `aborted`
    Aborted,
    /// `out_of_range`
    OutOfRange,
    /// `unimplemented`
    Unimplemented,
    /// `internal`
    Internal,
    /// `unavailable`
    Unavailable,
    /// `data_loss`
    DataLoss,
    /// `unauthenticated`
    Unauthenticated,
}

impl Code {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Canceled => "canceled",
            Self::Unknown => "unknown",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::FailedPrecondition => "failed_precondition",
            Self::Aborted => "aborted",
            Self::OutOfRange => "out_of_range",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::DataLoss => "data_loss",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn http_status(self) -> StatusCode {
        match self {
            Self::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Self::Unknown | Self::Internal | Self::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Self::InvalidArgument | Self::FailedPrecondition | Self::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::AlreadyExists | Self::Aborted => StatusCode::CONFLICT,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC failure: a code and a message for the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// The message.
    pub message: String,
}

impl ConnectError {
    /// A new error.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    /// `invalid_argument`
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    /// `not_found`
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    /// `internal`
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// The JSON error object `{"code","message"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// A unary error response.
    pub fn into_unary_response(self) -> Response {
        if matches!(self.code, Code::Internal | Code::Unknown | Code::DataLoss) {
            tracing::warn!(error = %self, "rpc failed");
        } else {
            tracing::debug!(error = %self, "rpc refused");
        }
        let mut r = (self.code.http_status(), self.to_json().to_string()).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

/// The codec of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// ProtoJSON.
    Json,
    /// Binary protobuf.
    Proto,
}

/// Anything that can travel in either codec.
pub trait Msg: prost::Message + Default + Serialize + DeserializeOwned + Send + 'static {}
impl<T: prost::Message + Default + Serialize + DeserializeOwned + Send + 'static> Msg for T {}

impl Codec {
    /// Decodes one message.
    pub fn decode<T: Msg>(self, bytes: &[u8]) -> Result<T, ConnectError> {
        match self {
            Self::Json => {
                let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { bytes };
                serde_json::from_slice(bytes).map_err(|e| {
                    ConnectError::invalid(format!("failed to decode JSON message: {e}"))
                })
            }
            Self::Proto => T::decode(bytes).map_err(|e| {
                ConnectError::invalid(format!("failed to decode protobuf message: {e}"))
            }),
        }
    }

    /// Encodes one message.
    pub fn encode<T: Msg>(self, msg: &T) -> Bytes {
        match self {
            // Serializing these plain structs into a Vec cannot fail.
            Self::Json => Bytes::from(serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec())),
            Self::Proto => Bytes::from(msg.encode_to_vec()),
        }
    }

    fn unary_content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Proto => "application/proto",
        }
    }

    fn stream_content_type(self) -> &'static str {
        match self {
            Self::Json => "application/connect+json",
            Self::Proto => "application/connect+proto",
        }
    }
}

/// The shape of a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One message in, one out.
    Unary,
    /// One message in, a stream out.
    ServerStream,
    /// A stream in, one message out.
    ClientStream,
}

/// What the Connect headers of a request say.
#[derive(Clone, Debug)]
pub struct CallMeta {
    /// The codec.
    pub codec: Codec,
    /// `Connect-Timeout-Ms`.
    pub timeout: Option<Duration>,
    /// `Keepalive-Ping-Interval` (seconds; 90 s when missing or unparsable).
    pub keepalive: Duration,
}

/// Default keepalive interval of streams (envd's).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Checks the headers of a call of `kind`; the error is the whole HTTP answer.
pub fn parse_meta(kind: Kind, headers: &HeaderMap) -> Result<CallMeta, Box<Response>> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let codec = match (kind, ct.as_str()) {
        (Kind::Unary, "application/json") => Codec::Json,
        (Kind::Unary, "application/proto") => Codec::Proto,
        (Kind::ServerStream | Kind::ClientStream, "application/connect+json") => Codec::Json,
        (Kind::ServerStream | Kind::ClientStream, "application/connect+proto") => Codec::Proto,
        _ => {
            let accept = match kind {
                Kind::Unary => "application/json, application/proto",
                _ => "application/connect+json, application/connect+proto",
            };
            let mut r = (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("unsupported content-type {ct:?}; use {accept}"),
            )
                .into_response();
            if let Ok(v) = HeaderValue::from_str(accept) {
                r.headers_mut().insert("accept-post", v);
            }
            return Err(Box::new(r));
        }
    };
    let refuse = |e: ConnectError| {
        Box::new(match kind {
            Kind::Unary => e.into_unary_response(),
            _ => stream_error_response(codec, e),
        })
    };
    let enc_header =
        if kind == Kind::Unary { "content-encoding" } else { "connect-content-encoding" };
    if let Some(enc) = headers.get(enc_header) {
        let enc = enc.to_str().unwrap_or("?");
        if !enc.eq_ignore_ascii_case("identity") {
            return Err(refuse(ConnectError::new(
                Code::Unimplemented,
                format!("unsupported compression {enc:?}; supported: identity"),
            )));
        }
    }
    let timeout = match headers.get("connect-timeout-ms") {
        None => None,
        Some(v) => {
            let s = v.to_str().unwrap_or("");
            match s.parse::<u64>() {
                Ok(ms) if !s.is_empty() && s.len() <= 10 => Some(Duration::from_millis(ms)),
                _ => {
                    return Err(refuse(ConnectError::invalid(format!(
                        "invalid connect-timeout-ms {s:?}"
                    ))));
                }
            }
        }
    };
    let keepalive = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs);
    Ok(CallMeta { codec, timeout, keepalive })
}

/// Frames one envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    // Payloads are far below 4 GiB (outputs are chunked to 32 KiB).
    b.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    b.put_slice(payload);
    b.freeze()
}

/// The end-of-stream envelope for `result`.
pub fn end_envelope(result: Result<(), &ConnectError>) -> Bytes {
    let json = match result {
        Ok(()) => serde_json::json!({}),
        Err(e) => serde_json::json!({ "error": e.to_json() }),
    };
    envelope(FLAG_END, json.to_string().as_bytes())
}

/// A streaming response that carries only an end-of-stream error (HTTP 200).
pub fn stream_error_response(codec: Codec, e: ConnectError) -> Response {
    tracing::debug!(error = %e, "stream refused");
    stream_response(codec, futures::stream::once(async move { end_envelope(Err(&e)) }))
}

fn stream_response(codec: Codec, frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>));
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(codec.stream_content_type()));
    r
}

/// A unary success response.
pub fn unary_response<T: Msg>(codec: Codec, msg: &T) -> Response {
    let mut r = Response::new(Body::from(codec.encode(msg)));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(codec.unary_content_type()));
    r
}

/// Incremental decoder of request envelopes.
#[derive(Default)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
}

impl EnvelopeDecoder {
    /// Adds received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete envelope `(flags, payload)`, if any.
    pub fn next_envelope(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("message size {len} is larger than configured max {MAX_MESSAGE}"),
            ));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::internal(
                "protocol error: sent compressed message without compression support",
            ));
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END) != 0 {
            return Err(ConnectError::invalid(format!("invalid envelope flags {flags:#04x}")));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some((flags, self.buf.split_to(len).freeze())))
    }

    /// Whether bytes are left over (an incomplete envelope).
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Decodes a complete request body that must hold exactly one message envelope.
pub fn decode_single<T: Msg>(codec: Codec, body: &[u8]) -> Result<T, ConnectError> {
    let mut d = EnvelopeDecoder::default();
    d.push(body);
    let Some((flags, payload)) = d.next_envelope()? else {
        return Err(ConnectError::invalid("incomplete request envelope"));
    };
    if flags & FLAG_END != 0 {
        return Err(ConnectError::invalid("request stream ended before its message"));
    }
    if d.has_partial() {
        return Err(ConnectError::invalid("unexpected data after the request message"));
    }
    codec.decode(&payload)
}

/// Reads a whole body of at most [`MAX_MESSAGE`] (+ envelope) bytes.
pub async fn read_body(body: Body) -> Result<Bytes, ConnectError> {
    axum::body::to_bytes(body, MAX_MESSAGE + 5).await.map_err(|e| {
        let too_big = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_big {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("message is larger than configured max {MAX_MESSAGE}"),
            )
        } else {
            ConnectError::new(Code::Canceled, format!("failed to read request: {e}"))
        }
    })
}

/// The request messages of a client stream.
pub fn client_stream<T: Msg>(
    codec: Codec,
    body: Body,
) -> impl Stream<Item = Result<T, ConnectError>> + Send + 'static {
    futures::stream::unfold(
        (body.into_data_stream(), EnvelopeDecoder::default(), false),
        move |(mut data, mut dec, done)| async move {
            if done {
                return None;
            }
            loop {
                match dec.next_envelope() {
                    Err(e) => return Some((Err(e), (data, dec, true))),
                    Ok(Some((flags, _))) if flags & FLAG_END != 0 => return None,
                    Ok(Some((_, payload))) => {
                        let m = codec.decode::<T>(&payload);
                        let stop = m.is_err();
                        return Some((m, (data, dec, stop)));
                    }
                    Ok(None) => {}
                }
                match data.next().await {
                    Some(Ok(chunk)) => dec.push(&chunk),
                    Some(Err(e)) => {
                        let e = ConnectError::new(Code::Canceled, format!("request body: {e}"));
                        return Some((Err(e), (data, dec, true)));
                    }
                    None if dec.has_partial() => {
                        let e = ConnectError::invalid("incomplete request envelope");
                        return Some((Err(e), (data, dec, true)));
                    }
                    None => return None,
                }
            }
        },
    )
}

/// The sending side of a server stream, handed to a streaming method.
#[derive(Clone)]
pub struct Sink<T> {
    codec: Codec,
    tx: mpsc::Sender<Bytes>,
    _t: std::marker::PhantomData<fn(T)>,
}

/// The client went away.
#[derive(Debug, thiserror::Error)]
#[error("client disconnected")]
pub struct Gone;

impl<T: Msg> Sink<T> {
    /// Sends one message (waits while the client is slow).
    pub async fn send(&self, msg: &T) -> Result<(), Gone> {
        self.tx.send(envelope(0, &self.codec.encode(msg))).await.map_err(|_| Gone)
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// Runs a server-streaming method: `f` gets a [`Sink`] and its result becomes the end-of-stream
/// envelope. The method keeps running in its own task until it returns (a gone client makes
/// [`Sink::send`] fail).
pub fn serve_stream<T, F, Fut>(codec: Codec, f: F) -> Response
where
    T: Msg,
    F: FnOnce(Sink<T>) -> Fut,
    Fut: Future<Output = Result<(), ConnectError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let sink = Sink { codec, tx: tx.clone(), _t: std::marker::PhantomData };
    let fut = f(sink);
    tokio::spawn(async move {
        let result = fut.await;
        if let Err(e) = &result {
            tracing::debug!(error = %e, "stream ended with an error");
        }
        let _ = tx.send(end_envelope(result.as_ref().map(|_| ()))).await;
    });
    let frames =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    stream_response(codec, frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::PathRequest;

    #[test]
    fn envelope_round_trip() {
        let e = envelope(0, br#"{"event":{"start":{"pid":4242}}}"#);
        assert_eq!(&e[..6], &[0, 0, 0, 0, 0x20, b'{']);
        assert_eq!(&end_envelope(Ok(()))[..], &[2, 0, 0, 0, 2, b'{', b'}']);
        let mut d = EnvelopeDecoder::default();
        d.push(&e[..3]);
        assert_eq!(d.next_envelope().unwrap(), None);
        d.push(&e[3..]);
        let (f, p) = d.next_envelope().unwrap().unwrap();
        assert_eq!((f, p.len()), (0, 32));
        assert!(!d.has_partial());
    }

    #[test]
    fn bad_envelopes_are_refused() {
        let c = Codec::Json;
        assert_eq!(
            decode_single::<PathRequest>(c, &[0, 0, 0]).unwrap_err().message,
            "incomplete request envelope"
        );
        let big = [0, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            decode_single::<PathRequest>(c, &big).unwrap_err().code,
            Code::ResourceExhausted
        );
        let compressed = envelope(FLAG_COMPRESSED, b"{}");
        assert_eq!(decode_single::<PathRequest>(c, &compressed).unwrap_err().code, Code::Internal);
        let bad_json = envelope(0, b"{\"path\":");
        assert_eq!(
            decode_single::<PathRequest>(c, &bad_json).unwrap_err().code,
            Code::InvalidArgument
        );
        let ok = envelope(0, br#"{"path":"/x"}"#);
        assert_eq!(decode_single::<PathRequest>(c, &ok).unwrap().path, "/x");
    }

    #[test]
    fn statuses_match_the_table() {
        assert_eq!(Code::Canceled.http_status().as_u16(), 499);
        assert_eq!(Code::FailedPrecondition.http_status().as_u16(), 400);
        assert_eq!(Code::Unauthenticated.http_status().as_u16(), 401);
        assert_eq!(Code::Unimplemented.http_status().as_u16(), 501);
    }
}
