//! Inspecting an identifier (its live state in every policy, a peek that consumes nothing)
//! and resetting it (everywhere, in one policy, or one rule), with the reset's audit record.
//! The admin API and the dashboard's inspector both call these.

use super::{Service, now_ms};
use crate::{
    domain::{
        Identifier, Name, Policy, RulesFor,
        inspection::{Inspection, LeaseView, PolicyState, RuleState},
        lease::LeaseId,
    },
    service::audit::{Actor, Change},
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
    /// No reset of that token can be undone: over a minute old, or undone already.
    #[error("token: no reset to undo (a reset can be undone for a minute, once)")]
    NothingToUndo,
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

/// What a reset did: the policies it touched, how many keys it deleted, and how to undo
/// it (when it deleted any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetDone {
    pub policies: Vec<String>,
    pub deleted_keys: u64,
    pub undo: Option<UndoOffer>,
}

/// A reset can be undone until `until_ms` with `token`: its counters are kept that long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndoOffer {
    pub token: String,
    pub until_ms: i64,
}

/// What an undo put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndoDone {
    pub identifiers: Vec<String>,
    pub restored_keys: u64,
}

/// How long a reset can be undone: long enough to notice the wrong identifier was reset,
/// short enough that the counters put back still mean what they meant.
pub const UNDO_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// One identifier a reset touches: in every policy, one policy, or one rule of it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResetTarget {
    pub identifier: String,
    pub policy: Option<String>,
    pub rule: Option<String>,
}

/// What an undo needs of a reset, kept beside it for [`UNDO_FOR`].
#[derive(serde::Serialize, serde::Deserialize)]
struct ResetRecord {
    targets: Vec<ResetTarget>,
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
                        // As a check of cost 1 counts it: a weighted rule's too.
                        .map(|rule| super::check::entry_at(rule, id, 1))
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
                    let rule_named = |name: &crate::domain::Name| {
                        policy.all_rules().find(|rule| rule.name == *name)
                    };
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
                            penalty: r.outcome.penalty,
                            block_ms: rule_named(&r.rule).and_then(|rule| rule.block_ms),
                            flush_ms: rule_named(&r.rule).and_then(|rule| rule.local_flush_ms()),
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

    /// As [`Service::inspect`] for what a person typed: `user=42`, a bare value (`bob`,
    /// looked up in every dimension in use), or a descriptor as the overview shows it
    /// (`path=/x` for `envoy=path=/x`). One identifier with state is inspected, with the
    /// identifiers it was checked together with; several are offered as candidates.
    /// Redis failing is said in the inspection's `error`, for the page to show.
    pub async fn inspect_typed(&self, raw: &str) -> Inspection {
        let typed = raw.trim();
        match self.resolve_and_inspect(typed).await {
            Ok(inspection) => inspection,
            Err(error) => {
                tracing::warn!(%error, "inspector: Redis call failed");
                Inspection {
                    identifier: typed.to_owned(),
                    at_ms: now_ms(),
                    error: Some("Redis is unavailable; the counters cannot be read".into()),
                    ..Inspection::default()
                }
            }
        }
    }

    async fn resolve_and_inspect(&self, typed: &str) -> Result<Inspection, StoreError> {
        let parsed = Identifier::parse(typed).ok();
        let direct = match &parsed {
            Some(id) => !self.policies_with_state(id).await?.is_empty(),
            None => false,
        };
        let (id, resolved_from, lookup) = if direct {
            (parsed.expect("parsed above"), None, Lookup::default())
        } else {
            let lookup = self.lookup(typed).await?;
            // Nothing with state: one recent identifier of exactly that value is still who
            // was meant (bob, just reset, is "not blocked", not "unknown").
            let recent_one = || {
                let mut exact = lookup
                    .recent
                    .iter()
                    .filter(|r| r.split_once('=').is_some_and(|(_, v)| v == typed));
                match (exact.next(), exact.next()) {
                    (Some(one), None) => Identifier::parse(one).ok(),
                    _ => None,
                }
            };
            match (lookup.with_state.as_slice(), parsed) {
                ([(only, _)], _) => {
                    let from = (only.to_string() != typed).then(|| typed.to_owned());
                    (only.clone(), from, lookup)
                }
                ([], Some(id)) => (id, None, lookup),
                ([], None) if let Some(id) = recent_one() => (id, Some(typed.to_owned()), lookup),
                _ => {
                    return Ok(Inspection {
                        identifier: typed.to_owned(),
                        at_ms: now_ms(),
                        error: lookup.with_state.is_empty().then(|| {
                            format!(
                                "nothing with the value “{typed}” has state now; \
                                 write it as dimension=value, such as user={typed}"
                            )
                        }),
                        candidates: lookup
                            .with_state
                            .into_iter()
                            .map(|(id, p)| (id.to_string(), p))
                            .collect(),
                        recent: lookup.recent,
                        typed: Some(typed.to_owned()),
                        ..Inspection::default()
                    });
                }
            }
        };
        let mut inspection = self.inspect(&id).await?;
        inspection.typed = resolved_from;
        inspection.recent = lookup.recent;
        for companion in self.companions(&id).await?.into_iter().take(MAX_COMPANIONS) {
            inspection.companions.push(self.inspect(&companion).await?);
        }
        Ok(inspection)
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
        let target = ResetTarget {
            identifier: id.to_string(),
            policy: policy.map(str::to_owned),
            rule: rule.map(str::to_owned),
        };
        self.reset_identifiers(actor, &[target], reason).await
    }

