//! Planning an Envoy rate limit request, before anything is counted: each descriptor's
//! target (no limit, unlimited, always over, or counted under a rule), `replaces` and the
//! policy's overrides applied, repeated descriptors folded into one count, and the counted
//! ones sorted into the checks the service makes: the enforced ones together (all or
//! nothing), each cost of shadow-mode ones, and peeks. Then, as each check's decision comes
//! back, the descriptors' answers. Pure: the service runs the checks (`service::envoy`).
//!
//! How envoyproxy/ratelimit's rules map onto the engine:
//! - a descriptor that finds no limit is OK and consumes nothing; an `unlimited` limit is OK
//!   without asking Redis;
//! - `requests_per_unit: 0` denies without asking Redis;
//! - all counted descriptors are decided together: when one is over its limit, none is
//!   consumed, and each over its limit answers `limit_remaining` 0;
//! - a descriptor repeated in one request counts once (envoyproxy/ratelimit counts each
//!   repeat);
//! - a `shadow_mode` limit is counted after the others allowed (its own check): over it
//!   answers OK, and the denial is counted and shown;
//! - `replaces`: a limit named in the `replaces` of another limit that applies to the same
//!   request is not checked;
//! - a `quota_mode` limit is counted after the enforced ones allowed (its own check): over it
//!   answers OVER_LIMIT for that descriptor, and the request is over only when every
//!   quota-mode descriptor of it is;
//! - `share_threshold`: every value a wildcard matches is counted under the wildcard
//!   itself, one counter for all;
//! - a policy override of the descriptor's identifier (`envoy=...`) makes it unlimited or
//!   blocks it, as it does for any identifier.

use std::{collections::HashSet, sync::Arc};

use super::{
    Algorithm, Decision, Identifier, Policy, Rule, RulesFor,
    envoy::{self, Allowance, EnvoyDomain, Limit, RequestDescriptor, Unit},
};

mod target;
use target::*;

/// A `ShouldRateLimit` request, without the protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyRequest {
    pub domain: String,
    pub descriptors: Vec<EnvoyDescriptor>,
    /// Hits for every descriptor that does not say (0 means 1).
    pub hits_addend: u64,
    /// Kuadrant's `CheckRateLimit`: nothing is counted, and a descriptor is over when one
    /// more hit would not fit.
    pub check_only: bool,
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
    /// OK, with no limit: what a descriptor that finds none answers.
    pub fn unlimited() -> Self {
        Self {
            ok: true,
            limit: None,
            remaining: 0,
            reset_ms: None,
            shadow_denied: false,
        }
    }
}

/// Where a descriptor's check goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// No limit: OK, nothing consumed.
    Free,
    /// Unlimited: OK without Redis.
    Unlimited,
    /// Always over (a limit of 0, or blocked by an override).
    Over(Option<CurrentLimit>),
    /// Counted under `rule`.
    Count {
        rule: RuleRef,
        current: CurrentLimit,
        shadow: bool,
        /// `quota_mode`: over it fails the request only when every quota descriptor is over.
        quota: bool,
    },
}

/// A counted descriptor's rule: an index into the policy's rules, or into the caller's own
/// limits of this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleRef {
    Policy(usize),
    Caller(usize),
}

/// How a group of descriptors was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Together, all or nothing: each is OK when under its limit.
    Enforced,
    /// Shadow-mode limits: always OK; over the limit is marked (and was counted).
    Shadow,
    /// Quota-mode limits: each over its limit answers so, and the request fails only when
    /// every one is.
    Quota,
    /// Read without consuming: the code is left as it is.
    Peek,
}

/// A request that cannot be planned: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    pub field: String,
    pub message: String,
}

