//! What if: a policy's rules (a draft's, or the ones in force) replayed in the reference
//! model over the checks a policy recorded, in time order, and the answer compared with what
//! happened: what would be denied and allowed, by rule, whom it would newly throttle or
//! free, and the minute it would deny most. Pure: the record comes from the store, the
//! budget from the caller.
//!
//! The replay starts from no state at the record's first check (what came before is not
//! known), and decides each check as `service::check` does: overrides (unlimited, block, or
//! rules of their own), the rules that count each identifier, a cost no rule could admit
//! (denied, nothing counted), all or nothing. Not replayed: `concurrency` rules (a lease is
//! released by its holder at a time the record does not hold) and the numbers a caller sent
//! with a check (`limits`: the record does not hold them).
//!
//! A sampled record (see [`sample`]) replays the checks of its kept identifiers whole, and
//! scales the totals by the sample's rate, each newly denied or allowed count with a bound.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{
    Identifier, Mode, Policy, Rule, RulesFor,
    check::{Entry, EntryState, binding_index, evaluate_costs},
    rule::Algorithm,
};

pub mod sample;

/// One recorded check: when Redis decided it (µs on its clock, or the instance's when no
/// Redis call was made), its cost, what was decided, and its identifiers; and the sample it
/// was recorded in: kept as one identifier's in 2^`level`, that identifier being
/// `identifiers[unit]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub at_us: i64,
    pub cost: u64,
    pub allowed: bool,
    pub identifiers: Vec<Identifier>,
    pub level: u8,
    pub unit: u8,
}

impl Recorded {
    /// One line: `at_us`, cost, 1|0, the sample when there is one (`s<level>.<unit>`) and
    /// each identifier, tab-separated (identifiers hold no control characters).
    pub fn to_line(&self) -> String {
        let mut line = format!("{}\t{}\t{}", self.at_us, self.cost, u8::from(self.allowed));
        if self.level > 0 || self.unit > 0 {
            line.push_str(&format!("\ts{}.{}", self.level, self.unit));
        }
        for identifier in &self.identifiers {
            line.push('\t');
            line.push_str(&identifier.to_string());
        }
        line
    }

    /// Reads [`Recorded::to_line`]'s line back; `None` when it is not one.
    pub fn from_line(line: &str) -> Option<Self> {
        let mut parts = line.split('\t').peekable();
        let at_us = parts.next()?.parse().ok()?;
        let cost = parts.next()?.parse().ok()?;
        let allowed = match parts.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        // An identifier always holds `=`; the sample never does.
        let (level, unit) = match parts.next_if(|p| p.starts_with('s') && !p.contains('=')) {
            Some(sample) => {
                let (level, unit) = sample[1..].split_once('.')?;
                let level: u8 = level.parse().ok()?;
                (level <= sample::MAX_LEVEL).then_some(())?;
                (level, unit.parse().ok()?)
            }
            None => (0, 0),
        };
        let identifiers = parts
            .map(|p| Identifier::parse(p).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            at_us,
            cost,
            allowed,
            identifiers,
            level,
            unit,
        })
    }
}

/// How many identifiers each top list names at most.
pub const TOP: usize = 10;

/// An identifier (or a check's identifiers, joined) and how many checks of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counted {
    pub identifier: String,
    pub checks: u64,
}

/// The minute with the most checks the replayed rules deny.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakMinute {
    /// Its start (ms since the epoch).
    pub at_ms: i64,
    pub denied: u64,
}

/// The replay's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIf {
    /// Checks replayed, and the time (ms) of the first and the last.
    pub checks: u64,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    /// What happened: checks allowed and denied when they were made.
    pub allowed_then: u64,
    pub denied_then: u64,
    /// What the replayed rules decide.
    pub allowed: u64,
    pub denied: u64,
    /// Allowed then, denied now; denied then, allowed now.
    pub newly_denied: u64,
    pub newly_allowed: u64,
    /// The replayed rules' denials by the rule that bound (`override` for a blocking
    /// override, `cost` for a cost no rule could admit), most first.
    pub denied_by_rule: Vec<Counted>,
    /// The identifiers the replayed rules newly deny (the one that bound), most first, at
    /// most [`TOP`].
    pub newly_throttled: Vec<Counted>,
    /// The checks they newly allow, by the check's identifiers, most first, at most [`TOP`].
    pub newly_freed: Vec<Counted>,
    pub peak_minute: Option<PeakMinute>,
    /// Rules not replayed (concurrency: see the module's documentation).
    pub not_replayed: Vec<String>,
    /// False when the budget ran out before the record's end: the answer covers the checks
    /// up to `to_ms`.
    pub complete: bool,
    /// 1 when every check was recorded; else the record kept the checks of one identifier
    /// in this many, and the counts above are its checks' times this (the top lists are the
    /// kept identifiers' own counts).
    pub one_in: u64,
    /// About two standard errors of `newly_denied` and `newly_allowed` when sampled (0 when
    /// not): the true count is most likely within this of the estimate.
    pub newly_denied_bound: u64,
    pub newly_allowed_bound: u64,
}

