//! The over-limit cache (as Envoy's ratelimit has): once a rule denies an identifier until
//! T, the same or a larger request is answered from memory until T, without Redis. A reset
//! of the identifier, on any instance, clears it everywhere at once (pub/sub), and a new
//! policy version makes old entries void.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::domain::{Decision, Identifier, Outcome, Policy, RuleResult};

/// Most entries kept; past that, expired ones are dropped, then the insert is skipped.
const MAX_ENTRIES: usize = 100_000;

#[derive(Clone, Debug)]
struct Entry {
    until: Instant,
    version: u64,
    /// The smallest cost known to be denied.
    cost: u64,
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
    /// A cached denial that covers this check, if any: `(rule name, identifier)` pairs are
    /// the check's entries.
    pub fn lookup<'a>(
        &self,
        policy: &Policy,
        entries: impl Iterator<Item = (&'a str, &'a Identifier)>,
        cost: u64,
    ) -> Option<Decision> {
        if cost == 0 {
            return None;
        }
        let now = Instant::now();
        let map = self.map.lock().expect("deny cache lock");
        if map.is_empty() {
            return None;
        }
        for (rule, identifier) in entries {
            if let Some(e) = map.get(&key(policy.name.as_str(), rule, identifier))
                && e.until > now
                && e.version == policy.version
                && cost >= e.cost
            {
                let mut result = e.result.clone();
                let left = |t: Instant| t.saturating_duration_since(now).as_millis() as u64;
                result.outcome = Outcome {
                    retry_after_ms: Some(left(e.until).max(1)),
                    reset_ms: left(e.reset_at),
                    ..result.outcome
                };
                return Some(Decision::new(vec![result]));
            }
        }
        None
    }

    /// Remembers the denials of `decision` that say when they will pass.
    pub fn remember(&self, policy: &Policy, decision: &Decision, cost: u64) {
        if decision.allowed || cost == 0 {
            return;
        }
        let now = Instant::now();
        let mut map = self.map.lock().expect("deny cache lock");
        // A rule that counts denials must see every request, so it is never cached.
        let counts_denials = |name: &crate::domain::Name| {
            policy
                .rules
                .iter()
                .any(|x| &x.name == name && x.count_denied)
        };
        for r in decision
            .results
            .iter()
            .filter(|r| !r.outcome.allowed && !counts_denials(&r.rule))
        {
            let Some(retry) = r.outcome.retry_after_ms else {
                continue;
            };
            if map.len() >= MAX_ENTRIES {
                map.retain(|_, e| e.until > now);
                if map.len() >= MAX_ENTRIES {
                    return;
                }
            }
            let entry = Entry {
                until: now + Duration::from_millis(retry),
                version: policy.version,
                cost,
                result: RuleResult {
                    binding: false,
                    ..r.clone()
                },
                reset_at: now + Duration::from_millis(r.outcome.reset_ms),
            };
            map.insert(
                key(policy.name.as_str(), r.rule.as_str(), &r.identifier),
                entry,
            );
        }
    }

    /// Forgets `identifier` under `policies` (all when `None`).
    pub fn invalidate(&self, policies: Option<&[String]>, identifier: &Identifier) {
        let suffix = format!("\u{0}{identifier}");
        let mut map = self.map.lock().expect("deny cache lock");
        map.retain(|k, _| {
            if !k.ends_with(&suffix) {
                return true;
            }
            let policy = k.split('\u{0}').next().unwrap_or_default();
            !policies.is_none_or(|ps| ps.iter().any(|p| p == policy))
        });
    }
}
