//! Usage reported after the fact: the cost of a request known only once it is done (the
//! tokens an LLM answered with, the bytes a download sent). Added to the identifier's rules
//! without a decision, even past their limits (the next check is then denied); a negative
//! cost gives back what a check over-estimated, never below nothing.

use std::sync::Arc;

use super::{Service, check::CheckError};
use crate::{
    domain::{Decision, Identifier, Policy, RulesFor, rule::CostModel},
    store::{CheckEntry, Now},
};

/// Most a report may add or give back at once (the largest cost of a check).
pub const MAX_REPORT: i64 = super::check::MAX_COST as i64;

/// A report: the policy by name, the identifiers, and the cost to add (negative: to give
/// back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportRequest {
    pub policy: String,
    pub identifiers: Vec<Identifier>,
    pub cost: i64,
}

/// What a report left: every rule's state for every identifier afterwards.
#[derive(Clone, Debug)]
pub struct Reported {
    pub policy: Arc<Policy>,
    pub state: Decision,
}

impl Service {
    /// Adds (or gives back) `request.cost` to every rule of the policy for each identifier,
    /// in one call per identifier's slot. An identifier an override lets through unlimited
    /// or blocks is not counted. Redis failing is an error whatever the failure mode: a
    /// report is not a decision, and the caller should send it again.
    pub async fn report(&self, request: &ReportRequest) -> Result<Reported, CheckError> {
        let policy = self.policy_named(&request.policy)?;
        let now_ms = super::now_ms();
        // Each rule takes the report as it counts a check's cost: a rule that counts
        // requests takes none of it (a report is units: tokens, bytes; its state is read
        // all the same), a weighted one takes it times its weight. One call per weight
        // (there is usually one).
        let mut by_weight: Vec<(u64, Vec<CheckEntry<'_>>)> = Vec::new();
        for identifier in &request.identifiers {
            if let RulesFor::Rules(rules) = policy.rules_for(identifier, now_ms) {
                for rule in rules
                    .iter()
                    .filter(|r| r.applies_to(identifier.dimension().as_str()))
                {
                    let weight = match rule.cost_model() {
                        CostModel::Request => 0,
                        CostModel::Units => 1,
                        CostModel::Weight(w) => w,
                    };
                    let entry = CheckEntry::new(rule, identifier);
                    match by_weight.iter_mut().find(|(w, _)| *w == weight) {
                        Some((_, entries)) => entries.push(entry),
                        None => by_weight.push((weight, vec![entry])),
                    }
                }
            }
        }
        let mut results = Vec::new();
        for (weight, entries) in &by_weight {
            let cost = request
                .cost
                .saturating_mul(i64::try_from(*weight).unwrap_or(i64::MAX))
                .clamp(-MAX_REPORT, MAX_REPORT);
            let state = self
                .store
                .report(&policy.name, entries, cost, Now::Redis)
                .await
                .map_err(CheckError::Unavailable)?;
            results.extend(state.results);
        }
        let state = Decision::new(results);
        if request.cost < 0 {
            // What was given back may end a denial some instance remembers.
            let scope = [policy.name.to_string()];
            for identifier in &request.identifiers {
                self.denials.invalidate(Some(&scope), identifier);
                if let Err(error) = self.store.forget_denials(&scope[0], identifier).await {
                    tracing::warn!(%error, "could not tell the other instances of a give-back");
                }
            }
        }
        crate::telemetry::metrics::reported(policy.name.as_str(), request.cost);
        Ok(Reported { policy, state })
    }
}
