//! Inspecting an identifier (its live state in every policy, a peek that consumes nothing)
//! and resetting it (everywhere, in one policy, or one rule), with the reset's audit record.
//! The admin API and the dashboard's inspector both call these.

use super::{Service, now_ms};
use crate::{
    audit::{Actor, Change},
    domain::{
        Identifier, Name, Policy, RulesFor,
        inspection::{Inspection, LeaseView, PolicyState, RuleState},
        lease::LeaseId,
    },
    store::{CheckEntry, StoreError},
};

/// Why a reset did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// A field of the request is wrong (`rule` without `policy`, a rule the policy lacks).
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("policy: no policy named {0:?}")]
    UnknownPolicy(String),
    /// The caller's role may not reset this identifier.
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

/// What a reset did: the policies it touched and how many keys it deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetDone {
    pub policies: Vec<String>,
    pub deleted_keys: u64,
}

impl Service {
    /// The identifier's state in every policy that has rules for it: a peek at cost 0 per
    /// policy, and each rule's key's TTL. Redis failing is an error, not an empty answer.
    pub async fn inspect(&self, id: &Identifier) -> Result<Inspection, StoreError> {
        let now_ms = now_ms();
        let mut out = Inspection {
            identifier: id.to_string(),
            at_ms: now_ms,
            ..Inspection::default()
        };
        for policy in self.policies.all() {
            let mut ps = PolicyState {
                policy: policy.name.to_string(),
                version: policy.version,
                status: "rules".into(),
                rules: Vec::new(),
            };
            match policy.rules_for(id, now_ms) {
                RulesFor::Unlimited => ps.status = "unlimited".into(),
                RulesFor::Blocked => ps.status = "blocked".into(),
                RulesFor::Rules(rules) => {
                    // An Envoy domain counts a descriptor under the one limit it finds.
                    let found = policy
                        .envoy
                        .as_ref()
                        .and_then(|t| t.rule_for(id))
                        .map(|i| &policy.rules[i].name);
                    let entries: Vec<CheckEntry<'_>> = rules
                        .iter()
                        .filter(|r| {
                            r.applies_to(id.dimension().as_str())
                                && found.is_none_or(|name| *name == r.name)
                        })
                        .map(|rule| CheckEntry::new(rule, id))
                        .collect();
                    if entries.is_empty() {
                        continue;
                    }
                    // Each rule's state, and when a request of cost 1 would pass it: what
                    // support staff are asked ("when can they try again?").
                    let decision = self.store.probe(&policy.name, &entries, 1).await?;
                    let ttls = self.store.rule_ttls(&policy.name, &entries).await?;
                    let mut leases = Vec::with_capacity(entries.len());
                    for entry in &entries {
                        leases.push(if entry.takes_lease() {
                            self.leases_view(&policy.name, entry).await?
                        } else {
                            Vec::new()
                        });
                    }
                    ps.rules = decision
                        .results
                        .into_iter()
                        .zip(ttls)
                        .zip(leases)
                        .map(|((r, ttl), leases)| RuleState {
                            rule: r.rule.to_string(),
                            algorithm: r.algorithm_name().to_owned(),
                            identifier: r.identifier.to_string(),
                            limit: r.outcome.limit,
                            remaining: r.outcome.remaining,
                            reset_ms: r.outcome.reset_ms,
                            ttl_ms: (ttl >= 0).then_some(ttl),
                            binding: r.binding,
                            retry_after_ms: r.outcome.retry_after_ms,
                            leases,
                        })
                        .collect();
                }
            }
            out.policies.push(ps);
        }
        Ok(out)
    }

    /// The leases a concurrency entry holds now, with their ids.
    async fn leases_view(
        &self,
        policy: &Name,
        entry: &CheckEntry<'_>,
    ) -> Result<Vec<LeaseView>, StoreError> {
        let (now_us, held) = self
            .store
            .leases_of(policy, entry.identifier, &entry.rule.name)
            .await?;
        Ok(held
            .into_iter()
            .map(|l| LeaseView {
                id: LeaseId {
                    policy: policy.clone(),
                    rule: entry.rule.name.clone(),
                    identifier: entry.identifier.clone(),
                    token: l.token,
                    cost: l.cost,
                    taken_us: l.taken_us,
                }
                .to_string(),
                cost: l.cost,
                age_ms: ((now_us - l.taken_us).max(0) / 1000) as u64,
                expires_in_ms: ((l.expires_us - now_us).max(0) as u64).div_ceil(1000),
            })
            .collect())
    }