/// A request's plan: its descriptors' targets, the checks to make, and the answers so far.
#[derive(Clone, Debug)]
pub struct Plan {
    policy: Arc<Policy>,
    caller_rules: Vec<Rule>,
    targets: Vec<Target>,
    /// Each descriptor's identifier (`envoy=key=value|...`).
    pub identifiers: Vec<Identifier>,
    /// Each descriptor's hits.
    pub costs: Vec<u64>,
    statuses: Vec<DescriptorAnswer>,
    /// The first descriptor over without asking Redis (a limit of 0, or blocked).
    pub over_already: Option<usize>,
    /// Counted together, all or nothing, each at its own hits.
    pub enforced: Vec<usize>,
    /// Shadow-mode limits, counted per cost after the enforced ones allowed.
    pub shadows: Vec<usize>,
    /// Quota-mode limits, counted per cost after the enforced ones allowed.
    pub quotas: Vec<usize>,
    /// Each descriptor's metric key (`domain.key_value.key`), when it found a limit in the
    /// domain's file.
    pub metric_keys: Vec<Option<String>>,
    /// Read without consuming.
    pub peeks: Vec<usize>,
    /// (a repeated descriptor, the one checked for it).
    repeats: Vec<(usize, usize)>,
    /// The domain counts every hit, past the limit too (`Counting::EveryHit`).
    every_hit: bool,
    /// Only reading: a counter with nothing left is over (Kuadrant's `CheckRateLimit`).
    check_only: bool,
    /// Every limit in quota mode (`EnvoyDomain::quota_all`).
    quota_all: bool,
}

/// Plans `request` against `policy`, whose Envoy domain is `tree`, at `now_ms`.
pub fn plan(
    policy: &Arc<Policy>,
    tree: &EnvoyDomain,
    request: &EnvoyRequest,
    now_ms: i64,
) -> Result<Plan, PlanError> {
    let default_cost = request.hits_addend.max(1);
    let costs: Vec<u64> = request
        .descriptors
        .iter()
        .map(|d| match request.check_only {
            true => 0,
            false => d.hits_addend.unwrap_or(default_cost),
        })
        .collect();
    let n = costs.len();
    let (mut identifiers, mut metric_keys) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut caller_rules = Vec::new();
    let mut limits = Vec::with_capacity(n);
    let mut targets = Vec::with_capacity(n);
    for (i, d) in request.descriptors.iter().enumerate() {
        // A caller's own limit replaces the file's: it finds nothing there.
        let found = d.limit.is_none().then(|| tree.lookup(&d.entries)).flatten();
        let entries = found.as_ref().and_then(|f| f.shared.clone());
        identifiers.push(
            RequestDescriptor {
                entries: entries.unwrap_or_else(|| d.entries.clone()),
            }
            .identifier(),
        );
        let limit = found.as_ref().map(|f| f.limit);
        metric_keys.push(found.map(|f| f.metric_key));
        let every_hit = tree.counts == envoy::Counting::EveryHit;
        targets.push(target_of(
            i,
            d,
            (costs[i], every_hit, tree.quota_all),
            limit,
            &mut caller_rules,
        ));
        limits.push(limit);
    }
    apply_replaces(&mut targets, &limits);
    for (target, identifier) in targets.iter_mut().zip(&identifiers) {
        match policy.rules_for(identifier, now_ms) {
            RulesFor::Unlimited => *target = Target::Unlimited,
            RulesFor::Blocked => *target = Target::Over(None),
            RulesFor::Rules(_) => {}
        }
    }
    let statuses: Vec<DescriptorAnswer> = targets.iter().map(|t| first_answer(t, now_ms)).collect();
    let mut plan = Plan {
        policy: policy.clone(),
        caller_rules,
        targets,
        identifiers,
        costs,
        over_already: statuses.iter().position(|s| !s.ok),
        statuses,
        enforced: Vec::new(),
        shadows: Vec::new(),
        quotas: Vec::new(),
        peeks: Vec::new(),
        repeats: Vec::new(),
        metric_keys,
        every_hit: tree.counts == envoy::Counting::EveryHit,
        quota_all: tree.quota_all,
        check_only: request.check_only,
    };
    plan.sort_into_checks();
    plan.fold_repeats();
    Ok(plan)
}

