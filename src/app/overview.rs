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
pub use crate::domain::throttle::Throttle;

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
    pub degraded_last_hour: u64,
    pub alerts_firing: Vec<String>,
    pub throttled: Option<Vec<Throttle>>,
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
            degraded_last_hour: new.degraded_last_hour,
            alerts_firing: new.alerts_firing.clone(),
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
        self.degraded_last_hour = delta.degraded_last_hour;
        self.alerts_firing = delta.alerts_firing;
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
    /// Most denied over the last 5 minutes, with what each denial was.
    pub throttled: Vec<Throttle>,
    /// At 80 % or more of a limit in the last minute or two.
    pub near: Vec<RankedRow>,
    /// Keys in Redis (DBSIZE), for scale.
    pub keys: u64,
    /// Server time spent gathering this, µs.
    pub gathered_us: u64,
    /// Checks answered without Redis in the last hour (every instance).
    pub degraded_last_hour: u64,
    /// Alert rules firing now.
    pub alerts_firing: Vec<String>,
}

/// What the overview's tables show: the policies the filter box picks (a part of the name),
/// and the top 10 of each table or, with `all`, the top 100.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub filter: String,
    pub all: bool,
}

impl View {
    /// Rows of each table.
    pub fn top(&self) -> usize {
        if self.all { 100 } else { 10 }
    }

    /// The query string that shows this view (without `?`; empty for the default).
    pub fn query(&self) -> String {
        let mut parts = Vec::new();
        if !self.filter.is_empty() {
            parts.push(format!("filter={}", encode(&self.filter)));
        }
        if self.all {
            parts.push("all=1".to_owned());
        }
        parts.join("&")
    }
}

/// Seconds of history the chart shows.
pub const CHART_SECONDS: usize = 60;

/// Gathers the overview (server only) for `view`: the health probe and the counters,
/// shaped for the page.
#[cfg(feature = "ssr")]
pub async fn gather(state: &crate::state::AppState, view: &View) -> OverviewData {
    let started = std::time::Instant::now();
    let filter = view.filter.clone();
    let only = move |p: &str| passes(p, &filter);
    let facts = state
        .service()
        .overview(
            CHART_SECONDS as i64,
            view.top(),
            (!view.filter.is_empty()).then_some(&only as &(dyn Fn(&str) -> bool + Sync)),
        )
        .await;
    let Ok(health) = facts.redis else {
        return OverviewData::default();
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
        throttled: facts.throttled,
        near: facts
            .near
            .into_iter()
            .map(|r| RankedRow {
                policy: r.policy,
                identifier: r.identifier,
                value: r.value,
            })
            .collect(),
        keys: facts.keys,
        gathered_us: started.elapsed().as_micros() as u64,
        degraded_last_hour: facts.degraded_last_hour,
        alerts_firing: facts.alerts_firing,
    }
}

/// The overview, for the first render (and for anyone polling).
#[server(prefix = "/fn", endpoint = "overview")]
pub async fn overview(
    #[server(default)] filter: String,
    #[server(default)] all: bool,
) -> Result<OverviewData, AppError> {
    crate::app::guard::require(crate::domain::people::Action::View)?;
    Ok(gather(
        &expect_context::<crate::state::AppState>(),
        &View { filter, all },
    )
    .await)
}

/// Reads Redis's status on the server by running the health script.
#[server(prefix = "/fn", endpoint = "redis_status")]
pub async fn redis_status() -> Result<RedisReport, AppError> {
    crate::app::guard::require(crate::domain::people::Action::View)?;
    Ok(gather(
        &expect_context::<crate::state::AppState>(),
        &View::default(),
    )
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
                <li class=redis_level><a href="#redis-heading">
                    <span class="what">"Redis"</span>
                    <strong data-testid="status-redis">{redis_text}</strong>
                </a></li>
            </ul>
        }
    }
}

/// `then` as "12 s ago" from `now_ms`.
fn ago(now_ms: i64, then: i64) -> String {
    let s = ((now_ms - then).max(0) + 500) / 1000;
    if s < 90 {
        format!("{s} s ago")
    } else {
        format!("{} min ago", (s + 30) / 60)
    }
}

/// Whether and until when a throttled identifier is blocked, read at `now_ms`.
fn blocked_text(t: &Throttle, now_ms: i64) -> String {
    match (t.until_ms, t.blocked_at(now_ms)) {
        (Some(until), true) => {
            format!("blocked {} s more", (until - now_ms + 999) / 1000)
        }
        (None, true) => "blocked (no end known)".to_owned(),
        _ => "passes now".to_owned(),
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
                <th class="num">"denials"</th><th>"since"</th><th>"last"</th><th>"blocked"</th>
            </tr></thead>
            <tbody>
                {d.throttled.iter().map(|t| {
                    let others: Vec<_> = t.others().map(|o| view! { {link(o)}" " }).collect();
                    let rule = t.rule.clone().map_or(t.policy.clone(), |r| format!("{} › {r}", t.policy));
                    let blocked = blocked_text(t, now_ms);
                    let is_blocked = t.blocked_at(now_ms);
                    view! {
                        <tr>
                            <td data-label="Denied through">{link(&t.identifier)}</td>
                            <td data-label="Checked with">{if others.is_empty() { view! { <span class="muted">"—"</span> }.into_any() } else { others.collect_view().into_any() }}</td>
                            <td data-label="Policy › rule">{rule}</td>
                            <td data-label="denials" class="num">{t.denials}</td>
                            <td data-label="since">{t.first_ms.map_or("—".to_owned(), |f| ago(now_ms, f))}</td>
                            <td data-label="last">{t.last_ms.map_or("—".to_owned(), |l| ago(now_ms, l))}</td>
                            <td data-label="blocked"><span class=if is_blocked { "badge bad" } else { "badge ok" }>{blocked}</span></td>
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
