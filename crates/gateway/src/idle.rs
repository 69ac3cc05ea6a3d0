//! An idle timeout around a byte stream: [`IdleIo`] fails a read or write with
//! [`io::ErrorKind::TimedOut`] once nothing has moved in either direction for the timeout.
//!
//! Activity is a timestamp updated on every read or write that moves bytes; the timer is only
//! looked at when the stream would block, and only moved when it fires, so a busy stream pays
//! one clock read per operation and one timer reset per timeout.
//!
//! An upstream connection (into a sandbox) also counts the bytes it moves ([`IdleIo::metered`]):
//! one relaxed atomic addition per read or write, into the gateway's relayed-bytes counters.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Where a metered stream counts its bytes.
#[derive(Debug, Clone)]
pub struct ByteMeter {
    /// Bytes read from the stream.
    pub read: Counter,
    /// Bytes written to it.
    pub written: Counter,
}

/// A stream that times out after `timeout` without traffic.
#[derive(Debug)]
pub struct IdleIo<T> {
    io: T,
    timeout: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    /// The waker the timer was last polled with: while the same task polls again and the
    /// timer has not fired, the timer need not be polled.
    armed: Option<Waker>,
    meter: Option<ByteMeter>,
}

impl<T> IdleIo<T> {
    /// Wraps `io`.
    pub fn new(io: T, timeout: Duration) -> Self {
        let last = Instant::now();
        Self {
            io,
            timeout,
            last,
            timer: Box::pin(tokio::time::sleep_until(last + timeout)),
            armed: None,
            meter: None,
        }
    }

    /// Wraps `io`, counting the bytes read and written into `meter`.
    pub fn metered(io: T, timeout: Duration, meter: ByteMeter) -> Self {
        Self { meter: Some(meter), ..Self::new(io, timeout) }
    }

    fn wrote(&mut self, result: &io::Result<usize>) {
        if let Ok(n) = result
            && *n > 0
        {
            self.last = Instant::now();
            if let Some(meter) = &self.meter {
                meter.written.inc_by(*n as u64);
            }
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Polled when the stream would block: an error once the stream has been idle too long.
    ///
    /// The timer is not moved on traffic: when it fires and the stream was active since, it is
    /// set again from the last activity, so a busy stream resets it once per timeout, not on
    /// every would-block.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.armed.as_ref().is_some_and(|w| w.will_wake(cx.waker())) && !self.timer.is_elapsed()
        {
            return Poll::Pending;
        }
        self.armed = Some(cx.waker().clone());
        loop {
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    let deadline = self.last + self.timeout;
                    if deadline <= Instant::now() {
                        return Poll::Ready(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("idle for {}s", self.timeout.as_secs()),
                        ));
                    }
                    self.timer.as_mut().reset(deadline);
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    this.last = Instant::now();
                    if let Some(meter) = &this.meter {
                        meter.read.inc_by(read as u64);
                    }
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(result) => {
                this.wrote(&result);
                Poll::Ready(result)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                this.wrote(&result);
                Poll::Ready(result)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_stream_times_out_and_traffic_keeps_it_alive() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = IdleIo::new(a, Duration::from_secs(10));
        // Traffic every 6 s keeps it alive past the timeout.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            b.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            a.read_exact(&mut byte).await.unwrap();
        }
        // Then silence: the read fails after 10 s.
        let start = Instant::now();
        let mut byte = [0u8; 1];
        let err = a.read_exact(&mut byte).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_metered_stream_counts_its_bytes() {
        let (a, mut b) = tokio::io::duplex(64);
        let meter = ByteMeter { read: Counter::default(), written: Counter::default() };
        let mut a = IdleIo::metered(a, Duration::from_secs(10), meter.clone());
        a.write_all(b"hello").await.unwrap();
        b.write_all(b"abc").await.unwrap();
        let mut three = [0u8; 3];
        a.read_exact(&mut three).await.unwrap();
        let mut five = [0u8; 5];
        b.read_exact(&mut five).await.unwrap();
        assert_eq!((meter.read.get(), meter.written.get()), (3, 5));
    }
}
