//! Bodies of dashboard forms and server functions, read within a limit before Leptos sees
//! them (it answers a body over the limit with a 500), and only once the caller is known.

use axum::{
    extract::Request,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

/// `req` with its body read within the form limit, for server functions and the sign-in
/// form. Bodies are read only once the caller is known: someone not signed in (the sign-in
/// form, a server function that will answer 401) sends a few kilobytes at most, and is not
/// buffered 256 KiB a stream.
pub(crate) async fn bounded_body(
    req: Request,
    path: &str,
    signed_in: bool,
) -> Result<Request, Response> {
    if !(path.starts_with("/fn/") || path.starts_with("/auth/")) {
        return Ok(req);
    }
    let limit = if signed_in {
        MAX_FORM_BODY
    } else {
        MAX_ANONYMOUS_FORM_BODY
    };
    within_form_limit(req, limit).await
}

/// Largest body a dashboard form or server function may send: far more than any form of
/// the dashboard needs (a policy of 100 rules is about 20 KB).
pub const MAX_FORM_BODY: usize = 256 * 1024;

/// Largest body from someone not signed in: the sign-in form is a user name, a password and
/// two tokens.
pub const MAX_ANONYMOUS_FORM_BODY: usize = 8 * 1024;

/// Server functions and the sign-in form read their bodies through Leptos, which answers a
/// body over the limit with a 500: here it is refused first, with 413 (a body without a
/// length is read here, within the limit).
pub(crate) async fn within_form_limit(request: Request, limit: usize) -> Result<Request, Response> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("The form is larger than {limit} bytes."),
        )
            .into_response()
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(Request::from_parts(parts, bytes.into())),
        Err(_) => Err(too_large()),
    }
}
