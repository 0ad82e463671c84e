//! `ShouldRateLimit` (and Kuadrant's `CheckRateLimit` and `Report`) the short way, straight
//! from hyper: the message read whole within the
//! header-read timeout, decoded once, decided within the caller's `grpc-timeout` and the
//! server's request timeout, and encoded once into a unary answer with its trailers.

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
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
use tonic::Status;

use crate::state::AppState;

use super::*;

/// A gRPC message's prefix: a compression flag and its length (4 bytes, big-endian).
pub(super) const PREFIX: usize = 5;

/// A response body: the answer's message then its trailers (`grpc-status: 0`), or nothing
/// for an error, whose status goes in the headers (a "trailers-only" response).
#[derive(Default)]
pub(super) struct Unary {
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

/// Whether the short way takes `request`: a call of one of its methods with an uncompressed
/// protobuf message (gRPC's only encoding without `grpc-encoding`).
pub(super) fn takes(request: &http::Request<Incoming>) -> bool {
    Method::of(request.uri().path()).is_some()
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

/// One `ShouldRateLimit` call the short way (its caller already authenticated): read whole
/// within the header-read timeout, decided within the caller's `grpc-timeout` and this
/// server's request timeout, whichever ends first (`DEADLINE_EXCEEDED` past it, as gRPC
/// says a server ends such a call, and as tonic's path does), answered.
pub(super) async fn answer(
    state: AppState,
    request: http::Request<Incoming>,
    place: tokio::sync::OwnedSemaphorePermit,
) -> http::Response<Unary> {
    let path = request.uri().path().trim_start_matches('/').to_owned();
    let span = crate::telemetry::traces::server_span(
        || path.clone(),
        request.headers(),
        || {
            use opentelemetry::KeyValue;
            let (service, name) = path.split_once('/').unwrap_or((&path, ""));
            vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service.to_owned()),
                KeyValue::new("rpc.method", name.to_owned()),
            ]
        },
    );
    let traced = span.clone();
    let result =
        crate::telemetry::traces::within(span, within_deadline(&state, request, place)).await;
    if let Some(cx) = traced {
        record_status(&cx, &result);
    }
    match result {
        Ok(response) => unary_response(&response),
        Err(status) => status.into_http(),
    }
}

/// The call read and decided before the caller's `grpc-timeout` or this server's request
/// timeout ends, whichever comes first.
pub(super) async fn within_deadline(
    state: &AppState,
    request: http::Request<Incoming>,
    place: tokio::sync::OwnedSemaphorePermit,
) -> Result<RateLimitResponse, Status> {
    let method = Method::of(request.uri().path()).unwrap_or(Method::ShouldRateLimit);
    let started = std::time::Instant::now();
    let callers = request
        .headers()
        .get("grpc-timeout")
        .map(deadline_of)
        .transpose()?;
    let within = callers.map_or(state.request_timeout, |d| d.min(state.request_timeout));
    let read_within = state.header_read_timeout;
    let call = async {
        let message = tokio::time::timeout(read_within, read_message(request.into_body()))
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "the request message did not arrive within {} ms \
                     (SPILLWAY_HEADER_READ_TIMEOUT_MS)",
                    read_within.as_millis()
                ))
            })??;
        // Read: the place in the port's budget of pending calls is free again. The
        // decision's future is boxed, so a call still waiting for its message holds only
        // what reading needs (see `config::capacity::PER_PENDING_CALL`).
        drop(place);
        match method {
            Method::ShouldRateLimit => {
                Box::pin(decide(state, message, Some(started + within))).await
            }
            _ => Box::pin(kuadrant(state, method, message)).await,
        }
    };
    tokio::time::timeout(within, call)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(if callers == Some(within) {
                "the caller's grpc-timeout passed".to_owned()
            } else {
                format!(
                    "the call did not end within {} ms (SPILLWAY_REQUEST_TIMEOUT_MS)",
                    within.as_millis()
                )
            }))
        })
}

/// The call's status on its span; the server's faults only mark it failed (a caller's bad
/// request or missing key is an answer).
pub(super) fn record_status(
    cx: &opentelemetry::Context,
    result: &Result<RateLimitResponse, Status>,
) {
    let code = result.as_ref().map_or_else(|s| s.code() as i64, |_| 0);
    crate::telemetry::traces::record_on(
        cx,
        vec![opentelemetry::KeyValue::new("rpc.grpc.status_code", code)],
    );
    if let Err(status) = result
        && matches!(
            status.code(),
            tonic::Code::Internal
                | tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown
                | tonic::Code::DataLoss
        )
    {
        crate::telemetry::traces::failed(cx, status.message().to_owned());
    }
}

/// A unary call's successful answer: the length-prefixed message, `grpc-status: 0` in the
/// trailers.
pub(super) fn unary_response(response: &RateLimitResponse) -> http::Response<Unary> {
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

/// The one request message of a unary call.
pub(super) async fn read_message(body: Incoming) -> Result<RateLimitRequest, Status> {
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
pub(super) fn deadline_of(value: &HeaderValue) -> Result<Duration, Status> {
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
