//! `ApiError`: every failure the JSON API reports, rendered as RFC 9457 problem+json.
//! Internal details are logged, never echoed to the caller.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::store::StoreError;

/// A failure answered to an HTTP caller.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("redis is unavailable")]
    RedisUnavailable(#[source] StoreError),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str, String) {
        match self {
            ApiError::RedisUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "redis-unavailable",
                "Redis is unavailable",
                "Spillway could not reach Redis or Redis did not run the script in time".into(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, title, detail) = self.parts();
        if status.is_server_error() {
            tracing::warn!(error = ?self, "request failed");
        }
        let body = json!({
            "type": format!("https://spillway.dev/problems/{kind}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = (status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