/// A descriptor's answer before anything is counted.
fn first_answer(target: &Target, now_ms: i64) -> DescriptorAnswer {
    match target {
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
    }
}

impl Plan {
    /// Sorts the counted descriptors: peeks (hits 0, and every one when the request is over
    /// already), shadow-mode ones, and the enforced rest.
    fn sort_into_checks(&mut self) {
        for (i, t) in self.targets.iter().enumerate() {
            if let Target::Count { shadow, quota, .. } = t {
                // Over already: the rest is only read, unless every hit counts.
                // (A quota over already fails nothing alone: the rest count.)
                let over_already = self.over_already.is_some() && !self.quota_all;
                if self.costs[i] == 0 || (over_already && !self.every_hit) {
                    self.peeks.push(i);
                } else if *shadow {
                    self.shadows.push(i);
                } else if *quota {
                    self.quotas.push(i);
                } else {
                    self.enforced.push(i);
                }
            }
        }
    }

    /// Counts a repeated descriptor once. Its copies share a counter (the same entries, hits
    /// and rule name: a caller's own limits of one unit are all `caller-<unit>`); they are
    /// checked once, under the strictest of their limits, and each answers as that check
    /// did, under its own limit. envoyproxy/ratelimit increments once per copy; here the
    /// counted descriptors are one all-or-nothing check of one cost, where two entries of
    /// one key would each read the state before either wrote (a fixed window then counted
    /// them once when new, twice when not).
    fn fold_repeats(&mut self) {
        let mut groups = [
            std::mem::take(&mut self.enforced),
            std::mem::take(&mut self.shadows),
            std::mem::take(&mut self.quotas),
            std::mem::take(&mut self.peeks),
        ];
        for group in &mut groups {
            let mut kept: Vec<usize> = Vec::with_capacity(group.len());
            // (a copy, the position in `kept` of the one checked for it)
            let mut copies: Vec<(usize, usize)> = Vec::new();
            for &i in group.iter() {
                match kept
                    .iter()
                    .position(|&j| self.counter(j) == self.counter(i))
                {
                    Some(at) if self.fixed_limit(i) < self.fixed_limit(kept[at]) => {
                        copies.push((kept[at], at));
                        kept[at] = i;
                    }
                    Some(at) => copies.push((i, at)),
                    None => kept.push(i),
                }
            }
            self.repeats
                .extend(copies.into_iter().map(|(copy, at)| (copy, kept[at])));
            *group = kept;
        }
        let [enforced, shadows, quotas, peeks] = groups;
        (self.enforced, self.shadows, self.quotas, self.peeks) = (enforced, shadows, quotas, peeks);
    }

    /// What descriptor `i` counts on: its rule's name, its identifier and its hits.
    fn counter(&self, i: usize) -> Option<(&str, &Identifier, u64)> {
        match &self.targets[i] {
            Target::Count { rule, .. } => Some((
                self.rule(*rule).name.as_str(),
                &self.identifiers[i],
                self.costs[i],
            )),
            _ => None,
        }
    }

    /// Descriptor `i`'s fixed-window limit (what tells the strictest of repeated ones).
    fn fixed_limit(&self, i: usize) -> u64 {
        match &self.targets[i] {
            Target::Count { rule, .. } => match self.rule(*rule).algorithm {
                Algorithm::FixedWindow { limit, .. } => limit,
                _ => u64::MAX,
            },
            _ => u64::MAX,
        }
    }

