//! `POST /api/v1/report`: usage known after the fact, added to an identifier's rules (or,
//! negative, given back) without a decision (service keys, as for checks).

use axum::{
    Json,
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{ApiError, JsonBody, check::rate_limit_headers, require_key};
use crate::{
    domain::people::KeyRole,
    service::{
        CheckRequest,
        report::{MAX_REPORT, ReportRequest},
    },
    state::AppState,
};

/// `{"policy", "identifiers", "cost"}` with a signed cost: the check's fields, checked the
/// same way.
fn parse(body: &Value) -> Result<ReportRequest, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad("body", "must be a JSON object"))?;
    let cost = match obj.get("cost") {
        None => {
            return Err(ApiError::bad(
                "cost",
                "is required: the cost to add, or a negative one to give back",
            ));
        }
        Some(v) => v
            .as_i64()
            .filter(|c| (-MAX_REPORT..=MAX_REPORT).contains(c))
            .ok_or_else(|| {
                ApiError::bad(
                    "cost",
                    format!("must be a whole number from -{MAX_REPORT} to {MAX_REPORT}"),
                )
            })?,
    };
    if obj.contains_key("limits") {
        return Err(ApiError::bad(
            "limits",
            "a report counts against the rules as the policy has them",
        ));
    }
    let mut rest = obj.clone();
    rest.remove("cost");
    let CheckRequest {
        policy,
        identifiers,
        ..
    } = CheckRequest::parse(&Value::Object(rest), "")?;
    // A check may be anonymous; usage is always someone's.
    if identifiers.is_empty() {
        return Err(ApiError::bad(
            "identifiers",
            "must hold at least 1 identifier: whose usage this is",
        ));
    }
    Ok(ReportRequest {
        policy,
        identifiers,
        cost,
    })
}

/// Adds `cost` to every rule of the policy for the identifiers, even past their limits (the
/// next check is then denied); a negative cost gives back what a check over-estimated, never
/// below nothing. Leases are released, not reported. Answers each rule's state afterwards.
#[utoipa::path(post, path = "/api/v1/report", tag = "checks", operation_id = "report_usage",
    request_body = crate::api::openapi::ReportRequest,
    responses((status = 200, description = "Each rule's state afterwards", body = crate::api::openapi::ReportResponse),
        (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
        (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unreachable: send the report again", body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn report(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Response, ApiError> {
    require_key(&state, &headers, KeyRole::Service)?;
    let request = parse(&body.0)?;
    let reported = state.service().report(&request).await?;
    let results: Vec<Value> = reported
        .state
        .results
        .iter()
        .map(|r| {
            json!({
                "rule": r.rule.as_str(),
                "identifier": r.identifier.to_string(),
                "algorithm": r.algorithm_name(),
                "limit": r.outcome.limit,
                "remaining": r.outcome.remaining,
                "reset_ms": r.outcome.reset_ms,
            })
        })
        .collect();
    let body = json!({
        "policy": reported.policy.name.as_str(),
        "policy_version": reported.policy.version,
        "cost": request.cost,
        "results": results,
    });
    Ok((rate_limit_headers(&reported.state), Json(body)).into_response())
}
