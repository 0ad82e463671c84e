//! The identifier inspector: type `user=42`, see every policy and rule that applies with
//! its live counter as a bar, the time to reset and the key's TTL, which rule binds, and a
//! per-second history (sampled while the page is open, from `/events/identifier`); reset one
//! rule, one policy or everything, with a reason that goes to the audit log.

use leptos::prelude::*;

use leptos_meta::Title;
use leptos_router::components::Form;

use super::kept::use_done;
use super::policies::OwnLimitFields;
use super::session::{CsrfField, error_message, use_session};
use crate::domain::people::Action;

pub use crate::domain::inspection::{Inspection, PolicyState, RuleState};

mod actions;
pub use actions::*;

mod panels;
use panels::*;

mod forms;
use forms::*;

/// Follows `/events/identifier?id=…` in the browser; each sample replaces the data and is
/// added to the history (the last 60).
#[cfg(feature = "hydrate")]
fn follow_identifier(
    id: String,
    live: RwSignal<Option<Inspection>>,
    history: RwSignal<Vec<Inspection>>,
) {
    let path = format!("/events/identifier?id={}", super::overview::encode(&id));
    super::follow_events(&path, move |data: Inspection| {
        history.update(|h| {
            h.push(data.clone());
            if h.len() > 60 {
                h.remove(0);
            }
        });
        live.set(Some(data));
    });
}

fn seconds(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 120_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{:.1} min", ms as f64 / 60_000.0)
    }
}

/// The `id` of a query string (with or without its `?`), decoded once.
fn id_of(search: &str) -> String {
    crate::domain::query_value(search, "id").unwrap_or_default()
}

