//! `ApiError`: every failure the JSON API reports, rendered as RFC 9457 problem+json.
//! Internal details are logged, never echoed to the caller.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{
    domain::PolicyError,
    service::StoreError,
    service::{CheckError, audit::AuditError, identifiers::ResetError, policies::ChangeError},
};

/// A failure answered to an HTTP caller.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("redis is unavailable")]
    RedisUnavailable(#[source] StoreError),
    #[error("{field}: {detail}")]
    BadRequest { field: String, detail: String },
    #[error("missing or unknown API key")]
    Unauthorized,
    /// Known, but not allowed this: the detail says why (field first).
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("no policy named {0}")]
    UnknownPolicy(String),
    #[error("not found")]
    NotFound(String),
    /// The path is served, but not for this method (`Allow` lists those it takes).
    #[error("method not allowed")]
    MethodNotAllowed(String),
    #[error("conflict")]
    Conflict(String),
    #[error("body too large")]
    PayloadTooLarge,
    /// A strict policy's rules meet none of the check's identifiers (the detail names the
    /// dimensions they count).
    #[error("{0}")]
    Unmatched(String),
    /// A strict policy was sent dimensions none of its rules counts (the detail names them
    /// and the dimensions its rules count).
    #[error("{0}")]
    UnknownDimensions(String),
    /// A check's cost is more than one of its rules ever admits (the detail names it).
    #[error("{0}")]
    CostTooHigh(String),
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("policies not loaded")]
    PoliciesNotLoaded,
    #[error("shutting down")]
    ShuttingDown,
    /// The port has as many requests begun as its budget allows (the detail says which).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The request took longer than `SPILLWAY_REQUEST_TIMEOUT_MS` to arrive and be answered
    /// (a body that stalled, or an answer that could not be made in time).
    #[error("request timed out")]
    Timeout(std::time::Duration),
}

impl From<PolicyError> for ApiError {
    fn from(e: PolicyError) -> Self {
        ApiError::BadRequest {
            field: e.field,
            detail: e.message,
        }
    }
}

impl From<CheckError> for ApiError {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::UnknownPolicy(name) => ApiError::UnknownPolicy(name),
            CheckError::PoliciesNotLoaded => ApiError::PoliciesNotLoaded,
            CheckError::Unavailable(error) => ApiError::RedisUnavailable(error),
            e @ CheckError::Unmatched { .. } => ApiError::Unmatched(e.to_string()),
            e @ CheckError::UnknownDimensions { .. } => ApiError::UnknownDimensions(e.to_string()),
            e @ CheckError::CostTooHigh { .. } => ApiError::CostTooHigh(e.to_string()),
            CheckError::BadLimits { field, message } => ApiError::bad(field, message),
        }
    }
}

impl From<crate::service::record::WhatIfError> for ApiError {
    fn from(e: crate::service::record::WhatIfError) -> Self {
        use crate::service::record::WhatIfError;
        match e {
            WhatIfError::UnknownPolicy(name) => ApiError::UnknownPolicy(name),
            // The draft's fields are under `policy` in the request.
            WhatIfError::Draft(e) => ApiError::bad(format!("policy.{}", e.field), e.message),
            WhatIfError::Invalid { field, message } => ApiError::bad(field, message),
            WhatIfError::Unavailable(error) => ApiError::RedisUnavailable(error),
        }
    }
}

impl From<AuditError> for ApiError {
    fn from(e: AuditError) -> Self {
        match e {
            AuditError::Invalid { field, message } => ApiError::bad(field, message),
            AuditError::Unavailable(error) => ApiError::RedisUnavailable(error),
        }
    }
}

impl From<ResetError> for ApiError {
    fn from(e: ResetError) -> Self {
        match e {
            ResetError::Invalid { field, message } => ApiError::bad(field, message),
            ResetError::UnknownPolicy(name) => ApiError::UnknownPolicy(name),
            ResetError::Forbidden(why) => ApiError::Forbidden(why),
            e @ ResetError::NothingToUndo => ApiError::NotFound(e.to_string()),
            ResetError::Unavailable(error) => ApiError::RedisUnavailable(error),
        }
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Conflict { .. } => ApiError::Conflict(format!("If-Match: {e}")),
            ChangeError::UnknownPolicy(name) => ApiError::UnknownPolicy(name),
            ChangeError::Taken { field, message } => {
                ApiError::Conflict(format!("{field}: {message}"))
            }
            ChangeError::Invalid { field, message } => ApiError::bad(field, message),
            ChangeError::Unavailable(error) => ApiError::RedisUnavailable(error),
        }
    }
}

