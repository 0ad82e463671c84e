//! The live counters behind the dashboard's overview (`lua/stats.lua`): kept by the check
//! path in the same round trip, read here from a handful of keys, never by scanning.

use std::collections::HashMap;

use super::{CheckEntry, Store, StoreError};
use crate::domain::Name;

/// Seconds the rate circle holds.
pub const RATE_SECONDS: i64 = 300;
/// A rate bucket holds `second * RATE_SHIFT + count`.
const RATE_SHIFT: i64 = 1 << 20;

/// One second of one policy's checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SecondCount {
    pub second: i64,
    pub allowed: u64,
    pub denied: u64,
}

/// An identifier on the overview: `policy` and `dimension=value`, and a figure (denials,
/// or the percentage of its limit used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranked {
    pub policy: String,
    pub identifier: String,
    pub value: u64,
}

/// The label the counters use for an identifier under a policy.
pub fn label(policy: &str, identifier: &str) -> String {
    format!("{policy}|{identifier}")
}

fn split_label(label: &str) -> (String, String) {
    match label.split_once('|') {
        Some((p, i)) => (p.to_owned(), i.to_owned()),
        None => (String::new(), label.to_owned()),
    }
}

pub(super) fn minute_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(60_000)
}

pub(super) use crate::clock::now_ms;

impl Store {
    /// Adds counts answered elsewhere (an instance's over-limit cache) to the counters.
    pub async fn add_stats(
        &self,
        policy: &str,
        allowed: u64,
        denied: u64,
        denied_labels: &[(String, u64)],
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.stats_flush.prepare_invoke();
        invocation
            .key(self.keys.stats_rate(policy))
            .key(self.keys.stats_denied(minute_of(now_ms())))
            .arg(allowed)
            .arg(denied);
        for (l, n) in denied_labels {
            invocation.arg(l).arg(n);
        }
        let _: i64 = self.invoke(&invocation).await?;
        Ok(())
    }

    /// The last `seconds` seconds of each policy's checks, oldest first, ending at Redis's
    /// current second. One pipelined read of one hash per policy.
    pub async fn policy_rates(
        &self,
        policies: &[String],
        seconds: i64,
    ) -> Result<(i64, Vec<Vec<SecondCount>>), StoreError> {
        let seconds = seconds.clamp(1, RATE_SECONDS - 2);
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for p in policies {
            pipe.cmd("HGETALL").arg(self.keys.stats_rate(p));
        }
        let mut replies: Vec<redis::Value> = self.query_pipe(&pipe).await?;
        let time: (i64, i64) = redis::from_redis_value(replies.remove(0)).map_err(parsing)?;
        let now = time.0;
        let mut out = Vec::with_capacity(policies.len());
        for reply in replies {
            let fields: HashMap<String, i64> = redis::from_redis_value(reply).map_err(parsing)?;
            let series = (now - seconds + 1..=now)
                .map(|sec| {
                    let i = sec.rem_euclid(RATE_SECONDS);
                    // A bucket holds second * 2^20 + count (see lua/stats.lua).
                    let get = |k: &str| match fields.get(&format!("{k}{i}")) {
                        Some(v) if v.div_euclid(RATE_SHIFT) == sec => {
                            v.rem_euclid(RATE_SHIFT) as u64
                        }
                        _ => 0,
                    };
                    SecondCount {
                        second: sec,
                        allowed: get("a"),
                        denied: get("d"),
                    }
                })
                .collect();
            out.push(series);
        }
        Ok((now, out))
    }

    /// The identifiers denied most over the last `minutes` minutes (each minute's top 50,
    /// summed: exact for the leaders, and bounded work however many were denied).
    pub async fn top_denied(&self, minutes: i64, n: usize) -> Result<Vec<Ranked>, StoreError> {
        let current = minute_of(now_ms());
        let mut pipe = redis::pipe();
        for m in (current - minutes + 1)..=current {
            pipe.cmd("ZREVRANGE")
                .arg(self.keys.stats_denied(m))
                .arg(0)
                .arg(49)
                .arg("WITHSCORES");
        }
        let pages: Vec<Vec<(String, f64)>> = self.query_pipe(&pipe).await?;
        let mut sums: HashMap<String, u64> = HashMap::new();
        for page in pages {
            for (member, score) in page {
                *sums.entry(member).or_default() += score.max(0.0) as u64;
            }
        }
        let mut ranked: Vec<Ranked> = sums
            .into_iter()
            .map(|(l, v)| {
                let (policy, identifier) = split_label(&l);
                Ranked {
                    policy,
                    identifier,
                    value: v,
                }
            })
            .collect();
        ranked.sort_by(|a, b| b.value.cmp(&a.value).then(a.identifier.cmp(&b.identifier)));
        ranked.truncate(n);
        Ok(ranked)
    }

    /// Identifiers that used 80 % or more of a limit in this minute or the last (the latest
    /// figure for each).
    pub async fn near_limit(&self, n: usize) -> Result<Vec<Ranked>, StoreError> {
        let current = minute_of(now_ms());
        let mut pipe = redis::pipe();
        for m in [current, current - 1] {
            pipe.cmd("ZREVRANGE")
                .arg(self.keys.stats_near(m))
                .arg(0)
                .arg(n.saturating_sub(1))
                .arg("WITHSCORES");
        }
        let pages: Vec<Vec<(String, f64)>> = self.query_pipe(&pipe).await?;
        let mut seen = std::collections::HashSet::new();
        let mut ranked = Vec::new();
        for page in pages {
            for (member, score) in page {
                if seen.insert(member.clone()) {
                    let (policy, identifier) = split_label(&member);
                    ranked.push(Ranked {
                        policy,
                        identifier,
                        value: score.max(0.0) as u64,
                    });
                }
            }
        }
        ranked.sort_by(|a, b| b.value.cmp(&a.value).then(a.identifier.cmp(&b.identifier)));
        ranked.truncate(n);
        Ok(ranked)
    }

    /// The remaining TTL (ms) of each entry's state key; -2 when there is no state.
    pub async fn rule_ttls(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
    ) -> Result<Vec<i64>, StoreError> {
        let mut pipe = redis::pipe();
        for e in entries {
            pipe.cmd("PTTL").arg(self.keys.rule_state(
                policy,
                e.identifier,
                &e.rule.name,
                &e.rule.algorithm,
            ));
        }
        self.query_pipe(&pipe).await
    }

    /// How many keys Redis holds (DBSIZE: constant time).
    pub async fn key_count(&self) -> Result<u64, StoreError> {
        self.query(&redis::cmd("DBSIZE")).await
    }
}

fn parsing(e: impl std::fmt::Display) -> StoreError {
    StoreError::Reply(format!("unexpected counter reply: {e}"))
}
