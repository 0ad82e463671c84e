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
