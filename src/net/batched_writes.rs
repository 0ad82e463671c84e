//! Answers of one HTTP/2 connection written together: the checks that one Redis call
//! answers finish together, each in its own stream's task, and without this each answer
//! went out in a write of its own, a loopback write costing as much as the rest of the
//! check (benches/DESIGN.md).
//!
//! [`BatchedWrites`] wraps a connection's socket. When the connection has something to
//! write, its first attempt yields once instead: the task asks to be polled again and lets
//! the tasks already waiting to run go first (tokio puts a task that wakes itself at the
//! back of the queue). Those are the other streams whose answers are ready; they add their
//! frames, and the retry writes them all in one call. Nothing waits on a timer, and an idle
//! server writes at once after one turn of the scheduler.
//!
//! Only HTTP/2 gains: an HTTP/1.1 connection has one answer in flight, so there is nothing
//! to batch. The HTTP port, which serves both, turns batching on when a connection opens
//! with the HTTP/2 preface; the gRPC port is HTTP/2 only.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What an HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A socket whose writes wait one turn of the scheduler, so that answers ready together go
/// out together.
pub struct BatchedWrites<IO> {
    io: IO,
    /// Batching is on (HTTP/2).
    on: bool,
    /// Whether to look at the first bytes read for the HTTP/2 preface.
    sniff: bool,
    /// The current write already yielded once: the next attempt writes.
    yielded: bool,
}

impl<IO> BatchedWrites<IO> {
    /// For a port that speaks only HTTP/2 (gRPC).
    pub fn http2(io: IO) -> Self {
        Self {
            io,
            on: true,
            sniff: false,
            yielded: false,
        }
    }

    /// For a port that speaks HTTP/1.1 and HTTP/2: batches when the first bytes read are
    /// the HTTP/2 preface (at least its first four).
    pub fn sniffing(io: IO) -> Self {
        Self {
            io,
            on: false,
            sniff: true,
            yielded: false,
        }
    }

    /// Whether this attempt to write should yield first (and, if so, arranges the retry).
    fn yield_first(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.on || self.yielded {
            return false;
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        true
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for BatchedWrites<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.sniff && buf.filled().len() > before {
            // "PRI " starts no HTTP/1.1 request; a first read too short to tell (a client
            // trickling its request line) leaves batching off, which only forgoes batching.
            let first = &buf.filled()[before..];
            let n = first.len().min(PREFACE.len());
            let on = n >= 4 && first[..n] == PREFACE[..n];
            self.on = on;
            self.sniff = false;
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for BatchedWrites<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.yield_first(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.yield_first(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        if polled.is_ready() {
            // Everything written: the next write yields again.
            self.yielded = false;
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for BatchedWrites<tokio::net::TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::Connected::connect_info(&self.io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A write yields once, then goes through; after a flush the next write yields again.
    /// HTTP/1.1 never yields (nor a first read too short to tell); the preface, or a first
    /// piece of it, turns batching on.
    #[tokio::test]
    async fn writes_yield_once_on_http2_only() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut batched = BatchedWrites::http2(a);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            Pin::new(&mut batched)
                .poll_write(&mut cx, b"one")
                .is_pending()
        );
        assert!(matches!(
            Pin::new(&mut batched).poll_write(&mut cx, b"one"),
            Poll::Ready(Ok(3))
        ));
        assert!(Pin::new(&mut batched).poll_flush(&mut cx).is_ready());
        assert!(
            Pin::new(&mut batched)
                .poll_write(&mut cx, b"two")
                .is_pending()
        );
        batched.write_all(b"two").await.unwrap();
        let mut got = [0u8; 6];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"onetwo");

        for (first, on) in [
            (&b"GET / HTTP/1.1\r\n"[..], false),
            (&b"POST /api/v1/check HTTP/1.1\r\n"[..], false),
            (&b"P"[..], false),
            (&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], true),
            (&b"PRI * HT"[..], true),
        ] {
            let (a, mut b) = tokio::io::duplex(1024);
            let mut sniffing = BatchedWrites::sniffing(a);
            b.write_all(first).await.unwrap();
            let mut buf = [0u8; 64];
            let n = sniffing.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], first);
            assert_eq!(
                Pin::new(&mut sniffing)
                    .poll_write(&mut cx, b"x")
                    .is_pending(),
                on,
                "{first:?}"
            );
        }
    }
}
