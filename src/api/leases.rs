//! Leases of concurrency rules: the holder of a lease that a check handed out releases it
//! when its work is done, or renews it while the work goes on (service keys, as for checks).

use axum::{Json, Router, extract::State, http::HeaderMap, routing::post};
use serde_json::{Value, json};

use super::{ApiError, JsonBody, require_key};
use crate::{
    domain::lease::LeaseId, domain::people::KeyRole, service::leases::MAX_LEASES_PER_CALL,
    state::AppState,
};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/leases/release", post(release))
        .route("/api/v1/leases/renew", post(renew))
}

/// The caller's key checked, then the lease ids of the body: `{"leases": [id, ...]}` or
/// `{"lease": id}`, parsed and as given.
fn lease_ids(
    state: &AppState,
    headers: &HeaderMap,
    body: &Value,
) -> Result<(Vec<LeaseId>, Vec<String>), ApiError> {
    require_key(state, headers, KeyRole::Service)?;
    let (field, raw): (&str, Vec<&Value>) = match (body.get("leases"), body.get("lease")) {
        (Some(Value::Array(items)), None) => ("leases", items.iter().collect()),
        (None, Some(one)) => ("lease", vec![one]),
        (Some(_), None) => return Err(ApiError::bad("leases", "must be an array of lease ids")),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad("lease", "give lease or leases, not both"));
        }
        (None, None) => {
            return Err(ApiError::bad(
                "leases",
                "is required: the lease ids a check answered with",
            ));
        }
    };
    if raw.is_empty() || raw.len() > MAX_LEASES_PER_CALL {
        return Err(ApiError::bad(
            field,
            format!("must name 1 to {MAX_LEASES_PER_CALL} leases"),
        ));
    }
    let mut ids = Vec::with_capacity(raw.len());
    let mut texts = Vec::with_capacity(raw.len());
    for (i, v) in raw.into_iter().enumerate() {
        let at = if field == "lease" {
            "lease".to_owned()
        } else {
            format!("leases[{i}]")
        };
        let text = v
            .as_str()
            .ok_or_else(|| ApiError::bad(at.clone(), "must be a string"))?;
        ids.push(text.parse().map_err(|m: String| ApiError::bad(at, m))?);
        texts.push(text.to_owned());
    }
    Ok((ids, texts))
}

/// Releases leases (one or many); releasing one twice, or one that ran out, is harmless.
#[utoipa::path(post, path = "/api/v1/leases/release", tag = "checks", operation_id = "release_leases",
    request_body = crate::api::openapi::LeaseRequest,
    responses((status = 200, description = "For each lease, whether it was held until now", body = crate::api::openapi::LeaseRelease),
        (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unreachable", body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let (ids, texts) = lease_ids(&state, &headers, &body.0)?;
    let released = state
        .service()
        .release_leases(&ids)
        .await
        .map_err(ApiError::RedisUnavailable)?;
    Ok(results(
        texts,
        released,
        |released| json!({ "released": released }),
    ))
}

/// `{"results": [...]}`: each lease as given, with what `each` says of it.
fn results<T>(texts: Vec<String>, answers: Vec<T>, each: impl Fn(T) -> Value) -> Json<Value> {
    let results: Vec<Value> = texts
        .into_iter()
        .zip(answers)
        .map(|(lease, answer)| {
            let mut item = each(answer);
            item["lease"] = json!(lease);
            item
        })
        .collect();
    Json(json!({ "results": results }))
}

/// Renews leases by their rule's `lease_ms` from now. A lease no longer held (released, or
/// run out and possibly given to another caller) is not renewed: its holder must check again.
#[utoipa::path(post, path = "/api/v1/leases/renew", tag = "checks", operation_id = "renew_leases",
    request_body = crate::api::openapi::LeaseRequest,
    responses((status = 200, description = "For each lease, whether it was renewed and until when", body = crate::api::openapi::LeaseRenewal),
        (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unreachable", body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn renew(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let (ids, texts) = lease_ids(&state, &headers, &body.0)?;
    let renewed = state
        .service()
        .renew_leases(&ids)
        .await
        .map_err(ApiError::RedisUnavailable)?;
    Ok(results(
        texts,
        renewed,
        |until| json!({ "renewed": until.is_some(), "expires_in_ms": until }),
    ))
}
