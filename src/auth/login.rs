//! Signing in and out. Plain form posts (they work with JavaScript off), answered with a
//! redirect.
//!
//! Failed sign-ins are limited by Spillway's own engine (`service::signin`: charged before the
//! password is checked, given back when it was right). Unknown user and wrong password get
//! the same answer after the same Argon2 work.
//!
//! A visitor of the sign-in page gets no session: the form's CSRF token is a random value in
//! a cookie of its own (HttpOnly, SameSite=Strict) that the form sends back, so anonymous
//! page loads store nothing in Redis.

use axum::{
    Extension, Form, Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{Html, IntoResponse, Redirect, Response},
    routing::post,
};
use serde::Deserialize;

use super::{
    password,
    session::{self, ClientIp, CurrentSession, OverHttps, encode_component, safe_next},
};
use crate::{
    audit::{Actor, Change},
    domain::people::Username,
    service::signin::{Attempt, Charged},
    state::AppState,
};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/auth/login", post(login))
        .route("/auth/logout", post(logout))
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
}

fn back_to_login(error: &str, next: &str, extra: &str) -> Response {
    Redirect::to(&format!(
        "/login?error={error}{extra}&next={}",
        encode_component(safe_next(next))
    ))
    .into_response()
}

fn forbidden(message: &'static str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(format!(
            "<!DOCTYPE html><title>Refused</title><p>{message}</p><p><a href=\"/login\">Sign in again</a></p>"
        )),
    )
        .into_response()
}

async fn login(
    State(state): State<AppState>,
    Extension(current): Extension<CurrentSession>,
    Extension(ClientIp(ip)): Extension<ClientIp>,
    Extension(OverHttps(secure)): Extension<OverHttps>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    // The sign-in form's token: a visitor's login cookie (nothing is stored for a visitor),
    // or the session's own for someone signed in already.
    let from_this_site = session::login_token_matches(&headers, &form.csrf)
        || current
            .0
            .as_ref()
            .is_some_and(|s| s.csrf_matches(&form.csrf));
    if !from_this_site {
        return forbidden(
            "Your sign-in form expired or was not sent from this site. Load the sign-in page again.",
        );
    }
    // User names are at most 64 characters; a longer one is wrong, but still charged.
    let attempted: String = form
        .username
        .trim()
        .to_ascii_lowercase()
        .chars()
        .filter(|c| !c.is_control())
        .take(65)
        .collect();
    let actor = Actor {
        name: attempted.clone(),
        role: String::new(),
        ip: ip.clone(),
    };

    // Charge the attempt before looking at the password.
    let attempt = match Attempt::charge(&state, &attempted, &ip).await {
        Ok(Charged::Allowed(attempt)) => attempt,
        Ok(Charged::Invalid) => return back_to_login("invalid", &form.next, ""),
        Ok(Charged::Limited(wait_s)) => {
            let _ = actor
                .record(
                    &state.store,
                    Change {
                        action: "login.limited",
                        target: &attempted,
                        reason: "too many failed sign-ins",
                        ..Change::default()
                    },
                )
                .await;
            return back_to_login("limited", &form.next, &format!("&retry={wait_s}"));
        }
        Err(error) => {
            tracing::warn!(%error, "sign-in: Redis unavailable");
            return back_to_login("unavailable", &form.next, "");
        }
    };

    let user = match Username::parse(&attempted) {
        Ok(name) => match state.store.get_user(&name).await {
            Ok(user) => user,
            Err(error) => {
                tracing::warn!(%error, "sign-in: Redis unavailable");
                return back_to_login("unavailable", &form.next, "");
            }
        },
        Err(_) => None,
    };
    let stored_hash = user.as_ref().map(|u| u.password_hash.clone());
    let ok = password::verify(stored_hash, form.password).await;
    let user = match (ok, user) {
        (true, Some(user)) => user,
        _ => {
            let _ = actor
                .record(
                    &state.store,
                    Change {
                        action: "login.failure",
                        target: &attempted,
                        ..Change::default()
                    },
                )
                .await;
            return back_to_login("invalid", &form.next, "");
        }
    };

    // Success: forgive the attempt; a session this browser had ends, and a new one starts.
    attempt.forgive(&state).await;
    if let Some(previous) = current.0 {
        let _ = state.store.delete_session(&previous.digest, None).await;
    }
    let (id, _) = match session::start(&state, (user.username.clone(), user.role)).await {
        Ok(started) => started,
        Err(error) => {
            tracing::warn!(%error, "sign-in: could not start a session");
            return back_to_login("unavailable", &form.next, "");
        }
    };
    let _ = Actor {
        name: format!("user:{}", user.username),
        role: user.role.to_string(),
        ip,
    }
    .record(
        &state.store,
        Change {
            action: "login.success",
            target: user.username.as_str(),
            ..Change::default()
        },
    )
    .await;
    let mut response = Redirect::to(safe_next(&form.next)).into_response();
    let h = response.headers_mut();
    h.append(header::SET_COOKIE, session::cookie(&id, secure));
    h.append(header::SET_COOKIE, session::login_token_removal(secure));
    response
}

#[derive(Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(state): State<AppState>,
    Extension(current): Extension<CurrentSession>,
    Extension(ClientIp(ip)): Extension<ClientIp>,
    Extension(OverHttps(secure)): Extension<OverHttps>,
    Form(form): Form<LogoutForm>,
) -> Response {
    let Some(s) = current.0 else {
        return (
            [(header::SET_COOKIE, session::removal_cookie(secure))],
            Redirect::to("/login"),
        )
            .into_response();
    };
    if !s.csrf_matches(&form.csrf) {
        return forbidden("The sign-out form was not sent from this site.");
    }
    if let Err(error) = state
        .store
        .delete_session(&s.digest, s.record.user.as_ref())
        .await
    {
        tracing::warn!(%error, "sign-out: could not delete the session");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "Redis is unavailable; try again.",
        )
            .into_response();
    }
    if let Some((user, role)) = s.user() {
        let _ = Actor {
            name: format!("user:{user}"),
            role: role.to_string(),
            ip,
        }
        .record(
            &state.store,
            Change {
                action: "logout",
                target: user.as_str(),
                ..Change::default()
            },
        )
        .await;
    }
    (
        [(header::SET_COOKIE, session::removal_cookie(secure))],
        Redirect::to("/login"),
    )
        .into_response()
}
