//! The composition root: routes, middleware, and serving with graceful shutdown.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
    time::Duration,
};

use crate::net::connection::{Activity, InFlight, WATCH_TICKS, Watch, Watched};
use crate::net::tls::Socket;

use axum::Router;
use leptos::prelude::{provide_context, use_context};
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tokio::net::TcpListener;
use tower_http::trace::TraceLayer;

use crate::{
    api,
    app::{App, shell},
    auth,
    config::{Config, LogFormat},
    state::AppState,
    support::shutdown::Shutdown,
};

/// Builds the whole HTTP application for `state`.
pub fn router(state: AppState) -> Router {
    crate::telemetry::metrics::handle();
    let routes = dashboard_routes();
    let context_state = state.clone();
    let leptos_options = state.leptos_options.clone();
    Router::new()
        .merge(api::router(&state))
        .merge(crate::envoy::json::router())
        .merge(auth::login::router())
        .merge(crate::app::events::router())
        // The routes above answer a method they do not take with a problem document (the
        // dashboard's, added below, keep axum's empty 405).
        .method_not_allowed_fallback(api::wrong_method)
        .leptos_routes_with_context(
            &state,
            routes,
            move || provide_server_context(&context_state),
            move || shell(leptos_options.clone()),
        )
        .nest_service("/pkg", assets(&state))
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::session::middleware,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.request_timeout,
            within_request_timeout,
        ))
        .layer(axum::middleware::from_fn(traced))
        .layer(crate::net::compression::layer())
        // A failed answer is not an error of this process: 5xx answers are counted in
        // metrics and an outage is said once (`service::alerts::RedisOutage`), so the
        // layer's per-request ERROR line is kept for RUST_LOG=tower_http=debug.
        .layer(
            TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ),
        )
        .layer(axum::middleware::from_fn_with_state(
            state.shutdown.clone(),
            close_while_draining,
        ))
        .with_state(state)
}

/// The dashboard's files (`/pkg`: wasm, JS, CSS), each sent brotli- or gzip-compressed
/// when the browser takes it and the build wrote the compressed copy (`--precompress`).
/// Their caching is set by the session middleware (`auth::session`).
fn assets(state: &AppState) -> tower_http::services::ServeDir {
    let options = &state.leptos_options;
    tower_http::services::ServeDir::new(format!("{}/{}", options.site_root, options.site_pkg_dir))
        .precompressed_br()
        .precompressed_gzip()
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

/// What pages and server functions reach through Leptos's context: the whole
/// state, and this response's CSP nonce (the one the session middleware put in the header).
fn provide_server_context(state: &AppState) {
    provide_context(state.clone());
    if let Some(parts) = use_context::<axum::http::request::Parts>()
        && let Some(nonce) = parts.extensions.get::<auth::session::CspNonce>()
    {
        provide_context(leptos::nonce::Nonce::from_value(nonce.0.clone()));
    }
}

/// A request not received and answered within `limit` gets a 504 problem document (an empty
/// 504 told a client whose body stalled nothing).
async fn within_request_timeout(
    axum::extract::State(limit): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        // With the API's headers: the session middleware that adds them is inside this one.
        Err(_) => auth::headers::secure_api_response(api::ApiError::Timeout(limit).into_response()),
    }
}

/// With traces on, a server span for each request (the files of `/pkg`, health and metrics
/// aside), its parent the caller's `traceparent`; the admin action a request makes and the
/// checks it runs are recorded inside it.
async fn traced(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let span = http_span(&request);
    in_http_span(span, next.run(request)).await
}

/// The server span of `request` when traces are on (and it is not for `/pkg`, health or
/// metrics), named by its route's template (`GET /api/v1/identifiers/{dimension}/{value}`,
/// as `http.route`): never by the path, which may carry an identifier's value. A request
/// that matched no route is named by its method alone. The check endpoints, answered before
/// the router, have fixed paths.
fn http_span<B>(request: &http::Request<B>) -> Option<opentelemetry::Context> {
    use opentelemetry::KeyValue;
    if !crate::telemetry::traces::on() {
        return None;
    }
    let path = request.uri().path();
    if path.starts_with("/pkg/") || matches!(path, "/healthz" | "/readyz" | "/metrics") {
        return None;
    }
    let route = match request.extensions().get::<axum::extract::MatchedPath>() {
        Some(matched) => Some(matched.as_str()),
        None if api::is_check_endpoint(request.method(), path) => Some(path),
        None => None,
    };
    let method = request.method().as_str();
    crate::telemetry::traces::server_span(
        || match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_owned(),
        },
        request.headers(),
        || {
            let mut attributes = vec![KeyValue::new("http.request.method", method.to_owned())];
            if let Some(route) = route {
                attributes.push(KeyValue::new("http.route", route.to_owned()));
            }
            attributes
        },
    )
}

