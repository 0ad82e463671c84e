//! A sampled record: past its budget, a policy's record keeps the checks of one identifier
//! in 2^level (the identifier its first counted dimension names, hashed the same way by
//! every instance and version), whole, so each kept identifier's sequence replays exactly;
//! totals are then estimates, with a bound.
//!
//! The level follows the policy's rate (all instances' checks of the last ten seconds): the
//! lowest at which a day at that rate fits the record's budget. The identifiers kept at a
//! level are among those kept at every lower one, so a replay keeps the checks that the
//! highest level in its window keeps, whole, and scales by 2^level.

use super::Recorded;
use crate::domain::{Identifier, Policy};

/// The highest sampling level: one identifier in about a million.
pub const MAX_LEVEL: u8 = 20;

/// Which of `ids` a check is sampled by: the first one whose dimension a rule of `policy`
/// counts (in the rules' order), else the first.
pub fn unit_of(policy: &Policy, ids: &[Identifier]) -> usize {
    policy
        .rules
        .iter()
        .find_map(|rule| {
            ids.iter()
                .position(|id| rule.applies_to(id.dimension().as_str()))
        })
        .unwrap_or(0)
}

/// Whether sampling at `level` keeps the checks of `identifier`.
pub fn keeps(identifier: &Identifier, level: u8) -> bool {
    if level == 0 {
        return true;
    }
    // XXH3 is specified: the same on every instance, version and machine. One call over
    // `dimension NUL value`, on the stack when it fits (every identifier of a check does).
    let (dimension, value) = (
        identifier.dimension().as_str().as_bytes(),
        identifier.value().as_bytes(),
    );
    let len = dimension.len() + 1 + value.len();
    let digest = if len <= 256 {
        let mut buf = [0u8; 256];
        buf[..dimension.len()].copy_from_slice(dimension);
        buf[dimension.len() + 1..len].copy_from_slice(value);
        xxhash_rust::xxh3::xxh3_64(&buf[..len])
    } else {
        let mut joined = Vec::with_capacity(len);
        joined.extend_from_slice(dimension);
        joined.push(0);
        joined.extend_from_slice(value);
        xxhash_rust::xxh3::xxh3_64(&joined)
    };
    digest >> (64 - u32::from(level.min(MAX_LEVEL))) == 0
}

/// Whether `check`, recorded at its own level, is kept at `level` (no lower than its own).
pub fn kept_at(check: &Recorded, level: u8) -> bool {
    level <= check.level
        || check
            .identifiers
            .get(usize::from(check.unit))
            .is_none_or(|unit| keeps(unit, level))
}

/// The level a policy's record samples at when `seen` checks of it came in `period_ms`: the
/// lowest at which a day at that rate fits in `max` recorded checks.
pub fn level_for(seen: u64, period_ms: i64, max: u64, day_ms: i64) -> u8 {
    if max == 0 || period_ms <= 0 {
        return 0;
    }
    let per_day = seen as f64 * day_ms as f64 / period_ms as f64;
    if per_day <= max as f64 {
        return 0;
    }
    (per_day / max as f64)
        .log2()
        .ceil()
        .clamp(0.0, f64::from(MAX_LEVEL)) as u8
}

/// The level a burst of `seen` checks needs when `burst` is what a moment may record: one
/// more each time it doubles past it.
pub fn burst_level(seen: u64, burst: u64) -> u8 {
    let over = seen / burst.max(1);
    if over == 0 {
        return 0;
    }
    u8::try_from(u64::BITS - over.leading_zeros())
        .unwrap_or(MAX_LEVEL)
        .min(MAX_LEVEL)
}

/// An estimate's bound (at least `one_in`): about two standard errors of a total counted over sampled
/// identifiers (`per_unit`: the count each kept identifier contributed), each kept with
/// probability 1/`one_in` (the Horvitz–Thompson variance of a cluster sample).
pub fn bound(per_unit: impl Iterator<Item = u64>, one_in: u64) -> u64 {
    if one_in <= 1 {
        return 0;
    }
    let squares: f64 = per_unit.map(|c| (c as f64) * (c as f64)).sum();
    let spread = (2.0 * (one_in as f64 * (one_in as f64 - 1.0) * squares).sqrt()).ceil() as u64;
    // None among the kept identifiers is not none at all: an identifier left out could have
    // had as many as one kept one stands for.
    spread.max(one_in)
}
