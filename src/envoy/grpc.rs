//! The gRPC server Envoy calls: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! `grpc.health.v1.Health` and server reflection (v1 and v1alpha, so `grpcurl` needs no
//! .proto files), on `SPILLWAY_GRPC_ADDR`. Callers send a service key in
//! their metadata (`authorization: Bearer <key>`, which Envoy sends from the rate limit
//! cluster's `initial_metadata`, or `x-spillway-key`) unless `SPILLWAY_GRPC_AUTH=none`.

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, metadata::MetadataMap};

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
        authenticate(&self.state, request.metadata())?;
        let request = wire::request(request.into_inner()).map_err(status_of)?;
        let answer = self
            .state
            .should_rate_limit(&request)
            .await
            .map_err(status_of)?;
        Ok(Response::new(wire::response(
            &answer,
            self.state.envoy.headers,
        )))
    }
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

/// The caller's key from the metadata; `UNAUTHENTICATED` when it is missing or unknown.
fn authenticate(state: &AppState, metadata: &MetadataMap) -> Result<(), Status> {
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

/// Serves the rate limit and health services on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
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
    // Answers that one Redis call decides together leave in one write (see batched_writes).
    let incoming = futures_util::StreamExt::map(
        tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        |accepted| accepted.map(crate::batched_writes::BatchedWrites::http2),
    );
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RateLimitServiceServer::new(RateLimiter::new(state)))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
