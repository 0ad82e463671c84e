//! `GET /api/v1/audit`: the audit log for automation, with the audit page's filters (the
//! service reads it for both). Admin keys, or a signed-in session.

use axum::{
    Json,
    extract::{Query, State},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Admin, ApiError, may};
use crate::state::AppState;

/// Records per answer; `older` names the id to pass as `before` for the next page.
const PAGE: usize = 100;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct AuditQuery {
    /// Only this actor (`user:ann`, `key:ci`).
    actor: Option<String>,
    /// Only actions starting with this (`policy.`, `identifier.reset`).
    action: Option<String>,
    /// Only records at or after this UTC time (`2026-11-22 10:58`).
    since: Option<String>,
    /// Only records up to this UTC minute.
    until: Option<String>,
    /// Only records older than this record id (paging).
    before: Option<String>,
}

/// The newest audit records first, filtered as the audit page filters them.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", operation_id = "list_audit_records",
    params(AuditQuery),
    responses((status = 200, description = "Records newest first, and the id to page from", body = crate::api::openapi::AuditPage),
    (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn list(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    let query = crate::service::audit::AuditQuery {
        actor: query.actor.as_deref().unwrap_or_default(),
        action: query.action.as_deref().unwrap_or_default(),
        since: query.since.as_deref().unwrap_or_default(),
        until: query.until.as_deref().unwrap_or_default(),
        before: query.before.as_deref().unwrap_or_default(),
    };
    let page = state.service().read_audit(&query, PAGE).await?;
    Ok(Json(
        json!({ "entries": page.entries, "older": page.older }),
    ))
}
