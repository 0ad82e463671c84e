//! Plain axum handlers for services and automation: health probes, the check endpoints and
//! the admin JSON API. Errors are problem+json (`ApiError`).

mod alerts;
mod audit;
pub mod check;
pub mod envoy;
mod history;
pub mod identifiers;
mod leases;
pub mod openapi;
pub(crate) mod policies;
mod problem;
mod report;
mod whatif;

pub use problem::ApiError;

use axum::{
    Json, Router,
    body::Bytes,
    extract::{FromRequest, Request, State},
    http::{HeaderMap, StatusCode, header},
    routing::{get, post},
};
use serde_json::{Value, json};

use crate::{domain::people::KeyRole, service::keys::KeyCaller, state::AppState};

/// Largest request body the API reads.
pub const MAX_BODY: usize = 64 * 1024;

/// Routes served outside the dashboard.
pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/api/openapi.json", get(openapi::openapi_json))
        .route("/api/v1/check", post(check::check_handler))
        .route("/api/v1/check/batch", post(check::batch_handler))
        .route("/api/v1/forward-auth", get(check::forward_auth_handler))
        .route("/api/v1/report", post(report::report))
        .route("/api/v1/audit", get(audit::list))
        .route("/api/v1/history", get(history::read))
        .route("/api/v1/history/csv", get(history::read_csv))
        .merge(alerts::router())
        .merge(policies::router())
        .merge(whatif::router())
        .merge(identifiers::router())
        .merge(leases::router())
        .merge(envoy::router())
        // On the routes above only: an unknown path is a 404 whoever asks.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            credentials_first,
        ))
        .route("/api/{*rest}", axum::routing::any(unknown_path))
        // Last, so every route above has it; axum still adds `Allow`.
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

/// The check endpoints, answered without the router: services call them on every request
/// of their own, and the router's matching and its middleware (the session layer's path
/// tests, a tracing span, boxed futures) cost a check about 3 of its 25 µs of CPU (A/B,
/// wrk, this 2-core VM). `Err` gives back any other request.
/// The handlers are the router's own, and the composition root adds what the middleware
/// would have (the request timeout, the API's security headers, closing while draining).
#[allow(clippy::result_large_err)]
pub fn check_endpoint(
    request: Request,
    state: &AppState,
) -> Result<futures_util::future::BoxFuture<'static, axum::response::Response>, Request> {
    use axum::handler::Handler;
    let handler = match check_route(request.method(), request.uri().path()) {
        Some(CheckRoute::Check) => check::check_handler.call(request, state.clone()),
        Some(CheckRoute::Batch) => check::batch_handler.call(request, state.clone()),
        Some(CheckRoute::ForwardAuth) => check::forward_auth_handler.call(request, state.clone()),
        None => return Err(request),
    };
    Ok(handler)
}

/// Whether [`check_endpoint`] answers a request of `method` to `path`.
pub fn is_check_endpoint(method: &axum::http::Method, path: &str) -> bool {
    check_route(method, path).is_some()
}

enum CheckRoute {
    Check,
    Batch,
    ForwardAuth,
}

fn check_route(method: &axum::http::Method, path: &str) -> Option<CheckRoute> {
    use axum::http::Method;
    match (method, path) {
        (&Method::POST, "/api/v1/check") => Some(CheckRoute::Check),
        (&Method::POST, "/api/v1/check/batch") => Some(CheckRoute::Batch),
        (&Method::GET | &Method::HEAD, "/api/v1/forward-auth") => Some(CheckRoute::ForwardAuth),
        _ => None,
    }
}