    /// Resets several identifiers at once (one the inspector shows, and those checked
    /// together with it), as one change to undo. Every target is checked before any is
    /// reset: a wrong one resets nothing.
    pub async fn reset_identifiers(
        &self,
        actor: &Actor,
        targets: &[ResetTarget],
        reason: &str,
    ) -> Result<ResetDone, ResetError> {
        let mut plans = Vec::with_capacity(targets.len());
        for target in targets {
            // As given: a value's spaces are part of it (`user=bob ` is not bob).
            let id =
                Identifier::parse(&target.identifier).map_err(|message| ResetError::Invalid {
                    field: "id",
                    message,
                })?;
            let rule = reset_rule(target.policy.as_deref(), target.rule.as_deref())?;
            let all = self.resettable_policies(actor, &id).await?;
            chosen_policies(&all, target.policy.as_deref(), rule.as_ref())?;
            plans.push((id, rule, all));
        }
        let token = crate::support::ids::random_hex::<16>();
        // The record first: a reset that fails halfway (Redis) can still be undone.
        let record = ResetRecord {
            targets: targets.to_vec(),
        };
        let record = serde_json::to_string(&record).expect("a record serialises");
        self.store
            .put_reset_record(&token, &record, UNDO_FOR)
            .await?;
        let mut done = ResetDone {
            policies: Vec::new(),
            deleted_keys: 0,
            undo: None,
        };
        for ((id, rule, all), target) in plans.iter().zip(targets) {
            let policy = target.policy.as_deref();
            let chosen = chosen_policies(all, policy, rule.as_ref())?;
            // The stash outlives the record a little: the record decides whether an undo
            // may still happen, and finds its stash there.
            let keep = UNDO_FOR + std::time::Duration::from_secs(5);
            let deleted_keys = self
                .store
                .reset_identifier(&chosen, id, rule.as_ref(), policy.is_none(), (&token, keep))
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
            done.deleted_keys += deleted_keys;
            for p in policies {
                if !done.policies.contains(&p) {
                    done.policies.push(p);
                }
            }
        }
        if done.deleted_keys > 0 {
            done.undo = Some(UndoOffer {
                token,
                until_ms: now_ms() + UNDO_FOR.as_millis() as i64,
            });
        }
        Ok(done)
    }

    /// Puts back the counters of the reset `token` names, as they were (each with the time
    /// it had left), within [`UNDO_FOR`] of it and once. Writes the audit record.
    pub async fn undo_reset(&self, actor: &Actor, token: &str) -> Result<UndoDone, ResetError> {
        let token = token.trim();
        if token.is_empty() || token.len() > 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ResetError::Invalid {
                field: "token",
                message: "is not a reset's undo token".into(),
            });
        }
        let Some(record) = self.store.reset_record(token).await? else {
            return Err(ResetError::NothingToUndo);
        };
        let record: ResetRecord =
            serde_json::from_str(&record).map_err(|_| ResetError::NothingToUndo)?;
        // Who may not reset an identifier may not put its counters back either.
        let mut plans = Vec::with_capacity(record.targets.len());
        for target in &record.targets {
            let Ok(id) = Identifier::parse(&target.identifier) else {
                continue;
            };
            let rule = reset_rule(target.policy.as_deref(), target.rule.as_deref())?;
            let all = self.resettable_policies(actor, &id).await?;
            plans.push((id, rule, all, target.policy.as_deref()));
        }
        // Taken once: of two undos at the same time, one puts the counters back.
        if self.store.take_reset_record(token).await?.is_none() {
            return Err(ResetError::NothingToUndo);
        }
        let mut done = UndoDone {
            identifiers: Vec::new(),
            restored_keys: 0,
        };
        for (id, rule, all, policy) in &plans {
            // A policy deleted since the reset has no counters to come back to.
            let chosen = chosen_policies(all, *policy, rule.as_ref()).unwrap_or_default();
            let restored = self
                .store
                .undo_reset(&chosen, id, rule.as_ref(), token)
                .await?;
            let _ = actor
                .record(
                    &self.store,
                    Change {
                        action: "identifier.reset.undo",
                        target: &id.to_string(),
                        after: serde_json::json!({ "restored_keys": restored }).to_string(),
                        reason: "undo of a reset",
                        ..Change::default()
                    },
                )
                .await;
            done.identifiers.push(id.to_string());
            done.restored_keys += restored;
        }
        Ok(done)
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