/// The notice of an override added from the inspector.
const OVERRIDE_ADDED: &str = "Override added. It is listed under “Overrides on it” below (and on the policy's page), where it can be extended or removed.";

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn InspectorPage() -> impl IntoView {
    let location = leptos_router::hooks::use_location();
    let id = move || location.search.with(|search| id_of(search));
    let reset = ServerAction::<ResetIdentifier>::new();
    let undo = ServerAction::<UndoReset>::new();
    let release = ServerAction::<ReleaseLease>::new();
    let exempt = ServerAction::<crate::app::policies::AddOverride>::new();
    let change_ov = ServerAction::<crate::app::policies::ChangeOverride>::new();
    // Each press of Inspect reads anew: for the identifier the page already shows the
    // address does not change, so the router alone would not (and the reset's choices are
    // of the page's read). A new identifier changes both in one go: one read.
    let asked_again = RwSignal::new(0u32);
    let again = move |_| asked_again.update(|n| *n += 1);
    let data = Resource::new(
        move || {
            (
                id(),
                asked_again.get(),
                reset.version().get(),
                release.version().get(),
                exempt.version().get(),
                undo.version().get(),
                change_ov.version().get(),
            )
        },
        |(id, _, _, _, _, _, _)| async move {
            if id.trim().is_empty() {
                Ok(None)
            } else {
                inspect_identifier(id).await.map(Some)
            }
        },
    );
    let denials = Resource::new(
        move || {
            (
                id(),
                asked_again.get(),
                reset.version().get(),
                undo.version().get(),
            )
        },
        |(id, _, _, _)| async move {
            if crate::domain::Identifier::parse(id.trim()).is_err() {
                Ok(Denials::default())
            } else {
                identifier_denials(id).await
            }
        },
    );
    let session = use_session();
    // A form posted without JavaScript comes back with `done=<form>` for its notice.
    let (released, gone, exempted, ov_changed) = (
        use_done("lease"),
        use_done("lease-gone"),
        use_done("override"),
        use_done("override-changed"),
    );
    let live = RwSignal::new(None::<Inspection>);
    let history = RwSignal::new(Vec::<Inspection>::new());
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| {
        let id = id();
        live.set(None);
        history.set(Vec::new());
        if !id.trim().is_empty() {
            follow_identifier(id, live, history);
        }
    });
    // After a change, show the fresh read at once rather than the last sample.
    Effect::new(move |_| {
        asked_again.track();
        reset.version().track();
        undo.version().track();
        release.version().track();
        exempt.version().track();
        change_ov.version().track();
        live.set(None);
    });

    view! {
        <Title text="Identifiers"/>
        <h1>"Identifier inspector"</h1>
        <Form method="GET" action="" on_form_data=super::without_nameless() attr:class="row" on:submit=again>
            <label>"Identifier or value"
                <input name="id" placeholder="bob, user=42 or ip=203.0.113.7" value=id prop:value=id required
                    list="recent-identifiers" autocomplete="off"/>
            </label>
            <button type="submit">"Inspect"</button>
        </Form>
        <ResetNotice reset=reset undo=undo/>
        {move || reset.value().get().and_then(Result::err).map(|e| view! { <p class="alert" role="alert">{error_message(&e)}</p> })}
        {move || undo.value().get().and_then(Result::err).map(|e| view! { <p class="alert" role="alert">{error_message(&e)}</p> })}
        {move || match release.value().get() {
            Some(Ok(true)) => Some(view! { <p class="notice" role="status">"Lease released."</p> }.into_any()),
            Some(Ok(false)) => Some(view! { <p class="notice" role="status">"That lease was no longer held."</p> }.into_any()),
            Some(Err(e)) => Some(view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any()),
            None if released.get() => Some(view! { <p class="notice" role="status">"Lease released."</p> }.into_any()),
            None if gone.get() => Some(view! { <p class="notice" role="status">"That lease was no longer held."</p> }.into_any()),
            None => None,
        }}
        {move || match exempt.value().get() {
            Some(Ok(())) => Some(view! { <p class="notice" role="status">{OVERRIDE_ADDED}</p> }.into_any()),
            Some(Err(e)) => Some(view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any()),
            None if exempted.get() => Some(view! { <p class="notice" role="status">{OVERRIDE_ADDED}</p> }.into_any()),
            None => None,
        }}
        {move || match change_ov.value().get() {
            Some(Ok(())) => Some(view! { <p class="notice" role="status">"Override changed: the audit log has it."</p> }.into_any()),
            Some(Err(e)) => Some(view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any()),
            None if ov_changed.get() => Some(view! { <p class="notice" role="status">"Override changed: the audit log has it."</p> }.into_any()),
            None => None,
        }}
        <Suspense fallback=|| view! { <p>"Reading counters…"</p> }>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(None) => view! { <p class="muted">"Type what support was told (bob), or an identifier as dimension=value (user=42, ip=203.0.113.7)."</p> }.into_any(),
                    Ok(Some(first)) if !first.candidates.is_empty() || (first.policies.is_empty() && first.typed.is_some()) => {
                        view! { <Candidates inspection=first/> }.into_any()
                    }
                    Ok(Some(first)) => {
                        let can_reset = s.may(Action::ResetIdentifier);
                        let can_override = s.may(Action::ManageOverrides);
                        let csrf = s.csrf.clone();
                        let leases = view! { <Leases inspection=first.clone() can_release=can_reset csrf=csrf.clone() action=release/> };
                        let recent = first.recent.clone();
                        // The latest sample, else this read. A plain closure over the page's
                        // signal, not a signal made here: a change refetches the data and
                        // disposes what this branch made while its old view may still hear
                        // a sample.
                        let current = {
                            let first = first.clone();
                            move || live.get().unwrap_or_else(|| first.clone())
                        };
                        let (c1, c2, c3, c4, c5) = (current.clone(), current.clone(), current.clone(), current.clone(), current.clone());
                        view! {
                            <datalist id="recent-identifiers">
                                {recent.into_iter().map(|r| view! { <option value=r/> }).collect_view()}
                            </datalist>
                            {move || c1().error.map(|e| view! { <p class="alert" role="alert">{e}</p> })}
                            {move || view! { <VerdictBanner inspection=c2()/> }}
                            {can_reset.then(|| view! { <ResetForm action=reset inspection=first.clone() csrf=csrf.clone() page_id=id()/> })}
                            {move || view! { <Companions inspection=c3()/> }}
                            {move || view! { <Policies inspection=c4()/> }}
                            {leases}
                            {let csrf = csrf.clone(); move || view! { <OverridesHere inspection=c5() action=change_ov csrf=csrf.clone() can_change=can_override/> }}
                            {can_override.then(|| view! { <OverrideForm action=exempt inspection=first.clone() csrf=csrf.clone()/> })}
                            <Suspense fallback=|| ()>
                                {move || Suspend::new(async move {
                                    match denials.await {
                                        Ok(d) => view! { <Throttled denials=d/> }.into_any(),
                                        Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                                    }
                                })}
                            </Suspense>
                            <History history=history/>
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}

/// What a bare value may mean, when it is not one identifier with state: those with state
/// and the recent ones that contain it, each a link to inspect it.
#[component]
fn Candidates(inspection: Inspection) -> impl IntoView {
    let typed = inspection.typed.clone().unwrap_or_default();
    let link = |id: String| {
        let href = format!("/identifiers?id={}", super::overview::encode(&id));
        view! { <a href=href>{id}</a> }
    };
    view! {
        <section class="card" aria-labelledby="candidates-heading" data-testid="candidates">
            <h2 id="candidates-heading">{format!("What “{typed}” may be")}</h2>
            {inspection.error.map(|e| view! { <p class="notice" role="status">{e}</p> })}
            {(!inspection.candidates.is_empty()).then(|| view! {
                <p>"These have state now:"</p>
                <ul>{inspection.candidates.into_iter().map(|(id, policies)| view! {
                    <li>{link(id)}<span class="muted">{format!(" — in {}", policies.join(", "))}</span></li>
                }).collect_view()}</ul>
            })}
            {(!inspection.recent.is_empty()).then(|| view! {
                <p>"Seen in the last two hours:"</p>
                <ul>{inspection.recent.into_iter().map(|id| view! { <li>{link(id)}</li> }).collect_view()}</ul>
            })}
        </section>
    }
}

/// The answer support is asked for: blocked now or not, by what, on which identifier, and
/// when the next request passes.
#[component]
fn VerdictBanner(inspection: Inspection) -> impl IntoView {
    use crate::domain::inspection::Verdict;
    if inspection.error.is_some() {
        return ().into_any();
    }
    let resolved = inspection.typed.clone().map(|t| {
        view! { <p class="muted">{format!("Showing {} for “{t}”.", inspection.identifier)}</p> }
    });
    let verdict = match inspection.verdict() {
        Verdict::Blocked {
            policy,
            rule,
            identifier,
            passes_in_ms,
            penalty_ms,
        } => {
            let through = through_another(&inspection, &identifier);
            let on = if identifier == inspection.identifier {
                identifier
            } else {
                format!(
                    "{identifier} (checked together with {})",
                    inspection.identifier
                )
            };
            let when = match (passes_in_ms, penalty_ms) {
                (Some(ms), Some(penalty)) => format!(
                    "blocked until {} (a penalty of {} after the rule denied); the next request passes in {}",
                    crate::domain::time::utc_seconds(inspection.at_ms + ms as i64),
                    seconds(penalty),
                    seconds(ms)
                ),
                (Some(ms), None) => format!("the next request passes in {}", seconds(ms)),
                (None, _) if rule == "override" => {
                    "until the override is removed or expires".to_owned()
                }
                (None, _) => "until a lease is released or the limit is raised".to_owned(),
            };
            view! {
                <p class="verdict bad" role="status" data-testid="verdict">
                    <strong>"Blocked now"</strong>{format!(" by {policy} › {rule} on {on} — {when}.")}
                </p>
                {through}
            }
            .into_any()
        }
        Verdict::NotBlocked { closest } => {
            let closest = match closest {
                Some((policy, rule, identifier, pct)) => {
                    format!("; closest: {policy} › {rule} on {identifier} at {pct} %")
                }
                None => "; nothing used of any limit".to_owned(),
            };
            view! {
                <p class="verdict ok" role="status" data-testid="verdict">
                    <strong>"Not blocked"</strong>{format!("{closest}.")}
                </p>
            }
            .into_any()
        }
    };
    let steady = steady_line(&inspection);
    view! { {resolved} {verdict} {steady} }.into_any()
}

/// When what blocks is another identifier the inspected one is checked with: how many it is
/// checked with (a shared address blocks hundreds), that acting on the inspected identifier
/// alone leaves it blocking, and a link to act on it.
fn through_another(inspection: &Inspection, blocking: &str) -> Option<impl IntoView + use<>> {
    if blocking == inspection.identifier {
        return None;
    }
    let seen = inspection
        .companions
        .iter()
        .find(|c| c.identifier == blocking)
        .map_or(0, |c| c.companions_seen);
    let shared = if seen > 1 {
        format!(
            "{blocking} was checked with {seen} identifiers in the last hour{}. ",
            if seen > 16 { ": a shared address?" } else { "" }
        )
    } else {
        String::new()
    };
    let exempt = inspection
        .overrides
        .iter()
        .find(|o| o.in_force && o.document["action"] == "unlimited")
        .map(|o| format!("{} is exempt in {}, yet ", inspection.identifier, o.policy))
        .unwrap_or_default();
    let href = format!("/identifiers?id={}", super::overview::encode(blocking));
    Some(view! {
        <p class="notice" role="note" data-testid="through-another">
            {format!("{shared}{exempt}Resetting, exempting or limiting {} alone leaves {blocking} blocking it: ", inspection.identifier)}
            <a href=format!("{href}#override")>{format!("reset, exempt or limit {blocking}")}</a>
            " (or reset both at once below)."
        </p>
    })
}

/// The verdict over time, beside the instant one: a full window lets a request through now
/// and then, and the instant flips; the streak does not.
fn steady_line(inspection: &Inspection) -> impl IntoView + use<> {
    use crate::domain::throttle::StreakState;
    let now = inspection.at_ms;
    let blocked_now = matches!(
        inspection.verdict(),
        crate::domain::inspection::Verdict::Blocked { .. }
    );
    let (class, text) = match inspection.steady() {
        Some((policy, s)) => match s.state_at(now) {
            StreakState::Blocked => (
                "verdict bad",
                format!(
                    "Over time: blocked in {policy} — {}; the last denial {} ago.",
                    s.words(now),
                    crate::domain::time::spoken_duration(now - s.last_ms)
                ),
            ),
            StreakState::AtTimes => (
                "verdict warn",
                format!(
                    "Over time: denied at times in {policy} — {}; the last denial {} ago.",
                    s.words(now),
                    crate::domain::time::spoken_duration(now - s.last_ms)
                ),
            ),
            // Not asked again since, and still refused now: not an all-clear.
            StreakState::Over if blocked_now => (
                "verdict bad",
                format!(
                    "Over time: no request for {} since its last denial in {policy}, and it is still blocked (above); before that, {}.",
                    crate::domain::time::spoken_duration(now - s.last_ms),
                    s.words(now)
                ),
            ),
            StreakState::Over => (
                "verdict ok",
                format!(
                    "Over time: not denied for {}; before that, in {policy}, {}.",
                    crate::domain::time::spoken_duration(now - s.last_ms),
                    s.words(now)
                ),
            ),
        },
        None => (
            "verdict ok",
            "Over time: no denial in the last hour.".to_owned(),
        ),
    };
    view! { <p class=class data-testid="steady">{text}</p> }
}

/// The identifiers it was checked together with in the last hour, each with its own state.
#[component]
fn Companions(inspection: Inspection) -> impl IntoView {
    use crate::domain::inspection::Verdict;
    if inspection.error.is_some() {
        return ().into_any();
    }
    if inspection.companions.is_empty() {
        return view! {
            <p class="muted" data-testid="companions">"Checked with no other identifier in the last hour."</p>
        }
        .into_any();
    }
    let rows = inspection
        .companions
        .into_iter()
        .map(|c| {
            let state = match c.verdict() {
                Verdict::Blocked {
                    policy,
                    rule,
                    passes_in_ms,
                    ..
                } => format!(
                    "blocked by {policy} › {rule}{}",
                    passes_in_ms.map_or(String::new(), |ms| format!(", passes in {}", seconds(ms)))
                ),
                Verdict::NotBlocked {
                    closest: Some((policy, rule, _, pct)),
                } => {
                    format!("not blocked; {policy} › {rule} at {pct} %")
                }
                Verdict::NotBlocked { closest: None } => "not blocked".to_owned(),
            };
            let href = format!("/identifiers?id={}", super::overview::encode(&c.identifier));
            let seen = match c.companions_seen {
                0 | 1 => String::new(),
                n if n > 16 => format!(" · checked with {n} identifiers in the last hour: a shared address?"),
                n => format!(" · checked with {n} identifiers in the last hour"),
            };
            view! { <li><a href=href>{c.identifier.clone()}</a>" — "{state}<span class="muted">{seen}</span></li> }
        })
        .collect_view();
    view! {
        <section class="card" aria-labelledby="companions-heading" data-testid="companions">
            <h2 id="companions-heading">"Checked together with, last hour"</h2>
            <ul>{rows}</ul>
        </section>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::id_of;

    #[test]
    fn the_id_is_decoded_once() {
        for (search, id) in [
            ("?id=user%3D42", "user=42"),
            ("id=user%3Da%2525b&x=1", "user=a%25b"),
            (
                "?x=1&id=envoy%3Dk%3Dv+%C2%B7+p%3D%25C2%25B7",
                "envoy=k=v · p=%C2%B7",
            ),
            ("?id=user%3Da%2Bb", "user=a+b"),
            ("?x=1", ""),
        ] {
            assert_eq!(id_of(search), id, "{search}");
        }
    }
}
