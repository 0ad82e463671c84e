//! Sessions for people using the dashboard, and the middleware every dashboard request
//! passes through.
//!
//! A session id is 256 random bits, sent only in an HttpOnly, SameSite=Strict cookie (Secure
//! over https). Redis keeps the session under the SHA-256 of its id, with the idle timeout as
//! TTL (renewed on each request, never past the absolute expiry). A visitor of the login
//! page gets no session, only the sign-in form's CSRF token in a cookie of its own (so
//! anonymous page loads store nothing in Redis); signing in starts a new session (a new
//! id) and ends any the browser had, so a session id planted before login is worthless
//! after it.
//!
//! The middleware also refuses state changes from other origins (Origin or Sec-Fetch-Site),
//! sends people who are not signed in to the login page, and puts the security headers
//! (CSP with a per-response nonce, `frame-ancestors 'none'`, `Cache-Control: no-store`) on
//! every dashboard response.

use std::net::{IpAddr, SocketAddr};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
};
use subtle::ConstantTimeEq;

use crate::{
    state::AppState,
    support::ids::{random_bytes, to_hex},
};

pub use crate::config::SessionSettings;

/// The session cookie.
pub const COOKIE: &str = "spillway_session";

pub use crate::service::sessions::Session;

/// The session of the current request, put in its extensions by the middleware.
#[derive(Clone, Debug, Default)]
pub struct CurrentSession(pub Option<Session>);

/// The caller's address, for the audit log and the login limit: the TCP peer, or the client
/// a trusted proxy forwarded for (`crate::net::forwarded`).
#[derive(Clone, Debug, Default)]
pub struct ClientIp(pub String);

/// Whether this request came over https (see [`is_https`]): cookies are then Secure.
#[derive(Clone, Copy, Debug, Default)]
pub struct OverHttps(pub bool);

/// A visitor's sign-in form token (from the login cookie), for the form to send back.
#[derive(Clone, Debug)]
pub struct LoginToken(pub String);

/// The cookie that carries a visitor's sign-in form token.
pub const LOGIN_COOKIE: &str = "spillway_login";

/// The CSP nonce of this response; the page's inline scripts carry it.
#[derive(Clone, Debug)]
pub struct CspNonce(pub String);

