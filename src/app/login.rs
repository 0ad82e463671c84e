//! The sign-in page: a plain form posted to `/auth/login` (it works the same with
//! JavaScript off), with the answer of the last attempt from the query string.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::session::use_session;

#[component]
pub fn LoginPage() -> impl IntoView {
    let query = use_query_map();
    let session = use_session();
    let error = move || {
        query.with(|q| match q.get("error").as_deref() {
            Some("invalid") => Some("Wrong user name or password.".to_owned()),
            Some("limited") => Some(format!(
                "Too many failed sign-ins. Try again in {} seconds.",
                q.get("retry").unwrap_or_else(|| "a few".into())
            )),
            Some("unavailable") => Some(
                "Redis is unavailable, so nobody can sign in right now. Try again soon.".into(),
            ),
            _ => None,
        })
    };
    let next = move || query.with(|q| q.get("next").unwrap_or_else(|| "/".into()));
    let changed = move || query.with(|q| q.get("changed").is_some());
    view! {
        <Title text="Sign in"/>
        <section class="card narrow">
            <h1>"Sign in to Spillway"</h1>
            {move || error().map(|e| view! { <p class="alert" role="alert">{e}</p> })}
            {move || changed().then(|| view! { <p class="notice" role="status">"Password changed. Sign in with the new one."</p> })}
            <Suspense fallback=|| ()>
                {move || Suspend::new(async move {
                    let s = session.await.unwrap_or_default();
                    view! {
                        <form method="post" action="/auth/login" class="stack">
                            <input type="hidden" name="csrf" value=s.csrf/>
                            <input type="hidden" name="next" value=next()/>
                            <label>"User name"
                                <input name="username" autocomplete="username" required autofocus/>
                            </label>
                            <label>"Password"
                                <input name="password" type="password" autocomplete="current-password" required/>
                            </label>
                            <button type="submit">"Sign in"</button>
                        </form>
                    }
                })}
            </Suspense>
        </section>
    }
}
