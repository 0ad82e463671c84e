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
pub struct Limit(Arc<tokio::sync::Semaphore>, usize);

impl Limit {
    pub fn new(connections: usize) -> Self {
        Self(
            Arc::new(tokio::sync::Semaphore::new(connections)),
            connections,
        )
    }

    /// Whether the port is nearly full (fewer than an eighth of its connections left): a
    /// connection idle between requests is then closed at its first quiet look rather than
    /// after a whole timeout, so a busy port makes room for new callers before it runs out.
    pub fn pressed(&self) -> bool {
        self.0.available_permits() < self.1.div_ceil(8)
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
    /// On a `pressed` port, a connection that has been answered and is idle between
    /// requests is overdue at its first quiet look (one that has not sent a request yet
    /// still has the whole timeout: its first request may be on its way).
    pub fn overdue(&mut self, activity: &Activity, pressed: bool) -> bool {
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
        let served = activity.streams.load(Ordering::Relaxed) > 0;
        let idle_limit = if pressed && served { 1 } else { WATCH_TICKS };
        self.idle_ticks >= idle_limit || self.head_ticks > WATCH_TICKS
    }

    /// One tick, for a connection that only speaks HTTP/2 (the gRPC port): whether it has
    /// gone a whole timeout with no request in flight and none begun. Reads and writes do
    /// not count here: keep-alive PINGs and a preface with nothing after it would otherwise
    /// keep a connection that asks nothing open for ever.
    /// On a `pressed` port, one that has made calls and is quiet now is unused at its first
    /// quiet look.
    pub fn unused(&mut self, activity: &Activity, pressed: bool) -> bool {
        let streams = activity.streams.load(Ordering::Relaxed);
        let quiet = streams == self.streams && activity.in_flight.load(Ordering::Relaxed) == 0;
        self.quiet_ticks = if quiet { self.quiet_ticks + 1 } else { 0 };
        self.streams = streams;
        let quiet_limit = if pressed && streams > 0 {
            1
        } else {
            WATCH_TICKS
        };
        self.quiet_ticks >= quiet_limit
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

/// Live streams one user may hold open on one instance, over all their sessions: a few
/// tabs of the overview and the inspector.
pub const STREAMS_PER_USER: usize = 8;

/// Live streams one instance holds open at most, over all users. Each view's data is read
/// once a second however many follow it ([`LatestReads`]), so this bounds the streams'
/// memory and writes, not Redis's load.
pub const MAX_LIVE_STREAMS: usize = 64;

/// The live streams each user holds open on this instance, and their total.
#[derive(Default)]
pub struct StreamSlots(std::sync::Mutex<(std::collections::HashMap<String, usize>, usize)>);

/// Why a stream was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamsFull {
    /// This user holds [`STREAMS_PER_USER`] already.
    User,
    /// The instance holds [`MAX_LIVE_STREAMS`] already.
    Instance,
}

/// One stream's place, given back when the stream ends (the client went away, the session
/// ended, the server drains).
pub struct StreamSlot {
    slots: std::sync::Arc<StreamSlots>,
    user: String,
}

impl StreamSlots {
    /// A place for one more stream of `user`, if they and the instance have room.
    pub fn take(self: &std::sync::Arc<Self>, user: &str) -> Result<StreamSlot, StreamsFull> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if open.1 >= MAX_LIVE_STREAMS {
            return Err(StreamsFull::Instance);
        }
        let n = open.0.entry(user.to_owned()).or_default();
        if *n >= STREAMS_PER_USER {
            return Err(StreamsFull::User);
        }
        *n += 1;
        open.1 += 1;
        Ok(StreamSlot {
            slots: self.clone(),
            user: user.to_owned(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.0.lock().unwrap_or_else(|e| e.into_inner());
        open.1 = open.1.saturating_sub(1);
        if let Some(n) = open.0.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                open.0.remove(&self.user);
            }
        }
    }
}

/// The latest read of each live view (an overview filter, an inspected identifier), shared
/// by every stream that follows it: a view is read at most once per `fresh`, however many
/// tabs follow it, and two streams asking at once wait for one read.
#[derive(Default)]
pub struct LatestReads {
    views: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<View>>>,
}

type View = tokio::sync::Mutex<Option<(std::time::Instant, Arc<dyn std::any::Any + Send + Sync>)>>;

impl LatestReads {
    /// The read of `view` made within `fresh`, or a new one by `read`.
    pub async fn get<T, F>(&self, view: &str, fresh: std::time::Duration, read: F) -> Arc<T>
    where
        T: Send + Sync + 'static,
        F: std::future::Future<Output = T>,
    {
        let slot = {
            let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
            // Views nobody followed for a while are forgotten.
            if views.len() > 256 {
                views.retain(|_, v| {
                    v.try_lock()
                        .map(|v| v.as_ref().is_some_and(|(at, _)| at.elapsed() < fresh * 10))
                        .unwrap_or(true)
                });
            }
            views.entry(view.to_owned()).or_default().clone()
        };
        let mut latest = slot.lock().await;
        if let Some((at, data)) = latest.as_ref()
            && at.elapsed() < fresh
            && let Ok(data) = data.clone().downcast::<T>()
        {
            return data;
        }
        let data = Arc::new(read.await);
        *latest = Some((std::time::Instant::now(), data.clone()));
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_capped_per_user_and_overall() {
        let slots = Arc::new(StreamSlots::default());
        let mine: Vec<_> = (0..STREAMS_PER_USER)
            .map(|_| slots.take("bob").unwrap())
            .collect();
        assert_eq!(slots.take("bob").err(), Some(StreamsFull::User));
        drop(mine);
        let all: Vec<_> = (0..MAX_LIVE_STREAMS)
            .map(|i| {
                slots
                    .take(&format!("viewer{}", i / STREAMS_PER_USER))
                    .unwrap()
            })
            .collect();
        assert_eq!(slots.take("carol").err(), Some(StreamsFull::Instance));
        drop(all);
        assert!(slots.take("carol").is_ok());
    }

    /// On a nearly full port a connection idle after its requests goes at its first quiet
    /// look; one that has not sent a request yet keeps the whole timeout.
    #[test]
    fn a_pressed_port_closes_connections_idle_between_requests_first() {
        let fresh = Arc::new(Activity::default());
        let mut watch = Watch::default();
        for _ in 0..WATCH_TICKS - 1 {
            assert!(!watch.overdue(&fresh, true));
        }
        assert!(watch.overdue(&fresh, true), "a whole timeout");
        let served = Arc::new(Activity::default());
        drop(InFlight::start(&served));
        let (mut pressed, mut calm) = (Watch::default(), Watch::default());
        assert!(
            !pressed.overdue(&served, true),
            "its answer was just written"
        );
        assert!(pressed.overdue(&served, true), "one quiet look");
        for _ in 0..WATCH_TICKS {
            assert!(!calm.overdue(&served, false));
        }
        assert!(calm.overdue(&served, false));
    }

    #[tokio::test]
    async fn a_view_is_read_once_for_all_its_followers() {
        let reads = LatestReads::default();
        let count = std::sync::atomic::AtomicUsize::new(0);
        let read = || async {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            7u32
        };
        let fresh = std::time::Duration::from_secs(60);
        for _ in 0..30 {
            assert_eq!(*reads.get("overview", fresh, read()).await, 7);
        }
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
        reads.get("identifier:bob", fresh, read()).await;
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
