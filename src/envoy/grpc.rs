//! The gRPC server Envoy calls: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! `grpc.health.v1.Health` and server reflection (v1 and v1alpha, so `grpcurl` needs no
//! .proto files), on `SPILLWAY_GRPC_ADDR`. Callers send a service key in
//! their metadata (`authorization: Bearer <key>`, which Envoy sends from the rate limit
//! cluster's `initial_metadata`, or `x-spillway-key`) unless `SPILLWAY_GRPC_AUTH=none`.
//!
//! `ShouldRateLimit` itself, every check Envoy makes, is answered straight from hyper
//! (`grpc/unary.rs`): the message read whole, decoded and encoded once. tonic's server stack
//! around a unary call (its connection-info, error-recovery and timeout layers, a router,
//! a streaming codec and body adapters, each boxing or moving the call's future) cost a
//! check about as much CPU as deciding it. Health, reflection, and any `ShouldRateLimit`
//! call the short way does not take (a compressed message, say) go to tonic's services.

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
};
use std::{convert::Infallible, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, header::CONTENT_TYPE};
use hyper::body::{Body, Incoming};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::wire;
use crate::{service::envoy::EnvoyError, state::AppState};

mod unary;
use unary::*;

/// The descriptors of `envoy.service.ratelimit.v3` and its imports, for reflection (kept
/// by build.rs from envoy-types' compiled Envoy API).
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ratelimit_descriptors.bin"));

/// The rate limit service, on the app's state.
pub struct RateLimiter {
    state: AppState,
}

impl RateLimiter {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        authenticate(&self.state, request.metadata().as_ref())?;
        // The caller's grpc-timeout, and this server's request timeout, whichever ends
        // first (a call past the latter is cut off).
        let now = std::time::Instant::now();
        let own = now + self.state.request_timeout;
        let deadline = request
            .metadata()
            .as_ref()
            .get("grpc-timeout")
            .map(deadline_of)
            .transpose()?
            .map_or(own, |d| (now + d).min(own));
        decide(&self.state, request.into_inner(), Some(deadline))
            .await
            .map(Response::new)
    }
}

/// The answer to one request message: the service's decision in the protocol's terms. A
/// domain that waits may hold an over-limit request until `deadline` (the caller's
/// `grpc-timeout`; a little is kept to answer in).
async fn decide(
    state: &AppState,
    message: RateLimitRequest,
    deadline: Option<std::time::Instant>,
) -> Result<RateLimitResponse, Status> {
    let request = wire::request(message).map_err(status_of)?;
    let deadline = deadline.map(|d| d.checked_sub(Duration::from_millis(5)).unwrap_or(d));
    let answer = state
        .service()
        .should_rate_limit_or_wait(&request, deadline)
        .await
        .map_err(status_of)?;
    Ok(wire::response(&answer, state.envoy.headers))
}

/// The gRPC status of a request the service did not answer.
pub fn status_of(error: EnvoyError) -> Status {
    match error {
        EnvoyError::Invalid { .. } => Status::invalid_argument(error.to_string()),
        EnvoyError::PoliciesNotLoaded | EnvoyError::Unavailable(_) => {
            Status::unavailable(error.to_string())
        }
    }
}

/// The caller's key from the metadata (the request's headers); `UNAUTHENTICATED` when it
/// is missing or unknown.
fn authenticate(state: &AppState, metadata: &HeaderMap) -> Result<(), Status> {
    if !state.envoy.require_key {
        return Ok(());
    }
    match crate::auth::keys::caller_of_headers(state.service().keys(), metadata) {
        Some(_) => Ok(()),
        None => Err(Status::unauthenticated(
            "send a service key as `authorization: Bearer <key>` or `x-spillway-key`",
        )),
    }
}

/// The method every Envoy check calls.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// Kuadrant's extension of the protocol (Limitador's `kuadrant.service.ratelimit.v1`, which
/// Kuadrant's wasm-shim calls for its TokenRateLimitPolicy): the same messages.
const CHECK_RATE_LIMIT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/CheckRateLimit";
const REPORT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Report";

/// The methods the short way answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    ShouldRateLimit,
    CheckRateLimit,
    Report,
}

impl Method {
    fn of(path: &str) -> Option<Self> {
        match path {
            SHOULD_RATE_LIMIT => Some(Method::ShouldRateLimit),
            CHECK_RATE_LIMIT => Some(Method::CheckRateLimit),
            REPORT => Some(Method::Report),
            _ => None,
        }
    }
}

