//! Signing in and out. Plain form posts (they work with JavaScript off), answered with a
//! redirect.
//!
//! The checks, limits and audit records are the service's (`service::sessions`): failed
//! sign-ins are limited by Spillway's own engine, charged before the password is checked and
//! given back when it was right; unknown user and wrong password get the same answer after
//! the same Argon2 work.
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

use super::session::{ClientIp, CurrentSession, OverHttps, safe_next};
use crate::{
    service::sessions::{SignIn, SignInRefused},
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
        crate::domain::percent_encode_path(safe_next(next))
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
    let from_this_site = super::cookies::login_token_matches(&headers, &form.csrf)
        || current
            .0
            .as_ref()
            .is_some_and(|s| s.csrf_matches(&form.csrf));
    if !from_this_site {
        return forbidden(
            "Your sign-in form expired or was not sent from this site. Load the sign-in page again.",
        );
    }
    let attempt = SignIn {
        username: &form.username,
        password: form.password,
        ip: &ip,
    };
    let previous = current.0.as_ref().map(|s| s.digest.as_str());
    let id = match state
        .service()
        .sign_in(attempt, previous, state.sessions)
        .await
    {
        Ok((id, _)) => id,
        Err(SignInRefused::Invalid) => return back_to_login("invalid", &form.next, ""),
        Err(SignInRefused::Limited(wait_s)) => {
            return back_to_login("limited", &form.next, &format!("&retry={wait_s}"));
        }
        Err(SignInRefused::Unavailable(error)) => {
            tracing::warn!(%error, "sign-in: Redis unavailable");
            return back_to_login("unavailable", &form.next, "");
        }
    };
    let mut response = Redirect::to(safe_next(&form.next)).into_response();
    let h = response.headers_mut();
    h.append(header::SET_COOKIE, super::cookies::cookie(&id, secure));
    h.append(
        header::SET_COOKIE,
        super::cookies::login_token_removal(secure),
    );
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
            [(header::SET_COOKIE, super::cookies::removal_cookie(secure))],
            Redirect::to("/login"),
        )
            .into_response();
    };
    if !s.csrf_matches(&form.csrf) {
        return forbidden("The sign-out form was not sent from this site.");
    }
    if let Err(error) = state.service().sign_out(&s, &ip).await {
        tracing::warn!(%error, "sign-out: could not delete the session");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "Redis is unavailable; try again.",
        )
            .into_response();
    }
    (
        [(header::SET_COOKIE, super::cookies::removal_cookie(secure))],
        Redirect::to("/login"),
    )
        .into_response()
}
