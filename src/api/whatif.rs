//! What if: a draft policy replayed over the checks its policy recorded (admin keys or an
//! admin session), before it enforces anything.

use axum::{
    Json, Router,
    extract::{Path, State},
    routing::{get, post},
};
use serde_json::Value;

use super::{Admin, ApiError, JsonBody, may};
use crate::{
    domain::{Name, suggest::Suggestion, whatif::WhatIf},
    state::AppState,
};

/// How far back a replay looks unless the request says.
const DEFAULT_LAST_MS: i64 = 60 * 60 * 1000;

pub fn router() -> axum::Router<AppState> {
    Router::new()
        .route("/api/v1/policies/{name}/what-if", post(what_if))
        .route("/api/v1/policies/{name}/suggestions", get(suggestions))
}

#[utoipa::path(post, path = "/api/v1/policies/{name}/what-if", tag = "policies", operation_id = "what_if", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")), request_body = crate::api::openapi::WhatIfRequest, responses((status = 200, body = crate::api::openapi::WhatIfAnswer), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 503, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn what_if(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::EditPolicies>,
    Path(raw): Path<String>,
    body: JsonBody,
) -> Result<Json<WhatIf>, ApiError> {
    let name = Name::parse(&raw).map_err(|m| ApiError::bad("name", m))?;
    let Value::Object(request) = &body.0 else {
        return Err(ApiError::bad(
            "body",
            "must be an object: {\"policy\": {…}, \"last_ms\": 3600000}",
        ));
    };
    if let Some(unknown) = request
        .keys()
        .find(|k| !["policy", "version", "last_ms"].contains(&k.as_str()))
    {
        return Err(ApiError::bad(
            unknown.clone(),
            "is not a field of a what-if request (policy, version, last_ms)",
        ));
    }
    let last_ms = match request.get("last_ms") {
        None | Some(Value::Null) => DEFAULT_LAST_MS,
        Some(v) => v
            .as_i64()
            .ok_or_else(|| ApiError::bad("last_ms", "must be a whole number of ms"))?,
    };
    let draft = request.get("policy").filter(|p| !p.is_null());
    let service = state.service();
    let answer = match request.get("version").filter(|v| !v.is_null()) {
        None => service.what_if(&actor, &name, draft, last_ms).await?,
        Some(_) if draft.is_some() => {
            return Err(ApiError::bad(
                "version",
                "give a draft (policy) or a stored version to replay, not both",
            ));
        }
        Some(v) => {
            let version = v
                .as_u64()
                .ok_or_else(|| ApiError::bad("version", "must be a version number"))?;
            let candidate = crate::service::record::Candidate::Version(version);
            service
                .what_if_policy(&actor, &name, candidate, last_ms)
                .await?
        }
    };
    Ok(Json(answer))
}

/// `rule`: the rule to suggest a limit for; `last_ms`: how far back (an hour unless said).
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SuggestionsQuery {
    /// The rule (with a window) to suggest limits for.
    rule: String,
    /// How far back, in ms (1 to a day; default an hour).
    last_ms: Option<i64>,
}

#[utoipa::path(get, path = "/api/v1/policies/{name}/suggestions", tag = "policies", operation_id = "suggest_limits", params(("name" = String, Path, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), SuggestionsQuery), responses((status = 200, body = crate::api::openapi::LimitSuggestion), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 503, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn suggestions(
    State(state): State<AppState>,
    Admin(..): Admin<may::EditPolicies>,
    Path(raw): Path<String>,
    query: Result<axum::extract::Query<SuggestionsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Suggestion>, ApiError> {
    let name = Name::parse(&raw).map_err(|m| ApiError::bad("name", m))?;
    let axum::extract::Query(query) = query.map_err(|e| ApiError::bad("rule", e.body_text()))?;
    let answer = state
        .service()
        .suggest_limits(&name, &query.rule, query.last_ms.unwrap_or(DEFAULT_LAST_MS))
        .await?;
    Ok(Json(answer))
}
