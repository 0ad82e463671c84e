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
    /// Its rule's penalty box (`block_ms`), 0 for none.
    pub block_ms: u64,
}

/// What the store keeps for one entry: its rule's state, and until when (µs on Redis's
/// clock) the rule's penalty box holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EntryState {
    pub state: Option<State>,
    pub blocked_until_us: Option<i64>,
}

/// All-or-nothing evaluation of `entries` with their current `states`.
///
/// When every entry allows, each consumes `cost`. When any denies, nothing is consumed,
/// except by entries with `count_denied`; entries that would have allowed report their
/// state as it is (a peek). Returns the states afterwards and one outcome per entry.
///
/// The penalty box: an entry whose rule has `block_ms` and that denies on its own (at a
/// cost) holds its identifier denied for `block_ms` from now. While held, the entry is not
/// stepped at all: it answers its state as a peek, denied, with nothing remaining and the
/// rest of the penalty to wait. `lua/check.lua` does the same (`held`, `trip`).
pub fn evaluate(
    states: &[EntryState],
    now_us: i64,
    cost: u64,
    entries: &[Entry<'_>],
) -> (Vec<EntryState>, Vec<Outcome>) {
    evaluate_costs(states, now_us, &vec![cost; entries.len()], entries)
}

/// [`evaluate`] with each entry at a cost of its own (`costs`, one per entry: the check's
/// cost as its rule counts it, [`super::Rule::cost_of`]), as the script takes them.
pub fn evaluate_costs(
    states: &[EntryState],
    now_us: i64,
    costs: &[u64],
    entries: &[Entry<'_>],
) -> (Vec<EntryState>, Vec<Outcome>) {
    assert_eq!(states.len(), entries.len(), "one state per entry");
    assert_eq!(costs.len(), entries.len(), "one cost per entry");
    let steps: Vec<_> = states
        .iter()
        .zip(entries)
        .zip(costs)
        .map(|((s, e), &cost)| {
            let state = s.state.as_ref();
            let held = (e.block_ms > 0)
                .then_some(s.blocked_until_us)
                .flatten()
                .filter(|&until| until > now_us);
            if let Some(until) = held {
                let (_, peek) = step(state, now_us, 0, e.algorithm, false);
                return (None, held_outcome(peek, now_us, until), s.blocked_until_us);
            }
            let (new_state, outcome) = step(state, now_us, cost, e.algorithm, e.count_denied);
            if e.block_ms > 0 && !outcome.allowed && cost > 0 {
                let until = now_us + e.block_ms as i64 * 1000;
                return (new_state, tripped(outcome, e.block_ms), Some(until));
            }
            (new_state, outcome, s.blocked_until_us)
        })
        .collect();
    let all_allowed = steps.iter().all(|(_, o, _)| o.allowed);
    let mut after = Vec::with_capacity(states.len());
    let mut outcomes = Vec::with_capacity(states.len());
    for ((stored, entry), (new_state, outcome, blocked_until_us)) in
        states.iter().zip(entries).zip(steps)
    {
        let state = &stored.state;
        let (state, outcome) = if all_allowed || entry.count_denied {
            (new_state.or_else(|| state.clone()), outcome)
        } else if outcome.allowed {
            let (_, peek) = step(state.as_ref(), now_us, 0, entry.algorithm, false);
            (state.clone(), peek)
        } else {
            (state.clone(), outcome)
        };
        after.push(EntryState {
            state,
            blocked_until_us,
        });
        outcomes.push(outcome);
    }
    (after, outcomes)
}

/// An entry its penalty holds until `until_us`: its state as `peek` shows it, denied.
fn held_outcome(peek: Outcome, now_us: i64, until_us: i64) -> Outcome {
    let wait = super::algorithm::ceil_ms((until_us - now_us) as f64);
    Outcome {
        allowed: false,
        remaining: 0,
        reset_ms: peek.reset_ms.max(wait),
        retry_after_ms: Some(wait),
        delay_ms: 0,
        penalty: true,
        ..peek
    }
}

/// The denial that starts a penalty of `block_ms`: its own wait, at least the penalty.
fn tripped(denied: Outcome, block_ms: u64) -> Outcome {
    Outcome {
        remaining: 0,
        reset_ms: denied.reset_ms.max(block_ms),
        retry_after_ms: denied.retry_after_ms.map(|r| r.max(block_ms)),
        penalty: true,
        ..denied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    #[test]
    fn a_penalty_holds_from_the_denial_whatever_the_rule_says_then_lets_go() {
        let window = Algorithm::FixedWindow {
            limit: 2,
            window_ms: 1000,
        };
        let entry = Entry {
            algorithm: &window,
            count_denied: false,
            block_ms: 5000,
        };
        let t0 = 1_700_000_000 * SECOND;
        let mut states = vec![EntryState::default()];
        let mut at = |t: i64, cost: u64| {
            let (after, outcomes) = evaluate(&states, t, cost, &[entry]);
            states = after;
            outcomes[0]
        };
        assert!(at(t0, 1).allowed);
        assert!(at(t0, 1).allowed);
        let trip = at(t0 + 100_000, 1);
        assert!(!trip.allowed && trip.penalty);
        assert_eq!(
            trip.retry_after_ms,
            Some(5000),
            "the penalty, not the window's 900 ms"
        );
        // The window has turned over, but the penalty holds, to the microsecond.
        let held = at(t0 + 2 * SECOND, 1);
        assert!(!held.allowed && held.penalty);
        assert_eq!((held.retry_after_ms, held.remaining), (Some(3100), 0));
        // A peek sees the hold too, and changes nothing.
        assert_eq!(at(t0 + 2 * SECOND, 0).retry_after_ms, Some(3100));
        assert!(!at(t0 + 5 * SECOND + 99_999, 1).allowed);
        let free = at(t0 + 5 * SECOND + 100_000, 1);
        assert!(free.allowed && !free.penalty);
        assert_eq!(free.remaining, 1, "a held request counted nothing");
    }

    #[test]
    fn only_the_rule_that_denies_starts_a_penalty() {
        let (wide, tight) = (
            Algorithm::FixedWindow {
                limit: 100,
                window_ms: 1000,
            },
            Algorithm::FixedWindow {
                limit: 1,
                window_ms: 1000,
            },
        );
        let entries = [
            Entry {
                algorithm: &wide,
                count_denied: false,
                block_ms: 60_000,
            },
            Entry {
                algorithm: &tight,
                count_denied: false,
                block_ms: 0,
            },
        ];
        let t0 = 1_700_000_000 * SECOND;
        let (states, _) = evaluate(
            &[EntryState::default(), EntryState::default()],
            t0,
            1,
            &entries,
        );
        let (states, outcomes) = evaluate(&states, t0 + 1, 1, &entries);
        assert!(!outcomes[1].allowed && outcomes[0].allowed);
        assert_eq!(states[0].blocked_until_us, None);
        let (_, outcomes) = evaluate(&states, t0 + 2 * SECOND, 1, &entries);
        assert!(outcomes.iter().all(|o| o.allowed));
    }
}
