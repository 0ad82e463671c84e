//! A check's way through Redis: the check script assembled for the algorithms a check uses,
//! its arguments built from the rules, the call (one round trip on a single Redis, one per
//! identifier's slot on a cluster, with refunds when a later slot denies), the probe that
//! reads without consuming, usage reported afterwards, and the reply read back into domain
//! outcomes. The coalescer (`coalesce.rs`) sends counted checks together; together these two
//! files are a check's whole path through the store.

use std::sync::OnceLock;

use redis::Script;

use super::{Store, StoreError};
use crate::domain::{Algorithm, Decision, Identifier, Name, Outcome, Rule, RuleResult};

/// The algorithm files the check script is assembled from, by their codes in `keys.rs`.
pub(super) const ALGORITHM_FILES: [(&str, &str); 9] = [
    ("fw", include_str!("../../lua/fixed_window.lua")),
    ("lw", include_str!("../../lua/sliding_log.lua")),
    ("sw", include_str!("../../lua/sliding_window.lua")),
    ("tb", include_str!("../../lua/token_bucket.lua")),
    ("lb", include_str!("../../lua/leaky_bucket.lua")),
    ("gc", include_str!("../../lua/gcra.lua")),
    ("bw", include_str!("../../lua/bucketed_window.lua")),
    ("cc", include_str!("../../lua/concurrency.lua")),
    ("qt", include_str!("../../lua/quota.lua")),
];

/// The check script for each mix of algorithms, built on first use: the shared prelude, the
/// files of just the algorithms the check uses, the live counters, then the driver that reads
/// KEYS and ARGV. Still one script and one round trip per check, whatever the mix; leaving
/// out the algorithms a check does not use spares Redis defining them on every call
/// (benches/DESIGN.md).
pub(super) struct CheckScripts([OnceLock<Script>; 1 << ALGORITHM_FILES.len()]);

impl CheckScripts {
    pub(super) fn new() -> Self {
        Self(std::array::from_fn(|_| OnceLock::new()))
    }

    /// The script for checks of these algorithms.
    pub(super) fn for_algorithms<'a>(
        &self,
        algorithms: impl Iterator<Item = &'a Algorithm>,
    ) -> &Script {
        let mask = algorithms.fold(0usize, |mask, a| {
            let code = a.kind().code;
            mask | 1
                << ALGORITHM_FILES
                    .iter()
                    .position(|(c, _)| *c == code)
                    .expect("every algorithm code has a file")
        });
        self.0[mask].get_or_init(|| Script::new(&check_source(mask)))
    }
}

/// The source of the check script for the algorithms in `mask` (bits in ALGORITHM_FILES order).
fn check_source(mask: usize) -> String {
    let mut parts = vec![include_str!("../../lua/prelude.lua")];
    parts.extend(
        ALGORITHM_FILES
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & 1 << i != 0)
            .map(|(_, (_, source))| *source),
    );
    parts.push(include_str!("../../lua/stats.lua"));
    parts.push(include_str!("../../lua/check.lua"));
    parts.join("\n")
}

/// Which clock a check runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Now {
    /// Redis `TIME`: the server's clock, the same for every Spillway host. Production.
    Redis,
    /// A fixed time in µs (tests that replay published tables).
    At(i64),
    /// Redis `TIME` plus an offset in µs: a test clock that never runs slower than the
    /// real one, so real TTLs never expire state the test still counts on.
    RedisPlus(i64),
}

impl Now {
    fn arg(self) -> String {
        match self {
            Now::Redis => String::new(),
            Now::At(us) => us.to_string(),
            Now::RedisPlus(us) => format!("+{us}"),
        }
    }
}

/// What one check adds to its rules' script parameters: the random token its leases are
/// named by (concurrency rules), and the time calendar boundaries are worked out around
/// (quota rules; the script places Redis's own clock among them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckContext {
    token: u64,
    around_us: i64,
}

