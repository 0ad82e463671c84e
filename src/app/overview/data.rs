//! What the overview shows and how it travels: the page's data, the deltas the event
//! stream sends each second, and the server functions that gather them.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use super::*;

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
    #[serde(default)]
    pub unused_last_hour: Vec<(String, u64)>,
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
            unused_last_hour: new.unused_last_hour.clone(),
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
        self.unused_last_hour = delta.unused_last_hour;
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
pub(super) fn sparse(dense: &[(u64, u64)]) -> Vec<(u8, u64, u64)> {
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
    /// Checks over the last hour that sent dimensions no rule of their policy counts, by
    /// policy, most first (at most 5 policies).
    #[serde(default)]
    pub unused_last_hour: Vec<(String, u64)>,
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
        unused_last_hour: facts.unused_last_hour.into_iter().take(5).collect(),
        // `rule|subject` (the subject `policy|identifier`, or a policy) as a person reads it.
        alerts_firing: facts
            .alerts_firing
            .iter()
            .map(|key| match key.split_once('|') {
                Some((rule, subject)) if !subject.is_empty() => {
                    format!("{rule} ({})", subject.replace('|', " › "))
                }
                _ => key.trim_end_matches('|').to_owned(),
            })
            .collect(),
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
