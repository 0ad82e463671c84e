//! The check: a policy from memory, its overrides, the over-limit cache, one round trip to
//! Redis (which also keeps the overview's counters), the failure mode when Redis fails, and
//! the metrics. Every front door that checks calls [`Service::check`].

use std::sync::Arc;

use super::{Service, live::Denial};
use crate::{
    domain::{
        Decision, FailureMode, Identifier, Mode, Name, Outcome, Policy, RuleResult, RulesFor,
        history,
    },
    store::{CheckEntry, StoreError},
};

mod answered;
mod refuse;
pub(in crate::service) use answered::Settled;
use refuse::{counted, unmatched_words};

/// Largest cost one check may ask for.
pub const MAX_COST: u64 = 1_000_000_000;
/// Most identifiers in one check.
pub const MAX_IDENTIFIERS: usize = 16;

/// A check to make: the policy by name, the identifiers, the cost (0 peeks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRequest {
    pub policy: String,
    pub identifiers: Vec<Identifier>,
    pub cost: u64,
    /// Limits sent with the request: numbers of the policy's rules for this check only
    /// (rule → parameter field → value), each within the rule's `caller_max`.
    pub limits: std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>,
}

/// Why a check has no decision. A denial is a decision, not an error.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("policy: no policy named {0:?}")]
    UnknownPolicy(String),
    #[error("the policies have not been loaded from Redis yet")]
    PoliciesNotLoaded,
    /// Redis failed and the policy fails closed.
    #[error("redis is unavailable: {0}")]
    Unavailable(StoreError),
    /// A rule counts the check as more than it ever admits: no wait would let it pass.
    #[error("cost: {cost} is more than {policy} › {rule} ever admits at once ({max})")]
    CostTooHigh {
        policy: String,
        rule: String,
        cost: u64,
        max: u64,
    },
    /// Limits sent with the request that the policy does not allow (`field`: where in
    /// `limits`).
    #[error("{field}: {message}")]
    BadLimits { field: String, message: String },
    /// A strict policy's rules meet none of the identifiers: refused rather than let
    /// through uncounted. `expects`: the dimensions its rules count.
    #[error("identifiers: {} {}", if given.is_empty() { "none given" } else { given }, unmatched_words(policy, expects))]
    Unmatched {
        policy: String,
        given: String,
        expects: Vec<String>,
    },
    /// A strict policy was sent dimensions none of its rules counts while one they count
    /// is `missing` (a typo beside a correct one is not let through half counted).
    /// `expects`: the dimensions it counts.
    #[error("identifiers: {} {} not counted by any rule of {policy}, {}, and {} {} missing", unknown.join(", "), if unknown.len() == 1 { "is" } else { "are" }, counted(expects), missing.join(", "), if missing.len() == 1 { "is" } else { "are" })]
    UnknownDimensions {
        policy: String,
        unknown: Vec<String>,
        missing: Vec<String>,
        expects: Vec<String>,
    },
}

/// A check's answer: the policy it ran under and its decision. `degraded` when Redis failed
/// and the policy fails open (the decision is then an empty allow). `unmatched` when no
/// rule nor override met any of its identifiers: allowed, and nothing was counted.
/// `unused`: the dimensions it sent that none of the policy's rules counts.
#[derive(Clone, Debug)]
pub struct Checked {
    pub policy: Arc<Policy>,
    pub decision: Decision,
    pub degraded: bool,
    pub unmatched: bool,
    pub unused: Vec<crate::domain::Name>,
}

impl Checked {
    /// What this answer counts as in the history and the metrics.
    fn outcome(&self) -> history::Outcome {
        match (self.degraded, self.decision.allowed, self.policy.mode) {
            (true, _, _) => history::Outcome::Degraded,
            (false, true, _) if self.unmatched => history::Outcome::Unmatched,
            (false, true, _) => history::Outcome::Allowed,
            (false, false, Mode::Shadow) => history::Outcome::ShadowDenied,
            (false, false, Mode::Enforce) => history::Outcome::Denied,
        }
    }
}

