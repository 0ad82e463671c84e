//! Resetting an identifier (everywhere, in one policy, or one rule) with its audit record,
//! and undoing a reset within its minute.

use super::*;

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

impl ResetTarget {
    /// In words: "demo › per-minute on ip=203.0.113.11", "everything of user=bob".
    pub fn words(&self) -> String {
        match (&self.policy, &self.rule) {
            (Some(p), Some(r)) => format!("{p} › {r} on {}", self.identifier),
            (Some(p), None) => format!("{p} on {}", self.identifier),
            _ => format!("everything of {}", self.identifier),
        }
    }
}

impl Service {
    /// What to reset to let `typed` through, decided now (the inspector's first choice, taken
    /// when the button is pressed, not when the page loaded): the rule that denies it or one
    /// it is checked with right now; else the one that denied them last in the last five
    /// minutes; else everything of the identifier.
    pub async fn what_denies(&self, typed: &str) -> Result<ResetTarget, StoreError> {
        use crate::domain::inspection::Verdict;
        let inspection = self.inspect_typed(typed).await;
        if let Verdict::Blocked {
            policy,
            rule,
            identifier,
            ..
        } = inspection.verdict()
            && rule != "override"
        {
            return Ok(ResetTarget {
                identifier,
                policy: Some(policy),
                rule: Some(rule),
            });
        }
        let of: Vec<(String, String)> = std::iter::once(&inspection)
            .chain(&inspection.companions)
            .flat_map(|x| {
                x.policies
                    .iter()
                    .map(|p| (p.policy.clone(), x.identifier.clone()))
            })
            .collect();
        let latest = self
            .store
            .denial_details(&of, 5)
            .await?
            .into_iter()
            .filter(|t| t.rule.as_deref().is_some_and(|r| r != "override"))
            .max_by_key(|t| t.last_ms);
        Ok(match latest {
            Some(t) => ResetTarget {
                identifier: t.identifier,
                policy: Some(t.policy),
                rule: t.rule,
            },
            None => ResetTarget {
                identifier: inspection.identifier,
                policy: None,
                rule: None,
            },
        })
    }
}

/// What an undo needs of a reset, kept beside it for [`UNDO_FOR`].
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ResetRecord {
    targets: Vec<ResetTarget>,
}

/// Resets and their undo.
impl Service {
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
            // This instance forgets at once; others on the pub/sub message. Its streaks
            // end: freed is not "blocked over time".
            self.denials
                .invalidate(policy.is_some().then_some(policies.as_slice()), id);
            self.store.end_streaks(&policies, &id.to_string()).await?;
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
    pub(super) async fn resettable_policies(
        &self,
        actor: &Actor,
        id: &Identifier,
    ) -> Result<Vec<Policy>, ResetError> {
        let mut all = self.store.list_policies().await?;
        if crate::service::signin::is_login_dimension(id.dimension().as_str()) {
            if actor.role != "admin" {
                return Err(ResetError::Forbidden(
                    "id: the sign-in limits guard every account; only an admin resets them",
                ));
            }
            all.push(crate::service::signin::login_policy());
        }
        Ok(all)
    }
}

/// The rule a reset names, parsed; a rule needs its policy.
pub(super) fn reset_rule(
    policy: Option<&str>,
    rule: Option<&str>,
) -> Result<Option<Name>, ResetError> {
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
pub(super) fn chosen_policies<'a>(
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
