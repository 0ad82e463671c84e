//! The identifier inspector: type `user=42`, see every policy and rule that applies with
//! its live counter as a bar, the time to reset and the key's TTL, which rule binds, and a
//! per-second history (sampled while the page is open, from `/events/identifier`); reset one
//! rule, one policy or everything, with a reason that goes to the audit log.

use leptos::prelude::*;

use crate::app::error::AppError;
use leptos_meta::Title;
use leptos_router::components::Form;

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
        now_ms: crate::clock::now_ms(),
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

/// Resets the identifier: `scope` is empty (every policy), `<policy>` or `<policy>/<rule>`.
#[server(prefix = "/fn", endpoint = "reset")]
pub async fn reset_identifier(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
    #[server(default)] scope: String,
    #[server(default)] reason: String,
) -> Result<u64, AppError> {
    use crate::{domain::Identifier, service::identifiers::ResetError};
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let state = expect_context::<crate::state::AppState>();
    let id = Identifier::parse(id.trim()).map_err(|m| AppError::bad_input("id", m))?;
    let reason = reason_given(&reason)?;
    let (policy, rule) = match scope.split_once('/') {
        Some((p, r)) => (Some(p), Some(r)),
        None if scope.is_empty() => (None, None),
        None => (Some(scope.as_str()), None),
    };
    match state
        .service()
        .reset_identifier(&caller.actor(), &id, policy, rule, reason)
        .await
    {
        Ok(done) => Ok(done.deleted_keys),
        Err(ResetError::Invalid { field, message }) => Err(AppError::bad_input(field, message)),
        Err(ResetError::UnknownPolicy(_)) => Err(AppError::bad_input("scope", "no such policy")),
        Err(ResetError::Forbidden(why)) => {
            Err(AppError::refused(axum::http::StatusCode::FORBIDDEN, why))
        }
        Err(ResetError::Unavailable(error)) => Err(AppError::unavailable("reset", error)),
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
    state
        .service()
        .release_lease_by(&caller.actor(), &lease, reason)
        .await
        .map_err(|e| AppError::unavailable("release", e))
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

/// The `id` of a query string (with or without its `?`), decoded once. leptos_router's
/// query map decodes again what the URL parser decoded: `%25` in an identifier came out as
/// `%`, and an Envoy descriptor's escapes (`%C2%B7`) as the characters they stand for.
fn id_of(search: &str) -> String {
    search
        .trim_start_matches('?')
        .split('&')
        .find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == "id").then(|| {
                let value = value.replace('+', " ");
                percent_encoding::percent_decode_str(&value)
                    .decode_utf8_lossy()
                    .into_owned()
            })
        })
        .unwrap_or_default()
}

