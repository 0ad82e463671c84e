//! Whether a request comes from this site and over https: the dashboard's own origin (the
//! host it was asked for, `X-Forwarded-Host` behind a trusted proxy), compared with a state
//! change's `Origin` or `Sec-Fetch-Site`.

use std::net::IpAddr;

use axum::http::{HeaderMap, header};

use crate::state::AppState;

/// Whether cookies must be Secure: always with `SPILLWAY_SECURE_COOKIES`, and whenever a
/// trusted proxy's `X-Forwarded-Proto` says the request came over https.
pub fn is_https(state: &AppState, peer: Option<IpAddr>, headers: &HeaderMap) -> bool {
    state.sessions.secure_cookies
        || forwarded_proto(state, peer, headers).is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

pub(crate) fn forwarded_proto<'h>(
    state: &AppState,
    peer: Option<IpAddr>,
    headers: &'h HeaderMap,
) -> Option<&'h str> {
    state
        .trusted_proxies
        .header(peer?, headers, "x-forwarded-proto")
}

/// The origin this site answers as, `scheme://host`: the host a trusted proxy forwarded (or
/// `Host`), over https when the request came over https (see [`is_https`]).
pub(crate) fn own_origin(
    state: &AppState,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
) -> Option<String> {
    let host = peer
        .and_then(|p| state.trusted_proxies.header(p, headers, "x-forwarded-host"))
        .or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()))?;
    // The scheme the trusted proxy says the browser used; without one, https only when
    // the deployment says it is served over https.
    let https = match forwarded_proto(state, peer, headers) {
        Some(proto) => proto.eq_ignore_ascii_case("https"),
        None => state.sessions.secure_cookies,
    };
    let scheme = if https { "https" } else { "http" };
    Some(format!("{scheme}://{host}"))
}

/// Whether a state-changing request comes from this site: its `Origin` is this site's
/// origin (scheme and host), or (without Origin) `Sec-Fetch-Site` says same-origin. Requests
/// with neither header are not from a browser form; they still need the session's CSRF token.
pub fn same_origin(own_origin: Option<&str>, headers: &HeaderMap) -> bool {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        return own_origin.is_some_and(|own| origin.eq_ignore_ascii_case(own));
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site) => site == "same-origin" || site == "none",
        None => true,
    }
}

/// Whether a state change from a signed-in browser comes from this site: its `Origin` (or
/// `Sec-Fetch-Site`) says so, as the dashboard's own forms are checked.
pub fn from_this_site(state: &AppState, peer: IpAddr, headers: &HeaderMap) -> bool {
    same_origin(own_origin(state, Some(peer), headers).as_deref(), headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origins_are_compared_with_scheme_and_host() {
        let own = Some("http://127.0.0.1:3000");
        let origin = |o: &'static str| headers(&[("origin", o)]);
        assert!(same_origin(own, &origin("http://127.0.0.1:3000")));
        assert!(same_origin(own, &origin("HTTP://127.0.0.1:3000")));
        assert!(!same_origin(own, &origin("https://evil.example")));
        assert!(!same_origin(own, &origin("null")));
        // The same host over the other scheme is another origin.
        assert!(!same_origin(own, &origin("https://127.0.0.1:3000")));
        assert!(!same_origin(Some("https://a"), &origin("http://a")));
        assert!(!same_origin(None, &origin("http://a")));
        assert!(!same_origin(
            own,
            &headers(&[("sec-fetch-site", "cross-site")])
        ));
        assert!(same_origin(
            own,
            &headers(&[("sec-fetch-site", "same-origin")])
        ));
        assert!(same_origin(own, &headers(&[])));
    }
}