/// Kuadrant's answers, as Limitador gives them: only the overall code (`UNKNOWN` for a
/// request without a domain); `CheckRateLimit` counts nothing, `Report` always says OK.
async fn kuadrant(
    state: &AppState,
    method: Method,
    message: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    if message.domain.is_empty() {
        return Ok(RateLimitResponse::default());
    }
    let request = wire::request(message).map_err(status_of)?;
    let service = state.service();
    let ok = match method {
        Method::Report => service.report_envoy_usage(&request).await.map(|()| true),
        _ => service.check_envoy_limits(&request).await,
    }
    .map_err(status_of)?;
    Ok(RateLimitResponse {
        overall_code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        ..RateLimitResponse::default()
    })
}

/// The largest request message read. A `RateLimitRequest` is a domain and a few
/// descriptors: Envoy sends a few hundred bytes, and 64 KiB holds hundreds of descriptors.
/// (tonic's default, 4 MiB, let a caller with no key make the server hold 4 MiB a stream.)
const MAX_MESSAGE: usize = 64 * 1024;

/// Streams one connection may have open at once (a client that needs more opens another
/// connection, as Envoy does). What they hold unread is bounded by the connection window,
/// and each is a row of the codec's table: 128 keeps a connection's worst case within
/// `config::capacity::PER_CONNECTION`.
const MAX_STREAMS: u32 = 128;

/// The HTTP/2 windows: what a client may send before the server reads it, per stream and
/// per connection (with the connection cap, the most the port buffers unread). A message
/// larger than a stream's window flows on as it is read.
const STREAM_WINDOW: u32 = 64 * 1024;
const CONNECTION_WINDOW: u32 = crate::net::connection::CONNECTION_WINDOW;

/// The gRPC methods anyone may call without a key: health, which orchestrators' probes
/// call and which says nothing about the limits.
const OPEN_PREFIX: &str = "/grpc.health.v1.Health/";

/// The largest health request read: a service name. Anyone may call health, so what it may
/// make the server hold is kept to this (a message that declares more is refused at once).
const MAX_HEALTH_MESSAGE: usize = 1024;

/// Health calls one connection may have open at once (a probe makes one at a time; a
/// `Watch` stays open). Past it a health call is refused with `RESOURCE_EXHAUSTED`.
pub const HEALTH_CALLS_PER_CONNECTION: usize = 4;

/// How long a health call's message may take to arrive (it is a service name, sent with
/// the call's headers by every client).
const HEALTH_MESSAGE_WITHIN: Duration = Duration::from_secs(1);

