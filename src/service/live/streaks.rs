//! Which identifiers this instance watches for streaks of denials: from its first denial of
//! one under a policy, every check of it is counted (allowed or denied) and written once a
//! second, until two minutes pass here without a denial. Bounded: `MAX_WATCHED` at a time.

use std::collections::HashMap;

use crate::{domain::Identifier, store::streaks::StreakNote};

/// Identifiers watched at once, at most, over every policy: a flood of denied identifiers
/// costs bounded memory and writes (the rest are still counted everywhere else).
const MAX_WATCHED: usize = 10_000;
/// An identifier not denied here for this long is no longer watched.
const FORGET_MS: i64 = 2 * crate::domain::throttle::STREAK_GAP_MS;

#[derive(Clone, Copy, Default)]
struct Tally {
    checks: u64,
    denials: u64,
    /// This second's first and last denial (0: none).
    first_ms: i64,
    last_ms: i64,
    /// The last denial this instance answered.
    denied_here_ms: i64,
}

/// Per policy, the identifiers watched and what was seen of them since the last flush.
#[derive(Default)]
pub(super) struct Watch {
    policies: HashMap<String, HashMap<Identifier, Tally>>,
    len: usize,
}

impl Watch {
    /// How many identifiers are watched.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Counts a check of `identifiers` under `policy` at `now_ms`: a denial starts watching
    /// each of them (every identifier of a denied check is credited); an allowed check counts
    /// only for those already watched.
    pub(super) fn checked<'a>(
        &mut self,
        policy: &str,
        identifiers: impl IntoIterator<Item = &'a Identifier>,
        denied: bool,
        now_ms: i64,
    ) {
        if !denied {
            let Some(watched) = self.policies.get_mut(policy) else {
                return;
            };
            for id in identifiers {
                if let Some(t) = watched.get_mut(id) {
                    t.checks += 1;
                }
            }
            return;
        }
        if !self.policies.contains_key(policy) {
            self.policies.insert(policy.to_owned(), HashMap::new());
        }
        let watched = self.policies.get_mut(policy).expect("inserted above");
        for id in identifiers {
            let t = match watched.get_mut(id) {
                Some(t) => t,
                None if self.len < MAX_WATCHED => {
                    self.len += 1;
                    watched.entry(id.clone()).or_default()
                }
                None => continue,
            };
            t.checks += 1;
            t.denials += 1;
            if t.first_ms == 0 {
                t.first_ms = now_ms;
            }
            t.last_ms = t.last_ms.max(now_ms);
            t.denied_here_ms = t.denied_here_ms.max(now_ms);
        }
    }

    /// What to write, per policy (identifiers with checks since the last flush), the counts
    /// started over; identifiers not denied here for `FORGET_MS` are let go.
    pub(super) fn drain(&mut self, now_ms: i64) -> Vec<(String, Vec<StreakNote>)> {
        let mut out = Vec::new();
        for (policy, watched) in &mut self.policies {
            let mut notes = Vec::new();
            for (id, t) in watched.iter_mut() {
                if t.checks > 0 {
                    notes.push(StreakNote {
                        identifier: id.to_string(),
                        checks: t.checks,
                        denials: t.denials,
                        first_ms: t.first_ms,
                        last_ms: t.last_ms,
                    });
                }
                *t = Tally {
                    denied_here_ms: t.denied_here_ms,
                    ..Tally::default()
                };
            }
            let before = watched.len();
            watched.retain(|_, t| now_ms - t.denied_here_ms <= FORGET_MS);
            self.len -= before - watched.len();
            if !notes.is_empty() {
                out.push((policy.clone(), notes));
            }
        }
        self.policies.retain(|_, w| !w.is_empty());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(raw: &[&str]) -> Vec<Identifier> {
        raw.iter().map(|r| Identifier::parse(r).unwrap()).collect()
    }

    #[test]
    fn a_denial_starts_counting_every_check_until_forgotten() {
        let mut w = Watch::default();
        let bob = ids(&["user=bob", "ip=203.0.113.11"]);
        // Allowed before any denial: not counted.
        w.checked("demo", &bob, false, 1_000);
        assert_eq!(w.len(), 0);
        w.checked("demo", &bob, true, 2_000);
        w.checked("demo", &bob[..1], false, 2_500);
        w.checked("demo", &bob, true, 3_000);
        let drained = w.drain(3_000);
        let mut notes = drained[0].1.clone();
        notes.sort_by(|a, b| a.identifier.cmp(&b.identifier));
        assert_eq!(
            notes,
            [
                StreakNote {
                    identifier: "ip=203.0.113.11".into(),
                    checks: 2,
                    denials: 2,
                    first_ms: 2_000,
                    last_ms: 3_000
                },
                StreakNote {
                    identifier: "user=bob".into(),
                    checks: 3,
                    denials: 2,
                    first_ms: 2_000,
                    last_ms: 3_000
                },
            ]
        );
        // Nothing new: nothing written; still watched until two minutes without a denial.
        assert!(w.drain(4_000).is_empty());
        w.checked("demo", &bob[..1], false, 5_000);
        assert_eq!(w.drain(5_000)[0].1[0].checks, 1);
        assert!(w.drain(3_000 + FORGET_MS + 1).is_empty());
        assert_eq!(w.len(), 0);
    }
}