impl Service {
    /// Checks `request`: its policy's rules (or an override's) for every identifier, all or
    /// nothing. A denial that stands until a known time is answered from memory; anything
    /// else is one round trip to Redis. When Redis fails, the policy's failure mode decides.
    pub async fn check(&self, request: &CheckRequest) -> Result<Checked, CheckError> {
        let span = crate::telemetry::traces::child_span("check");
        let traced = span.clone();
        let checked = crate::telemetry::traces::within(span, self.check_untraced(request)).await;
        // A caller's mistake (an unknown policy, a cost too high) is an answer, not a fault.
        if let (
            Some(cx),
            Err(error @ (CheckError::Unavailable(_) | CheckError::PoliciesNotLoaded)),
        ) = (traced, &checked)
        {
            crate::telemetry::traces::failed(&cx, error.to_string());
        }
        checked
    }

    /// Checks `request` as [`Service::check`] does, for a front door that can hold a
    /// request (forward-auth): a denial under a policy that waits is held until it would
    /// pass (see [`Service::hold_while_denied`]).
    pub async fn check_or_wait(
        &self,
        request: &CheckRequest,
        deadline: Option<std::time::Instant>,
    ) -> Result<Checked, CheckError> {
        let started = std::time::Instant::now();
        let checked = self.check(request).await?;
        let Some(max_wait) = checked.policy.max_wait() else {
            return Ok(checked);
        };
        let held = |c: &Checked| {
            let denied = !c.decision.allowed && !c.degraded && c.policy.mode == Mode::Enforce;
            denied.then(|| c.decision.binding().and_then(|b| b.outcome.retry_after_ms))
        };
        let policy = checked.policy.name.to_string();
        self.hold_while_denied(&policy, started + max_wait, deadline, checked, held, || {
            self.check(request)
        })
        .await
    }

    async fn check_untraced(&self, request: &CheckRequest) -> Result<Checked, CheckError> {
        let started = std::time::Instant::now();
        let policy = self.policy_named(&request.policy)?;
        let caller_rules = caller_rules(&policy, &request.limits)?;
        let unused = self.account_unused(&policy, request, started)?;
        let refuses = policy.is_strict() && policy.mode == Mode::Enforce;
        let decided = self.decide_request(&policy, request, &caller_rules).await;
        let checked = match decided {
            Ok(Decided::Unmatched) if refuses && !policy.anonymous_allowed() => {
                return Err(self.refuse_unmatched(&policy, request, started));
            }
            Ok(Decided::TooCostly { rule, cost, max }) => {
                self.answered(
                    &policy,
                    history::Outcome::Denied,
                    &request.identifiers,
                    None,
                    started,
                );
                return Err(CheckError::CostTooHigh {
                    policy: policy.name.to_string(),
                    rule,
                    cost,
                    max,
                });
            }
            // Anonymous under a policy whose every dimension is optional: a normal allow.
            Ok(Decided::Unmatched) => Checked {
                unmatched: !policy.anonymous_allowed(),
                policy,
                decision: Decision::new(Vec::new()),
                degraded: false,
                unused,
            },
            Ok(Decided::Decision(decision)) => Checked {
                policy,
                decision,
                degraded: false,
                unmatched: false,
                unused,
            },
            Err(error) => {
                self.failure_mode(&policy, error, &request.identifiers, started)
                    .map_err(CheckError::Unavailable)?;
                Checked {
                    policy,
                    decision: Decision::new(Vec::new()),
                    degraded: true,
                    unmatched: false,
                    unused,
                }
            }
        };
        self.record(&checked, request);
        let binding = (!checked.decision.allowed)
            .then(|| checked.decision.binding())
            .flatten();
        self.settle(
            Settled {
                policy: &checked.policy,
                outcome: checked.outcome(),
                degraded: checked.degraded,
                together: &request.identifiers,
                denial: binding.map(|b| Denial {
                    identifier: &b.identifier,
                    rule: b.rule.as_str(),
                    retry_after_ms: b.outcome.retry_after_ms,
                }),
            },
            &request.identifiers,
            started,
        );
        Ok(checked)
    }

