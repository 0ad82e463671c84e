//! History: each policy's checks per minute, hour and day (allowed, denied, shadow-denied,
//! degraded), and the identifiers checked and denied most per hour and per day. Pure: the
//! periods and ranges, what a series covers, and merging the per-period top lists.
//!
//! Periods are UTC and aligned to the epoch (a day is 00:00 to 24:00 UTC). Counts are kept
//! in blocks, one Redis hash a block: the minutes of an hour, the hours of a day, 30 days.

use serde::{Deserialize, Serialize};

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;
const DAY_MS: i64 = 24 * HOUR_MS;

/// The scope of the counts and lists of every policy together (no policy has this name).
pub const ALL: &str = "*";

/// How finely a series is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    Minute,
    Hour,
    Day,
}

impl Step {
    pub const ALL: [Step; 3] = [Step::Minute, Step::Hour, Step::Day];

    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "minute" | "1m" => Ok(Self::Minute),
            "hour" | "1h" => Ok(Self::Hour),
            "day" | "1d" => Ok(Self::Day),
            _ => Err(format!("expected minute, hour or day, got {raw:?}")),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
        }
    }

    pub const fn ms(self) -> i64 {
        match self {
            Self::Minute => MINUTE_MS,
            Self::Hour => HOUR_MS,
            Self::Day => DAY_MS,
        }
    }

    /// How long counts of this step are kept: 48 hours of minutes, 90 days of hours,
    /// 400 days of days.
    pub const fn retention_ms(self) -> i64 {
        match self {
            Self::Minute => 48 * HOUR_MS,
            Self::Hour => 90 * DAY_MS,
            Self::Day => 400 * DAY_MS,
        }
    }

    /// Periods one block (one Redis hash) holds.
    pub const fn per_block(self) -> i64 {
        match self {
            Self::Minute => 60,
            Self::Hour => 24,
            Self::Day => 30,
        }
    }

    /// The period (its index since the epoch) that holds `ms`.
    pub const fn period_of(self, ms: i64) -> i64 {
        ms.div_euclid(self.ms())
    }

    /// The block that holds `period`, and the period's place in it.
    pub const fn block_of(self, period: i64) -> (i64, i64) {
        (
            period.div_euclid(self.per_block()),
            period.rem_euclid(self.per_block()),
        )
    }

    /// When a block's key may go: its last period's end plus the retention.
    pub const fn block_expiry_ms(self, block: i64) -> i64 {
        (block + 1) * self.per_block() * self.ms() + self.retention_ms()
    }
}

/// The time ranges the overview and the API offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Range {
    #[serde(rename = "1h")]
    Hour,
    #[serde(rename = "24h")]
    Day,
    #[serde(rename = "7d")]
    Week,
    #[serde(rename = "30d")]
    Month,
    #[serde(rename = "90d")]
    Quarter,
}

impl Range {
    pub const ALL: [Range; 5] = [
        Range::Hour,
        Range::Day,
        Range::Week,
        Range::Month,
        Range::Quarter,
    ];

