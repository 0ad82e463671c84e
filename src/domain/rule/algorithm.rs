//! What an algorithm says of itself: its kind and name, its parameters as the scripts take
//! them, its calendar, the most it admits at once, and its validation (each parameter
//! checked, the field named in every error).

use super::*;

impl Algorithm {
    /// Its entry in [`ALGORITHMS`].
    pub fn kind(&self) -> &'static AlgorithmKind {
        let name = match self {
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::BucketedWindow { .. } => "bucketed_window",
            Algorithm::Concurrency { .. } => "concurrency",
            Algorithm::Quota { .. } => "quota",
        };
        AlgorithmKind::named(name).expect("every algorithm is in the table")
    }

    /// The name used in documents and responses.
    pub fn name(&self) -> &'static str {
        self.kind().name
    }

    /// Its parameters in the table's order (what the check script takes as p1..p3; 0 for
    /// one an algorithm does not have).
    pub fn params(&self) -> [u64; 3] {
        match *self {
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms } => [limit, window_ms, 0],
            Algorithm::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => [capacity, refill_tokens, refill_period_ms],
            Algorithm::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => [capacity, leak_tokens, leak_period_ms],
            Algorithm::Gcra {
                rate,
                period_ms,
                burst,
            } => [rate, period_ms, burst],
            Algorithm::BucketedWindow {
                limit,
                window_ms,
                bucket_ms,
            } => [limit, window_ms, bucket_ms],
            Algorithm::Concurrency { limit, lease_ms } => [limit, lease_ms, 0],
            Algorithm::Quota { limit, .. } => [limit, 0, 0],
        }
    }

    /// A quota's calendar.
    pub fn calendar(&self) -> Option<Calendar> {
        match *self {
            Algorithm::Quota {
                period,
                time_zone,
                start_day,
                start_month,
                ..
            } => Some(Calendar {
                period,
                zone: time_zone,
                start_day,
                start_month,
            }),
            _ => None,
        }
    }

    /// The most one request may cost and still be admitted by an empty rule.
    pub fn max_admissible(&self) -> u64 {
        match *self {
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::BucketedWindow { limit, .. }
            | Algorithm::Concurrency { limit, .. }
            | Algorithm::Quota { limit, .. } => limit,
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity
            }
            Algorithm::Gcra { burst, .. } => burst + 1,
        }
    }

    /// The window the IETF `RateLimit-Policy` header advertises, in whole seconds (≥ 1).
    pub fn window_seconds(&self) -> u64 {
        let ms = match *self {
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingLog { window_ms, .. }
            | Algorithm::SlidingWindow { window_ms, .. }
            | Algorithm::BucketedWindow { window_ms, .. } => window_ms,
            // Time for an empty bucket to refill completely.
            Algorithm::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => capacity.saturating_mul(refill_period_ms) / refill_tokens.max(1),
            Algorithm::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => capacity.saturating_mul(leak_period_ms) / leak_tokens.max(1),
            Algorithm::Gcra {
                rate,
                period_ms,
                burst,
            } => (burst + 1).saturating_mul(period_ms) / rate.max(1),
            // How long a lease is held unless released.
            Algorithm::Concurrency { lease_ms, .. } => lease_ms,
            Algorithm::Quota { period, .. } => period.nominal_seconds() * 1000,
        };
        ms.div_ceil(1000).max(1)
    }

    /// Checks every parameter of rule number `rule`; the error names the first that is out
    /// of range (`rules[<rule>].<field>`).
    pub(super) fn validate(&self, rule: usize) -> Result<(), PolicyError> {
        let amount = |name: &str, v: u64| check_amount(rule, name, v);
        let period = |name: &str, v: u64| check_period(rule, name, v);
        match *self {
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms } => {
                amount("limit", limit)?;
                period("window_ms", window_ms)?;
                if matches!(self, Algorithm::SlidingLog { .. }) && limit > 100_000 {
                    return Err(PolicyError::field(
                        field(rule, "limit"),
                        "a sliding_log keeps one entry per request: at most 100000; use sliding_window for more",
                    ));
                }
            }
            Algorithm::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => {
                amount("capacity", capacity)?;
                amount("refill_tokens", refill_tokens)?;
                period("refill_period_ms", refill_period_ms)?;
            }
            Algorithm::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => {
                amount("capacity", capacity)?;
                amount("leak_tokens", leak_tokens)?;
                period("leak_period_ms", leak_period_ms)?;
            }
            Algorithm::Gcra {
                rate,
                period_ms,
                burst,
            } => {
                amount("rate", rate)?;
                period("period_ms", period_ms)?;
                if burst >= MAX_AMOUNT {
                    return Err(PolicyError::field(
                        field(rule, "burst"),
                        format!("must be between 0 and {}", MAX_AMOUNT - 1),
                    ));
                }
            }
            Algorithm::BucketedWindow {
                limit,
                window_ms,
                bucket_ms,
            } => {
                amount("limit", limit)?;
                check_buckets(rule, window_ms, bucket_ms)?;
            }
            Algorithm::Concurrency { limit, lease_ms } => check_leases(rule, limit, lease_ms)?,
            Algorithm::Quota {
                limit,
                period,
                start_day,
                start_month,
                ..
            } => {
                amount("limit", limit)?;
                check_quota_start(rule, period, start_day, start_month)?;
            }
        }
        Ok(())
    }
}

