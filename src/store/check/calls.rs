//! The script calls: each check's keys and arguments placed by slot, penalties and leases
//! among them, and the reply read back into outcomes.

use super::*;
use crate::store::{Store, StoreError};

/// The script calls themselves.
impl Store {
    /// Runs the check script on explicit keys. The building block of `check_and_consume`,
    /// public so the tests can drive each algorithm against its reference model.
    pub async fn run_check(
        &self,
        keys: &[String],
        rules: &[(Algorithm, bool)],
        cost: u64,
        now: Now,
    ) -> Result<ScriptReply, StoreError> {
        let rules: Vec<_> = rules.iter().map(|&(a, c)| (a, c, 0)).collect();
        self.run_check_with_penalties(keys, &rules, cost, now).await
    }

    /// As [`Store::run_check`], each entry with its rule's penalty box (`block_ms`, 0 for
    /// none).
    pub async fn run_check_with_penalties(
        &self,
        keys: &[String],
        rules: &[(Algorithm, bool, u64)],
        cost: u64,
        now: Now,
    ) -> Result<ScriptReply, StoreError> {
        let rules = &at_check_cost(rules);
        let context = CheckContext::new(rules, now);
        self.run_script(keys, rules, cost, now, Mode::Check, &context)
            .await
    }

    /// The state key and the script's parameters of every entry: the one place a check's
    /// entries become what the script takes (the batch call of `coalesce.rs` too).
    pub(super) fn prepare(&self, policy: &Name, entries: &[CheckEntry<'_>]) -> Prepared {
        Prepared {
            keys: entries
                .iter()
                .map(|e| {
                    let mut key = self.keys.rule_key(policy, e.identifier, e.rule);
                    if let Some(numbers) = e.limits {
                        key.push('~');
                        key.push_str(numbers);
                    }
                    key
                })
                .collect(),
            rules: entries
                .iter()
                .map(|e| {
                    let counting = Counting {
                        count_denied: e.rule.count_denied,
                        cost: e.cost,
                        block_ms: if e.penalty {
                            e.rule.block_ms.unwrap_or(0)
                        } else {
                            0
                        },
                    };
                    (e.rule.algorithm, counting)
                })
                .collect(),
        }
    }

    pub(super) async fn run_script(
        &self,
        keys: &[String],
        rules: &[(Algorithm, Counting)],
        cost: u64,
        now: Now,
        mode: Mode,
        context: &CheckContext,
    ) -> Result<ScriptReply, StoreError> {
        if keys.is_empty() {
            return Ok(ScriptReply {
                allowed: true,
                discarded: false,
                now_us: 0,
                outcomes: vec![],
            });
        }
        let script = self
            .scripts
            .checks
            .for_algorithms(rules.iter().map(|(a, _)| a));
        let mut penalties = penalty_keys(keys, rules);
        if let Mode::Flush { .. } = mode {
            // The epoch key, last (after the penalty keys, whose places count from the
            // first state key).
            penalties.push(crate::store::keys::reset_epoch_of(&keys[0]));
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len() + penalties.len());
        for key in keys.iter().chain(&penalties) {
            cmd.arg(key);
        }
        cmd.arg(now.arg()).arg(cost).arg(mode.arg().as_ref());
        let mut penalty_at = penalty_offsets(keys.len());
        for rule in rules {
            entry_args(&mut cmd, rule, context, penalty_at(rule));
        }
        let carried: Vec<_> = crate::telemetry::traces::current_sampled()
            .into_iter()
            .collect();
        let raw: Vec<i64> = Store::traced_script_call(&carried, self.evalsha(script, &cmd)).await?;
        parse_reply(&raw, keys.len())
    }
}

/// A check's entries as the check script takes them: a state key and the algorithm with
/// `count_denied`, per entry.
pub(super) struct Prepared {
    pub(super) keys: Vec<String>,
    pub(super) rules: Vec<(Algorithm, Counting)>,
}

impl Prepared {
    /// The entries of each identifier (one hash-tag slot on a cluster), in first-seen order.
    pub(super) fn slot_groups(&self, entries: &[CheckEntry<'_>]) -> Vec<SlotGroup> {
        let mut groups: Vec<(&Identifier, SlotGroup)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let at = match groups.iter().position(|(id, _)| *id == e.identifier) {
                Some(at) => at,
                None => {
                    groups.push((e.identifier, SlotGroup::default()));
                    groups.len() - 1
                }
            };
            let group = &mut groups[at].1;
            group.members.push(i);
            group.keys.push(self.keys[i].clone());
            group.rules.push(self.rules[i]);
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }
}

/// The entries of one identifier: their places in the check, their keys and rules.
#[derive(Default)]
pub(super) struct SlotGroup {
    pub(super) members: Vec<usize>,
    pub(super) keys: Vec<String>,
    pub(super) rules: Vec<(Algorithm, Counting)>,
}

impl SlotGroup {
    /// Puts this group's outcomes at their places in the check.
    pub(super) fn place(&self, outcomes: Vec<Outcome>, into: &mut [Option<Outcome>]) {
        for (&i, outcome) in self.members.iter().zip(outcomes) {
            into[i] = Some(outcome);
        }
    }
}

/// Names the lease each concurrency entry of an allowed, counted check took: the check's
/// token, the entry's cost (the rule's count of the check's, `CheckEntry::cost`), and the
/// time the entry's script ran at (`taken(i)` for entry `i`).
pub(super) fn with_leases(
    policy: &Name,
    entries: &[CheckEntry<'_>],
    decision: &mut Decision,
    context: &CheckContext,
    cost: u64,
    taken: impl Fn(usize) -> i64,
) {
    if !decision.allowed || cost == 0 || context.token == 0 {
        return;
    }
    for (i, (entry, result)) in entries.iter().zip(&mut decision.results).enumerate() {
        if entry.takes_lease() {
            result.lease = Some(
                crate::domain::lease::LeaseId {
                    policy: policy.clone(),
                    rule: entry.rule.name.clone(),
                    identifier: entry.identifier.clone(),
                    token: context.token,
                    cost: entry.cost.unwrap_or(cost),
                    taken_us: taken(i),
                }
                .to_string(),
            );
        }
    }
}

/// The outcomes once every group has put its own.
pub(super) fn placed(outcomes: Vec<Option<Outcome>>) -> Vec<Outcome> {
    outcomes
        .into_iter()
        .map(|o| o.expect("every entry is in a group"))
        .collect()
}

/// The penalty keys of a check's entries whose rules have a penalty box, in entry order:
/// they follow the check's state keys (`keys`) in the script's KEYS.
pub(in crate::store) fn penalty_keys(
    keys: &[String],
    rules: &[(Algorithm, Counting)],
) -> Vec<String> {
    keys.iter()
        .zip(rules)
        .filter(|(_, (_, counting))| counting.block_ms > 0)
        .map(|(key, _)| crate::store::keys::penalty_box(key))
        .collect()
}

/// Where each entry's penalty key is among a check's `n` state keys and its penalty keys
/// (the offset from its first key, as [`entry_args`] tells the script); `None` for an
/// entry without a penalty box. Called once per entry, in order.
pub(in crate::store) fn penalty_offsets(
    n: usize,
) -> impl FnMut(&(Algorithm, Counting)) -> Option<usize> {
    let mut next = n;
    move |(_, counting)| {
        (counting.block_ms > 0).then(|| {
            next += 1;
            next
        })
    }
}

/// One entry's five arguments to the check script: the algorithm's code, `count_denied`
/// (`1` or `0`, followed by `:<cost>` when the entry has a cost of its own, then by
/// `!<block_ms>@<offset>` when its rule has a penalty box whose key is at `penalty_at`),
/// and its three parameters (see the algorithm's Lua file): a concurrency rule's third is
/// the check's lease token, a quota's second the calendar boundaries around the check.
pub(in crate::store) fn entry_args(
    cmd: &mut redis::Cmd,
    (algorithm, counting): &(Algorithm, Counting),
    context: &CheckContext,
    penalty_at: Option<usize>,
) {
    cmd.arg(algorithm.kind().code);
    match (counting.count_denied, counting.cost, penalty_at) {
        (true, None, None) => cmd.arg("1"),
        (false, None, None) => cmd.arg("0"),
        (count_denied, cost, penalty_at) => {
            let mut flag = u8::from(count_denied).to_string();
            if let Some(cost) = cost {
                flag.push_str(&format!(":{cost}"));
            }
            if let Some(at) = penalty_at {
                flag.push_str(&format!("!{}@{at}", counting.block_ms));
            }
            cmd.arg(flag)
        }
    };
    match algorithm {
        Algorithm::Concurrency { limit, lease_ms } => {
            cmd.arg(limit).arg(lease_ms).arg(context.token);
        }
        Algorithm::Quota { limit, .. } => {
            let calendar = algorithm.calendar().expect("a quota has a calendar");
            let [p, s, e, n] =
                crate::domain::calendar::periods_around(&calendar, context.around_us);
            cmd.arg(limit).arg(format!("{p}:{s}:{e}:{n}")).arg(0);
        }
        _ => {
            let [p1, p2, p3] = algorithm.params();
            cmd.arg(p1).arg(p2).arg(p3);
        }
    }
}

pub(in crate::store) fn parse_reply(
    raw: &[i64],
    entries: usize,
) -> Result<ScriptReply, StoreError> {
    if raw.len() != 2 + 6 * entries {
        return Err(StoreError::Reply(format!(
            "check.lua answered {} integers for {entries} entries",
            raw.len()
        )));
    }
    let nonneg = |v: i64, what: &str| -> Result<u64, StoreError> {
        u64::try_from(v).map_err(|_| StoreError::Reply(format!("negative {what}: {v}")))
    };
    let outcomes = raw[2..]
        .chunks_exact(6)
        .map(|c| {
            Ok(Outcome {
                // 2: denied by the rule's penalty box (see check.lua)
                allowed: c[0] == 1,
                penalty: c[0] == 2,
                limit: nonneg(c[1], "limit")?,
                remaining: nonneg(c[2], "remaining")?,
                reset_ms: nonneg(c[3], "reset_ms")?,
                retry_after_ms: if c[4] < 0 { None } else { Some(c[4] as u64) },
                delay_ms: nonneg(c[5], "delay_ms")?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(ScriptReply {
        allowed: raw[0] == 1,
        discarded: raw[0] == 2,
        now_us: raw[1],
        outcomes,
    })
}
