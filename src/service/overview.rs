//! What the overview shows, gathered in one go: Redis's health, each policy's last minute,
//! the most throttled identifiers and those near a limit. Everything comes from the live
//! counters: a few keys, never a scan, so it costs the same with a million identifiers.

use std::sync::Arc;

use super::{RedisHealth, Service, StoreError};
use crate::{
    domain::Policy,
    store::stats::{Ranked, SecondCount},
};

/// A policy and its last seconds, oldest first.
pub type PolicySeconds = (Arc<Policy>, Vec<SecondCount>);

/// The overview's facts, as the store gives them; the dashboard shapes them for its page.
pub struct OverviewFacts {
    /// `Err` when Redis did not answer its health probe (nothing else is read then).
    pub redis: Result<RedisHealth, StoreError>,
    /// The policies this instance holds, each with its last seconds (oldest first), ending
    /// at Redis's second `rates_until` (`None` when the counters could not be read).
    pub rates: Option<(i64, Vec<PolicySeconds>)>,
    /// Most denied over the last 5 minutes.
    pub throttled: Vec<Ranked>,
    /// At 80 % or more of a limit in the last minute or two.
    pub near: Vec<Ranked>,
    /// Keys in Redis (DBSIZE), for scale.
    pub keys: u64,
}

impl Service {
    /// The overview's facts, over the last `seconds` seconds; `top` identifiers of each
    /// list. The counters are read at once (one round trip each, together).
    pub async fn overview(&self, seconds: i64, top: usize) -> OverviewFacts {
        let redis = self.store.health().await;
        if let Err(error) = &redis {
            tracing::warn!(%error, "redis health probe failed");
            return OverviewFacts {
                redis,
                rates: None,
                throttled: Vec::new(),
                near: Vec::new(),
                keys: 0,
            };
        }
        let policies = self.policies.all();
        let names: Vec<String> = policies.iter().map(|p| p.name.to_string()).collect();
        let (rates, throttled, near, keys) = tokio::join!(
            self.store.policy_rates(&names, seconds),
            self.store.top_denied(5, top),
            self.store.near_limit(top),
            self.store.key_count(),
        );
        OverviewFacts {
            redis,
            rates: rates
                .ok()
                .map(|(now, series)| (now, policies.into_iter().zip(series).collect())),
            throttled: throttled.unwrap_or_default(),
            near: near.unwrap_or_default(),
            keys: keys.unwrap_or(0),
        }
    }
}
