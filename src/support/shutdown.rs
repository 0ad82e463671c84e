//! The shutdown of one server: a handle held in its state and passed down to everything
//! that runs in the background (as mini-redis's `Shutdown`), not a process-wide flag, so two
//! servers in one process (the tests run many) stop on their own.
//!
//! Two stages: draining (a signal arrived: still answering, but telling clients to close
//! their connections and `/readyz` failing), then stopped (every background task ends).

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// One server's shutdown; cheap to clone (all clones are the same handle).
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    draining: Arc<AtomicBool>,
    drain: CancellationToken,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Shutdown {
    /// A signal arrived: answer on, but tell clients to go elsewhere.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
        self.drain.cancel();
    }

    /// Resolves once this server starts draining.
    pub async fn draining(&self) {
        self.drain.cancelled().await;
    }

    /// Whether this server is shutting down (draining or stopped).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Ends every background task spawned through [`Shutdown::spawn`].
    pub fn stop(&self) {
        self.start_draining();
        self.stop.cancel();
        self.tasks.close();
    }

    /// Resolves once the server is stopped (a second listener, such as gRPC's, closes then).
    pub async fn stopped(&self) {
        self.stop.cancelled().await;
    }

    /// Runs `task` in the background until it ends or the server stops.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Runs `task` in the background to its end: it watches [`Shutdown::stopped`] itself, to
    /// finish its work (a last flush) before it ends; [`Shutdown::finished`] waits for it.
    pub fn spawn_to_the_end(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Waits until every background task has ended (after [`Shutdown::stop`]).
    pub async fn finished(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The next connection `listener` accepts, with `TCP_NODELAY` set (an answer goes out as
/// soon as it is written, not behind an unacknowledged segment), or `None` once `shutdown`
/// resolves. An accept that fails (out of file descriptors and the like) waits 50 ms rather
/// than spin.
pub async fn accept<F: Future<Output = ()>>(
    listener: &tokio::net::TcpListener,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    // Failing accepts (out of descriptors, say) are said once, with how many, when they
    // stop; not once each, 20 a second.
    let mut failed = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if failed > 0 {
                        tracing::info!(failed, "accepting connections works again");
                    }
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "could not set TCP_NODELAY");
                    }
                    return Some((stream, peer));
                }
                Err(error) => {
                    if failed == 0 {
                        tracing::warn!(%error, "accepting a connection failed; trying again every 50 ms");
                    }
                    failed += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            () = shutdown.as_mut() => return None,
        }
    }
}

/// As [`accept`], once `limit` has room for one more connection: with the permit the
/// connection holds until it closes.
pub async fn accept_within<F: Future<Output = ()>>(
    listener: &tokio::net::TcpListener,
    limit: &crate::net::connection::Limit,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Option<(
    tokio::net::TcpStream,
    std::net::SocketAddr,
    tokio::sync::OwnedSemaphorePermit,
)> {
    let permit = tokio::select! {
        permit = limit.acquire() => permit,
        () = shutdown.as_mut() => return None,
    };
    let (stream, peer) = accept(listener, shutdown).await?;
    Some((stream, peer, permit))
}
