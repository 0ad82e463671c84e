//! Alert rules over the admin API: `GET /api/v1/alerts` (the rules, what fires, the latest
//! deliveries), `PUT /api/v1/alerts/{name}` and `DELETE /api/v1/alerts/{name}` (audited).
//! Reading needs any admin key or session; changing needs the right to edit policies.

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    routing::get,
};
use serde_json::{Value, json};

use super::{Admin, ApiError, JsonBody, may};
use crate::{
    domain::alerts::AlertRule,
    service::alerts::{AlertError, shown},
    state::AppState,
};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/v1/alerts", get(list)).route(
        "/api/v1/alerts/{name}",
        axum::routing::put(put).delete(delete),
    )
}

impl From<AlertError> for ApiError {
    fn from(e: AlertError) -> Self {
        match e {
            AlertError::Invalid { field, message } => ApiError::bad(field, message),
            AlertError::Unknown(name) => {
                ApiError::NotFound(format!("name: no alert rule named {name:?}"))
            }
            AlertError::Unavailable(error) => ApiError::RedisUnavailable(error),
        }
    }
}

/// The field a serde error is about (`missing field `secret``), if it names one.
fn field_of(message: &str) -> Option<&str> {
    message
        .split('`')
        .nth(1)
        .filter(|_| message.contains("field"))
}

/// A rule document, each error naming its field (`condition.per_second`, `secret`).
fn parse_rule(mut doc: Value) -> Result<AlertRule, ApiError> {
    let Some(map) = doc.as_object_mut() else {
        return Err(ApiError::bad("body", "must be a JSON object"));
    };
    // The condition first: its errors are the condition's.
    if let Some(condition) = map.get("condition") {
        serde_json::from_value::<crate::domain::alerts::Condition>(condition.clone()).map_err(
            |e| {
                let message = e.to_string();
                let field =
                    field_of(&message).map_or("condition".to_owned(), |f| format!("condition.{f}"));
                ApiError::bad(field, message)
            },
        )?;
    }
    serde_json::from_value(doc).map_err(|e| {
        let message = e.to_string();
        ApiError::bad(field_of(&message).unwrap_or("body").to_owned(), message)
    })
}

/// The rules (secrets hidden), what fires now, and the latest deliveries.
#[utoipa::path(get, path = "/api/v1/alerts", tag = "alerts", operation_id = "list_alerts",
    responses((status = 200, description = "Rules, firings, deliveries", body = crate::api::openapi::AlertsDocument),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn list(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::View>,
) -> Result<Json<Value>, ApiError> {
    // Webhook URLs and delivery details are for admins (the URLs are often credentials).
    let view = state
        .service()
        .alerts(actor.role == "admin")
        .await
        .map_err(ApiError::RedisUnavailable)?;
    Ok(Json(json!(view)))
}

/// Creates or replaces an alert rule.
#[utoipa::path(put, path = "/api/v1/alerts/{name}", tag = "alerts", operation_id = "put_alert",
    params(("name" = String, Path, description = "Rule name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = crate::api::openapi::AlertRuleDocument,
    responses((status = 200, description = "Stored (the secret is not shown again)", body = crate::api::openapi::AlertRuleDocument),
    (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn put(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::EditPolicies>,
    Path(name): Path<String>,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let mut doc = body.0;
    if let Some(map) = doc.as_object_mut() {
        map.insert("name".into(), json!(name));
    }
    let rule = parse_rule(doc)?;
    let saved = state.service().save_alert(&actor, rule).await?;
    Ok(Json(shown(&saved)))
}

/// Removes an alert rule; what fired for it stops without a resolution message.
#[utoipa::path(delete, path = "/api/v1/alerts/{name}", tag = "alerts", operation_id = "delete_alert",
    params(("name" = String, Path, description = "Rule name")),
    responses((status = 204, description = "Removed"),
    (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn delete(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::EditPolicies>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.service().delete_alert(&actor, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
