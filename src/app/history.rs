//! The history page (`/history?policy=<name>&range=24h`): a policy's checks, or every
//! policy's, over the last hour to 90 days, as a bar chart with a time axis, a scale and a
//! tooltip per bar; the identifiers denied and checked most over the range; the policy's
//! current version and a link to edit it. The range is a link, so it works without
//! JavaScript; hydrated, choosing one reloads the data only.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use super::{overview::encode, session::error_message};
use crate::{
    app::error::AppError,
    domain::history::{Counts, Range, Step},
};

/// What the page shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryData {
    /// The policy, or empty for every policy together.
    pub policy: String,
    /// The policy's current version (none for every policy, or a deleted policy).
    pub version: Option<u64>,
    pub range: String,
    pub step_ms: i64,
    /// Each period's start (ms since the epoch) and counts, oldest first.
    pub points: Vec<(i64, Counts)>,
    pub totals: Counts,
    /// (policy, identifier, count).
    pub top_denied: Vec<(String, String, u64)>,
    pub top_checked: Vec<(String, String, u64)>,
    /// Every policy's totals over the range (for every policy together only).
    pub per_policy: Vec<(String, Counts)>,
}

/// The history of `policy` (empty: every policy) over `range`.
#[server(prefix = "/fn", endpoint = "history")]
pub async fn load_history(
    policy: String,
    range: String,
    #[server(default)] all: bool,
    #[server(default)] find: String,
) -> Result<HistoryData, AppError> {
    use crate::{domain::history::ALL, service::history::HistoryError};
    crate::app::guard::require(crate::domain::people::Action::View)?;
    let state = expect_context::<crate::state::AppState>();
    let range = if range.is_empty() {
        Range::Day
    } else {
        Range::parse(&range).map_err(|m| AppError::bad_input("range", m))?
    };
    let found = state
        .service()
        .history(
            Some(policy.as_str()),
            range,
            None,
            if all {
                crate::domain::history::TOP_KEPT
            } else {
                10
            },
        )
        .await
        .map_err(|e| match e {
            HistoryError::Invalid { field, message } => AppError::bad_input(field, message),
            HistoryError::Store(error) => AppError::unavailable("history", error),
        })?;
    let all = found.policy == ALL;
    let needle = find.trim().to_lowercase();
    let rows = |list: Vec<(String, u64)>| {
        list.into_iter()
            .filter(|(member, _)| needle.is_empty() || member.to_lowercase().contains(&needle))
            .map(|(member, n)| {
                if all {
                    let (p, id) = crate::domain::history::split_member(&member);
                    (p.to_owned(), id.to_owned(), n)
                } else {
                    (found.policy.clone(), member, n)
                }
            })
            .collect()
    };
    let per_policy = if all {
        state
            .service()
            .policy_totals(range)
            .await
            .map_err(|e| AppError::unavailable("history totals", e))?
    } else {
        Vec::new()
    };
    Ok(HistoryData {
        per_policy,
        version: state
            .service()
            .known_policy(&found.policy)
            .map(|p| p.version),
        policy: if all {
            String::new()
        } else {
            found.policy.clone()
        },
        range: range.as_str().to_owned(),
        step_ms: found.step.ms(),
        points: found.points.clone(),
        totals: found.totals,
        top_denied: rows(found.top_denied.clone()),
        top_checked: rows(found.top_checked.clone()),
    })
}