/// The name errors give the field `name` of rule number `rule`: `rules[<rule>].<name>`.
pub(super) fn field(rule: usize, name: &str) -> String {
    format!("rules[{rule}].{name}")
}

/// Checks that `v`, the field `name` of rule `rule`, is an amount: 1 to [`MAX_AMOUNT`].
pub(super) fn check_amount(rule: usize, name: &str, v: u64) -> Result<(), PolicyError> {
    if v == 0 || v > MAX_AMOUNT {
        return Err(PolicyError::field(
            field(rule, name),
            format!("must be between 1 and {MAX_AMOUNT}"),
        ));
    }
    Ok(())
}

/// Checks that `v`, the field `name` of rule `rule`, is a period: 1 to [`MAX_PERIOD_MS`]
/// milliseconds.
pub(super) fn check_period(rule: usize, name: &str, v: u64) -> Result<(), PolicyError> {
    if v == 0 || v > MAX_PERIOD_MS {
        return Err(PolicyError::field(
            field(rule, name),
            format!("must be between 1 and {MAX_PERIOD_MS} milliseconds"),
        ));
    }
    Ok(())
}

/// Checks a bucketed window's periods: both in range, and the window a whole number of
/// buckets, at most [`MAX_BUCKETS`].
pub(super) fn check_buckets(
    rule: usize,
    window_ms: u64,
    bucket_ms: u64,
) -> Result<(), PolicyError> {
    check_period(rule, "window_ms", window_ms)?;
    check_period(rule, "bucket_ms", bucket_ms)?;
    if !window_ms.is_multiple_of(bucket_ms) {
        return Err(PolicyError::field(
            field(rule, "bucket_ms"),
            "must divide window_ms exactly",
        ));
    }
    if window_ms / bucket_ms > MAX_BUCKETS {
        return Err(PolicyError::field(
            field(rule, "bucket_ms"),
            format!("window_ms / bucket_ms must be at most {MAX_BUCKETS}"),
        ));
    }
    Ok(())
}

/// Checks a concurrency rule's leases: at most [`MAX_LEASES`] at once, each held at most
/// [`MAX_LEASE_MS`].
pub(super) fn check_leases(rule: usize, limit: u64, lease_ms: u64) -> Result<(), PolicyError> {
    if limit == 0 || limit > MAX_LEASES {
        return Err(PolicyError::field(
            field(rule, "limit"),
            format!("must be between 1 and {MAX_LEASES} (each lease is kept in Redis)"),
        ));
    }
    if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
        return Err(PolicyError::field(
            field(rule, "lease_ms"),
            format!(
                "must be between 1 and {MAX_LEASE_MS} milliseconds (a day); renew longer leases"
            ),
        ));
    }
    Ok(())
}

/// Checks where a quota's periods start: `start_day` a day its `period` has (none for a
/// daily quota), `start_month` a month and only for a yearly one (0: not given).
pub(super) fn check_quota_start(
    rule: usize,
    period: Period,
    start_day: u8,
    start_month: u8,
) -> Result<(), PolicyError> {
    let days = match period {
        Period::Day => 0,
        Period::Week => 7,
        Period::Month | Period::Year => 31,
    };
    if start_day > days {
        return Err(PolicyError::field(
            field(rule, "start_day"),
            match period {
                Period::Day => {
                    "a daily quota starts every day at midnight: leave start_day out".to_owned()
                }
                Period::Week => "must be an ISO weekday: 1 (Monday) to 7 (Sunday)".to_owned(),
                _ => {
                    "must be a day of the month, 1 to 31 (the month's last day when it is shorter)"
                        .to_owned()
                }
            },
        ));
    }
    if start_month > 12 || (start_month > 0 && period != Period::Year) {
        return Err(PolicyError::field(
            field(rule, "start_month"),
            if period == Period::Year {
                "must be a month, 1 to 12"
            } else {
                "only a yearly quota has a start_month"
            },
        ));
    }
    Ok(())
}
