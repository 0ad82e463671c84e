//! Usage reported after a check: a cost added to or given back to an identifier's state,
//! taking from the newest entries or buckets first, so a refund undoes what was taken.

use super::*;

/// Usage reported after the fact (`POST /api/v1/report`): the state once `cost` is added, as
/// a counted denial would add it (even past the limit: the next check is then denied), or,
/// for a negative cost, once it is given back (never below nothing; see [`give_back`]).
/// Concurrency rules are left alone: their leases are released instead.
pub fn report(
    state: Option<&State>,
    now_us: i64,
    cost: i64,
    algorithm: &Algorithm,
) -> Option<State> {
    if cost == 0 || matches!(algorithm, Algorithm::Concurrency { .. }) {
        return state.cloned();
    }
    if cost > 0 {
        let (after, _) = step(state, now_us, cost as u64, algorithm, true);
        after.or_else(|| state.cloned())
    } else {
        give_back(state, now_us, cost.unsigned_abs(), algorithm)
    }
}

/// `cost` given back at `now_us` (`lua/*.lua`: GIVEBACKS, else REFUNDS): windows and quotas
/// from the current window or period, a log its newest entries in the window, buckets of
/// tokens or water and GCRA's debt as far as they go, a bucketed window from its newest
/// counted buckets. Never below nothing.
pub fn give_back(
    state: Option<&State>,
    now_us: i64,
    cost: u64,
    algorithm: &Algorithm,
) -> Option<State> {
    let cost = cost as i64;
    let state = state?;
    let given = give_back_to_window(state, now_us, cost, algorithm)
        .or_else(|| give_back_to_bucket(state, now_us, cost, algorithm));
    given.or_else(|| Some(state.clone()))
}

/// A window's, a log's or a quota's `state` with `cost` given back (see [`give_back`]);
/// `None` when its window or period has passed, or `state` is not one of theirs.
pub(super) fn give_back_to_window(
    state: &State,
    now_us: i64,
    cost: i64,
    algorithm: &Algorithm,
) -> Option<State> {
    match (state, *algorithm) {
        (State::FixedWindow { window, count }, Algorithm::FixedWindow { window_ms, .. }) => {
            let w = floor_div(now_us, window_ms as i64 * 1000);
            (window.rem_euclid(FIXED_WINDOW_SLOTS) == w.rem_euclid(FIXED_WINDOW_SLOTS)).then(|| {
                State::FixedWindow {
                    window: w,
                    count: (count - cost).max(0),
                }
            })
        }
        (State::Quota { period, count }, Algorithm::Quota { .. }) => {
            let calendar = algorithm.calendar().expect("a quota has a calendar");
            let (start, _) = calendar::period_at(&calendar, now_us);
            let minute = floor_div(start, 60_000_000);
            (period.rem_euclid(FIXED_WINDOW_SLOTS) == minute.rem_euclid(FIXED_WINDOW_SLOTS)).then(
                || State::Quota {
                    period: minute,
                    count: (count - cost).max(0),
                },
            )
        }
        (
            State::SlidingWindow {
                window,
                current,
                previous,
            },
            Algorithm::SlidingWindow { window_ms, .. },
        ) => {
            (*window == floor_div(now_us, window_ms as i64 * 1000)).then(|| State::SlidingWindow {
                window: *window,
                current: (current - cost).max(0),
                previous: *previous,
            })
        }
        (State::SlidingLog { entries }, Algorithm::SlidingLog { window_ms, .. }) => {
            let horizon = now_us - window_ms as i64 * 1000;
            Some(State::SlidingLog {
                entries: take_from_newest_entries(entries, horizon, cost),
            })
        }
        (
            State::BucketedWindow { last, slots },
            Algorithm::BucketedWindow {
                window_ms,
                bucket_ms,
                ..
            },
        ) => {
            let n = window_ms as i64 / bucket_ms as i64;
            let cur = floor_div(now_us, bucket_ms as i64 * 1000);
            Some(State::BucketedWindow {
                last: *last,
                slots: take_from_newest_buckets(slots, *last, cur, n, cost),
            })
        }
        _ => None,
    }
}

/// A sliding log's `entries` with `cost` units taken off the newest ones still in the
/// window (after `horizon`), off the tail; an entry left with nothing is dropped.
pub(super) fn take_from_newest_entries(
    entries: &[(i64, i64)],
    horizon: i64,
    cost: i64,
) -> Vec<(i64, i64)> {
    let mut entries = entries.to_vec();
    let mut left = cost;
    while left > 0 {
        match entries.last_mut() {
            Some((t, w)) if *t > horizon => {
                let take = left.min(*w);
                *w -= take;
                left -= take;
                if *w == 0 {
                    entries.pop();
                }
            }
            _ => break,
        }
    }
    entries
}

/// A bucketed window's `slots` (`n` of them, the newest written bucket `last`) with `cost`
/// taken off its newest counted buckets, from bucket `cur` (now) or `last` back, never
/// further back than the window.
pub(super) fn take_from_newest_buckets(
    slots: &[i64],
    last: i64,
    cur: i64,
    n: i64,
    cost: i64,
) -> Vec<i64> {
    let mut slots = slots.to_vec();
    let mut left = cost;
    let mut a = cur.min(last);
    while left > 0 && a > cur - n && a > last - n {
        let slot = &mut slots[a.rem_euclid(n) as usize];
        let take = (*slot).min(left);
        *slot -= take;
        left -= take;
        a -= 1;
    }
    slots
}

/// A token bucket's, a leaky bucket's or GCRA's `state` with `cost` given back (see
/// [`give_back`]); `None` when `state` is not one of theirs.
pub(super) fn give_back_to_bucket(
    state: &State,
    now_us: i64,
    cost: i64,
    algorithm: &Algorithm,
) -> Option<State> {
    match (state, *algorithm) {
        (State::TokenBucket { tokens, last_us }, Algorithm::TokenBucket { capacity, .. }) => {
            Some(State::TokenBucket {
                tokens: (capacity as f64).min(tokens + cost as f64),
                last_us: *last_us,
            })
        }
        (State::LeakyBucket { level, last_us }, Algorithm::LeakyBucket { .. }) => {
            Some(State::LeakyBucket {
                level: (level - cost as f64).max(0.0),
                last_us: *last_us,
            })
        }
        (
            State::Gcra { debt, at_us },
            Algorithm::Gcra {
                rate, period_ms, ..
            },
        ) => {
            let drained = (debt
                - (now_us - at_us).max(0) as f64 * rate as f64 / (period_ms as f64 * 1000.0))
                .max(0.0);
            Some(State::Gcra {
                debt: (drained - cost as f64).max(0.0),
                at_us: now_us.max(*at_us),
            })
        }
        _ => None,
    }
}
