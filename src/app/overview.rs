//! The overview: checks per second per policy (allowed and denied), the identifiers
//! throttled now and those near a limit, and Redis's health. Rendered complete on the server
//! (so it works without JavaScript); hydrated, it follows a server-sent event stream
//! (`/events/overview`) and updates every second without reloading.
//!
//! Everything comes from the live counters (`service::overview`): a few keys, never a scan, so it
//! costs the same with a million identifiers.

use leptos::prelude::*;

use crate::app::error::AppError;
use leptos_meta::Title;

use super::session::error_message;
pub use crate::domain::throttle::Throttle;

mod data;
pub use data::*;
// Named, so it is this View and not the prelude's.
pub use data::View;

/// Formats epoch milliseconds as a UTC time of day with milliseconds.
fn clock(ms: i64) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// Policies drawn as charts at most; the other busy ones are rows of a table, the idle ones
/// names in a folded list, so a few hundred policies fit one screen.
pub const CHARTED: usize = 12;

/// The overview's view as the page's query gives it (`filter`, `all=1`).
fn view_of(query: &leptos_router::params::ParamsMap) -> View {
    View {
        filter: query.get("filter").unwrap_or_default(),
        all: query.get("all").as_deref() == Some("1"),
    }
}

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn OverviewPage() -> impl IntoView {
    let query = leptos_router::hooks::use_query_map();
    let range = move || query.with(|q| q.get("range").unwrap_or_default());
    let filter = filter_text();
    let view = Memo::new(move |_| query.with(view_of));
    let initial = Resource::new(move || view.get(), |v| overview(v.filter, v.all));
    let live = RwSignal::new(None::<OverviewData>);
    // What the page shows: the stream's state, else the first read. Made here, not in the
    // Suspense: a new filter reloads the first read and renders the live part anew, and
    // the old part must not be left reading a signal that went with it.
    let data = Signal::derive(move || {
        live.get()
            .or_else(|| initial.get().and_then(Result::ok))
            .unwrap_or_default()
    });
    #[cfg(feature = "hydrate")]
    Effect::new(move |previous: Option<View>| {
        let v = view.get();
        // Another filter: the stream starts over (a change of range alone swaps the live
        // part out, and must not touch what it is still reading while it goes).
        if previous.as_ref().is_some_and(|p| *p != v) {
            live.set(None);
        }
        if !matches!(range().as_str(), "" | "live") {
            return v;
        }
        let q = v.query();
        let path = if q.is_empty() {
            "/events/overview".to_owned()
        } else {
            format!("/events/overview?{q}")
        };
        super::follow_events(&path, move |delta: OverviewDelta| {
            live.update(|current| match current {
                Some(data) => data.apply(delta),
                None => {
                    let mut data = initial
                        .get_untracked()
                        .and_then(|r| r.ok())
                        .unwrap_or_default();
                    data.apply(delta);
                    *current = Some(data);
                }
            })
        });
        v
    });

    view! {
        <Title text="Overview"/>
        <h1>"Overview"</h1>
        <div class="toolbar">
            <nav class="ranges" aria-label="Time range">
                {["live", "1h", "24h", "7d", "30d", "90d"].into_iter().map(|r| {
                    let href = move || {
                        let f = filter();
                        let range = if r == "live" { String::new() } else { format!("range={r}") };
                        let filter = if f.is_empty() { String::new() } else { format!("filter={}", encode(&f)) };
                        let q = [range, filter].into_iter().filter(|p| !p.is_empty()).collect::<Vec<_>>().join("&");
                        if q.is_empty() { "/".to_owned() } else { format!("/?{q}") }
                    };
                    let current = move || {
                        let chosen = range();
                        (chosen == r || (chosen.is_empty() && r == "live")).then_some("page")
                    };
                    view! { <a href=href aria-current=current data-testid=format!("range-{r}")>{r}</a> }
                }).collect_view()}
            </nav>
            <leptos_router::components::Form method="GET" action="/" on_form_data=super::without_nameless() attr:role="search" attr:class="filter">
                {move || (!matches!(range().as_str(), "" | "live")).then(|| view! { <input type="hidden" name="range" value=range()/> })}
                <label>"Policies " <input type="search" name="filter" placeholder="filter by name" value=filter/></label>
                <button type="submit">"Filter"</button>
            </leptos_router::components::Form>
        </div>
        {move || if matches!(range().as_str(), "" | "live") {
            view! {
                <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                    {move || Suspend::new(async move {
                        match initial.await {
                            Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                            Ok(_) => view! { <Live data=data view=view/> }.into_any(),
                        }
                    })}
                </Suspense>
            }.into_any()
        } else {
            view! { <super::history::RangeOverview range=range()/> }.into_any()
        }}
    }
}