/// The `Set-Cookie` value for session `id`.
pub fn cookie(id: &str, secure: bool) -> HeaderValue {
    private_cookie(COOKIE, id, secure)
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn removal_cookie(secure: bool) -> HeaderValue {
    removal(COOKIE, secure)
}

/// The `Set-Cookie` value that removes the cookie `name`.
fn removal(name: &str, secure: bool) -> HeaderValue {
    let mut c = cookie::Cookie::build((name, ""))
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .path("/")
        .secure(secure)
        .build();
    c.make_removal();
    HeaderValue::from_str(&c.to_string()).expect("a cookie is a valid header value")
}

/// Whether cookies must be Secure: always with `SPILLWAY_SECURE_COOKIES`, and whenever a
/// trusted proxy's `X-Forwarded-Proto` says the request came over https.
pub fn is_https(state: &AppState, peer: Option<IpAddr>, headers: &HeaderMap) -> bool {
    state.sessions.secure_cookies
        || forwarded_proto(state, peer, headers).is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

fn forwarded_proto<'h>(
    state: &AppState,
    peer: Option<IpAddr>,
    headers: &'h HeaderMap,
) -> Option<&'h str> {
    state
        .trusted_proxies
        .header(peer?, headers, "x-forwarded-proto")
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
fn token_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    cookie_value(headers, name)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn session_id_from(headers: &HeaderMap) -> Option<String> {
    token_cookie(headers, COOKIE)
}

fn login_token_from(headers: &HeaderMap) -> Option<String> {
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

fn login_token_cookie(token: &str, secure: bool) -> HeaderValue {
    private_cookie(LOGIN_COOKIE, token, secure)
}

/// The `Set-Cookie` value that removes the login cookie (after signing in).
pub fn login_token_removal(secure: bool) -> HeaderValue {
    removal(LOGIN_COOKIE, secure)
}

/// The origin this site answers as, `scheme://host`: the host a trusted proxy forwarded (or
/// `Host`), over https when the request came over https (see [`is_https`]).
fn own_origin(state: &AppState, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<String> {
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

/// The live session whose cookie the request carries (renewing its idle timeout), if any.
pub async fn load(state: &AppState, headers: &HeaderMap) -> Option<Session> {
    read(state, headers).await.unwrap_or_else(|error| {
        tracing::warn!(%error, "could not read a session");
        None
    })
}

/// As [`load`], telling a session that is not there from one Redis did not answer for.
async fn read(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<Session>, crate::service::StoreError> {
    let Some(id) = session_id_from(headers) else {
        return Ok(None);
    };
    state.service().touch_session(&id, state.sessions).await
}

/// The page for a dashboard request whose session could not be read: 503, the reason, and
/// a way back; the visitor stays signed in.
fn session_unreadable(stylesheet: &str) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (header::RETRY_AFTER, HeaderValue::from_static("2")),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
        ],
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Can't reach Redis · Spillway</title>\
         <link rel=\"stylesheet\" href=\"STYLESHEET\"></head><body><main>\
         <section class=\"card\"><h1>Can't reach Redis</h1>\
         <p>Spillway could not read your session from Redis just now, so this page cannot \
         be shown. You are still signed in: <a href=\"\">try again</a> in a moment. If it \
         keeps happening, Redis is down or slow; checks answer by each policy's failure \
         mode meanwhile.</p></section></main></body></html>"
            .replace("STYLESHEET", stylesheet),
    )
        .into_response()
}

/// Whether a state change from a signed-in browser comes from this site: its `Origin` (or
/// `Sec-Fetch-Site`) says so, as the dashboard's own forms are checked.
pub fn from_this_site(state: &AppState, peer: IpAddr, headers: &HeaderMap) -> bool {
    same_origin(own_origin(state, Some(peer), headers).as_deref(), headers)
}

/// Paths the session middleware leaves alone: the service API (and envoyproxy/ratelimit's
/// `/json`), probes and static files.
fn is_outside_dashboard(path: &str) -> bool {
    path.starts_with("/api/")
        || path.starts_with("/pkg/")
        || matches!(
            path,
            "/healthz" | "/readyz" | "/healthcheck" | "/metrics" | "/favicon.ico" | "/json"
        )
}

/// Dashboard paths anyone may load: the login page and the endpoints that do their own
/// checks (server functions answer 401/403 themselves, the login form checks its token).
fn is_open(path: &str) -> bool {
    path == "/login" || path.starts_with("/fn/") || path.starts_with("/auth/")
}

/// The middleware: loads the session, guards origins and pages, sets security headers.
pub async fn middleware(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    if is_outside_dashboard(&path) {
        return outside_dashboard(&path, next.run(req).await);
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let ip = peer.map_or_else(String::new, |p| {
        state
            .trusted_proxies
            .client_ip(p, req.headers())
            .to_string()
    });
    req.extensions_mut().insert(ClientIp(ip));
    let changes_state = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let own = own_origin(&state, peer, req.headers());
    if changes_state && !same_origin(own.as_deref(), req.headers()) {
        return secured(
            (
                StatusCode::FORBIDDEN,
                "Refused: this request came from another site.",
            )
                .into_response(),
            None,
        );
    }
    // Read again once before giving up: a failover or a blip of Redis should not cost a
    // page (and an error never signs anyone out).
    let session = match read(&state, req.headers()).await {
        Ok(session) => Ok(session),
        Err(_) => read(&state, req.headers()).await,
    };
    let session = match session {
        Ok(session) => session,
        Err(error) => {
            tracing::warn!(%error, "could not read a session");
            let css = stylesheet_href(&state.leptos_options);
            return secured(session_unreadable(&css), None);
        }
    };
    let signed_in = session.as_ref().is_some_and(|s| s.user().is_some());
    // Who calls comes before what they sent: no argument of a server function is read for
    // someone not signed in, or whose role may not call it.
    if let Some(refused) = super::server_fns::refuse_before_reading(&req, &path, session.as_ref()) {
        return secured(refused, None);
    }
    req = match bounded_body(req, &path, signed_in).await {
        Ok(req) => req,
        Err(too_large) => return secured(too_large, None),
    };
    let secure = is_https(&state, peer, req.headers());
    req.extensions_mut().insert(OverHttps(secure));
    let new_cookie = if session.is_none() {
        visitor_token(&mut req, &path, secure)
    } else {
        None
    };
    if !signed_in && !is_open(&path) {
        if path.starts_with("/events/") {
            // A live stream is not a page to send to the sign-in form: a browser's
            // EventSource follows the redirect, and its cookieless load of the sign-in page
            // would be given a new form token, replacing that of a form open in another tab.
            let refused = (StatusCode::UNAUTHORIZED, "Sign in to follow live data.");
            return secured(refused.into_response(), None);
        }
        return secured(to_sign_in(&req), None);
    }
    if signed_in && path == "/login" && req.method() == Method::GET {
        // Already signed in: on to where the sign-in would have led.
        let next = req
            .uri()
            .query()
            .and_then(|q| crate::domain::query_value(q, "next"))
            .unwrap_or_default();
        return secured(
            axum::response::Redirect::to(safe_next(&next)).into_response(),
            None,
        );
    }
    req.extensions_mut().insert(CurrentSession(session));
    let nonce = to_hex(&random_bytes::<16>());
    req.extensions_mut().insert(CspNonce(nonce.clone()));
    let mut response = next.run(req).await;
    if let Some(c) = new_cookie {
        response.headers_mut().append(header::SET_COOKIE, c);
    }
    secured(response, Some(&nonce))
}

/// A response outside the dashboard (the API, probes, static files) with its headers: a
/// missing asset is a plain 404, not the dashboard's page.
fn outside_dashboard(path: &str, mut response: Response) -> Response {
    if path.starts_with("/pkg/") && response.status() == StatusCode::NOT_FOUND {
        response = (StatusCode::NOT_FOUND, "Not found").into_response();
    }
    if path.starts_with("/pkg/") {
        if response.status().is_success() || response.status() == StatusCode::NOT_MODIFIED {
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, asset_caching(path));
        }
        return with_security_headers(response, HeaderValue::from_static(API_CSP));
    }
    secure_api_response(response)
}

/// How long a browser keeps a dashboard file: a year for one whose name carries its
/// content's hash (`spillway.3f9a…c1.wasm`: a new build is a new name), otherwise it asks
/// again each time (and gets 304 while the file is unchanged).
fn asset_caching(path: &str) -> HeaderValue {
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

/// `req` with its body read within the form limit, for server functions and the sign-in
/// form. Bodies are read only once the caller is known: someone not signed in (the sign-in
/// form, a server function that will answer 401) sends a few kilobytes at most, and is not
/// buffered 256 KiB a stream.
async fn bounded_body(req: Request, path: &str, signed_in: bool) -> Result<Request, Response> {
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

/// A visitor's sign-in form token, put in the request's extensions: the one their cookie
/// holds, or a new one on `GET /login` (returned as the cookie to set). Nothing is stored
/// in Redis.
fn visitor_token(req: &mut Request, path: &str, secure: bool) -> Option<HeaderValue> {
    let mut new_cookie = None;
    let token = match login_token_from(req.headers()) {
        Some(token) => Some(token),
        None if path == "/login" && req.method() == Method::GET => {
            let token = to_hex(&random_bytes::<32>());
            new_cookie = Some(login_token_cookie(&token, secure));
            Some(token)
        }
        None => None,
    };
    if let Some(token) = token {
        req.extensions_mut().insert(LoginToken(token));
    }
    new_cookie
}

/// The redirect to the sign-in page, coming back to `req`'s page after.
fn to_sign_in(req: &Request) -> Response {
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let to = format!("/login?next={}", encode_component(&target));
    Redirect::to(&to).into_response()
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
async fn within_form_limit(request: Request, limit: usize) -> Result<Request, Response> {
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

/// The CSP of responses that are not pages (JSON, metrics, assets): nothing may run, nothing
/// may frame them.
const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// Adds the headers every dashboard response carries.
fn secured(mut response: Response, nonce: Option<&str>) -> Response {
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
fn with_security_headers(mut response: Response, csp: HeaderValue) -> Response {
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

/// Percent-encodes a query parameter value.
pub fn encode_component(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Where to go after signing in: only a path on this site, never another host. A path is
/// printable ASCII without spaces or backslashes (browsers drop tabs and newlines from a URL
/// and read `\\` as `/`, so `/%09/evil.example` would become `//evil.example`), and does
/// not start with `//`; anything else goes to `/`.
pub fn safe_next(next: &str) -> &str {
    let printable = next.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    if printable && next.starts_with('/') && !next.starts_with("//") {
        next
    } else {
        "/"
    }
}

/// The stylesheet's address (`/pkg/spillway.<hash>.css` when the build hashes file
/// names), for pages rendered outside the app; read once.
fn stylesheet_href(options: &leptos::config::LeptosOptions) -> String {
    static HREF: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HREF.get_or_init(|| {
        let hash = options
            .hash_files
            .then(|| {
                let exe = std::env::current_exe().ok()?;
                let file = exe.parent()?.join(options.hash_file.as_ref());
                let text = std::fs::read_to_string(file).ok()?;
                text.lines()
                    .find_map(|l| l.trim().strip_prefix("css:").map(|h| h.trim().to_owned()))
            })
            .flatten();
        match hash {
            Some(h) => format!("/{}/{}.{h}.css", options.site_pkg_dir, options.output_name),
            None => format!("/{}/{}.css", options.site_pkg_dir, options.output_name),
        }
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(
            safe_next("/identifiers?q=user%3D1"),
            "/identifiers?q=user%3D1"
        );
        for bad in [
            "//evil.example",
            "https://evil.example",
            "/\\evil",
            "",
            "/\t/evil.example/x",
            "/\n/evil.example",
            "/a\r\nSet-Cookie: x=1",
            "/\u{b}/evil",
            "/\u{c}/evil",
            "/ /evil",
            "/caf\u{e9}",
        ] {
            assert_eq!(safe_next(bad), "/");
        }
    }

    #[test]
    fn session_cookies_are_locked_down() {
        let c = cookie("ab", false).to_str().unwrap().to_owned();
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/"));
        assert!(!c.contains("Secure"));
        assert!(cookie("ab", true).to_str().unwrap().contains("Secure"));
    }
}
