//! "What would this do?" beside Save: the draft as typed (or an Envoy domain's file as typed,
//! or a stored version before a rollback), replayed over the last hour or day of the
//! policy's recorded checks, shown above the editor; nothing is saved. Without JavaScript
//! the button posts the form (`intent=what-if`) and the server sends the page back with the
//! draft in its address; with it, the button goes there itself.

use leptos::prelude::*;
use leptos_router::hooks::use_location;

use super::{Draft, LOOK_BACKS, look_back, policy_what_if};
use crate::domain::{time::utc_minutes, whatif::WhatIf};

/// The address that asks the editor's page to replay `draft`.
pub(super) fn what_if_address(name: &str, draft: &Draft) -> String {
    format!(
        "/policy?name={}&draft={}&whatif=1#what-if",
        crate::domain::percent_encode(name),
        draft.to_query()
    )
}

/// The address that asks the page to replay an Envoy domain's `file` as typed.
pub(super) fn file_what_if_address(name: &str, file: &str) -> String {
    format!(
        "/policy?name={}&file={}&whatif=1#what-if",
        crate::domain::percent_encode(name),
        crate::domain::percent_encode(file)
    )
}

/// The address that asks the page what rolling back to `version` would change.
pub(super) fn version_what_if_address(name: &str, version: u64) -> String {
    format!(
        "/policy?name={}&version={version}&whatif=1#what-if",
        crate::domain::percent_encode(name)
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
/// `file`: the button of an Envoy domain's file form.
#[component]
pub fn WhatIfButton(name: String, #[prop(optional)] file: bool) -> impl IntoView {
    let navigate = leptos_router::hooks::use_navigate();
    let ask = move |ev: leptos::ev::MouseEvent| {
        #[cfg(feature = "hydrate")]
        {
            let address = if file {
                super::preview::form_pairs(&ev).and_then(|pairs| {
                    let (_, typed) = pairs.into_iter().find(|(k, _)| k == "file")?;
                    Some(file_what_if_address(&name, &typed))
                })
            } else {
                draft_of_form(&ev).map(|draft| what_if_address(&name, &draft))
            };
            if let Some(address) = address {
                ev.prevent_default();
                navigate(&address, Default::default());
            }
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = (&ev, &navigate, &name, file);
    };
    view! {
        <button type="submit" name="intent" value="what-if" class="secondary" on:click=ask
            title="Replays what is typed over this policy's recorded checks (the last hour, or day); saves nothing">
            "What would this do?"
        </button>
    }
}

/// What the page's address asks to replay: a draft, a file or a version, and how far back.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Asked {
    draft: String,
    file: String,
    version: u64,
    last: String,
}

impl Asked {
    fn from_search(search: &str) -> Option<Self> {
        use crate::domain::query_value;
        query_value(search, "whatif")?;
        let asked = Self {
            draft: query_value(search, "draft").unwrap_or_default(),
            file: query_value(search, "file").unwrap_or_default(),
            version: query_value(search, "version")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            last: query_value(search, "last").unwrap_or_default(),
        };
        (!asked.draft.is_empty() || !asked.file.is_empty() || asked.version > 0).then_some(asked)
    }

    /// The card's title.
    fn title(&self) -> String {
        let (_, span, _) = look_back(&self.last);
        if self.version > 0 {
            format!(
                "What would rolling back to version {} do? {span}, replayed",
                self.version
            )
        } else {
            format!("What would this do? {span}, replayed")
        }
    }

    /// The same question over `last` (`hour`, `day`).
    fn over(&self, name: &str, last: &str) -> String {
        let address = if self.version > 0 {
            version_what_if_address(name, self.version)
        } else if !self.file.is_empty() {
            file_what_if_address(name, &self.file)
        } else {
            format!(
                "/policy?name={}&draft={}&whatif=1#what-if",
                crate::domain::percent_encode(name),
                crate::domain::percent_encode(&self.draft)
            )
        };
        address.replace("&whatif=1#", &format!("&whatif=1&last={last}#"))
    }
}

/// The replay's answer, when the address asks for one.
#[component]
pub fn WhatIfCard(name: String) -> impl IntoView {
    let location = use_location();
    let asked = move || location.search.with(|s| Asked::from_search(s));
    let fetch_name = name.clone();
    let answer = Resource::new(asked, move |asked| {
        let name = fetch_name.clone();
        async move {
            let a = asked?;
            Some((
                a.clone(),
                policy_what_if(name, a.draft, a.version, a.file, a.last).await,
            ))
        }
    });
    view! {
        <Suspense fallback=|| ()>
            {move || answer.get().flatten().map(|(asked, answer)| {
                let spans = LOOK_BACKS.map(|(key, label, _)| {
                    let current = look_back(&asked.last).0 == key;
                    view! { <a href=asked.over(&name, key) aria-current=current.then_some("true") class="small">{label}</a>" " }
                });
                view! {
                <section class="card" id="what-if" aria-labelledby="what-if-heading" data-testid="what-if">
                    <h2 id="what-if-heading">{asked.title()}</h2>
                    <p class="muted">"Look back: "{spans.into_iter().collect_view()}</p>
                    {match answer {
                        Ok(w) => view! { {answered(&w.answer)}{suggested(&name, &asked, &w.suggestions)} }.into_any(),
                        Err(e) => view! { <p class="alert" role="alert">{crate::app::session::error_message(&e)}</p> }.into_any(),
                    }}
                    <p class="muted">{if asked.version > 0 { "Nothing is rolled back: roll back from the versions below, or leave the page." } else { "Nothing is saved: this is what is typed below. Save it, change it and ask again, or leave the page to back out." }}</p>
                </section>
            }})}
        </Suspense>
    }
}

/// Limits suggested for the draft's rules, each a link that puts it in the form and asks
/// again (with JavaScript and without).
fn suggested(
    name: &str,
    asked: &Asked,
    suggestions: &[crate::domain::suggest::Suggestion],
) -> impl IntoView + use<> {
    let draft: Option<Draft> = serde_json::from_str(&asked.draft).ok();
    let last = look_back(&asked.last).0;
    let items: Vec<_> = suggestions
        .iter()
        .filter(|s| !s.limits.is_empty())
        .filter_map(|s| {
            let draft = draft.clone()?;
            let uses: Vec<_> = s
                .limits
                .iter()
                .map(|t| {
                    let mut with = draft.clone();
                    for rule in with.rules.iter_mut().filter(|r| r.name.trim() == s.rule) {
                        rule.limit = t.limit.to_string();
                    }
                    let again = Asked {
                        draft: serde_json::to_string(&with).unwrap_or_default(),
                        ..asked.clone()
                    };
                    let words = format!(
                        ": throttles {} ({} check{} newly denied)",
                        t.throttled.join(", "),
                        t.newly_denied,
                        if t.newly_denied == 1 { "" } else { "s" }
                    );
                    // A whole page load: the form's fields take their values from the address
                    // only when the page is rendered.
                    view! { <li><a href=again.over(name, last) rel="external">{format!("Use {}", t.limit)}</a>{words}</li> }
                })
                .collect();
            let spread = format!(
                "{}: each of {} identifier{}' busiest window held {} at the median, {} at the 99th percentile, {} at most (the limit is {}).",
                s.rule,
                s.identifiers,
                if s.identifiers == 1 { "" } else { "s" },
                s.p50,
                s.p99,
                s.max,
                s.limit_now
            );
            Some(view! { <p>{spread}</p><ul data-testid="suggested-limits">{uses}</ul> })
        })
        .collect();
    (!items.is_empty()).then(|| view! { <h3>"Suggested limits"</h3>{items} })
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
    let sampled = (w.one_in > 1).then(|| view! {
        <p class="notice" data-testid="what-if-sample">{format!(
            "This policy is busy: its record keeps the checks of one identifier in {}, so these counts are estimates (newly denied within ±{}, newly let through within ±{}, most likely); the lists are the kept identifiers' own checks.",
            w.one_in, w.newly_denied_bound, w.newly_allowed_bound
        )}</p>
    });
    let cut = (!w.complete).then(|| view! { <p class="notice">"The replay ran out of time: this covers the record up to its last time above."</p> });
    view! {
        <p data-testid="what-if-summary">{summary}</p>
        {sampled}
        {list("Newly throttled", "newly-throttled", &w.newly_throttled)}
        {list("Newly let through", "newly-freed", &w.newly_freed)}
        {list("Denials by rule", "denied-by-rule", &w.denied_by_rule)}
        {peak}
        {skipped}
        {cut}
    }
}