/// Whether `policy` passes the filter box (a part of its name, any case).
pub fn passes(policy: &str, filter: &str) -> bool {
    filter.is_empty()
        || policy
            .to_lowercase()
            .contains(&filter.trim().to_lowercase())
}

/// The filter box's text, from the page's query (read by each part itself: a signal derived
/// in the page would be gone when a part re-renders on the way to another page).
pub fn filter_text() -> impl Fn() -> String + Copy {
    let query = leptos_router::hooks::use_query_map();
    move || query.with(|q| q.get("filter").unwrap_or_default())
}

/// Busy seconds in the minute below which a policy is a row of the "more busy" table rather
/// than a chart: a short spike does not take a chart's height.
const SHORT_LIVED: usize = 6;

#[component]
fn Live(data: Signal<OverviewData>, view: Memo<View>) -> impl IntoView {
    // From the page's view, not a query memo of this part's own: a new filter renders this
    // part anew, and its old closures must not read a memo that went with it.
    let filter = move || view.with(|v| v.filter.clone());
    let policies = move || {
        let d = data.get();
        if d.policies.is_empty() {
            return view! { <p class="empty">"No policies yet."</p> }.into_any();
        }
        let f = filter();
        let shown: Vec<PolicyRate> = d
            .policies
            .into_iter()
            .filter(|p| passes(&p.policy, &f))
            .collect();
        let (mut busy, idle): (Vec<PolicyRate>, Vec<PolicyRate>) =
            shown.into_iter().partition(|p| !p.busy.is_empty());
        // Most denials first, then most checks.
        busy.sort_by(|a, b| {
            let (ta, tb) = (a.totals(), b.totals());
            tb.1.cmp(&ta.1)
                .then(tb.0.cmp(&ta.0))
                .then_with(|| a.policy.cmp(&b.policy))
        });
        // The busiest policy is always a chart; the others only when busy for a while.
        let mut order = 0;
        let (mut steady, short): (Vec<PolicyRate>, Vec<PolicyRate>) =
            busy.into_iter().partition(|p| {
                order += 1;
                order == 1 || p.busy.len() >= SHORT_LIVED
            });
        let mut rest = steady.split_off(steady.len().min(CHARTED));
        rest.extend(short);
        let charts = steady
            .into_iter()
            .map(|p| view! { <RateChart rate=p/> })
            .collect_view();
        let rows = (!rest.is_empty()).then(|| view! {
            <table data-testid="more-busy" class="cards-on-phone">
                <thead><tr><th>"More busy policies"</th><th class="num">"allowed"</th><th class="num">"denied"</th><th class="num">"busy seconds"</th></tr></thead>
                <tbody>
                    {rest.into_iter().map(|p| {
                        let (a, d) = p.totals();
                        let href = format!("/history?policy={}", encode(&p.policy));
                        let seconds = p.busy.len();
                        view! { <tr>
                            <td data-label="Policy"><a href=href>{p.policy}</a></td>
                            <td data-label="allowed" class="num">{a}</td>
                            <td data-label="denied" class="num">{d}</td>
                            <td data-label="busy seconds" class="num">{seconds}</td>
                        </tr> }
                    }).collect_view()}
                </tbody>
            </table>
        });
        let idle_count = idle.len();
        let folded = (idle_count > 0).then(|| view! {
            <details class="idle" data-testid="idle-policies">
                <summary>{format!("{idle_count} idle {}", if idle_count == 1 { "policy" } else { "policies" })}</summary>
                <p class="names">
                    {idle.into_iter().map(|p| {
                        let href = format!("/history?policy={}", encode(&p.policy));
                        view! { <a href=href>{p.policy}</a>" " }
                    }).collect_view()}
                </p>
            </details>
        });
        view! { {charts} {rows} {folded} }.into_any()
    };
    let scope = move || {
        let v = view.get();
        if v.filter.is_empty() {
            "every policy".to_owned()
        } else {
            format!("policies matching “{}”", v.filter)
        }
    };
    view! {
        <StatusStrip data=data/>
        <div class="grid">
            <section class="card wide" aria-labelledby="rates-heading">
                <h2 id="rates-heading">"Checks per second, last minute"</h2>
                <p class="muted legend"><span class="swatch allowed"></span>"allowed "<span class="swatch denied"></span>"denied"</p>
                {policies}
            </section>
            <section class="card wide" aria-labelledby="throttled-heading">
                <h2 id="throttled-heading">"Throttled now"</h2>
                <p class="muted">{move || format!("Most denied in the last 5 minutes, {}", scope())}</p>
                {move || throttled_table(&data.get())}
                <ShowAll view=view/>
            </section>
            <section class="card" aria-labelledby="near-heading">
                <h2 id="near-heading">"Near their limit"</h2>
                <p class="muted">{move || format!("80 % or more of a limit used in the last minute, {}", scope())}</p>
                {move || ranked_table(data.get().near, "of limit", "near", "Nobody is close to a limit.")}
            </section>
            <section class="card" aria-labelledby="redis-heading">
                <h2 id="redis-heading">"Redis"</h2>
                {move || {
                    let d = data.get();
                    let s = d.redis;
                    if s.up {
                        view! {
                            <dl class="facts" data-testid="redis-status">
                                <dt>"Status"</dt>
                                <dd><span class="badge ok">"up"</span></dd>
                                <dt>"Server clock"</dt>
                                <dd data-testid="redis-clock">{s.server_time_ms.map(clock)}</dd>
                                <dt>"Script round trip"</dt>
                                <dd>{s.round_trip_us.map(|us| format!("{:.2} ms", us as f64 / 1000.0))}</dd>
                                <dt>"Keys"</dt>
                                <dd>{d.keys}</dd>
                                <dt>"Gathered in"</dt>
                                <dd>{format!("{:.1} ms", d.gathered_us as f64 / 1000.0)}</dd>
                            </dl>
                        }.into_any()
                    } else {
                        view! {
                            <p data-testid="redis-status"><span class="badge bad">"down"</span>
                                " Redis did not answer the health script."</p>
                        }.into_any()
                    }
                }}
            </section>
        </div>
    }
}

