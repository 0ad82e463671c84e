//! A check's way through Redis: a check's entries and context, and the calls that count,
//! consume or probe (one round trip on a single Redis, one per identifier's slot on a
//! cluster, with refunds when a later slot denies). The script's assembly is `check/script.rs`,
//! the calls' arguments and replies `check/calls.rs`, usage reported afterwards
//! `check/report.rs`; the coalescer (`coalesce.rs`) sends counted checks together.

mod calls;
mod report;
mod script;

use calls::{Prepared, placed, with_leases};
pub(super) use calls::{entry_args, parse_reply, penalty_keys, penalty_offsets};
pub(super) use script::CheckScripts;

use super::{Store, StoreError};
use crate::domain::{Algorithm, Decision, Identifier, Name, Outcome, Rule, RuleResult};

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
        let both = super::script::check_source(0b10_0001);
        for (code, _) in super::script::ALGORITHM_FILES {
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