impl ApiError {
    pub fn bad(field: impl Into<String>, detail: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The problem's status, type (the last segment of its URI), title and detail.
    fn parts(&self) -> (StatusCode, &'static str, &'static str, String) {
        let (status, kind, title) = self.kind();
        (status, kind, title, self.detail())
    }

    /// The kind of problem, the same for every error of a variant: its status, its type
    /// (the last segment of its URI) and its title.
    fn kind(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::RedisUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "redis-unavailable",
                "Redis is unavailable",
            ),
            ApiError::PoliciesNotLoaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "policies-not-loaded",
                "Policies are not loaded yet",
            ),
            ApiError::ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting-down",
                "Shutting down",
            ),
            ApiError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy", "Too busy"),
            ApiError::BadRequest { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid-request",
                "Invalid request",
            ),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::UnknownPolicy(_) => {
                (StatusCode::NOT_FOUND, "unknown-policy", "Unknown policy")
            }
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout", "Request timed out"),
            ApiError::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            ApiError::Unmatched(_) => (
                StatusCode::BAD_REQUEST,
                "unmatched-identifiers",
                "The identifiers match no rule",
            ),
            ApiError::UnknownDimensions(_) => (
                StatusCode::BAD_REQUEST,
                "unknown-dimensions",
                "A dimension is counted by no rule",
            ),
            ApiError::CostTooHigh(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "cost-too-high",
                "The cost is more than a rule ever admits",
            ),
        }
    }

    /// What went wrong, as the caller reads it (a field first, where one is to blame).
    fn detail(&self) -> String {
        match self {
            ApiError::RedisUnavailable(_) => {
                "Spillway could not reach Redis or Redis did not run the script in time".into()
            }
            ApiError::PoliciesNotLoaded => {
                "Spillway has not been able to read its policies from Redis since it started".into()
            }
            ApiError::ShuttingDown => {
                "this instance received a shutdown signal and is draining".into()
            }
            ApiError::Busy(what) => format!(
                "this instance holds as many {what} as its budget allows \
                 (SPILLWAY_MAX_PENDING_CALLS); try again in a moment"
            ),
            ApiError::BadRequest { field, detail } => format!("{field}: {detail}"),
            ApiError::Unauthorized => {
                "Authorization: send 'Bearer <api key>' with a key this instance knows".into()
            }
            ApiError::Forbidden(why) => (*why).into(),
            ApiError::UnknownPolicy(name) => format!("policy: no policy named {name:?}"),
            ApiError::NotFound(what) => what.clone(),
            ApiError::MethodNotAllowed(method) => {
                format!("method: this path does not take {method} (see Allow)")
            }
            ApiError::Conflict(what) => what.clone(),
            ApiError::Timeout(limit) => format!(
                "the request was not received and answered within {} ms (SPILLWAY_REQUEST_TIMEOUT_MS)",
                limit.as_millis()
            ),
            ApiError::PayloadTooLarge => "body: at most 65536 bytes".into(),
            ApiError::UnsupportedMediaType => "Content-Type: send application/json".into(),
            ApiError::Unmatched(detail)
            | ApiError::UnknownDimensions(detail)
            | ApiError::CostTooHigh(detail) => detail.clone(),
        }
    }

    /// The problem document, for callers that embed it (batch answers).
    pub fn body(&self) -> serde_json::Value {
        let (status, kind, title, detail) = self.parts();
        let mut body = json!({
            "type": format!("https://spillway.dev/problems/{kind}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        match self {
            ApiError::BadRequest { field, .. } => body["field"] = json!(field),
            ApiError::Unmatched(_) | ApiError::UnknownDimensions(_) => {
                body["field"] = json!("identifiers")
            }
            ApiError::CostTooHigh(_) => body["field"] = json!("cost"),
            _ => {}
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A timeout is the client's as often as ours (a body that stalled): not worth a
        // warning per connection that anyone may open.
        // Nor is Redis being down, once per check: the outage log says it once
        // (`service::alerts::RedisOutage`); nor a state of the whole instance (starting,
        // draining, busy) that its own log lines and metrics say.
        if status.is_server_error()
            && !matches!(
                self,
                ApiError::Timeout(_)
                    | ApiError::RedisUnavailable(_)
                    | ApiError::Busy(_)
                    | ApiError::PoliciesNotLoaded
                    | ApiError::ShuttingDown
            )
        {
            tracing::warn!(error = ?self, "request failed");
        }
        let mut response = (status, self.body().to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
