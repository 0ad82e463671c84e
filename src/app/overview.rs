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
use serde::{Deserialize, Serialize};

use super::session::error_message;

/// Redis as the server sees it at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisReport {
    /// Whether Redis answered the health script.
    pub up: bool,
    /// Redis server clock, milliseconds since the epoch, when it answered.
    pub server_time_ms: Option<i64>,
    /// Round trip of the health script, microseconds.
    pub round_trip_us: Option<u64>,
}

/// Seconds of a minute that saw checks: (index, allowed, denied).
pub type Seconds = Vec<(u8, u64, u64)>;

/// One policy's last minute.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRate {
    pub policy: String,
    pub shadow: bool,
    /// The seconds of the last minute that saw checks: (index, allowed, denied), index 0
    /// the oldest second, `CHART_SECONDS - 1` the current one. Empty: the policy is idle.
    pub busy: Vec<(u8, u64, u64)>,
}

impl PolicyRate {
    /// (allowed, denied) over the minute.
    pub fn totals(&self) -> (u64, u64) {
        self.busy
            .iter()
            .fold((0, 0), |(a, d), (_, x, y)| (a + x, d + y))
    }

    fn dense(&self) -> Vec<(u64, u64)> {
        let mut out = vec![(0, 0); CHART_SECONDS];
        for (i, a, d) in &self.busy {
            if let Some(slot) = out.get_mut(usize::from(*i)) {
                *slot = (*a, *d);
            }
        }
        out
    }

    /// The same minute seen `k` seconds later: older seconds drop out.
    fn shifted(&self, k: i64) -> Vec<(u8, u64, u64)> {
        self.busy
            .iter()
            .filter_map(|(i, a, d)| {
                let j = i64::from(*i) - k;
                (0..CHART_SECONDS as i64)
                    .contains(&j)
                    .then_some((j as u8, *a, *d))
            })
            .collect()
    }
}

/// What changed since the stream's last event: the live overview sends this every second
/// instead of the whole minute of every policy (an idle policy costs nothing; a busy one
/// its last second or two).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverviewDelta {
    /// The whole state follows: forget what was there.
    pub full: bool,
    pub second: i64,
    pub redis: RedisReport,
    pub keys: u64,
    pub gathered_us: u64,
    pub throttled: Option<Vec<RankedRow>>,
    pub near: Option<Vec<RankedRow>>,
    /// The policies (name, shadow mode) in order, when they changed.
    pub names: Option<Vec<(String, bool)>>,
    /// Per policy, the seconds that differ from the last event's minute moved on to this
    /// second: (index, allowed, denied), zeros included.
    pub changed: Vec<(String, Seconds)>,
}

impl OverviewDelta {
    /// What turns `old` (the last event's state; `None` for the first) into `new`.
    pub fn between(old: Option<&OverviewData>, new: &OverviewData) -> Self {
        let names: Vec<(String, bool)> = new
            .policies
            .iter()
            .map(|p| (p.policy.clone(), p.shadow))
            .collect();
        let mut delta = OverviewDelta {
            full: old.is_none(),
            second: new.second,
            redis: new.redis.clone(),
            keys: new.keys,
            gathered_us: new.gathered_us,
            ..OverviewDelta::default()
        };
        let Some(old) = old else {
            delta.names = Some(names);
            delta.throttled = Some(new.throttled.clone());
            delta.near = Some(new.near.clone());
            delta.changed = new
                .policies
                .iter()
                .filter(|p| !p.busy.is_empty())
                .map(|p| (p.policy.clone(), p.busy.clone()))
                .collect();
            return delta;
        };
        let old_names: Vec<(&str, bool)> = old
            .policies
            .iter()
            .map(|p| (p.policy.as_str(), p.shadow))
            .collect();
        if old_names.iter().ne(names
            .iter()
            .map(|(n, s)| (n.as_str(), *s))
            .collect::<Vec<_>>()
            .iter())
        {
            delta.names = Some(names);
        }
        if old.throttled != new.throttled {
            delta.throttled = Some(new.throttled.clone());
        }
        if old.near != new.near {
            delta.near = Some(new.near.clone());
        }
        let k = new.second - old.second;
        for p in &new.policies {
            let before = old
                .policies
                .iter()
                .find(|o| o.policy == p.policy)
                .map(|o| PolicyRate {
                    busy: o.shifted(k),
                    ..PolicyRate::default()
                })
                .unwrap_or_default();
            let (was, is) = (before.dense(), p.dense());
            let diff: Vec<(u8, u64, u64)> = (0..CHART_SECONDS)
                .filter(|&i| was[i] != is[i])
                .map(|i| (i as u8, is[i].0, is[i].1))
                .collect();
            if !diff.is_empty() {
                delta.changed.push((p.policy.clone(), diff));
            }
        }
        delta
    }
}

