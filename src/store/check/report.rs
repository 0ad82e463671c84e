//! Usage reported after a check: a refund when a later slot denies, reports of what a
//! call cost (added or given back), and local counters' flushes.

use super::*;
use crate::store::{Store, StoreError};

/// Usage reported after a check: refunds, reports and local flushes.
impl Store {
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

    pub(super) async fn report_script(
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
}
