//! Who is using the dashboard, as the page sees it: the signed-in user and role (or none)
//! and the session's CSRF token, which every form sends back.

use leptos::prelude::*;

use crate::app::error::AppError;
use serde::{Deserialize, Serialize};

use crate::domain::people::{Action, Role};

/// The current session, as pages need it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    pub user: Option<String>,
    pub role: Option<Role>,
    /// The token forms must send back.
    pub csrf: String,
}

impl SessionView {
    pub fn may(&self, action: Action) -> bool {
        self.role.is_some_and(|r| r.may(action))
    }
}

/// The caller's session (for a visitor, just the sign-in form's token).
#[server(prefix = "/fn", endpoint = "whoami")]
pub async fn whoami() -> Result<SessionView, AppError> {
    use crate::auth::session::{CurrentSession, LoginToken};
    let parts = use_context::<axum::http::request::Parts>();
    let session = parts
        .as_ref()
        .and_then(|p| p.extensions.get::<CurrentSession>().cloned())
        .and_then(|s| s.0);
    Ok(match session {
        // A visitor: the sign-in form's token, from the login cookie.
        None => SessionView {
            csrf: parts
                .and_then(|p| p.extensions.get::<LoginToken>().map(|t| t.0.clone()))
                .unwrap_or_default(),
            ..SessionView::default()
        },
        Some(s) => SessionView {
            user: s.record.user.as_ref().map(|u| u.to_string()),
            role: s.record.role,
            csrf: s.record.csrf.clone(),
        },
    })
}

/// The session resource the app provides to every page.
pub type SessionResource = Resource<Result<SessionView, AppError>>;

/// The session resource (provided by `App`).
pub fn use_session() -> SessionResource {
    expect_context::<SessionResource>()
}

/// A server function's error as an alert shows it (a field error names its field).
pub fn error_message(e: &AppError) -> String {
    e.to_string()
}

/// A hidden input carrying the CSRF token.
#[component]
pub fn CsrfField(csrf: String) -> impl IntoView {
    view! { <input type="hidden" name="csrf" value=csrf/> }
}
