//! Envoy's rate limit check (`ShouldRateLimit`), on the same engine as every other check:
//! the domain's policy from memory, each request descriptor's limit found in its tree, one
//! all-or-nothing decision through the over-limit cache and the check scripts, the live
//! counters, the metrics and the policy's failure mode. The gRPC server and `POST /json`
//! both call [`Service::should_rate_limit`].
//!
//! How envoyproxy/ratelimit's rules map onto the engine:
//! - a descriptor that finds no limit, or a domain that does not exist, is OK and consumes
//!   nothing; an `unlimited` limit is OK without asking Redis;
//! - `requests_per_unit: 0` denies without asking Redis;
//! - all counted descriptors are decided together: when one is over its limit, none is
//!   consumed, and each over its limit answers `limit_remaining` 0;
//! - a descriptor repeated in one request counts once (envoyproxy/ratelimit counts each
//!   repeat);
//! - a `shadow_mode` limit is counted after the others allowed (its own check): over it
//!   answers OK, and the denial is counted and shown;
//! - `replaces`: a limit named in the `replaces` of another limit that applies to the same
//!   request is not checked;
//! - a policy override of the descriptor's identifier (`envoy=...`) makes it unlimited or
//!   blocks it, as it does for any identifier.

use std::{collections::HashSet, sync::Arc};

use super::{Service, check::MAX_COST};
use crate::{
    domain::{
        Algorithm, Decision, FailureMode, Identifier, Policy, Rule, RulesFor,
        envoy::{self, Allowance, RequestDescriptor, Unit},
        history,
    },
    store::{CheckEntry, StoreError},
};

/// Most descriptors in one request, and most entries in one descriptor.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;

/// A `ShouldRateLimit` request, without the protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyRequest {
    pub domain: String,
    pub descriptors: Vec<EnvoyDescriptor>,
    /// Hits for every descriptor that does not say (0 means 1).
    pub hits_addend: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyDescriptor {
    pub entries: Vec<(String, String)>,
    /// A limit the caller sets for this descriptor, instead of the configured one.
    pub limit: Option<(u32, Unit)>,
    /// This descriptor's hits, when set (0 peeks: nothing is consumed).
    pub hits_addend: Option<u64>,
}

/// The limit a descriptor was checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    pub name: String,
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// One descriptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorAnswer {
    pub ok: bool,
    pub limit: Option<CurrentLimit>,
    /// What is left after this request (`u32::MAX` when unlimited).
    pub remaining: u32,
    /// Until the limit's window ends.
    pub reset_ms: Option<u64>,
    /// A shadow-mode limit that was over: answered OK, counted as a denial.
    pub shadow_denied: bool,
}

impl DescriptorAnswer {
    fn unlimited() -> Self {
        Self {
            ok: true,
            limit: None,
            remaining: 0,
            reset_ms: None,
            shadow_denied: false,
        }
    }
}

