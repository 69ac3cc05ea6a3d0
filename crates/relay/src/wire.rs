//! The `OKA-RELAY/1` header and answer (see the crate documentation for the flow): how each is
//! written and parsed, with no IO, so every malformed case is a table test.

use oka_runtime_api::SandboxId;

use crate::token::RelayToken;

/// The protocol version this crate speaks, the header's first field.
pub const VERSION: &str = "OKA-RELAY/1";

/// What every version's first field starts with: lets the server refuse a stranger (an HTTP
/// request, a TLS hello) on its first bytes, without waiting for a line end.
const MAGIC: &[u8] = b"OKA-RELAY/";

/// The most bytes a header line may have, its `\n` included. The longest valid header is
/// `OKA-RELAY/1 ` (12) + a 256-byte token + a 128-byte id + a 5-digit port + two spaces and the
/// line end: 404 bytes.
pub const MAX_HEADER: usize = 512;

/// The most bytes an answer line may have, its `\n` included.
pub const MAX_ANSWER: usize = 512;

/// The success answer, exactly; its fixed length is what lets a client read it without reading
/// past it.
pub const OK: &[u8; 3] = b"OK\n";

/// What starts every other answer.
pub const ERR: &[u8; 3] = b"ERR";

/// Why a header was refused; every case is answered `bad-request` with this message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The bytes are not an `OKA-RELAY` header at all.
    #[error("not an OKA-RELAY header")]
    NotRelay,
    /// Another version of the protocol.
    #[error("unsupported version {0} (this relay speaks {VERSION})")]
    UnsupportedVersion(String),
    /// No line end within [`MAX_HEADER`] bytes.
    #[error("header longer than {MAX_HEADER} bytes")]
    TooLong,
    /// Not four fields separated by single spaces.
    #[error("malformed header: expected `{VERSION} <token> <runtime-id> <port>`")]
    Malformed,
    /// The runtime id is not a valid sandbox id.
    #[error("invalid runtime id {0:?}")]
    InvalidId(String),
    /// The port is not a number from 1 to 65535.
    #[error("invalid port {0:?}")]
    InvalidPort(String),
}

/// The header a client sends to reach `port` of sandbox `id`.
pub fn encode_request(token: &RelayToken, id: &SandboxId, port: u16) -> Vec<u8> {
    format!("{VERSION} {} {id} {port}\n", token.expose()).into_bytes()
}

/// Whether `prefix`, the first bytes received, can still begin a header: `false` means the
/// server can refuse the peer now.
pub fn could_be_header(prefix: &[u8]) -> bool {
    let n = prefix.len().min(MAGIC.len());
    prefix[..n] == MAGIC[..n]
}

/// A header split into its fields, the token not yet checked and the target not yet parsed: the
/// server checks the token first, so an unauthenticated peer learns nothing from how its id or
/// port would have been judged.
#[derive(Debug, PartialEq, Eq)]
pub struct RawRequest<'a> {
    /// The token as sent.
    pub token: &'a [u8],
    id: &'a [u8],
    port: &'a [u8],
}

impl RawRequest<'_> {
    /// The sandbox and port asked for.
    pub fn target(&self) -> Result<(SandboxId, u16), WireError> {
        let id = std::str::from_utf8(self.id)
            .ok()
            .and_then(|id| SandboxId::new(id).ok())
            .ok_or_else(|| WireError::InvalidId(String::from_utf8_lossy(self.id).into_owned()))?;
        let port = std::str::from_utf8(self.port)
            .ok()
            // `u16::from_str` accepts a leading `+`; the protocol says decimal digits.
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p != 0)
            .ok_or_else(|| {
                WireError::InvalidPort(String::from_utf8_lossy(self.port).into_owned())
            })?;
        Ok((id, port))
    }
}

/// Splits a header `line` (its `\n` removed) into its fields after checking the version.
pub fn parse_request(line: &[u8]) -> Result<RawRequest<'_>, WireError> {
    let mut fields = line.split(|&b| b == b' ');
    let version = fields.next().unwrap_or_default();
    if version != VERSION.as_bytes() {
        return Err(if version.starts_with(MAGIC) {
            WireError::UnsupportedVersion(String::from_utf8_lossy(version).into_owned())
        } else {
            WireError::NotRelay
        });
    }
    match (fields.next(), fields.next(), fields.next(), fields.next()) {
        (Some(token), Some(id), Some(port), None)
            if !token.is_empty() && !id.is_empty() && !port.is_empty() =>
        {
            Ok(RawRequest { token, id, port })
        }
        _ => Err(WireError::Malformed),
    }
}

/// The server's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The sandbox's port is connected: `OK\n`, then the pipe.
    Ok,
    /// Nothing listens on the port.
    PortClosed,
    /// The node has no running instance of the sandbox.
    Gone,
    /// The token is wrong.
    Unauthorized,
    /// The header is malformed, of another version, too long or too slow.
    BadRequest,
    /// Anything else (the runtime failed).
    Error,
}