#[component]
pub fn HistoryPage() -> impl IntoView {
    let query = use_query_map();
    let policy = move || query.with(|q| q.get("policy").unwrap_or_default());
    let range = move || query.with(|q| q.get("range").unwrap_or_default());
    let all = move || query.with(|q| q.get("all").as_deref() == Some("1"));
    let find = move || query.with(|q| q.get("find").unwrap_or_default());
    let data = Resource::new(
        move || (policy(), range(), all(), find()),
        |(p, r, a, f)| load_history(p, r, a, f),
    );
    let names = Resource::new(|| (), |_| super::policies::list_policies());
    view! {
        <Title text="History"/>
        <h1>{move || if policy().is_empty() { "History · every policy".to_owned() } else { format!("History · {}", policy()) }}</h1>
        <leptos_router::components::Form method="GET" action="" on_form_data=super::without_nameless() attr:class="row filter" attr:aria-label="Policy">
            <input type="hidden" name="range" value=range/>
            // Typed with suggestions, not a select: hundreds of policies (Envoy domains) are
            // found by a few letters.
            <label>"Policy "
                <input type="search" name="policy" list="policy-names" value=policy prop:value=policy
                    placeholder="every policy" autocomplete="off"/>
            </label>
            <datalist id="policy-names">
                <Suspense fallback=|| ()>
                    {move || Suspend::new(async move {
                        names.await.unwrap_or_default().into_iter().map(|p| {
                            view! { <option value=p.name.clone()/> }
                        }).collect_view()
                    })}
                </Suspense>
            </datalist>
            <label>"Identifiers containing " <input type="search" name="find" value=find placeholder="bob, 203.0.113."/></label>
            <input type="hidden" name="all" value=move || if all() { "1" } else { "0" }/>
            <button type="submit">"Show"</button>
        </leptos_router::components::Form>
        <nav class="ranges" aria-label="Time range">
            {Range::ALL.into_iter().map(|r| {
                let href = move || {
                    let p = policy();
                    if p.is_empty() { format!("/history?range={}", r.as_str()) } else { format!("/history?policy={}&range={}", encode(&p), r.as_str()) }
                };
                let current = move || {
                    let chosen = range();
                    (chosen == r.as_str() || (chosen.is_empty() && r == Range::Day)).then_some("page")
                };
                view! { <a href=href aria-current=current data-testid=format!("range-{}", r.as_str())>{r.as_str()}</a> }
            }).collect_view()}
        </nav>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(h) => view! { <HistoryBody h=h/> }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// The overview over a past range: every policy's chart and top lists, and each policy's
/// totals, most denials first, the idle ones folded away.
#[component]
pub fn RangeOverview(range: String) -> impl IntoView {
    let filter = super::overview::filter_text();
    let data = Resource::new(
        move || range.clone(),
        |r| load_history(String::new(), r, false, String::new()),
    );
    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(h) => {
                        let range = h.range.clone();
                        let per_policy = h.per_policy.clone();
                        view! {
                            <HistoryBody h=h/>
                            <section class="card" aria-labelledby="per-policy-heading">
                                <h2 id="per-policy-heading">{format!("Policies, last {range}")}</h2>
                                {move || policy_totals(per_policy.clone(), &filter(), &range)}
                            </section>
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}

fn policy_totals(rows: Vec<(String, Counts)>, filter: &str, range: &str) -> AnyView {
    let (mut busy, idle): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .filter(|(p, _)| super::overview::passes(p, filter))
        .partition(|(_, c)| c.total() > 0);
    busy.sort_by(|a, b| {
        b.1.denied
            .cmp(&a.1.denied)
            .then(b.1.total().cmp(&a.1.total()))
            .then_with(|| a.0.cmp(&b.0))
    });
    let link = |p: &str| format!("/history?policy={}&range={range}", encode(p));
    let idle_count = idle.len();
    view! {
        {if busy.is_empty() {
            view! { <p class="empty">"No checks in this range."</p> }.into_any()
        } else {
            view! {
                <table data-testid="policy-totals">
                    <thead><tr><th>"Policy"</th><th class="num">"allowed"</th><th class="num">"denied"</th><th class="num">"shadow"</th><th class="num">"degraded"</th></tr></thead>
                    <tbody>
                        {busy.into_iter().map(|(p, c)| view! {
                            <tr><td><a href=link(&p)>{p.clone()}</a></td><td class="num">{c.allowed}</td><td class="num">{c.denied}</td><td class="num">{c.shadow_denied}</td><td class="num">{c.degraded}</td></tr>
                        }).collect_view()}
                    </tbody>
                </table>
            }.into_any()
        }}
        {(idle_count > 0).then(|| view! {
            <details class="idle" data-testid="idle-policies">
                <summary>{format!("{idle_count} idle {}", if idle_count == 1 { "policy" } else { "policies" })}</summary>
                <p class="names">{idle.into_iter().map(|(p, _)| view! { <a href=link(&p)>{p.clone()}</a>" " }).collect_view()}</p>
            </details>
        })}
    }
    .into_any()
}

#[component]
fn HistoryBody(h: HistoryData) -> impl IntoView {
    let t = h.totals;
    let edit = (!h.policy.is_empty()).then(|| {
        let href = format!("/policy?name={}", encode(&h.policy));
        let version = h
            .version
            .map_or("deleted".to_owned(), |v| format!("version {v}"));
        view! { <p class="muted" data-testid="policy-version">"Current: " {version} " · " <a href=href>"edit the policy"</a></p> }
    });
    view! {
        {edit}
        <div class="grid">
            <section class="card wide" aria-labelledby="series-heading">
                <h2 id="series-heading">{format!("Checks per {}, last {}", step_name(h.step_ms), h.range)}</h2>
                <p class="muted legend">
                    <span class="swatch allowed"></span>{format!("allowed {} ", t.allowed)}
                    <span class="swatch denied"></span>{format!("denied {} ", t.denied)}
                    <span class="swatch shadow"></span>{format!("shadow-denied {} ", t.shadow_denied)}
                    <span class="swatch degraded"></span>{format!("degraded {}", t.degraded)}
                </p>
                <HistoryChart points=h.points.clone() step_ms=h.step_ms/>
            </section>
            <section class="card" aria-labelledby="top-denied-heading">
                <h2 id="top-denied-heading">"Denied most"</h2>
                {top_table(h.top_denied, "denials", "top-denied", "Nobody was denied in this range.")}
            </section>
            <section class="card" aria-labelledby="top-checked-heading">
                <h2 id="top-checked-heading">"Checked most"</h2>
                {top_table(h.top_checked, "checks", "top-checked", "Nothing was checked in this range.")}
            </section>
        </div>
        <p class="row">{top_links(&h.policy, &h.range)}</p>
    }
}

/// "Show the top 64" (or 10), and the CSV downloads of the series and of the top lists.
fn top_links(policy: &str, range: &str) -> impl IntoView {
    let query = use_query_map();
    let all = query.with_untracked(|q| q.get("all").as_deref() == Some("1"));
    let base = if policy.is_empty() {
        format!("range={range}")
    } else {
        format!("policy={}&range={range}", encode(policy))
    };
    let other = if all {
        (format!("/history?{base}"), "Show the top 10")
    } else {
        (format!("/history?{base}&all=1"), "Show the top 64")
    };
    let api = if policy.is_empty() {
        format!("range={range}")
    } else {
        format!("policy={}&range={range}", encode(policy))
    };
    view! {
        <a href=other.0 data-testid="top-all">{other.1}</a>
        " · "<a href=format!("/api/v1/history/csv?{api}") download="history.csv">"Download CSV (the series)"</a>
        " · "<a href=format!("/api/v1/history/csv?{api}&format=csv-top&top=100") download="history-top.csv">"Download CSV (the top identifiers)"</a>
    }
}

fn step_name(step_ms: i64) -> &'static str {
    match step_ms {
        ms if ms == Step::Minute.ms() => "minute",
        ms if ms == Step::Hour.ms() => "hour",
        _ => "day",
    }
}

fn top_table(
    rows: Vec<(String, String, u64)>,
    what: &'static str,
    testid: &'static str,
    empty: &'static str,
) -> AnyView {
    let rows = rows
        .into_iter()
        .map(|(policy, identifier, n)| super::widgets::IdentifierRow {
            policy,
            identifier,
            value: n.to_string(),
        });
    super::widgets::identifier_table(rows.collect(), what, testid, empty)
}

/// `10:00`, with the date (`11-24 10:00`) where a new day starts or at the first tick;
/// `11-24` for days.
fn tick_label(ms: i64, step_ms: i64, previous: Option<i64>) -> String {
    let text = crate::domain::time::utc_minutes(Some(ms)); // 2026-11-24 10:58 UTC
    if step_ms >= Step::Day.ms() {
        return text[5..10].to_owned();
    }
    let new_day = previous.is_none_or(|p| p.div_euclid(86_400_000) != ms.div_euclid(86_400_000));
    if new_day && step_ms >= Step::Hour.ms() {
        text[5..16].to_owned()
    } else {
        text[11..16].to_owned()
    }
}

/// Stacked bars per period (allowed, shadow-denied, degraded, denied from the bottom), a
/// scale on the left, time ticks below, each bar's figures in its tooltip. SVG attributes
/// and classes only (the CSP allows no inline styles).
#[component]
fn HistoryChart(points: Vec<(i64, Counts)>, step_ms: i64) -> impl IntoView {
    const W: f64 = 720.0;
    const H: f64 = 160.0;
    const LEFT: f64 = 48.0;
    const BOTTOM: f64 = 20.0;
    let plot_w = W - LEFT;
    let plot_h = H - BOTTOM;
    let n = points.len().max(1);
    let peak = points
        .iter()
        .map(|(_, c)| c.total())
        .max()
        .unwrap_or(0)
        .max(1);
    let bar = plot_w / n as f64;
    let ticks = 6.min(n);
    let bars = points
        .iter()
        .enumerate()
        .map(|(i, (at, c))| {
            let x = LEFT + i as f64 * bar;
            let mut y = plot_h;
            let segments = [
                ("allowed", c.allowed),
                ("shadow", c.shadow_denied),
                ("degraded", c.degraded),
                ("denied", c.denied),
            ]
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(class, v)| {
                let h = v as f64 / peak as f64 * plot_h;
                y -= h;
                view! { <rect class=class x=format!("{x:.1}") y=format!("{y:.1}") width=format!("{:.2}", (bar * 0.85).max(0.5)) height=format!("{h:.1}")/> }
            })
            .collect_view();
            let tip = format!(
                "{}: {} allowed, {} denied, {} shadow-denied, {} degraded",
                crate::domain::time::utc_minutes(Some(*at)),
                c.allowed,
                c.denied,
                c.shadow_denied,
                c.degraded
            );
            // A full-height, transparent hit area, so even an empty period has a tooltip.
            view! {
                <g class="bar">
                    <title>{tip}</title>
                    <rect class="hit" x=format!("{x:.1}") y="0" width=format!("{bar:.2}") height=format!("{plot_h:.1}")/>
                    {segments}
                </g>
            }
        })
        .collect_view();
    let tick_views = (0..ticks)
        .map(|k| {
            let i = if ticks <= 1 { 0 } else { k * (n - 1) / (ticks - 1) };
            let x = LEFT + i as f64 * bar + bar / 2.0;
            let previous = (k > 0)
                .then(|| (k - 1) * (n - 1) / (ticks - 1).max(1))
                .and_then(|j| points.get(j))
                .map(|(at, _)| *at);
            let label = points
                .get(i)
                .map(|(at, _)| tick_label(*at, step_ms, previous))
                .unwrap_or_default();
            let anchor = if k == 0 { "start" } else if k + 1 == ticks { "end" } else { "middle" };
            view! {
                <line class="tick" x1=format!("{x:.1}") x2=format!("{x:.1}") y1=format!("{plot_h:.1}") y2=format!("{:.1}", plot_h + 4.0)/>
                <text class="axis" x=format!("{x:.1}") y=format!("{:.1}", H - 4.0) text-anchor=anchor>{label}</text>
            }
        })
        .collect_view();
    let summary = format!("{} periods; the busiest had {peak} checks", points.len());
    let label = summary.clone();
    view! {
        <svg class="history" viewBox=format!("0 0 {W} {H}") role="img" aria-label=label data-testid="history-chart">
            <title>{summary}</title>
            <line class="axis" x1=LEFT x2=W y1=format!("{plot_h:.1}") y2=format!("{plot_h:.1}")/>
            <line class="axis" x1=LEFT x2=LEFT y1="0" y2=format!("{plot_h:.1}")/>
            <text class="axis" x=format!("{:.1}", LEFT - 4.0) y="10" text-anchor="end">{peak}</text>
            <text class="axis" x=format!("{:.1}", LEFT - 4.0) y=format!("{:.1}", plot_h / 2.0 + 4.0) text-anchor="end">{peak / 2}</text>
            <text class="axis" x=format!("{:.1}", LEFT - 4.0) y=format!("{plot_h:.1}") text-anchor="end">"0"</text>
            {bars}
            {tick_views}
        </svg>
    }
}
