//! The unit tests of `src/app/overview.rs`.

use proptest::prelude::*;

use super::*;

fn data(second: i64, policies: Vec<(&str, Seconds)>) -> OverviewData {
    OverviewData {
        second,
        policies: policies
            .into_iter()
            .map(|(p, busy)| PolicyRate {
                policy: p.into(),
                shadow: false,
                busy,
            })
            .collect(),
        ..OverviewData::default()
    }
}

#[test]
fn an_idle_policy_costs_nothing_and_a_busy_one_its_new_seconds() {
    let mut policies: Vec<(&str, Seconds)> = vec![("busy", vec![(58, 5, 1), (59, 2, 0)])];
    let names: Vec<String> = (0..199).map(|i| format!("idle-{i}")).collect();
    policies.extend(names.iter().map(|n| (n.as_str(), Vec::new())));
    let a = data(1000, policies.clone());
    // A second later: the busy policy's seconds moved on by one, and it got a new one.
    policies[0].1 = vec![(57, 5, 1), (58, 3, 0), (59, 1, 0)];
    let b = data(1001, policies);
    let delta = OverviewDelta::between(Some(&a), &b);
    assert!(delta.names.is_none());
    assert_eq!(
        delta.changed,
        vec![("busy".to_owned(), vec![(58, 3, 0), (59, 1, 0)])]
    );
    let bytes = serde_json::to_string(&delta).unwrap().len();
    assert!(bytes < 300, "{bytes} bytes for 200 policies, one busy");
    let mut client = a.clone();
    client.apply(delta);
    assert_eq!(client, b);
}

fn minute() -> impl Strategy<Value = Vec<(u8, u64, u64)>> {
    proptest::collection::btree_map(0u8..60, (0u64..5, 0u64..5), 0..8).prop_map(|m| {
        m.into_iter()
            .filter(|(_, (a, d))| a + d > 0)
            .map(|(i, (a, d))| (i, a, d))
            .collect()
    })
}

proptest! {
    /// Whatever the two states (policies added, removed, renamed, seconds apart or
    /// backwards), applying the delta to the old state gives the new one, and a first
    /// event replaces whatever the page had.
    #[test]
    fn applying_the_delta_gives_the_new_state(
        old in proptest::collection::vec(("[a-d]", minute()), 0..5),
        new in proptest::collection::vec(("[a-d]", minute()), 0..5),
        s0 in 0i64..200,
        step in -3i64..70,
        throttled in proptest::bool::ANY,
    ) {
        let dedup = |v: Vec<(String, Seconds)>| {
            let mut seen = std::collections::HashSet::new();
            v.into_iter().filter(|(n, _)| seen.insert(n.clone())).collect::<Vec<_>>()
        };
        let (old, new) = (dedup(old), dedup(new));
        let mut a = data(s0, old.iter().map(|(n, b)| (n.as_str(), b.clone())).collect());
        let mut b = data(s0 + step, new.iter().map(|(n, b)| (n.as_str(), b.clone())).collect());
        if throttled {
            b.throttled = vec![Throttle { policy: "a".into(), identifier: "user=1".into(), denials: 3, ..Throttle::default() }];
        } else {
            a.near = vec![RankedRow { policy: "b".into(), identifier: "user=2".into(), value: 90 }];
        }
        let mut client = a.clone();
        client.apply(OverviewDelta::between(Some(&a), &b));
        prop_assert_eq!(&client, &b);
        let mut stale = a.clone();
        stale.apply(OverviewDelta::between(None, &b));
        prop_assert_eq!(&stale, &b);
    }
}

#[test]
fn a_streak_over_is_not_an_all_clear_while_the_limit_still_refuses() {
    let streak = crate::domain::throttle::Streak {
        since_ms: 0,
        last_ms: 1_000,
        checks: 1,
        denials: 1,
    };
    let mut t = Throttle {
        last_ms: Some(1_000),
        until_ms: Some(700_000),
        streak: Some(streak),
        ..Throttle::default()
    };
    // 61 s without a request, the window still full: blocked, said as such.
    let (class, text) = state_text(&t, 62_000);
    assert_eq!(class, "badge bad");
    assert!(text.starts_with("blocked: no request for 61 s"), "{text}");
    // Once the limit lets requests through, it is cleared.
    t.until_ms = Some(50_000);
    assert_eq!(state_text(&t, 62_000).0, "badge ok");
}
