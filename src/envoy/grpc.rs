//! The gRPC server Envoy calls: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! `grpc.health.v1.Health` and server reflection (v1 and v1alpha, so `grpcurl` needs no
//! .proto files), on `SPILLWAY_GRPC_ADDR`. Callers send a service key in
//! their metadata (`authorization: Bearer <key>`, which Envoy sends from the rate limit
//! cluster's `initial_metadata`, or `x-spillway-key`) unless `SPILLWAY_GRPC_AUTH=none`.
//!
//! `ShouldRateLimit` itself, every check Envoy makes, is answered straight from hyper
//! ([`answer`]): the message read whole, decoded and encoded once. tonic's server stack
//! around a unary call (its connection-info, error-recovery and timeout layers, a router,
//! a streaming codec and body adapters, each boxing or moving the call's future) cost a
//! check about as much CPU as deciding it. Health, reflection, and any `ShouldRateLimit`
//! call the short way does not take (a compressed message, say) go to tonic's services.

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
};
use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, header::CONTENT_TYPE};
use hyper::body::{Body, Frame, Incoming};
use prost::Message;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::wire;
use crate::{service::envoy::EnvoyError, state::AppState};

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
        decide(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }
}

/// The answer to one request message: the service's decision in the protocol's terms.
async fn decide(state: &AppState, message: RateLimitRequest) -> Result<RateLimitResponse, Status> {
    let request = wire::request(message).map_err(status_of)?;
    let answer = state.should_rate_limit(&request).await.map_err(status_of)?;
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
    let text = |name| metadata.get(name).and_then(|v| v.to_str().ok());
    match state
        .keys
        .caller_of_either(text("authorization"), text("x-spillway-key"))
    {
        Some(_) => Ok(()),
        None => Err(Status::unauthenticated(
            "send a service key as `authorization: Bearer <key>` or `x-spillway-key`",
        )),
    }
}

/// The method every Envoy check calls.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request message read, as tonic's default (4 MiB).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A gRPC message's prefix: a compression flag and its length (4 bytes, big-endian).
const PREFIX: usize = 5;

/// A response body: the answer's message then its trailers (`grpc-status: 0`), or nothing
/// for an error, whose status goes in the headers (a "trailers-only" response).
#[derive(Default)]
struct Unary {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for Unary {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }
}

/// Whether the short way takes `request`: a `ShouldRateLimit` call with an uncompressed
/// protobuf message (gRPC's only encoding without `grpc-encoding`).
fn takes(request: &http::Request<Incoming>) -> bool {
    request.uri().path() == SHOULD_RATE_LIMIT
        && request.method() == http::Method::POST
        && request
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto")
        && request
            .headers()
            .get("grpc-encoding")
            .is_none_or(|v| v == "identity")
}

/// One `ShouldRateLimit` call the short way: authenticated, read whole, decided within the
/// caller's `grpc-timeout` (`DEADLINE_EXCEEDED` past it, as gRPC says a server ends such
/// a call), answered.
async fn answer(state: AppState, request: http::Request<Incoming>) -> http::Response<Unary> {
    let result = async {
        authenticate(&state, request.headers())?;
        let deadline = request
            .headers()
            .get("grpc-timeout")
            .map(deadline_of)
            .transpose()?;
        let call = async {
            let message = read_message(request.into_body()).await?;
            decide(&state, message).await
        };
        match deadline {
            None => call.await,
            Some(d) => tokio::time::timeout(d, call).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(
                    "the caller's grpc-timeout passed",
                ))
            }),
        }
    }
    .await;
    match result {
        Ok(response) => {
            let mut body = BytesMut::with_capacity(PREFIX + response.encoded_len());
            body.put_u8(0);
            body.put_u32(response.encoded_len() as u32);
            response
                .encode(&mut body)
                .expect("the buffer holds the encoded length");
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let mut answer = http::Response::new(Unary {
                message: Some(body.freeze()),
                trailers: Some(trailers),
            });
            answer
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            answer
        }
        Err(status) => status.into_http(),
    }
}

