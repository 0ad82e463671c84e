//! Tables of `(t, cost) → (allowed, remaining, reset, retry)` through the pure model,
//! in the style of redis-cell's `it_rate_limits`. The same sequences run against the
//! Lua scripts in the integration tests.

use super::*;

/// (ms since start, cost, allowed, remaining, reset_ms, retry_ms)
type Row = (i64, u64, bool, u64, u64, Option<u64>);

fn run(algorithm: Algorithm, rows: &[Row]) {
    let t0 = 1_700_000_000_000_000i64; // aligned to every window used below
    let mut state = None;
    for (i, &(at, cost, allowed, remaining, reset, retry)) in rows.iter().enumerate() {
        let (next, o) = step(state.as_ref(), t0 + at * 1000, cost, &algorithm, false);
        assert_eq!(
            (o.allowed, o.remaining, o.reset_ms, o.retry_after_ms),
            (allowed, remaining, reset, retry),
            "{} row {i}",
            algorithm.name()
        );
        if next.is_some() {
            state = next;
        }
    }
}

#[test]
#[rustfmt::skip]
fn gcra_matches_redis_cell() {
    run(Algorithm::Gcra { rate: 1, period_ms: 1000, burst: 4 }, &[
        (0, 6, false, 5, 0, None),
        (0, 1, true, 4, 1000, None), (0, 1, true, 3, 2000, None), (0, 1, true, 2, 3000, None),
        (0, 1, true, 1, 4000, None), (0, 1, true, 0, 5000, None), (0, 1, false, 0, 5000, Some(1000)),
        (3000, 1, true, 2, 3000, None), (3100, 1, true, 1, 3900, None), (4000, 1, true, 1, 4000, None),
        (8000, 1, true, 4, 1000, None), (9500, 1, true, 4, 1000, None), (9500, 0, true, 4, 1000, None),
        (9500, 2, true, 2, 3000, None), (9500, 5, false, 2, 3000, Some(3000)),
    ]);
}

proptest::proptest! {
    /// GCRA counts exactly at every rate validation accepts: requests at one instant
    /// leave `burst + 1` minus what they took, even at 10^9 a millisecond, where one
    /// request is a millionth of a microsecond (a TAT kept in µs lost them).
    #[test]
    fn gcra_counts_exactly_at_every_rate(
        rate in proptest::prop_oneof![proptest::strategy::Just(crate::domain::rule::MAX_AMOUNT), 1u64..=crate::domain::rule::MAX_AMOUNT],
        period_ms in proptest::prop_oneof![proptest::strategy::Just(1u64), 1u64..=crate::domain::rule::MAX_PERIOD_MS],
        burst in proptest::prop_oneof![proptest::strategy::Just(crate::domain::rule::MAX_AMOUNT - 1), 0u64..crate::domain::rule::MAX_AMOUNT],
        costs in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just(1u64), 0u64..=1000, 1u64..=crate::domain::rule::MAX_AMOUNT], 1..20),
    ) {
        let algorithm = Algorithm::Gcra { rate, period_ms, burst };
        let now = 1_763_800_000_123_456;
        let mut state = None;
        let mut left = burst + 1;
        for cost in costs {
            let (next, o) = step(state.as_ref(), now, cost, &algorithm, false);
            let allowed = cost <= left;
            if allowed {
                left -= cost;
            }
            proptest::prop_assert_eq!(o.allowed, allowed, "cost {} of {:?}", cost, algorithm);
            proptest::prop_assert_eq!(o.remaining, left, "cost {} of {:?}", cost, algorithm);
            if next.is_some() {
                state = next;
            }
        }
    }
}

#[test]
#[rustfmt::skip]
fn fixed_window_resets_at_the_window_edge() {
    run(Algorithm::FixedWindow { limit: 3, window_ms: 1000 }, &[
        (0, 0, true, 3, 0, None),
        (100, 2, true, 1, 900, None), (200, 1, true, 0, 800, None),
        (300, 1, false, 0, 700, Some(700)), (400, 4, false, 0, 600, None),
        (1000, 1, true, 2, 1000, None),
    ]);
}

#[test]
#[rustfmt::skip]
fn token_bucket_refills_continuously() {
    run(Algorithm::TokenBucket { capacity: 4, refill_tokens: 1, refill_period_ms: 1000 }, &[
        (0, 4, true, 0, 4000, None), (0, 1, false, 0, 4000, Some(1000)),
        (500, 1, false, 0, 3500, Some(500)), (1000, 1, true, 0, 4000, None),
        (3000, 2, true, 0, 4000, None), (3000, 5, false, 0, 4000, None),
    ]);
}

#[test]
#[rustfmt::skip]
fn leaky_bucket_reports_the_queueing_delay() {
    run(Algorithm::LeakyBucket { capacity: 3, leak_tokens: 1, leak_period_ms: 100 }, &[
        (0, 1, true, 2, 100, None), (0, 1, true, 1, 200, None), (0, 1, true, 0, 300, None),
        (0, 1, false, 0, 300, Some(100)), (150, 1, true, 0, 250, None),
    ]);
    let (_, o) = step(Some(&State::LeakyBucket { level: 2.0, last_us: 0 }), 0, 1,
        &Algorithm::LeakyBucket { capacity: 3, leak_tokens: 1, leak_period_ms: 100 }, false);
    assert_eq!(o.delay_ms, 200, "two ahead in the queue, 100 ms each");
}

#[test]
#[rustfmt::skip]
fn sliding_log_frees_the_oldest_entries_first() {
    run(Algorithm::SlidingLog { limit: 2, window_ms: 1000 }, &[
        (0, 1, true, 1, 1000, None), (400, 1, true, 0, 1000, None),
        (500, 1, false, 0, 900, Some(500)), (1000, 1, true, 0, 1000, None),
        (1000, 2, false, 0, 1000, Some(1000)),
    ]);
}

#[test]
#[rustfmt::skip]
fn bucketed_window_counts_the_last_n_buckets() {
    run(Algorithm::BucketedWindow { limit: 2, window_ms: 1000, bucket_ms: 250 }, &[
        (0, 1, true, 1, 1000, None), (300, 1, true, 0, 950, None),
        (600, 1, false, 0, 650, Some(400)), (1000, 1, true, 0, 1000, None),
    ]);
}
