//! The inspector's panels: every policy and rule with its live state, what throttles
//! the identifier now, its per-second history, and the leases it holds.

use leptos::prelude::*;

use super::*;

#[component]
pub(super) fn Policies(inspection: Inspection) -> impl IntoView {
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
            let policy = p.policy.clone();
            let rows = p
                .rules
                .into_iter()
                .map(|r| rule_row(&policy, r))
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

/// One rule's line in a policy's card: how much is used, when the next request passes,
/// when all of it is back, and how long its state is kept.
fn rule_row(policy: &str, r: RuleState) -> impl IntoView {
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
                " "<span data-testid=format!("used-{}-{}", policy, r.rule)>{format!("{used} / {}", r.limit)}</span>
                <span class="muted">{format!(" ({pct} %)")}</span>
            </td>
            <td data-label="Next request passes">{next}</td>
            <td data-label="All used refills in">{if used == 0 { "—".to_owned() } else { seconds(r.reset_ms) }}</td>
            <td data-label="State kept for">{r.ttl_ms.map_or("no state".to_owned(), |t| seconds(t as u64))}</td>
        </tr>
    }
}

/// When the identifier was throttled over the last 7 days: a bar per hour and the totals
/// per policy (from the hourly lists of the most denied: lower bounds).
#[component]
pub(super) fn Throttled(denials: Denials) -> impl IntoView {
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
pub(super) fn History(history: RwSignal<Vec<Inspection>>) -> impl IntoView {
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
pub(super) fn Leases(
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

/// The overrides that apply to the identifier, where they act: each with its action, expiry
/// and reason, and (for support and admins) Extend by a day and Remove.
#[component]
pub(super) fn OverridesHere(
    inspection: Inspection,
    action: ServerAction<crate::app::policies::ChangeOverride>,
    csrf: String,
    can_change: bool,
) -> impl IntoView {
    if inspection.overrides.is_empty() {
        return ().into_any();
    }
    let rows = inspection.overrides.into_iter().map(|o| {
        let matcher = o.document["match"].as_str().unwrap_or_default().to_owned();
        let words = crate::app::policies::override_action_words(&o.document);
        let expires = o.document["expires_at_ms"].as_i64();
        let until = expires.map_or("until removed".to_owned(), |t| {
            format!("until {}", crate::domain::time::utc_minutes(Some(t)))
        });
        let reason = o.document["reason"].as_str().unwrap_or_default().to_owned();
        let force = if o.in_force { "" } else { " (a more precise one applies)" };
        let (csrf, policy, shown) = (csrf.clone(), o.policy.clone(), matcher.clone());
        let form = move |change: &'static str, label: &'static str| {
            view! {
                <ActionForm action=action attr:class="inline">
                    <CsrfField csrf=csrf.clone()/>
                    <input type="hidden" name="name" value=policy.clone()/>
                    <input type="hidden" name="index" value=o.index.to_string()/>
                    <input type="hidden" name="matcher" value=shown.clone()/>
                    <input type="hidden" name="change" value=change/>
                    <input type="hidden" name="minutes" value="1440"/>
                    <button type="submit" class=if change == "remove" { "small danger" } else { "small" }>{label}</button>
                </ActionForm>
            }
        };
        let buttons = can_change.then(|| view! {
            {expires.is_some().then(|| form.clone()("extend", "Extend by a day"))}
            {form("remove", "Remove")}
        });
        view! {
            <li data-testid="override-here">
                <strong>{format!("{}: {words}", o.policy)}</strong>
                {format!(" on {matcher}, {until}{force}")}
                {(!reason.is_empty()).then(|| view! { <span class="muted">{format!(" — {reason}")}</span> })}
                " "{buttons}
            </li>
        }
    }).collect_view();
    view! {
        <section class="card" aria-labelledby="overrides-here-heading" data-testid="overrides-here">
            <h2 id="overrides-here-heading">"Overrides on it"</h2>
            <ul>{rows}</ul>
        </section>
    }
    .into_any()
}
