//! The relay's client side: one handshake, then the caller owns a plain [`TcpStream`] to the
//! sandbox's port.
//!
//! The client reads exactly the three bytes of `OK\n` before handing the stream over, so a
//! sandbox that speaks first loses nothing; any other answer is an error line after which the
//! server sends nothing more.

use std::io;
use std::time::Duration;

use oka_runtime_api::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::token::RelayToken;
use crate::wire::{self, MAX_ANSWER, Status};

/// Why [`RelayClient::connect`] failed. The variants line up with what the gateway answers when
/// it dials locally: a closed port, a sandbox without a running instance, anything else.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Nothing listens on the port inside the sandbox: E2B's "port is not open".
    #[error("port {port} is not open")]
    PortClosed {
        /// The port asked for.
        port: u16,
    },
    /// The node has no running instance of the sandbox (none, stopped or hibernated); the node's
    /// message says which.
    #[error("the sandbox has no running instance: {0}")]
    SandboxGone(String),
    /// The node refused the token: the client's and the node's configuration differ.
    #[error("the relay refused the token")]
    Unauthorized,
    /// The node's runtime failed to dial for another reason; its message. Retrying may help,
    /// the request itself was fine.
    #[error("the relay could not dial: {0}")]
    Remote(String),
    /// The two sides do not understand each other: a malformed header, a version the node does
    /// not speak, or an answer that is not `OKA-RELAY/1` (not a relay at that address).
    #[error("relay protocol error: {0}")]
    Protocol(String),
    /// Connecting to, writing to or reading from the relay failed.
    #[error("relay connection failed: {0}")]
    Io(#[from] io::Error),
    /// The connect and handshake did not finish within [`ClientConfig::timeout`].
    #[error("relay handshake timed out")]
    Timeout,
}

/// The client's settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long the TCP connect and the handshake (the node's own dial included) may take
    /// together. Longer than the server's dial timeout, so the node's answer arrives first.
    pub timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(15) }
    }
}

/// Opens connections to sandbox ports through node relays. Cheap to clone and share.
#[derive(Clone, Debug)]
pub struct RelayClient {
    token: RelayToken,
    config: ClientConfig,
}

impl RelayClient {
    /// A client that presents `token`.
    pub fn new(token: RelayToken, config: ClientConfig) -> Self {
        Self { token, config }
    }

    /// Connects to `port` of sandbox `id` (its runtime id) through the relay at `relay` (a
    /// [`std::net::SocketAddr`], or a `"host:port"` string resolved here). The stream returned is
    /// past the handshake: every byte read from it is the sandbox's.
    pub async fn connect(
        &self,
        relay: impl ToSocketAddrs,
        id: &SandboxId,
        port: u16,
    ) -> Result<TcpStream, RelayError> {
        let header = wire::encode_request(&self.token, id, port);
        tokio::time::timeout(self.config.timeout, handshake(relay, &header, port))
            .await
            .map_err(|_| RelayError::Timeout)?
    }
}

async fn handshake(
    relay: impl ToSocketAddrs,
    header: &[u8],
    port: u16,
) -> Result<TcpStream, RelayError> {
    let mut stream = TcpStream::connect(relay).await?;
    stream.set_nodelay(true)?;
    stream.write_all(header).await?;
    let mut head = [0u8; 3];
    read_answer_start(&mut stream, &mut head).await?;
    if &head == wire::OK {
        return Ok(stream);
    }
    if &head != wire::ERR {
        return Err(RelayError::Protocol(format!(
            "not an OKA-RELAY answer: {:?}",
            String::from_utf8_lossy(&head)
        )));
    }
    // An error line: the server closes after it, so reading on cannot take a sandbox's byte.
    let mut rest = Vec::with_capacity(64);
    let mut chunk = [0u8; 128];
    loop {
        let n = stream.read(&mut chunk).await?;
        rest.extend_from_slice(&chunk[..n]);
        if let Some(end) = rest.iter().position(|&b| b == b'\n') {
            rest.truncate(end);
            break;
        }
        if n == 0 || rest.len() >= MAX_ANSWER {
            break;
        }
    }
    let (status, code, message) = wire::parse_error_answer(&rest);
    Err(match status {
        Some(Status::PortClosed) => RelayError::PortClosed { port },
        Some(Status::Gone) => RelayError::SandboxGone(message),
        Some(Status::Unauthorized) => RelayError::Unauthorized,
        Some(Status::BadRequest) => RelayError::Protocol(message),
        Some(Status::Error) => RelayError::Remote(message),
        Some(Status::Ok) | None => {
            RelayError::Protocol(format!("unknown answer {code}: {message}"))
        }
    })
}

/// Reads the answer's first three bytes, exactly: enough to tell `OK\n` from `ERR`.
async fn read_answer_start(stream: &mut TcpStream, head: &mut [u8; 3]) -> Result<(), RelayError> {
    match stream.read_exact(head).await {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
            Err(RelayError::Protocol("the relay closed the connection without answering".into()))
        }
        Err(error) => Err(RelayError::Io(error)),
    }
}
