//! An identifier's state in every policy, as the inspector shows it and the admin API
//! returns it. Plain data: the server fills it (`service::identifiers`), the browser shows it.

use serde::{Deserialize, Serialize};

/// One rule's state for the identifier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleState {
    pub rule: String,
    pub algorithm: String,
    pub identifier: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    /// Milliseconds until Redis drops the state (`None`: no state kept now).
    pub ttl_ms: Option<i64>,
    pub binding: bool,
    pub retry_after_ms: Option<u64>,
    /// Held by the rule's penalty box: it denied the identifier less than `block_ms` ago.
    #[serde(default)]
    pub penalty: bool,
    /// The rule's penalty box, if it has one (ms).
    #[serde(default)]
    pub block_ms: Option<u64>,
    /// A local rule (`sync: local`): its flush period (ms). Redis, which this state is read
    /// from, is then up to one flush behind what the instances admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_ms: Option<u64>,
    /// A concurrency rule: the leases held now, soonest to run out first.
    #[serde(default)]
    pub leases: Vec<LeaseView>,
}

/// A lease held by a concurrency rule, as the inspector lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// Its id, to release it.
    pub id: String,
    pub cost: u64,
    /// Since it was taken.
    pub age_ms: u64,
    /// Until it runs out unless renewed.
    pub expires_in_ms: u64,
}

/// An override that applies to the identifier, as the inspector lists it (to extend or
/// remove it where it acts).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideView {
    pub policy: String,
    /// Its place in the policy's list, from 0 (what removing it names).
    pub index: usize,
    /// The override as stored: `match`, `action`, `rules`, `expires_at_ms`, `reason`.
    pub document: serde_json::Value,
    /// Whether it is the one that applies (the most precise match wins).
    pub in_force: bool,
}

/// One policy's view of the identifier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyState {
    pub policy: String,
    pub version: u64,
    /// `rules`, or `unlimited` / `blocked` by an override.
    pub status: String,
    pub rules: Vec<RuleState>,
}

/// The identifier in every policy, at `at_ms`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inspection {
    pub identifier: String,
    pub at_ms: i64,
    pub policies: Vec<PolicyState>,
    /// Why nothing could be shown (a malformed identifier, Redis down).
    pub error: Option<String>,
    /// What the person typed, when it was a bare value (`bob`) or a descriptor without
    /// its `envoy=` that was resolved to `identifier`.
    #[serde(default)]
    pub typed: Option<String>,
    /// What the typed text may mean, when it did not resolve to one identifier: each
    /// identifier with state now and the policies it has state in.
    #[serde(default)]
    pub candidates: Vec<(String, Vec<String>)>,
    /// Identifiers of the last two hours' traffic that contain the typed text.
    #[serde(default)]
    pub recent: Vec<String>,
    /// The identifiers it was checked together with in the last hour, each as inspected
    /// now (a check of bob is denied when his address is blocked).
    #[serde(default)]
    pub companions: Vec<Inspection>,
    /// How many distinct identifiers it was checked together with in the last hour (a
    /// shared address: hundreds of users).
    #[serde(default)]
    pub companions_seen: u64,
    /// The overrides that apply to it now, in every policy.
    #[serde(default)]
    pub overrides: Vec<OverrideView>,
    /// Its streaks of denials, per policy that denied a check of it in the last hour or two
    /// (whichever identifier of the check bound).
    #[serde(default)]
    pub streaks: Vec<(String, crate::domain::throttle::Streak)>,
}

/// Whether the identifier's next request passes, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// A request now is denied by `policy` › `rule` on `identifier` (itself or one it is
    /// checked with); it passes in `passes_in_ms` (`None`: no time is known, such as an
    /// override's block).
    Blocked {
        policy: String,
        rule: String,
        identifier: String,
        passes_in_ms: Option<u64>,
        /// Held by the rule's penalty box, of this many ms from the denial that started it.
        penalty_ms: Option<u64>,
    },
    /// Not blocked; the rule it has used most of, if any.
    NotBlocked {
        closest: Option<(String, String, String, u64)>,
    },
}

impl Inspection {
    /// The verdict over time: the identifier's streak of denials (each denial of a check of
    /// it credited, whichever identifier bound) under the policy that denied it last, with
    /// that policy; `None` when it was not denied in the last hour or two.
    pub fn steady(&self) -> Option<(&str, crate::domain::throttle::Streak)> {
        self.streaks
            .iter()
            .map(|(p, s)| (p.as_str(), *s))
            .max_by_key(|(_, s)| s.last_ms)
    }

