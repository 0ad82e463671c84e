use serde_json::json;

use super::*;

const MINUTE_US: i64 = 60_000_000;
const T0: i64 = 1_700_000_000_000_000;

fn policy(doc: serde_json::Value) -> Policy {
    Policy::from_document("api", &doc).unwrap()
}

fn check(at_us: i64, user: &str, allowed: bool) -> Recorded {
    Recorded {
        at_us,
        cost: 1,
        allowed,
        identifiers: vec![Identifier::new("user", user).unwrap()],
        ..Recorded::default()
    }
}

#[test]
fn a_line_reads_back_as_written() {
    let recorded = Recorded {
        at_us: T0 + 17,
        cost: 3,
        allowed: false,
        identifiers: vec![
            Identifier::new("user", "a=b c").unwrap(),
            Identifier::new("ip", "192.0.2.1").unwrap(),
        ],
        ..Recorded::default()
    };
    assert_eq!(Recorded::from_line(&recorded.to_line()), Some(recorded));
    assert_eq!(Recorded::from_line("12\tx\t1"), None);
}

/// A day's traffic, one request a minute from each of 20 users and 10 a minute from one
/// heavy user, all allowed under 20 a minute: halving the limit to 5 throttles only the
/// heavy user, 5 checks a minute, and the current rules reproduce what happened.
#[test]
fn halving_a_limit_names_the_heavy_user_and_counts_exactly() {
    let mut record = Vec::new();
    for minute in 0..60 {
        let at = T0 + minute * MINUTE_US;
        for u in 0..20 {
            record.push(check(at + u * 1000, &format!("u{u}"), true));
        }
        for n in 0..10 {
            record.push(check(at + 100_000 + n * 1000, "heavy", true));
        }
    }
    let rule = |limit: u64| {
        policy(
            json!({"rules": [{"name": "per-minute", "algorithm": "fixed_window", "limit": limit, "window_ms": 60000}]}),
        )
    };
    let same = replay(&rule(20), &record, || false);
    assert_eq!(
        (same.newly_denied, same.newly_allowed, same.denied),
        (0, 0, 0)
    );
    assert!(same.complete);
    let halved = replay(&rule(5), &record, || false);
    assert_eq!(halved.checks, 60 * 30);
    assert_eq!(halved.newly_denied, 60 * 5);
    assert_eq!(
        halved.newly_throttled,
        vec![Counted {
            identifier: "user=heavy".into(),
            checks: 300
        }]
    );
    assert_eq!(
        halved.denied_by_rule,
        vec![Counted {
            identifier: "per-minute".into(),
            checks: 300
        }]
    );
    let peak = halved.peak_minute.unwrap();
    let first_minute = (T0 / 1000).div_euclid(60_000) * 60_000;
    assert_eq!(
        (peak.at_ms, peak.denied),
        (first_minute, 5),
        "the first of equal minutes"
    );
}

#[test]
fn overrides_free_and_block_and_concurrency_is_not_replayed() {
    let record: Vec<Recorded> = (0..4).map(|i| check(T0 + i, "vip", i < 2)).collect();
    let with = |overrides: serde_json::Value| {
        policy(json!({
            "rules": [
                {"name": "two", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000},
                {"name": "in-flight", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}
            ],
            "overrides": overrides,
        }))
    };
    let plain = replay(&with(json!([])), &record, || false);
    assert_eq!((plain.newly_denied, plain.newly_allowed), (0, 0));
    assert_eq!(plain.not_replayed, vec!["in-flight".to_owned()]);
    let free = replay(
        &with(json!([{"match": "user=vip", "action": "unlimited"}])),
        &record,
        || false,
    );
    assert_eq!(free.newly_allowed, 2);
    assert_eq!(free.newly_freed[0].identifier, "user=vip");
    let blocked = replay(
        &with(json!([{"match": "user=vip", "action": "block"}])),
        &record,
        || false,
    );
    assert_eq!(blocked.newly_denied, 2);
    assert_eq!(blocked.denied_by_rule[0].identifier, "override");
}

#[test]
fn a_budget_that_runs_out_stops_the_replay_and_says_so() {
    let record: Vec<Recorded> = (0..10_000).map(|i| check(T0 + i, "a", true)).collect();
    let rules = policy(
        json!({"rules": [{"name": "w", "algorithm": "fixed_window", "limit": 100000, "window_ms": 60000}]}),
    );
    let mut asked = 0;
    let cut = replay(&rules, &record, || {
        asked += 1;
        asked == 2
    });
    assert!(!cut.complete);
    assert_eq!(cut.checks, 2 * 4096 - 1);
}

