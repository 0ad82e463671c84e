//! The audit log page: every change, newest first, filtered by actor, action and time, with
//! the documents before and after. Read only: nothing in the app edits the log.

use leptos::prelude::*;

use crate::app::error::AppError;
use leptos_meta::Title;
use leptos_router::{components::Form, hooks::use_query_map};
use serde::{Deserialize, Serialize};

use super::session::error_message;
use crate::domain::{people::AuditEntry, time::utc_seconds};

/// Records per page.
pub const PAGE: usize = 50;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPageData {
    pub entries: Vec<AuditEntry>,
    /// The id to page on from, when there may be older records.
    pub older: Option<String>,
}

#[server(prefix = "/fn", endpoint = "audit")]
pub async fn audit_log(
    #[server(default)] actor: String,
    #[server(default)] action: String,
    #[server(default)] since: String,
    #[server(default)] until: String,
    #[server(default)] before: String,
) -> Result<AuditPageData, AppError> {
    use crate::service::audit::{AuditError, AuditQuery};
    crate::app::guard::require(crate::domain::people::Action::View)?;
    let query = AuditQuery {
        actor: &actor,
        action: &action,
        since: &since,
        until: &until,
        before: &before,
    };
    match expect_context::<crate::state::AppState>()
        .service()
        .read_audit(&query, PAGE)
        .await
    {
        Ok(page) => Ok(AuditPageData {
            entries: page.entries,
            older: page.older,
        }),
        Err(AuditError::Invalid { field, message }) => Err(AppError::bad_input(field, message)),
        Err(AuditError::Unavailable(e)) => Err(AppError::unavailable("audit page", e)),
    }
}

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn AuditPage() -> impl IntoView {
    let query = use_query_map();
    let get = move |k: &'static str| query.with(|q| q.get(k).unwrap_or_default());
    let data = Resource::new(
        move || {
            (
                get("actor"),
                get("action"),
                get("since"),
                get("until"),
                get("before"),
            )
        },
        |(actor, action, since, until, before)| audit_log(actor, action, since, until, before),
    );
    view! {
        <Title text="Audit"/>
        <h1>"Audit log"</h1>
        <Form method="GET" action="" on_form_data=super::without_nameless() attr:class="row filters">
            <label>"Actor"<input name="actor" placeholder="user:alice, key:billing" value=move || get("actor") prop:value=move || get("actor")/></label>
            <label>"Action"
                <select name="action">
                    {[("", "any"), ("policy", "policy"), ("override", "override"), ("identifier.reset", "reset"), ("user", "user"), ("key", "key"), ("login", "login"), ("logout", "logout")]
                        .into_iter()
                        .map(|(v, l)| view! { <option value=v selected=move || get("action") == v>{l}</option> })
                        .collect_view()}
                </select>
            </label>
            <label>"From (UTC)"<input name="since" type="datetime-local" value=move || get("since") prop:value=move || get("since")/></label>
            <label>"To (UTC)"<input name="until" type="datetime-local" value=move || get("until") prop:value=move || get("until")/></label>
            <button type="submit">"Filter"</button>
        </Form>
        <Suspense fallback=|| view! { <p>"Reading the log…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(page) if page.entries.is_empty() => view! { <p class="empty">"No records match."</p> }.into_any(),
                    Ok(page) => {
                        let older = page.older.map(|id| {
                            let href = query.with_untracked(|q| {
                                let mut parts: Vec<String> = ["actor", "action", "since", "until"]
                                    .iter()
                                    .filter_map(|k| q.get(k).filter(|v| !v.is_empty()).map(|v| format!("{k}={}", super::overview::encode(&v))))
                                    .collect();
                                parts.push(format!("before={id}"));
                                format!("/audit?{}", parts.join("&"))
                            });
                            view! { <p><a href=href>"Older records →"</a></p> }
                        });
                        view! {
                            <table class="audit" data-testid="audit">
                                <thead><tr><th>"When (UTC)"</th><th>"Who"</th><th>"Action"</th><th>"Target"</th><th>"Reason"</th><th>"From"</th><th>"Change"</th></tr></thead>
                                <tbody>
                                    {page.entries.into_iter().map(|e| {
                                        let change = (!e.before.is_empty() || !e.after.is_empty()).then(|| view! {
                                            <details>
                                                <summary>"before / after"</summary>
                                                <pre>{pretty(&e.before)}</pre>
                                                <pre>{pretty(&e.after)}</pre>
                                            </details>
                                        });
                                        view! {
                                            <tr>
                                                <td>{utc_seconds(e.time_ms)}</td>
                                                <td>{e.actor}<br/><span class="muted small">{e.role}</span></td>
                                                <td><code>{e.action}</code></td>
                                                <td>{e.target}</td>
                                                <td>{e.reason}</td>
                                                <td>{e.ip}</td>
                                                <td>{change}</td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                            {older}
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}

fn pretty(json: &str) -> String {
    if json.is_empty() {
        return "—".into();
    }
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_owned())
}
