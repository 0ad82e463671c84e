//! What the dashboard says of a denial beyond its count: the rule that bound, since when,
//! until when, and every identifier of the denied check (so `user=scraper` shows beside the
//! address it was denied through). The server fills these from the live counters; the
//! overview and the inspector show them.

use serde::{Deserialize, Serialize};

/// An identifier throttled in the last few minutes, under one policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throttle {
    pub policy: String,
    /// The identifier that bound, `dimension=value`.
    pub identifier: String,
    /// Denials in the last few minutes.
    pub denials: u64,
    /// The details below are `None` for a denial counted before its details arrived (each
    /// instance writes them once a second) or when their write failed.
    pub rule: Option<String>,
    /// The first and the last denial seen, ms since the epoch.
    pub first_ms: Option<i64>,
    pub last_ms: Option<i64>,
    /// When the next request passes, as known at the last denial; `None` when no time
    /// was known (an override's block, or a cost the limit can never hold).
    pub until_ms: Option<i64>,
    /// Every identifier of the last denied check, the binding one among them.
    pub identifiers: Vec<String>,
    /// Its denials as a state: since when, and what share of its checks.
    #[serde(default)]
    pub streak: Option<Streak>,
}

/// A streak of denials: from an identifier's first denial until a minute passes without one
/// (`STREAK_GAP_MS`), its checks and denials under one policy, each identifier of a denied
/// check credited. What "blocked" means over time, where `Throttle::blocked_at` is an
/// instant that flips with every window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Streak {
    /// The streak's first denial and its last, ms since the epoch.
    pub since_ms: i64,
    pub last_ms: i64,
    /// Checks counted since its first denial (by the instances that denied it), and how many
    /// of them were denied.
    pub checks: u64,
    pub denials: u64,
}

/// A minute without a denial ends a streak.
pub const STREAK_GAP_MS: i64 = 60_000;

/// What a streak says at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreakState {
    /// Denied at least half its checks, and denied within the last minute.
    Blocked,
    /// Denied within the last minute, but less than half its checks.
    AtTimes,
    /// No denial for a minute or more.
    Over,
}

impl Streak {
    /// The share of its checks denied, in percent (rounded down; 100 only when all were).
    pub fn percent_denied(&self) -> u64 {
        (self.denials.min(self.checks) * 100)
            .checked_div(self.checks)
            .unwrap_or(100)
    }

    /// Its state at `now_ms`.
    pub fn state_at(&self, now_ms: i64) -> StreakState {
        if now_ms - self.last_ms > STREAK_GAP_MS {
            StreakState::Over
        } else if self.denials * 2 >= self.checks {
            StreakState::Blocked
        } else {
            StreakState::AtTimes
        }
    }

    /// How long it has lasted at `now_ms` (until its last denial once it is over).
    pub fn lasted_ms(&self, now_ms: i64) -> i64 {
        let end = match self.state_at(now_ms) {
            StreakState::Over => self.last_ms,
            _ => now_ms,
        };
        (end - self.since_ms).max(0)
    }

    /// In words: "denied 97 % of 1,241 checks for 18 min".
    pub fn words(&self, now_ms: i64) -> String {
        format!(
            "denied {} % of {} check{} for {}",
            self.percent_denied(),
            thousands(self.checks),
            if self.checks == 1 { "" } else { "s" },
            crate::domain::time::spoken_duration(self.lasted_ms(now_ms)),
        )
    }

    /// The stored form: `since,last,checks,denials`.
    pub fn parse(raw: &str) -> Option<Self> {
        let mut parts = raw.split(',');
        let streak = Self {
            since_ms: parts.next()?.parse().ok()?,
            last_ms: parts.next()?.parse().ok()?,
            checks: parts.next()?.parse().ok()?,
            denials: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(streak)
    }
}

/// `1241` as "1,241".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Throttle {
    /// Whether it is still denied at `now_ms`, as far as the last denial tells.
    pub fn blocked_at(&self, now_ms: i64) -> bool {
        match (self.until_ms, self.last_ms) {
            (Some(until), _) => until > now_ms,
            // No end was known: blocked while denials keep coming.
            (None, Some(last)) => now_ms - last < 60_000,
            (None, None) => false,
        }
    }

    /// The identifiers of the check other than the one that bound.
    pub fn others(&self) -> impl Iterator<Item = &str> {
        self.identifiers
            .iter()
            .map(String::as_str)
            .filter(|i| *i != self.identifier)
    }
}

/// A stored detail read back: (first ms, last ms, blocked-until ms, rule, identifiers).
pub type Detail = (i64, i64, Option<i64>, String, Vec<String>);

/// One stored detail (`first,last,until,rule` then the identifiers, a line each), read
/// back. `None` when it does not parse.
pub fn parse_detail(raw: &str) -> Option<Detail> {
    let mut lines = raw.split('\n');
    let head = lines.next()?;
    let mut parts = head.splitn(4, ',');
    let first = parts.next()?.parse().ok()?;
    let last = parts.next()?.parse().ok()?;
    let until: i64 = parts.next()?.parse().ok()?;
    let rule = parts.next()?.to_owned();
    Some((
        first,
        last,
        (until > 0).then_some(until),
        rule,
        lines.filter(|l| !l.is_empty()).map(str::to_owned).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_reads_back() {
        assert_eq!(
            parse_detail("100,200,260,per-minute\nuser=scraper\nip=192.0.2.66"),
            Some((
                100,
                200,
                Some(260),
                "per-minute".into(),
                vec!["user=scraper".into(), "ip=192.0.2.66".into()]
            ))
        );
        assert_eq!(
            parse_detail("100,200,0,override\nip=192.0.2.66"),
            Some((
                100,
                200,
                None,
                "override".into(),
                vec!["ip=192.0.2.66".into()]
            ))
        );
        assert_eq!(parse_detail("garbage"), None);
    }

    #[test]
    fn a_streak_is_a_state_that_holds_between_windows() {
        let s = Streak::parse("1000,1081000,1241,1204").unwrap();
        assert_eq!(s.percent_denied(), 97);
        // Blocked whatever the instant: the next request may pass, the state holds.
        assert_eq!(s.state_at(1_100_000), StreakState::Blocked);
        assert_eq!(s.words(1_081_000), "denied 97 % of 1,241 checks for 18 min");
        // A minute without a denial ends it; its length stops at the last denial.
        assert_eq!(s.state_at(1_141_001), StreakState::Over);
        assert_eq!(s.lasted_ms(5_000_000), 1_080_000);
        let seldom = Streak {
            checks: 10,
            denials: 4,
            ..s
        };
        assert_eq!(seldom.state_at(1_081_000), StreakState::AtTimes);
        assert_eq!(Streak::parse("1,2,3"), None);
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
    }

    #[test]
    fn blocked_until_a_known_time_or_while_denials_come() {
        let t = Throttle {
            until_ms: Some(1_000),
            last_ms: Some(900),
            ..Throttle::default()
        };
        assert!(t.blocked_at(999));
        assert!(!t.blocked_at(1_000));
        let open_ended = Throttle {
            until_ms: None,
            last_ms: Some(900),
            ..Throttle::default()
        };
        assert!(open_ended.blocked_at(60_899));
        assert!(!open_ended.blocked_at(60_900));
    }
}
