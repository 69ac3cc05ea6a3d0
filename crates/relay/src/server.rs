//! The relay's server side: accepts connections, checks each header and pipes it to the
//! sandbox's port that the node's runtime dials.
//!
//! Expected flow of one connection (each in its own task):
//!
//! 1. Read the header, at most [`MAX_HEADER`] bytes within
//!    [`ServerConfig::handshake_timeout`]; bytes that are not the start of a header are refused
//!    at once.
//! 2. Check the version, then the token; only then parse the id and the port.
//! 3. Dial through [`Runtime::connect`], within [`ServerConfig::connect_timeout`], and answer.
//! 4. After `OK`, forward any bytes the client sent past its header, then splice both ways
//!    until both directions have ended.
//!
//! Shutdown: [`RelayServer::serve`] stops accepting when its shutdown future completes, then
//! waits for open connections to end for at most [`ServerConfig::drain_timeout`]; connections
//! still open then are closed. A relay connection carries anything (an envd stream, a WebSocket,
//! a long download), so it is not ours to wait on forever: a node agent being replaced must exit.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oka_runtime_api::{Runtime, RuntimeError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::activity::{Activity, PipeActivity};
use crate::metrics::{Counted, Outcome, RelayMetrics};
use crate::token::RelayToken;
use crate::wire::{self, MAX_HEADER, Status, WireError};

/// The server's timeouts.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How long a peer may take to send its whole header, counted from the accept: bounds what a
    /// slow peer (slowloris) holds.
    pub handshake_timeout: Duration,
    /// How long the runtime may take to dial the sandbox's port.
    pub connect_timeout: Duration,
    /// How long [`RelayServer::serve`] waits, after shutdown, for open connections to end before
    /// closing them.
    pub drain_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// The relay's server: one per node agent, over the runtime that runs the node's sandboxes.
#[derive(Clone)]
pub struct RelayServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RelayServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayServer").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

struct Inner {
    runtime: Arc<dyn Runtime>,
    token: RelayToken,
    config: ServerConfig,
    metrics: RelayMetrics,
    /// Refused peers are logged at warn, at most once a second, so a scanner cannot flood the log.
    refusals: WarnLimiter,
    /// The last traffic of each sandbox port.
    activity: Arc<Activity>,
}

impl RelayServer {
    /// A server that dials through `runtime` for peers that present `token`.
    pub fn new(runtime: Arc<dyn Runtime>, token: RelayToken, config: ServerConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime,
                token,
                config,
                metrics: RelayMetrics::default(),
                refusals: WarnLimiter::new(Duration::from_secs(1)),
                activity: Arc::default(),
            }),
        }
    }

    /// The server's series, to register into the process's registry.
    /// When traffic last flowed to each sandbox port through this relay (activity probes).
    pub fn activity(&self) -> Arc<Activity> {
        Arc::clone(&self.inner.activity)
    }

    /// The relay's series.
    pub fn metrics(&self) -> &RelayMetrics {
        &self.inner.metrics
    }

    /// Accepts connections on `listener` until `shutdown` completes, then drains (see the module
    /// documentation) and returns. Accept errors (too many open files) are logged and retried
    /// after a pause, never fatal: the relay is the node's only way in.
    pub async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let inner = Arc::clone(&self.inner);
                        tasks.spawn(async move { inner.handle(stream, peer).await });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "relay accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                // Reap finished connections so the set holds only open ones.
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => log_panic(joined),
            }
        }
        drop(listener);
        let open = tasks.len();
        if open == 0 {
            return;
        }
        tracing::info!(open, "relay stopped accepting; draining open connections");
        let drained = tokio::time::timeout(self.inner.config.drain_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                log_panic(joined);
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                open = tasks.len(),
                "relay connections still open after the drain timeout; closing them"
            );
            tasks.shutdown().await;
        }
    }
}

fn log_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(%error, "relay connection task panicked");
    }
}

/// Why no header was read.
enum ReadError {
    /// The peer closed (or reset) before a whole header: a TCP health check, or a client gone.
    Closed,
    /// Not a header (the first bytes, or no line end within the bound).
    Wire(WireError),
}

