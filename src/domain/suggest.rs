//! Suggested limits, from the record of recent checks: for a rule with a window, each
//! identifier's busiest window (what the rule counts of it, in windows of the rule's length
//! starting on the epoch), their spread over identifiers (p50, p99, max), and for the top
//! one, two and three identifiers the limit that would have throttled only them, with what
//! a replay of that limit denies.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::whatif::{Recorded, replay};
use super::{Algorithm, Policy, RulesFor};

/// A limit that throttles only the identifiers with the busiest windows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopLimit {
    /// How many identifiers it was asked to throttle.
    pub top: usize,
    /// The limit: the busiest window of the next identifier down (it and everyone below
    /// would never have been denied).
    pub limit: u64,
    /// The identifiers whose busiest window is above it (more than `top` when tied).
    pub throttled: Vec<String>,
    /// Checks a replay of the policy with this limit newly denies.
    pub newly_denied: u64,
}

/// What the record says of one rule's identifiers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suggestion {
    pub rule: String,
    pub window_ms: u64,
    pub limit_now: u64,
    /// Identifiers the rule counted in the record.
    pub identifiers: u64,
    /// Their busiest windows: the median identifier's, the 99th percentile's, the busiest's.
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    /// For the top 1, 2 and 3 (as far as there are identifiers below them).
    pub limits: Vec<TopLimit>,
    /// 1 when every check was recorded; else the record keeps one identifier in this many,
    /// and the figures above are of the kept ones.
    pub one_in: u64,
}

/// Suggestions for `rule` of `policy` from `record`. An error names what does not fit: no
/// such rule, or a rule without a window (buckets, GCRA, concurrency, quotas).
pub fn suggest(policy: &Policy, rule: &str, record: &[Recorded]) -> Result<Suggestion, String> {
    let found = policy
        .rules
        .iter()
        .find(|r| r.name.as_str() == rule)
        .ok_or_else(|| format!("{} has no rule {rule:?}", policy.name))?;
    let (limit_now, window_ms) = match found.algorithm {
        Algorithm::FixedWindow { limit, window_ms }
        | Algorithm::SlidingWindow { limit, window_ms }
        | Algorithm::SlidingLog { limit, window_ms }
        | Algorithm::BucketedWindow {
            limit, window_ms, ..
        } => (limit, window_ms),
        _ => {
            return Err(format!(
                "{rule} is a {}: limits are suggested for rules with a window (fixed_window, sliding_window, sliding_log, bucketed_window)",
                found.algorithm.name()
            ));
        }
    };
    // A sampled record: the identifiers its highest level keeps, whole.
    let level = record.iter().map(|r| r.level).max().unwrap_or(0);
    let kept: Vec<Recorded>;
    let record = if level == 0 {
        record
    } else {
        kept = record
            .iter()
            .filter(|r| super::whatif::sample::kept_at(r, level))
            .cloned()
            .collect();
        &kept
    };
    // (identifier, window) → what the rule counted.
    let mut windows: HashMap<(String, i64), u64> = HashMap::new();
    for check in record {
        let window = check.at_us.div_euclid(1000).div_euclid(window_ms as i64);
        for identifier in &check.identifiers {
            // Only where the policy's own rule counts it (not an override's).
            let own = matches!(policy.rules_for(identifier, check.at_us / 1000), RulesFor::Rules(r) if std::ptr::eq(r.as_ptr(), policy.rules.as_ptr()));
            if own
                && policy
                    .counting(&policy.rules, identifier)
                    .any(|r| r.name == found.name)
            {
                *windows.entry((identifier.to_string(), window)).or_default() +=
                    found.cost_of(check.cost);
            }
        }
    }
    let mut busiest: HashMap<String, u64> = HashMap::new();
    for ((identifier, _), n) in windows {
        let most = busiest.entry(identifier).or_default();
        *most = (*most).max(n);
    }
    let mut ranked: Vec<(String, u64)> = busiest.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let at = |share: f64| -> u64 {
        // Nearest rank over the ascending order.
        let n = ranked.len();
        if n == 0 {
            return 0;
        }
        let rank = ((share * n as f64).ceil() as usize).clamp(1, n);
        ranked[n - rank].1
    };
    let limits = (1..=3)
        .filter(|&top| top < ranked.len())
        .map(|top| top_limit(policy, found.name.as_str(), record, &ranked, top))
        // A tie at the top: the next one down is as busy, and its limit throttles nobody.
        .filter(|limit| !limit.throttled.is_empty())
        .collect();
    Ok(Suggestion {
        rule: rule.to_owned(),
        window_ms,
        limit_now,
        identifiers: ranked.len() as u64,
        p50: at(0.5),
        p99: at(0.99),
        max: ranked.first().map_or(0, |r| r.1),
        limits,
        one_in: 1 << level,
    })
}