/// Whether a request is a gRPC call at all (`application/grpc`, `+proto`, `+json`...).
fn is_grpc(request: &http::Request<Incoming>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// The services behind the short way, with their message-size caps.
type Routes = tonic::service::Routes;

/// One request on the gRPC port, decided before any of its body is read: what is not gRPC
/// gets HTTP 415 (as the gRPC spec says), a call without a valid key `UNAUTHENTICATED`
/// (health excepted), a call past the port's budgets `RESOURCE_EXHAUSTED`; all of these at
/// once, without a task of their own ([`admit`]). Then `ShouldRateLimit` the short way and
/// everything else through tonic, within the request timeout.
type Answer = http::Response<http_body_util::Either<Unary, tonic::body::Body>>;

/// What an admitted call holds: its place in the port's budget of pending calls (until its
/// message is read) and, for health, one of its connection's few health calls.
struct Admitted {
    place: tokio::sync::OwnedSemaphorePermit,
    health: Option<HealthCall>,
}

/// Whether `request` is taken, decided from its headers alone; the refusal otherwise.
fn admit(
    state: &AppState,
    request: &http::Request<Incoming>,
    port: &Port,
) -> Result<Admitted, Box<Answer>> {
    use http_body_util::Either;
    if !is_grpc(request) {
        let mut answer = http::Response::new(Either::Left(Unary::default()));
        *answer.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return Err(Box::new(answer));
    }
    let refuse = |status: Status| Box::new(status.into_http().map(Either::Left));
    let health = match request.uri().path().starts_with(OPEN_PREFIX) {
        false => {
            authenticate(state, request.headers()).map_err(refuse)?;
            None
        }
        true => Some(port.health.take().ok_or_else(|| {
            refuse(Status::resource_exhausted(format!(
                "at most {HEALTH_CALLS_PER_CONNECTION} health calls a connection at once"
            )))
        })?),
    };
    // Health has a budget of its own: a flood of calls cannot starve the probes, nor a
    // flood of health calls the checks.
    let budget = match health {
        Some(_) => &port.pending_health,
        None => &port.pending,
    };
    let place = budget.try_take().ok_or_else(|| {
        refuse(Status::resource_exhausted(
            "this instance holds as many calls waiting for their message as its budget \
             allows (SPILLWAY_MAX_PENDING_CALLS); try again in a moment",
        ))
    })?;
    Ok(Admitted { place, health })
}

/// An admitted call, answered.
async fn route(
    state: AppState,
    routes: Routes,
    request: http::Request<Incoming>,
    admitted: Admitted,
) -> Answer {
    use http_body_util::Either;
    let Admitted { place, health } = admitted;
    if takes(&request) {
        return answer(state, request, place).await.map(Either::Left);
    }
    let within = state.request_timeout;
    let answered = match health {
        Some(call) => {
            let request = match health_request(request).await {
                Ok(request) => request,
                Err(status) => return status.into_http().map(Either::Left),
            };
            drop(place);
            let answered = Box::pin(tokio::time::timeout(
                within,
                tower_service::Service::call(&mut routes.clone(), request),
            ))
            .await;
            drop(call);
            answered
        }
        None => {
            let answered = Box::pin(tokio::time::timeout(
                within,
                tower_service::Service::call(&mut routes.clone(), request),
            ))
            .await;
            drop(place);
            answered
        }
    };
    match answered {
        Ok(Ok(answer)) => answer.map(Either::Right),
        Ok(Err(never)) => match never {},
        Err(_) => Status::deadline_exceeded(format!(
            "the call did not end within {} ms (SPILLWAY_REQUEST_TIMEOUT_MS)",
            within.as_millis()
        ))
        .into_http()
        .map(Either::Left),
    }
}

/// A health call with its message read first, within [`HEALTH_MESSAGE_WITHIN`] and
/// [`MAX_HEALTH_MESSAGE`]: what anyone may make the server wait on is a second and a
/// kilobyte.
async fn health_request(
    request: http::Request<Incoming>,
) -> Result<http::Request<http_body_util::Full<Bytes>>, Status> {
    use http_body_util::BodyExt;
    let (parts, body) = request.into_parts();
    let read = http_body_util::Limited::new(body, PREFIX + MAX_HEALTH_MESSAGE).collect();
    let bytes = match tokio::time::timeout(HEALTH_MESSAGE_WITHIN, read).await {
        Err(_) => {
            return Err(Status::deadline_exceeded(format!(
                "a health call's message must arrive within {} ms",
                HEALTH_MESSAGE_WITHIN.as_millis()
            )));
        }
        Ok(Err(_)) => {
            return Err(Status::out_of_range(format!(
                "a health call's message is at most {MAX_HEALTH_MESSAGE} bytes"
            )));
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    Ok(http::Request::from_parts(
        parts,
        http_body_util::Full::new(bytes),
    ))
}

/// What the calls of one connection share: the port's budget of pending calls and the
/// connection's own count of health calls.
#[derive(Clone)]
struct Port {
    pending: crate::net::connection::Pending,
    pending_health: crate::net::connection::Pending,
    health: HealthCalls,
}

/// The health calls open on one connection.
#[derive(Clone, Default)]
struct HealthCalls(std::sync::Arc<std::sync::atomic::AtomicUsize>);

/// One open health call, counted until dropped.
struct HealthCall(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl HealthCalls {
    fn take(&self) -> Option<HealthCall> {
        use std::sync::atomic::Ordering;
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < HEALTH_CALLS_PER_CONNECTION).then_some(n + 1)
            })
            .ok()
            .map(|_| HealthCall(self.0.clone()))
    }
}

impl Drop for HealthCall {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The health, reflection and rate limit services, each reading messages up to
/// `MAX_MESSAGE`, behind the short way.
async fn services(state: &AppState) -> Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<RateLimiter>>()
        .await;
    // Draining: health says NOT_SERVING, so a mesh stops sending before the port closes.
    let draining = state.shutdown.clone();
    state.shutdown.spawn(async move {
        draining.draining().await;
        reporter
            .set_not_serving::<RateLimitServiceServer<RateLimiter>>()
            .await;
    });
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("the descriptors envoy-types ships are valid")
        .max_decoding_message_size(MAX_MESSAGE);
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the descriptors envoy-types ships are valid")
        .max_decoding_message_size(MAX_MESSAGE);
    tonic::service::Routes::new(health.max_decoding_message_size(MAX_HEALTH_MESSAGE))
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            RateLimitServiceServer::new(RateLimiter::new(state.clone()))
                .max_decoding_message_size(MAX_MESSAGE),
        )
        .prepare()
}

