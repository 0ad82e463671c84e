//! Users and API keys (admins only): add users, change roles, remove them; create API keys
//! (the key is shown once), see when each was last used, revoke them.

use leptos::prelude::*;

use crate::app::widgets::{ConfirmStep, CopyButton};

use crate::app::error::AppError;
use leptos_meta::Title;
use serde::{Deserialize, Serialize};

use super::kept::{Kept, use_done, use_kept};
use super::session::{CsrfField, error_message};
use crate::domain::{
    people::{KeyRole, Role},
    time::utc_minutes,
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRow {
    pub username: String,
    pub role: Role,
    pub created_at_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub role: KeyRole,
    pub created_at_ms: i64,
    pub created_by: String,
    pub revoked_at_ms: Option<i64>,
    pub last_used_ms: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeopleView {
    pub users: Vec<UserRow>,
    pub keys: Vec<KeyRow>,
    /// A key created just now, shown once.
    pub new_key: Option<String>,
    pub csrf: String,
    pub me: String,
}

#[cfg(feature = "ssr")]
fn state() -> crate::state::AppState {
    expect_context::<crate::state::AppState>()
}

#[cfg(feature = "ssr")]
fn store_failed(e: impl std::fmt::Display) -> AppError {
    AppError::unavailable("people page", e)
}

#[cfg(feature = "ssr")]
fn people_failed(e: crate::service::people::PeopleError) -> AppError {
    use crate::service::people::PeopleError;
    match e {
        PeopleError::Store(e) => store_failed(e),
        PeopleError::Invalid { field, message } => AppError::bad_input(field, message),
        other => AppError::bad_input(other.field(), other),
    }
}

#[server(prefix = "/fn", endpoint = "people")]
pub async fn list_people() -> Result<PeopleView, AppError> {
    use crate::{app::guard, domain::people::Action};
    let caller = guard::require(Action::ManagePeople)?;
    let service = state().service().clone();
    let users = service.users().await.map_err(store_failed)?;
    let keys = service.api_keys().await.map_err(store_failed)?;
    // A new key is shown once: half of it was left in the session, the other half in this
    // browser's cookie (see create_key).
    let new_key = service
        .take_session_flash(&caller.session_digest)
        .await
        .map_err(store_failed)?
        .and_then(|masked| {
            let pad = crate::auth::cookies::cookie_value(
                &use_context::<axum::http::request::Parts>()?.headers,
                NEW_KEY_COOKIE,
            )?;
            crate::service::keys::join_secret(&masked, &pad)
        });
    Ok(PeopleView {
        users: users
            .into_iter()
            .map(|u| UserRow {
                username: u.username.to_string(),
                role: u.role,
                created_at_ms: u.created_at_ms,
            })
            .collect(),
        keys: keys
            .into_iter()
            .map(|k| KeyRow {
                id: k.id,
                name: k.name,
                role: k.role,
                created_at_ms: k.created_at_ms,
                created_by: k.created_by,
                revoked_at_ms: k.revoked_at_ms,
                last_used_ms: k.last_used_ms,
            })
            .collect(),
        new_key,
        csrf: caller.csrf,
        me: caller.user.to_string(),
    })
}

#[server(prefix = "/fn", endpoint = "user_add")]
pub async fn add_user(
    #[server(default)] csrf: String,
    #[server(default)] username: String,
    #[server(default)] role: String,
    #[server(default)] password: String,
) -> Result<(), AppError> {
    use crate::{app::guard, domain::people::Action};
    let added = async {
        let caller = guard::require_change(Action::ManagePeople, &csrf)?;
        let role = Role::parse(&role).map_err(|m| AppError::bad_input("role", m))?;
        state()
            .service()
            .add_user(&caller.actor(), &username, role, &password)
            .await
            .map(|_| ())
            .map_err(people_failed)
    }
    .await;
    crate::app::kept::answer_form(
        "/people",
        "new-user",
        &[("username", &username), ("role", &role)],
        &added,
    );
    added
}

#[server(prefix = "/fn", endpoint = "user_set_role")]
pub async fn set_user_role(
    #[server(default)] csrf: String,
    #[server(default)] username: String,
    #[server(default)] role: String,
) -> Result<(), AppError> {
    use crate::{app::guard, domain::people::Action};
    let caller = guard::require_change(Action::ManagePeople, &csrf)?;
    let role = Role::parse(&role).map_err(|m| AppError::bad_input("role", m))?;
    state()
        .service()
        .set_role(&caller.actor(), &username, role)
        .await
        .map_err(people_failed)
}

#[server(prefix = "/fn", endpoint = "user_remove")]
pub async fn remove_user(
    #[server(default)] csrf: String,
    #[server(default)] username: String,
) -> Result<(), AppError> {
    use crate::{app::guard, domain::people::Action};
    let caller = guard::require_change(Action::ManagePeople, &csrf)?;
    state()
        .service()
        .remove_user(&caller.actor(), &username)
        .await
        .map_err(people_failed)
}

#[server(prefix = "/fn", endpoint = "key_create")]
pub async fn create_key(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] role: String,
) -> Result<(), AppError> {
    use crate::{app::guard, domain::people::Action};
    let made = async {
        let caller = guard::require_change(Action::ManagePeople, &csrf)?;
        let role = KeyRole::parse(&role).map_err(|m| AppError::bad_input("role", m))?;
        let (_, secret) = state()
            .service()
            .create_key(&caller.actor(), &name, role)
            .await
            .map_err(people_failed)?;
        Ok((caller, secret))
    }
    .await;
    crate::app::kept::answer_form(
        "/people",
        "new-key",
        &[("name", &name), ("role", &role)],
        &made,
    );
    let (caller, secret) = made?;
    let service = state().service().clone();
    // Shown once by the next read of the page, with or without JavaScript: the session keeps
    // the key XOR a random pad, the browser the pad (an HttpOnly cookie), so neither Redis
    // nor the cookie alone holds the key.
    let (masked, pad) = crate::service::keys::split_secret(&secret);
    service
        .set_session_flash(&caller.session_digest, &masked)
        .await
        .map_err(store_failed)?;
    let secure = use_context::<axum::http::request::Parts>()
        .and_then(|p| {
            p.extensions
                .get::<crate::auth::session::OverHttps>()
                .copied()
        })
        .is_some_and(|s| s.0);
    expect_context::<leptos_axum::ResponseOptions>().append_header(
        axum::http::header::SET_COOKIE,
        crate::auth::cookies::private_cookie(NEW_KEY_COOKIE, &pad, secure),
    );
    Ok(())
}

/// The cookie that holds the browser's half of a new API key until the page shows it.
#[cfg(feature = "ssr")]
const NEW_KEY_COOKIE: &str = "spillway_new_key";

#[server(prefix = "/fn", endpoint = "key_revoke")]
pub async fn revoke_key(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
) -> Result<(), AppError> {
    use crate::{app::guard, domain::people::Action};
    let caller = guard::require_change(Action::ManagePeople, &csrf)?;
    state()
        .service()
        .revoke_key(&caller.actor(), &id)
        .await
        .map_err(people_failed)
}

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn PeoplePage() -> impl IntoView {
    let add = ServerAction::<AddUser>::new();
    let set_role = ServerAction::<SetUserRole>::new();
    let remove = ServerAction::<RemoveUser>::new();
    let create = ServerAction::<CreateKey>::new();
    let revoke = ServerAction::<RevokeKey>::new();
    // The lists are read again after a change that succeeded, not after a failed one: that
    // would draw the forms anew and lose what was typed.
    let changes = RwSignal::new(0usize);
    let count_success = move |ok: Signal<bool>| {
        Effect::new(move |_| {
            if ok.get() {
                changes.update(|n| *n += 1);
            }
        });
    };
    let ok = |r: &Option<Result<(), AppError>>| matches!(r, Some(Ok(())));
    count_success(Signal::derive(move || add.value().with(ok)));
    count_success(Signal::derive(move || set_role.value().with(ok)));
    count_success(Signal::derive(move || remove.value().with(ok)));
    count_success(Signal::derive(move || create.value().with(ok)));
    count_success(Signal::derive(move || revoke.value().with(ok)));
    let data = Resource::new(move || changes.get(), |_| list_people());
    // A form whose post succeeded is cleared (with JavaScript; without, the page comes back
    // empty).
    let (add_form, key_form) = (
        NodeRef::<leptos::html::Form>::new(),
        NodeRef::<leptos::html::Form>::new(),
    );
    Effect::new(move |_| {
        if add.value().with(ok)
            && let Some(form) = add_form.get()
        {
            form.reset();
        }
    });
    Effect::new(move |_| {
        if create.value().with(ok)
            && let Some(form) = key_form.get()
        {
            form.reset();
        }
    });
    // A form that failed without JavaScript: what was typed (never the password), from the
    // address.
    let kept_user = use_kept("new-user");
    let added_without_js = use_done("new-user");
    let kept_key = use_kept("new-key");
    let typed = |kept: Memo<Option<Kept>>, field: &'static str| {
        move || kept.with(|k| k.as_ref().map(|k| k.value(field)))
    };
    let errors = move || {
        [
            add.value().get(),
            set_role.value().get(),
            remove.value().get(),
            create.value().get(),
            revoke.value().get(),
        ]
        .into_iter()
        .filter_map(|r| r.and_then(Result::err))
        .map(|e| error_message(&e))
        .chain(
            [kept_user.get(), kept_key.get()]
                .into_iter()
                .flatten()
                .filter(|k| !k.message.is_empty())
                .map(|k| k.error_line()),
        )
        .collect::<Vec<_>>()
    };

    let done = move || {
        let ok = |r: Option<Result<(), AppError>>| r.is_some_and(|r| r.is_ok());
        [
            (
                ok(add.value().get()) || added_without_js.get(),
                "User added.",
            ),
            (ok(set_role.value().get()), "Role set."),
            (ok(remove.value().get()), "User removed and signed out."),
            (ok(revoke.value().get()), "Key revoked."),
        ]
        .into_iter()
        .filter(|(done, _)| *done)
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
    };

    view! {
        <Title text="Users and keys"/>
        <h1>"Users and API keys"</h1>
        {move || errors().into_iter().map(|e| view! { <p class="alert" role="alert">{e}</p> }).collect_view()}
        {move || done().into_iter().map(|t| view! { <p class="notice" role="status">{t}</p> }).collect_view()}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(p) => {
                        let csrf = p.csrf.clone();
                        let (csrf_add, csrf_key) = (csrf.clone(), csrf.clone());
                        let me = p.me.clone();
                        let user_rows = p.users.into_iter().map(|u| {
                            let name = u.username.clone();
                            let is_me = name == me;
                            let role = u.role;
                            let (c1, c2) = (csrf.clone(), csrf.clone());
                            let (n1, n2) = (name.clone(), name.clone());
                            let role_label = format!("Role of {name}");
                            let remove_label = format!("Remove {name}");
                            view! {
                                <tr>
                                    <td>{name}{is_me.then_some(" (you)")}</td>
                                    <td>
                                        {role.as_str()}
                                        <ConfirmStep summary="Change…">
                                            <ActionForm action=set_role attr:class="inline">
                                                <CsrfField csrf=c1/>
                                                <input type="hidden" name="username" value=n1/>
                                                <select name="role" aria-label=role_label>
                                                    {Role::ALL.iter().map(|r| view! {
                                                        <option value=r.as_str() selected=*r == role>{r.as_str()}</option>
                                                    }).collect_view()}
                                                </select>
                                                <button type="submit" class="small">"Set role"</button>
                                            </ActionForm>
                                            <p class="muted small">"Takes effect on their next request; their sessions stay signed in."</p>
                                        </ConfirmStep>
                                    </td>
                                    <td>{utc_minutes(Some(u.created_at_ms))}</td>
                                    <td>
                                        <ConfirmStep summary="Remove…" warning={format!("{n2} is signed out everywhere and can no longer sign in. Their audit records stay.")}>
                                            <ActionForm action=remove attr:class="inline">
                                                <CsrfField csrf=c2/>
                                                <input type="hidden" name="username" value=n2.clone()/>
                                                <button type="submit" class="small danger" aria-label=remove_label>{format!("Yes, remove {n2}")}</button>
                                            </ActionForm>
                                        </ConfirmStep>
                                    </td>
                                </tr>
                            }
                        }).collect_view();
                        let no_keys = p.keys.is_empty();
                        let key_rows = p.keys.into_iter().map(|k| {
                            let revoked = k.revoked_at_ms;
                            let label = format!("Revoke {}", k.name);
                            let id = k.id.clone();
                            let c = csrf.clone();
                            view! {
                                <tr>
                                    <td>{k.name}<br/><span class="muted small">{k.id}</span></td>
                                    <td>{k.role.as_str()}</td>
                                    <td>{utc_minutes(Some(k.created_at_ms))}<br/><span class="muted small">{k.created_by}</span></td>
                                    <td>{utc_minutes(k.last_used_ms)}</td>
                                    <td>{match revoked {
                                        Some(ms) => view! { <span class="badge bad">"revoked"</span>" "{utc_minutes(Some(ms))} }.into_any(),
                                        None => view! { <span class="badge ok">"active"</span> }.into_any(),
                                    }}</td>
                                    <td>{revoked.is_none().then(|| view! {
                                        <ConfirmStep summary="Revoke…" warning="Every service using this key is refused (401) from its next call. A revoked key cannot be restored: make a new one.">
                                            <ActionForm action=revoke attr:class="inline">
                                                <CsrfField csrf=c/>
                                                <input type="hidden" name="id" value=id/>
                                                <button type="submit" class="small danger" aria-label=label>"Yes, revoke it"</button>
                                            </ActionForm>
                                        </ConfirmStep>
                                    })}</td>
                                </tr>
                            }
                        }).collect_view();
                        view! {
                            {p.new_key.map(|k| view! {
                                <section class="card notice" aria-labelledby="new-key">
                                    <h2 id="new-key">"New API key"</h2>
                                    <p>"Copy it now: it is not shown again."</p>
                                    <code data-testid="new-key">{k.clone()}</code>
                                    <CopyButton text=k/>
                                </section>
                            })}
                            <section class="card" aria-labelledby="users-heading">
                                <h2 id="users-heading">"Users"</h2>
                                <table>
                                    <thead><tr><th>"User"</th><th>"Role"</th><th>"Created"</th><th></th></tr></thead>
                                    <tbody>{user_rows}</tbody>
                                </table>
                                <h3>"Add a user"</h3>
                                <ActionForm action=add attr:class="row" attr:id="new-user" node_ref=add_form>
                                    <CsrfField csrf=csrf_add/>
                                    <label>"User name"<input name="username" required autocomplete="off" value=typed(kept_user, "username")/></label>
                                    <label>"Role"
                                        <select name="role">
                                            {["viewer", "support", "admin"].map(|r| view! {
                                                <option value=r selected=move || typed(kept_user, "role")().as_deref() == Some(r)>{r}</option>
                                            })}
                                        </select>
                                    </label>
                                    <label>"Password (12 or more characters)"<input name="password" type="password" required minlength="12" autocomplete="new-password"/></label>
                                    <button type="submit">"Add user"</button>
                                </ActionForm>
                            </section>
                            <section class="card" aria-labelledby="keys-heading">
                                <h2 id="keys-heading">"API keys"</h2>
                                <p class="muted">"Service keys may only call the check endpoints; admin keys act as admins on the JSON API. Keys from SPILLWAY_SERVICE_KEYS and SPILLWAY_ADMIN_KEYS are not listed."</p>
                                <table>
                                    <thead><tr><th>"Name"</th><th>"Role"</th><th>"Created"</th><th>"Last used"</th><th>"State"</th><th></th></tr></thead>
                                    <tbody>{key_rows}</tbody>
                                </table>
                                {no_keys.then(|| view! { <p class="empty">"No API keys made here yet."</p> })}
                                <h3>"Create a key"</h3>
                                <ActionForm action=create attr:class="row" attr:id="new-key" node_ref=key_form>
                                    <CsrfField csrf=csrf_key/>
                                    <label>"Name"<input name="name" required autocomplete="off" value=typed(kept_key, "name")/></label>
                                    <label>"Role"
                                        <select name="role">
                                            {["service", "admin"].map(|r| view! {
                                                <option value=r selected=move || typed(kept_key, "role")().as_deref() == Some(r)>{r}</option>
                                            })}
                                        </select>
                                    </label>
                                    <button type="submit">"Create key"</button>
                                </ActionForm>
                            </section>
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}