impl OverviewData {
    /// Applies one event of the live stream.
    pub fn apply(&mut self, delta: OverviewDelta) {
        if delta.full {
            for p in &mut self.policies {
                p.busy.clear();
            }
        } else {
            let k = delta.second - self.second;
            for p in &mut self.policies {
                p.busy = p.shifted(k);
            }
        }
        self.second = delta.second;
        self.redis = delta.redis;
        self.keys = delta.keys;
        self.gathered_us = delta.gathered_us;
        if let Some(t) = delta.throttled {
            self.throttled = t;
        }
        if let Some(n) = delta.near {
            self.near = n;
        }
        if let Some(names) = delta.names {
            let mut old = std::mem::take(&mut self.policies);
            self.policies = names
                .into_iter()
                .map(|(policy, shadow)| {
                    let busy = old
                        .iter_mut()
                        .find(|p| p.policy == policy)
                        .map(|p| std::mem::take(&mut p.busy))
                        .unwrap_or_default();
                    PolicyRate {
                        policy,
                        shadow,
                        busy,
                    }
                })
                .collect();
        }
        for (policy, seconds) in delta.changed {
            if let Some(p) = self.policies.iter_mut().find(|p| p.policy == policy) {
                let mut dense = p.dense();
                for (i, a, d) in seconds {
                    if let Some(slot) = dense.get_mut(usize::from(i)) {
                        *slot = (a, d);
                    }
                }
                p.busy = sparse(&dense);
            }
        }
    }
}

/// The non-zero seconds of a dense minute.
fn sparse(dense: &[(u64, u64)]) -> Vec<(u8, u64, u64)> {
    dense
        .iter()
        .enumerate()
        .filter(|(_, (a, d))| a + d > 0)
        .map(|(i, (a, d))| (i as u8, *a, *d))
        .collect()
}

/// An identifier on the overview.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankedRow {
    pub policy: String,
    pub identifier: String,
    pub value: u64,
}

/// Everything the overview shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverviewData {
    /// Redis's second the minute ends at (its current second).
    pub second: i64,
    pub redis: RedisReport,
    pub policies: Vec<PolicyRate>,
    /// Most denied over the last 5 minutes.
    pub throttled: Vec<RankedRow>,
    /// At 80 % or more of a limit in the last minute or two.
    pub near: Vec<RankedRow>,
    /// Keys in Redis (DBSIZE), for scale.
    pub keys: u64,
    /// Server time spent gathering this, µs.
    pub gathered_us: u64,
}

/// Seconds of history the chart shows.
pub const CHART_SECONDS: usize = 60;

/// Gathers the overview (server only): the health probe and the counters, shaped for the
/// page.
#[cfg(feature = "ssr")]
pub async fn gather(state: &crate::state::AppState) -> OverviewData {
    let started = std::time::Instant::now();
    let facts = state.service().overview(CHART_SECONDS as i64, 10).await;
    let Ok(health) = facts.redis else {
        return OverviewData::default();
    };
    let rows = |ranked: Vec<crate::service::Ranked>| {
        ranked
            .into_iter()
            .map(|r| RankedRow {
                policy: r.policy,
                identifier: r.identifier,
                value: r.value,
            })
            .collect()
    };
    let (second, policies) = facts.rates.map_or((0, Vec::new()), |(now, series)| {
        let rates = series
            .iter()
            .map(|(p, s)| PolicyRate {
                policy: p.name.to_string(),
                shadow: p.mode == crate::domain::Mode::Shadow,
                busy: sparse(&s.iter().map(|c| (c.allowed, c.denied)).collect::<Vec<_>>()),
            })
            .collect();
        (now, rates)
    });
    OverviewData {
        second,
        redis: RedisReport {
            up: true,
            server_time_ms: Some(health.server_time_us / 1000),
            round_trip_us: Some(health.round_trip_us),
        },
        policies,
        throttled: rows(facts.throttled),
        near: rows(facts.near),
        keys: facts.keys,
        gathered_us: started.elapsed().as_micros() as u64,
    }
}

