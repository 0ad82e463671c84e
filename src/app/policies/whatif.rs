//! "What would this do?" beside Save: the draft as typed, replayed over the last hour of the
//! policy's recorded checks, shown above the editor; nothing is saved. Without JavaScript
//! the button posts the form (`intent=what-if`) and the server sends the page back with the
//! draft in its address; with it, the button goes there itself.

use leptos::prelude::*;
use leptos_router::hooks::use_location;

use super::{Draft, policy_what_if};
use crate::domain::{time::utc_minutes, whatif::WhatIf};

/// The address that asks the editor's page to replay `draft`.
pub(super) fn what_if_address(name: &str, draft: &Draft) -> String {
    format!(
        "/policy?name={}&draft={}&whatif=1#what-if",
        crate::domain::percent_encode(name),
        draft.to_query()
    )
}

/// The draft the form holds now (hydrated: read from the form the event came from).
#[cfg(feature = "hydrate")]
fn draft_of_form(ev: &leptos::ev::Event) -> Option<Draft> {
    let pairs = super::preview::form_pairs(ev)?;
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    Some(Draft {
        description: get("description"),
        shadow: get("shadow") == "on",
        failure_closed: get("failure_closed") == "on",
        strict: get("strict") == "on",
        optional: get("optional"),
        wait: get("wait") == "on",
        max_wait_ms: get("max_wait_ms"),
        rules: super::rule_forms_from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        ..Draft::default()
    })
}

/// The button beside Save. A submit button of the editor's form (`intent=what-if`), so it
/// works without JavaScript; hydrated, it goes to the replay's address instead of posting.
#[component]
pub fn WhatIfButton(name: String) -> impl IntoView {
    let navigate = leptos_router::hooks::use_navigate();
    let ask = move |ev: leptos::ev::MouseEvent| {
        #[cfg(feature = "hydrate")]
        if let Some(draft) = draft_of_form(&ev) {
            ev.prevent_default();
            navigate(&what_if_address(&name, &draft), Default::default());
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = (&ev, &navigate, &name);
    };
    view! {
        <button type="submit" name="intent" value="what-if" class="secondary" on:click=ask
            title="Replays the rules as typed over the last hour of this policy's checks; saves nothing">
            "What would this do?"
        </button>
    }
}

/// The replay's answer, when the address asks for one (`whatif=1` and a `draft`).
#[component]
pub fn WhatIfCard(name: String) -> impl IntoView {
    let location = use_location();
    let asked = move || {
        location.search.with(|s| {
            crate::domain::query_value(s, "whatif")
                .and_then(|_| crate::domain::query_value(s, "draft"))
        })
    };
    let answer = Resource::new(asked, move |draft| {
        let name = name.clone();
        async move {
            match draft {
                Some(draft) => Some(policy_what_if(name, draft).await),
                None => None,
            }
        }
    });
    view! {
        <Suspense fallback=|| ()>
            {move || answer.get().flatten().map(|answer| view! {
                <section class="card" id="what-if" aria-labelledby="what-if-heading" data-testid="what-if">
                    <h2 id="what-if-heading">"What would this do? The last hour, replayed"</h2>
                    {match answer {
                        Ok(w) => answered(&w).into_any(),
                        Err(e) => view! { <p class="alert" role="alert">{crate::app::session::error_message(&e)}</p> }.into_any(),
                    }}
                    <p class="muted">"Nothing is saved: this is the draft as typed below. Save it, change it and ask again, or leave the page to back out."</p>
                </section>
            })}
        </Suspense>
    }
}

/// The answer in sentences and lists.
fn answered(w: &WhatIf) -> impl IntoView + use<> {
    let span = match (w.from_ms, w.to_ms) {
        (Some(from), Some(to)) => format!(
            " from {} to {}",
            utc_minutes(Some(from)),
            utc_minutes(Some(to))
        ),
        _ => String::new(),
    };
    let summary = format!(
        "Over {} recorded check{}{span}: {} that were let through would be denied, {} that were denied would be let through ({} denied then, {} with these rules).",
        w.checks,
        if w.checks == 1 { "" } else { "s" },
        w.newly_denied,
        w.newly_allowed,
        w.denied_then,
        w.denied
    );
    let list = |title: &'static str,
                testid: &'static str,
                rows: &[crate::domain::whatif::Counted]| {
        (!rows.is_empty()).then(|| {
            let items: Vec<_> = rows
                .iter()
                .map(|c| view! { <li><code>{c.identifier.clone()}</code>{format!(": {} check{}", c.checks, if c.checks == 1 { "" } else { "s" })}</li> })
                .collect();
            view! { <h3>{title}</h3><ul data-testid=testid>{items}</ul> }
        })
    };
    let peak = w.peak_minute.as_ref().filter(|p| p.denied > 0).map(|p| {
        view! { <p>{format!("Most denied in one minute: {} at {}.", p.denied, utc_minutes(Some(p.at_ms)))}</p> }
    });
    let skipped = (!w.not_replayed.is_empty()).then(|| {
        view! { <p class="muted">{format!("Not replayed (their leases' releases are not recorded): {}.", w.not_replayed.join(", "))}</p> }
    });
    let cut = (!w.complete).then(|| view! { <p class="notice">"The replay ran out of time: this covers the record up to its last time above."</p> });
    view! {
        <p data-testid="what-if-summary">{summary}</p>
        {list("Newly throttled", "newly-throttled", &w.newly_throttled)}
        {list("Newly let through", "newly-freed", &w.newly_freed)}
        {list("Denials by rule", "denied-by-rule", &w.denied_by_rule)}
        {peak}
        {skipped}
        {cut}
    }
}