/// What a lookup of what a person typed found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The identifiers it may mean that have state now: (identifier, policies with state).
    pub with_state: Vec<(Identifier, Vec<String>)>,
    /// Identifiers from the last two hours' traffic whose text contains it, most checked
    /// first (at most 20).
    pub recent: Vec<String>,
}

/// Companions the inspector reads the state of, at most.
const MAX_COMPANIONS: usize = 4;

/// Most identifiers a lookup tries, whatever the number of dimensions in use.
const LOOKUP_CANDIDATES: usize = 32;

impl Service {
    /// What `typed` may mean: `bob` as `user=bob`, `ip=bob`… (every dimension a policy
    /// names or recent traffic used), `path=/x` as the Envoy descriptor `envoy=path=/x`;
    /// those with state now, and recent identifiers that contain the text.
    pub async fn lookup(&self, typed: &str) -> Result<Lookup, StoreError> {
        let typed = typed.trim();
        let policies = self.policies.all();
        let recent = self.recent_identifiers().await?;
        let mut dimensions: Vec<String> = Vec::new();
        let mut add = |d: &str| {
            if !dimensions.iter().any(|x| x == d) {
                dimensions.push(d.to_owned());
            }
        };
        for p in &policies {
            for r in p.all_rules() {
                for d in r.dimensions.iter().flatten() {
                    add(d.as_str());
                }
            }
            for o in &p.overrides {
                add(o.dimension.as_str());
            }
        }
        for id in &recent {
            if let Some((d, _)) = id.split_once('=') {
                add(d);
            }
        }
        let mut candidates: Vec<Identifier> = Vec::new();
        if let Ok(id) = Identifier::parse(typed) {
            candidates.push(id);
        }
        if policies.iter().any(|p| p.envoy.is_some())
            && let Ok(id) = Identifier::parse(&format!("envoy={typed}"))
        {
            candidates.push(id);
        }
        for d in &dimensions {
            if let Ok(id) = Identifier::parse(&format!("{d}={typed}"))
                && !candidates.contains(&id)
            {
                candidates.push(id);
            }
        }
        candidates.truncate(LOOKUP_CANDIDATES);
        let mut with_state = Vec::new();
        for id in candidates {
            let held = self.policies_with_state(&id).await?;
            if !held.is_empty() {
                with_state.push((id, held));
            }
        }
        let needle = typed.to_lowercase();
        let recent = recent
            .into_iter()
            .filter(|id| !needle.is_empty() && id.to_lowercase().contains(&needle))
            .take(20)
            .collect();
        Ok(Lookup { with_state, recent })
    }

    /// The policies where `id` has state now (one pipelined read of its keys' TTLs).
    async fn policies_with_state(&self, id: &Identifier) -> Result<Vec<String>, StoreError> {
        let now_ms = now_ms();
        let mut out = Vec::new();
        for policy in self.policies.all() {
            let RulesFor::Rules(rules) = policy.rules_for(id, now_ms) else {
                continue;
            };
            let entries: Vec<CheckEntry<'_>> = rules
                .iter()
                .filter(|r| r.applies_to(id.dimension().as_str()))
                .map(|rule| CheckEntry::new(rule, id))
                .collect();
            if entries.is_empty() {
                continue;
            }
            let ttls = self.store.rule_ttls(&policy.name, &entries).await?;
            if ttls.iter().any(|t| *t != -2) {
                out.push(policy.name.to_string());
            }
        }
        Ok(out)
    }

    /// The identifiers of the last two hours' lists of the most checked and most denied,
    /// most first.
    async fn recent_identifiers(&self) -> Result<Vec<String>, StoreError> {
        use crate::domain::history::{self, ALL, Step, TopKind};
        let now = now_ms();
        let hour = Step::Hour.period_of(now);
        let mut out: Vec<String> = Vec::new();
        for kind in [TopKind::Denied, TopKind::Checked] {
            let top = self
                .store
                .history_top(ALL, kind, Step::Hour, hour - 1..=hour, 200)
                .await?;
            for (member, _) in top {
                let (_, id) = history::split_member(&member);
                if !out.iter().any(|o| o == id) {
                    out.push(id.to_owned());
                }
            }
        }
        Ok(out)
    }

    /// The identifiers `id` was checked together with in the last hour.
    pub async fn companions(&self, id: &Identifier) -> Result<Vec<Identifier>, StoreError> {
        Ok(self
            .store
            .companions(&id.to_string())
            .await?
            .iter()
            .filter_map(|c| Identifier::parse(c).ok())
            .collect())
    }
}
