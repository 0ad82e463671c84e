//! The reference model of every algorithm: `step(state, now, cost, rule) -> (state, Outcome)`.
//!
//! Each Lua script in `lua/` implements exactly this arithmetic, in the same order and with
//! the same IEEE doubles (Lua 5.1 has no other number type), so the integration tests can run
//! one sequence through both and demand identical outcomes. Time is microseconds on Redis's
//! clock; durations in outcomes are milliseconds rounded up.
//!
//! Shared conventions:
//! - a denied request changes nothing, unless the rule has `count_denied`: then window
//!   counters count it, a sliding log fills up to its limit, and buckets are left empty;
//! - `cost == 0` peeks: always allowed, nothing written;
//! - a cost the rule can never admit is denied with `retry_after_ms: None`;
//! - `reset_ms` is the time until the rule is back to full capacity (0 when it is).

use serde::{Deserialize, Serialize};

use super::{
    calendar::{self, Calendar},
    rule::Algorithm,
};

mod report;
pub use report::*;

mod buckets;
use buckets::*;

/// What one rule says about one identifier for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub allowed: bool,
    /// The most this rule admits at once (for GCRA, `burst + 1`).
    pub limit: u64,
    /// What is left after this request (or now, if it was not consumed).
    pub remaining: u64,
    /// Milliseconds until the rule is back to full capacity.
    pub reset_ms: u64,
    /// Milliseconds until the same request would be allowed; `None` when allowed, or when
    /// the cost is larger than the rule could ever admit.
    pub retry_after_ms: Option<u64>,
    /// Leaky bucket only: milliseconds a queueing caller should wait to stay smooth.
    pub delay_ms: u64,
    /// Denied by the rule's penalty box (`block_ms`): it denied this identifier a moment
    /// ago and holds it until `retry_after_ms`, whatever its own state says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub penalty: bool,
}

/// How many fixed windows the stored window index tells apart (it is kept mod this).
pub const FIXED_WINDOW_SLOTS: i64 = 1 << 20;
/// Where a fixed window's count saturates (only counted denials get there), so that
/// count * slots stays an exact double in Lua.
pub const FIXED_WINDOW_MAX_COUNT: i64 = (1 << 33) - 1;

/// The state one rule keeps for one identifier, as the Lua scripts store it in Redis.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// `window` is the clock-aligned window index, `count` what it has admitted. Redis keeps
    /// the index mod [`FIXED_WINDOW_SLOTS`] only (see `lua/fixed_window.lua`), and so does
    /// the model when it tells windows apart.
    FixedWindow {
        window: i64,
        count: i64,
    },
    /// Admissions, oldest first: (time µs, units of cost admitted), one per counted
    /// check, not one per unit (see `lua/sliding_log.lua`).
    SlidingLog {
        entries: Vec<(i64, i64)>,
    },
    /// Counts of the current window and the one before it.
    SlidingWindow {
        window: i64,
        current: i64,
        previous: i64,
    },
    TokenBucket {
        tokens: f64,
        last_us: i64,
    },
    LeakyBucket {
        level: f64,
        last_us: i64,
    },
    /// How many requests the theoretical arrival time stood ahead of `at_us`: counted in
    /// requests, not µs, so the arithmetic stays exact at every rate (see `lua/gcra.lua`).
    Gcra {
        debt: f64,
        at_us: i64,
    },
    /// `slots[i]` counts bucket indexes `≡ i (mod slots.len())`; `last` is the newest
    /// absolute bucket index written.
    BucketedWindow {
        last: i64,
        slots: Vec<i64>,
    },
    /// Leases not yet reclaimed: (expiry µs, cost), in the order they were taken.
    Concurrency {
        leases: Vec<(i64, i64)>,
    },
    /// `period` is the current calendar period's start in whole minutes since the epoch
    /// (Redis keeps it mod [`FIXED_WINDOW_SLOTS`]), `count` what it has admitted.
    Quota {
        period: i64,
        count: i64,
    },
}

/// The longest duration an outcome carries or a key's TTL may be: 10^13 ms, 317 years
/// (see `lua/prelude.lua`: a slower refill than that cannot be a Redis TTL).
pub const MAX_DURATION_MS: u64 = 10_000_000_000_000;

