//! The overview: checks per second per policy (allowed and denied), the identifiers
//! throttled now and those near a limit, and Redis's health. Rendered complete on the server
//! (so it works without JavaScript); hydrated, it follows a server-sent event stream
//! (`/events/overview`) and updates every second without reloading.
//!
//! Everything comes from the live counters (`store::stats`): a few keys, never a scan, so it
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

/// One policy's last minute.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRate {
    pub policy: String,
    pub shadow: bool,
    /// (allowed, denied) per second, oldest first, the last one is the current second.
    pub seconds: Vec<(u64, u64)>,
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

/// Gathers the overview (server only): the health probe and the counters.
#[cfg(feature = "ssr")]
pub async fn gather(state: &crate::state::AppState) -> OverviewData {
    let started = std::time::Instant::now();
    let store = &state.store;
    let redis = match store.health().await {
        Ok(h) => RedisReport {
            up: true,
            server_time_ms: Some(h.server_time_us / 1000),
            round_trip_us: Some(h.round_trip_us),
        },
        Err(error) => {
            tracing::warn!(%error, "redis health probe failed");
            RedisReport::default()
        }
    };
    let mut data = OverviewData {
        redis,
        ..OverviewData::default()
    };
    if !data.redis.up {
        return data;
    }
    let policies = state.policies.all();
    let names: Vec<String> = policies.iter().map(|p| p.name.to_string()).collect();
    let rates = store.policy_rates(&names, CHART_SECONDS as i64);
    let throttled = store.top_denied(5, 10);
    let near = store.near_limit(10);
    let keys = store.key_count();
    let (rates, throttled, near, keys) = tokio::join!(rates, throttled, near, keys);
    if let Ok((_, series)) = rates {
        data.policies = policies
            .iter()
            .zip(series)
            .map(|(p, s)| PolicyRate {
                policy: p.name.to_string(),
                shadow: p.mode == crate::domain::Mode::Shadow,
                seconds: s.iter().map(|c| (c.allowed, c.denied)).collect(),
            })
            .collect();
    }
    let rows = |r: Vec<crate::store::stats::Ranked>| {
        r.into_iter()
            .map(|r| RankedRow {
                policy: r.policy,
                identifier: r.identifier,
                value: r.value,
            })
            .collect()
    };
    data.throttled = throttled.map(rows).unwrap_or_default();
    data.near = near.map(rows).unwrap_or_default();
    data.keys = keys.unwrap_or(0);
    data.gathered_us = started.elapsed().as_micros() as u64;
    data
}

/// The overview, for the first render (and for anyone polling).
#[server(prefix = "/fn", endpoint = "overview")]
pub async fn overview() -> Result<OverviewData, AppError> {
    crate::auth::guard::require(crate::domain::people::Action::View)?;
    Ok(gather(&expect_context::<crate::state::AppState>()).await)
}

/// Reads Redis's status on the server by running the health script.
#[server(prefix = "/fn", endpoint = "redis_status")]
pub async fn redis_status() -> Result<RedisReport, AppError> {
    crate::auth::guard::require(crate::domain::people::Action::View)?;
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

#[component]
pub fn OverviewPage() -> impl IntoView {
    let initial = Resource::new(|| (), |_| overview());
    let live = RwSignal::new(None::<OverviewData>);
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| {
        super::follow_events("/events/overview", move |data: OverviewData| {
            live.set(Some(data))
        })
    });

    view! {
        <Title text="Overview"/>
        <h1>"Overview"</h1>
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
    }
}

#[component]
fn Live(data: Signal<OverviewData>) -> impl IntoView {
    view! {
        <div class="grid">
            <section class="card wide" aria-labelledby="rates-heading">
                <h2 id="rates-heading">"Checks per second, last minute"</h2>
                <p class="muted legend"><span class="swatch allowed"></span>"allowed "<span class="swatch denied"></span>"denied"</p>
                {move || {
                    let d = data.get();
                    if d.policies.is_empty() {
                        view! { <p class="empty">"No policies yet."</p> }.into_any()
                    } else {
                        d.policies.into_iter().map(|p| view! { <RateChart rate=p/> }).collect_view().into_any()
                    }
                }}
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
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A stacked bar per second: allowed below, denied above. SVG attributes, no inline styles
/// (the CSP allows none).
#[component]
fn RateChart(rate: PolicyRate) -> impl IntoView {
    const W: f64 = 600.0;
    const H: f64 = 80.0;
    let n = rate.seconds.len().max(1);
    let busiest = rate.seconds.iter().map(|(a, d)| a + d).max().unwrap_or(0);
    let peak = busiest.max(1);
    let bar = W / n as f64;
    let (allowed, denied): (u64, u64) = rate
        .seconds
        .iter()
        .fold((0, 0), |(a, d), (x, y)| (a + x, d + y));
    let (now_a, now_d) = rate.seconds.iter().rev().nth(1).copied().unwrap_or((0, 0));
    let summary = format!(
        "{}: {allowed} allowed and {denied} denied in the last minute; {now_a} allowed and {now_d} denied in the last full second",
        rate.policy
    );
    let bars = rate
        .seconds
        .iter()
        .enumerate()
        .map(|(i, (a, d))| {
            let x = i as f64 * bar;
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