    pub fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == raw)
            .ok_or_else(|| format!("expected 1h, 24h, 7d, 30d or 90d, got {raw:?}"))
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "1h",
            Self::Day => "24h",
            Self::Week => "7d",
            Self::Month => "30d",
            Self::Quarter => "90d",
        }
    }

    pub const fn ms(self) -> i64 {
        match self {
            Self::Hour => HOUR_MS,
            Self::Day => DAY_MS,
            Self::Week => 7 * DAY_MS,
            Self::Month => 30 * DAY_MS,
            Self::Quarter => 90 * DAY_MS,
        }
    }

    /// The step a chart of this range uses unless asked for another: at most 168 bars.
    pub const fn default_step(self) -> Step {
        match self {
            Self::Hour => Step::Minute,
            Self::Day | Self::Week => Step::Hour,
            Self::Month | Self::Quarter => Step::Day,
        }
    }

    /// Checks that `step` can draw this range: minutes are kept 48 hours, so they draw at
    /// most a day; a step longer than the range draws nothing useful.
    pub fn check_step(self, step: Step) -> Result<(), String> {
        if step == Step::Minute && self.ms() > DAY_MS {
            return Err(format!(
                "minutes are kept 48 hours: use hour or day for {}",
                self.as_str()
            ));
        }
        if step.ms() > self.ms() {
            return Err(format!(
                "a {} is longer than {}",
                step.as_str(),
                self.as_str()
            ));
        }
        Ok(())
    }

    /// The periods of `step` a series of this range ending at `now_ms` covers, oldest
    /// first: the current period and the ones before it, `range / step` in all.
    pub fn periods(self, step: Step, now_ms: i64) -> std::ops::RangeInclusive<i64> {
        let last = step.period_of(now_ms);
        let n = (self.ms() / step.ms()).max(1);
        (last - n + 1)..=last
    }

    /// The step whose top lists serve this range: hours up to a week, days beyond.
    pub const fn top_step(self) -> Step {
        match self {
            Self::Hour | Self::Day | Self::Week => Step::Hour,
            Self::Month | Self::Quarter => Step::Day,
        }
    }
}

/// One period's checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    /// Answered without Redis (its failure mode), whichever way.
    pub degraded: u64,
    /// Checks whose identifiers met no rule: let through uncounted, or refused by a strict
    /// policy (counted here only).
    #[serde(default)]
    pub unmatched: u64,
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.shadow_denied += other.shadow_denied;
        self.degraded += other.degraded;
        self.unmatched += other.unmatched;
    }

    pub fn total(&self) -> u64 {
        self.allowed + self.denied + self.shadow_denied + self.degraded + self.unmatched
    }

    /// Each figure with the one-letter code it is stored under.
    pub fn fields(&self) -> [(char, u64); 5] {
        [
            ('a', self.allowed),
            ('d', self.denied),
            ('s', self.shadow_denied),
            ('g', self.degraded),
            ('u', self.unmatched),
        ]
    }

    /// Adds `n` to the figure stored under `code`; `false` for an unknown code.
    pub fn add_code(&mut self, code: char, n: u64) -> bool {
        match code {
            'a' => self.allowed += n,
            'd' => self.denied += n,
            's' => self.shadow_denied += n,
            'g' => self.degraded += n,
            'u' => self.unmatched += n,
            _ => return false,
        }
        true
    }
}

/// What a check counts as in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    ShadowDenied,
    Degraded,
    /// Its identifiers met no rule (let through uncounted, or refused by a strict policy).
    Unmatched,
}

impl Outcome {
    /// What the metrics and logs call it (`spillway_checks_total{outcome}`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::ShadowDenied => "shadow_denied",
            Self::Degraded => "degraded",
            Self::Unmatched => "unmatched",
        }
    }

    pub fn counts(self) -> Counts {
        let mut c = Counts::default();
        match self {
            Self::Allowed => c.allowed = 1,
            Self::Denied => c.denied = 1,
            Self::ShadowDenied => c.shadow_denied = 1,
            Self::Degraded => c.degraded = 1,
            Self::Unmatched => c.unmatched = 1,
        }
        c
    }
}

/// Which top list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TopKind {
    Checked,
    Denied,
}

impl TopKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Checked => "checked",
            Self::Denied => "denied",
        }
    }
}

/// How many identifiers a period's top list keeps, and how many of one list an instance
/// adds in one flush (its largest of that flush): together at most 128, so a list stays in
/// Redis's compact encoding (a listpack of at most `zset-max-listpack-entries`, 128) when
/// each flush is added atomically.
pub const TOP_KEPT: usize = 64;
pub const TOP_SENT: usize = 64;

