//! The relay server's Prometheus series:
//!
//! - `oka_relay_connections_total{result}`: connections by how their handshake ended (`ok`,
//!   `unauthorized`, `bad_request`, `timeout`, `closed` (the peer left before a whole header:
//!   a TCP health check), `port_closed`, `gone`, `error`);
//! - `oka_relay_active_connections`: connections open now, in handshake or piping;
//! - `oka_relay_bytes_total{direction}`: bytes relayed, `in` (into sandboxes) and `out`.
//!
//! Every counter a connection touches is fetched once when the metrics are made (no label lookup
//! per connection), and bytes are counted as they are read, one atomic addition per read, so a
//! long-lived pipe shows its traffic while it is open, not only when it closes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// How the handshake ended.
    pub result: &'static str,
}

/// `direction`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `in` (into sandboxes) or `out` (out of sandboxes).
    pub direction: &'static str,
}

/// How a connection's handshake ended; the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Unauthorized,
    BadRequest,
    Timeout,
    Closed,
    PortClosed,
    Gone,
    Error,
}

impl Outcome {
    const ALL: [Outcome; 8] = [
        Self::Ok,
        Self::Unauthorized,
        Self::BadRequest,
        Self::Timeout,
        Self::Closed,
        Self::PortClosed,
        Self::Gone,
        Self::Error,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Unauthorized => "unauthorized",
            Self::BadRequest => "bad_request",
            Self::Timeout => "timeout",
            Self::Closed => "closed",
            Self::PortClosed => "port_closed",
            Self::Gone => "gone",
            Self::Error => "error",
        }
    }
}

/// The relay server's series; [`RelayServer::metrics`](crate::RelayServer::metrics) gives the
/// server's, to [`register`](Self::register).
#[derive(Debug)]
pub struct RelayMetrics {
    connections: Family<ResultLabels, Counter>,
    /// Indexed like [`Outcome::ALL`].
    by_outcome: [Counter; Outcome::ALL.len()],
    active: Gauge,
    bytes: Family<DirectionLabels, Counter>,
    pub(crate) bytes_in: Counter,
    pub(crate) bytes_out: Counter,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        let connections = Family::<ResultLabels, Counter>::default();
        let bytes = Family::<DirectionLabels, Counter>::default();
        Self {
            by_outcome: Outcome::ALL
                .map(|o| connections.get_or_create_owned(&ResultLabels { result: o.label() })),
            connections,
            active: Gauge::default(),
            bytes_in: bytes.get_or_create_owned(&DirectionLabels { direction: "in" }),
            bytes_out: bytes.get_or_create_owned(&DirectionLabels { direction: "out" }),
            bytes,
        }
    }
}

impl RelayMetrics {
    /// Registers the relay's families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "oka_relay_connections",
            "Relay connections, by how their handshake ended",
            self.connections.clone(),
        );
        registry.register(
            "oka_relay_active_connections",
            "Relay connections open now, in handshake or piping",
            self.active.clone(),
        );
        registry.register(
            "oka_relay_bytes",
            "Bytes relayed, into sandboxes (in) and out of them (out)",
            self.bytes.clone(),
        );
    }

    pub(crate) fn record(&self, outcome: Outcome) {
        // `ALL` lists every variant in declaration order.
        self.by_outcome[outcome as usize].inc();
    }

    /// Counts a connection as active until the guard is dropped (a panic included).
    pub(crate) fn active(&self) -> ActiveGuard {
        self.active.inc();
        ActiveGuard(self.active.clone())
    }
}

/// Decrements `oka_relay_active_connections` when dropped.
pub(crate) struct ActiveGuard(Gauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A stream whose reads are counted: everything read from one side of a pipe is written to the
/// other, so counting reads counts the relayed bytes, once.
pub(crate) struct Counted<S> {
    pub(crate) inner: S,
    pub(crate) read: Counter,
    /// Where the pipe's traffic is recorded as the sandbox's activity.
    pub(crate) activity: std::sync::Arc<crate::activity::PipeActivity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let read = buf.filled().len() - before;
            if read > 0 {
                self.read.inc_by(read as u64);
                self.activity.saw_traffic();
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_index_their_own_counter() {
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, i);
        }
        let metrics = RelayMetrics::default();
        metrics.record(Outcome::Gone);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("oka_relay_connections_total{result=\"gone\"} 1"), "{text}");
        assert!(text.contains("oka_relay_active_connections 0"), "{text}");
        assert!(text.contains("oka_relay_bytes_total{direction=\"in\"} 0"), "{text}");
    }
}
