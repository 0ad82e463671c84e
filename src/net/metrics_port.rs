//! The metrics port (`SPILLWAY_METRICS_ADDR`): `/metrics` only, for a scraper, on a port of
//! its own and without a key. Nothing on it may hold the process's memory: at most
//! [`MAX_CONNECTIONS`] connections at once (more wait in the listen queue), each closed
//! after [`CONNECTION_LIFETIME`] whatever it does, so one that never sends is let go too.

use std::{sync::Arc, time::Duration};

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a connection is kept, idle or not (a scrape takes milliseconds; scrapers
/// connect again).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// Serves `router` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, router: axum::Router) {
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(place) = places.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::debug!(%error, "metrics port: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let router = router.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    tower_service::Service::call(
                        &mut router.clone(),
                        request.map(axum::body::Body::new),
                    )
                });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(place);
        });
    }
}