impl Status {
    /// The code on the wire.
    pub fn code(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::PortClosed => "port-closed",
            Self::Gone => "gone",
            Self::Unauthorized => "unauthorized",
            Self::BadRequest => "bad-request",
            Self::Error => "error",
        }
    }

    /// The status of an error answer's code; `None` for a code this version does not know.
    pub fn from_code(code: &str) -> Option<Self> {
        [Self::PortClosed, Self::Gone, Self::Unauthorized, Self::BadRequest, Self::Error]
            .into_iter()
            .find(|s| s.code() == code)
    }
}

/// The answer line for `status`: `OK\n`, or `ERR <code> <message>\n` with the message made one
/// line and cut to fit [`MAX_ANSWER`].
pub fn encode_answer(status: Status, message: &str) -> Vec<u8> {
    if status == Status::Ok {
        return OK.to_vec();
    }
    let mut line = format!("ERR {} ", status.code()).into_bytes();
    let room = MAX_ANSWER - line.len() - 1;
    line.extend(message.bytes().map(|b| if b.is_ascii_control() { b' ' } else { b }).take(room));
    line.push(b'\n');
    line
}

/// Splits what follows `ERR` in an error answer (its `\n` removed) into the status, if known,
/// the code as sent, and the message.
pub fn parse_error_answer(rest: &[u8]) -> (Option<Status>, String, String) {
    let rest = String::from_utf8_lossy(rest);
    let rest = rest.strip_prefix(' ').unwrap_or(&rest);
    let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
    (Status::from_code(code), code.to_owned(), message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> RelayToken {
        RelayToken::new("t".repeat(32)).unwrap()
    }

    #[test]
    fn a_request_round_trips() {
        let id = SandboxId::new("default--sbx-1").unwrap();
        let line = encode_request(&token(), &id, 49983);
        assert_eq!(line.last(), Some(&b'\n'));
        let raw = parse_request(&line[..line.len() - 1]).unwrap();
        assert_eq!(raw.token, "t".repeat(32).as_bytes());
        assert_eq!(raw.target().unwrap(), (id, 49983));
    }

    #[test]
    fn the_longest_valid_header_fits() {
        let token = RelayToken::new("t".repeat(crate::token::MAX_TOKEN_LEN)).unwrap();
        let id = SandboxId::new("i".repeat(oka_runtime_api::spec::MAX_ID_LEN)).unwrap();
        assert!(encode_request(&token, &id, 65535).len() <= MAX_HEADER);
    }

    #[test]
    fn malformed_headers_are_refused() {
        let t = "t".repeat(32);
        let cases: &[(&str, WireError)] = &[
            ("GET / HTTP/1.1", WireError::NotRelay),
            ("", WireError::NotRelay),
            ("OKA-RELAY/2 a b c", WireError::UnsupportedVersion("OKA-RELAY/2".into())),
            ("OKA-RELAY/1", WireError::Malformed),
            ("OKA-RELAY/1 tok id", WireError::Malformed),
            ("OKA-RELAY/1 tok id 80 extra", WireError::Malformed),
            ("OKA-RELAY/1  id 80", WireError::Malformed),
            ("OKA-RELAY/1 tok id 80 ", WireError::Malformed),
        ];
        for (line, want) in cases {
            assert_eq!(parse_request(line.as_bytes()).unwrap_err(), *want, "{line:?}");
        }
        let targets: &[(String, WireError)] = &[
            (format!("OKA-RELAY/1 {t} ../etc 80"), WireError::InvalidId("../etc".into())),
            (format!("OKA-RELAY/1 {t} sbx 0"), WireError::InvalidPort("0".into())),
            (format!("OKA-RELAY/1 {t} sbx 65536"), WireError::InvalidPort("65536".into())),
            (format!("OKA-RELAY/1 {t} sbx +80"), WireError::InvalidPort("+80".into())),
            (format!("OKA-RELAY/1 {t} sbx http"), WireError::InvalidPort("http".into())),
        ];
        for (line, want) in targets {
            let raw = parse_request(line.as_bytes()).unwrap();
            assert_eq!(raw.target().unwrap_err(), *want, "{line:?}");
        }
    }

    #[test]
    fn strangers_are_recognised_on_their_first_bytes() {
        assert!(could_be_header(b""));
        assert!(could_be_header(b"OKA"));
        assert!(could_be_header(b"OKA-RELAY/9 whatever"));
        assert!(!could_be_header(b"GET"));
        assert!(!could_be_header(b"\x16\x03\x01"));
    }

    #[test]
    fn answers_round_trip_and_stay_one_bounded_line() {
        assert_eq!(encode_answer(Status::Ok, "ignored"), b"OK\n");
        let line = encode_answer(Status::PortClosed, "nothing\nlistens");
        assert_eq!(line, b"ERR port-closed nothing listens\n");
        let (status, code, message) = parse_error_answer(&line[3..line.len() - 1]);
        assert_eq!(
            (status, code.as_str(), message.as_str()),
            (Some(Status::PortClosed), "port-closed", "nothing listens")
        );
        let long = encode_answer(Status::Error, &"x".repeat(10_000));
        assert_eq!(long.len(), MAX_ANSWER);
        assert_eq!(long.last(), Some(&b'\n'));
        assert_eq!(parse_error_answer(b" teapot short").0, None);
        for status in [Status::Gone, Status::Unauthorized, Status::BadRequest, Status::Error] {
            assert_eq!(Status::from_code(status.code()), Some(status));
        }
    }
}