/// The one request message of a unary call.
async fn read_message(body: Incoming) -> Result<RateLimitRequest, Status> {
    use http_body_util::BodyExt;
    let mut bytes = http_body_util::Limited::new(body, PREFIX + MAX_MESSAGE)
        .collect()
        .await
        .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
            Ok(_) => Status::out_of_range(format!(
                "the request message is larger than {MAX_MESSAGE} bytes"
            )),
            Err(e) => Status::internal(format!("reading the request: {e}")),
        })?
        .to_bytes();
    if bytes.len() < PREFIX {
        return Err(Status::internal("the request ended before its message"));
    }
    let compressed = bytes.get_u8();
    let length = bytes.get_u32() as usize;
    if compressed != 0 {
        // gRPC: a compressed flag without `grpc-encoding` is an INTERNAL error.
        return Err(Status::internal(
            "the message is marked compressed, and the call names no `grpc-encoding`",
        ));
    }
    if bytes.len() != length {
        return Err(Status::internal(format!(
            "the message declares {length} bytes and {} follow (a unary call sends one message)",
            bytes.len()
        )));
    }
    RateLimitRequest::decode(bytes)
        .map_err(|e| Status::internal(format!("decoding the request: {e}")))
}

/// The time a `grpc-timeout` header gives (gRPC over HTTP/2: up to 8 digits and a unit).
fn deadline_of(value: &HeaderValue) -> Result<Duration, Status> {
    let bad = || Status::invalid_argument(format!("grpc-timeout {value:?} is not a timeout"));
    let text = value.to_str().map_err(|_| bad())?;
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    Ok(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    })
}

/// Serves the rate limit, health and reflection services on `listener` until `shutdown`
/// resolves, then lets the calls in flight finish (HTTP/2 only, as tonic's server).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<RateLimiter>>()
        .await;
    // Draining: health says NOT_SERVING, so a mesh stops sending before the port closes.
    let draining = state.shutdown.clone();
    state.shutdown.spawn(async move {
        while !draining.is_draining() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
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
        .expect("the descriptors envoy-types ships are valid");
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the descriptors envoy-types ships are valid");
    let routes = tonic::service::Routes::new(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RateLimitServiceServer::new(RateLimiter::new(state.clone())))
        .prepare();
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // tonic's settings: no limit on streams, hyper's windows and frames.
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(None);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    while let Some((stream, _)) = crate::shutdown::accept(&listener, &mut shutdown).await {
        let state = state.clone();
        let routes = routes.clone();
        let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let (state, mut routes) = (state.clone(), routes.clone());
            async move {
                Ok::<_, Infallible>(if takes(&request) {
                    answer(state, request)
                        .await
                        .map(http_body_util::Either::Left)
                } else {
                    match tower_service::Service::call(&mut routes, request).await {
                        Ok(answer) => answer.map(http_body_util::Either::Right),
                        Err(never) => match never {},
                    }
                })
            }
        });
        // Answers that one Redis call decides together leave in one write (see
        // batched_writes).
        let io = TokioIo::new(crate::batched_writes::BatchedWrites::http2(stream));
        let connection = graceful.watch(builder.serve_connection(io, service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "gRPC connection ended with an error");
            }
        });
    }
    // New connections are refused at once, not left to hang while the calls in flight end.
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_read_as_the_protocol_writes_them() {
        let read = |s: &'static str| deadline_of(&HeaderValue::from_static(s));
        assert_eq!(read("20m").unwrap(), Duration::from_millis(20));
        assert_eq!(read("1S").unwrap(), Duration::from_secs(1));
        assert_eq!(read("99999999n").unwrap(), Duration::from_nanos(99_999_999));
        assert_eq!(read("2H").unwrap(), Duration::from_secs(7200));
        for bad in ["", "m", "20", "123456789m", "20x", "-1S", "1.5S"] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }
}