    /// `request`'s decision under `policy`: its rules (or an override's) for every
    /// identifier, all or nothing; a block by an override denies without asking Redis.
    /// `Unmatched` when nothing applies to any identifier (nothing is counted).
    async fn decide_request(
        &self,
        policy: &Policy,
        request: &CheckRequest,
        caller_rules: &[CallerRule<'_>],
    ) -> Result<Decided, StoreError> {
        let now_ms = super::now_ms();
        let mut entries = Vec::new();
        let mut blocked = Vec::new();
        let mut exempt = false;
        for identifier in &request.identifiers {
            match policy.rules_for(identifier, now_ms) {
                RulesFor::Unlimited => exempt = true,
                RulesFor::Blocked => blocked.push(identifier.clone()),
                RulesFor::Rules(rules) => {
                    entries.extend(policy.counting(rules, identifier).map(|rule| {
                        // The policy's own rule with the caller's numbers, counted apart.
                        match caller_rules.iter().find(|c| std::ptr::eq(c.of, rule)) {
                            Some(c) => CheckEntry {
                                limits: Some(&c.variant),
                                ..entry_at(&c.rule, identifier, request.cost)
                            },
                            None => entry_at(rule, identifier, request.cost),
                        }
                    }));
                }
            }
        }
        // Shadow mode reports what would be denied and writes no penalty: one earned while
        // shadowing would otherwise bite once the policy enforces.
        if policy.mode == Mode::Shadow {
            for entry in &mut entries {
                entry.penalty = false;
            }
        }
        // A cost no rule could ever admit is the caller's mistake, not a wait (in shadow
        // mode it is a denial like any other: the answer stays 200).
        if policy.mode == Mode::Enforce
            && let Some(e) = entries
                .iter()
                .find(|e| e.cost.unwrap_or(request.cost) > e.rule.algorithm.max_admissible())
        {
            return Ok(Decided::TooCostly {
                rule: e.rule.name.to_string(),
                cost: e.cost.unwrap_or(request.cost),
                max: e.rule.algorithm.max_admissible(),
            });
        }
        if !blocked.is_empty() {
            // Blocked by an override: denied without touching Redis, nothing consumed.
            return Ok(Decided::Decision(Decision::new(
                blocked.into_iter().map(blocked_result).collect(),
            )));
        }
        if entries.is_empty() {
            // Exempt by an override is an answer; meeting nothing at all is not.
            return Ok(if exempt {
                Decided::Decision(Decision::new(Vec::new()))
            } else {
                Decided::Unmatched
            });
        }
        self.decide(policy, &entries, request.cost)
            .await
            .map(Decided::Decision)
    }
}

/// What a check's rules made of it.
enum Decided {
    Decision(Decision),
    /// No rule nor override met any identifier.
    Unmatched,
    /// `rule` counts this check as `cost`, more than it ever admits (`max`).
    TooCostly {
        rule: String,
        cost: u64,
        max: u64,
    },
}

/// A rule of the policy with the numbers a caller sent for one check.
struct CallerRule<'p> {
    /// The policy's rule it stands for.
    of: &'p crate::domain::Rule,
    rule: crate::domain::Rule,
    /// The numbers, as its counters are told apart (`limit=500`): two callers who send
    /// different numbers never share a counter, nor share one with the rule's own.
    variant: String,
}

/// The policy's rules with the numbers `limits` gives them, each held to its `caller_max`.
fn caller_rules<'p>(
    policy: &'p Policy,
    limits: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>,
) -> Result<Vec<CallerRule<'p>>, CheckError> {
    let mut out = Vec::with_capacity(limits.len());
    for (name, numbers) in limits {
        let at = format!("limits.{name}");
        let of = policy
            .rules
            .iter()
            .find(|r| r.name.as_str() == name)
            .ok_or_else(|| CheckError::BadLimits {
                field: at.clone(),
                message: format!("{} has no rule {name:?}", policy.name),
            })?;
        let rule = of
            .with_caller_numbers(numbers, &at)
            .map_err(|e| CheckError::BadLimits {
                field: e.field,
                message: e.message,
            })?;
        // The rule's own numbers: its own counters (and the denials remembered for it).
        if rule.algorithm == of.algorithm {
            continue;
        }
        // Named by the numbers that result, so one set of numbers is one counter however
        // the caller spelt it.
        let kind = rule.algorithm.kind();
        let variant = kind
            .params
            .iter()
            .zip(rule.algorithm.params())
            .map(|(p, n)| format!("{}={n}", p.field))
            .collect::<Vec<_>>()
            .join(",");
        out.push(CallerRule { of, rule, variant });
    }
    Ok(out)
}