/// "Show all" (the top 100) or "Show the top 10", keeping the filter.
#[component]
fn ShowAll(view: Memo<View>) -> impl IntoView {
    move || {
        let v = view.get();
        let other = View {
            all: !v.all,
            ..v.clone()
        };
        let q = other.query();
        let href = if q.is_empty() {
            "/".to_owned()
        } else {
            format!("/?{q}")
        };
        let text = if v.all {
            "Show the top 10"
        } else {
            "Show all (top 100)"
        };
        view! { <p><a href=href data-testid="show-all">{text}</a></p> }
    }
}

/// The first thing on the overview: is anything wrong? Each figure turns amber or red when
/// it should worry someone, and links to where to look.
#[component]
fn StatusStrip(data: Signal<OverviewData>) -> impl IntoView {
    move || {
        let d = data.get();
        let last_full = CHART_SECONDS - 2;
        let (mut per_second, mut allowed, mut denied) = (0u64, 0u64, 0u64);
        for p in &d.policies {
            for (i, a, x) in &p.busy {
                allowed += a;
                denied += x;
                if usize::from(*i) == last_full {
                    per_second += a + x;
                }
            }
        }
        let deny_pct = (denied * 1000)
            .checked_div(allowed + denied)
            .map_or(0.0, |permille| permille as f64 / 10.0);
        let deny_level = if deny_pct >= 25.0 {
            "bad"
        } else if deny_pct >= 5.0 {
            "warn"
        } else {
            "ok"
        };
        let degraded_level = if d.degraded_last_hour > 0 {
            "bad"
        } else {
            "ok"
        };
        let firing = d.alerts_firing.len();
        let alerts_level = if firing > 0 { "bad" } else { "ok" };
        let redis_level = if d.redis.up { "ok" } else { "bad" };
        let redis_text = if d.redis.up {
            d.redis.round_trip_us.map_or("up".to_owned(), |us| {
                format!("up · {:.1} ms", us as f64 / 1000.0)
            })
        } else {
            "down".to_owned()
        };
        let firing_text = if firing == 0 {
            "none".to_owned()
        } else {
            d.alerts_firing.join(", ")
        };
        view! {
            <ul class="status-strip" aria-label="Status" data-testid="status-strip">
                <li class="ok"><a href="#rates-heading">
                    <span class="what">"Checks"</span>
                    <strong data-testid="status-rate">{format!("{per_second}/s")}</strong>
                </a></li>
                <li class=deny_level><a href="#throttled-heading">
                    <span class="what">"Denied, last minute"</span>
                    <strong data-testid="status-deny">{format!("{deny_pct:.1} %")}</strong>
                </a></li>
                <li class=degraded_level><a href="/history?range=1h">
                    <span class="what">"Answered without Redis, last hour"</span>
                    <strong data-testid="status-degraded">{d.degraded_last_hour}</strong>
                </a></li>
                <li class=alerts_level><a href="/alerts">
                    <span class="what">"Alerts firing"</span>
                    <strong data-testid="status-alerts">{firing_text}</strong>
                </a></li>
                {unused_item(&d.unused_last_hour)}
                <li class=redis_level><a href="#redis-heading">
                    <span class="what">"Redis"</span>
                    <strong data-testid="status-redis">{redis_text}</strong>
                </a></li>
            </ul>
        }
    }
}

