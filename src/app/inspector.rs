//! The identifier inspector: type `user=42`, see every policy and rule that applies with
//! its live counter as a bar, the time to reset and the key's TTL, which rule binds, and a
//! per-second history (sampled while the page is open, from `/events/identifier`); reset one
//! rule, one policy or everything, with a reason that goes to the audit log.

use leptos::prelude::*;

use crate::app::error::AppError;
use leptos_meta::Title;
use leptos_router::components::Form;

use super::kept::use_done;
use super::policies::OwnLimitFields;
use super::session::{CsrfField, error_message, use_session};
use crate::domain::people::Action;

pub use crate::domain::inspection::{Inspection, PolicyState, RuleState};

#[server(prefix = "/fn", endpoint = "inspect")]
pub async fn inspect_identifier(#[server(default)] id: String) -> Result<Inspection, AppError> {
    crate::app::guard::require(Action::View)?;
    Ok(expect_context::<crate::state::AppState>()
        .service()
        .inspect_typed(&id)
        .await)
}

/// When the identifier was throttled over the last 7 days.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Denials {
    /// The server's clock when read.
    pub now_ms: i64,
    /// (hour start ms, policy, denials), oldest first.
    pub hours: Vec<(i64, String, u64)>,
}

#[server(prefix = "/fn", endpoint = "identifier_denials")]
pub async fn identifier_denials(#[server(default)] id: String) -> Result<Denials, AppError> {
    crate::app::guard::require(Action::View)?;
    let id =
        crate::domain::Identifier::parse(id.trim()).map_err(|m| AppError::bad_input("id", m))?;
    let hours = expect_context::<crate::state::AppState>()
        .service()
        .denials_of(&id.to_string())
        .await
        .map_err(|e| AppError::unavailable("identifier history", e))?;
    Ok(Denials {
        now_ms: crate::support::clock::now_ms(),
        hours,
    })
}

/// The reason a person gave for a change to an identifier, trimmed: required, at most 500
/// characters (it goes to the audit log).
#[cfg(feature = "ssr")]
fn reason_given(reason: &str) -> Result<&str, AppError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::bad_input(
            "reason",
            "is required: say why (it goes to the audit log)",
        ));
    }
    if reason.chars().count() > 500 {
        return Err(AppError::bad_input(
            "reason",
            "must be at most 500 characters",
        ));
    }
    Ok(reason)
}

/// Resets counters. `what` (the inspector's choice) is `<scope> <identifier>`, a line
/// per identifier when several are reset together; without it, `id` and `scope`. A scope
/// is `*` (every policy), `<policy>` or `<policy>/<rule>`; an empty `scope` is every policy.
/// All of it is one change, undone together: the page comes back (`id`, else the first
/// identifier) saying how many keys went, with the undo for a minute.
#[server(prefix = "/fn", endpoint = "reset")]
pub async fn reset_identifier(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
    #[server(default)] scope: String,
    #[server(default)] what: String,
    #[server(default)] reason: String,
) -> Result<ResetAnswer, AppError> {
    use crate::service::identifiers::ResetTarget;
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let reason = reason_given(&reason)?;
    let pairs: Vec<(&str, &str)> = if what.trim().is_empty() {
        vec![(scope.trim(), id.trim())]
    } else {
        what.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| l.split_once(' ').unwrap_or(("*", l)))
            .collect()
    };
    if pairs.len() > 1 + MAX_RESET_TOGETHER {
        return Err(AppError::bad_input(
            "what",
            "names too many identifiers at once",
        ));
    }
    let targets: Vec<ResetTarget> = pairs
        .iter()
        .map(|(scope, id)| {
            let (policy, rule) = match scope.split_once('/') {
                Some((p, r)) => (Some(p), Some(r)),
                None if scope.is_empty() || *scope == "*" => (None, None),
                None => (Some(*scope), None),
            };
            ResetTarget {
                identifier: id.trim().to_owned(),
                policy: policy.map(str::to_owned),
                rule: rule.map(str::to_owned),
            }
        })
        .collect();
    let done = state()
        .service()
        .reset_identifiers(&caller.actor(), &targets, reason)
        .await
        .map_err(reset_refused)?;
    let page_id = if id.trim().is_empty() {
        targets
            .first()
            .map(|t| t.identifier.clone())
            .unwrap_or_default()
    } else {
        id.trim().to_owned()
    };
    let undo = done.undo.map(|u| u.token);
    crate::app::guard::back_from_a_form(&format!(
        "/identifiers?id={}&reset={}{}",
        crate::domain::percent_encode(&page_id),
        done.deleted_keys,
        undo.as_ref()
            .map(|t| format!("&undo={t}"))
            .unwrap_or_default()
    ));
    Ok(ResetAnswer {
        deleted: done.deleted_keys,
        undo,
    })
}