/// `rule`'s entry for `identifier` in a check of `cost`: at the cost the rule counts it
/// (`Rule::cost_of`), named only when it is not the check's own.
pub(super) fn entry_at<'a>(
    rule: &'a crate::domain::Rule,
    identifier: &'a Identifier,
    cost: u64,
) -> CheckEntry<'a> {
    let own = rule.cost_of(cost);
    CheckEntry {
        cost: (own != cost).then_some(own),
        ..CheckEntry::new(rule, identifier)
    }
}

impl Service {
    /// The policy a check or report names, from memory.
    pub(super) fn policy_named(&self, name: &str) -> Result<Arc<Policy>, CheckError> {
        let found = self.policies.get(name);
        crate::telemetry::metrics::policy_lookup(found.is_some());
        match found {
            Some(p) => Ok(p),
            None if self.policies.is_loaded() => Err(CheckError::UnknownPolicy(name.to_owned())),
            None => Err(CheckError::PoliciesNotLoaded),
        }
    }

    /// Decides `entries` of `policy` at `cost`, all or nothing. A check with local rules: by
    /// this instance's counters, asking Redis for its exact rules only (see local.rs). Any
    /// other: from the over-limit cache when a denial there covers it, else in one round
    /// trip to Redis (which also keeps the overview's counters). The caller applies the
    /// failure mode to an error.
    pub(super) async fn decide(
        &self,
        policy: &Policy,
        entries: &[CheckEntry<'_>],
        cost: u64,
    ) -> Result<Decision, StoreError> {
        if entries.iter().any(super::local::is_local)
            && let Some(decided) = self.decide_with_local(policy, entries, cost).await
        {
            crate::telemetry::metrics::local_check();
            if let Ok(decision) = &decided {
                crate::telemetry::metrics::decided(
                    policy.name.as_str(),
                    &decision.results,
                    self.rule_metrics,
                );
            }
            return decided;
        }
        if let Some(cached) = self.denials.lookup(policy, entries, cost) {
            // Denied until a known time: answered from memory, no Redis call (the overview's
            // counters hear of it within a second).
            crate::telemetry::metrics::deny_cache_hit();
            crate::telemetry::metrics::decided(
                policy.name.as_str(),
                &cached.results,
                self.rule_metrics,
            );
            self.live.denied_from_cache(
                policy.name.as_str(),
                cached.binding().map(|b| b.identifier.to_string()),
            );
            return Ok(cached);
        }
        let redis_started = std::time::Instant::now();
        let result = self
            .store
            .check_and_count(&policy.name, entries, cost)
            .await;
        crate::telemetry::metrics::redis_call(
            redis_started.elapsed().as_secs_f64(),
            result.is_ok(),
        );
        match &result {
            Ok(decision) => {
                self.outage.answered();
                self.denials
                    .remember(policy, entries, decision, cost, redis_started);
                crate::telemetry::metrics::decided(
                    policy.name.as_str(),
                    &decision.results,
                    self.rule_metrics,
                );
            }
            Err(error) => self.outage.failed(super::now_ms(), error),
        }
        result
    }

    /// Checks several requests, each its own all-or-nothing decision, answered in order. On
    /// a single Redis they go out together and share script calls: each is queued for the
    /// coalesced call when first polled, and `join_all` polls them first in order (also past
    /// 30, where it runs them as a `FuturesOrdered`), so checks of one identifier are
    /// decided in the given order. On a cluster a check is several calls: they go one
    /// after another to keep that order.
    pub async fn check_all<'a>(
        &self,
        requests: impl IntoIterator<Item = &'a CheckRequest>,
    ) -> Vec<Result<Checked, CheckError>> {
        let requests: Vec<&CheckRequest> = requests.into_iter().collect();
        if self.store.is_cluster() {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(self.check(request).await);
            }
            return answers;
        }
        futures_util::future::join_all(requests.into_iter().map(|r| self.check(r))).await
    }
}

fn blocked_result(identifier: Identifier) -> RuleResult {
    RuleResult {
        rule: Name::parse("override").expect("a valid name"),
        identifier,
        algorithm: None,
        outcome: Outcome {
            allowed: false,
            limit: 0,
            remaining: 0,
            reset_ms: 0,
            retry_after_ms: None,
            delay_ms: 0,
            penalty: false,
        },
        binding: false,
        lease: None,
    }
}