/// The limit below the top `top` of `ranked` (busiest first), and its replay.
fn top_limit(
    policy: &Policy,
    rule: &str,
    record: &[Recorded],
    ranked: &[(String, u64)],
    top: usize,
) -> TopLimit {
    let limit = ranked[top].1.max(1);
    let mut changed = policy.clone();
    for r in changed.rules.iter_mut().filter(|r| r.name.as_str() == rule) {
        match &mut r.algorithm {
            Algorithm::FixedWindow { limit: l, .. }
            | Algorithm::SlidingWindow { limit: l, .. }
            | Algorithm::SlidingLog { limit: l, .. }
            | Algorithm::BucketedWindow { limit: l, .. } => *l = limit,
            _ => {}
        }
    }
    let answer = replay(&changed, record, || false);
    TopLimit {
        top,
        limit,
        throttled: ranked
            .iter()
            .filter(|(_, n)| *n > limit)
            .map(|(id, _)| id.clone())
            .collect(),
        newly_denied: answer.newly_denied,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::Identifier;

    const T0: i64 = 1_700_006_400_000_000;

    #[test]
    fn the_top_one_limit_throttles_only_the_heavy_user() {
        let policy = Policy::from_document(
            "api",
            &json!({"rules": [{"name": "per-minute", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000}]}),
        )
        .unwrap();
        let mut record = Vec::new();
        for (user, n) in [("heavy", 30), ("mid", 12), ("a", 3), ("b", 2), ("c", 2)] {
            for i in 0..n {
                record.push(Recorded {
                    at_us: T0 + i * 1000,
                    cost: 1,
                    allowed: true,
                    identifiers: vec![Identifier::new("user", user).unwrap()],
                    ..Recorded::default()
                });
            }
        }
        let s = suggest(&policy, "per-minute", &record).unwrap();
        assert_eq!((s.identifiers, s.p50, s.max, s.limit_now), (5, 3, 30, 100));
        // Two identifiers as busy as each other: no limit throttles only one of them.
        let tied: Vec<Recorded> = record
            .iter()
            .filter(|r| ["heavy"].contains(&r.identifiers[0].value()))
            .flat_map(|r| {
                let mut twin = r.clone();
                twin.identifiers = vec![Identifier::new("user", "twin").unwrap()];
                [r.clone(), twin]
            })
            .collect();
        let even = suggest(&policy, "per-minute", &tied).unwrap();
        assert_eq!((even.identifiers, even.max), (2, 30));
        assert!(even.limits.is_empty(), "{:?}", even.limits);
        assert_eq!(s.p99, 30);
        let top1 = &s.limits[0];
        assert_eq!(
            (top1.limit, top1.throttled.clone(), top1.newly_denied),
            (12, vec!["user=heavy".to_owned()], 18)
        );
        let top2 = &s.limits[1];
        assert_eq!((top2.limit, top2.newly_denied), (3, 27 + 9));
        assert!(suggest(&policy, "nope", &record).is_err());
    }
}