/// The answer: OK only when every descriptor is.
#[derive(Clone, Debug)]
pub struct EnvoyAnswer {
    pub ok: bool,
    pub statuses: Vec<DescriptorAnswer>,
    /// Redis failed and the domain fails open: every descriptor is OK, nothing was counted.
    pub degraded: bool,
    /// The domain's policy, when there is one.
    pub policy: Option<Arc<Policy>>,
}

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("the policies have not been loaded from Redis yet")]
    PoliciesNotLoaded,
    /// Redis failed and the domain fails closed.
    #[error("redis is unavailable: {0}")]
    Unavailable(StoreError),
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> EnvoyError {
    EnvoyError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Where a descriptor's check goes.
enum Target {
    /// No limit: OK, nothing consumed.
    Free,
    /// Unlimited: OK without Redis.
    Unlimited,
    /// Always over (a limit of 0, or blocked by an override).
    Over(Option<CurrentLimit>),
    /// Counted under `rule` (an index into the policy's rules, or into the caller's).
    Count {
        rule: RuleRef,
        current: CurrentLimit,
        shadow: bool,
    },
}

#[derive(Clone, Copy)]
enum RuleRef {
    Policy(usize),
    Caller(usize),
}

impl Service {
    /// Answers an Envoy rate limit request; see the module's notes for the rules.
    pub async fn should_rate_limit(
        &self,
        request: &EnvoyRequest,
    ) -> Result<EnvoyAnswer, EnvoyError> {
        let started = std::time::Instant::now();
        validate(request)?;
        let n = request.descriptors.len();
        let free = |policy| EnvoyAnswer {
            ok: true,
            statuses: vec![DescriptorAnswer::unlimited(); n],
            degraded: false,
            policy,
        };
        let Ok(name) = envoy::policy_name(&request.domain) else {
            return Ok(free(None));
        };
        let policy = match self.policies.get(name.as_str()) {
            Some(p) => p,
            None if self.policies.is_loaded() => return Ok(free(None)),
            None => return Err(EnvoyError::PoliciesNotLoaded),
        };
        let Some(tree) = policy
            .envoy
            .as_ref()
            .filter(|t| t.doc.domain == request.domain)
        else {
            return Ok(free(None));
        };
        let default_cost = request.hits_addend.max(1);
        let costs: Vec<u64> = request
            .descriptors
            .iter()
            .map(|d| d.hits_addend.unwrap_or(default_cost))
            .collect();
        let identifiers: Vec<Identifier> = request
            .descriptors
            .iter()
            .map(|d| {
                RequestDescriptor {
                    entries: d.entries.clone(),
                }
                .identifier()
            })
            .collect();

        // Each descriptor's limit: the caller's, or the tree's; then `replaces` and overrides.
        let now_ms = super::now_ms();
        let mut caller_rules: Vec<Rule> = Vec::new();
        let mut targets = Vec::with_capacity(n);
        let mut names = Vec::with_capacity(n);
        for (i, d) in request.descriptors.iter().enumerate() {
            let (target, name) = if let Some((rpu, unit)) = d.limit {
                let current = CurrentLimit {
                    name: String::new(),
                    requests_per_unit: rpu,
                    unit,
                };
                if rpu == 0 && costs[i] == 0 {
                    (Target::Free, None)
                } else if rpu == 0 {
                    (Target::Over(Some(current)), None)
                } else {
                    caller_rules.push(caller_rule(i, rpu, unit));
                    let rule = RuleRef::Caller(caller_rules.len() - 1);
                    let shadow = false;
                    (
                        Target::Count {
                            rule,
                            current,
                            shadow,
                        },
                        None,
                    )
                }
            } else {
                match tree.find(&d.entries) {
                    None => (Target::Free, None),
                    Some(limit) => {
                        let target = match limit.allowance {
                            Allowance::Unlimited => Target::Unlimited,
                            Allowance::Count {
                                requests_per_unit,
                                unit,
                                rule,
                            } => {
                                let current = CurrentLimit {
                                    name: limit.name.clone(),
                                    requests_per_unit,
                                    unit,
                                };
                                match rule {
                                    // 0 a unit: over for any hit (a peek passes; a shadow
                                    // limit answers OK).
                                    None if limit.shadow || costs[i] == 0 => Target::Free,
                                    None => Target::Over(Some(current)),
                                    Some(r) => Target::Count {
                                        rule: RuleRef::Policy(r),
                                        current,
                                        shadow: limit.shadow,
                                    },
                                }
                            }
                        };
                        (target, Some(limit))
                    }
                }
            };
            targets.push(target);
            names.push(name);
        }
        let replaced: HashSet<&str> = names
            .iter()
            .flatten()
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        for (i, target) in targets.iter_mut().enumerate() {
            if names[i].is_some_and(|l| !l.name.is_empty() && replaced.contains(l.name.as_str())) {
                *target = Target::Free;
            }
            match policy.rules_for(&identifiers[i], now_ms) {
                RulesFor::Unlimited => *target = Target::Unlimited,
                RulesFor::Blocked => *target = Target::Over(None),
                RulesFor::Rules(_) => {}
            }
        }

        let mut statuses: Vec<DescriptorAnswer> = targets
            .iter()
            .map(|t| match t {
                Target::Free => DescriptorAnswer::unlimited(),
                Target::Unlimited => DescriptorAnswer {
                    remaining: envoy::UNLIMITED_REMAINING,
                    ..DescriptorAnswer::unlimited()
                },
                Target::Over(current) => DescriptorAnswer {
                    ok: false,
                    reset_ms: current.as_ref().map(|c| until_window_end(c.unit, now_ms)),
                    limit: current.clone(),
                    remaining: 0,
                    shadow_denied: false,
                },
                Target::Count { current, .. } => DescriptorAnswer {
                    ok: true,
                    limit: Some(current.clone()),
                    remaining: 0,
                    reset_ms: None,
                    shadow_denied: false,
                },
            })
            .collect();

        // Who is checked how: the enforced ones together (all or nothing), then each cost of
        // shadow ones; peeks (hits 0) and, when the request is over already, all others are
        // read without consuming.
        let over_already = statuses.iter().any(|s| !s.ok);
        if let Some(i) = statuses.iter().position(|s| !s.ok) {
            // Denied without Redis (a limit of 0, or blocked): the live view still hears of it.
            self.live
                .denied_from_cache(policy.name.as_str(), Some(identifiers[i].to_string()));
        }
        let mut enforced = Vec::new();
        let mut shadows = Vec::new();
        let mut peeks = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            if let Target::Count { shadow, .. } = t {
                if costs[i] == 0 || over_already {
                    peeks.push(i);
                } else if *shadow {
                    shadows.push(i);
                } else {
                    enforced.push(i);
                }
            }
        }
        let rule_of = |r: RuleRef| -> &Rule {
            match r {
                RuleRef::Policy(i) => &policy.rules[i],
                RuleRef::Caller(i) => &caller_rules[i],
            }
        };
        // A descriptor repeated in one request is counted once. Its copies share a counter
        // (the same entries, hits and rule name: a caller's own limits of one unit are all
        // `caller-<unit>`); they are checked once, under the strictest of their limits, and
        // each answers as that check did, under its own limit. envoyproxy/ratelimit
        // increments once per copy; here the counted descriptors are one all-or-nothing
        // check of one cost, where two entries of one key would each read the state before
        // either wrote (a fixed window then counted them once when new, twice when not).
        let counter = |i: usize| match &targets[i] {
            Target::Count { rule, .. } => Some((&rule_of(*rule).name, &identifiers[i], costs[i])),
            _ => None,
        };
        let limit_of = |i: usize| match &targets[i] {
            Target::Count { rule, .. } => match rule_of(*rule).algorithm {
                Algorithm::FixedWindow { limit, .. } => limit,
                _ => u64::MAX,
            },
            _ => u64::MAX,
        };
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for group in [&mut enforced, &mut shadows, &mut peeks] {
            let mut kept: Vec<usize> = Vec::with_capacity(group.len());
            // (a copy, the position in `kept` of the one checked for it)
            let mut copies: Vec<(usize, usize)> = Vec::new();
            for &i in group.iter() {
                match kept.iter().position(|&j| counter(j) == counter(i)) {
                    Some(at) if limit_of(i) < limit_of(kept[at]) => {
                        copies.push((kept[at], at));
                        kept[at] = i;
                    }
                    Some(at) => copies.push((i, at)),
                    None => kept.push(i),
                }
            }
            repeats.extend(copies.into_iter().map(|(copy, at)| (copy, kept[at])));
            *group = kept;
        }
        if let Some(&first) = enforced.first()
            && let Some(&other) = enforced.iter().find(|&&i| costs[i] != costs[first])
        {
            return Err(invalid(
                format!("descriptors[{other}].hits_addend"),
                format!(
                    "differs from descriptors[{first}]'s ({} against {}); the counted descriptors of one request must share their hits",
                    costs[other], costs[first]
                ),
            ));
        }
        let entries = |idx: &[usize]| -> Vec<CheckEntry<'_>> {
            idx.iter()
                .map(|&i| {
                    let Target::Count { rule, .. } = &targets[i] else {
                        unreachable!("only counted descriptors are checked")
                    };
                    CheckEntry {
                        rule: rule_of(*rule),
                        identifier: &identifiers[i],
                    }
                })
                .collect()
        };

        let mut failed = None;
        let mut ok = !over_already;
        if !enforced.is_empty() {
            match self
                .decide(&policy, &entries(&enforced), costs[enforced[0]])
                .await
            {
                Ok(decision) => {
                    ok = decision.allowed;
                    fill(
                        &mut statuses,
                        &enforced,
                        &targets,
                        &decision,
                        Group::Enforced,
                    );
                    if !decision.allowed {
                        peeks.append(&mut shadows);
                        peeks.sort_unstable();
                    }
                }
                Err(e) => failed = Some(e),
            }
        }
        let mut shadow_costs: Vec<u64> = shadows.iter().map(|&i| costs[i]).collect();
        shadow_costs.sort_unstable();
        shadow_costs.dedup();
        for cost in shadow_costs {
            if failed.is_some() {
                break;
            }
            let group: Vec<usize> = shadows
                .iter()
                .copied()
                .filter(|&i| costs[i] == cost)
                .collect();
            match self.decide(&policy, &entries(&group), cost).await {
                Ok(decision) => fill(&mut statuses, &group, &targets, &decision, Group::Shadow),
                Err(e) => failed = Some(e),
            }
        }
        if !peeks.is_empty() && failed.is_none() {
            match self.decide(&policy, &entries(&peeks), 0).await {
                Ok(decision) => fill(&mut statuses, &peeks, &targets, &decision, Group::Peek),
                Err(e) => failed = Some(e),
            }
        }
        for (copy, checked) in repeats {
            statuses[copy] = DescriptorAnswer {
                limit: statuses[copy].limit.take(),
                ..statuses[checked].clone()
            };
        }

        let answer = match failed {
            None => EnvoyAnswer {
                ok,
                statuses,
                degraded: false,
                policy: Some(policy.clone()),
            },
            Some(error) => {
                // Logged by the outage's changes of state (`RedisOutage`), not per check.
                tracing::debug!(%error, policy = %policy.name, "envoy check failed on redis");
                if policy.failure_mode == FailureMode::Closed {
                    self.history.record(
                        policy.name.as_str(),
                        history::Outcome::Degraded,
                        limited(&targets, &identifiers),
                        None,
                    );
                    crate::metrics::check_done(
                        policy.name.as_str(),
                        "unavailable",
                        started.elapsed().as_secs_f64(),
                    );
                    return Err(EnvoyError::Unavailable(error));
                }
                EnvoyAnswer {
                    degraded: true,
                    ..free(Some(policy.clone()))
                }
            }
        };
        let outcome = match (answer.degraded, answer.ok) {
            (true, _) => "degraded",
            (false, true) if answer.statuses.iter().any(|s| s.shadow_denied) => "shadow_denied",
            (false, true) => "allowed",
            (false, false) => "denied",
        };
        self.history.record(
            policy.name.as_str(),
            match outcome {
                "degraded" => history::Outcome::Degraded,
                "shadow_denied" => history::Outcome::ShadowDenied,
                "allowed" => history::Outcome::Allowed,
                _ => history::Outcome::Denied,
            },
            limited(&targets, &identifiers),
            answer
                .statuses
                .iter()
                .position(|s| !s.ok || s.shadow_denied)
                .filter(|_| !answer.degraded)
                .map(|i| &identifiers[i]),
        );
        crate::metrics::check_done(
            policy.name.as_str(),
            outcome,
            started.elapsed().as_secs_f64(),
        );
        Ok(answer)
    }
}