    /// The policy the request runs under.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    fn rule(&self, r: RuleRef) -> &Rule {
        match r {
            RuleRef::Policy(i) => &self.policy.rules[i],
            RuleRef::Caller(i) => &self.caller_rules[i],
        }
    }

    /// The rule, identifier and hits each of the counted descriptors `idx` is checked
    /// under.
    pub fn entries(&self, idx: &[usize]) -> Vec<(&Rule, &Identifier, u64)> {
        idx.iter()
            .map(|&i| {
                let Target::Count { rule, .. } = &self.targets[i] else {
                    unreachable!("only counted descriptors are checked")
                };
                (self.rule(*rule), &self.identifiers[i], self.costs[i])
            })
            .collect()
    }

    /// The shadow-mode descriptors by cost (each cost is its own check), lowest first.
    pub fn shadow_checks(&self) -> Vec<(u64, Vec<usize>)> {
        by_cost(&self.shadows, &self.costs)
    }

    /// The enforced check denied: the shadow- and quota-mode descriptors are then only read
    /// (unless every hit counts).
    pub fn enforced_denied(&mut self) {
        if self.every_hit {
            return;
        }
        self.peeks.append(&mut self.shadows);
        self.peeks.append(&mut self.quotas);
        self.peeks.sort_unstable();
    }

    /// The quota-mode descriptors by cost (each cost is its own check), lowest first.
    pub fn quota_checks(&self) -> Vec<(u64, Vec<usize>)> {
        by_cost(&self.quotas, &self.costs)
    }

    /// Whether the request is over its limits once every check has answered: a descriptor
    /// over an enforced limit (or over without asking Redis), or every quota-mode one over.
    pub fn over(&self) -> bool {
        let over = |i: usize| !self.statuses[i].ok;
        if self.quota_all {
            // An identifier blocked by the policy's overrides fails the request whatever
            // else holds.
            if self.targets.iter().any(|t| matches!(t, Target::Over(None))) {
                return true;
            }
            // Every descriptor but an `unlimited` one is a quota (one that found no limit,
            // within it): over when each of them is.
            let mut quotas = (0..self.statuses.len())
                .filter(|&i| !matches!(self.targets[i], Target::Unlimited))
                .peekable();
            return quotas.peek().is_some() && quotas.all(over);
        }
        let quota = |i: usize| matches!(self.targets[i], Target::Count { quota: true, .. });
        (0..self.statuses.len()).any(|i| over(i) && !quota(i))
            || (!self.quotas.is_empty() && self.quotas.iter().all(|&i| over(i)))
    }

    /// Takes the answers of descriptors `idx` from `decision` (its results are in their
    /// order), checked as `group`; `now_ms` when the decision does not say when it was made.
    pub fn fill(&mut self, idx: &[usize], decision: &Decision, group: Group, now_ms: i64) {
        let now_ms = if decision.at_us > 0 {
            decision.at_us / 1000
        } else {
            now_ms
        };
        for (result, &i) in decision.results.iter().zip(idx) {
            let Target::Count { current, .. } = &self.targets[i] else {
                continue;
            };
            let s = &mut self.statuses[i];
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
                Group::Quota => {
                    s.ok = result.outcome.allowed;
                    if !s.ok {
                        s.remaining = 0;
                    }
                }
                // Read only: left OK, but when the domain counts every hit, a counter with
                // nothing left (or past its limit) is over, as envoyproxy/ratelimit answers
                // a descriptor of 0 hits there.
                Group::Peek => {
                    let shadow = matches!(self.targets[i], Target::Count { shadow: true, .. });
                    if (self.every_hit || self.check_only)
                        && !shadow
                        && result.outcome.remaining == 0
                    {
                        s.ok = false;
                    }
                }
            }
        }
    }

    /// Every descriptor's answer, a repeated one answering as the one checked for it did
    /// (taken: a second call answers nothing).
    pub fn answers(&mut self) -> Vec<DescriptorAnswer> {
        let mut statuses = std::mem::take(&mut self.statuses);
        for &(copy, checked) in &self.repeats {
            statuses[copy] = DescriptorAnswer {
                limit: statuses[copy].limit.take(),
                ..statuses[checked].clone()
            };
        }
        statuses
    }

    /// Every counted descriptor once (a repeated one by the copy checked for it), in order:
    /// what a usage report adds to.
    pub fn counted(&self) -> Vec<usize> {
        let mut all: Vec<usize> = [&self.enforced, &self.shadows, &self.quotas, &self.peeks]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        all.sort_unstable();
        all
    }

    /// The name of the rule descriptor `i` counts under, as the dashboard shows a denial:
    /// the limit's name, or `override` / `limit-0` for one over without Redis.
    pub fn rule_of(&self, i: usize) -> String {
        match self.targets.get(i) {
            Some(Target::Count {
                rule: RuleRef::Policy(r),
                ..
            }) => self.policy.rules[*r].name.to_string(),
            Some(Target::Count {
                rule: RuleRef::Caller(r),
                ..
            }) => self.caller_rules[*r].name.to_string(),
            Some(Target::Over(Some(_))) => "limit-0".into(),
            Some(Target::Over(None)) => "override".into(),
            _ => String::new(),
        }
    }

    /// The identifiers of the descriptors that found a limit (the others consume nothing).
    /// The descriptors that found no limit in the domain's file (answered OK, counted
    /// nowhere), by place.
    pub fn unmatched(&self) -> impl Iterator<Item = usize> + '_ {
        self.targets
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(t, Target::Free))
            .map(|(i, _)| i)
    }

    /// The hits every limited descriptor counts when they all count the same, none brought
    /// its own limit, none is in shadow or quota mode and none was over without Redis (a
    /// limit of 0, a block): what a what-if record holds of a request, which a replay of the
    /// domain's rules decides as Envoy's request was. `None` otherwise.
    pub fn shared_cost(&self) -> Option<u64> {
        if !self.caller_rules.is_empty()
            || !self.shadows.is_empty()
            || !self.quotas.is_empty()
            || self.over_already.is_some()
        {
            return None;
        }
        let mut costs = self
            .targets
            .iter()
            .zip(&self.costs)
            .filter(|(t, _)| matches!(t, Target::Count { .. } | Target::Over(_)))
            .map(|(_, c)| *c);
        let first = costs.next()?;
        costs.all(|c| c == first).then_some(first)
    }

    pub fn limited(&self) -> impl Iterator<Item = &Identifier> + Clone {
        self.targets
            .iter()
            .zip(&self.identifiers)
            .filter(|(t, _)| matches!(t, Target::Count { .. } | Target::Over(_)))
            .map(|(_, id)| id)
    }
}

