//! The signed-in person's own account: who they are, and changing their password (which
//! ends every one of their sessions, this one included).

use leptos::prelude::*;

use crate::app::error::AppError;
use leptos_meta::Title;

use super::session::{CsrfField, error_message, use_session};

/// Changes the caller's own password after checking the current one.
#[server(prefix = "/fn", endpoint = "my_password")]
pub async fn change_my_password(
    #[server(default)] csrf: String,
    #[server(default)] current: String,
    #[server(default)] new_password: String,
) -> Result<(), AppError> {
    use crate::{
        domain::people::Action,
        service::people::{OwnPasswordRefused, PeopleError},
    };
    let caller = crate::app::guard::require_change(Action::View, &csrf)?;
    let state = expect_context::<crate::state::AppState>();
    state
        .service()
        .change_own_password(&caller.actor(), &caller.user, current, &new_password)
        .await
        .map_err(|refused| match refused {
            OwnPasswordRefused::Limited(_) => {
                let error = AppError::bad_input("current", refused);
                crate::app::guard::set_status(axum::http::StatusCode::TOO_MANY_REQUESTS);
                error
            }
            OwnPasswordRefused::WrongPassword | OwnPasswordRefused::NoSuchUser => {
                AppError::bad_input("current", refused)
            }
            OwnPasswordRefused::Refused(PeopleError::Invalid { message, .. }) => {
                AppError::bad_input("new_password", message)
            }
            OwnPasswordRefused::Refused(other) => {
                AppError::refused(axum::http::StatusCode::BAD_REQUEST, other)
            }
            OwnPasswordRefused::Unavailable(e) => AppError::unavailable("password change", e),
        })?;
    leptos_axum::redirect("/login?changed=1");
    Ok(())
}

#[component]
pub fn AccountPage() -> impl IntoView {
    let change = ServerAction::<ChangeMyPassword>::new();
    let session = use_session();
    view! {
        <Title text="Account"/>
        <h1>"Your account"</h1>
        {move || change.value().get().and_then(|r| r.err()).map(|e| view! { <p class="alert" role="alert">{error_message(&e)}</p> })}
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                view! {
                    <section class="card narrow" aria-labelledby="password-heading">
                        <p>{format!("Signed in as {} ({}).", s.user.clone().unwrap_or_default(), s.role.map_or("", |r| r.as_str()))}</p>
                        <h2 id="password-heading">"Change your password"</h2>
                        <p class="muted">"Every session of yours ends, this one too: you sign in again with the new password."</p>
                        <ActionForm action=change attr:class="stack">
                            <CsrfField csrf=s.csrf.clone()/>
                            <label>"Current password"<input name="current" type="password" required autocomplete="current-password"/></label>
                            <label>"New password (12 or more characters)"<input name="new_password" type="password" required minlength="12" autocomplete="new-password"/></label>
                            <button type="submit">"Change password"</button>
                        </ActionForm>
                    </section>
                }
            })}
        </Suspense>
    }
}