    /// As [`Service::inspect`] for what a person typed (`user=42`): a malformed identifier
    /// or Redis failing is said in the inspection's `error`, for the page to show.
    pub async fn inspect_typed(&self, raw: &str) -> Inspection {
        let failed = |error: String| Inspection {
            identifier: raw.trim().to_owned(),
            at_ms: now_ms(),
            error: Some(error),
            ..Inspection::default()
        };
        let id = match Identifier::parse(raw.trim()) {
            Ok(id) => id,
            Err(e) => {
                return failed(format!(
                    "identifier: {e} (write it as dimension=value, such as user=42)"
                ));
            }
        };
        match self.inspect(&id).await {
            Ok(inspection) => inspection,
            Err(error) => {
                tracing::warn!(%error, "inspector: Redis call failed");
                failed("Redis is unavailable; the counters cannot be read".into())
            }
        }
    }

    /// Resets `id`'s counters: everywhere, in one policy, or for one rule of it; every
    /// instance forgets its cached denials of it at once. Writes the audit record.
    pub async fn reset_identifier(
        &self,
        actor: &Actor,
        id: &Identifier,
        policy: Option<&str>,
        rule: Option<&str>,
        reason: &str,
    ) -> Result<ResetDone, ResetError> {
        let rule = reset_rule(policy, rule)?;
        let all = self.resettable_policies(actor, id).await?;
        let chosen = chosen_policies(&all, policy, rule.as_ref())?;
        let deleted_keys = self
            .store
            .reset_identifier(&chosen, id, rule.as_ref(), policy.is_none())
            .await?;
        let policies: Vec<String> = chosen.iter().map(|p| p.name.to_string()).collect();
        // This instance forgets at once; others on the pub/sub message.
        self.denials
            .invalidate(policy.is_some().then_some(policies.as_slice()), id);
        let scope = serde_json::json!({
            "policies": policies,
            "rule": rule.as_ref().map(Name::as_str),
            "deleted_keys": deleted_keys,
        });
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "identifier.reset",
                    target: &id.to_string(),
                    after: scope.to_string(),
                    reason,
                    ..Change::default()
                },
            )
            .await;
        Ok(ResetDone {
            policies,
            deleted_keys,
        })
    }

    /// The policies a reset of `id` may touch: every stored one, and the sign-in limits for
    /// a sign-in identifier, whose counters live under no stored policy (a reset of one
    /// lifts a lock-out). Only an admin resets those: they guard every account, an admin's
    /// too, and support resetting them after each few guesses would have unlimited guesses
    /// at an admin's password.
    async fn resettable_policies(
        &self,
        actor: &Actor,
        id: &Identifier,
    ) -> Result<Vec<Policy>, ResetError> {
        let mut all = self.store.list_policies().await?;
        if super::signin::is_login_dimension(id.dimension().as_str()) {
            if actor.role != "admin" {
                return Err(ResetError::Forbidden(
                    "id: the sign-in limits guard every account; only an admin resets them",
                ));
            }
            all.push(super::signin::login_policy());
        }
        Ok(all)
    }
}

/// The rule a reset names, parsed; a rule needs its policy.
fn reset_rule(policy: Option<&str>, rule: Option<&str>) -> Result<Option<Name>, ResetError> {
    match rule {
        None => Ok(None),
        Some(_) if policy.is_none() => Err(ResetError::Invalid {
            field: "rule",
            message: "needs policy too".into(),
        }),
        Some(r) => Name::parse(r)
            .map(Some)
            .map_err(|message| ResetError::Invalid {
                field: "rule",
                message,
            }),
    }
}

/// The policies of `all` a reset touches: the one named (which must have `rule`, when
/// given), or every one.
fn chosen_policies<'a>(
    all: &'a [Policy],
    policy: Option<&str>,
    rule: Option<&Name>,
) -> Result<Vec<&'a Policy>, ResetError> {
    let Some(name) = policy else {
        return Ok(all.iter().collect());
    };
    let p = all
        .iter()
        .find(|p| p.name.as_str() == name)
        .ok_or_else(|| ResetError::UnknownPolicy(name.to_owned()))?;
    if let Some(r) = rule
        && !p.all_rules().any(|x| &x.name == r)
    {
        return Err(ResetError::Invalid {
            field: "rule",
            message: format!("{name} has no rule {r}"),
        });
    }
    Ok(vec![p])
}
