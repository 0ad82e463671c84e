//! `GET /api/v1/audit`: the audit log for automation, with the audit page's filters. Admin
//! API keys only.

use std::net::SocketAddr;

use axum::{
    Json,
    extract::{ConnectInfo, Query, State},
    http::{HeaderMap, Method},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, require_admin};
use crate::{
    domain::{
        people::{Action, AuditFilter},
        time::parse_utc,
    },
    state::AppState,
};

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
    responses((status = 200, description = "`{entries, older}`: records newest first, and the id to page from"),
    (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn list(
    State(state): State<AppState>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    require_admin(&state, &headers, &method, addr, Action::View).await?;
    let time = |field: &'static str, raw: &Option<String>| -> Result<Option<i64>, ApiError> {
        match raw.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(raw) => parse_utc(raw)
                .map(Some)
                .map_err(|m| ApiError::bad(field, m)),
        }
    };
    let filter = AuditFilter {
        actor: query.actor.unwrap_or_default().trim().to_owned(),
        action: query.action.unwrap_or_default().trim().to_owned(),
        since_ms: time("since", &query.since)?,
        until_ms: time("until", &query.until)?.map(|t| t + 59_999),
    };
    let before = query
        .before
        .as_deref()
        .map(str::trim)
        .filter(|b| !b.is_empty());
    if let Some(b) = before
        && !b
            .split_once('-')
            .is_some_and(|(a, z)| a.parse::<u64>().is_ok() && z.parse::<u64>().is_ok())
    {
        return Err(ApiError::bad("before", "is not a record id"));
    }
    let entries = state
        .store
        .read_audit(&filter, PAGE, before)
        .await
        .map_err(ApiError::RedisUnavailable)?;
    let older = (entries.len() == PAGE).then(|| entries[PAGE - 1].id.clone());
    Ok(Json(json!({ "entries": entries, "older": older })))
}
