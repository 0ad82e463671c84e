//! The bucket algorithms' steps: token bucket, leaky bucket and GCRA, each a pure function
//! of the state, the time and the cost.

use super::*;

pub(super) fn token_bucket(
    state: Option<&State>,
    now: i64,
    cost: i64,
    capacity: f64,
    rate: f64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let mut tokens = match state {
        Some(State::TokenBucket { tokens, last_us }) => {
            let elapsed = (now - last_us).max(0) as f64;
            capacity.min(tokens + elapsed * rate)
        }
        _ => capacity,
    };
    let cost_f = cost as f64;
    let allowed = cost_f <= tokens;
    let retry = (!allowed && cost_f <= capacity).then(|| (cost_f - tokens) / rate);
    let consume = cost > 0 && (allowed || count_denied);
    if consume {
        tokens = (tokens - cost_f).max(0.0);
    }
    let reset = (capacity - tokens) / rate;
    let new_state = consume.then_some(State::TokenBucket {
        tokens,
        last_us: now,
    });
    (
        new_state,
        outcome(
            allowed,
            capacity as i64,
            tokens.floor() as i64,
            reset,
            retry,
        ),
    )
}

pub(super) fn leaky_bucket(
    state: Option<&State>,
    now: i64,
    cost: i64,
    capacity: f64,
    rate: f64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let mut level = match state {
        Some(State::LeakyBucket { level, last_us }) => {
            let elapsed = (now - last_us).max(0) as f64;
            (level - elapsed * rate).max(0.0)
        }
        _ => 0.0,
    };
    let cost_f = cost as f64;
    let allowed = level + cost_f <= capacity;
    let delay = if allowed { level / rate } else { 0.0 };
    let retry = (!allowed && cost_f <= capacity).then(|| (level + cost_f - capacity) / rate);
    let consume = cost > 0 && (allowed || count_denied);
    if consume {
        level = capacity.min(level + cost_f);
    }
    let reset = level / rate;
    let new_state = consume.then_some(State::LeakyBucket {
        level,
        last_us: now,
    });
    let mut out = outcome(
        allowed,
        capacity as i64,
        (capacity - level).floor() as i64,
        reset,
        retry,
    );
    out.delay_ms = ceil_ms(delay);
    (new_state, out)
}

pub(super) fn gcra(
    state: Option<&State>,
    now: i64,
    cost: i64,
    rate: u64,
    period_ms: u64,
    burst: u64,
    count_denied: bool,
) -> (Option<State>, Outcome) {
    let period = period_ms as f64 * 1000.0;
    let rate = rate as f64;
    let capacity = (burst + 1) as f64;
    let cost_f = cost as f64;
    let debt = match state {
        Some(State::Gcra { debt, at_us }) => {
            (debt - (now - at_us).max(0) as f64 * rate / period).max(0.0)
        }
        _ => 0.0,
    };
    let allowed = debt + cost_f <= capacity;
    let (after, write, retry) = if allowed {
        if cost > 0 {
            (debt + cost_f, true, None)
        } else {
            (debt, false, None)
        }
    } else {
        let retry = (cost_f <= capacity).then(|| (debt + cost_f - capacity) * period / rate);
        if count_denied && cost > 0 {
            // Counted while denied: the bucket is left empty.
            (capacity, true, retry)
        } else {
            (debt, false, retry)
        }
    };
    let ttl = after * period / rate;
    (
        write.then_some(State::Gcra {
            debt: after,
            at_us: now,
        }),
        outcome(
            allowed,
            burst as i64 + 1,
            (capacity - after).floor() as i64,
            ttl,
            retry,
        ),
    )
}