/// Milliseconds, rounded up, of a non-negative duration in microseconds, at most
/// [`MAX_DURATION_MS`].
pub fn ceil_ms(us: f64) -> u64 {
    if us <= 0.0 {
        0
    } else {
        ((us / 1000.0).ceil() as u64).min(MAX_DURATION_MS)
    }
}

fn floor_div(a: i64, b: i64) -> i64 {
    (a as f64 / b as f64).floor() as i64
}

/// Advances `state` by one request of `cost` at `now_us` under `algorithm`.
///
/// Returns the state to store (unchanged when nothing was consumed) and the outcome.
pub fn step(
    state: Option<&State>,
    now_us: i64,
    cost: u64,
    algorithm: &Algorithm,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let cost = cost as i64;
    match *algorithm {
        Algorithm::FixedWindow { limit, window_ms } => fixed_window(
            state,
            now_us,
            cost,
            limit as i64,
            window_ms as i64 * 1000,
            count_denied,
        ),
        Algorithm::SlidingLog { limit, window_ms } => sliding_log(
            state,
            now_us,
            cost,
            limit as i64,
            window_ms as i64 * 1000,
            count_denied,
        ),
        Algorithm::SlidingWindow { limit, window_ms } => sliding_window(
            state,
            now_us,
            cost,
            limit as i64,
            window_ms as i64 * 1000,
            count_denied,
        ),
        Algorithm::BucketedWindow {
            limit,
            window_ms,
            bucket_ms,
        } => bucketed_window(
            state,
            now_us,
            cost,
            limit as i64,
            window_ms as i64 * 1000,
            bucket_ms as i64 * 1000,
            count_denied,
        ),
        Algorithm::Quota { limit, .. } => quota(
            state,
            now_us,
            cost,
            limit as i64,
            &algorithm.calendar().expect("a quota has a calendar"),
            count_denied,
        ),
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } | Algorithm::Gcra { .. } => {
            step_rate(state, now_us, cost, algorithm, count_denied)
        }
        Algorithm::Concurrency { limit, lease_ms } => {
            concurrency(state, now_us, cost, limit as i64, lease_ms as i64 * 1000)
        }
    }
}

/// [`step`] for the algorithms that fill or drain at a steady rate: token and leaky
/// buckets, and GCRA.
fn step_rate(
    state: Option<&State>,
    now_us: i64,
    cost: i64,
    algorithm: &Algorithm,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    match *algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => token_bucket(
            state,
            now_us,
            cost,
            capacity as f64,
            refill_tokens as f64 / (refill_period_ms as f64 * 1000.0),
            count_denied,
        ),
        Algorithm::LeakyBucket {
            capacity,
            leak_tokens,
            leak_period_ms,
        } => leaky_bucket(
            state,
            now_us,
            cost,
            capacity as f64,
            leak_tokens as f64 / (leak_period_ms as f64 * 1000.0),
            count_denied,
        ),
        Algorithm::Gcra {
            rate,
            period_ms,
            burst,
        } => gcra(state, now_us, cost, rate, period_ms, burst, count_denied),
        _ => unreachable!("step sends only token buckets, leaky buckets and GCRA here"),
    }
}

fn outcome(
    allowed: bool,
    limit: i64,
    remaining: i64,
    reset_us: f64,
    retry_us: Option<f64>,
) -> Outcome {
    Outcome {
        allowed,
        limit: limit as u64,
        remaining: remaining.max(0) as u64,
        reset_ms: ceil_ms(reset_us),
        retry_after_ms: retry_us.map(ceil_ms),
        delay_ms: 0,
        penalty: false,
    }
}

fn fixed_window(
    state: Option<&State>,
    now: i64,
    cost: i64,
    limit: i64,
    window: i64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let w = floor_div(now, window);
    let count = match state {
        Some(State::FixedWindow { window, count })
            if window.rem_euclid(FIXED_WINDOW_SLOTS) == w.rem_euclid(FIXED_WINDOW_SLOTS) =>
        {
            *count
        }
        _ => 0,
    };
    let (after, out) = counted(count, (w + 1) * window - now, cost, limit, count_denied);
    (
        after.map(|count| State::FixedWindow { window: w, count }),
        out,
    )
}

