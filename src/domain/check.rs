//! A check of a policy: every rule × identifier at once, all or nothing, and the decision
//! the caller sees. `evaluate` is the reference model of `lua/check.lua`.

use serde::{Deserialize, Serialize};

use super::{
    Identifier, Name,
    algorithm::{Outcome, State, step},
    rule::Algorithm,
};

/// What one rule said about one identifier in a check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleResult {
    pub rule: Name,
    pub identifier: Identifier,
    /// The algorithm (with its parameters) that was evaluated: the policy's rule, or an
    /// override's rule of the same name. `None` when an override blocks the identifier.
    pub algorithm: Option<Algorithm>,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The result that decided: the one that denied, or the one with least remaining.
    pub binding: bool,
    /// A concurrency rule of a counted check that was allowed: the id of the lease it holds
    /// (see `lease.rs`), to release or renew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
}

impl RuleResult {
    /// The algorithm's name as documents and answers write it (`block` for a blocking
    /// override).
    pub fn algorithm_name(&self) -> &'static str {
        self.algorithm.as_ref().map_or("block", Algorithm::name)
    }
}

/// The answer to a check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub results: Vec<RuleResult>,
    /// Redis Cluster only: a later slot denied, and what earlier slots had consumed was
    /// given back.
    #[serde(default)]
    pub refunded: bool,
    /// When it was decided, µs on Redis's clock (the earliest, when a check took several
    /// calls); 0 when Redis was not asked. What a refund of this check must name.
    #[serde(default)]
    pub at_us: i64,
}

impl Decision {
    /// Builds the decision from every result, marking the binding one.
    pub fn new(mut results: Vec<RuleResult>) -> Self {
        let allowed = results.iter().all(|r| r.outcome.allowed);
        if let Some(i) = binding_index(results.iter().map(|r| &r.outcome)) {
            results[i].binding = true;
        }
        Self {
            allowed,
            results,
            refunded: false,
            at_us: 0,
        }
    }

    /// The binding result, if the check evaluated anything.
    pub fn binding(&self) -> Option<&RuleResult> {
        self.results.iter().find(|r| r.binding)
    }
}

/// Which outcome binds: among denials the one that makes the caller wait longest (a cost
/// that can never pass waits forever); otherwise the one with least remaining. Ties go to
/// the first.
pub fn binding_index<'a>(outcomes: impl Iterator<Item = &'a Outcome>) -> Option<usize> {
    let mut best: Option<(usize, &Outcome)> = None;
    for (i, o) in outcomes.enumerate() {
        let better = match best {
            None => true,
            Some((_, b)) => match (o.allowed, b.allowed) {
                (false, true) => true,
                (true, false) => false,
                (false, false) => {
                    let wait = |x: &Outcome| x.retry_after_ms.unwrap_or(u64::MAX);
                    wait(o) > wait(b)
                }
                (true, true) => o.remaining < b.remaining,
            },
        };
        if better {
            best = Some((i, o));
        }
    }
    best.map(|(i, _)| i)
}

/// One rule × identifier pair of a check, as the model sees it.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub algorithm: &'a Algorithm,
    pub count_denied: bool,
}

/// All-or-nothing evaluation of `entries` with their current `states`.
///
/// When every entry allows, each consumes `cost`. When any denies, nothing is consumed,
/// except by entries with `count_denied`; entries that would have allowed report their
/// state as it is (a peek). Returns the states afterwards and one outcome per entry.
pub fn evaluate(
    states: &[Option<State>],
    now_us: i64,
    cost: u64,
    entries: &[Entry<'_>],
) -> (Vec<Option<State>>, Vec<Outcome>) {
    assert_eq!(states.len(), entries.len(), "one state per entry");
    let steps: Vec<_> = states
        .iter()
        .zip(entries)
        .map(|(s, e)| step(s.as_ref(), now_us, cost, e.algorithm, e.count_denied))
        .collect();
    let all_allowed = steps.iter().all(|(_, o)| o.allowed);
    let mut after = Vec::with_capacity(states.len());
    let mut outcomes = Vec::with_capacity(states.len());
    for ((state, entry), (new_state, outcome)) in states.iter().zip(entries).zip(steps) {
        if all_allowed || entry.count_denied {
            after.push(new_state.or_else(|| state.clone()));
            outcomes.push(outcome);
        } else if outcome.allowed {
            let (_, peek) = step(state.as_ref(), now_us, 0, entry.algorithm, false);
            after.push(state.clone());
            outcomes.push(peek);
        } else {
            after.push(state.clone());
            outcomes.push(outcome);
        }
    }
    (after, outcomes)
}