impl CheckContext {
    /// The context of a check of `rules` on the clock `now`: a token is drawn only for a
    /// check that takes leases.
    pub(super) fn new(rules: &[(Algorithm, Counting)], now: Now) -> Self {
        // 0 when the check takes no lease.
        let token = if rules
            .iter()
            .any(|(a, _)| matches!(a, Algorithm::Concurrency { .. }))
        {
            (getrandom::u64().unwrap_or_else(|_| {
                // No entropy: still unique within this process.
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    ^ super::stats::now_ms().wrapping_mul(0x9E37_79B9) as u64
            }) & crate::domain::lease::MAX_TOKEN)
                .max(1)
        } else {
            0
        };
        // The clock is read only for a check that has a quota (0 otherwise: unused).
        let around_us = if rules
            .iter()
            .any(|(a, _)| matches!(a, Algorithm::Quota { .. }))
        {
            match now {
                Now::At(us) => us,
                Now::Redis => super::stats::now_ms() * 1000,
                Now::RedisPlus(offset) => super::stats::now_ms() * 1000 + offset,
            }
        } else {
            0
        };
        Self { token, around_us }
    }
}

/// One rule × identifier to evaluate in a check.
#[derive(Clone, Copy, Debug)]
pub struct CheckEntry<'a> {
    pub rule: &'a Rule,
    pub identifier: &'a Identifier,
    /// This entry's own cost, when it is not the check's (an Envoy request whose
    /// descriptors carry different hits): still one all-or-nothing decision.
    pub cost: Option<u64>,
    /// The numbers a caller sent for this rule (`limit=500`), when it did: the entry has
    /// counters of its own under them.
    pub limits: Option<&'a str>,
    /// Whether a denial may start the rule's penalty box (`block_ms`): not in a policy's
    /// shadow mode, whose denials are only reported and must not bite once it enforces.
    pub penalty: bool,
}

impl<'a> CheckEntry<'a> {
    /// An entry counted at the check's cost.
    pub fn new(rule: &'a Rule, identifier: &'a Identifier) -> Self {
        Self {
            rule,
            identifier,
            cost: None,
            limits: None,
            penalty: true,
        }
    }
}

/// Entries of `(algorithm, count_denied, block_ms)`, each counted at the check's cost.
fn at_check_cost(rules: &[(Algorithm, bool, u64)]) -> Vec<(Algorithm, Counting)> {
    rules
        .iter()
        .map(|&(algorithm, count_denied, block_ms)| {
            let counting = Counting {
                count_denied,
                cost: None,
                block_ms,
            };
            (algorithm, counting)
        })
        .collect()
}

/// How one entry counts, as the check script takes it: whether a denied check still counts
/// it (`count_denied`), its own cost when it has one, and its rule's penalty box
/// (`block_ms`, 0 for none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counting {
    pub count_denied: bool,
    pub cost: Option<u64>,
    pub block_ms: u64,
}

impl CheckEntry<'_> {
    /// What this entry's rule said: `outcome`, named by rule and identifier.
    pub fn result(&self, outcome: Outcome) -> RuleResult {
        RuleResult {
            rule: self.rule.name.clone(),
            identifier: self.identifier.clone(),
            algorithm: Some(self.rule.algorithm),
            outcome,
            binding: false,
            lease: None,
        }
    }

    /// A concurrency rule: an allowed, counted check holds a lease of it.
    pub fn takes_lease(&self) -> bool {
        matches!(self.rule.algorithm, Algorithm::Concurrency { .. })
    }
}

/// The raw answer of the check script, before it is named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptReply {
    pub allowed: bool,
    /// A local rule's flush that was not applied: the identifier was reset after its
    /// counter was seeded.
    pub discarded: bool,
    /// The time the script used, µs on Redis's clock.
    pub now_us: i64,
    pub outcomes: Vec<Outcome>,
}

/// What the check script is asked to do (its ARGV[3]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The all-or-nothing check.
    Check,
    /// Another slot of the same check denied: consume nothing (but `count_denied`).
    Denied,
    /// Give back what a `Check` at the same time consumed.
    Refund,
    /// Write nothing: each entry's state, and when a request of the cost would pass it.
    Probe,
    /// Usage after the fact: count the cost even past the limit.
    Report,
    /// A negative report: give the cost back.
    GiveBack,
    /// A local rule's flush: a report, unless the identifier was reset at or after
    /// `since_us` (when the counter was seeded, Redis's clock).
    Flush { since_us: i64 },
}

impl Mode {
    fn arg(self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed(match self {
            Mode::Check => "check",
            Mode::Denied => "denied",
            Mode::Refund => "refund",
            Mode::Probe => "probe",
            Mode::Report => "report",
            Mode::GiveBack => "giveback",
            Mode::Flush { since_us } => return format!("flush:{since_us}").into(),
        })
    }
}