/// What the replayed rules make of one check.
enum Replayed {
    Allowed,
    /// Denied, with the rule and identifier that bound.
    Denied(String, String),
}

/// Replays `policy` over `record` (in time order; ties keep the record's order). Asks
/// `out_of_time` every 4,096 checks and stops when it says so (`complete` is then false).
pub fn replay(
    policy: &Policy,
    record: &[Recorded],
    mut out_of_time: impl FnMut() -> bool,
) -> WhatIf {
    // The highest level in the window keeps identifiers that every lower level kept too.
    let level = record.iter().map(|r| r.level).max().unwrap_or(0);
    let mut order: Vec<&Recorded> = record
        .iter()
        .filter(|r| sample::kept_at(r, level))
        .collect();
    order.sort_by_key(|r| r.at_us);
    let mut states: HashMap<String, EntryState> = HashMap::new();
    let mut tally = Tally::default();
    let mut out = WhatIf {
        complete: true,
        not_replayed: policy
            .all_rules()
            .filter(|r| matches!(r.algorithm, Algorithm::Concurrency { .. }))
            .map(|r| r.name.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        ..WhatIf::default()
    };
    for (i, check) in order.into_iter().enumerate() {
        if i % 4096 == 4095 && out_of_time() {
            out.complete = false;
            break;
        }
        let replayed = decide(policy, check, &mut states);
        tally.add(&mut out, check, replayed);
    }
    tally.finish(&mut out, 1u64 << level);
    out
}

/// A policy's rules in the reference model, with state: checks decided one after another,
/// as `service::check` decides them (for `spillway policy test`, and the replay).
pub struct Model<'p> {
    policy: &'p Policy,
    states: HashMap<String, EntryState>,
}

/// What the model made of one check: allowed, or denied with the rule (`override`, `cost`)
/// and identifier that bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied { rule: String, identifier: String },
}

impl<'p> Model<'p> {
    /// `policy` from no state.
    pub fn new(policy: &'p Policy) -> Self {
        Self {
            policy,
            states: HashMap::new(),
        }
    }

    /// Decides a check of `cost` with `identifiers` at `at_us` (µs since the epoch; each
    /// check no earlier than the one before).
    pub fn check(&mut self, at_us: i64, cost: u64, identifiers: &[Identifier]) -> Verdict {
        let check = Recorded {
            at_us,
            cost,
            allowed: true,
            identifiers: identifiers.to_vec(),
            ..Recorded::default()
        };
        match decide(self.policy, &check, &mut self.states) {
            Replayed::Allowed => Verdict::Allowed,
            Replayed::Denied(rule, identifier) => Verdict::Denied { rule, identifier },
        }
    }
}

/// `check` under `policy`, stepping `states` (keyed by rule, its numbers and identifier).
fn decide(policy: &Policy, check: &Recorded, states: &mut HashMap<String, EntryState>) -> Replayed {
    let now_ms = check.at_us.div_euclid(1000);
    let mut counted: Vec<(&Rule, &Identifier)> = Vec::new();
    for identifier in &check.identifiers {
        match policy.rules_for(identifier, now_ms) {
            RulesFor::Unlimited => {}
            RulesFor::Blocked => {
                return Replayed::Denied("override".to_owned(), identifier.to_string());
            }
            RulesFor::Rules(rules) => counted.extend(
                policy
                    .counting(rules, identifier)
                    .filter(|r| !matches!(r.algorithm, Algorithm::Concurrency { .. }))
                    .map(|r| (r, identifier)),
            ),
        }
    }
    if policy.mode == Mode::Enforce
        && let Some((_, identifier)) = counted
            .iter()
            .find(|(r, _)| r.cost_of(check.cost) > r.algorithm.max_admissible())
    {
        return Replayed::Denied("cost".to_owned(), identifier.to_string());
    }
    if counted.is_empty() {
        return Replayed::Allowed;
    }
    let keys: Vec<String> = counted
        .iter()
        .map(|(r, id)| format!("{}\u{1f}{:?}\u{1f}{id}", r.name, r.algorithm))
        .collect();
    let entries: Vec<Entry<'_>> = counted
        .iter()
        .map(|(r, _)| Entry {
            algorithm: &r.algorithm,
            count_denied: r.count_denied,
            // Shadow mode writes no penalty.
            block_ms: if policy.mode == Mode::Shadow {
                0
            } else {
                r.block_ms.unwrap_or(0)
            },
        })
        .collect();
    let costs: Vec<u64> = counted.iter().map(|(r, _)| r.cost_of(check.cost)).collect();
    let before: Vec<EntryState> = keys
        .iter()
        .map(|k| states.get(k).cloned().unwrap_or_default())
        .collect();
    let (after, outcomes) = evaluate_costs(&before, check.at_us, &costs, &entries);
    for (key, state) in keys.into_iter().zip(after) {
        states.insert(key, state);
    }
    if outcomes.iter().all(|o| o.allowed) {
        return Replayed::Allowed;
    }
    let bound = binding_index(outcomes.iter()).unwrap_or(0);
    let (rule, identifier) = counted[bound];
    Replayed::Denied(rule.name.to_string(), identifier.to_string())
}