/// The identifiers of the descriptors that found a limit (the others consume nothing).
fn limited<'a>(
    targets: &'a [Target],
    identifiers: &'a [Identifier],
) -> impl Iterator<Item = &'a Identifier> {
    targets
        .iter()
        .zip(identifiers)
        .filter(|(t, _)| matches!(t, Target::Count { .. } | Target::Over(_)))
        .map(|(_, id)| id)
}

/// How a group of descriptors was checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    /// Together, all or nothing: each is OK when under its limit.
    Enforced,
    /// Shadow-mode limits: always OK; over the limit is marked (and was counted).
    Shadow,
    /// Read without consuming: the code is left as it is.
    Peek,
}

/// The statuses of the descriptors `idx` from `decision` (its results are in their order).
fn fill(
    statuses: &mut [DescriptorAnswer],
    idx: &[usize],
    targets: &[Target],
    decision: &Decision,
    group: Group,
) {
    let now_ms = if decision.at_us > 0 {
        decision.at_us / 1000
    } else {
        super::now_ms()
    };
    for (result, &i) in decision.results.iter().zip(idx) {
        let Target::Count { current, .. } = &targets[i] else {
            continue;
        };
        let s = &mut statuses[i];
        s.remaining = u32::try_from(result.outcome.remaining).unwrap_or(u32::MAX);
        s.reset_ms = Some(until_window_end(current.unit, now_ms));
        match group {
            Group::Enforced => {
                s.ok = result.outcome.allowed;
                if !s.ok {
                    // As envoyproxy/ratelimit answers an OVER_LIMIT descriptor.
                    s.remaining = 0;
                }
            }
            Group::Shadow => s.shadow_denied = !result.outcome.allowed,
            Group::Peek => {}
        }
    }
}