/// Answers within `span` (when there is one) and records the answer's status on it.
async fn in_http_span(
    span: Option<opentelemetry::Context>,
    answer: impl Future<Output = axum::response::Response>,
) -> axum::response::Response {
    let Some(cx) = span else {
        return answer.await;
    };
    let response = crate::telemetry::traces::within(Some(cx.clone()), answer).await;
    let status = response.status();
    crate::telemetry::traces::record_on(
        &cx,
        vec![opentelemetry::KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        )],
    );
    if status.is_server_error() {
        crate::telemetry::traces::failed(&cx, status.to_string());
    }
    response
}

/// While the server drains, every answer tells the client to close its connection.
async fn close_while_draining(
    axum::extract::State(shutdown): axum::extract::State<Shutdown>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let mut response = next.run(request).await;
    closing_if_draining(&shutdown, &mut response);
    response
}

fn closing_if_draining(shutdown: &Shutdown, response: &mut axum::response::Response) {
    if shutdown.is_draining() {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
}

/// A check endpoint's answer, served before the router (`api::check_endpoint`), with what
/// the router's middleware gives every API answer: a 504 problem past the request timeout,
/// the API's security headers and `Cache-Control`, `Connection: close` while draining, the
/// request's span when traces are on. (Not the tracing span of each request, which only
/// `RUST_LOG=tower_http=debug` would show.)
async fn check_answer(
    check: futures_util::future::BoxFuture<'static, axum::response::Response>,
    span: Option<opentelemetry::Context>,
    state: AppState,
) -> Result<axum::response::Response, std::convert::Infallible> {
    use axum::response::IntoResponse;
    let within = state.request_timeout;
    let response = in_http_span(span, async move {
        match tokio::time::timeout(within, check).await {
            Ok(response) => response,
            Err(_) => api::ApiError::Timeout(within).into_response(),
        }
    })
    .await;
    let mut response = auth::headers::secure_api_response(response);
    closing_if_draining(&state.shutdown, &mut response);
    Ok(response)
}

/// Resolves `drain` after a shutdown signal, during which requests are still served (with
/// `Connection: close`, and /readyz failing); then the server stops accepting and lets the
/// requests in flight finish.
pub async fn shutdown_after_drain(shutdown: Shutdown, drain: Duration) {
    shutdown_signal().await;
    shutdown.start_draining();
    tokio::time::sleep(drain).await;
}

/// Serves both listeners: HTTP on `http` (see [`run`]) and, when there is one, Envoy's
/// rate limit service on `grpc`, until `shutdown` resolves; the gRPC server stops with the
/// HTTP one (the state's shutdown handle). Should either stop on its own (an error, a
/// panic), this returns the reason, so the process ends rather than half-serving.
pub async fn serve(
    http: TcpListener,
    grpc: Option<TcpListener>,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Renewed certificates are picked up while serving.
    state.shutdown.spawn(state.tls.clone().watch());
    if let Some(dir) = &state.domains_dir {
        let folder = crate::sources::domains_dir::Folder::new(dir.clone());
        state.shutdown.spawn(folder.watch(state.service().clone()));
    }
    if let Some(xds) = &state.xds {
        state.shutdown.spawn(crate::sources::xds::run(
            state.service().clone(),
            xds.clone(),
        ));
    }
    let grpc = grpc.map(|listener| {
        let stopped = state.shutdown.clone();
        tokio::spawn(crate::envoy::grpc::serve(
            listener,
            state.clone(),
            async move { stopped.stopped().await },
        ))
    });
    let http = run(http, state.clone(), shutdown);
    tokio::pin!(http);
    let Some(mut grpc) = grpc else {
        return http.await;
    };
    tokio::select! {
        served = &mut http => {
            served?;
            // Stopped with HTTP: let its calls in flight end.
            grpc.await
                .map_err(|e| std::io::Error::other(format!("the gRPC server failed: {e}")))?
        }
        ended = &mut grpc => {
            // Stopped through the state's handle (a shutdown under way): HTTP goes on to
            // its own end.
            if matches!(ended, Ok(Ok(()))) && state.shutdown.is_draining() {
                return http.await;
            }
            state.shutdown.stop();
            let reason = match ended {
                Ok(Ok(())) => "it ended before the HTTP server".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            Err(std::io::Error::other(format!("the gRPC server stopped: {reason}")))
        }
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then lets in-flight requests
/// finish. Tests bind `127.0.0.1:0` and pass their own shutdown future.
///
/// HTTP/1.1 and HTTP/2 cleartext (prior knowledge) share the port. A connection must send a
/// request's whole header within the header-read timeout, counted from the first byte of
/// it, and may sit idle (no request in flight, nothing read or written) no longer than that
/// either: one that sends nothing, trickles a header line at a time, stops inside the
/// HTTP/2 preface or idles between requests is closed then (axum::serve sets no timer, so
/// such a connection stayed open for ever). One watch per connection does it ([`Activity`],
/// [`Watch`]), which also covers what hyper's header timeout does not: the bytes the
/// HTTP/1-or-2 sniff waits for, and a request answered slowly (never cut off while in
/// flight). The socket only counts its reads and writes; the watch, a quarter of the timeout
/// apart, compares the counts (hyper's per-request timer, and then a clock read on every
/// read and write, cost the check path 1-2 µs of CPU a request).
///
/// The check endpoints are answered before the router ([`api::check_endpoint`]): the same
/// handlers, with the API's headers, timeout and draining added here.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::TokioIo;
    let header_read_timeout = state.header_read_timeout;
    let server_shutdown = state.shutdown.clone();
    let app = router(state.clone());
    let builder = http_builder(header_read_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let limit = crate::net::connection::Limit::new(state.max_connections);
    // HTTP/2 streams in flight (see `requests_of`); requests held by policies that wait
    // have their own budget beside it.
    let pending = crate::net::connection::Pending::new(state.max_pending + state.max_waiting);
    tokio::pin!(shutdown);
    while let Some((stream, peer, permit)) =
        crate::support::shutdown::accept_within(&listener, &limit, &mut shutdown).await
    {
        let (app, state, builder) = (app.clone(), state.clone(), builder.clone());
        let (limit, pending) = (limit.clone(), pending.clone());
        let graceful = graceful.watcher();
        // The TLS handshake (when the port has TLS) happens in the connection's own task.
        tokio::spawn(async move {
            let _permit = permit;
            let tls = state.tls.http.as_deref();
            let socket = match Socket::accept(stream, tls, header_read_timeout).await {
                Ok(socket) => socket,
                Err(error) => {
                    tracing::debug!(%error, %peer, "TLS handshake failed");
                    return;
                }
            };
            let activity = Arc::new(Activity::default());
            let service = requests_of(app, state, peer, activity.clone(), pending);
            let connection = builder
                .serve_connection_with_upgrades(
                    TokioIo::new(crate::net::batched_writes::BatchedWrites::sniffing(
                        Watched {
                            io: socket,
                            activity: activity.clone(),
                        },
                    )),
                    service,
                )
                .into_owned();
            let connection = graceful.watch(connection);
            watched(connection, activity, header_read_timeout, peer, &limit).await;
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

/// The HTTP/1 and HTTP/2 settings of the HTTP port. HTTP/1: a read buffer of 64 KiB at
/// most (a longer header is refused; hyper's default is about 400 KiB). HTTP/2: 128 streams,
/// and windows that bound what a client may send before the server reads it.
fn http_builder(
    header_read_timeout: Duration,
) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .header_read_timeout(None)
        .max_buf_size(64 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(128)
        .initial_stream_window_size(64 * 1024)
        .initial_connection_window_size(crate::net::connection::CONNECTION_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(header_read_timeout);
    builder
}

/// What answers the requests of one connection from `peer`: a check straight to its
/// handler, anything else through the router; each counted in flight on `activity`, and
/// each HTTP/2 stream holding a place of the port's `pending` budget until its answer's
/// head is out (a stream past the budget is answered 503 at once).
fn requests_of(
    app: Router,
    state: AppState,
    peer: std::net::SocketAddr,
    activity: Arc<Activity>,
    pending: crate::net::connection::Pending,
) -> impl hyper::service::Service<
    axum::extract::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(
        move |request: axum::extract::Request<hyper::body::Incoming>| {
            let in_flight = InFlight::start(&activity);
            // HTTP/2's streams take places of the budget: a connection may carry 128 of
            // them. An HTTP/1 connection carries one request at a time, so the connection cap
            // bounds those already (and refusing one before its body is read would close its
            // connection under the client's feet).
            let place = if request.version() == http::Version::HTTP_2 {
                match pending.try_take() {
                    Some(place) => Some(place),
                    None => {
                        use axum::response::IntoResponse;
                        let busy = auth::headers::secure_api_response(
                            api::ApiError::Busy("requests in flight on this port").into_response(),
                        );
                        return futures_util::future::Either::Left(std::future::ready(Ok(busy)));
                    }
                }
            } else {
                None
            };
            // The router's requests get theirs from its `traced` layer.
            let span = (crate::telemetry::traces::on()
                && api::is_check_endpoint(request.method(), request.uri().path()))
            .then(|| http_span(&request))
            .flatten();
            let answer = match api::check_endpoint(request.map(axum::body::Body::new), &state) {
                Ok(check) => {
                    futures_util::future::Either::Left(check_answer(check, span, state.clone()))
                }
                Err(mut request) => {
                    request
                        .extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    futures_util::future::Either::Right(tower_service::Service::call(
                        &mut app.clone(),
                        request,
                    ))
                }
            };
            futures_util::future::Either::Right(async move {
                let response = answer.await;
                drop((in_flight, place));
                response
            })
        },
    )
}

/// Serves `connection` until it ends, or until its `activity` shows it idle or stalled past
/// the header read timeout (dropping it closes it).
async fn watched<C, E>(
    connection: C,
    activity: Arc<Activity>,
    header_read_timeout: Duration,
    peer: std::net::SocketAddr,
    limit: &crate::net::connection::Limit,
) where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    tokio::pin!(connection);
    let mut tick = tokio::time::interval(header_read_timeout / WATCH_TICKS);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch = Watch::default();
    loop {
        tokio::select! {
            ended = &mut connection => {
                if let Err(error) = ended {
                    tracing::debug!(%error, %peer, "connection ended with an error");
                }
                return;
            }
            _ = tick.tick() => {
                if watch.overdue(&activity, limit.pressed()) {
                    return;
                }
            }
        }
    }
}

/// Runs `start` (connecting to Redis) while `listener` answers as a process that is alive
/// and not ready: `/healthz` 200, everything else (`/readyz` too) a 503 problem saying the
/// policies are not loaded. Liveness probes pass and readiness probes fail until the
/// server proper takes the port.
pub async fn starting<T>(
    listener: &TcpListener,
    tls: Option<Arc<crate::net::tls::Port>>,
    start: impl Future<Output = T>,
) -> T {
    use axum::routing::get;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let app: Router = Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({ "status": "ok", "starting": true })) }),
        )
        // upstream's probe says "not healthy" its own way.
        .route(
            "/healthcheck",
            get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .fallback(|| async { api::ApiError::PoliciesNotLoaded });
    let within = Duration::from_secs(5);
    tokio::pin!(start);
    loop {
        tokio::select! {
            started = &mut start => return started,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let (app, tls) = (app.clone(), tls.clone());
                tokio::spawn(async move {
                    let Ok(socket) = Socket::accept(stream, tls.as_deref(), within).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |request: http::Request<hyper::body::Incoming>| {
                            tower_service::Service::call(
                                &mut app.clone(),
                                request.map(axum::body::Body::new),
                            )
                        },
                    );
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let connection = builder.serve_connection(TokioIo::new(socket), service);
                    // Probes ask once and go: no connection outlives a few seconds.
                    let _ = tokio::time::timeout(within, connection).await;
                });
            }
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let level = config.log_level.as_deref().unwrap_or("info");
        tracing_subscriber::EnvFilter::new(format!("{level},tower_http=warn"))
    });
    // Lines written inside a traced request carry its trace and span ids.
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match config.log_format {
        LogFormat::Json => builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(crate::telemetry::traces::WithTraceIds::new(
                tracing_subscriber::fmt::format().json(),
                true,
            ))
            .try_init(),
        LogFormat::Pretty => builder
            .event_format(crate::telemetry::traces::WithTraceIds::new(
                tracing_subscriber::fmt::format(),
                false,
            ))
            .try_init(),
    };
}