#[component]
pub fn InspectorPage() -> impl IntoView {
    let location = leptos_router::hooks::use_location();
    let id = move || location.search.with(|search| id_of(search));
    let reset = ServerAction::<ResetIdentifier>::new();
    let release = ServerAction::<ReleaseLease>::new();
    let data = Resource::new(
        move || (id(), reset.version().get(), release.version().get()),
        |(id, _, _)| async move {
            if id.trim().is_empty() {
                Ok(None)
            } else {
                inspect_identifier(id).await.map(Some)
            }
        },
    );
    let denials = Resource::new(
        move || (id(), reset.version().get()),
        |(id, _)| async move {
            if id.trim().is_empty() {
                Ok(Denials::default())
            } else {
                identifier_denials(id).await
            }
        },
    );
    let session = use_session();
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
    // After a reset or a release, show the fresh read at once rather than the last sample.
    Effect::new(move |_| {
        reset.version().track();
        release.version().track();
        live.set(None);
    });

    view! {
        <Title text="Identifiers"/>
        <h1>"Identifier inspector"</h1>
        <Form method="GET" action="" attr:class="row">
            <label>"Identifier"
                <input name="id" placeholder="user=42" value=id prop:value=id required/>
            </label>
            <button type="submit">"Inspect"</button>
        </Form>
        {move || reset.value().get().map(|r| match r {
            Ok(n) => view! { <p class="notice" role="status">{format!("Reset: {n} keys deleted.")}</p> }.into_any(),
            Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
        })}
        {move || release.value().get().map(|r| match r {
            Ok(true) => view! { <p class="notice" role="status">"Lease released."</p> }.into_any(),
            Ok(false) => view! { <p class="notice" role="status">"That lease was no longer held."</p> }.into_any(),
            Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
        })}
        <Suspense fallback=|| view! { <p>"Reading counters…"</p> }>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(None) => view! { <p class="muted">"Type an identifier as dimension=value, such as user=42 or ip=203.0.113.7."</p> }.into_any(),
                    Ok(Some(first)) => {
                        let can_reset = s.may(Action::ResetIdentifier);
                        let csrf = s.csrf.clone();
                        let leases = view! { <Leases inspection=first.clone() can_release=can_reset csrf=csrf.clone() action=release/> };
                        let current = Signal::derive(move || live.get().unwrap_or_else(|| first.clone()));
                        view! {
                            {move || current.get().error.map(|e| view! { <p class="alert" role="alert">{e}</p> })}
                            {move || view! { <Policies inspection=current.get()/> }}
                            {leases}
                            <Suspense fallback=|| ()>
                                {move || Suspend::new(async move {
                                    match denials.await {
                                        Ok(d) => view! { <Throttled denials=d/> }.into_any(),
                                        Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                                    }
                                })}
                            </Suspense>
                            <History history=history/>
                            {can_reset.then(|| view! { <ResetForm action=reset inspection=current csrf=csrf.clone()/> })}
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
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
    // fold into one line.
    let (touched, untouched): (Vec<PolicyState>, Vec<PolicyState>) =
        inspection.policies.into_iter().partition(|p| {
            p.status != "rules"
                || p.rules.iter().any(|r| {
                    r.ttl_ms.is_some() || r.remaining < r.limit || r.retry_after_ms.is_some()
                })
        });
    let touched_any = !touched.is_empty();
    let folded = (!untouched.is_empty()).then(|| {
        let names = untouched
            .iter()
            .map(|p| p.policy.clone())
            .collect::<Vec<_>>()
            .join(", ");
        view! {
            <p class="muted untouched" data-testid="untouched">
                {format!(
                    "No state in {}{} {}: {names}.",
                    if touched_any { "" } else { "any of its " },
                    untouched.len(),
                    match (touched_any, untouched.len()) {
                        (true, 1) => "other policy",
                        (true, _) => "other policies",
                        (false, 1) => "policy",
                        (false, _) => "policies",
                    }
                )}
            </p>
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
                    // The binding rule only matters once something is used.
                    let binds = r.binding && (used > 0 || r.retry_after_ms.is_some());
                    view! {
                        <tr class:binding=binds>
                            <td data-label="Rule">{r.rule.clone()}{binds.then(|| view! { " " <span class="badge warn">"binds"</span> })}</td>
                            <td data-label="Algorithm">{r.algorithm}</td>
                            <td data-label="Used">
                                <meter min="0" max=r.limit.to_string() value=used.to_string() high=(r.limit * 8 / 10).to_string()
                                    optimum="0" aria-label=format!("{} used", r.rule)></meter>
                                " "<span data-testid=format!("used-{}-{}", p.policy, r.rule)>{format!("{used} / {}", r.limit)}</span>
                                <span class="muted">{format!(" ({pct} %)")}</span>
                            </td>
                            <td data-label="Full again in">{seconds(r.reset_ms)}</td>
                            <td data-label="Key TTL">{r.ttl_ms.map_or("no state".to_owned(), |t| seconds(t as u64))}</td>
                            <td data-label="Retry after">{r.retry_after_ms.map_or("—".to_owned(), seconds)}</td>
                        </tr>
                    }
                })
                .collect_view();
            view! {
                <section class="card" aria-label=format!("{} in {}", id, p.policy)>
                    <h2>{p.policy.clone()}<span class="muted">{format!(" · version {}", p.version)}</span></h2>
                    {status}
                    <table class="cards-on-phone">
                        <thead><tr><th>"Rule"</th><th>"Algorithm"</th><th>"Used"</th><th>"Full again in"</th><th>"Key TTL"</th><th>"Retry after"</th></tr></thead>
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

#[component]
fn ResetForm(
    action: ServerAction<ResetIdentifier>,
    inspection: Signal<Inspection>,
    csrf: String,
) -> impl IntoView {
    let options = move || {
        let i = inspection.get();
        let mut opts = vec![("".to_owned(), "Everything (every policy)".to_owned())];
        for p in &i.policies {
            opts.push((p.policy.clone(), format!("Policy {}", p.policy)));
            for r in &p.rules {
                opts.push((
                    format!("{}/{}", p.policy, r.rule),
                    format!("Rule {} of {}", r.rule, p.policy),
                ));
            }
        }
        opts.into_iter()
            .map(|(v, l)| view! { <option value=v>{l}</option> })
            .collect_view()
    };
    view! {
        <section class="card" aria-labelledby="reset-heading">
            <h2 id="reset-heading">"Reset"</h2>
            <ActionForm action=action attr:class="row">
                <CsrfField csrf=csrf/>
                <input type="hidden" name="id" value=move || inspection.get().identifier/>
                <label>"What"<select name="scope">{options}</select></label>
                <label>"Reason"<input name="reason" required maxlength="500" placeholder="support ticket, false positive…"/></label>
                <button type="submit" class="danger">"Reset counters"</button>
            </ActionForm>
        </section>
    }
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
