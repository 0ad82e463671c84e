//! The dashboard: the HTML shell, the navigation and the pages. Rendered on the server and
//! hydrated in the browser; every page works with JavaScript off.

pub mod account;
pub mod alerts;
pub mod audit;
pub mod error;
#[cfg(feature = "ssr")]
pub mod events;
#[cfg(feature = "ssr")]
pub mod guard;
pub mod history;
pub mod inspector;
pub mod kept;
mod login;
pub mod overview;
pub mod people;
pub mod policies;
pub mod session;
pub mod widgets;

use leptos::prelude::*;
use leptos_meta::{HashedStylesheet, MetaTags, Title, provide_meta_context};

use crate::domain::people::Action;
use leptos_router::{
    Lazy, LazyRoute, SsrMode, StaticSegment,
    components::{A, Route, Router, Routes},
    lazy_route,
};

pub use overview::{RedisReport, redis_status};

/// For a `<Form method="GET">`: leaves the nameless submit button out of the form's data,
/// as a browser does (Leptos adds it, and the address would end in `&=`).
pub(crate) fn without_nameless() -> std::sync::Arc<dyn Fn(&leptos::web_sys::FormData)> {
    std::sync::Arc::new(|data| data.delete(""))
}

/// Follows a server-sent event stream in the browser: each event's JSON goes to `on_event`;
/// the stream closes when the calling reactive scope is cleaned up.
#[cfg(feature = "hydrate")]
pub(crate) fn follow_events<T: serde::de::DeserializeOwned + 'static>(
    path: &str,
    on_event: impl Fn(T) + 'static,
) {
    use wasm_bindgen::{JsCast, closure::Closure};
    let Ok(source) = web_sys::EventSource::new(path) else {
        return;
    };
    let on_message =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |event: web_sys::MessageEvent| {
            if let Some(text) = event.data().as_string()
                && let Ok(data) = serde_json::from_str::<T>(&text)
            {
                on_event(data);
            }
        });
    source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let source = send_wrapper::SendWrapper::new(source);
    on_cleanup(move || source.close());
}

/// The HTML document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    // The CSP header's nonce (from the session middleware) for the inline scripts.
    #[cfg(feature = "ssr")]
    if let Some(nonce) = use_context::<axum::http::request::Parts>().and_then(|p| {
        p.extensions
            .get::<crate::auth::session::CspNonce>()
            .cloned()
    }) {
        provide_context(leptos::nonce::Nonce::from_value(nonce.0));
    }
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light dark"/>
                // No icon: a browser would otherwise ask for /favicon.ico on every first load.
                <link rel="icon" href="data:,"/>
                <AutoReload options=options.clone()/>
                <HashedStylesheet options=options.clone() id="leptos"/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The dashboard's root component: navigation and routes.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    // Effects run only in the browser, once the app is hydrated: browser tests wait for
    // this attribute before they test anything interactive.
    Effect::new(|| {
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
    let session: session::SessionResource = Resource::new(|| (), |_| session::whoami());
    provide_context(session);
    // The alert rules firing now, as a badge on "Alerts" (read with each page).
    let firing = Resource::new(|| (), |_| alerts::alerts_firing());
    view! {
        <Title formatter=|page: String| format!("{page} · Spillway")/>
        <Router>
            <header class="topbar">
                <a class="brand" href="/">"Spillway"</a>
                <Suspense fallback=|| ()>
                    {move || Suspend::new(async move {
                        let s = session.await.unwrap_or_default();
                        // Read with the session, in the same boundary: a second boundary
                        // inside the navigation hydrated on its own and raced the lazily
                        // loaded page's hydration.
                        let firing = firing.await.unwrap_or(0);
                        s.user.clone().map(|user| {
                            let admin = s.may(Action::ManagePeople);
                            view! {
                                <nav aria-label="Main">
                                    <A href="/" exact=true>"Overview"</A>
                                    <A href="/history">"History"</A>
                                    <A href="/identifiers">"Identifiers"</A>
                                    <A href="/policies">"Policies"</A>
                                    <A href="/audit">"Audit"</A>
                                    <A href="/alerts">"Alerts"
                                        {(firing > 0).then(|| view! {
                                            <span class="nav-badge" data-testid="firing-badge" title=format!("{firing} firing")>{firing}</span>
                                        })}
                                    </A>
                                    {admin.then(|| view! { <A href="/people">"Users & keys"</A> })}
                                </nav>
                                <form method="post" action="/auth/logout" class="whoami">
                                    <a href="/account" data-testid="whoami">{user}" · "{s.role.map(|r| r.as_str())}</a>
                                    <input type="hidden" name="csrf" value=s.csrf.clone()/>
                                    <button type="submit" class="small quiet">"Sign out"</button>
                                </form>
                            }
                        })
                    })}
                </Suspense>
            </header>
            <main>
                <Routes fallback=NotFound>
                    // Async SSR: the HTML is sent once the data has loaded, so the page is complete
                    // without JavaScript (streamed fragments would need a script to land).
                    <Route path=StaticSegment("") view=overview::OverviewPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("history") view={Lazy::<HistoryRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("identifiers") view={Lazy::<InspectorRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("policies") view={Lazy::<PoliciesRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("policy") view={Lazy::<PolicyRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("alerts") view={Lazy::<AlertsRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("audit") view={Lazy::<AuditRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("login") view=login::LoginPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("account") view={Lazy::<AccountRoute>::new()} ssr=SsrMode::Async/>
                    <Route path=StaticSegment("people") view={Lazy::<PeopleRoute>::new()} ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

// The pages past the overview and sign-in are split out of the main bundle (built with
// `cargo leptos build --split`): the browser fetches a page's code when it first visits it.
// Each page loads its own data, so the lazy route carries none.
macro_rules! lazy_page {
    ($route:ident, $page:path) => {
        struct $route;
        #[lazy_route]
        impl LazyRoute for $route {
            fn data() -> Self {
                Self
            }
            fn view(_this: Self) -> AnyView {
                $page().into_any()
            }
        }
    };
}

lazy_page!(HistoryRoute, history::HistoryPage);
lazy_page!(InspectorRoute, inspector::InspectorPage);
lazy_page!(PoliciesRoute, policies::PoliciesPage);
lazy_page!(PolicyRoute, policies::PolicyPage);
lazy_page!(AuditRoute, audit::AuditPage);
lazy_page!(AlertsRoute, alerts::AlertsPage);
lazy_page!(AccountRoute, account::AccountPage);
lazy_page!(PeopleRoute, people::PeoplePage);

#[component]
fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    {
        if let Some(response) = use_context::<leptos_axum::ResponseOptions>() {
            response.set_status(axum::http::StatusCode::NOT_FOUND);
        }
    }
    view! {
        <Title text="Not found"/>
        <h1>"Page not found"</h1>
        <p><a href="/">"Back to the overview"</a></p>
    }
}
