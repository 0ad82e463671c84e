//! The dashboard's cookies: the session's (HttpOnly, SameSite=Strict, Secure over https) and
//! the sign-in form's token, set, read and removed in one place.

use axum::http::{HeaderMap, HeaderValue, header};
use subtle::ConstantTimeEq;

/// The session cookie.
pub const COOKIE: &str = "spillway_session";

/// The cookie that carries a visitor's sign-in form token.
pub const LOGIN_COOKIE: &str = "spillway_login";

/// The `Set-Cookie` value for session `id`.
pub fn cookie(id: &str, secure: bool) -> HeaderValue {
    private_cookie(COOKIE, id, secure)
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn removal_cookie(secure: bool) -> HeaderValue {
    removal(COOKIE, secure)
}

/// The `Set-Cookie` value that removes the cookie `name`.
pub(crate) fn removal(name: &str, secure: bool) -> HeaderValue {
    let mut c = cookie::Cookie::build((name, ""))
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .path("/")
        .secure(secure)
        .build();
    c.make_removal();
    HeaderValue::from_str(&c.to_string()).expect("a cookie is a valid header value")
}

/// The value of the cookie `name`, if the request has it.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_owned())
}

/// A 256-bit hex value from the cookie `name`.
pub(crate) fn token_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    cookie_value(headers, name)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub(crate) fn session_id_from(headers: &HeaderMap) -> Option<String> {
    token_cookie(headers, COOKIE)
}

pub(crate) fn login_token_from(headers: &HeaderMap) -> Option<String> {
    token_cookie(headers, LOGIN_COOKIE)
}

/// Whether `token`, sent by the sign-in form, is this browser's login cookie (compared in
/// constant time). A site that cannot read or set our cookies cannot send it.
pub fn login_token_matches(headers: &HeaderMap, token: &str) -> bool {
    login_token_from(headers).is_some_and(|t| bool::from(t.as_bytes().ct_eq(token.as_bytes())))
}

/// An HttpOnly, SameSite=Strict cookie for the whole site, that ends with the browser
/// session. `value` must be cookie-safe (hex).
pub fn private_cookie(name: &str, value: &str, secure: bool) -> HeaderValue {
    let c = cookie::Cookie::build((name, value))
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .path("/")
        .secure(secure)
        .build();
    HeaderValue::from_str(&c.to_string()).expect("a cookie of hex is a valid header value")
}

pub(crate) fn login_token_cookie(token: &str, secure: bool) -> HeaderValue {
    private_cookie(LOGIN_COOKIE, token, secure)
}

/// The `Set-Cookie` value that removes the login cookie (after signing in).
pub fn login_token_removal(secure: bool) -> HeaderValue {
    removal(LOGIN_COOKIE, secure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_cookies_are_locked_down() {
        let c = cookie("ab", false).to_str().unwrap().to_owned();
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/"));
        assert!(!c.contains("Secure"));
        assert!(cookie("ab", true).to_str().unwrap().contains("Secure"));
    }
}