/// The descriptors `idx` grouped by their cost, lowest first.
fn by_cost(idx: &[usize], costs: &[u64]) -> Vec<(u64, Vec<usize>)> {
    let mut distinct: Vec<u64> = idx.iter().map(|&i| costs[i]).collect();
    distinct.sort_unstable();
    distinct.dedup();
    distinct
        .into_iter()
        .map(|cost| {
            let group = idx.iter().copied().filter(|&i| costs[i] == cost).collect();
            (cost, group)
        })
        .collect()
}

/// Milliseconds until the clock-aligned window of `unit` that holds `now_ms` ends.
pub fn until_window_end(unit: Unit, now_ms: i64) -> u64 {
    let len = unit.seconds() * 1000;
    len - (now_ms.max(0) as u64 % len)
}

/// The rule a caller's own limit runs as: named after its unit, so the count of one
/// descriptor carries on while the caller changes the number; counting denied hits when the
/// domain counts every hit.
fn caller_rule(index: usize, requests_per_unit: u32, unit: Unit, every_hit: bool) -> Rule {
    Rule::new(
        index,
        &format!("caller-{}", unit.as_str()),
        Algorithm::FixedWindow {
            limit: u64::from(requests_per_unit),
            window_ms: unit.seconds() * 1000,
        },
        Some(vec![envoy::DIMENSION.to_owned()]),
        every_hit,
    )
    .expect("a valid name and window")
}

#[cfg(test)]
mod tests;