impl Store {
    /// A check that also counts itself for the overview: `check_and_consume` at Redis's
    /// clock, with the live counters updated in the same script on a single Redis. On a
    /// cluster the counters live in another slot, so they are updated by a second call
    /// that the caller does not wait for.
    pub async fn check_and_count(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
    ) -> Result<Decision, StoreError> {
        if self.is_cluster() {
            let decision = self
                .check_and_consume(policy, entries, cost, Now::Redis)
                .await?;
            let store = self.clone();
            let policy = policy.to_string();
            let denied_label = (!decision.allowed)
                .then(|| {
                    decision
                        .binding()
                        .map(|b| super::stats::label(&policy, &b.identifier.to_string()))
                })
                .flatten();
            let allowed = decision.allowed;
            tokio::spawn(async move {
                let labels: Vec<(String, u64)> = denied_label.into_iter().map(|l| (l, 1)).collect();
                if let Err(error) = store
                    .add_stats(&policy, u64::from(allowed), u64::from(!allowed), &labels)
                    .await
                {
                    tracing::debug!(%error, "could not count a check");
                }
            });
            return Ok(decision);
        }
        // A single Redis: the check and its counters in one script call, shared with the
        // checks that arrive meanwhile (see coalesce.rs).
        let coalescer = self.coalescer.as_ref().ok_or_else(|| {
            StoreError::Unsupported("a check queue (a cluster checks key by key)")
        })?;
        let Prepared { keys, rules } = self.prepare(policy, entries);
        let context = CheckContext::new(&rules, Now::Redis);
        let labels = entries
            .iter()
            .map(|e| super::stats::label(policy.as_str(), &e.identifier.to_string()))
            .collect();
        let (at_us, outcomes) = coalescer
            .check(
                keys,
                rules,
                labels,
                self.keys.stats_rate(policy.as_str()),
                cost,
                context,
            )
            .await?;
        let mut decision = self.decision_of(entries, outcomes);
        decision.at_us = at_us;
        with_leases(policy, entries, &mut decision, &context, cost, |_| at_us);
        Ok(decision)
    }

    /// Checks `entries` of `policy` at `cost`, consuming only when every one allows, on the
    /// clock `now` (`Now::Redis` in production).
    ///
    /// One round trip on a single Redis. On a cluster, one per identifier (each identifier's
    /// keys share a hash-tag slot), in order; when a later identifier denies, what the
    /// earlier ones consumed is refunded and the decision says `refunded`.
    pub async fn check_and_consume(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
        now: Now,
    ) -> Result<Decision, StoreError> {
        let prepared = self.prepare(policy, entries);
        let context = CheckContext::new(&prepared.rules, now);
        if !self.is_cluster() {
            let reply = self
                .run_script(
                    &prepared.keys,
                    &prepared.rules,
                    cost,
                    now,
                    Mode::Check,
                    &context,
                )
                .await?;
            let mut decision = self.decision_of(entries, reply.outcomes);
            decision.at_us = reply.now_us;
            with_leases(policy, entries, &mut decision, &context, cost, |_| {
                reply.now_us
            });
            return Ok(decision);
        }
        let groups = prepared.slot_groups(entries);
        let mut outcomes: Vec<Option<Outcome>> = vec![None; entries.len()];
        // The time each entry's script ran at (what its lease is named by).
        let mut taken = vec![0i64; entries.len()];
        // Groups that consumed, with the time their script used (for the refund).
        let mut committed: Vec<(usize, i64)> = Vec::new();
        let mut denied = false;
        let mut at_us = i64::MAX;
        for (g, group) in groups.iter().enumerate() {
            let mode = if denied { Mode::Denied } else { Mode::Check };
            let reply = self
                .run_script(&group.keys, &group.rules, cost, now, mode, &context)
                .await?;
            at_us = at_us.min(reply.now_us);
            if mode == Mode::Check && !reply.allowed {
                denied = true;
            }
            if mode == Mode::Check && reply.allowed && cost > 0 {
                committed.push((g, reply.now_us));
            }
            for &i in &group.members {
                taken[i] = reply.now_us;
            }
            group.place(reply.outcomes, &mut outcomes);
        }
        let mut refunded = false;
        if denied {
            for (g, at) in committed {
                let group = &groups[g];
                let reply = self
                    .run_script(
                        &group.keys,
                        &group.rules,
                        cost,
                        Now::At(at),
                        Mode::Refund,
                        &context,
                    )
                    .await?;
                group.place(reply.outcomes, &mut outcomes);
                refunded = true;
            }
        }
        let mut decision = self.decision_of(entries, placed(outcomes));
        decision.refunded = refunded;
        decision.at_us = if at_us == i64::MAX { 0 } else { at_us };
        with_leases(policy, entries, &mut decision, &context, cost, |i| taken[i]);
        Ok(decision)
    }