/// What a reset did, as the page says it: the keys deleted, and the token that undoes it
/// for a minute (when it deleted any).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResetAnswer {
    pub deleted: u64,
    pub undo: Option<String>,
}

/// Puts back the counters of the reset `token` names (within a minute of it, once), and
/// comes back to `id`'s page saying so.
#[server(prefix = "/fn", endpoint = "reset_undo")]
pub async fn undo_reset(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
    #[server(default)] token: String,
) -> Result<u64, AppError> {
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let done = state()
        .service()
        .undo_reset(&caller.actor(), &token)
        .await
        .map_err(reset_refused)?;
    crate::app::guard::back_from_a_form(&format!(
        "/identifiers?id={}&undone={}",
        crate::domain::percent_encode(id.trim()),
        done.restored_keys
    ));
    Ok(done.restored_keys)
}

/// Identifiers one reset may take with the inspected one (those checked together with it).
#[cfg(feature = "ssr")]
const MAX_RESET_TOGETHER: usize = 8;

#[cfg(feature = "ssr")]
fn state() -> crate::state::AppState {
    expect_context::<crate::state::AppState>()
}

/// A reset or undo refused, as the page says it.
#[cfg(feature = "ssr")]
fn reset_refused(e: crate::service::identifiers::ResetError) -> AppError {
    use crate::service::identifiers::ResetError;
    match e {
        ResetError::Invalid { field, message } => AppError::bad_input(field, message),
        ResetError::UnknownPolicy(_) => AppError::bad_input("scope", "no such policy"),
        ResetError::Forbidden(why) => AppError::refused(axum::http::StatusCode::FORBIDDEN, why),
        ResetError::NothingToUndo => AppError::bad_input(
            "token",
            "no reset to undo: a reset can be undone for a minute, once",
        ),
        ResetError::Unavailable(error) => AppError::unavailable("reset", error),
    }
}