/// A count that starts again where its window (or period) ends, `to_end` µs from now: the
/// count after `cost` when it is written, and the outcome (fixed windows and quotas).
fn counted(
    count: i64,
    to_end: i64,
    cost: i64,
    limit: i64,
    count_denied: bool,
) -> (Option<i64>, Outcome) {
    let allowed = count + cost <= limit;
    let consume = cost > 0 && (allowed || count_denied);
    let after = if consume {
        (count + cost).min(FIXED_WINDOW_MAX_COUNT)
    } else {
        count
    };
    let reset = if after > 0 { to_end as f64 } else { 0.0 };
    let retry = (!allowed && cost <= limit).then_some(to_end as f64);
    (
        consume.then_some(after),
        outcome(allowed, limit, limit - after, reset, retry),
    )
}

/// A quota is a fixed window whose edges are calendar boundaries: the period is told apart
/// by its start minute, as a fixed window by its index.
fn quota(
    state: Option<&State>,
    now: i64,
    cost: i64,
    limit: i64,
    calendar: &Calendar,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let (start, end) = calendar::period_at(calendar, now);
    let minute = floor_div(start, 60_000_000);
    let count = match state {
        Some(State::Quota { period, count })
            if period.rem_euclid(FIXED_WINDOW_SLOTS) == minute.rem_euclid(FIXED_WINDOW_SLOTS) =>
        {
            *count
        }
        _ => 0,
    };
    let (after, out) = counted(count, end - now, cost, limit, count_denied);
    (
        after.map(|count| State::Quota {
            period: minute,
            count,
        }),
        out,
    )
}

/// Leases held at `now`: those taken whose expiry has not come. A denied request takes no
/// lease, whatever `count_denied` says (the rule refuses that flag).
fn concurrency(
    state: Option<&State>,
    now: i64,
    cost: i64,
    limit: i64,
    lease: i64,
) -> (Option<State>, Outcome) {
    let mut leases: Vec<(i64, i64)> = match state {
        Some(State::Concurrency { leases }) => {
            leases.iter().copied().filter(|(e, _)| *e > now).collect()
        }
        _ => Vec::new(),
    };
    let held: i64 = leases.iter().map(|(_, c)| c).sum();
    let allowed = held + cost <= limit;
    let retry = if !allowed && cost <= limit {
        // When enough of the soonest-expiring leases have run out (a release may come sooner).
        let need = held + cost - limit;
        let mut by_expiry = leases.clone();
        by_expiry.sort_by_key(|(e, _)| *e);
        let mut freed = 0;
        by_expiry.iter().find_map(|(e, c)| {
            freed += c;
            (freed >= need).then_some((e - now) as f64)
        })
    } else {
        None
    };
    let consume = cost > 0 && allowed;
    if consume {
        leases.push((now + lease, cost));
    }
    let after = if consume { held + cost } else { held };
    let reset = leases
        .iter()
        .map(|(e, _)| e - now)
        .max()
        .map_or(0.0, |us| us as f64);
    let new_state = consume.then_some(State::Concurrency { leases });
    (
        new_state,
        outcome(allowed, limit, limit - after, reset, retry),
    )
}

fn sliding_log(
    state: Option<&State>,
    now: i64,
    cost: i64,
    limit: i64,
    window: i64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let mut entries: Vec<(i64, i64)> = match state {
        Some(State::SlidingLog { entries }) => entries
            .iter()
            .copied()
            .filter(|(t, _)| *t > now - window)
            .collect(),
        _ => Vec::new(),
    };
    let count: i64 = entries.iter().map(|(_, w)| w).sum();
    let allowed = count + cost <= limit;
    let retry = if !allowed && cost <= limit {
        // The oldest admission by whose leaving enough units have left.
        let k = count + cost - limit;
        let mut left = 0;
        entries
            .iter()
            .find(|(_, w)| {
                left += w;
                left >= k
            })
            .map(|(t, _)| (t + window - now) as f64)
    } else {
        None
    };
    let consume = cost > 0 && (allowed || count_denied);
    let mut added = 0;
    if consume {
        // Never more than `limit` units: a counted denial only fills the log up.
        // Times only grow along the log: a clock that stepped back appends at the newest.
        added = cost.min(limit - count).max(0);
        let at = entries.last().map_or(now, |(newest, _)| now.max(*newest));
        if added > 0 {
            entries.push((at, added));
        }
    }
    let remaining = limit - count - added;
    let reset = entries
        .last()
        .map_or(0.0, |(newest, _)| (newest + window - now) as f64);
    let new_state = consume.then_some(State::SlidingLog { entries });
    (new_state, outcome(allowed, limit, remaining, reset, retry))
}

