//! Watching a connection for the timeouts hyper has no timer for: a request's header that
//! takes too long, a connection that sits idle, an HTTP/2 connection that starts no stream.
//! The HTTP port wraps its sockets in [`Watched`] (reads and writes counted); the gRPC
//! port, which only needs to know whether calls come, counts its streams alone. Both tick
//! a [`Watch`], and both cap how many connections they hold open
//! ([`Limit`], as mini-redis does with a semaphore).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

/// What a client may send on one HTTP/2 connection before the server reads it, on either
/// port (hyper's defaults let a connection push 5 MiB): the largest part of what a
/// connection can make the server hold (`config::capacity::PER_CONNECTION`).
pub const CONNECTION_WINDOW: u32 = 256 * 1024;

/// A cap on the connections one listener holds open: a connection accepted past it waits
/// for a permit (the kernel's backlog queues the rest), so memory and file descriptors stay
/// bounded however many clients connect.
#[derive(Clone)]
pub struct Limit(Arc<tokio::sync::Semaphore>);

impl Limit {
    pub fn new(connections: usize) -> Self {
        Self(Arc::new(tokio::sync::Semaphore::new(connections)))
    }

    /// A permit for one more connection, held until it closes.
    pub async fn acquire(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.0
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }
}

/// A port's budget of calls begun whose message (or body) has not been read yet: what a
/// client may make the server hold before it knows anything of the call. A call past it is
/// refused at once rather than queued, so the budget bounds memory, not just throughput.
#[derive(Clone)]
pub struct Pending(Arc<tokio::sync::Semaphore>);

impl Pending {
    pub fn new(calls: usize) -> Self {
        Self(Arc::new(tokio::sync::Semaphore::new(calls)))
    }

    /// A place for one more call until its message is read, if there is one.
    pub fn try_take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let taken = self.0.clone().try_acquire_owned().ok();
        if taken.is_none() {
            metrics::counter!("spillway_calls_refused_total", "reason" => "pending").increment(1);
        }
        taken
    }
}

/// What one connection has been doing, for its watch: a count of its reads and writes,
/// whether bytes of a request's header are waiting (and which header that is), and how many
/// requests are being answered. Counters rather than times: the socket updates them on
/// every read and write, and reading a clock there cost the check path a visible share of
/// its CPU; the watch compares them from one tick to the next instead.
#[derive(Default)]
pub struct Activity {
    /// Reads and writes so far (the connection's task and, over HTTP/2, its streams' tasks
    /// count them).
    io: AtomicU64,
    /// Headers begun so far: bumped by the first byte read while no request was being
    /// answered and none was pending.
    heads: AtomicU64,
    /// Whether the latest header begun has not become a request yet.
    head_pending: std::sync::atomic::AtomicBool,
    in_flight: AtomicU64,
    /// Requests (HTTP/2 streams) begun so far.
    streams: AtomicU64,
}

/// Ticks of the watch per timeout: a connection is closed between one timeout and a
/// quarter more after it went idle or its header began.
pub const WATCH_TICKS: u32 = 4;

impl Activity {
    /// Requests being answered now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn io(&self) {
        self.io.fetch_add(1, Ordering::Relaxed);
    }

    fn read(&self) {
        self.io();
        // Bytes while no request is being answered are the start of the next one's header
        // (a request's body, read while it is answered, is not).
        if self.in_flight.load(Ordering::Relaxed) == 0 && !self.head_pending.load(Ordering::Relaxed)
        {
            self.heads.fetch_add(1, Ordering::Relaxed);
            self.head_pending.store(true, Ordering::Relaxed);
        }
    }

    fn wrote(&self) {
        self.io();
    }
}

/// The watch's memory of a connection between its ticks.
#[derive(Default)]
pub struct Watch {
    io: u64,
    idle_ticks: u32,
    head: u64,
    head_ticks: u32,
    streams: u64,
    quiet_ticks: u32,
}

impl Watch {
    /// One tick (a quarter of the timeout after the last): whether the connection has taken
    /// longer than the timeout to send a request's header, or sat idle (nothing read or
    /// written, no request being answered) that long.
    pub fn overdue(&mut self, activity: &Activity) -> bool {
        let io = activity.io.load(Ordering::Relaxed);
        let quiet = io == self.io && activity.in_flight.load(Ordering::Relaxed) == 0;
        self.idle_ticks = if quiet { self.idle_ticks + 1 } else { 0 };
        self.io = io;
        let head = activity.heads.load(Ordering::Relaxed);
        self.head_ticks = if !activity.head_pending.load(Ordering::Relaxed) {
            0
        } else if head == self.head {
            self.head_ticks + 1
        } else {
            1
        };
        self.head = head;
        // Idle for WATCH_TICKS whole intervals; a header seen pending at WATCH_TICKS + 1
        // ticks began more than WATCH_TICKS intervals ago.
        self.idle_ticks >= WATCH_TICKS || self.head_ticks > WATCH_TICKS
    }

    /// One tick, for a connection that only speaks HTTP/2 (the gRPC port): whether it has
    /// gone a whole timeout with no request in flight and none begun. Reads and writes do
    /// not count here: keep-alive PINGs and a preface with nothing after it would otherwise
    /// keep a connection that asks nothing open for ever.
    pub fn unused(&mut self, activity: &Activity) -> bool {
        let streams = activity.streams.load(Ordering::Relaxed);
        let quiet = streams == self.streams && activity.in_flight.load(Ordering::Relaxed) == 0;
        self.quiet_ticks = if quiet { self.quiet_ticks + 1 } else { 0 };
        self.streams = streams;
        self.quiet_ticks >= WATCH_TICKS
    }
}

/// One request being answered on a connection: from the moment its header is complete
/// (hyper calls the service) until its answer's head is out or it is given up (a streamed
/// body goes on writing, which counts as activity).
pub struct InFlight(Arc<Activity>);

impl InFlight {
    pub fn start(activity: &Arc<Activity>) -> Self {
        activity.head_pending.store(false, Ordering::Relaxed);
        activity.streams.fetch_add(1, Ordering::Relaxed);
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.wrote();
    }
}

/// A connection's socket that tells its [`Activity`] what it reads and writes.
pub struct Watched<IO> {
    pub io: IO,
    pub activity: Arc<Activity>,
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Live streams one session may hold open on one instance: a few tabs of the overview and
/// the inspector. Each costs Redis a gathering a second; 400 of one viewer drove Redis to
/// about 55,700 commands a second.
pub const STREAMS_PER_SESSION: usize = 8;

/// The live streams each session holds open on this instance.
#[derive(Default)]
pub struct StreamSlots(std::sync::Mutex<std::collections::HashMap<String, usize>>);

/// One stream's place, given back when the stream ends (the client went away, the session
/// ended, the server drains).
pub struct StreamSlot {
    slots: std::sync::Arc<StreamSlots>,
    digest: String,
}

impl StreamSlots {
    /// A place for one more stream of the session `digest`, if it has fewer than
    /// [`STREAMS_PER_SESSION`] open.
    pub fn take(self: &std::sync::Arc<Self>, digest: &str) -> Option<StreamSlot> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(digest.to_owned()).or_default();
        if *n >= STREAMS_PER_SESSION {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            slots: self.clone(),
            digest: digest.to_owned(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.digest);
            }
        }
    }
}
