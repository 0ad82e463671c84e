//! The security headers of every response: a CSP (with a per-response nonce on pages,
//! nothing allowed elsewhere), no framing, no sniffing, never stored; assets cached by
//! whether their names carry a hash.

use axum::{
    http::{HeaderValue, header},
    response::Response,
};

/// How long a browser keeps a dashboard file: a year for one whose name carries its
/// content's hash (`spillway.3f9a…c1.wasm`: a new build is a new name), otherwise it asks
/// again each time (and gets 304 while the file is unchanged).
pub(crate) fn asset_caching(path: &str) -> HeaderValue {
    let file = path.rsplit('/').next().unwrap_or_default();
    let parts: Vec<&str> = file.split('.').collect();
    // name.<hash>.ext (cargo-leptos's hash-files); the unhashed split loader's name has a
    // run of underscores where the hash goes.
    let hashed = parts.len() >= 3
        && parts[1..parts.len() - 1]
            .iter()
            .any(|p| p.len() >= 10 && p.bytes().any(|b| b != b'_'));
    HeaderValue::from_static(if hashed {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    })
}

/// The CSP of responses that are not pages (JSON, metrics, assets): nothing may run, nothing
/// may frame them.
pub(crate) const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// Adds the headers every dashboard response carries.
pub(crate) fn secured(mut response: Response, nonce: Option<&str>) -> Response {
    let script = nonce.map_or(String::new(), |n| format!(" 'nonce-{n}'"));
    let csp = format!(
        "default-src 'self'; script-src 'self'{script} 'wasm-unsafe-eval'; style-src 'self'; \
         img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'"
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    with_security_headers(
        response,
        HeaderValue::from_str(&csp).expect("the CSP is a valid header value"),
    )
}

/// The headers of every answer outside the dashboard that is not an asset (the API, health,
/// metrics, Envoy's `/json`): never stored, and the security headers with a CSP that allows
/// nothing. The check endpoints, served before the router (`server.rs`), take theirs here too.
pub fn secure_api_response(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    with_security_headers(response, HeaderValue::from_static(API_CSP))
}

/// The headers every response carries, page or not: its CSP, no framing, no sniffing.
pub(crate) fn with_security_headers(mut response: Response, csp: HeaderValue) -> Response {
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, csp);
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}