/// A request with a body on the admin API is read only once its caller is known: a key
/// this instance knows, or a signed-in session. Anyone else gets 401 before a byte of the
/// body is read (axum's extractors read it before a handler's own role check, so up to
/// 1 MiB a stream could be held for a caller with no credentials at all). The handler
/// still checks the role.
pub async fn credentials_first(
    State(state): State<AppState>,
    request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::{http::Method, response::IntoResponse};
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let known = if headers.contains_key(header::AUTHORIZATION)
        || headers.contains_key(crate::auth::keys::KEY_HEADER)
    {
        crate::auth::keys::caller_of_headers(state.service().keys(), headers).is_some()
    } else {
        crate::auth::session::load(&state, headers)
            .await
            .is_some_and(|s| s.user().is_some())
    };
    if known {
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// Any other path under `/api/`: a problem document, not the dashboard's page.
async fn unknown_path(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("path: nothing is served at {}", uri.path()))
}

/// A served path called with a method it does not take: a problem document, not an
/// empty 405.
pub async fn wrong_method(method: axum::http::Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}

/// Liveness: the process is up and serving. Never touches Redis.
#[utoipa::path(get, path = "/healthz", tag = "health", operation_id = "healthz", security(()), responses((status = 200, body = openapi::Status)))]
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: able to answer. Not while draining, nor before the policies were first
/// loaded; but a Redis outage keeps the instance ready, so callers get each policy's failure
/// mode rather than connection errors. Redis's state is reported here (and in
/// `spillway_redis_up`).
#[utoipa::path(get, path = "/readyz", tag = "health", operation_id = "readyz", security(()), responses((status = 200, body = openapi::Status), (status = 503, body = openapi::Problem, content_type = "application/problem+json")))]
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    ready(&state)?;
    let redis = match state.service().redis_health().await {
        Ok(health) => json!({
            "status": "up",
            "server_time_us": health.server_time_us,
            "round_trip_us": health.round_trip_us,
        }),
        Err(error) => json!({ "status": "down", "error": error.to_string() }),
    };
    // Anyone may read this: the problem's file and field, never what the file holds (a
    // parser's message may quote it); the dashboard shows the whole message.
    let folder = state
        .service()
        .domains_folder()
        .map(|f| json!({ "dir": f.dir, "problem": f.problem.as_deref().map(problem_summary) }));
    Ok(Json(json!({
        "status": "ready",
        "policies_loaded": true,
        "domains_folder": folder,
        "redis": redis,
    })))
}

/// A domains folder's problem without what follows its file and field (`broken.yaml:
/// descriptors[0].rate_limit.unit`): the part a parser may quote the file in is left out.
fn problem_summary(problem: &str) -> String {
    let problem = problem.strip_prefix("file: ").unwrap_or(problem);
    let mut parts = problem.splitn(3, ": ");
    let file = parts.next().unwrap_or_default();
    match parts.next() {
        Some(field) if !field.contains(' ') => format!("{file}: {field}: does not load"),
        Some(_) => format!("{file}: does not load"),
        None => "the folder does not load".to_owned(),
    }
}

/// Whether this instance can answer checks: not draining, and its policies loaded.
fn ready(state: &AppState) -> Result<(), ApiError> {
    if state.shutdown.is_draining() {
        return Err(ApiError::ShuttingDown);
    }
    if !state.service().policies_loaded() {
        return Err(ApiError::PoliciesNotLoaded);
    }
    Ok(())
}

/// envoyproxy/ratelimit's health check, where its users' probes look (Envoy Gateway's
/// liveness and readiness probes among them): `OK` while the instance can answer (as
/// `/readyz`: a Redis outage leaves it OK, so each domain's failure mode is served), 500
/// while draining or before the policies were first loaded.
#[utoipa::path(get, path = "/healthcheck", tag = "health", operation_id = "healthcheck", security(()), responses((status = 200, description = "OK", content_type = "text/plain"), (status = 500, description = "Shutting down, or the policies not loaded yet")))]
async fn healthcheck(State(state): State<AppState>) -> (StatusCode, &'static str) {
    match ready(&state) {
        Ok(()) => (StatusCode::OK, "OK"),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, ""),
    }
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "health", operation_id = "metrics", security(()), responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
async fn metrics() -> impl axum::response::IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::telemetry::metrics::render(),
    )
}

/// The metrics port's server (`SPILLWAY_METRICS_ADDR`): `/metrics` at `path`, nothing else.
pub fn metrics_port(path: &str) -> axum::Router {
    axum::Router::new().route(path, get(metrics))
}

/// Checks the caller's API key: `Service` accepts service and admin keys, `Admin` only
/// admin keys.
pub fn require_key(
    state: &AppState,
    headers: &HeaderMap,
    needed: KeyRole,
) -> Result<KeyCaller, ApiError> {
    let caller = crate::auth::keys::caller_of_headers(state.service().keys(), headers)
        .ok_or(ApiError::Unauthorized)?;
    match (needed, caller.role) {
        (KeyRole::Admin, KeyRole::Service) => Err(ApiError::Forbidden(
            "Authorization: this API key may only call the check endpoints",
        )),
        _ => Ok(caller),
    }
}

/// The actions an admin API handler may need, as types: `Admin<may::EditPolicies>`.
pub mod may {
    use crate::domain::people::Action;