impl Inner {
    async fn handle(&self, mut client: TcpStream, peer: SocketAddr) {
        let _active = self.metrics.active();
        // Relayed traffic is interactive (envd calls, terminals): no Nagle delay on either side.
        let _ = client.set_nodelay(true);
        let mut buf = [0u8; MAX_HEADER];
        let read =
            tokio::time::timeout(self.config.handshake_timeout, read_header(&mut client, &mut buf))
                .await;
        let (line_len, filled) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(ReadError::Closed)) => {
                self.metrics.record(Outcome::Closed);
                return;
            }
            Ok(Err(ReadError::Wire(error))) => {
                tracing::debug!(%peer, %error, "relay header refused");
                return self.refuse(client, Outcome::BadRequest, &error.to_string()).await;
            }
            Err(_) => {
                tracing::debug!(%peer, "relay header not received in time");
                let message =
                    format!("header not received within {:?}", self.config.handshake_timeout);
                return self.refuse(client, Outcome::Timeout, &message).await;
            }
        };
        let raw = match wire::parse_request(&buf[..line_len - 1]) {
            Ok(raw) => raw,
            Err(error) => {
                if let WireError::UnsupportedVersion(_) = error {
                    self.warn_refused(peer, "unsupported protocol version");
                }
                return self.refuse(client, Outcome::BadRequest, &error.to_string()).await;
            }
        };
        if !self.token.matches(raw.token) {
            self.warn_refused(peer, "wrong token");
            return self.refuse(client, Outcome::Unauthorized, "wrong token").await;
        }
        let (id, port) = match raw.target() {
            Ok(target) => target,
            Err(error) => {
                return self.refuse(client, Outcome::BadRequest, &error.to_string()).await;
            }
        };
        let dialed =
            tokio::time::timeout(self.config.connect_timeout, self.runtime.connect(&id, port))
                .await;
        let upstream = match dialed {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(error)) => {
                let outcome = match error {
                    RuntimeError::PortClosed { .. } => Outcome::PortClosed,
                    RuntimeError::NotFound(_) | RuntimeError::InvalidState { .. } => Outcome::Gone,
                    _ => {
                        tracing::warn!(%peer, sandbox = %id, port, %error, "relay dial failed");
                        Outcome::Error
                    }
                };
                return self.refuse(client, outcome, &error.to_string()).await;
            }
            Err(_) => {
                tracing::warn!(%peer, sandbox = %id, port, "relay dial timed out");
                let message = format!("dial timed out after {:?}", self.config.connect_timeout);
                return self.refuse(client, Outcome::Error, &message).await;
            }
        };
        let _ = upstream.set_nodelay(true);
        self.metrics.record(Outcome::Ok);
        if client.write_all(wire::OK).await.is_err() {
            return;
        }
        let pipe = Arc::new(PipeActivity::new(Arc::clone(&self.activity), id.to_string(), port));
        let mut client = Counted {
            inner: client,
            read: self.metrics.bytes_in.clone(),
            activity: Arc::clone(&pipe),
        };
        let mut upstream =
            Counted { inner: upstream, read: self.metrics.bytes_out.clone(), activity: pipe };
        // Bytes the client sent after its header, before our answer, are the sandbox's.
        let early = &buf[line_len..filled];
        if !early.is_empty() {
            self.metrics.bytes_in.inc_by(early.len() as u64);
            if upstream.inner.write_all(early).await.is_err() {
                return;
            }
        }
        // Half-close: `copy_bidirectional` shuts down the writing half of one side when the
        // other reaches end of file, and returns when both directions are done.
        if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(%peer, sandbox = %id, port, %error, "relay pipe ended with an error");
        }
    }

    /// Answers an error, counts it and closes the connection gracefully.
    async fn refuse(&self, mut client: TcpStream, outcome: Outcome, message: &str) {
        self.metrics.record(outcome);
        let status = match outcome {
            Outcome::Unauthorized => Status::Unauthorized,
            Outcome::PortClosed => Status::PortClosed,
            Outcome::Gone => Status::Gone,
            Outcome::BadRequest | Outcome::Timeout => Status::BadRequest,
            Outcome::Ok | Outcome::Closed | Outcome::Error => Status::Error,
        };
        // The answer is one small write into an empty send buffer; the bound only matters for a
        // peer that stopped reading on purpose.
        let bound = Duration::from_secs(1);
        let answer = wire::encode_answer(status, message);
        if tokio::time::timeout(bound, client.write_all(&answer)).await.is_err() {
            return;
        }
        let _ = client.shutdown().await;
        // Closing a socket with unread bytes sends a reset, which can destroy our answer before
        // the peer reads it; read (and drop) what the peer still sends, briefly and boundedly.
        let mut sink = [0u8; 4096];
        let linger = async {
            let mut total = 0;
            while total < 64 * 1024 {
                match client.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        };
        let _ = tokio::time::timeout(bound, linger).await;
    }

    fn warn_refused(&self, peer: SocketAddr, why: &str) {
        if let Some(suppressed) = self.refusals.allow() {
            tracing::warn!(%peer, suppressed, "relay refused a peer: {why}");
        }
    }
}

/// Reads into `buf` until a line end; returns the line's length (its `\n` included) and how
/// many bytes were read in all (the client may have sent more after the line).
async fn read_header(
    client: &mut TcpStream,
    buf: &mut [u8; MAX_HEADER],
) -> Result<(usize, usize), ReadError> {
    let mut filled = 0;
    loop {
        let n = match client.read(&mut buf[filled..]).await {
            Ok(0) | Err(_) => return Err(ReadError::Closed),
            Ok(n) => n,
        };
        let scanned = filled;
        filled += n;
        if !wire::could_be_header(&buf[..filled]) {
            return Err(ReadError::Wire(WireError::NotRelay));
        }
        if let Some(at) = buf[scanned..filled].iter().position(|&b| b == b'\n') {
            return Ok((scanned + at + 1, filled));
        }
        if filled == MAX_HEADER {
            return Err(ReadError::Wire(WireError::TooLong));
        }
    }
}

/// Lets one event through per interval and counts the ones it held back, without a lock.
struct WarnLimiter {
    start: Instant,
    interval_ms: u64,
    /// Milliseconds since `start` before which nothing is let through.
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl WarnLimiter {
    fn new(interval: Duration) -> Self {
        Self {
            start: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last one)` if this event may be logged.
    fn allow(&self) -> Option<u64> {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warn_limiter_lets_one_through_per_interval_and_counts_the_rest() {
        let limiter = WarnLimiter::new(Duration::from_secs(3600));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
        assert_eq!(limiter.allow(), None);
        let open = WarnLimiter::new(Duration::ZERO);
        assert_eq!(open.allow(), Some(0));
        assert_eq!(open.allow(), Some(0));
    }
}
