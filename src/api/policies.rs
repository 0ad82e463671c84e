//! The admin JSON API for policies: list, read, create or replace (versioned), delete,
//! history, and overrides. Admin API keys only.

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use serde_json::{Value, json};

use super::{Admin, ApiError, JsonBody, may};
use crate::{
    domain::{Name, Policy, overrides::Override},
    service::policies::view,
    state::AppState,
};

pub fn router() -> axum::Router<AppState> {
    Router::new()
        .route("/api/v1/policies", get(list))
        .route("/api/v1/policies/{name}", get(read).put(put).delete(delete))
        .route("/api/v1/policies/{name}/versions", get(versions))
        .route(
            "/api/v1/policies/{name}/overrides",
            get(list_overrides).post(add_override),
        )
        .route(
            "/api/v1/policies/{name}/overrides/{index}",
            axum::routing::delete(remove_override),
        )
}

fn name(raw: &str) -> Result<Name, ApiError> {
    Name::parse(raw).map_err(|m| ApiError::bad("name", m))
}

#[utoipa::path(get, path = "/api/v1/policies", tag = "policies", operation_id = "list_policies", responses((status = 200, body = crate::api::openapi::PolicyList), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn list(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
) -> Result<Json<Value>, ApiError> {
    let policies = state
        .service()
        .stored_policies()
        .await
        .map_err(ApiError::RedisUnavailable)?;
    Ok(Json(
        json!({ "policies": policies.iter().map(view).collect::<Vec<_>>() }),
    ))
}

async fn load(state: &AppState, name: &Name) -> Result<Policy, ApiError> {
    state
        .service()
        .stored_policy(name)
        .await
        .map_err(ApiError::RedisUnavailable)?
        .ok_or_else(|| ApiError::UnknownPolicy(name.to_string()))
}

#[utoipa::path(get, path = "/api/v1/policies/{name}", tag = "policies", operation_id = "get_policy", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")), responses((status = 200, body = crate::api::openapi::PolicyView), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn read(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let policy = load(&state, &name(&raw)?).await?;
    Ok(([(header::ETAG, policy.etag())], Json(view(&policy))))
}

/// `If-Match: "<version>"` makes the write conditional (optimistic concurrency); the
/// entity tag a read gives (`"3.2"`: version 3, its overrides changed twice since) also
/// refuses a write over overrides changed meanwhile.
fn expected_version(headers: &HeaderMap) -> Result<Option<(u64, Option<u64>)>, ApiError> {
    let Some(raw) = headers.get(header::IF_MATCH).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let bad = || {
        ApiError::bad(
            "If-Match",
            "must be a policy's entity tag such as \"3\" or \"3.2\"",
        )
    };
    let tag = raw.trim().trim_matches('"');
    let (version, rev) = match tag.split_once('.') {
        Some((v, r)) => (v, Some(r.parse::<u64>().map_err(|_| bad())?)),
        None => (tag, None),
    };
    Ok(Some((version.parse::<u64>().map_err(|_| bad())?, rev)))
}

#[utoipa::path(put, path = "/api/v1/policies/{name}", tag = "policies", operation_id = "put_policy", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("If-Match" = Option<String>, Header, description = "Only if the current version is this one")), request_body = crate::api::openapi::PolicyDocument, responses((status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 201, body = crate::api::openapi::PolicyView), (status = 200, body = crate::api::openapi::PolicyView), (status = 409, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn put(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::EditPolicies>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    let policy = Policy::from_document(&raw, &body.0)?;
    crate::domain::policy::refuse_reserved(&policy.name)?;
    let saved = state
        .service()
        .save_policy_document(&actor, policy, expected_version(&headers)?)
        .await?;
    let status = if saved.version == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, [(header::ETAG, saved.etag())], Json(view(&saved))))
}

#[utoipa::path(delete, path = "/api/v1/policies/{name}", tag = "policies", operation_id = "delete_policy", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")), responses((status = 204, description = "Deleted"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn delete(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::EditPolicies>,
    Path(raw): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.service().delete_policy(&actor, &name(&raw)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/policies/{name}/versions", tag = "policies", operation_id = "list_policy_versions", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")), responses((status = 200, body = crate::api::openapi::PolicyVersions), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn versions(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let name = name(&raw)?;
    let history = state
        .service()
        .policy_versions(&name, 100)
        .await
        .map_err(ApiError::RedisUnavailable)?;
    Ok(Json(
        json!({ "policy": name, "previous_versions": history.iter().map(view).collect::<Vec<_>>() }),
    ))
}

#[utoipa::path(get, path = "/api/v1/policies/{name}/overrides", tag = "overrides", operation_id = "list_overrides", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")), responses((status = 200, body = crate::api::openapi::OverrideList), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn list_overrides(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let policy = load(&state, &name(&raw)?).await?;
    Ok(Json(
        json!({ "policy": policy.name, "version": policy.version, "overrides": policy.overrides }),
    ))
}

/// Adds one override: a new version of the policy, so the previous one stays in its history.
#[utoipa::path(post, path = "/api/v1/policies/{name}/overrides", tag = "overrides", operation_id = "add_override", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")), request_body = crate::api::openapi::OverrideDocument, responses((status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 409, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 201, body = crate::api::openapi::OverrideList), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn add_override(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::ManageOverrides>,
    Path(raw): Path<String>,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    let added = Override::from_document(&body.0, "body")?;
    if added.loosens_broadly() && actor.role != "admin" {
        return Err(ApiError::Forbidden(
            "body.match: an override that lifts or changes the limit for a wildcard, or for a network wider than an IPv4 /16 or an IPv6 /48, can turn the policy off for everyone; only an admin may add one",
        ));
    }
    added.refuse_unmatchable("body")?;
    added.refuse_past_expiry("body", crate::support::clock::now_ms())?;
    let saved = state
        .service()
        .change_policy(&actor, &name(&raw)?, "override.add", "", |current| {
            if current.overrides.len() >= crate::domain::overrides::MAX_OVERRIDES {
                return Err(ApiError::bad(
                    "body",
                    "this policy has the most overrides allowed",
                ));
            }
            current.refuse_shadowed(&added, "body")?;
            let mut next = current.clone();
            next.overrides.push(added);
            Ok(next)
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(
            json!({ "policy": saved.name, "version": saved.version, "overrides": saved.overrides }),
        ),
    ))
}

/// Removes one override (by its place in the list, from 0): a new version of the policy,
/// audited as the dashboard's removal is.
#[utoipa::path(delete, path = "/api/v1/policies/{name}/overrides/{index}", tag = "overrides", operation_id = "remove_override", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("index" = usize, Path, description = "The override's place in the list, from 0")), responses((status = 200, body = crate::api::openapi::OverrideList), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 409, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn remove_override(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::ManageOverrides>,
    Path((raw, index)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let index: usize = index
        .parse()
        .map_err(|_| ApiError::bad("index", "must be the override's place in the list, from 0"))?;
    let saved = state
        .service()
        .change_policy(&actor, &name(&raw)?, "override.remove", "", |current| {
            if index >= current.overrides.len() {
                return Err(ApiError::NotFound(format!(
                    "index: {} has {} overrides",
                    current.name,
                    current.overrides.len()
                )));
            }
            let mut next = current.clone();
            next.overrides.remove(index);
            Ok(next)
        })
        .await?;
    Ok(Json(
        json!({ "policy": saved.name, "version": saved.version, "overrides": saved.overrides }),
    ))
}
