//! Envoy's rate limit service protocol, a front door like `api/` and `app/`: the gRPC
//! server (`ShouldRateLimit`, health) and envoyproxy/ratelimit's `POST /json`, both turning
//! the protocol's messages into a [`crate::service::envoy::EnvoyRequest`], calling the
//! service and turning its answer back (`wire`).

pub mod grpc;
pub mod json;
pub mod wire;