    /// The verdict over the identifier and those it is checked with: the block that lasts
    /// longest, or the rule closest to its limit.
    pub fn verdict(&self) -> Verdict {
        // The longest block so far, and how long it lasts (`None`: no known end).
        let mut blocked: Option<(Verdict, Option<u64>)> = None;
        let mut closest: Option<(String, String, String, u64)> = None;
        let longer = |a: Option<u64>, b: Option<u64>| a.unwrap_or(u64::MAX) > b.unwrap_or(u64::MAX);
        for inspection in std::iter::once(self).chain(&self.companions) {
            for p in &inspection.policies {
                if p.status == "blocked" {
                    if blocked.as_ref().is_none_or(|b| longer(None, b.1)) {
                        let verdict = Verdict::Blocked {
                            policy: p.policy.clone(),
                            rule: "override".into(),
                            identifier: inspection.identifier.clone(),
                            passes_in_ms: None,
                            penalty_ms: None,
                        };
                        blocked = Some((verdict, None));
                    }
                    continue;
                }
                for r in &p.rules {
                    let full = r.limit == 0 || r.remaining == 0;
                    if r.retry_after_ms.is_some() || full {
                        if blocked
                            .as_ref()
                            .is_none_or(|b| longer(r.retry_after_ms, b.1))
                        {
                            let verdict = Verdict::Blocked {
                                policy: p.policy.clone(),
                                rule: r.rule.clone(),
                                identifier: inspection.identifier.clone(),
                                passes_in_ms: r.retry_after_ms,
                                penalty_ms: r.block_ms.filter(|_| r.penalty),
                            };
                            blocked = Some((verdict, r.retry_after_ms));
                        }
                    } else if let Some(pct) =
                        (r.limit.saturating_sub(r.remaining) * 100).checked_div(r.limit)
                        && pct > 0
                        && closest.as_ref().is_none_or(|c| pct > c.3)
                    {
                        closest = Some((
                            p.policy.clone(),
                            r.rule.clone(),
                            inspection.identifier.clone(),
                            pct,
                        ));
                    }
                }
            }
        }
        match blocked {
            Some((verdict, _)) => verdict,
            None => Verdict::NotBlocked { closest },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, limit: u64, remaining: u64, retry: Option<u64>) -> RuleState {
        RuleState {
            rule: name.into(),
            limit,
            remaining,
            retry_after_ms: retry,
            ..RuleState::default()
        }
    }

    fn inspection(id: &str, rules: Vec<RuleState>) -> Inspection {
        Inspection {
            identifier: id.into(),
            policies: vec![PolicyState {
                policy: "demo".into(),
                status: "rules".into(),
                rules,
                ..PolicyState::default()
            }],
            ..Inspection::default()
        }
    }

    #[test]
    fn bob_is_blocked_through_his_address() {
        let mut bob = inspection("user=bob", vec![rule("per-minute", 100, 9, None)]);
        bob.companions = vec![inspection(
            "ip=203.0.113.11",
            vec![rule("per-minute", 100, 0, Some(38_000))],
        )];
        assert_eq!(
            bob.verdict(),
            Verdict::Blocked {
                policy: "demo".into(),
                rule: "per-minute".into(),
                identifier: "ip=203.0.113.11".into(),
                passes_in_ms: Some(38_000),
                penalty_ms: None,
            }
        );
        bob.companions.clear();
        assert_eq!(
            bob.verdict(),
            Verdict::NotBlocked {
                closest: Some(("demo".into(), "per-minute".into(), "user=bob".into(), 91))
            }
        );
    }

    #[test]
    fn an_override_block_outlasts_any_window() {
        let mut i = inspection("user=eve", vec![rule("per-second", 5, 0, Some(900))]);
        i.policies.push(PolicyState {
            policy: "api".into(),
            status: "blocked".into(),
            ..PolicyState::default()
        });
        assert!(matches!(
            i.verdict(),
            Verdict::Blocked { ref policy, passes_in_ms: None, .. } if policy == "api"
        ));
    }

    #[test]
    fn nothing_used_has_no_closest() {
        let i = inspection("user=new", vec![rule("per-minute", 100, 100, None)]);
        assert_eq!(i.verdict(), Verdict::NotBlocked { closest: None });
    }
}
