//! A minimal ZMTP 3.0 client (the ZeroMQ wire protocol, <https://rfc.zeromq.org/spec/23/>) over a
//! tokio [`TcpStream`], NULL security mechanism only: enough to be a `DEALER` or a `SUB` peer of a
//! Jupyter kernel's libzmq `ROUTER` and `PUB` sockets.
//!
//! The connection starts with a 64-byte greeting each way (we advertise version 3.0, so a newer
//! libzmq peer speaks 3.0 to us), then a `READY` command each way carrying `Socket-Type`. After
//! that the stream is a sequence of frames: one flags byte (`MORE`, `LONG`, `COMMAND`), a size (one
//! byte, or eight big-endian bytes when `LONG`) and the body. A message is the frames up to and
//! including the first one without `MORE`. A `SUB` subscribes by sending a one-frame message
//! `\x01<prefix>` (the 3.0 form; 3.1 has a `SUBSCRIBE` command instead); we subscribe to everything.
//! A `PING` command is answered with `PONG`; other commands are ignored.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest frame body we accept (a kernel's display data can be big, but not this big).
pub const MAX_FRAME: u64 = 256 << 20;

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// Errors of the ZMTP layer.
#[derive(Debug, thiserror::Error)]
pub enum ZmtpError {
    /// The socket failed, or the peer closed it.
    #[error("zmtp i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer's greeting is not a ZMTP 3.x greeting.
    #[error("bad zmtp greeting: {0}")]
    BadGreeting(String),
    /// The peer wants a security mechanism other than NULL.
    #[error("zmtp mechanism mismatch: peer wants {0:?}, we only speak NULL")]
    Mechanism(String),
    /// A frame announced a body larger than [`MAX_FRAME`].
    #[error("zmtp frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(u64),
    /// A frame's flags byte has reserved bits set.
    #[error("zmtp frame with invalid flags {0:#04x}")]
    BadFlags(u8),
    /// A command frame could not be parsed, or the handshake saw an unexpected command.
    #[error("bad zmtp command: {0}")]
    BadCommand(String),
    /// The peer sent an `ERROR` command.
    #[error("zmtp peer error: {0}")]
    Peer(String),
    /// The peer's socket type cannot talk to ours.
    #[error("zmtp socket type mismatch: we are {ours}, peer is {peer}")]
    SocketType {
        /// Our socket type.
        ours: &'static str,
        /// What the peer announced.
        peer: String,
    },
}

/// The two socket types this client can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    /// Talks to a `ROUTER` (a kernel's shell and control sockets).
    Dealer,
    /// Receives from a `PUB` (a kernel's iopub socket).
    Sub,
}

impl SocketType {
    /// The name in the `Socket-Type` property.
    pub fn name(self) -> &'static str {
        match self {
            SocketType::Dealer => "DEALER",
            SocketType::Sub => "SUB",
        }
    }

    fn accepts(self, peer: &str) -> bool {
        match self {
            SocketType::Dealer => matches!(peer, "ROUTER" | "DEALER" | "REP"),
            SocketType::Sub => matches!(peer, "PUB" | "XPUB"),
        }
    }
}

/// Our 64-byte greeting: signature, version 3.0, mechanism NULL, as-server 0, filler.
pub fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Checks a peer's greeting: ZMTP signature, major version 3 or later, mechanism NULL.
pub fn check_greeting(g: &[u8; 64]) -> Result<(), ZmtpError> {
    if g[0] != 0xFF || g[9] & 0x01 != 0x01 {
        return Err(ZmtpError::BadGreeting(format!("signature {:02x?} is not ZMTP", &g[..10])));
    }
    if g[10] < 3 {
        return Err(ZmtpError::BadGreeting(format!(
            "peer speaks ZMTP {}.{}, we need 3.x",
            g[10], g[11]
        )));
    }
    let mech = &g[12..32];
    let end = mech.iter().position(|&b| b == 0).unwrap_or(mech.len());
    let mech = String::from_utf8_lossy(&mech[..end]).into_owned();
    if mech != "NULL" {
        return Err(ZmtpError::Mechanism(mech));
    }
    Ok(())
}

