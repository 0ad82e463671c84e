//! The live counters behind the dashboard's overview (`lua/stats.lua`): kept by the check
//! path in the same round trip, read here from a handful of keys, never by scanning.

use std::collections::HashMap;

use super::{CheckEntry, Store, StoreError};
use crate::domain::{
    Name,
    throttle::{Throttle, parse_detail},
};

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

fn ten_minutes_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(600_000)
}

/// What one instance saw of an identifier's denials under a policy in the last second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenialNote {
    /// The identifier that bound, `dimension=value`.
    pub identifier: String,
    pub denials: u64,
    pub first_ms: i64,
    pub last_ms: i64,
    pub until_ms: Option<i64>,
    pub rule: String,
    /// Every identifier of the last denied check.
    pub identifiers: Vec<String>,
}

pub(super) use crate::support::clock::now_ms;

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

    /// Adds what this instance learned of `policy`'s denials in the last second: each
    /// denied identifier's rule, first and last denial, until when and its check's
    /// identifiers, and the policy's own list of the most denied (`lua/stats_detail.lua`).
    pub async fn add_denial_details(
        &self,
        policy: &str,
        notes: &[DenialNote],
    ) -> Result<(), StoreError> {
        if notes.is_empty() {
            return Ok(());
        }
        let minute = minute_of(now_ms());
        let mut invocation = self.scripts.stats_detail.prepare_invoke();
        invocation
            .key(self.keys.stats_denial_details(policy, minute))
            .key(self.keys.stats_policy_denied(policy, minute));
        for n in notes {
            invocation
                .arg(&n.identifier)
                .arg(n.denials)
                .arg(n.first_ms)
                .arg(n.last_ms)
                .arg(n.until_ms.unwrap_or(0))
                .arg(&n.rule)
                .arg(n.identifiers.join("\n"));
        }
        let _: i64 = self.invoke(&invocation).await?;
        Ok(())
    }

    /// Adds identifiers checked together (`lua/companions.lua`): per identifier, the others.
    pub async fn add_companions(&self, pairs: &[(String, Vec<String>)]) -> Result<(), StoreError> {
        if pairs.is_empty() {
            return Ok(());
        }
        let slot = ten_minutes_of(now_ms());
        let mut invocation = self.scripts.companions.prepare_invoke();
        invocation.key(self.keys.stats_companions(slot));
        for (id, others) in pairs {
            invocation.arg(id).arg(others.join("\n"));
        }
        let shared: Vec<String> = self.invoke(&invocation).await?;
        if shared.is_empty() {
            return Ok(());
        }
        // The shared ones: their companions counted in a HyperLogLog (12 KB at most each,
        // for identifiers with more than 16 companions in ten minutes only).
        let mut pipe = redis::pipe();
        for pair in shared.chunks(2) {
            let [id, all] = pair else { continue };
            let key = self.keys.stats_companion_count(id, slot);
            pipe.cmd("PFADD")
                .arg(&key)
                .arg(all.split('\n').collect::<Vec<_>>())
                .ignore();
            pipe.cmd("PEXPIRE").arg(&key).arg(4_200_000).ignore();
        }
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// Adds `policy`'s Envoy descriptors that found no limit, by key shape (a hash per ten
    /// minutes, 70 minutes' TTL).
    pub async fn add_unmatched(
        &self,
        policy: &str,
        shapes: &[(String, u64)],
    ) -> Result<(), StoreError> {
        if shapes.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        incr_all(
            &mut pipe,
            &self.keys.stats_unmatched(policy, ten_minutes_of(now_ms())),
            shapes,
        );
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// `policy`'s Envoy descriptors that found no limit over the last hour, by key shape,
    /// most first.
    pub async fn unmatched(&self, policy: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.last_hour_sums(|slot| self.keys.stats_unmatched(policy, slot))
            .await
    }

    /// Adds `policy`'s checks that sent dimensions none of its rules counts, by those
    /// dimensions, to its count and to every policy's (a hash each per ten minutes, 70
    /// minutes' TTL).
    pub async fn add_unused(
        &self,
        policy: &str,
        shapes: &[(String, u64)],
    ) -> Result<(), StoreError> {
        if shapes.is_empty() {
            return Ok(());
        }
        let slot = ten_minutes_of(now_ms());
        let total: u64 = shapes.iter().map(|(_, n)| n).sum();
        let mut pipe = redis::pipe();
        incr_all(&mut pipe, &self.keys.stats_unused(policy, slot), shapes);
        incr_all(
            &mut pipe,
            &self.keys.stats_unused_all(slot),
            &[(policy.to_owned(), total)],
        );
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// `policy`'s checks over the last hour that sent dimensions none of its rules counts,
    /// by those dimensions, most first.
    pub async fn unused(&self, policy: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.last_hour_sums(|slot| self.keys.stats_unused(policy, slot))
            .await
    }

    /// Every policy's checks over the last hour that sent dimensions no rule counts, by
    /// policy, most first.
    pub async fn unused_by_policy(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.last_hour_sums(|slot| self.keys.stats_unused_all(slot))
            .await
    }

    /// The hashes of the last hour's ten-minute slots (`key` of each) summed field by
    /// field, most first.
    async fn last_hour_sums(
        &self,
        key: impl Fn(i64) -> String,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let current = ten_minutes_of(now_ms());
        let mut pipe = redis::pipe();
        for slot in current - 5..=current {
            pipe.cmd("HGETALL").arg(key(slot));
        }
        let found: Vec<HashMap<String, u64>> = self.query_pipe(&pipe).await?;
        let mut sums: HashMap<String, u64> = HashMap::new();
        for (shape, n) in found.into_iter().flatten() {
            *sums.entry(shape).or_default() += n;
        }
        let mut out: Vec<(String, u64)> = sums.into_iter().collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// How many distinct identifiers `identifier` was checked together with in the last
    /// hour: counted for a shared one (`None` when it never had more companions than the
    /// list keeps: then the list is the count).
    pub async fn companion_count(&self, identifier: &str) -> Result<Option<u64>, StoreError> {
        let current = ten_minutes_of(now_ms());
        let keys: Vec<String> = (current - 6..=current)
            .map(|slot| self.keys.stats_companion_count(identifier, slot))
            .collect();
        let mut exists = redis::cmd("EXISTS");
        exists.arg(&keys);
        let present: u64 = self.query(&exists).await?;
        if present == 0 {
            return Ok(None);
        }
        let mut count = redis::cmd("PFCOUNT");
        count.arg(&keys);
        Ok(Some(self.query(&count).await?))
    }

    /// The identifiers `identifier` was checked together with in the last hour, most recent
    /// first.
    pub async fn companions(&self, identifier: &str) -> Result<Vec<String>, StoreError> {
        let current = ten_minutes_of(now_ms());
        let mut pipe = redis::pipe();
        for slot in (current - 6..=current).rev() {
            pipe.cmd("HGET")
                .arg(self.keys.stats_companions(slot))
                .arg(identifier);
        }
        let found: Vec<Option<String>> = self.query_pipe(&pipe).await?;
        let mut out: Vec<String> = Vec::new();
        for c in found.iter().flatten().flat_map(|v| v.split('\n')) {
            if !c.is_empty() && c != identifier && !out.iter().any(|o| o == c) {
                out.push(c.to_owned());
            }
        }
        Ok(out)
    }

    /// The identifiers denied most over the last `minutes` minutes, with what is known of
    /// their denials: of every policy (the counters the check script keeps), or of the
    /// `policies` named (each one's own list).
    pub async fn throttled(
        &self,
        minutes: i64,
        n: usize,
        policies: Option<&[String]>,
    ) -> Result<Vec<Throttle>, StoreError> {
        let ranked = match policies {
            None => self.top_denied(minutes, n).await?,
            Some(names) => self.top_denied_of(names, minutes, n).await?,
        };
        self.with_details(ranked, minutes).await
    }

    /// The most denied of each of `policies` (each minute's top 50 of each, summed).
    async fn top_denied_of(
        &self,
        policies: &[String],
        minutes: i64,
        n: usize,
    ) -> Result<Vec<Ranked>, StoreError> {
        let current = minute_of(now_ms());
        let mut pipe = redis::pipe();
        for p in policies {
            for m in (current - minutes + 1)..=current {
                pipe.cmd("ZREVRANGE")
                    .arg(self.keys.stats_policy_denied(p, m))
                    .arg(0)
                    .arg(49)
                    .arg("WITHSCORES");
            }
        }
        let pages: Vec<Vec<(String, f64)>> = self.query_pipe(&pipe).await?;
        let mut sums: HashMap<(usize, String), u64> = HashMap::new();
        for (i, page) in pages.into_iter().enumerate() {
            let policy = i / minutes.max(1) as usize;
            for (member, score) in page {
                *sums.entry((policy, member)).or_default() += score.max(0.0) as u64;
            }
        }
        let mut ranked: Vec<Ranked> = sums
            .into_iter()
            .map(|((p, identifier), value)| Ranked {
                policy: policies[p].clone(),
                identifier,
                value,
            })
            .collect();
        ranked.sort_by(|a, b| b.value.cmp(&a.value).then(a.identifier.cmp(&b.identifier)));
        ranked.truncate(n);
        Ok(ranked)
    }

    /// What is known of the denials of each (policy, identifier) of `of` over the last
    /// `minutes` minutes (the identifier as the one that bound).
    pub async fn denial_details(
        &self,
        of: &[(String, String)],
        minutes: i64,
    ) -> Result<Vec<Throttle>, StoreError> {
        let ranked = of
            .iter()
            .map(|(policy, identifier)| Ranked {
                policy: policy.clone(),
                identifier: identifier.clone(),
                value: 0,
            })
            .collect();
        self.with_details(ranked, minutes).await
    }

    /// `ranked` with the details of its denials over the last `minutes` minutes: the
    /// earliest first denial, and the rest from the latest.
    async fn with_details(
        &self,
        ranked: Vec<Ranked>,
        minutes: i64,
    ) -> Result<Vec<Throttle>, StoreError> {
        if ranked.is_empty() {
            return Ok(Vec::new());
        }
        let current = minute_of(now_ms());
        let mut pipe = redis::pipe();
        for r in &ranked {
            for m in (current - minutes + 1)..=current {
                pipe.cmd("HGET")
                    .arg(self.keys.stats_denial_details(&r.policy, m))
                    .arg(&r.identifier);
            }
        }
        let found: Vec<Option<String>> = self.query_pipe(&pipe).await?;
        let per = minutes.max(1) as usize;
        Ok(ranked
            .into_iter()
            .zip(found.chunks(per))
            .map(|(r, details)| {
                let mut t = Throttle {
                    policy: r.policy,
                    identifier: r.identifier,
                    denials: r.value,
                    ..Throttle::default()
                };
                for (first, last, until, rule, ids) in
                    details.iter().flatten().filter_map(|d| parse_detail(d))
                {
                    t.first_ms = Some(t.first_ms.map_or(first, |f: i64| f.min(first)));
                    if t.last_ms.is_none_or(|l| last >= l) {
                        t.last_ms = Some(last);
                        t.until_ms = until;
                        t.rule = Some(rule);
                        t.identifiers = ids;
                    }
                }
                t
            })
            .collect())
    }

    /// The remaining TTL (ms) of each entry's state key; -2 when there is no state.
    pub async fn rule_ttls(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
    ) -> Result<Vec<i64>, StoreError> {
        let mut pipe = redis::pipe();
        for e in entries {
            pipe.cmd("PTTL")
                .arg(self.keys.rule_key(policy, e.identifier, e.rule));
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

/// Adds every `(field, n)` to hash `key`, which lasts 70 minutes from now.
fn incr_all(pipe: &mut redis::Pipeline, key: &str, counts: &[(String, u64)]) {
    for (field, n) in counts {
        pipe.cmd("HINCRBY").arg(key).arg(field).arg(*n).ignore();
    }
    pipe.cmd("PEXPIRE").arg(key).arg(4_200_000).ignore();
}
