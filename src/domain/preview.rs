//! What a burst would get: `n` requests spread evenly over `over_ms`, from one identifier,
//! through every rule of a policy, computed with the reference model. The dashboard runs it
//! in the browser (and on the server for pages without JavaScript).

use serde::{Deserialize, Serialize};

use super::{
    Rule,
    check::{Entry, EntryState, evaluate},
};

/// The result of a simulated burst.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstPreview {
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    /// The first denied request: its number (from 1) and when it came (ms after the first).
    pub first_denied: Option<(u64, u64)>,
    /// How many denials each rule caused (the rule that denied; several may).
    pub denials_by_rule: Vec<(String, u64)>,
    /// Of those, how many its penalty box gave (`block_ms`: the rule had denied a moment
    /// before and held the identifier), per rule in the same order.
    #[serde(default)]
    pub penalties_by_rule: Vec<u64>,
    /// The burst in `TIMELINE` equal slices of its time (or of its requests, when they come
    /// all at once): (allowed, denied) in each.
    #[serde(default)]
    pub timeline: Vec<(u64, u64)>,
}

/// Slices of a burst's timeline.
pub const TIMELINE: usize = 40;

/// The most requests a preview simulates.
pub const MAX_REQUESTS: u64 = 100_000;

/// Simulates `requests` requests of cost 1, evenly spread over `over_ms` (all at once when
/// 0), starting on a whole second, against fresh state.
pub fn burst(rules: &[Rule], requests: u64, over_ms: u64) -> BurstPreview {
    let requests = requests.min(MAX_REQUESTS);
    let entries: Vec<Entry<'_>> = rules
        .iter()
        .map(|r| Entry {
            algorithm: &r.algorithm,
            count_denied: r.count_denied,
            block_ms: r.block_ms.unwrap_or(0),
        })
        .collect();
    let mut states = vec![EntryState::default(); entries.len()];
    let start_us: i64 = 1_700_000_000_000_000;
    let mut out = BurstPreview {
        requests,
        denials_by_rule: rules.iter().map(|r| (r.name.to_string(), 0)).collect(),
        penalties_by_rule: vec![0; rules.len()],
        timeline: vec![(0, 0); if requests == 0 { 0 } else { TIMELINE }],
        ..BurstPreview::default()
    };
    for i in 0..requests {
        let offset_us = if requests <= 1 {
            0
        } else {
            (i as u128 * over_ms as u128 * 1000 / (requests - 1) as u128) as i64
        };
        let (after, outcomes) = evaluate(&states, start_us + offset_us, 1, &entries);
        states = after;
        // Its slice: by time, or by its number when the burst has no duration.
        let slice = if over_ms == 0 {
            (i as u128 * TIMELINE as u128 / requests as u128) as usize
        } else {
            (offset_us as u128 * TIMELINE as u128 / (over_ms as u128 * 1000 + 1)) as usize
        }
        .min(TIMELINE - 1);
        if outcomes.iter().all(|o| o.allowed) {
            out.allowed += 1;
            out.timeline[slice].0 += 1;
        } else {
            out.denied += 1;
            out.timeline[slice].1 += 1;
            out.first_denied
                .get_or_insert((i + 1, offset_us as u64 / 1000));
            for (k, o) in outcomes.iter().enumerate() {
                if !o.allowed {
                    out.denials_by_rule[k].1 += 1;
                    out.penalties_by_rule[k] += u64::from(o.penalty);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Algorithm;

    #[test]
    fn the_timeline_shows_where_the_denials_fall() {
        // 10 a second, 40 requests over 2 s: the first slices allowed, then denials until
        // the next window, which allows 10 again.
        let rules = [rule(
            "per-second",
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
        )];
        let p = burst(&rules, 40, 2000);
        assert_eq!(p.timeline.len(), TIMELINE);
        let (a, d) = p
            .timeline
            .iter()
            .fold((0, 0), |(a, d), (x, y)| (a + x, d + y));
        assert_eq!((a, d), (p.allowed, p.denied));
        assert!(p.timeline[0].0 > 0 && p.timeline[0].1 == 0);
        assert!(p.timeline[TIMELINE / 2 - 1].1 > 0, "{:?}", p.timeline);
        assert!(p.timeline[TIMELINE / 2].0 > 0, "{:?}", p.timeline);
    }

    fn rule(name: &str, algorithm: Algorithm) -> Rule {
        Rule::new(0, name, algorithm, None, false).unwrap()
    }

    #[test]
    fn a_fixed_window_admits_its_limit_of_a_burst() {
        let rules = [rule(
            "per-second",
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
        )];
        let p = burst(&rules, 25, 0);
        assert_eq!(
            (p.allowed, p.denied, p.first_denied),
            (10, 15, Some((11, 0)))
        );
        assert_eq!(p.denials_by_rule, vec![("per-second".to_owned(), 15)]);
    }

    #[test]
    fn a_token_bucket_refills_during_a_spread_burst() {
        // 20 at once, then 5 per second: 40 requests over 2 s get 20 + 10 (+1 at the edge).
        let rules = [rule(
            "burst",
            Algorithm::TokenBucket {
                capacity: 20,
                refill_tokens: 5,
                refill_period_ms: 1000,
            },
        )];
        let p = burst(&rules, 40, 2000);
        assert!((30..=31).contains(&p.allowed), "{p:?}");
    }

    #[test]
    fn the_tightest_rule_is_named() {
        let rules = [
            rule(
                "wide",
                Algorithm::FixedWindow {
                    limit: 100,
                    window_ms: 1000,
                },
            ),
            rule(
                "tight",
                Algorithm::Gcra {
                    rate: 1,
                    period_ms: 1000,
                    burst: 2,
                },
            ),
        ];
        let p = burst(&rules, 10, 0);
        assert_eq!(p.allowed, 3);
        assert_eq!(
            p.denials_by_rule,
            vec![("wide".to_owned(), 0), ("tight".to_owned(), 7)]
        );
    }

    #[test]
    fn a_penalty_box_turns_away_what_the_window_would_let_through() {
        // 10 a second with a 1.5 s penalty, 60 requests over 3 s: the first window lets 10
        // through and trips; the second window's requests are all held; the third lets 10.
        let mut rule = rule(
            "per-second",
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
        );
        let plain = burst(std::slice::from_ref(&rule), 60, 2950);
        rule.block_ms = Some(1500);
        let boxed = burst(&[rule], 60, 2950);
        assert_eq!(plain.allowed, 30);
        assert_eq!(plain.penalties_by_rule, vec![0]);
        assert_eq!(boxed.allowed, 20, "{boxed:?}");
        assert_eq!(boxed.first_denied, plain.first_denied);
        assert_eq!(boxed.penalties_by_rule, vec![40]);
    }
}
