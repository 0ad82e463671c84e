//! Forward-auth's problems as proxies take them: only 2xx, 401, 403, 429 and 5xx, since
//! nginx's `auth_request` turns anything else into a 500 of its own, with the problem kept
//! in the `Spillway-Problem` header (and the body) for whoever reads the proxy's logs.

use axum::{
    http::{HeaderName, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};

use crate::api::ApiError;

/// Carries a forward-auth problem's type and detail: `unknown-policy; policy: no policy …`.
pub const PROBLEM: HeaderName = HeaderName::from_static("spillway-problem");

/// The status a proxy in front of forward-auth is given for `error`: 401, 403, 429 and
/// 5xx as they are; a request this gate refuses for what it is (a cost no rule admits, an
/// address it cannot read) 403; and a gate set up wrong (an unknown policy, a dimension no
/// rule counts) 500, failing closed where the proxy's operator looks.
pub fn status_for_a_proxy(error: &ApiError) -> StatusCode {
    let status = error.status();
    match status.as_u16() {
        401 | 403 | 429 | 500.. => status,
        _ if matches!(error, ApiError::CostTooHigh(_)) => StatusCode::FORBIDDEN,
        _ if matches!(error, ApiError::BadRequest { field, .. } if field == "X-Forwarded-For") => {
            StatusCode::FORBIDDEN
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `error` answered to a proxy: at [`status_for_a_proxy`], its problem document saying
/// that status, and the `Spillway-Problem` header.
pub fn for_a_proxy(error: ApiError) -> Response {
    let status = status_for_a_proxy(&error);
    let mut body = error.body();
    let summary = format!(
        "{}; {}",
        body["type"]
            .as_str()
            .unwrap_or_default()
            .rsplit('/')
            .next()
            .unwrap_or_default(),
        body["detail"].as_str().unwrap_or_default()
    );
    let mut response = if status == error.status() {
        error.into_response()
    } else {
        body["status"] = status.as_u16().into();
        let mut r = (status, body.to_string()).into_response();
        r.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        r
    };
    // A header holds visible ASCII: `›` becomes `>`, anything else outside it a space.
    let ascii: String = summary
        .chars()
        .take(400)
        .map(|c| match c {
            '›' => '>',
            c if c.is_ascii() && !c.is_ascii_control() => c,
            _ => ' ',
        })
        .collect();
    if let Ok(value) = HeaderValue::from_str(&ascii) {
        response.headers_mut().insert(PROBLEM, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_proxies_pass_on() {
        let s = |e: ApiError| status_for_a_proxy(&e).as_u16();
        assert_eq!(s(ApiError::Unauthorized), 401);
        assert_eq!(s(ApiError::UnknownPolicy("x".into())), 500);
        assert_eq!(s(ApiError::bad("policy", "is required")), 500);
        assert_eq!(s(ApiError::UnknownDimensions("d".into())), 500);
        assert_eq!(s(ApiError::CostTooHigh("c".into())), 403);
        assert_eq!(s(ApiError::bad("X-Forwarded-For", "not an address")), 403);
        assert_eq!(s(ApiError::PoliciesNotLoaded), 503);
    }
}
