//! What the overview shows, gathered in one go: Redis's health, each policy's last minute,
//! the most throttled identifiers and those near a limit. Everything comes from the live
//! counters: a few keys, never a scan, so it costs the same with a million identifiers.

use std::sync::Arc;

use super::{RedisHealth, Service, StoreError};
use crate::{
    domain::{
        Policy,
        history::{ALL, Range},
        throttle::Throttle,
    },
    store::stats::{Ranked, SecondCount},
};

/// Policies a filtered overview reads each one's own list of the most denied for, at most;
/// past that it picks them out of the list of every policy.
const OWN_LISTS: usize = 25;

/// A policy and its last seconds, oldest first.
pub type PolicySeconds = (Arc<Policy>, Vec<SecondCount>);

/// The overview's facts, as the store gives them; the dashboard shapes them for its page.
pub struct OverviewFacts {
    /// `Err` when Redis did not answer its health probe (nothing else is read then).
    pub redis: Result<RedisHealth, StoreError>,
    /// The policies this instance holds, each with its last seconds (oldest first), ending
    /// at Redis's second `rates_until` (`None` when the counters could not be read).
    pub rates: Option<(i64, Vec<PolicySeconds>)>,
    /// Most denied over the last 5 minutes, with what each denial was.
    pub throttled: Vec<Throttle>,
    /// At 80 % or more of a limit in the last minute or two.
    pub near: Vec<Ranked>,
    /// Keys in Redis (DBSIZE), for scale.
    pub keys: u64,
    /// Checks answered without Redis (the failure mode) in the last hour, every instance.
    pub degraded_last_hour: u64,
    /// The alert rules firing now, by name.
    pub alerts_firing: Vec<String>,
    /// Checks over the last hour that sent dimensions no rule of their policy counts, by
    /// policy, most first (every instance).
    pub unused_last_hour: Vec<(String, u64)>,
}

impl Service {
    /// The overview's facts, over the last `seconds` seconds; `top` identifiers of each
    /// list, of the policies `only` picks (every one when `None`). The counters are read
    /// at once (one round trip each, together).
    pub async fn overview(
        &self,
        seconds: i64,
        top: usize,
        only: Option<&(dyn Fn(&str) -> bool + Sync)>,
    ) -> OverviewFacts {
        let redis = self.redis_health().await;
        // Said once per outage by the outage log (`alerts::RedisOutage`), not per view.
        if let Err(error) = &redis {
            tracing::debug!(%error, "redis health probe failed");
            return OverviewFacts {
                redis,
                rates: None,
                throttled: Vec::new(),
                near: Vec::new(),
                keys: 0,
                degraded_last_hour: 0,
                alerts_firing: Vec::new(),
                unused_last_hour: Vec::new(),
            };
        }
        let policies = self.policies.all();
        let names: Vec<String> = policies.iter().map(|p| p.name.to_string()).collect();
        let picked: Option<Vec<String>> =
            only.map(|f| names.iter().filter(|n| f(n)).cloned().collect());
        // A filter that picks a few policies reads their own lists; one that picks many,
        // more of the list of every policy.
        let (own, wide) = match &picked {
            Some(p) if p.len() <= OWN_LISTS => (Some(p.as_slice()), top),
            Some(_) => (None, top * 20),
            None => (None, top),
        };
        let keep = |p: &str| {
            picked
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == p))
        };
        let step = Range::Hour.default_step();
        let all = [ALL.to_owned()];
        let (rates, throttled, near, keys, degraded, firing, unused) = tokio::join!(
            self.store.policy_rates(&names, seconds),
            self.store.throttled(5, wide, own),
            self.store.near_limit(wide),
            self.store.key_count(),
            self.store
                .history_totals(&all, step, Range::Hour.periods(step, super::now_ms())),
            self.store.alert_firing(),
            self.store.unused_by_policy(),
        );
        let mut throttled = throttled.unwrap_or_default();
        throttled.retain(|t| keep(&t.policy));
        throttled.truncate(top);
        self.with_streaks(&mut throttled).await;
        let mut near = near.unwrap_or_default();
        near.retain(|r| keep(&r.policy));
        near.truncate(top);
        let mut alerts_firing: Vec<String> = firing.unwrap_or_default().into_keys().collect();
        alerts_firing.sort();
        OverviewFacts {
            redis,
            rates: rates
                .ok()
                .map(|(now, series)| (now, policies.into_iter().zip(series).collect())),
            throttled,
            near,
            keys: keys.unwrap_or(0),
            degraded_last_hour: degraded
                .ok()
                .and_then(|t| t.into_iter().next())
                .map_or(0, |c| c.degraded),
            alerts_firing,
            unused_last_hour: unused.unwrap_or_default(),
        }
    }
}

impl Service {
    /// Fills each row's streak of denials (left out when Redis cannot say).
    async fn with_streaks(&self, throttled: &mut [crate::domain::throttle::Throttle]) {
        let of: Vec<(&str, &str)> = throttled
            .iter()
            .map(|t| (t.policy.as_str(), t.identifier.as_str()))
            .collect();
        let streaks = match self.store.streaks(&of).await {
            Ok(s) => s,
            Err(error) => {
                tracing::debug!(%error, "could not read the streaks of denials");
                return;
            }
        };
        for (t, streak) in throttled.iter_mut().zip(streaks) {
            t.streak = streak;
        }
    }

    /// What `policy`'s checks sent over the last hour that nothing counted: dimensions no
    /// rule counts, and an Envoy domain's descriptors that found no limit, most first
    /// (either empty when it cannot be read).
    pub async fn what_nothing_counted(
        &self,
        policy: &Policy,
    ) -> (Vec<(String, u64)>, Vec<(String, u64)>) {
        let name = policy.name.as_str();
        let unused = self.store.unused(name).await.unwrap_or_default();
        let descriptors = match policy.envoy {
            Some(_) => self.store.unmatched(name).await.unwrap_or_default(),
            None => Vec::new(),
        };
        (unused, descriptors)
    }

    /// `policy`'s checks over the last minute, allowed and denied (every instance): what a
    /// change to it would touch.
    pub async fn policy_last_minute(&self, policy: &str) -> Result<(u64, u64), StoreError> {
        let (_, series) = self.store.policy_rates(&[policy.to_owned()], 60).await?;
        Ok(series
            .iter()
            .flatten()
            .fold((0, 0), |(a, d), s| (a + s.allowed, d + s.denied)))
    }
}
