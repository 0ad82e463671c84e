//! The admin JSON API for identifiers: the live state of every rule of every policy for one
//! identifier, and resetting it (all policies, one policy, or one rule).

use std::net::SocketAddr;

use axum::{
    Json, Router,
    extract::{ConnectInfo, Path, Query, State},
    http::HeaderMap,
    routing::get,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, key_actor, require_key};
use crate::{
    audit::Change,
    auth::KeyRole,
    domain::{Identifier, Name},
    state::AppState,
};

pub fn router() -> Router<AppState> {
    Router::new().route(
        "/api/v1/identifiers/{dimension}/{value}",
        get(inspect).delete(reset),
    )
}

fn identifier(dimension: &str, value: &str) -> Result<Identifier, ApiError> {
    Identifier::new(dimension, value).map_err(|m| ApiError::bad("identifier", m))
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct ResetQuery {
    /// Only this policy.
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    policy: Option<String>,
    /// Only this rule (needs `policy`).
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    rule: Option<String>,
    /// Why (kept in the audit log).
    #[param(max_length = 500)]
    reason: Option<String>,
}

/// Live state of every rule of every policy that applies to the identifier (a peek: nothing
/// is consumed).
#[utoipa::path(get, path = "/api/v1/identifiers/{dimension}/{value}",
    params(("dimension" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("value" = String, Path, pattern = "^[^\\x00-\\x1f\\x7f]{1,256}$")),
    responses((status = 200, description = "One entry per policy"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn inspect(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((dimension, value)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    require_key(&state, &headers, KeyRole::Admin)?;
    let id = identifier(&dimension, &value)?;
    let inspection = crate::app::inspector::inspect_now(&state, &id.to_string()).await;
    if let Some(problem) = inspection.error {
        tracing::warn!(%problem, "identifier inspection failed");
        return Err(ApiError::RedisUnavailable(crate::store::StoreError::Reply(
            problem,
        )));
    }
    Ok(Json(json!(inspection)))
}

/// Resets `id`'s counters: everywhere, in one policy, or for one rule of it; every instance
/// forgets its cached denials of it at once. Returns the policies touched and how many keys
/// were deleted. Shared by the JSON API and the dashboard.
pub async fn reset_scope(
    state: &AppState,
    id: &Identifier,
    policy: Option<&str>,
    rule: Option<&str>,
) -> Result<(Vec<String>, u64), ApiError> {
    let rule = match rule {
        None => None,
        Some(_) if policy.is_none() => return Err(ApiError::bad("rule", "needs policy too")),
        Some(r) => Some(Name::parse(r).map_err(|m| ApiError::bad("rule", m))?),
    };
    let all = state
        .store
        .list_policies()
        .await
        .map_err(ApiError::RedisUnavailable)?;
    let chosen: Vec<_> = match policy {
        None => all.iter().collect(),
        Some(name) => {
            let p = all
                .iter()
                .find(|p| p.name.as_str() == name)
                .ok_or_else(|| ApiError::UnknownPolicy(name.to_owned()))?;
            if let Some(r) = &rule
                && !p.all_rules().any(|x| &x.name == r)
            {
                return Err(ApiError::bad("rule", format!("{name} has no rule {r}")));
            }
            vec![p]
        }
    };
    let deleted = state
        .store
        .reset_identifier(&chosen, id, rule.as_ref(), policy.is_none())
        .await
        .map_err(ApiError::RedisUnavailable)?;
    let names: Vec<String> = chosen.iter().map(|p| p.name.to_string()).collect();
    // This instance forgets at once; others on the pub/sub message.
    state
        .denials
        .invalidate(policy.is_some().then_some(names.as_slice()), id);
    Ok((names, deleted))
}

/// Resets the identifier's counters: everywhere, in one policy, or for one rule of it.
/// Every instance forgets its cached denials of it at once.
#[utoipa::path(delete, path = "/api/v1/identifiers/{dimension}/{value}",
    params(("dimension" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("value" = String, Path, pattern = "^[^\\x00-\\x1f\\x7f]{1,256}$"), ResetQuery),
    responses((status = 200, description = "How many keys were deleted"), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn reset(
    State(state): State<AppState>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path((dimension, value)): Path<(String, String)>,
    Query(query): Query<ResetQuery>,
) -> Result<Json<Value>, ApiError> {
    let caller = require_key(&state, &headers, KeyRole::Admin)?;
    let reason = query.reason.as_deref().unwrap_or("").trim();
    if reason.chars().count() > 500 {
        return Err(ApiError::bad("reason", "must be at most 500 characters"));
    }
    let id = identifier(&dimension, &value)?;
    let (names, deleted) =
        reset_scope(&state, &id, query.policy.as_deref(), query.rule.as_deref()).await?;
    let scope = json!({ "policies": names, "rule": query.rule, "deleted_keys": deleted });
    let _ = key_actor(&caller, addr)
        .record(
            &state.store,
            Change {
                action: "identifier.reset",
                target: &id.to_string(),
                before: String::new(),
                after: scope.to_string(),
                reason,
            },
        )
        .await;
    Ok(Json(
        json!({ "identifier": id.to_string(), "policies": names, "deleted_keys": deleted }),
    ))
}