/// Drives one connection to its end: GOAWAY when the server closes (`closing`) or when it
/// has started no call for `timeout`, then dropped if the peer says nothing more for about
/// as long (calls in flight are waited for: each ends within the request timeout).
async fn watch_connection<C>(
    connection: C,
    activity: &crate::net::connection::Activity,
    timeout: Duration,
    closing: &tokio_util::sync::CancellationToken,
    limit: &crate::net::connection::Limit,
) where
    C: Future<Output = hyper::Result<()>> + GracefulConnection,
{
    use crate::net::connection::{WATCH_TICKS, Watch};
    tokio::pin!(connection);
    let mut tick = tokio::time::interval(timeout / WATCH_TICKS);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch = Watch::default();
    // Ticks since GOAWAY was sent.
    let mut goaway: Option<u32> = None;
    loop {
        tokio::select! {
            ended = &mut connection => {
                if let Err(error) = ended {
                    tracing::debug!(%error, "gRPC connection ended with an error");
                }
                return;
            }
            () = closing.cancelled(), if goaway.is_none() => {
                connection.as_mut().goaway();
                goaway = Some(0);
            }
            _ = tick.tick() => match goaway.as_mut() {
                Some(ticks) => {
                    *ticks += 1;
                    if *ticks > WATCH_TICKS && activity.in_flight() == 0 {
                        return;
                    }
                }
                None if watch.unused(activity, limit.pressed()) => {
                    connection.as_mut().goaway();
                    goaway = Some(0);
                }
                None => {}
            },
        }
    }
}

/// An HTTP/2 connection that can be asked to end gracefully (hyper's server connection).
trait GracefulConnection {
    fn goaway(self: std::pin::Pin<&mut Self>);
}

impl<I, S, E> GracefulConnection for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: Body + 'static,
    <S::ResBody as Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn goaway(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves the rate limit, health and reflection services on `listener` until `shutdown`
/// resolves, then lets the calls in flight finish (HTTP/2 only, as tonic's server).
///
/// Each connection is watched as the HTTP port's are: one that starts no stream for the
/// header-read timeout (silent, or a preface and nothing after it) is sent GOAWAY, and
/// closed if it is still open a timeout later; HTTP/2 PINGs find a peer that vanished
/// while a call is in flight. At most `max_connections` are open at once.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use crate::net::connection::{Activity, InFlight, Limit};
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let routes = services(&state).await;
    let timeout = state.header_read_timeout;
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(timeout);
    let closing = tokio_util::sync::CancellationToken::new();
    let connections = tokio_util::task::TaskTracker::new();
    let limit = Limit::new(state.max_connections);
    let pending = crate::net::connection::Pending::new(state.max_pending);
    let pending_health = crate::net::connection::Pending::new((state.max_pending / 4).max(16));
    tokio::pin!(shutdown);
    while let Some((stream, peer, permit)) =
        crate::support::shutdown::accept_within(&listener, &limit, &mut shutdown).await
    {
        let (state, routes, builder) = (state.clone(), routes.clone(), builder.clone());
        let (closing, limit) = (closing.clone(), limit.clone());
        let port = Port {
            pending: pending.clone(),
            pending_health: pending_health.clone(),
            health: HealthCalls::default(),
        };
        // The TLS handshake (when the port has TLS) happens in the connection's own task.
        connections.spawn(async move {
            let _permit = permit;
            let tls = state.tls.grpc.as_deref();
            let socket = match crate::net::tls::Socket::accept(stream, tls, timeout).await {
                Ok(socket) => socket,
                Err(error) => {
                    tracing::debug!(%error, %peer, "gRPC TLS handshake failed");
                    return;
                }
            };
            let activity = std::sync::Arc::new(Activity::default());
            let streams = activity.clone();
            let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                let in_flight = InFlight::start(&streams);
                // A refusal is answered from a ready future; only an admitted call's future
                // is allocated (boxed, so a refused stream's task stays small).
                match admit(&state, &request, &port) {
                    Err(refused) => {
                        drop(in_flight);
                        futures_util::future::Either::Left(std::future::ready(Ok::<_, Infallible>(
                            *refused,
                        )))
                    }
                    Ok(admitted) => {
                        let answer = route(state.clone(), routes.clone(), request, admitted);
                        futures_util::future::Either::Right(Box::pin(async move {
                            let answer = answer.await;
                            drop(in_flight);
                            Ok::<_, Infallible>(answer)
                        }))
                    }
                }
            });
            // Answers that one Redis call decides together leave in one write (see
            // batched_writes).
            // Only streams are watched here (`Watch::unused`): the socket is not wrapped to
            // count its reads and writes.
            let io = TokioIo::new(crate::net::batched_writes::BatchedWrites::http2(socket));
            let connection = builder.serve_connection(io, service);
            watch_connection(connection, &activity, timeout, &closing, &limit).await;
        });
    }
    // New connections are refused at once, not left to hang while the calls in flight end.
    drop(listener);
    closing.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}