#[test]
fn a_sampled_line_reads_back_as_written() {
    let recorded = Recorded {
        at_us: T0,
        cost: 1,
        allowed: true,
        identifiers: vec![
            Identifier::new("ip", "192.0.2.1").unwrap(),
            Identifier::new("user", "s1.0").unwrap(),
        ],
        level: 3,
        unit: 1,
    };
    assert!(
        recorded.to_line().contains("\ts3.1\t"),
        "{}",
        recorded.to_line()
    );
    assert_eq!(Recorded::from_line(&recorded.to_line()), Some(recorded));
}

/// Twenty checks a minute from each of 800 users for ten minutes, a heavier user one in
/// five: sampled one user in eight, the rules in force still reproduce every kept
/// decision, and a draft's newly denied count lands within its bound of the full
/// record's.
#[test]
fn a_sampled_record_estimates_within_its_bound() {
    let rule = |limit: u64| {
        policy(
            json!({"rules": [{"name": "per-minute", "algorithm": "fixed_window", "limit": limit, "window_ms": 60000}]}),
        )
    };
    let now = rule(30);
    let mut full = Vec::new();
    for minute in 0..10 {
        for u in 0..800i64 {
            let heavy = u % 5 == 0;
            for n in 0..if heavy { 28 } else { 12 } {
                let at = T0 + minute * MINUTE_US + n * 1_000_000 + u;
                full.push(check(at, &format!("u{u}"), true));
            }
        }
    }
    let truth = replay(&rule(15), &full, || false);
    assert_eq!(truth.newly_denied, 160 * 13 * 10);
    let level = 3;
    let sampled: Vec<Recorded> = full
        .iter()
        .filter(|r| sample::keeps(&r.identifiers[0], level))
        .map(|r| Recorded { level, ..r.clone() })
        .collect();
    assert!(sampled.len() < full.len() / 4, "{} kept", sampled.len());
    let same = replay(&now, &sampled, || false);
    assert_eq!(
        (same.one_in, same.newly_denied, same.newly_allowed),
        (8, 0, 0)
    );
    assert_eq!(
        same.newly_denied_bound, 8,
        "none kept changed: the bound is one identifier's share"
    );
    let estimate = replay(&rule(15), &sampled, || false);
    assert_eq!(estimate.one_in, 8);
    assert!(estimate.newly_denied_bound > 0);
    assert!(
        estimate.newly_denied.abs_diff(truth.newly_denied) <= estimate.newly_denied_bound,
        "estimate {} ± {}, truth {}",
        estimate.newly_denied,
        estimate.newly_denied_bound,
        truth.newly_denied
    );
    // Checks recorded at a lower level before the level rose are cut to the same sample.
    let mut mixed = full[..full.len() / 2].to_vec();
    mixed.extend(sampled.iter().skip(sampled.len() / 2).cloned());
    assert_eq!(
        replay(&now, &mixed, || false).checks,
        sampled.len() as u64 * 8
    );
}

#[test]
fn the_level_is_the_lowest_at_which_a_day_at_the_rate_fits() {
    use sample::level_for;
    const DAY: i64 = 86_400_000;
    // 8,640 ten-second periods a day: 10 checks in ten seconds is 86,400 a day.
    assert_eq!(level_for(10, 10_000, 100_000, DAY), 0);
    assert_eq!(level_for(12, 10_000, 100_000, DAY), 1);
    // 1,000 a second: 86.4M a day, 864 times the budget: 2^10 = 1,024.
    assert_eq!(level_for(10_000, 10_000, 100_000, DAY), 10);
    assert_eq!(level_for(0, 10_000, 100_000, DAY), 0);
    assert_eq!(level_for(u64::MAX, 10_000, 1, DAY), sample::MAX_LEVEL);
}

#[test]
fn a_burst_samples_more_each_time_it_doubles() {
    use sample::burst_level;
    assert_eq!(burst_level(999, 1000), 0);
    assert_eq!(burst_level(1001, 1000), 1);
    assert_eq!(burst_level(2000, 1000), 2);
    assert_eq!(burst_level(4000, 1000), 3);
    assert_eq!(burst_level(u64::MAX, 1), sample::MAX_LEVEL);
}