fn sliding_window(
    state: Option<&State>,
    now: i64,
    cost: i64,
    limit: i64,
    window: i64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let w = floor_div(now, window);
    let (current, previous) = match state {
        Some(State::SlidingWindow {
            window: sw,
            current,
            previous,
        }) if *sw == w => (*current, *previous),
        Some(State::SlidingWindow {
            window: sw,
            current,
            ..
        }) if *sw == w - 1 => (0, *current),
        _ => (0, 0),
    };
    let elapsed = now - w * window;
    let weighted = (previous as f64 * (window - elapsed) as f64 / window as f64).floor() as i64;
    let allowed = weighted + current + cost <= limit;
    let consume = cost > 0 && (allowed || count_denied);
    let current_after = if consume { current + cost } else { current };
    let remaining = limit - weighted - current_after;
    let to_end = (window - elapsed) as f64;
    let reset = if current_after > 0 {
        to_end + window as f64
    } else if previous > 0 {
        to_end
    } else {
        0.0
    };
    let retry = if allowed || cost > limit {
        None
    } else {
        // Smallest elapsed time e' at which floor(prev·(W−e')/W) + cur + cost ≤ limit.
        let spare = limit - current - cost;
        if spare >= 0 {
            let x = window as f64 - (spare + 1) as f64 * window as f64 / previous as f64;
            Some((x.floor() + 1.0) - elapsed as f64)
        } else {
            // Not in this window: the current count becomes the previous one.
            let x = window as f64 - (limit - cost + 1) as f64 * window as f64 / current as f64;
            Some(to_end + (x.floor() + 1.0).max(0.0))
        }
    };
    let new_state = consume.then_some(State::SlidingWindow {
        window: w,
        current: current_after,
        previous,
    });
    (new_state, outcome(allowed, limit, remaining, reset, retry))
}

fn bucketed_window(
    state: Option<&State>,
    now: i64,
    cost: i64,
    limit: i64,
    window: i64,
    bucket: i64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let n = window / bucket;
    let cur = floor_div(now, bucket);
    // Absolute bucket index held by each slot, or None when the slot is stale.
    let mut slots = vec![0i64; n as usize];
    if let Some(State::BucketedWindow {
        last,
        slots: stored,
    }) = state
    {
        for (i, count) in stored.iter().enumerate() {
            // The newest absolute index a ≤ last with a ≡ i (mod n).
            let a = last - (last - i as i64).rem_euclid(n);
            if a > cur - n && a <= cur {
                slots[i] = *count;
            }
        }
    }
    let count: i64 = slots.iter().sum();
    let allowed = count + cost <= limit;
    let retry = if !allowed && cost <= limit {
        let need = count + cost - limit;
        let mut freed = 0;
        let mut at = None;
        for a in (cur - n + 1)..=cur {
            freed += slots[a.rem_euclid(n) as usize];
            if freed >= need {
                at = Some(((a + n) * bucket - now) as f64);
                break;
            }
        }
        at
    } else {
        None
    };
    let consume = cost > 0 && (allowed || count_denied);
    if consume {
        slots[cur.rem_euclid(n) as usize] += cost;
    }
    let after: i64 = slots.iter().sum();
    let newest = ((cur - n + 1)..=cur)
        .rev()
        .find(|a| slots[a.rem_euclid(n) as usize] > 0);
    let reset = newest.map_or(0.0, |a| ((a + n) * bucket - now) as f64);
    let new_state = consume.then_some(State::BucketedWindow { last: cur, slots });
    (
        new_state,
        outcome(allowed, limit, limit - after, reset, retry),
    )
}

#[cfg(test)]
mod tests;
