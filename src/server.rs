//! The composition root: routes, middleware, and serving with graceful shutdown.

use std::{future::Future, sync::OnceLock, time::Duration};

use axum::Router;
use leptos::prelude::{provide_context, use_context};
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tokio::net::TcpListener;
use tower_http::{timeout::TimeoutLayer, trace::TraceLayer};

use crate::{
    api,
    app::{App, shell},
    auth,
    config::{Config, LogFormat},
    shutdown::Shutdown,
    state::AppState,
};

/// Builds the whole HTTP application for `state`.
pub fn router(state: AppState) -> Router {
    crate::metrics::handle();
    let routes = dashboard_routes();
    let context_state = state.clone();
    let leptos_options = state.leptos_options.clone();
    Router::new()
        .merge(api::router())
        .merge(auth::login::router())
        .merge(crate::app::events::router())
        .leptos_routes_with_context(
            &state,
            routes,
            move || provide_server_context(&context_state),
            move || shell(leptos_options.clone()),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::session::middleware,
        ))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::GATEWAY_TIMEOUT,
            state.request_timeout,
        ))
        .layer(TraceLayer::new_for_http())
        .layer(axum::middleware::from_fn_with_state(
            state.shutdown.clone(),
            close_while_draining,
        ))
        .with_state(state)
}

/// The dashboard's routes, generated once per process. Generating them renders the app once
/// with resource loading suppressed by a process-wide flag (leptos_server's
/// `SuppressResourceLoad`): a page whose data starts loading on another thread meanwhile
/// waits forever (leptos-rs/leptos#4773). A process that builds more than one router (the
/// integration tests build one per test, in parallel) saw pages time out with 504 now and
/// then; with the list made once, no router is built while another one serves.
fn dashboard_routes() -> Vec<AxumRouteListing> {
    static ROUTES: OnceLock<Vec<AxumRouteListing>> = OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App)).clone()
}

/// What pages and server functions reach through Leptos's context: the store and the whole
/// state, and this response's CSP nonce (the one the session middleware put in the header).
fn provide_server_context(state: &AppState) {
    provide_context(state.store.clone());
    provide_context(state.clone());
    if let Some(parts) = use_context::<axum::http::request::Parts>()
        && let Some(nonce) = parts.extensions.get::<auth::session::CspNonce>()
    {
        provide_context(leptos::nonce::Nonce::from_value(nonce.0.clone()));
    }
}

/// While the server drains, every answer tells the client to close its connection.
async fn close_while_draining(
    axum::extract::State(shutdown): axum::extract::State<Shutdown>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let mut response = next.run(request).await;
    if shutdown.is_draining() {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Resolves `drain` after a shutdown signal, during which requests are still served (with
/// `Connection: close`, and /readyz failing); then the server stops accepting and lets the
/// requests in flight finish.
pub async fn shutdown_after_drain(shutdown: Shutdown, drain: Duration) {
    shutdown_signal().await;
    shutdown.start_draining();
    tokio::time::sleep(drain).await;
}

/// Serves `state` on `listener` until `shutdown` resolves, then lets in-flight requests
/// finish. Tests bind `127.0.0.1:0` and pass their own shutdown future.
///
/// HTTP/1.1 and HTTP/2 cleartext (prior knowledge) share the port. A connection must send a
/// request's whole header within the header-read timeout, counted from when it opens and
/// again from the end of each answer: one that sends nothing, trickles a header line at a
/// time or sits idle between requests is closed then (axum::serve sets no timer, so such a
/// connection stayed open for ever). HTTP/2 connections are pinged and closed when the
/// client stops answering.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let header_read_timeout = state.header_read_timeout;
    let server_shutdown = state.shutdown.clone();
    let app = router(state);
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(header_read_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(connection) => connection,
                Err(error) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Answers go out as soon as they are written: no Nagle delay behind an
        // unacknowledged segment (a client that pipelines, or a response split in writes).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let app = app.clone();
        let service = hyper::service::service_fn(
            move |mut request: axum::extract::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                tower_service::Service::call(&mut app.clone(), request)
            },
        );
        // (A connection still being sniffed holds the graceful shutdown back, for at most
        // the header-read timeout.)
        let watcher = graceful.watcher();
        let builder = builder.clone();
        tokio::spawn(async move {
            // The auto builder tells HTTP/1 from HTTP/2 by the first bytes and waits for
            // them with no timer of its own: a connection that sends nothing, or only part
            // of the HTTP/2 preface, is dropped here after the header-read timeout.
            if tokio::time::timeout(header_read_timeout, sniffable(&stream))
                .await
                .is_err()
            {
                return;
            }
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Streams (the overview's events) end once they see the server draining.
    server_shutdown.start_draining();
    graceful.shutdown().await;
    server_shutdown.stop();
    server_shutdown.finished().await;
    Ok(())
}

/// Resolves once the connection has sent enough to tell its protocol: bytes that are not
/// the start of the HTTP/2 preface, or the whole preface. (A peek, so nothing is consumed.)
async fn sniffable(stream: &tokio::net::TcpStream) {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut buf = [0u8; PREFACE.len()];
    loop {
        match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return, // closed: serving it ends at once
            Ok(n) if n == PREFACE.len() || buf[..n] != PREFACE[..n] => return,
            // Part of the preface: wait for the rest (peek would answer at once again).
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut sig) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            sig.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = terminate => {} }
    tracing::info!("shutting down: finishing in-flight requests");
}

/// Sets up structured logging; `RUST_LOG` filters (default `info`).
pub fn init_tracing(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match config.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}
