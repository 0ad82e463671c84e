//! The checks every server function makes first: who is calling (the session the
//! middleware loaded), whether their role may do this, and for changes whether the request
//! carries the session's CSRF token. Failures set the HTTP status (401, 403) as well.

use axum::http::{StatusCode, request::Parts};
use leptos::prelude::*;

use super::error::AppError;
use crate::auth::session::{ClientIp, CurrentSession};
use crate::{
    domain::people::{Action, Role, Username},
    service::audit::Actor,
};

/// A signed-in person calling a server function.
#[derive(Clone, Debug)]
pub struct Caller {
    pub user: Username,
    pub role: Role,
    pub ip: String,
    /// The session's CSRF token, for forms the page renders.
    pub csrf: String,
    /// Digest of the session (to end it).
    pub session_digest: String,
}

impl Caller {
    /// The caller as the audit log names them.
    pub fn actor(&self) -> Actor {
        Actor {
            name: format!("user:{}", self.user),
            role: self.role.to_string(),
            ip: self.ip.clone(),
        }
    }
}

/// A plain form post: JavaScript off (a hydrated form's fetch does not ask for HTML).
fn from_a_form() -> bool {
    use_context::<Parts>().is_some_and(|p| {
        p.method == axum::http::Method::POST
            && p.headers
                .get(axum::http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|a| a.contains("text/html"))
    })
}

/// Sends a form posted without JavaScript to `path` (a server function answering one
/// otherwise goes back to the page it came from, address and all). A hydrated page shows
/// the answer where it is.
pub fn back_from_a_form(path: &str) {
    if from_a_form() {
        leptos_axum::redirect(path);
    }
}

/// Sends a form posted without JavaScript back to the page it was posted from (its
/// `Referer`: this site's, as the origin check made sure) with `done=<form>`, for that
/// page's success notice. A hydrated page is left alone (it shows the answer where it is).
pub fn back_done(form: &str) {
    if !from_a_form() {
        return;
    }
    let referer = use_context::<Parts>().and_then(|p| {
        p.headers
            .get(axum::http::header::REFERER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    leptos_axum::redirect(&with_done(referer.as_deref().unwrap_or("/"), form));
}

/// `referer`'s path and query, without a former answer (`done`, `kept`, a server function's
/// error), with `done=<form>`, landing on the form (`#form`).
fn with_done(referer: &str, form: &str) -> String {
    let path = match referer.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None if referer.starts_with('/') && !referer.starts_with("//") => referer,
        None => "/",
    };
    let path = path.split('#').next().unwrap_or("/");
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    // This site's page, never another's (`//host`, `/\host`).
    let path = if path.starts_with("//") || path.starts_with("/\\") {
        "/"
    } else {
        path
    };
    // What the page is of (an identifier, a policy), not an earlier answer (a reset's
    // notice, a kept draft, an error).
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| matches!(p.split('=').next().unwrap_or_default(), "id" | "name"))
        .collect();
    let done = format!("done={}", crate::domain::percent_encode(form));
    pairs.push(&done);
    format!("{path}?{}#{form}", pairs.join("&"))
}

/// Sets the status of a server function's answer, except for a plain form post (JavaScript
/// off): that one must stay a redirect back to the page, which shows the error.
pub fn set_status(status: StatusCode) {
    if !from_a_form()
        && let Some(response) = use_context::<leptos_axum::ResponseOptions>()
    {
        response.set_status(status);
    }
}

fn fail(status: StatusCode, message: &str) -> AppError {
    AppError::refused(status, message)
}

/// The signed-in caller, if any (no role check).
pub fn caller() -> Option<Caller> {
    let parts = use_context::<Parts>()?;
    let session = parts.extensions.get::<CurrentSession>()?.0.clone()?;
    let (user, role) = session.user()?;
    Some(Caller {
        user: user.clone(),
        role,
        ip: parts
            .extensions
            .get::<ClientIp>()
            .map(|ip| ip.0.clone())
            .unwrap_or_default(),
        csrf: session.record.csrf.clone(),
        session_digest: session.digest.clone(),
    })
}

/// For reads: a signed-in caller whose role may do `action`.
pub fn require(action: Action) -> Result<Caller, AppError> {
    let caller = caller().ok_or_else(|| fail(StatusCode::UNAUTHORIZED, "sign in first"))?;
    if !caller.role.may(action) {
        return Err(fail(
            StatusCode::FORBIDDEN,
            &format!("the {} role may not do this", caller.role),
        ));
    }
    Ok(caller)
}

/// For changes: as `require`, and the request must carry the session's CSRF token (the
/// middleware already refused other origins).
pub fn require_change(action: Action, csrf: &str) -> Result<Caller, AppError> {
    let caller = require(action)?;
    let matches = use_context::<Parts>()
        .and_then(|p| p.extensions.get::<CurrentSession>()?.0.clone())
        .is_some_and(|s| s.csrf_matches(csrf));
    if !matches {
        return Err(fail(
            StatusCode::FORBIDDEN,
            "the form's security token is missing or stale; reload the page",
        ));
    }
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::with_done;

    #[test]
    fn a_form_goes_back_to_its_page_with_its_notice_and_no_former_answer() {
        for (referer, back) in [
            (
                "http://127.0.0.1:3000/identifiers?id=user%3Dbob",
                "/identifiers?id=user%3Dbob&done=override#override",
            ),
            (
                "https://spillway.example/policy?name=demo&done=override&__err=x#overrides",
                "/policy?name=demo&done=override#override",
            ),
            (
                "http://h/identifiers",
                "/identifiers?done=override#override",
            ),
            ("http://h", "/?done=override#override"),
            (
                "http://h/identifiers?id=bob&reset=3&undo=t0k&done=lease",
                "/identifiers?id=bob&done=override#override",
            ),
            ("https://h//evil.example/x", "/?done=override#override"),
            ("//evil.example/x", "/?done=override#override"),
        ] {
            assert_eq!(with_done(referer, "override"), back, "{referer}");
        }
    }
}
