//! The policy list: every policy with its rules and traffic, a new policy, and Envoy
//! domains added from their files.

use leptos::prelude::*;

use leptos_meta::Title;
use leptos_router::{
    components::{A, Form},
    hooks::use_query_map,
};

use super::{ImportEnvoyFiles, PolicySummary, RestorePolicy, policies_page};
use crate::{
    app::session::{CsrfField, error_message, use_session},
    domain::{people::Action, time::utc_minutes},
};

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn PoliciesPage() -> impl IntoView {
    let import = ServerAction::<ImportEnvoyFiles>::new();
    let restore = ServerAction::<RestorePolicy>::new();
    let query_map = use_query_map();
    let page_asked = move || {
        query_map.with(|q| {
            q.get("page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(1)
        })
    };
    let data = Resource::new(
        move || {
            (
                import.version().get(),
                query_map.with(|q| q.get("q").unwrap_or_default()),
                page_asked(),
            )
        },
        |(_, q, page)| policies_page(q, page),
    );
    let folder = Resource::new(|| (), |_| super::actions::domains_folder_problem());
    let session = use_session();
    let query = use_query_map();
    let deleted = move || query.with(|q| q.get("deleted"));
    let search = move || query.with(|q| q.get("q").unwrap_or_default());
    view! {
        <Title text="Policies"/>
        <h1>"Policies"</h1>
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                folder.await.ok().flatten().map(|(dir, problem)| view! {
                    <p class="alert" role="alert" data-testid="folder-problem">
                        {format!("The domains folder {dir} does not load, so the domains it held before stay in force. Fix the file there; it is read again every second. {problem}")}
                    </p>
                })
            })}
        </Suspense>
        {move || deleted().map(|n| view! {
            <div class="notice" role="status">
                {format!("Deleted policy {n}. ")}
                <Suspense fallback=|| ()>
                    {let n = n.clone(); move || { let n = n.clone(); Suspend::new(async move {
                        let s = session.await.unwrap_or_default();
                        s.may(Action::EditPolicies).then(|| view! {
                            <ActionForm action=restore attr:class="inline">
                                <CsrfField csrf=s.csrf.clone()/>
                                <input type="hidden" name="name" value=n.clone()/>
                                <button type="submit" class="small">"Undo: restore it"</button>
                            </ActionForm>
                        })
                    })}}
                </Suspense>
            </div>
        })}
        {move || restore.value().get().and_then(|r| r.err()).map(|e| view! { <p class="alert" role="alert">{error_message(&e)}</p> })}
        {move || import.value().get().map(|r| match r {
            Ok(names) => view! {
                <p class="notice" role="status">
                    {format!("Loaded {} Envoy domain{}: ", names.len(), if names.len() == 1 { "" } else { "s" })}
                    {names.into_iter().map(|n| view! { <A href=format!("/policy?name={n}")>{n.clone()}</A>" " }).collect_view()}
                </p>
            }.into_any(),
            Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
        })}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(found) => {
                        let csrf = s.csrf.clone();
                        let total = found.total;
                        let pager = pager(&found, &search());
                        let shown = found.policies;
                        view! {
                            {s.may(Action::EditPolicies).then(|| view! {
                                <div class="grid">
                                    <form method="get" action="/policy" class="stack card">
                                        <h2>"New policy"</h2>
                                        <label>"New policy name"<input name="name" required pattern="[a-z0-9][a-z0-9_\\-]{0,63}" placeholder="checkout"/></label>
                                        <button type="submit">"Create"</button>
                                    </form>
                                    <NewEnvoyDomain action=import csrf=csrf.clone()/>
                                </div>
                            })}
                            <Form method="GET" action="" on_form_data=crate::app::without_nameless() attr:role="search" attr:class="filter">
                                <label>"Find " <input type="search" name="q" value=search() placeholder="name, description or domain"/></label>
                                <button type="submit">"Find"</button>
                            </Form>
                            {if shown.is_empty() {
                                view! { <p class="empty">{if total == 0 { "No policies yet.".to_owned() } else { format!("None of the {total} policies matches.") }}</p> }.into_any()
                            } else {
                                // Idle ones (no check in the last hour) fold away.
                                let (busy, idle): (Vec<PolicySummary>, Vec<PolicySummary>) = shown
                                    .into_iter()
                                    .partition(|p| p.last_hour.is_some_and(|(n, _, _)| n > 0));
                                let idle_count = idle.len();
                                let idle = (!idle.is_empty()).then(|| view! {
                                    <details class="folded" data-testid="idle-policies" open=busy.is_empty()>
                                        <summary>{format!("{idle_count} idle (no check in the last hour)")}</summary>
                                        <PolicyTable list=idle testid="policies-idle"/>
                                    </details>
                                });
                                view! {
                                    {(!busy.is_empty()).then(|| view! { <PolicyTable list=busy testid="policies"/> })}
                                    {idle}
                                    {pager}
                                }.into_any()
                            }}
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}

/// "Policies 51–100 of 230 · ‹ previous · next ›", the links keeping the search.
fn pager(found: &super::PoliciesPageData, q: &str) -> Option<AnyView> {
    if found.pages <= 1 {
        return None;
    }
    let per = super::POLICIES_PER_PAGE;
    let first = (found.page - 1) * per + 1;
    let last = (first + found.policies.len()).saturating_sub(1);
    let href = |page: usize| {
        let q = crate::app::overview::encode(q);
        if q.is_empty() {
            format!("/policies?page={page}")
        } else {
            format!("/policies?q={q}&page={page}")
        }
    };
    let prev = (found.page > 1)
        .then(|| view! { <a href=href(found.page - 1) rel="prev">"‹ previous"</a>" " });
    let next = (found.page < found.pages)
        .then(|| view! { " "<a href=href(found.page + 1) rel="next">"next ›"</a> });
    Some(view! {
        <nav class="pager" aria-label="Pages" data-testid="pager">
            {format!("Policies {first}–{last} of {} · page {} of {} ", found.matching, found.page, found.pages)}
            {prev}{next}
        </nav>
    }.into_any())
}

#[component]
pub(super) fn PolicyTable(list: Vec<PolicySummary>, testid: &'static str) -> impl IntoView {
    view! {
        <table data-testid=testid class="cards-on-phone">
            <thead><tr><th>"Name"</th><th>"Type"</th><th>"Mode"</th><th class="num">"Rules"</th><th class="num">"Checks, last hour"</th><th>"Last changed"</th><th class="num">"Version"</th></tr></thead>
            <tbody>
                {list.into_iter().map(|p| view! {
                    <tr>
                        <td data-label="Name"><A href=format!("/policy?name={}", p.name)>{p.name.clone()}</A><br/><span class="muted small">{p.description}</span></td>
                        <td data-label="Type">{match p.envoy_domain {
                            Some(d) => view! {
                                <span class="badge kind">"Envoy domain"</span>" "<code>{d}</code>
                                {p.managed_by.clone().map(|m| view! { <br/><span class="muted small">{format!("managed by {m}")}</span> })}
                            }.into_any(),
                            None => view! { "policy" }.into_any(),
                        }}</td>
                        <td data-label="Mode">{if p.shadow { view! { <span class="badge warn">"shadow"</span> }.into_any() } else { view! { "enforce" }.into_any() }}</td>
                        <td data-label="Rules" class="num">{p.rules}{(p.overrides > 0).then(|| format!(" (+{} overrides)", p.overrides))}</td>
                        <td data-label="Checks, last hour" class="num">{match p.last_hour {
                            Some((0, _, _)) => "—".to_owned(),
                            Some((n, 0, _)) => n.to_string(),
                            Some((n, d, _)) => format!("{n} ({d} denied)"),
                            None => "?".to_owned(),
                        }}{p.last_hour.filter(|h| h.2 > 0).map(|(_, _, u)| view! {
                            " "<span class="badge warn" title="Checks whose identifiers met no rule: nothing was counted">{format!("{u} matched no rule")}</span>
                        })}</td>
                        <td data-label="Last changed">{p.changed_ms.map_or("—".to_owned(), |t| utc_minutes(Some(t)))}</td>
                        <td data-label="Version" class="num">{p.version}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    }
}

/// Loads Envoy domain files: pasted, or (with JavaScript) read from a chosen file into the
/// text box first.
#[component]
pub(super) fn NewEnvoyDomain(
    action: ServerAction<ImportEnvoyFiles>,
    csrf: String,
) -> impl IntoView {
    // A load that failed without JavaScript comes back with the error and the text.
    let kept = crate::app::kept::use_kept("envoy-new");
    let done = crate::app::kept::use_done("envoy-new");
    let text = RwSignal::new(
        kept.get_untracked()
            .map(|k| k.value("file"))
            .unwrap_or_default(),
    );
    #[cfg(feature = "hydrate")]
    let on_file = move |ev: leptos::ev::Event| {
        use wasm_bindgen::JsCast;
        let Some(input) = ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok())
        else {
            return;
        };
        let Some(file) = input.files().and_then(|f| f.get(0)) else {
            return;
        };
        leptos::task::spawn_local(async move {
            if let Ok(value) = wasm_bindgen_futures::JsFuture::from(file.text()).await
                && let Some(s) = value.as_string()
            {
                text.set(s);
            }
        });
    };
    #[cfg(not(feature = "hydrate"))]
    let on_file = move |_: leptos::ev::Event| {};
    view! {
        <section class="card" id="envoy-new" aria-labelledby="envoy-new-heading">
            <h2 id="envoy-new-heading">"New Envoy domain"</h2>
            {move || kept.get().map(|k| view! { <p class="alert" role="alert" data-testid="envoy-new-error">{k.error_line()}</p> })}
            {move || done.get().then(|| view! { <p class="notice" role="status">"Domain files loaded: they are listed below."</p> })}
            <ActionForm action=action attr:class="stack">
                <CsrfField csrf=csrf/>
                <label>"Domain file (YAML, envoyproxy/ratelimit's format; several separated by ---)"
                    <textarea name="file" rows="8" spellcheck="false" class="code" required
                        placeholder="domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}"
                        prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))>{text.get_untracked()}</textarea>
                </label>
                <label>"Or choose a file"<input type="file" accept=".yaml,.yml,text/yaml" on:change=on_file/></label>
                <button type="submit">"Load domain"</button>
            </ActionForm>
        </section>
    }
}