/// The status strip's item for checks that sent dimensions no rule counts, when there were
/// any in the last hour: how many, and a link to the policy with most.
fn unused_item(unused: &[(String, u64)]) -> Option<impl IntoView + use<>> {
    let (worst, _) = unused.first()?;
    let total: u64 = unused.iter().map(|(_, n)| n).sum();
    let href = format!(
        "/policy?name={}#unused",
        crate::domain::percent_encode(worst)
    );
    let names: Vec<&str> = unused.iter().map(|(p, _)| p.as_str()).collect();
    Some(view! {
        <li class="warn"><a href=href title=format!("policies: {}", names.join(", "))>
            <span class="what">"Sent a dimension no rule counts, last hour"</span>
            <strong data-testid="status-unused">{match unused {
                [(_, n)] => format!("{n} in {worst}"),
                [(_, n), ..] => format!("{total} ({n} in {worst}, …)"),
                [] => String::new(),
            }}</strong>
        </a></li>
    })
}

/// `then` as "12 s ago" from `now_ms`.
fn ago(now_ms: i64, then: i64) -> String {
    format!(
        "{} ago",
        crate::domain::time::spoken_duration(now_ms - then)
    )
}

/// When the next request passes, read at `now_ms`: the instant.
fn next_request_text(t: &Throttle, now_ms: i64) -> String {
    match (t.until_ms, t.blocked_at(now_ms)) {
        (Some(until), true) => format!("passes in {} s", (until - now_ms + 999) / 1000),
        (None, true) => "no end known".to_owned(),
        _ => "passes now".to_owned(),
    }
}

/// The state over time at `now_ms` (its badge's class, and in words): blocked while it is
/// denied at least half its checks, whatever the instant says.
fn state_text(t: &Throttle, now_ms: i64) -> (&'static str, String) {
    use crate::domain::throttle::StreakState;
    match t.streak {
        // No request since its last denial, and its limit still refuses: blocked, not cleared.
        Some(s) if s.state_at(now_ms) == StreakState::Over && t.blocked_at(now_ms) => (
            "badge bad",
            format!(
                "blocked: no request for {}; before that {}",
                crate::domain::time::spoken_duration(now_ms - s.last_ms),
                s.words(now_ms)
            ),
        ),
        Some(s) => match s.state_at(now_ms) {
            StreakState::Blocked => ("badge bad", format!("blocked: {}", s.words(now_ms))),
            StreakState::AtTimes => ("badge warn", format!("at times: {}", s.words(now_ms))),
            StreakState::Over => ("badge ok", format!("cleared: {}", s.words(now_ms))),
        },
        // Its streak not written yet (within a second of the first denial), or unreadable.
        None if t.blocked_at(now_ms) => ("badge bad", "blocked".to_owned()),
        None => ("badge ok", "passes now".to_owned()),
    }
}