/// Releases one lease of a concurrency rule (its holder crashed, say), with a reason for
/// the audit log. Whether it was still held.
#[server(prefix = "/fn", endpoint = "release_lease")]
pub async fn release_lease(
    #[server(default)] csrf: String,
    #[server(default)] lease: String,
    #[server(default)] reason: String,
) -> Result<bool, AppError> {
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let state = expect_context::<crate::state::AppState>();
    let lease: crate::domain::lease::LeaseId = lease
        .trim()
        .parse()
        .map_err(|m: String| AppError::bad_input("lease", m))?;
    let reason = reason_given(&reason)?;
    let held = state
        .service()
        .release_lease_by(&caller.actor(), &lease, reason)
        .await
        .map_err(|e| AppError::unavailable("release", e))?;
    crate::app::guard::back_done(if held { "lease" } else { "lease-gone" });
    Ok(held)
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

/// The `id` of a query string (with or without its `?`), decoded once.
fn id_of(search: &str) -> String {
    crate::domain::query_value(search, "id").unwrap_or_default()
}

/// The notice of an override added from the inspector.
const OVERRIDE_ADDED: &str =
    "Override added. It is listed on the policy's page, where it can be removed.";

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn InspectorPage() -> impl IntoView {
    let location = leptos_router::hooks::use_location();
    let id = move || location.search.with(|search| id_of(search));
    let reset = ServerAction::<ResetIdentifier>::new();
    let undo = ServerAction::<UndoReset>::new();
    let release = ServerAction::<ReleaseLease>::new();
    let exempt = ServerAction::<crate::app::policies::AddOverride>::new();
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
            )
        },
        |(id, _, _, _, _, _)| async move {
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
    let (released, gone, exempted) = (
        use_done("lease"),
        use_done("lease-gone"),
        use_done("override"),
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
                        let (c1, c2, c3, c4) = (current.clone(), current.clone(), current.clone(), current.clone());
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
    view! { {resolved} {verdict} }.into_any()
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
            view! { <li><a href=href>{c.identifier.clone()}</a>" — "{state}</li> }
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

#[component]
fn Policies(inspection: Inspection) -> impl IntoView {
    if inspection.error.is_some() {
        return ().into_any();
    }
    if inspection.policies.is_empty() {
        return view! { <p class="empty">"No policy applies to "{inspection.identifier}"."</p> }
            .into_any();
    }
    let id = inspection.identifier.clone();
    // The policies where it has state (or an override) first; the ones it never touched
    // fold away.
    let (touched, untouched): (Vec<PolicyState>, Vec<PolicyState>) =
        inspection.policies.into_iter().partition(|p| {
            p.status != "rules"
                || p.rules.iter().any(|r| {
                    r.ttl_ms.is_some() || r.remaining < r.limit || r.retry_after_ms.is_some()
                })
        });
    let touched_any = !touched.is_empty();
    let folded = (!untouched.is_empty()).then(|| {
        let count = untouched.len();
        view! {
            <details class="muted untouched" data-testid="untouched">
                <summary>{format!(
                    "No state in {}{count} {}",
                    if touched_any { "" } else { "any of its " },
                    match (touched_any, count) {
                        (true, 1) => "other policy",
                        (true, _) => "other policies",
                        (false, 1) => "policy",
                        (false, _) => "policies",
                    }
                )}</summary>
                <p>{untouched.iter().map(|p| p.policy.clone()).collect::<Vec<_>>().join(", ")}</p>
            </details>
        }
    });
    let cards = touched
        .into_iter()
        .map(|p| {
            let status = match p.status.as_str() {
                "unlimited" => Some(view! { <p><span class="badge ok">"unlimited"</span>" An override lets it through without counting."</p> }),
                "blocked" => Some(view! { <p><span class="badge bad">"blocked"</span>" An override denies it."</p> }),
                _ => None,
            };
            let rows = p
                .rules
                .into_iter()
                .map(|r| {
                    let used = r.limit.saturating_sub(r.remaining);
                    let pct = (used * 100).checked_div(r.limit).unwrap_or(0);
                    let blocks = r.retry_after_ms.is_some() || r.remaining == 0;
                    let next = match r.retry_after_ms {
                        Some(ms) if r.penalty => format!(
                            "in {} (penalty box: blocked for {} after a denial; a reset lifts it)",
                            seconds(ms),
                            r.block_ms.map_or_else(|| "a while".to_owned(), seconds)
                        ),
                        Some(ms) => format!("in {}", seconds(ms)),
                        None if blocks => "when a lease is released".to_owned(),
                        None => "now".to_owned(),
                    };
                    view! {
                        <tr class:binding=blocks>
                            <td data-label="Rule">{r.rule.clone()}{blocks.then(|| view! { " " <span class="badge bad">"blocks"</span> })}
                                {r.flush_ms.map(|ms| view! {
                                    " "<span class="badge kind" data-testid=format!("approximate-{}", r.rule)
                                        title=format!("Counted on each instance and flushed to Redis every {ms} ms: what is shown here is up to one flush behind, and instances together may pass the limit by about what each admits between its flushes.")>
                                        {format!("approximate (local, flushed every {ms} ms)")}
                                    </span>
                                })}
                            </td>
                            <td data-label="Algorithm">{r.algorithm}</td>
                            <td data-label="Used">
                                <meter min="0" max=r.limit.to_string() value=used.to_string() high=(r.limit * 8 / 10).to_string()
                                    optimum="0" aria-label=format!("{} used", r.rule)></meter>
                                " "<span data-testid=format!("used-{}-{}", p.policy, r.rule)>{format!("{used} / {}", r.limit)}</span>
                                <span class="muted">{format!(" ({pct} %)")}</span>
                            </td>
                            <td data-label="Next request passes">{next}</td>
                            <td data-label="All used refills in">{if used == 0 { "—".to_owned() } else { seconds(r.reset_ms) }}</td>
                            <td data-label="State kept for">{r.ttl_ms.map_or("no state".to_owned(), |t| seconds(t as u64))}</td>
                        </tr>
                    }
                })
                .collect_view();
            view! {
                <section class="card" aria-label=format!("{} in {}", id, p.policy)>
                    <h2>{p.policy.clone()}<span class="muted">{format!(" · version {}", p.version)}</span></h2>
                    {status}
                    <table class="cards-on-phone">
                        <thead><tr><th>"Rule"</th><th>"Algorithm"</th><th>"Used"</th><th>"Next request passes"</th><th>"All used refills in"</th><th>"State kept for"</th></tr></thead>
                        <tbody>{rows}</tbody>
                    </table>
                </section>
            }
        })
        .collect_view();
    view! { {cards} {folded} }.into_any()
}

/// When the identifier was throttled over the last 7 days: a bar per hour and the totals
/// per policy (from the hourly lists of the most denied: lower bounds).
#[component]
fn Throttled(denials: Denials) -> impl IntoView {
    const W: f64 = 672.0;
    const H: f64 = 50.0;
    let now_hour = crate::domain::history::Step::Hour.period_of(denials.now_ms);
    let denials = denials.hours;
    let mut per_policy: Vec<(String, u64, u64)> = Vec::new();
    let mut per_hour: std::collections::BTreeMap<i64, u64> = Default::default();
    for (at, policy, n) in &denials {
        *per_hour.entry(*at).or_default() += n;
        match per_policy.iter_mut().find(|p| &p.0 == policy) {
            Some(p) => {
                p.1 += 1;
                p.2 += n;
            }
            None => per_policy.push((policy.clone(), 1, *n)),
        }
    }
    per_policy.sort_by_key(|p| std::cmp::Reverse(p.2));
    let peak = per_hour.values().copied().max().unwrap_or(1).max(1);
    let bars = per_hour
        .iter()
        .map(|(at, n)| {
            let hours_ago = now_hour - crate::domain::history::Step::Hour.period_of(*at);
            let x = W - (hours_ago as f64 + 1.0) * 4.0;
            let h = *n as f64 / peak as f64 * H;
            let tip = format!("{}: {n} denials", crate::domain::time::utc_minutes(Some(*at)));
            view! { <g><title>{tip}</title><rect class="denied" x=format!("{x:.1}") y=format!("{:.1}", H - h) width="3.4" height=format!("{h:.1}")/></g> }
        })
        .collect_view();
    view! {
        <section class="card" aria-labelledby="throttled-heading" data-testid="throttled-7d">
            <h2 id="throttled-heading">"Throttled, last 7 days"</h2>
            {if denials.is_empty() {
                view! { <p class="empty">"Not among the most denied in any hour of the last 7 days."</p> }.into_any()
            } else {
                view! {
                    <svg class="history" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none" role="img" aria-label="Denials per hour, last 7 days">
                        <title>"Denials per hour, last 7 days"</title>
                        {bars}
                    </svg>
                    <table>
                        <thead><tr><th>"Policy"</th><th class="num">"hours"</th><th class="num">"denials"</th></tr></thead>
                        <tbody>{per_policy.into_iter().map(|(p, hours, n)| view! {
                            <tr><td>{p}</td><td class="num">{hours}</td><td class="num">{n}</td></tr>
                        }).collect_view()}</tbody>
                    </table>
                    <p class="muted">"From each hour's list of the most denied identifiers: counts are lower bounds when it was not always on the list."</p>
                }.into_any()
            }}
        </section>
    }
}

/// Per-second history of the binding rule's use, sampled while the page is open.
#[component]
fn History(history: RwSignal<Vec<Inspection>>) -> impl IntoView {
    view! {
        <section class="card" aria-labelledby="history-heading">
            <h2 id="history-heading">"Last minute"</h2>
            {move || {
                let h = history.get();
                if h.len() < 2 {
                    return view! { <p class="muted">"The per-second history fills in while this page is open (it needs JavaScript)."</p> }.into_any();
                }
                const W: f64 = 600.0;
                const H: f64 = 60.0;
                let points: Vec<u64> = h
                    .iter()
                    .map(|i| {
                        i.policies
                            .iter()
                            .flat_map(|p| p.rules.iter())
                            .map(|r| (r.limit.saturating_sub(r.remaining) * 100).checked_div(r.limit).unwrap_or(0))
                            .max()
                            .unwrap_or(0)
                    })
                    .collect();
                let step = W / 59.0;
                let line: String = points
                    .iter()
                    .enumerate()
                    .map(|(i, p)| format!("{:.1},{:.1}", i as f64 * step, H - (*p).min(100) as f64 / 100.0 * H))
                    .collect::<Vec<_>>()
                    .join(" ");
                let label = format!("Highest share of a limit used, per second: now {} %", points.last().copied().unwrap_or(0));
                let aria = label.clone();
                view! {
                    <svg class="history" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none" role="img" aria-label=aria>
                        <title>{label}</title>
                        <line class="threshold" x1="0" x2=W.to_string() y1=format!("{:.1}", H * 0.2) y2=format!("{:.1}", H * 0.2)/>
                        <polyline class="usage" points=line/>
                    </svg>
                }.into_any()
            }}
        </section>
    }
}

/// The leases concurrency rules hold for the identifier, as read when the page loaded (or
/// after the last release): each with its age, and a form to release it with a reason.
#[component]
fn Leases(
    inspection: Inspection,
    can_release: bool,
    csrf: String,
    action: ServerAction<ReleaseLease>,
) -> impl IntoView {
    let rows: Vec<_> = inspection
        .policies
        .iter()
        .flat_map(|p| {
            p.rules.iter().flat_map(move |r| {
                r.leases
                    .iter()
                    .map(move |l| (p.policy.clone(), r.rule.clone(), l.clone()))
            })
        })
        .collect();
    if rows.is_empty() {
        return ().into_any();
    }
    let rows = rows
        .into_iter()
        .map(|(policy, rule, lease)| {
            let csrf = csrf.clone();
            view! {
                <tr data-testid="lease">
                    <td data-label="Policy">{policy}</td>
                    <td data-label="Rule">{rule}</td>
                    <td data-label="Holds" class="num">{lease.cost}</td>
                    <td data-label="Held for">{seconds(lease.age_ms)}</td>
                    <td data-label="Runs out in">{seconds(lease.expires_in_ms)}</td>
                    <td data-label="">{can_release.then(|| view! {
                        <ActionForm action=action attr:class="row">
                            <CsrfField csrf=csrf/>
                            <input type="hidden" name="lease" value=lease.id.clone()/>
                            <label>"Reason"<input name="reason" required maxlength="500" placeholder="worker crashed…"/></label>
                            <button type="submit" class="small danger">"Release"</button>
                        </ActionForm>
                    })}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="card" aria-labelledby="leases-heading">
            <h2 id="leases-heading">"Leases held"</h2>
            <table class="cards-on-phone">
                <thead><tr><th>"Policy"</th><th>"Rule"</th><th>"Holds"</th><th>"Held for"</th><th>"Runs out in"</th><th></th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
    .into_any()
}

/// What a reset or its undo did: from the action's answer on a hydrated page, from the
/// address a form posted without JavaScript came back to otherwise. A reset offers its
/// undo for a minute.
#[component]
fn ResetNotice(
    reset: ServerAction<ResetIdentifier>,
    undo: ServerAction<UndoReset>,
) -> impl IntoView {
    let query = leptos_router::hooks::use_query_map();
    let session = use_session();
    // A new reset's notice replaces the last undo's.
    Effect::new(move |_| {
        if reset.version().get() > 0 {
            undo.value().set(None);
        }
    });
    move || {
        let q = query.get();
        let id = q.get("id").unwrap_or_default();
        let undone = match undo.value().get() {
            Some(Ok(n)) => Some(n.to_string()),
            _ => q.get("undone"),
        };
        if let Some(n) = undone {
            return view! { <p class="notice" role="status">{format!("Reset undone: {n} keys put back as they were.")}</p> }.into_any();
        }
        let answer = match reset.value().get() {
            Some(Ok(a)) => Some((a.deleted.to_string(), a.undo)),
            _ => q.get("reset").map(|n| (n, q.get("undo"))),
        };
        let Some((n, token)) = answer else {
            return ().into_any();
        };
        let undo_form = token.map(|token| view! {
            <Suspense fallback=|| ()>
                {let (id, token) = (id.clone(), token.clone()); move || { let (id, token) = (id.clone(), token.clone()); Suspend::new(async move {
                    let s = session.await.unwrap_or_default();
                    view! {
                        <ActionForm action=undo attr:class="inline">
                            <CsrfField csrf=s.csrf.clone()/>
                            <input type="hidden" name="id" value=id/>
                            <input type="hidden" name="token" value=token/>
                            <button type="submit" class="small">"Undo (for a minute)"</button>
                        </ActionForm>
                    }
                })}}
            </Suspense>
        });
        view! {
            <div class="notice" role="status">
                {format!("Reset done: {n} keys deleted. The counters start again from nothing. ")}
                {undo_form}
            </div>
        }
        .into_any()
    }
}

/// The reset's choices, what blocks first (and chosen): for the identifier and each one
/// it was checked together with, every policy, each policy with state and each rule of
/// those; and all of them at once. Policies without state are left out.
fn reset_choices(i: &Inspection) -> (Vec<(String, String)>, String) {
    use crate::domain::inspection::Verdict;
    let mut opts: Vec<(String, String)> = Vec::new();
    let with_state = |p: &PolicyState| {
        p.status == "rules"
            && p.rules
                .iter()
                .any(|r| r.ttl_ms.is_some() || r.remaining < r.limit)
    };
    for x in std::iter::once(i).chain(&i.companions) {
        opts.push((
            format!("* {}", x.identifier),
            format!("{}: everything", x.identifier),
        ));
        for p in x.policies.iter().filter(|p| with_state(p)) {
            opts.push((
                format!("{} {}", p.policy, x.identifier),
                format!("{}: policy {}", x.identifier, p.policy),
            ));
            for r in &p.rules {
                opts.push((
                    format!("{}/{} {}", p.policy, r.rule, x.identifier),
                    format!("{}: rule {} of {}", x.identifier, r.rule, p.policy),
                ));
            }
        }
    }
    if !i.companions.is_empty() {
        let all: Vec<String> = std::iter::once(i)
            .chain(&i.companions)
            .map(|x| format!("* {}", x.identifier))
            .collect();
        opts.push((
            all.join("\n"),
            format!(
                "{} and the {} checked with it: everything",
                i.identifier,
                i.companions.len()
            ),
        ));
    }
    let chosen = match i.verdict() {
        Verdict::Blocked {
            policy,
            rule,
            identifier,
            ..
        } if rule != "override" => format!("{policy}/{rule} {identifier}"),
        _ => format!("* {}", i.identifier),
    };
    (opts, chosen)
}

#[component]
fn ResetForm(
    action: ServerAction<ResetIdentifier>,
    inspection: Inspection,
    csrf: String,
    /// What the page was asked for (`bob`), to come back to.
    page_id: String,
) -> impl IntoView {
    // The choices as the page was read: a live sample must not change the selection
    // under the person's hand.
    let (opts, chosen) = reset_choices(&inspection);
    let options = opts
        .into_iter()
        .map(|(v, l)| {
            let selected = v == chosen;
            view! { <option value=v selected=selected>{l}</option> }
        })
        .collect_view();
    view! {
        <section class="card" aria-labelledby="reset-heading">
            <h2 id="reset-heading">"Reset"</h2>
            <ActionForm action=action attr:class="row">
                <CsrfField csrf=csrf/>
                <input type="hidden" name="id" value=page_id/>
                <label>"What"<select name="what">{options}</select></label>
                <label>"Reason"<input name="reason" required maxlength="500" placeholder="support ticket, false positive…"/></label>
                <button type="submit" class="danger">"Reset counters"</button>
            </ActionForm>
            <p class="muted small">"A reset deletes the counters: the next request starts from a full allowance. It is written to the audit log with the reason, and can be undone for a minute."</p>
        </section>
    }
}

/// Block, exempt or limit the identifier in one policy for a while, with a reason: an override on
/// its exact value.
#[component]
fn OverrideForm(
    action: ServerAction<crate::app::policies::AddOverride>,
    inspection: Inspection,
    csrf: String,
) -> impl IntoView {
    let i = inspection;
    let Some((dimension, value)) = i
        .identifier
        .split_once('=')
        .map(|(d, v)| (d.to_owned(), v.to_owned()))
    else {
        return ().into_any();
    };
    // The policies where it has state first: the override is most likely for one of those.
    let mut policies: Vec<&PolicyState> = i.policies.iter().collect();
    policies.sort_by_key(|p| {
        !(p.status == "blocked"
            || p.rules
                .iter()
                .any(|r| r.ttl_ms.is_some() || r.remaining < r.limit))
    });
    let policies: Vec<String> = policies.into_iter().map(|p| p.policy.clone()).collect();
    // A `*` in the value would make the override a wildcard, not this identifier.
    if policies.is_empty() || value.contains('*') {
        return ().into_any();
    }
    let matcher = format!("{dimension}={value}");
    view! {
        <section class="card" id="override" aria-labelledby="override-heading">
            <h2 id="override-heading">"Block, exempt or limit"</h2>
            <ActionForm action=action attr:class="row override-form">
                <CsrfField csrf=csrf/>
                <input type="hidden" name="matcher" value=matcher/>
                <label>"Policy"<select name="name">{policies.into_iter().map(|p| view! { <option value=p.clone()>{p.clone()}</option> }).collect_view()}</select></label>
                <label>"Action"<select name="action">
                    <option value="unlimited">"Exempt (let through without counting)"</option>
                    <option value="block">"Block (deny every request)"</option>
                    <option value="limit">"A limit of its own"</option>
                </select></label>
                <OwnLimitFields/>
                <label>"For"<select name="expires_minutes">
                    <option value="15">"15 minutes"</option>
                    <option value="60" selected>"1 hour"</option>
                    <option value="1440">"1 day"</option>
                    <option value="10080">"7 days"</option>
                    <option value="">"until removed"</option>
                </select></label>
                <label>"Reason"<input name="reason" required maxlength="500" placeholder="ticket 4711, partner load test…"/></label>
                <button type="submit">"Add override"</button>
            </ActionForm>
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