    /// Each rule's state for `entries` (a peek: nothing is written), with `retry_after_ms`
    /// saying when a request of `cost` would pass that rule (`None`: it would pass now, or
    /// never). One call per identifier's slot.
    pub async fn probe(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.in_each_slot(policy, entries, cost, Mode::Probe).await
    }

    /// `entries` of a check that another part of it denied (a local rule): each counts it
    /// as a denied check counts, so only rules with `count_denied` write, and answers its
    /// state. One call per identifier's slot.
    pub async fn denied_elsewhere(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.in_each_slot(policy, entries, cost, Mode::Denied).await
    }

    /// Runs the check script in `mode` once per identifier's slot, at Redis's clock.
    async fn in_each_slot(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
        mode: Mode,
    ) -> Result<Decision, StoreError> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; entries.len()];
        for group in self.prepare(policy, entries).slot_groups(entries) {
            let reply = self
                .run_script(
                    &group.keys,
                    &group.rules,
                    cost,
                    Now::Redis,
                    mode,
                    &CheckContext::new(&group.rules, Now::Redis),
                )
                .await?;
            group.place(reply.outcomes, &mut outcomes);
        }
        Ok(self.decision_of(entries, placed(outcomes)))
    }

    fn decision_of(&self, entries: &[CheckEntry<'_>], outcomes: Vec<Outcome>) -> Decision {
        let results = entries
            .iter()
            .zip(outcomes)
            .map(|(e, outcome)| e.result(outcome))
            .collect();
        Decision::new(results)
    }

    /// Gives back what a `check_and_consume` of the same entries and cost consumed; `at_us`
    /// is its decision's `at_us`. Used where an attempt is charged first and forgiven when it
    /// turns out well (a successful login). Not for checks that took leases: those are
    /// released by their ids.
    pub async fn refund(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
        at_us: i64,
    ) -> Result<(), StoreError> {
        // Per identifier: on a cluster each identifier is its own slot.
        for group in self.prepare(policy, entries).slot_groups(entries) {
            self.run_script(
                &group.keys,
                &group.rules,
                cost,
                Now::At(at_us),
                Mode::Refund,
                &CheckContext::new(&group.rules, Now::At(at_us)),
            )
            .await?;
        }
        Ok(())
    }

    /// Usage known after the fact: adds `cost` to every entry (counted even past its limit,
    /// so the next check is denied) or, when negative, gives it back (never below nothing).
    /// Concurrency entries are left alone. The decision holds each entry's state afterwards
    /// (a peek); one call per identifier's slot.
    pub async fn report(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: i64,
        now: Now,
    ) -> Result<Decision, StoreError> {
        let prepared = self.prepare(policy, entries);
        let mut outcomes: Vec<Option<Outcome>> = vec![None; entries.len()];
        let mut at_us = 0;
        for group in prepared.slot_groups(entries) {
            let reply = self
                .report_script(&group.keys, &group.rules, cost, now)
                .await?;
            at_us = reply.now_us;
            group.place(reply.outcomes, &mut outcomes);
        }
        let mut decision = self.decision_of(entries, placed(outcomes));
        decision.at_us = at_us;
        Ok(decision)
    }

    /// A local rule's flush: `sent` counted on `entry` as [`Store::report`] counts it,
    /// unless the identifier was reset at or after `since_us` (when the counter was seeded,
    /// Redis's clock); then nothing is counted and the answer says `discarded`. The entry's
    /// state afterwards, and the time of the call (µs, Redis's clock).
    pub async fn flush_local(
        &self,
        policy: &Name,
        entry: &CheckEntry<'_>,
        sent: u64,
        since_us: i64,
    ) -> Result<ScriptReply, StoreError> {
        let prepared = self.prepare(policy, std::slice::from_ref(entry));
        let context = CheckContext::new(&prepared.rules, Now::Redis);
        self.run_script(
            &prepared.keys,
            &prepared.rules,
            sent,
            Now::Redis,
            Mode::Flush { since_us },
            &context,
        )
        .await
    }

    /// The report of [`Store::report`] on explicit keys (the tests drive it against the
    /// model).
    pub async fn run_report(
        &self,
        keys: &[String],
        rules: &[(Algorithm, bool)],
        cost: i64,
        now: Now,
    ) -> Result<ScriptReply, StoreError> {
        let rules: Vec<_> = rules.iter().map(|&(a, c)| (a, c, 0)).collect();
        self.report_script(keys, &at_check_cost(&rules), cost, now)
            .await
    }

    async fn report_script(
        &self,
        keys: &[String],
        rules: &[(Algorithm, Counting)],
        cost: i64,
        now: Now,
    ) -> Result<ScriptReply, StoreError> {
        let mode = if cost < 0 {
            Mode::GiveBack
        } else {
            Mode::Report
        };
        let context = CheckContext::new(rules, now);
        self.run_script(keys, rules, cost.unsigned_abs(), now, mode, &context)
            .await
    }

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
    fn prepare(&self, policy: &Name, entries: &[CheckEntry<'_>]) -> Prepared {
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

    async fn run_script(
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
            penalties.push(super::keys::reset_epoch_of(&keys[0]));
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
struct Prepared {
    keys: Vec<String>,
    rules: Vec<(Algorithm, Counting)>,
}

impl Prepared {
    /// The entries of each identifier (one hash-tag slot on a cluster), in first-seen order.
    fn slot_groups(&self, entries: &[CheckEntry<'_>]) -> Vec<SlotGroup> {
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
struct SlotGroup {
    members: Vec<usize>,
    keys: Vec<String>,
    rules: Vec<(Algorithm, Counting)>,
}

impl SlotGroup {
    /// Puts this group's outcomes at their places in the check.
    fn place(&self, outcomes: Vec<Outcome>, into: &mut [Option<Outcome>]) {
        for (&i, outcome) in self.members.iter().zip(outcomes) {
            into[i] = Some(outcome);
        }
    }
}

/// Names the lease each concurrency entry of an allowed, counted check took: the check's
/// token, the entry's cost (the rule's count of the check's, `CheckEntry::cost`), and the
/// time the entry's script ran at (`taken(i)` for entry `i`).
fn with_leases(
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
fn placed(outcomes: Vec<Option<Outcome>>) -> Vec<Outcome> {
    outcomes
        .into_iter()
        .map(|o| o.expect("every entry is in a group"))
        .collect()
}

/// The penalty keys of a check's entries whose rules have a penalty box, in entry order:
/// they follow the check's state keys (`keys`) in the script's KEYS.
pub(super) fn penalty_keys(keys: &[String], rules: &[(Algorithm, Counting)]) -> Vec<String> {
    keys.iter()
        .zip(rules)
        .filter(|(_, (_, counting))| counting.block_ms > 0)
        .map(|(key, _)| super::keys::penalty_box(key))
        .collect()
}

/// Where each entry's penalty key is among a check's `n` state keys and its penalty keys
/// (the offset from its first key, as [`entry_args`] tells the script); `None` for an
/// entry without a penalty box. Called once per entry, in order.
pub(super) fn penalty_offsets(n: usize) -> impl FnMut(&(Algorithm, Counting)) -> Option<usize> {
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
pub(super) fn entry_args(
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

pub(super) fn parse_reply(raw: &[i64], entries: usize) -> Result<ScriptReply, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_script_defines_just_the_algorithms_of_its_mix() {
        let scripts = CheckScripts::new();
        let fw = Algorithm::FixedWindow {
            limit: 1,
            window_ms: 1000,
        };
        let gcra = Algorithm::Gcra {
            rate: 1,
            period_ms: 1000,
            burst: 1,
        };
        let both = check_source(0b10_0001);
        for (code, _) in ALGORITHM_FILES {
            let defined = both.contains(&format!("ALGORITHMS.{code} = function"));
            assert_eq!(defined, code == "fw" || code == "gc", "{code}");
        }
        // The same mix in any order and with repeats is the same script.
        let a = scripts
            .for_algorithms([&gcra, &fw, &gcra].into_iter())
            .get_hash();
        let b = scripts.for_algorithms([&fw, &gcra].into_iter()).get_hash();
        assert_eq!(a, b);
        assert_ne!(a, scripts.for_algorithms([&fw].into_iter()).get_hash());
    }
}