fn throttled_table(d: &OverviewData) -> AnyView {
    if d.throttled.is_empty() {
        return view! { <p class="empty" data-testid="throttled">"Nobody is being throttled."</p> }
            .into_any();
    }
    // Redis's clock (the second the counters were read at), not the browser's.
    let now_ms = d.second * 1000 + 999;
    let link = |id: &str| {
        let href = format!("/identifiers?id={}", encode(id));
        view! { <a href=href>{crate::domain::envoy::readable(id).to_owned()}</a> }
    };
    view! {
        <table data-testid="throttled" class="cards-on-phone">
            <thead><tr>
                <th>"Denied through"</th><th>"Checked with"</th><th>"Policy › rule"</th>
                <th class="num">"denials, 5 min"</th><th>"state"</th><th>"since"</th><th>"last"</th><th>"next request"</th>
            </tr></thead>
            <tbody>
                {d.throttled.iter().map(|t| {
                    let others: Vec<_> = t.others().map(|o| view! { {link(o)}" " }).collect();
                    let rule = t.rule.clone().map_or(t.policy.clone(), |r| format!("{} › {r}", t.policy));
                    let (class, state) = state_text(t, now_ms);
                    let next = next_request_text(t, now_ms);
                    // As far back as the data goes: the streak's start, else this list's.
                    let since = t.streak.map(|s| s.since_ms).or(t.first_ms);
                    view! {
                        <tr>
                            <td data-label="Denied through">{link(&t.identifier)}</td>
                            <td data-label="Checked with">{if others.is_empty() { view! { <span class="muted">"—"</span> }.into_any() } else { others.collect_view().into_any() }}</td>
                            <td data-label="Policy › rule">{rule}</td>
                            <td data-label="denials, 5 min" class="num">{t.denials}</td>
                            <td data-label="state"><span class=class data-testid="state">{state}</span></td>
                            <td data-label="since">{since.map_or("—".to_owned(), |f| ago(now_ms, f))}</td>
                            <td data-label="last">{t.last_ms.map_or("—".to_owned(), |l| ago(now_ms, l))}</td>
                            <td data-label="next request">{next}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

fn ranked_table(
    rows: Vec<RankedRow>,
    what: &'static str,
    testid: &'static str,
    empty: &'static str,
) -> AnyView {
    let percent = what == "of limit";
    let rows = rows.into_iter().map(|r| super::widgets::IdentifierRow {
        value: if percent {
            format!("{} %", r.value)
        } else {
            r.value.to_string()
        },
        policy: r.policy,
        identifier: r.identifier,
    });
    super::widgets::identifier_table(rows.collect(), what, testid, empty)
}

/// Percent-encodes a query value.
pub fn encode(raw: &str) -> String {
    crate::domain::percent_encode(raw)
}

/// A stacked bar per second: allowed below, denied above. SVG attributes, no inline styles
/// (the CSP allows none).
#[component]
fn RateChart(rate: PolicyRate) -> impl IntoView {
    const W: f64 = 600.0;
    const H: f64 = 80.0;
    let n = CHART_SECONDS;
    let busiest = rate.busy.iter().map(|(_, a, d)| a + d).max().unwrap_or(0);
    let peak = busiest.max(1);
    let bar = W / n as f64;
    let (allowed, denied) = rate.totals();
    // The last full second (the current one is still counting).
    let (now_a, now_d) = rate
        .busy
        .iter()
        .find(|(i, _, _)| usize::from(*i) == CHART_SECONDS - 2)
        .map_or((0, 0), |(_, a, d)| (*a, *d));
    let summary = format!(
        "{}: {allowed} allowed and {denied} denied in the last minute; {now_a} allowed and {now_d} denied in the last full second",
        rate.policy
    );
    // Only seconds that saw checks are drawn.
    let bars = super::widgets::stacked_bars(
        rate.busy.iter().map(|(i, a, d)| (usize::from(*i), *a, *d)),
        bar,
        peak,
        H,
    );
    let policy = rate.policy.clone();
    let label = summary.clone();
    view! {
        <figure class="chart" data-testid=format!("rate-{policy}")>
            <figcaption>
                <strong>{rate.policy.clone()}</strong>
                {rate.shadow.then(|| view! { " " <span class="badge warn">"shadow"</span> })}
                <span class="muted">{format!(" · {now_a}/s allowed · {now_d}/s denied · peak {busiest}/s · ")}</span>
                <a href=format!("/history?policy={}", encode(&policy))>"history"</a>
            </figcaption>
            <div class="plot">
                <div class="y-axis" aria-hidden="true"><span>{format!("{peak}/s")}</span><span>{format!("{}/s", peak / 2)}</span><span>"0"</span></div>
                <svg viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none" role="img" aria-label=label>
                    <title>{summary}</title>
                    <line class="tick" x1="0" x2=W.to_string() y1=format!("{:.1}", H / 2.0) y2=format!("{:.1}", H / 2.0)/>
                    {bars}
                </svg>
            </div>
            <div class="x-axis" aria-hidden="true"><span>"60 s ago"</span><span>"30 s ago"</span><span>"now"</span></div>
        </figure>
    }
}

#[cfg(test)]
mod tests;
