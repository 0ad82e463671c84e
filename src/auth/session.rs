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

use std::net::SocketAddr;

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
};

use super::{
    cookies::{login_token_cookie, login_token_from, session_id_from},
    forms::bounded_body,
    headers::{API_CSP, asset_caching, secure_api_response, secured, with_security_headers},
    origin::{is_https, own_origin, same_origin},
};
use crate::{
    state::AppState,
    support::ids::{random_bytes, to_hex},
};

pub use crate::config::SessionSettings;

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

/// The CSP nonce of this response; the page's inline scripts carry it.
#[derive(Clone, Debug)]
pub struct CspNonce(pub String);

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
        let refused = (
            StatusCode::FORBIDDEN,
            "Refused: this request came from another site.",
        );
        return secured(refused.into_response(), None);
    }
    let session = match read_patiently(&state, req.headers()).await {
        Ok(session) => session,
        Err(unreadable) => return secured(unreadable, None),
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
    if let Some(elsewhere) = elsewhere_first(&req, &path, signed_in) {
        return secured(elsewhere, None);
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

/// The request's session, read again once before giving up: a failover or a blip of Redis
/// should not cost a page (and an error never signs anyone out). `Err` is the page that
/// says the session could not be read.
async fn read_patiently(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<Session>, Response> {
    let session = match read(state, headers).await {
        Ok(session) => Ok(session),
        Err(_) => read(state, headers).await,
    };
    session.map_err(|error| {
        tracing::warn!(%error, "could not read a session");
        session_unreadable(&stylesheet_href(&state.leptos_options))
    })
}

/// Where a request must go instead of its page: to the sign-in form when not signed in (a
/// live stream is refused instead), on from the sign-in form when already signed in.
fn elsewhere_first(req: &Request, path: &str, signed_in: bool) -> Option<Response> {
    if !signed_in && !is_open(path) {
        if path.starts_with("/events/") {
            // A live stream is not a page to send to the sign-in form: a browser's
            // EventSource follows the redirect, and its cookieless load of the sign-in page
            // would be given a new form token, replacing that of a form open in another tab.
            let refused = (StatusCode::UNAUTHORIZED, "Sign in to follow live data.");
            return Some(refused.into_response());
        }
        return Some(to_sign_in(req));
    }
    if signed_in && path == "/login" && req.method() == Method::GET {
        // Already signed in: on to where the sign-in would have led.
        let next = req
            .uri()
            .query()
            .and_then(|q| crate::domain::query_value(q, "next"))
            .unwrap_or_default();
        return Some(Redirect::to(safe_next(&next)).into_response());
    }
    None
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
    let to = format!(
        "/login?next={}",
        crate::domain::percent_encode_path(&target)
    );
    Redirect::to(&to).into_response()
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
}