/// Milliseconds until the clock-aligned window of `unit` that holds `now_ms` ends.
fn until_window_end(unit: Unit, now_ms: i64) -> u64 {
    let len = unit.seconds() * 1000;
    len - (now_ms.max(0) as u64 % len)
}

/// The rule a caller's own limit runs as: named after its unit, so the count of one
/// descriptor carries on while the caller changes the number.
fn caller_rule(index: usize, requests_per_unit: u32, unit: Unit) -> Rule {
    Rule::new(
        index,
        &format!("caller-{}", unit.as_str()),
        Algorithm::FixedWindow {
            limit: u64::from(requests_per_unit),
            window_ms: unit.seconds() * 1000,
        },
        Some(vec![envoy::DIMENSION.to_owned()]),
        false,
    )
    .expect("a valid name and window")
}

fn validate(request: &EnvoyRequest) -> Result<(), EnvoyError> {
    if request.domain.is_empty() {
        return Err(invalid("domain", "is required"));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(
            "descriptors",
            format!("at most {MAX_DESCRIPTORS} in one request"),
        ));
    }
    if request.hits_addend > MAX_COST {
        return Err(invalid("hits_addend", format!("at most {MAX_COST}")));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors", "must not be empty"));
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                format!("at most {MAX_ENTRIES}"),
            ));
        }
        for (j, (k, v)) in d.entries.iter().enumerate() {
            if k.is_empty() {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    "is required",
                ));
            }
            if k.len() > envoy::MAX_TEXT || v.len() > envoy::MAX_TEXT {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}]"),
                    format!("keys and values are at most {} bytes", envoy::MAX_TEXT),
                ));
            }
        }
        if let Some((rpu, _)) = d.limit
            && u64::from(rpu) > crate::domain::rule::MAX_AMOUNT
        {
            return Err(invalid(
                format!("descriptors[{i}].limit.requests_per_unit"),
                format!("at most {}", crate::domain::rule::MAX_AMOUNT),
            ));
        }
        if d.hits_addend.is_some_and(|h| h > MAX_COST) {
            return Err(invalid(
                format!("descriptors[{i}].hits_addend"),
                format!("at most {MAX_COST}"),
            ));
        }
    }
    Ok(())
}

/// An Envoy domain's YAML file as the JSON value the domain is read from. A key repeated in
/// one mapping is refused with its line (envoyproxy/ratelimit refuses such a file; read
/// straight into JSON, the last one silently won).
pub fn domain_yaml(text: &[u8]) -> Result<serde_json::Value, String> {
    let yaml: serde_yaml::Value =
        serde_yaml::from_slice(text).map_err(|e| format!("is not valid YAML: {e}"))?;
    serde_json::to_value(yaml).map_err(|e| format!("is not a configuration file: {e}"))
}

#[cfg(test)]
mod yaml_tests {
    #[test]
    fn a_repeated_key_is_refused_with_its_line() {
        let file = b"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      unit: minute\n      requests_per_unit: 1\n";
        let error = super::domain_yaml(file).unwrap_err();
        assert!(
            error.contains("duplicate entry with key \"unit\""),
            "{error}"
        );
        assert!(error.contains("descriptors[0].rate_limit"), "{error}");
        assert!(error.contains("line 5"), "{error}");
        let good = super::domain_yaml(b"domain: d\ndescriptors: []\n").unwrap();
        assert_eq!(good["domain"], "d");
    }
}