    /// An action a caller's role must allow.
    pub trait Needs: Send + Sync + 'static {
        const ACTION: Action;
    }

    macro_rules! actions {
        ($($name:ident),*) => {$(
            #[doc = concat!("`Action::", stringify!($name), "`.")]
            pub struct $name;
            impl Needs for $name {
                const ACTION: Action = Action::$name;
            }
        )*};
    }
    actions!(
        View,
        ResetIdentifier,
        ManageOverrides,
        EditPolicies,
        ManagePeople
    );
}

/// The caller of an admin API handler, allowed to do `A` (`require_admin`: an admin key,
/// or a signed-in session whose role allows it, with the CSRF token for a change): one
/// extractor instead of the same four in every handler.
pub struct Admin<A: may::Needs>(
    pub crate::service::audit::Actor,
    std::marker::PhantomData<A>,
);

impl<A: may::Needs> axum::extract::FromRequestParts<AppState> for Admin<A> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, ApiError> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0)
            .ok_or(ApiError::Unauthorized)?;
        let actor = require_admin(state, &parts.headers, &parts.method, peer, A::ACTION).await?;
        Ok(Self(actor, std::marker::PhantomData))
    }
}

/// The header a signed-in browser sends its session's CSRF token in, for changes through
/// the admin API.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The caller of the admin API, as the audit log names them: an admin API key (which may do
/// everything), or a signed-in dashboard session whose role may do `action`. A session's
/// changes need its CSRF token in `X-CSRF-Token` and must come from this site, as the
/// dashboard's forms do.
async fn require_admin(
    state: &AppState,
    headers: &HeaderMap,
    method: &axum::http::Method,
    peer: std::net::SocketAddr,
    action: crate::domain::people::Action,
) -> Result<crate::service::audit::Actor, ApiError> {
    if headers.contains_key(header::AUTHORIZATION) {
        let caller = require_key(state, headers, KeyRole::Admin)?;
        return Ok(key_actor(&caller, peer));
    }
    let session = crate::auth::session::load(state, headers)
        .await
        .ok_or(ApiError::Unauthorized)?;
    let (user, role) = session.user().ok_or(ApiError::Unauthorized)?;
    if !role.may(action) {
        return Err(ApiError::Forbidden(
            "session: the signed-in user's role may not do this",
        ));
    }
    let reads = matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD);
    if !reads {
        let token = headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !session.csrf_matches(token)
            || !crate::auth::origin::from_this_site(state, peer.ip(), headers)
        {
            return Err(ApiError::Forbidden(
                "X-CSRF-Token: a signed-in browser's change needs its session's CSRF token, sent from this site",
            ));
        }
    }
    Ok(crate::service::audit::Actor {
        name: format!("user:{user}"),
        role: role.to_string(),
        ip: state
            .trusted_proxies
            .client_ip(peer.ip(), headers)
            .to_string(),
    })
}

/// The audit actor for an admin key calling from `addr`.
pub fn key_actor(caller: &KeyCaller, addr: std::net::SocketAddr) -> crate::service::audit::Actor {
    crate::service::audit::Actor {
        name: caller.actor.clone(),
        role: caller.role.as_str().to_owned(),
        ip: addr.ip().to_string(),
    }
}

/// A JSON body of at most 64 KiB, with every way it can be wrong turned into problem+json
/// (413 when too large, 415 when not JSON, 400 naming `body` when it does not parse).
pub struct JsonBody(pub Value);

impl JsonBody {
    /// Parses the bytes of a `JsonBytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        serde_json::from_slice(bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad("body", format!("is not valid JSON: {e}")))
    }
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let JsonBytes(bytes) = JsonBytes::from_request(req, state).await?;
        Self::parse(&bytes)
    }
}

/// The bytes of a JSON body, not parsed yet: as `JsonBody` (413, 415), for a handler that
/// parses them into its own types (the check path).
pub struct JsonBytes(pub Bytes);

impl JsonBytes {
    /// Reads the body of a request whose header is `headers`: 415 unless it says JSON, 413
    /// past 64 KiB (whatever layers the request came through: the check endpoints are served
    /// before the router and its body limit).
    pub async fn read(headers: &HeaderMap, body: axum::body::Body) -> Result<Self, ApiError> {
        use http_body_util::BodyExt;
        let is_json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        match http_body_util::Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => Ok(JsonBytes(collected.to_bytes())),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                Err(ApiError::PayloadTooLarge)
            }
            Err(_) => Err(ApiError::bad("body", "could not be read")),
        }
    }
}

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        Self::read(&parts.headers, body).await
    }
}
