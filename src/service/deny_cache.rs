//! The over-limit cache (as Envoy's ratelimit has): once a check is denied by a rule until T,
//! the same or a larger request is answered from memory until T, without Redis. A reset of
//! the identifier, on any instance, clears it everywhere at once (pub/sub), and a new policy
//! version or a change of its overrides makes old entries void.
//!
//! A cached answer has the shape Redis's would have: one result per rule × identifier of the
//! check, in order. So a denied check leaves every one of its results here (the denials, and
//! the others as they stood), and a check is answered from memory only when each of its
//! entries has a result here and one of them is a denial that still stands for its cost.
//! Rules that count denials must see every request: a check with one is never cached.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    domain::{Decision, Identifier, Outcome, Policy, RuleResult},
    store::CheckEntry,
};

/// Most entries kept; past that, expired ones are dropped, then the insert is skipped.
const MAX_ENTRIES: usize = 100_000;

#[derive(Clone, Debug)]
struct Entry {
    /// The entry is good until then (the denial's end).
    until: Instant,
    revision: (u64, u64),
    /// For a denial: the smallest cost known to be denied. `None`: a result that allowed
    /// (or would have), kept for the shape of the answer.
    denied_cost: Option<u64>,
    result: RuleResult,
    reset_at: Instant,
}

/// Shared between all handlers of one instance.
#[derive(Clone, Default)]
pub struct DenyCache {
    map: Arc<Mutex<HashMap<String, Entry>>>,
}

fn key(policy: &str, rule: &str, identifier: &Identifier) -> String {
    format!("{policy}\u{0}{rule}\u{0}{identifier}")
}

impl DenyCache {
    /// The cached answer to this check, if a denial covers it: one result per entry, in
    /// order, with their times counted down.
    pub fn lookup(
        &self,
        policy: &Policy,
        entries: &[CheckEntry<'_>],
        cost: u64,
    ) -> Option<Decision> {
        // A rule that counts denials must see every request (an expiring override can swap
        // such a rule in under the same policy version); entries of their own costs are
        // not the check's cost the cache keeps.
        if cost == 0
            || entries
                .iter()
                .any(|e| e.rule.count_denied || e.cost.is_some())
        {
            return None;
        }
        let now = Instant::now();
        let map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.is_empty() {
            return None;
        }
        let mut covered = false;
        let mut results = Vec::with_capacity(entries.len());
        for entry in entries {
            let e = map.get(&key(
                policy.name.as_str(),
                entry.rule.name.as_str(),
                entry.identifier,
            ))?;
            if e.until <= now
                || e.revision != policy.revision()
                || e.result.algorithm != Some(entry.rule.algorithm)
            {
                return None;
            }
            let left = |t: Instant| t.saturating_duration_since(now).as_millis() as u64;
            let mut result = RuleResult {
                binding: false,
                ..e.result.clone()
            };
            result.outcome = Outcome {
                reset_ms: left(e.reset_at),
                ..result.outcome
            };
            if let Some(denied) = e.denied_cost {
                covered |= cost >= denied;
                result.outcome.retry_after_ms = Some(left(e.until).max(1));
            }
            results.push(result);
        }
        covered.then(|| Decision::new(results))
    }

    /// Remembers a denied check of `entries` that says when it will pass: each denial that
    /// does, and every other result, for the shape of a later answer. `asked`: when the
    /// check was sent to Redis. A denial is remembered until `asked` plus its wait less a
    /// millisecond: Redis decided after `asked`, and the wait it answers is rounded up to
    /// the millisecond, so the cache never denies a check Redis would already let pass (a
    /// replay of the record then finds every cached denial where Redis would have made it).
    pub fn remember(
        &self,
        policy: &Policy,
        entries: &[CheckEntry<'_>],
        decision: &Decision,
        cost: u64,
        asked: Instant,
    ) {
        // A concurrency denial ends whenever a lease is released: it is never known to stand.
        if decision.allowed
            || cost == 0
            || entries
                .iter()
                .any(|e| e.rule.count_denied || e.takes_lease() || e.cost.is_some())
        {
            return;
        }
        let now = Instant::now();
        let stands = |ms: u64| asked + Duration::from_millis(ms.saturating_sub(1));
        // The answer stands while its longest-waiting known denial does.
        let Some(until) = decision
            .results
            .iter()
            .filter(|r| !r.outcome.allowed)
            .filter_map(|r| r.outcome.retry_after_ms)
            .max()
            .map(stands)
        else {
            return;
        };
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() + decision.results.len() > MAX_ENTRIES {
            map.retain(|_, e| e.until > now);
            if map.len() + decision.results.len() > MAX_ENTRIES {
                return;
            }
        }
        for r in &decision.results {
            let denied_until = (!r.outcome.allowed)
                .then_some(r.outcome.retry_after_ms)
                .flatten()
                .map(stands);
            let entry = Entry {
                until: denied_until.unwrap_or(until),
                revision: policy.revision(),
                denied_cost: denied_until.map(|_| cost),
                result: RuleResult {
                    binding: false,
                    ..r.clone()
                },
                reset_at: now + Duration::from_millis(r.outcome.reset_ms),
            };
            let k = key(policy.name.as_str(), r.rule.as_str(), &r.identifier);
            // A standing denial is not replaced by a mere snapshot of the same entry.
            if entry.denied_cost.is_none()
                && map
                    .get(&k)
                    .is_some_and(|old| old.denied_cost.is_some() && old.until > now)
            {
                continue;
            }
            map.insert(k, entry);
        }
        crate::telemetry::metrics::deny_cache_entries(map.len());
    }

    /// Forgets `identifier` under `policies` (all when `None`).
    pub fn invalidate(&self, policies: Option<&[String]>, identifier: &Identifier) {
        let suffix = format!("\u{0}{identifier}");
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|k, _| {
            if !k.ends_with(&suffix) {
                return true;
            }
            let policy = k.split('\u{0}').next().unwrap_or_default();
            !policies.is_none_or(|ps| ps.iter().any(|p| p == policy))
        });
        crate::telemetry::metrics::deny_cache_entries(map.len());
    }
}