/// Counts kept while replaying.
#[derive(Default)]
struct Tally {
    by_rule: HashMap<String, u64>,
    throttled: HashMap<String, u64>,
    freed: HashMap<String, u64>,
    by_minute: HashMap<i64, u64>,
    /// Newly denied and newly allowed checks by the identifier each was sampled by.
    denied_by_unit: HashMap<String, u64>,
    allowed_by_unit: HashMap<String, u64>,
}

impl Tally {
    fn add(&mut self, out: &mut WhatIf, check: &Recorded, replayed: Replayed) {
        let at_ms = check.at_us.div_euclid(1000);
        out.checks += 1;
        out.from_ms.get_or_insert(at_ms);
        out.to_ms = Some(at_ms);
        if check.allowed {
            out.allowed_then += 1;
        } else {
            out.denied_then += 1;
        }
        match replayed {
            Replayed::Allowed => {
                out.allowed += 1;
                if !check.allowed {
                    out.newly_allowed += 1;
                    *self.allowed_by_unit.entry(unit_of(check)).or_default() += 1;
                    let ids: Vec<String> =
                        check.identifiers.iter().map(ToString::to_string).collect();
                    *self.freed.entry(ids.join(", ")).or_default() += 1;
                }
            }
            Replayed::Denied(rule, identifier) => {
                out.denied += 1;
                *self.by_rule.entry(rule).or_default() += 1;
                *self.by_minute.entry(at_ms.div_euclid(60_000)).or_default() += 1;
                if check.allowed {
                    out.newly_denied += 1;
                    *self.denied_by_unit.entry(unit_of(check)).or_default() += 1;
                    *self.throttled.entry(identifier).or_default() += 1;
                }
            }
        }
    }

    /// Sets the lists, and scales the totals by `one_in` (1: every check recorded).
    fn finish(self, out: &mut WhatIf, one_in: u64) {
        out.one_in = one_in;
        out.newly_denied_bound = sample::bound(self.denied_by_unit.into_values(), one_in);
        out.newly_allowed_bound = sample::bound(self.allowed_by_unit.into_values(), one_in);
        for total in [
            &mut out.checks,
            &mut out.allowed_then,
            &mut out.denied_then,
            &mut out.allowed,
            &mut out.denied,
            &mut out.newly_denied,
            &mut out.newly_allowed,
        ] {
            *total = total.saturating_mul(one_in);
        }
        let by_rule = self
            .by_rule
            .into_iter()
            .map(|(r, n)| (r, n.saturating_mul(one_in)));
        out.denied_by_rule = most_first(by_rule.collect(), usize::MAX);
        out.newly_throttled = most_first(self.throttled, TOP);
        out.newly_freed = most_first(self.freed, TOP);
        out.peak_minute = self
            .by_minute
            .into_iter()
            .max_by_key(|&(minute, denied)| (denied, std::cmp::Reverse(minute)))
            .map(|(minute, denied)| PeakMinute {
                at_ms: minute * 60_000,
                denied: denied.saturating_mul(one_in),
            });
    }
}

/// The identifier `check` was sampled by, as a string.
fn unit_of(check: &Recorded) -> String {
    check
        .identifiers
        .get(usize::from(check.unit))
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// `counts` most first (ties by name), at most `top`.
fn most_first(counts: HashMap<String, u64>, top: usize) -> Vec<Counted> {
    let mut list: Vec<Counted> = counts
        .into_iter()
        .map(|(identifier, checks)| Counted { identifier, checks })
        .collect();
    list.sort_by(|a, b| {
        b.checks
            .cmp(&a.checks)
            .then(a.identifier.cmp(&b.identifier))
    });
    list.truncate(top);
    list
}

#[cfg(test)]
mod tests;
