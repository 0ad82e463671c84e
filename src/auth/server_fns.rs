//! The server functions' (`/fn/…`) guard before their arguments are read: a visitor not
//! signed in gets 401, a role that may not call the function 403, each as the function's
//! own role check (`app::guard::require`) words it, so nothing a caller sent is decoded
//! before who they are is known.

use axum::{
    extract::Request,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use super::session::{Session, safe_next};
use crate::domain::people::{Action, Role};

/// The refusal of a server function call before its arguments are read, if it is refused.
pub(super) fn refuse_before_reading(
    req: &Request,
    path: &str,
    session: Option<&Session>,
) -> Option<Response> {
    if !path.starts_with("/fn/") {
        return None;
    }
    match session.and_then(Session::user) {
        None if !OPEN_SERVER_FNS.contains(&path) => Some(server_fn_sign_in_first(req, path)),
        None => None,
        Some((_, role)) => server_fn_role_refusal(req, path, role),
    }
}

/// Server functions anyone may call (they say who is signed in, or answer nothing to a
/// visitor); every other one needs a signed-in caller, checked here before its arguments
/// are read.
const OPEN_SERVER_FNS: &[&str] = &["/fn/whoami", "/fn/alerts_firing"];

/// What each server function's own role check asks (`app::guard::require`), so a caller
/// whose role may not is refused before the function's arguments are read. A test holds
/// this table to the functions' code (`tests/it/auth.rs`); a function missing here is left
/// to its own check.
pub const SERVER_FN_ACTIONS: &[(&str, Action)] = &[
    ("/fn/my_password", Action::View),
    ("/fn/alerts", Action::View),
    ("/fn/alert_test", Action::EditPolicies),
    ("/fn/alert_save", Action::EditPolicies),
    ("/fn/alert_delete", Action::EditPolicies),
    ("/fn/audit", Action::View),
    ("/fn/history", Action::View),
    ("/fn/inspect", Action::View),
    ("/fn/identifier_denials", Action::View),
    ("/fn/reset", Action::ResetIdentifier),
    ("/fn/reset_undo", Action::ResetIdentifier),
    ("/fn/release_lease", Action::ResetIdentifier),
    ("/fn/overview", Action::View),
    ("/fn/redis_status", Action::View),
    ("/fn/people", Action::ManagePeople),
    ("/fn/user_add", Action::ManagePeople),
    ("/fn/user_set_role", Action::ManagePeople),
    ("/fn/user_remove", Action::ManagePeople),
    ("/fn/key_create", Action::ManagePeople),
    ("/fn/key_revoke", Action::ManagePeople),
    ("/fn/policies", Action::View),
    ("/fn/policies_page", Action::View),
    ("/fn/domains_folder", Action::View),
    ("/fn/policy", Action::View),
    ("/fn/policy_save", Action::EditPolicies),
    ("/fn/policy_what_if", Action::EditPolicies),
    ("/fn/envoy_import", Action::EditPolicies),
    ("/fn/envoy_save", Action::EditPolicies),
    ("/fn/policy_rollback", Action::EditPolicies),
    ("/fn/policy_delete", Action::EditPolicies),
    ("/fn/policy_restore", Action::EditPolicies),
    ("/fn/override_add", Action::ManageOverrides),
    ("/fn/override_remove", Action::ManageOverrides),
    ("/fn/override_change", Action::ManageOverrides),
];

/// A signed-in caller's refusal by a server function's role check, made before its
/// arguments are read: 403 with the dashboard's error, as `app::guard::require` words it.
/// A form posted without JavaScript goes on to the function, which shows the refusal on
/// its page.
fn server_fn_role_refusal(req: &Request, path: &str, role: Role) -> Option<Response> {
    let action = SERVER_FN_ACTIONS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, a)| *a)?;
    if role.may(action) || accepts_html(req) {
        return None;
    }
    let body = serde_json::json!({ "Refused": format!("the {role} role may not do this") });
    Some(
        (
            StatusCode::FORBIDDEN,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::HeaderName::from_static("serverfnerror"), path),
            ],
            body.to_string(),
        )
            .into_response(),
    )
}

/// Whether `req` is a form posted by a browser without JavaScript (it asks for HTML).
fn accepts_html(req: &Request) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

/// A server function's answer to someone not signed in, as its own role check gives it:
/// 401 with the dashboard's error (`{"Refused": …}`, the JSON of `app::AppError`); a form
/// posted without JavaScript goes to the sign-in page and back to the page it came from.
fn server_fn_sign_in_first(req: &Request, path: &str) -> Response {
    if accepts_html(req) {
        let back = req
            .headers()
            .get(header::REFERER)
            .and_then(|v| v.to_str().ok())
            .and_then(|r| r.parse::<axum::http::Uri>().ok())
            .map_or_else(|| "/".to_owned(), |u| u.path().to_owned());
        let next: String =
            url::form_urlencoded::byte_serialize(safe_next(&back).as_bytes()).collect();
        return axum::response::Redirect::to(&format!("/login?next={next}")).into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::HeaderName::from_static("serverfnerror"), path),
        ],
        r#"{"Refused":"sign in first"}"#,
    )
        .into_response()
}
