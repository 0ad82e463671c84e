//! The admin JSON API for identifiers: the live state of every rule of every policy for one
//! identifier, and resetting it (all policies, one policy, or one rule).

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Admin, ApiError, may};
use crate::{domain::Identifier, state::AppState};

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/api/v1/identifiers/{dimension}/{value}",
            get(inspect).delete(reset),
        )
        .route("/api/v1/resets/{token}/undo", post(undo_reset))
}

fn identifier(dimension: &str, value: &str) -> Result<Identifier, ApiError> {
    Identifier::new(dimension, value).map_err(|m| ApiError::bad("identifier", m))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
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
#[utoipa::path(get, path = "/api/v1/identifiers/{dimension}/{value}", tag = "identifiers", operation_id = "inspect_identifier",
    params(("dimension" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("value" = String, Path, pattern = "^[^\\x00-\\x1f\\x7f]{1,256}$")),
    responses((status = 200, description = "One entry per policy", body = crate::api::openapi::Inspection), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn inspect(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    Path((dimension, value)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let id = identifier(&dimension, &value)?;
    let inspection = state
        .service()
        .inspect(&id)
        .await
        .map_err(ApiError::RedisUnavailable)?;
    Ok(Json(json!(inspection)))
}

/// Resets the identifier's counters: everywhere, in one policy, or for one rule of it.
/// Every instance forgets its cached denials of it at once.
#[utoipa::path(delete, path = "/api/v1/identifiers/{dimension}/{value}", tag = "identifiers", operation_id = "reset_identifier",
    params(("dimension" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("value" = String, Path, pattern = "^[^\\x00-\\x1f\\x7f]{1,256}$"), ResetQuery),
    responses((status = 200, description = "What was reset", body = crate::api::openapi::ResetResult), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn reset(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::ResetIdentifier>,
    Path((dimension, value)): Path<(String, String)>,
    Query(query): Query<ResetQuery>,
) -> Result<Json<Value>, ApiError> {
    let reason = query.reason.as_deref().unwrap_or("").trim();
    if reason.chars().count() > 500 {
        return Err(ApiError::bad("reason", "must be at most 500 characters"));
    }
    let id = identifier(&dimension, &value)?;
    let done = state
        .service()
        .reset_identifier(
            &actor,
            &id,
            query.policy.as_deref(),
            query.rule.as_deref(),
            reason,
        )
        .await?;
    let undo = done
        .undo
        .map(|u| json!({ "token": u.token, "until_ms": u.until_ms }));
    Ok(Json(
        json!({ "identifier": id.to_string(), "policies": done.policies, "deleted_keys": done.deleted_keys, "undo": undo }),
    ))
}

/// Puts back the counters a reset deleted, each with the time it had left: within a
/// minute of the reset, once. A check made since the reset is replaced by the state
/// before it.
#[utoipa::path(post, path = "/api/v1/resets/{token}/undo", tag = "identifiers", operation_id = "undo_reset",
    params(("token" = String, Path, description = "The reset's `undo.token`")),
    responses((status = 200, description = "What was put back", body = crate::api::openapi::ResetUndone), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, description = "No reset of that token can be undone (over a minute old, or undone)", body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn undo_reset(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::ResetIdentifier>,
    Path(token): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let done = state.service().undo_reset(&actor, &token).await?;
    Ok(Json(
        json!({ "identifiers": done.identifiers, "restored_keys": done.restored_keys }),
    ))
}
