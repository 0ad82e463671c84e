//! The check endpoints services call on every request: `POST /api/v1/check`,
//! `POST /api/v1/check/batch` and `GET /api/v1/forward-auth`. Parsing a request is
//! `request.rs`; rendering the service's answer (body and RateLimit headers), `answer.rs`.

mod answer;
mod proxied;
mod request;

pub use answer::{CheckAnswer, CheckBody, ResultBody, rate_limit_headers};

use axum::{
    Json,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, JsonBody, JsonBytes, require_key};
use crate::{
    domain::{Identifier, people::KeyRole},
    service::CheckRequest,
    state::AppState,
};

pub use crate::service::check::{MAX_COST, MAX_IDENTIFIERS};

/// Most checks in one batch.
pub const MAX_BATCH: usize = 100;

/// Runs one check through the service and renders its answer. `deny_status` is 429 except
/// for forward-auth, where it is configurable.
pub async fn check(
    state: &AppState,
    request: &CheckRequest,
    deny_status: StatusCode,
) -> Result<CheckAnswer, ApiError> {
    let checked = state.service().check(request).await?;
    Ok(answer::answer(&checked, deny_status))
}

/// `POST /api/v1/check`
#[utoipa::path(post, path = "/api/v1/check", tag = "checks", operation_id = "check", request_body = crate::api::openapi::CheckRequest, responses((status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), 
    (status = 200, description = "Allowed (or shadow mode)", body = crate::api::openapi::CheckResponse, headers(
        ("RateLimit-Policy" = String, description = "Every rule evaluated: `\"per-second\";q=10;w=1` (RFC 9651 list)"),
        ("RateLimit" = String, description = "The binding rule's state: `\"per-second\";r=9;t=1`"),
        ("Spillway-Unmatched" = String, description = "`?1` when no rule met any identifier (`unmatched`)"),
        ("Spillway-Unused" = String, description = "The dimensions sent that no rule counts, as a list of strings (`\"usr\"`), when there are any (`unused`)"))),
    (status = 429, description = "Denied", body = crate::api::openapi::CheckResponse, headers(
        ("RateLimit-Policy" = String, description = "Every rule evaluated"),
        ("RateLimit" = String, description = "The binding rule's state"),
        ("Retry-After" = u64, description = "Seconds until the check could pass (at most 1 for a concurrency rule)"))),
    (status = 400, description = "A field is wrong, or a strict policy's rules meet none of the identifiers (`unmatched-identifiers`) or count none of a dimension sent (`unknown-dimensions`)", body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 422, description = "`cost-too-high`: a rule counts the check as more than it ever admits; no wait would let it pass", body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 413, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 503, description = "Redis unreachable and the policy fails closed", body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub async fn check_handler(
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> Result<CheckAnswer, ApiError> {
    // The request's own header, not a copy (an extracted `HeaderMap` is one per check).
    let (parts, body) = request.into_parts();
    // The key first: no body is read for a caller without one.
    require_key(&state, &parts.headers, KeyRole::Service)?;
    let body = JsonBytes::read(&parts.headers, body).await?;
    let request = CheckRequest::from_body(&body.0)?;
    check(&state, &request, StatusCode::TOO_MANY_REQUESTS).await
}

/// `POST /api/v1/check/batch`: `{"checks": [...]}`, up to 100, answered in order, each with
/// its own status and body.
#[utoipa::path(post, path = "/api/v1/check/batch", tag = "checks", operation_id = "check_batch", request_body = crate::api::openapi::BatchRequest, responses((status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), 
    (status = 200, body = crate::api::openapi::BatchResponse), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub async fn batch_handler(
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    // The key first: no body is read for a caller without one.
    let (parts, body) = request.into_parts();
    require_key(&state, &parts.headers, KeyRole::Service)?;
    let body = JsonBody::parse(&JsonBytes::read(&parts.headers, body).await?.0)?;
    let checks = body
        .0
        .get("checks")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("checks", "is required: an array of check requests"))?;
    if checks.is_empty() || checks.len() > MAX_BATCH {
        return Err(ApiError::bad(
            "checks",
            format!("must hold 1 to {MAX_BATCH} checks"),
        ));
    }
    let requests: Vec<Result<CheckRequest, ApiError>> = checks
        .iter()
        .enumerate()
        .map(|(i, item)| CheckRequest::parse(item, &format!("checks[{i}].")))
        .collect();
    let valid: Vec<&CheckRequest> = requests.iter().filter_map(|r| r.as_ref().ok()).collect();
    let mut checked = state.service().check_all(valid).await.into_iter();
    let results: Vec<Value> = requests
        .iter()
        .enumerate()
        .map(|(i, request)| {
            let answer = match request {
                Err(e) => Err(e),
                Ok(_) => Ok(checked.next().expect("one answer per valid check")),
            };
            match answer {
                Ok(Ok(c)) => {
                    let a = answer::answer(&c, StatusCode::TOO_MANY_REQUESTS);
                    json!({ "status": a.status.as_u16(), "body": serde_json::to_value(&a.body).unwrap_or(Value::Null) })
                }
                Ok(Err(e)) => {
                    // A field of this check is named as the batch holds it.
                    let e = match e {
                        crate::service::CheckError::BadLimits { field, message } => {
                            ApiError::bad(format!("checks[{i}].{field}"), message)
                        }
                        e => ApiError::from(e),
                    };
                    json!({ "status": e.status().as_u16(), "body": e.body() })
                }
                Err(e) => json!({ "status": e.status().as_u16(), "body": e.body() }),
            }
        })
        .collect();
    Ok(Json(json!({ "results": results })))
}

/// Query of forward-auth. Both are strings so that parsing the query never fails before
/// our own field-named errors can answer.
#[derive(Deserialize)]
pub struct ForwardAuthQuery {
    policy: Option<String>,
    cost: Option<String>,
}

/// `GET /api/v1/forward-auth?policy=<name>` for Traefik ForwardAuth, Envoy ext_authz and
/// nginx auth_request: identifiers come from the configured headers (`X-Forwarded-For` →
/// `ip`: the address the calling proxy appended, or further left past trusted proxies, see
/// `crate::net::forwarded`); the key may come as `Authorization: Bearer` or `X-Spillway-Key`.
#[utoipa::path(get, path = "/api/v1/forward-auth", tag = "checks", operation_id = "forward_auth", params(("policy" = String, Query, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("cost" = Option<u64>, Query, description = "Default 1", maximum = 1000000000), ("X-Forwarded-For" = String, Header, description = "The client address (the default identifier header)", pattern = "^[0-9a-fA-F.:]{2,45}$")), responses(
    (status = 200, description = "Allowed", body = crate::api::openapi::CheckResponse),
    (status = 429, description = "Denied (the status is configurable)", body = crate::api::openapi::CheckResponse), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 403, description = "Refused for what the request is: a cost no rule ever admits, an X-Forwarded-For that is not an address (the problem also in `Spillway-Problem`)", body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 500, description = "The gate is set up wrong: no policy named so, no identifier header, a dimension no rule counts (the problem also in `Spillway-Problem`; a proxy passes on only 2xx, 401, 403, 429 and 5xx)", body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 503, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub async fn forward_auth_handler(
    State(state): State<AppState>,
    Query(query): Query<ForwardAuthQuery>,
    headers: HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match forward_auth(state, query, headers).await {
        Ok(answer) => answer.into_response(),
        Err(error) => proxied::for_a_proxy(error),
    }
}

/// Forward-auth's check: the identifiers from the configured headers, the policy's answer.
async fn forward_auth(
    state: AppState,
    query: ForwardAuthQuery,
    headers: HeaderMap,
) -> Result<CheckAnswer, ApiError> {
    if crate::auth::keys::caller_of_headers(state.service().keys(), &headers).is_none() {
        return Err(ApiError::Unauthorized);
    }
    let policy = query
        .policy
        .ok_or_else(|| ApiError::bad("policy", "is required as a query parameter"))?;
    let cost = match query.cost {
        None => 1,
        Some(raw) => raw
            .parse::<u64>()
            .ok()
            .filter(|c| *c <= MAX_COST)
            .ok_or_else(|| ApiError::bad("cost", "must be a whole number"))?,
    };
    let mut identifiers = Vec::new();
    for (dimension, header_name) in &state.forward_auth.identifiers {
        let Some(raw) = headers
            .get(header_name.as_str())
            .and_then(|v| v.to_str().ok())
        else {
            continue;
        };
        let client;
        let value = if header_name == "x-forwarded-for" {
            // The caller holds a service key: the address it appended (the rightmost) is
            // believed, and so are those further left only while they are trusted proxies.
            // What the client itself wrote there is never the identifier.
            match state
                .trusted_proxies
                .forwarded_client(&headers)
                .map_err(|m| ApiError::bad("X-Forwarded-For", m))?
            {
                Some(ip) => {
                    client = ip.to_string();
                    client.as_str()
                }
                None => continue,
            }
        } else {
            raw.trim()
        };
        if value.is_empty() {
            continue;
        }
        identifiers.push(
            Identifier::new(dimension, value).map_err(|m| ApiError::bad(header_name.clone(), m))?,
        );
    }
    if identifiers.is_empty() {
        let names: Vec<&str> = state
            .forward_auth
            .identifiers
            .iter()
            .map(|(_, h)| h.as_str())
            .collect();
        return Err(ApiError::bad(
            names.join(", "),
            "no identifier header in the request",
        ));
    }
    let deny = StatusCode::from_u16(state.forward_auth.deny_status)
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let request = CheckRequest {
        policy,
        identifiers,
        cost,
        limits: Default::default(),
    };
    // A policy that waits holds a denied request here, within the request's own timeout
    // (less a little to answer in).
    let deadline = std::time::Instant::now()
        + state
            .request_timeout
            .saturating_sub(std::time::Duration::from_millis(50));
    let checked = state
        .service()
        .check_or_wait(&request, Some(deadline))
        .await?;
    Ok(answer::answer(&checked, deny))
}
