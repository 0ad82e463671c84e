//! Denials remembered until their `Retry-After`: the same check in that time is denied
//! without a call. Never a denial by a `concurrency` rule (a release frees a slot at any
//! moment), never a shadow or degraded answer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue};

use crate::{Check, Decision, Identifiers, Outcome};

/// At most this many denials are remembered; past it, the expired ones are dropped, then all.
const CAPACITY: usize = 10_000;

/// A denial is remembered at most this long, whatever its Retry-After: a support reset or a
/// new override then shows within it.
pub const MAX_CACHED: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Denials {
    /// Per check: until when it is remembered, when it may pass, the denial.
    map: Mutex<HashMap<String, (Instant, Instant, Decision)>>,
}

/// The cache key: the policy, the cost, the limits sent and the identifiers (sorted by rule
/// and dimension): each set of limits is a counter, and a denial, of its own.
pub(crate) fn key(policy: &str, identifiers: &Identifiers, check: &Check) -> String {
    let mut key = format!("{policy}\u{0}{}", check.cost);
    for (rule, fields) in &check.limits {
        for (field, value) in fields {
            key.push_str(&format!("\u{0}limits.{rule}.{field}={value}"));
        }
    }
    for (dimension, value) in identifiers {
        key.push('\u{0}');
        key.push_str(dimension);
        key.push('=');
        key.push_str(value);
    }
    key
}

impl Denials {
    pub(crate) fn get(&self, key: &str) -> Option<Decision> {
        let mut map = self.map.lock().unwrap();
        let (until, retry_at, decision) = map.get(key)?;
        let now = Instant::now();
        if *until <= now {
            map.remove(key);
            return None;
        }
        let left = retry_at.saturating_duration_since(now);
        let secs = left.as_millis().div_ceil(1000);
        // The stored RateLimit header's reset time is stale: only the policy and a fresh
        // Retry-After go out with a remembered denial.
        let mut headers: Vec<(HeaderName, HeaderValue)> = decision
            .headers()
            .iter()
            .filter(|(name, _)| name == "ratelimit-policy")
            .cloned()
            .collect();
        headers.push((
            HeaderName::from_static("retry-after"),
            HeaderValue::from(secs as u64),
        ));
        Some(Decision::cached(
            Outcome::Limited {
                retry_after: Some(left),
            },
            decision.answer().cloned(),
            headers,
        ))
    }

    pub(crate) fn remember(&self, key: &str, decision: &Decision) {
        let Outcome::Limited {
            retry_after: Some(after),
        } = decision.outcome()
        else {
            return;
        };
        let Some(answer) = decision.answer() else {
            return;
        };
        let by_concurrency = answer
            .results
            .iter()
            .any(|r| !r.allowed && r.algorithm == "concurrency");
        if by_concurrency || answer.degraded || *after < Duration::from_millis(1) {
            return;
        }
        let mut map = self.map.lock().unwrap();
        if map.len() >= CAPACITY {
            let now = Instant::now();
            map.retain(|_, (until, _, _)| *until > now);
            if map.len() >= CAPACITY {
                map.clear();
            }
        }
        let now = Instant::now();
        map.insert(
            key.to_owned(),
            (
                now + (*after).min(MAX_CACHED),
                now + *after,
                decision.clone(),
            ),
        );
    }
}