/// The state of the top lists' counts, for the API and the pages.
pub const TOP_ERROR: &str = "Each instance adds, every few seconds, the 64 identifiers it counted most in that time to each list, and each period's list keeps its 64 largest. A count is exact for an identifier that was in every addition and never dropped from the list; any other count is a lower bound.";

/// A member of the lists of every policy together: `<policy>|<dimension>=<value>`.
pub fn all_member(policy: &str, identifier: &str) -> String {
    format!("{policy}|{identifier}")
}

/// The policy and identifier of a member of the lists of every policy.
pub fn split_member(member: &str) -> (&str, &str) {
    member.split_once('|').unwrap_or(("", member))
}

/// The `n` largest of several periods' lists, summed per member; ties by member name.
pub fn merge_top<'a>(
    lists: impl IntoIterator<Item = &'a [(String, u64)]>,
    n: usize,
) -> Vec<(String, u64)> {
    let mut sums: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for list in lists {
        for (member, count) in list {
            *sums.entry(member.as_str()).or_default() += count;
        }
    }
    let mut all: Vec<(String, u64)> = sums.into_iter().map(|(m, c)| (m.to_owned(), c)).collect();
    all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.truncate(n);
    all
}

/// The `n` largest of `counts` by `key` (non-zero only), largest first; ties by name.
pub fn largest<T>(
    counts: impl IntoIterator<Item = (String, T)>,
    key: impl Fn(&T) -> u64,
    n: usize,
) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = counts
        .into_iter()
        .map(|(m, t)| {
            let k = key(&t);
            (m, k)
        })
        .filter(|(_, k)| *k > 0)
        .collect();
    if all.len() > n {
        all.select_nth_unstable_by(n - 1, |a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
    }
    all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_and_blocks_are_utc_aligned() {
        let t = crate::domain::time::parse_utc("2026-11-24 10:30:15").unwrap();
        assert_eq!(t - Step::Minute.period_of(t) * 60_000, 15_000);
        let hour = Step::Hour.period_of(t);
        assert_eq!(Step::Hour.block_of(hour), (hour / 24, 10));
        let minute = Step::Minute.period_of(t);
        assert_eq!(Step::Minute.block_of(minute).1, 30);
        // A block of minutes is kept 48 hours after its hour ends.
        let (block, _) = Step::Minute.block_of(minute);
        assert_eq!(
            Step::Minute.block_expiry_ms(block),
            (hour + 1) * 3_600_000 + 48 * 3_600_000
        );
    }

    #[test]
    fn ranges_cover_range_over_step_periods_ending_now() {
        let now = crate::domain::time::parse_utc("2026-11-24 10:30:15").unwrap();
        for range in Range::ALL {
            let step = range.default_step();
            assert!(range.check_step(step).is_ok());
            let p = range.periods(step, now);
            assert_eq!(p.end() - p.start() + 1, range.ms() / step.ms());
            assert_eq!(*p.end(), step.period_of(now));
            assert!(p.end() - p.start() < 200, "{range:?}: at most 168 bars");
        }
        assert!(Range::Week.check_step(Step::Minute).is_err());
        assert!(Range::Hour.check_step(Step::Day).is_err());
        assert_eq!(Range::parse("7d"), Ok(Range::Week));
        assert!(Range::parse("2d").is_err());
    }

    #[test]
    fn top_lists_merge_by_sum() {
        let a = vec![("x".to_owned(), 5), ("y".to_owned(), 3)];
        let b = vec![("y".to_owned(), 4), ("z".to_owned(), 1)];
        let merged = merge_top([a.as_slice(), b.as_slice()], 2);
        assert_eq!(merged, vec![("y".to_owned(), 7), ("x".to_owned(), 5)]);
        let l = largest(
            vec![
                ("a".into(), 1u64),
                ("b".into(), 9),
                ("c".into(), 0),
                ("d".into(), 4),
            ],
            |n| *n,
            2,
        );
        assert_eq!(l, vec![("b".to_owned(), 9), ("d".to_owned(), 4)]);
    }
}