/// Appends one frame to `out`.
pub fn encode_frame(out: &mut Vec<u8>, body: &[u8], more: bool, command: bool) {
    let mut flags = 0;
    if more {
        flags |= FLAG_MORE;
    }
    if command {
        flags |= FLAG_COMMAND;
    }
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

/// Encodes a multipart message (every frame but the last has `MORE`).
pub fn encode_message<B: AsRef<[u8]>>(frames: &[B]) -> Vec<u8> {
    let len = frames.iter().map(|f| f.as_ref().len() + 9).sum();
    let mut out = Vec::with_capacity(len);
    for (i, f) in frames.iter().enumerate() {
        encode_frame(&mut out, f.as_ref(), i + 1 < frames.len(), false);
    }
    out
}

/// A command's body: name length, name, data.
pub fn encode_command(name: &str, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    let mut out = Vec::with_capacity(body.len() + 9);
    encode_frame(&mut out, &body, false, true);
    out
}

/// The `READY` command for a socket type (metadata: `Socket-Type` only).
pub fn ready_command(t: SocketType) -> Vec<u8> {
    let mut props = Vec::new();
    encode_property(&mut props, "Socket-Type", t.name().as_bytes());
    encode_command("READY", &props)
}

fn encode_property(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
}

/// Parses a command frame's body into its name and data.
pub fn parse_command(body: &[u8]) -> Result<(&str, &[u8]), ZmtpError> {
    let (&n, rest) =
        body.split_first().ok_or_else(|| ZmtpError::BadCommand("empty command".into()))?;
    let n = usize::from(n);
    if rest.len() < n {
        return Err(ZmtpError::BadCommand("command name overruns the frame".into()));
    }
    let name = std::str::from_utf8(&rest[..n])
        .map_err(|_| ZmtpError::BadCommand("command name is not ASCII".into()))?;
    Ok((name, &rest[n..]))
}

/// Parses `READY` metadata into (name, value) pairs.
pub fn parse_properties(mut data: &[u8]) -> Result<Vec<(String, Vec<u8>)>, ZmtpError> {
    let bad = || ZmtpError::BadCommand("truncated READY property".into());
    let mut out = Vec::new();
    while let Some((&n, rest)) = data.split_first() {
        let n = usize::from(n);
        if rest.len() < n + 4 {
            return Err(bad());
        }
        let name = String::from_utf8_lossy(&rest[..n]).into_owned();
        let mut len = [0u8; 4];
        len.copy_from_slice(&rest[n..n + 4]);
        let len = u32::from_be_bytes(len) as usize;
        let rest = &rest[n + 4..];
        if rest.len() < len {
            return Err(bad());
        }
        out.push((name, rest[..len].to_vec()));
        data = &rest[len..];
    }
    Ok(out)
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// More frames of the same message follow.
    pub more: bool,
    /// This is a command frame, not a message frame.
    pub command: bool,
    /// The frame body.
    pub body: Bytes,
}

/// Takes one complete frame off the front of `buf`, or `None` if `buf` holds only part of one.
/// Never panics, whatever the bytes.
pub fn decode_frame(buf: &mut BytesMut) -> Result<Option<Frame>, ZmtpError> {
    let Some(&flags) = buf.first() else {
        return Ok(None);
    };
    if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 {
        return Err(ZmtpError::BadFlags(flags));
    }
    let (header, size) = if flags & FLAG_LONG != 0 {
        if buf.len() < 9 {
            return Ok(None);
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&buf[1..9]);
        (9, u64::from_be_bytes(s))
    } else {
        if buf.len() < 2 {
            return Ok(None);
        }
        (2, u64::from(buf[1]))
    };
    if size > MAX_FRAME {
        return Err(ZmtpError::FrameTooLarge(size));
    }
    let size = size as usize;
    if buf.len() < header + size {
        return Ok(None);
    }
    buf.advance(header);
    let body = buf.split_to(size).freeze();
    Ok(Some(Frame { more: flags & FLAG_MORE != 0, command: flags & FLAG_COMMAND != 0, body }))
}

/// A connected, handshaken ZMTP socket.
#[derive(Debug)]
pub struct Socket {
    stream: TcpStream,
    kind: SocketType,
    buf: BytesMut,
    parts: Vec<Bytes>,
}

impl Socket {
    /// Connects to `addr` and performs the greeting and `READY` handshake; a `SUB` then subscribes
    /// to every topic.
    pub async fn connect(addr: std::net::SocketAddr, kind: SocketType) -> Result<Self, ZmtpError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Self::handshake(stream, kind).await
    }

    /// Performs the handshake on an already connected stream.
    pub async fn handshake(mut stream: TcpStream, kind: SocketType) -> Result<Self, ZmtpError> {
        stream.write_all(&greeting()).await?;
        let mut g = [0u8; 64];
        stream.read_exact(&mut g).await?;
        check_greeting(&g)?;
        stream.write_all(&ready_command(kind)).await?;
        let mut s = Socket { stream, kind, buf: BytesMut::with_capacity(8192), parts: Vec::new() };
        let frame = s.next_frame().await?;
        if !frame.command {
            return Err(ZmtpError::BadCommand("expected READY, got a message frame".into()));
        }
        let (name, data) = parse_command(&frame.body)?;
        match name {
            "READY" => {
                let peer = parse_properties(data)?
                    .into_iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("Socket-Type"))
                    .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
                    .unwrap_or_default();
                if !kind.accepts(&peer) {
                    return Err(ZmtpError::SocketType { ours: kind.name(), peer });
                }
            }
            "ERROR" => return Err(ZmtpError::Peer(error_reason(data))),
            other => return Err(ZmtpError::BadCommand(format!("expected READY, got {other}"))),
        }
        if kind == SocketType::Sub {
            s.send(&[&[1u8][..]]).await?;
        }
        Ok(s)
    }

    /// The socket type.
    pub fn kind(&self) -> SocketType {
        self.kind
    }

    /// Sends a multipart message.
    pub async fn send<B: AsRef<[u8]>>(&mut self, frames: &[B]) -> Result<(), ZmtpError> {
        self.stream.write_all(&encode_message(frames)).await?;
        Ok(())
    }

    /// Receives the next complete message. Cancel-safe: a partly received message stays buffered
    /// for the next call.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>, ZmtpError> {
        loop {
            let frame = self.next_frame().await?;
            if frame.command {
                self.on_command(&frame.body).await?;
                continue;
            }
            self.parts.push(frame.body);
            if !frame.more {
                return Ok(std::mem::take(&mut self.parts));
            }
        }
    }

    async fn on_command(&mut self, body: &[u8]) -> Result<(), ZmtpError> {
        let (name, data) = parse_command(body)?;
        match name {
            "PING" => {
                // PING: TTL (2 bytes) then up to 16 bytes of context, echoed in PONG.
                let ctx = data.get(2..).unwrap_or_default();
                let ctx = &ctx[..ctx.len().min(16)];
                self.stream.write_all(&encode_command("PONG", ctx)).await?;
            }
            "ERROR" => return Err(ZmtpError::Peer(error_reason(data))),
            other => tracing::debug!(command = other, "ignoring zmtp command"),
        }
        Ok(())
    }

    async fn next_frame(&mut self) -> Result<Frame, ZmtpError> {
        loop {
            if let Some(f) = decode_frame(&mut self.buf)? {
                return Ok(f);
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                // Doubling growth: a large frame needs O(log n) reallocations.
                self.buf.reserve(self.buf.len().max(8192));
            }
            let n = self.stream.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(ZmtpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }
}

fn error_reason(data: &[u8]) -> String {
    match data.split_first() {
        Some((&n, rest)) => {
            String::from_utf8_lossy(&rest[..usize::from(n).min(rest.len())]).into_owned()
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn decode_all(bytes: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(f) = decode_frame(&mut buf).unwrap() {
            out.push(f);
        }
        assert!(buf.is_empty());
        out
    }

    #[test]
    fn greeting_is_zmtp_3_0_null() {
        let g = greeting();
        assert_eq!(g.len(), 64);
        assert_eq!((g[0], g[9], g[10], g[11]), (0xFF, 0x7F, 3, 0));
        assert_eq!(&g[12..17], b"NULL\0");
        check_greeting(&g).unwrap();
    }

    #[test]
    fn bad_greetings_are_typed_errors() {
        let mut g = greeting();
        g[0] = b'G';
        assert!(matches!(check_greeting(&g), Err(ZmtpError::BadGreeting(_))));
        let mut g = greeting();
        g[10] = 2;
        assert!(matches!(check_greeting(&g), Err(ZmtpError::BadGreeting(_))));
        let mut g = greeting();
        g[12..17].copy_from_slice(b"PLAIN");
        assert!(matches!(check_greeting(&g), Err(ZmtpError::Mechanism(m)) if m == "PLAIN"));
        // A 3.1 peer (libzmq 4.3) is fine.
        let mut g = greeting();
        g[11] = 1;
        check_greeting(&g).unwrap();
    }

    #[test]
    fn short_and_long_frames() {
        let mut out = Vec::new();
        encode_frame(&mut out, b"abc", true, false);
        assert_eq!(out, [0x01, 3, b'a', b'b', b'c']);
        let big = vec![7u8; 300];
        let mut out = Vec::new();
        encode_frame(&mut out, &big, false, false);
        assert_eq!(out[0], 0x02);
        assert_eq!(&out[1..9], &300u64.to_be_bytes());
        assert_eq!(decode_all(&out)[0].body.len(), 300);
    }

    #[test]
    fn ready_command_round_trips() {
        let bytes = ready_command(SocketType::Dealer);
        let f = &decode_all(&bytes)[0];
        assert!(f.command && !f.more);
        let (name, data) = parse_command(&f.body).unwrap();
        assert_eq!(name, "READY");
        assert_eq!(
            parse_properties(data).unwrap(),
            vec![("Socket-Type".to_string(), b"DEALER".to_vec())]
        );
    }

    #[test]
    fn oversize_and_bad_flags_are_errors() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0x02]);
        buf.extend_from_slice(&(MAX_FRAME + 1).to_be_bytes());
        assert!(matches!(decode_frame(&mut buf), Err(ZmtpError::FrameTooLarge(_))));
        let mut buf = BytesMut::from(&[0x80u8, 0][..]);
        assert!(matches!(decode_frame(&mut buf), Err(ZmtpError::BadFlags(0x80))));
    }

    #[test]
    fn partial_frames_wait_for_more() {
        let msg = encode_message(&[b"hello".as_slice(), b"world".as_slice()]);
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        for b in msg {
            buf.extend_from_slice(&[b]);
            if let Some(f) = decode_frame(&mut buf).unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert!(frames[0].more && !frames[1].more);
    }

    proptest! {
        #[test]
        fn messages_round_trip(frames in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..700), 1..6)) {
            let bytes = encode_message(&frames);
            let decoded = decode_all(&bytes);
            prop_assert_eq!(decoded.len(), frames.len());
            for (i, (d, f)) in decoded.iter().zip(&frames).enumerate() {
                prop_assert_eq!(&d.body[..], &f[..]);
                prop_assert_eq!(d.more, i + 1 < frames.len());
                prop_assert!(!d.command);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(f)) = decode_frame(&mut buf) {
                if f.command
                    && let Ok((_, data)) = parse_command(&f.body)
                {
                    let _ = parse_properties(data);
                }
            }
            let _ = parse_properties(&bytes);
            let _ = parse_command(&bytes);
            if bytes.len() >= 64 {
                let mut g = [0u8; 64];
                g.copy_from_slice(&bytes[..64]);
                let _ = check_greeting(&g);
            }
        }
    }
}