/// The overview, for the first render (and for anyone polling).
#[server(prefix = "/fn", endpoint = "overview")]
pub async fn overview() -> Result<OverviewData, AppError> {
    crate::app::guard::require(crate::domain::people::Action::View)?;
    Ok(gather(&expect_context::<crate::state::AppState>()).await)
}

/// Reads Redis's status on the server by running the health script.
#[server(prefix = "/fn", endpoint = "redis_status")]
pub async fn redis_status() -> Result<RedisReport, AppError> {
    crate::app::guard::require(crate::domain::people::Action::View)?;
    Ok(gather(&expect_context::<crate::state::AppState>())
        .await
        .redis)
}

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

#[component]
pub fn OverviewPage() -> impl IntoView {
    let query = leptos_router::hooks::use_query_map();
    let range = move || query.with(|q| q.get("range").unwrap_or_default());
    let filter = filter_text();
    let initial = Resource::new(|| (), |_| overview());
    let live = RwSignal::new(None::<OverviewData>);
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| {
        if !matches!(range().as_str(), "" | "live") {
            return;
        }
        super::follow_events("/events/overview", move |delta: OverviewDelta| {
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
        })
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
            <leptos_router::components::Form method="GET" action="/" attr:role="search" attr:class="filter">
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
                            Ok(first) => view! {
                                <Live data=Signal::derive(move || live.get().unwrap_or_else(|| first.clone()))/>
                            }.into_any(),
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

#[component]
fn Live(data: Signal<OverviewData>) -> impl IntoView {
    let filter = filter_text();
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
        let rest = busy.split_off(busy.len().min(CHARTED));
        let charts = busy
            .into_iter()
            .map(|p| view! { <RateChart rate=p/> })
            .collect_view();
        let rows = (!rest.is_empty()).then(|| view! {
            <table data-testid="more-busy">
                <thead><tr><th>"More busy policies"</th><th class="num">"allowed"</th><th class="num">"denied"</th></tr></thead>
                <tbody>
                    {rest.into_iter().map(|p| {
                        let (a, d) = p.totals();
                        let href = format!("/history?policy={}", encode(&p.policy));
                        view! { <tr><td><a href=href>{p.policy}</a></td><td class="num">{a}</td><td class="num">{d}</td></tr> }
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
    view! {
        <div class="grid">
            <section class="card wide" aria-labelledby="rates-heading">
                <h2 id="rates-heading">"Checks per second, last minute"</h2>
                <p class="muted legend"><span class="swatch allowed"></span>"allowed "<span class="swatch denied"></span>"denied"</p>
                {policies}
            </section>
            <section class="card" aria-labelledby="throttled-heading">
                <h2 id="throttled-heading">"Throttled now"</h2>
                <p class="muted">"Most denied in the last 5 minutes"</p>
                {move || ranked_table(data.get().throttled, "denials", "throttled", "Nobody is being throttled.")}
            </section>
            <section class="card" aria-labelledby="near-heading">
                <h2 id="near-heading">"Near their limit"</h2>
                <p class="muted">"80 % or more of a limit used in the last minute"</p>
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

fn ranked_table(
    rows: Vec<RankedRow>,
    what: &'static str,
    testid: &'static str,
    empty: &'static str,
) -> AnyView {
    if rows.is_empty() {
        return view! { <p class="empty" data-testid=testid>{empty}</p> }.into_any();
    }
    let percent = what == "of limit";
    view! {
        <table data-testid=testid>
            <thead><tr><th>"Identifier"</th><th>"Policy"</th><th class="num">{what}</th></tr></thead>
            <tbody>
                {rows.into_iter().map(|r| {
                    let href = format!("/identifiers?id={}", encode(&r.identifier));
                    let value = if percent { format!("{} %", r.value) } else { r.value.to_string() };
                    view! {
                        <tr>
                            <td><a href=href>{crate::domain::envoy::readable(&r.identifier).to_owned()}</a></td>
                            <td>{r.policy}</td>
                            <td class="num">{value}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
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
    let bars = rate
        .busy
        .iter()
        .map(|(i, a, d)| {
            let x = f64::from(*i) * bar;
            let ha = *a as f64 / peak as f64 * H;
            let hd = *d as f64 / peak as f64 * H;
            view! {
                <rect class="allowed" x=format!("{x:.1}") y=format!("{:.1}", H - ha) width=format!("{:.1}", bar * 0.85) height=format!("{ha:.1}")/>
                <rect class="denied" x=format!("{x:.1}") y=format!("{:.1}", H - ha - hd) width=format!("{:.1}", bar * 0.85) height=format!("{hd:.1}")/>
            }
        })
        .collect_view();
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
            <svg viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none" role="img" aria-label=label>
                <title>{summary}</title>
                {bars}
            </svg>
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn data(second: i64, policies: Vec<(&str, Seconds)>) -> OverviewData {
        OverviewData {
            second,
            policies: policies
                .into_iter()
                .map(|(p, busy)| PolicyRate {
                    policy: p.into(),
                    shadow: false,
                    busy,
                })
                .collect(),
            ..OverviewData::default()
        }
    }

    #[test]
    fn an_idle_policy_costs_nothing_and_a_busy_one_its_new_seconds() {
        let mut policies: Vec<(&str, Seconds)> = vec![("busy", vec![(58, 5, 1), (59, 2, 0)])];
        let names: Vec<String> = (0..199).map(|i| format!("idle-{i}")).collect();
        policies.extend(names.iter().map(|n| (n.as_str(), Vec::new())));
        let a = data(1000, policies.clone());
        // A second later: the busy policy's seconds moved on by one, and it got a new one.
        policies[0].1 = vec![(57, 5, 1), (58, 3, 0), (59, 1, 0)];
        let b = data(1001, policies);
        let delta = OverviewDelta::between(Some(&a), &b);
        assert!(delta.names.is_none());
        assert_eq!(
            delta.changed,
            vec![("busy".to_owned(), vec![(58, 3, 0), (59, 1, 0)])]
        );
        let bytes = serde_json::to_string(&delta).unwrap().len();
        assert!(bytes < 300, "{bytes} bytes for 200 policies, one busy");
        let mut client = a.clone();
        client.apply(delta);
        assert_eq!(client, b);
    }

    fn minute() -> impl Strategy<Value = Vec<(u8, u64, u64)>> {
        proptest::collection::btree_map(0u8..60, (0u64..5, 0u64..5), 0..8).prop_map(|m| {
            m.into_iter()
                .filter(|(_, (a, d))| a + d > 0)
                .map(|(i, (a, d))| (i, a, d))
                .collect()
        })
    }

    proptest! {
        /// Whatever the two states (policies added, removed, renamed, seconds apart or
        /// backwards), applying the delta to the old state gives the new one, and a first
        /// event replaces whatever the page had.
        #[test]
        fn applying_the_delta_gives_the_new_state(
            old in proptest::collection::vec(("[a-d]", minute()), 0..5),
            new in proptest::collection::vec(("[a-d]", minute()), 0..5),
            s0 in 0i64..200,
            step in -3i64..70,
            throttled in proptest::bool::ANY,
        ) {
            let dedup = |v: Vec<(String, Seconds)>| {
                let mut seen = std::collections::HashSet::new();
                v.into_iter().filter(|(n, _)| seen.insert(n.clone())).collect::<Vec<_>>()
            };
            let (old, new) = (dedup(old), dedup(new));
            let mut a = data(s0, old.iter().map(|(n, b)| (n.as_str(), b.clone())).collect());
            let mut b = data(s0 + step, new.iter().map(|(n, b)| (n.as_str(), b.clone())).collect());
            if throttled {
                b.throttled = vec![RankedRow { policy: "a".into(), identifier: "user=1".into(), value: 3 }];
            } else {
                a.near = vec![RankedRow { policy: "b".into(), identifier: "user=2".into(), value: 90 }];
            }
            let mut client = a.clone();
            client.apply(OverviewDelta::between(Some(&a), &b));
            prop_assert_eq!(&client, &b);
            let mut stale = a.clone();
            stale.apply(OverviewDelta::between(None, &b));
            prop_assert_eq!(&stale, &b);
        }
    }
}
