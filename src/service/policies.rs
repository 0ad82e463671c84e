//! Changing policies: saving a new version (optimistically, against the version the editor
//! started from), deleting one, each with its audit record and this instance's cache
//! refreshed before the answer (the others follow by pub/sub); and the demo policy a first
//! start creates. The admin API, the dashboard and the command line all change policies here.

use serde_json::{Value, json};

use super::Service;
use crate::{
    domain::{Name, Policy, envoy::Counting},
    service::audit::{Actor, Change},
    store::{Saved, Store, StoreError},
};

mod envoy_files;
use envoy_files::keep_domain_settings;
pub use envoy_files::read_envoy_files;

/// Why a policy change did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// Someone else saved a version since the one the change was made against.
    #[error("{name} changed since version {expected}; read it again")]
    Conflict { name: String, expected: u64 },
    #[error("policy: no policy named {0:?}")]
    UnknownPolicy(String),
    /// The name is held by a policy the change may not replace.
    #[error("{field}: {message}")]
    Taken { field: String, message: String },
    /// The change itself is not valid: a reserved name, an Envoy domain under a policy name
    /// it does not map to, or an override a document adds that could never apply.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

/// The refusal of a change to a domain that `source` keeps.
fn managed(name: &Name, source: &str) -> ChangeError {
    ChangeError::Taken {
        field: "managed_by".into(),
        message: format!("{name} is managed by {source}: change its file there"),
    }
}

/// An Envoy domain is changed through its file: a plain policy (or another domain's) saved
/// over it would drop its descriptors, and Envoy's requests would pass unlimited. And a
/// domain lives under the policy name it maps to, or no request finds it.
fn refuse_domain_change(policy: &Policy, before: Option<&Policy>) -> Result<(), ChangeError> {
    let domain_of = |p: &Policy| p.envoy.as_ref().map(|t| t.doc.domain.clone());
    if let Some(domain) = before.and_then(domain_of)
        && domain_of(policy).as_ref() != Some(&domain)
    {
        return Err(ChangeError::Taken {
            field: "name".into(),
            message: format!(
                "{} is the Envoy domain {domain:?}; change it through /api/v1/envoy/domains/{domain}",
                policy.name
            ),
        });
    }
    if let Some(domain) = domain_of(policy)
        && crate::domain::envoy::policy_name(&domain).ok().as_ref() != Some(&policy.name)
    {
        return Err(ChangeError::Invalid {
            field: "envoy.domain".into(),
            message: format!(
                "{domain:?} is not the domain of a policy named {}",
                policy.name
            ),
        });
    }
    Ok(())
}

/// How a save writes: a new version (refused unless the stored one is still the expected
/// version, and its overrides' count within it when given), or the overrides in place
/// (refused unless the stored one is still at this version and overrides' count).
#[derive(Clone, Copy)]
enum Write {
    Version(Option<(u64, Option<u64>)>),
    Overrides((u64, u64)),
}

/// A policy as the API shows it and the audit log keeps it: its document with name and
/// version.
pub fn view(policy: &Policy) -> Value {
    let mut doc = policy.document();
    doc["name"] = json!(policy.name);
    doc["version"] = json!(policy.version);
    doc
}

impl Service {
    /// Saves `policy` as a new version (only if the stored one is still `expected`, when
    /// given), refreshes the cache, and records `action` with the documents before and after.
    pub async fn save_policy(
        &self,
        actor: &Actor,
        policy: Policy,
        expected: Option<u64>,
        action: &str,
        reason: &str,
    ) -> Result<Policy, ChangeError> {
        let write = Write::Version(expected.map(|v| (v, None)));
        self.write_policy(actor, policy, write, action, reason)
            .await
    }

    /// Saves `policy` as `write` says: a new version, or its overrides in place.
    async fn write_policy(
        &self,
        actor: &Actor,
        mut policy: Policy,
        write: Write,
        action: &str,
        reason: &str,
    ) -> Result<Policy, ChangeError> {
        let before = self.store.get_policy_for_change(&policy.name).await?;
        policy.settle_strict(before.as_ref());
        if let Some(source) = before.as_ref().and_then(|b| b.managed_by.clone()) {
            // Its failure mode and overrides are the admin's; its file is its source's.
            let file = |p: &Policy| p.envoy.as_ref().map(|t| t.doc.clone());
            if before.as_ref().and_then(file) != file(&policy) {
                return Err(managed(&policy.name, &source));
            }
            policy.managed_by = Some(source);
        }
        refuse_domain_change(&policy, before.as_ref())?;
        let stored = match write {
            Write::Version(expected) => self.store.save_policy_at(&policy, expected).await,
            Write::Overrides(expected) => self.store.save_overrides(&policy, expected).await,
        };
        let saved = match stored {
            Err(error) if error.is_timeout() => {
                // The write may still land (Redis ran it after the answer's time ran out):
                // audited once it is known to have.
                self.audit_if_landed(actor, &policy, before.as_ref(), action, reason);
                return Err(ChangeError::Unavailable(error));
            }
            other => other?,
        };
        match saved {
            Saved::Version(version) => {
                let overrides_rev = match write {
                    Write::Overrides((_, rev)) => rev + 1,
                    Write::Version(_) => 0,
                };
                let saved = Policy {
                    version,
                    overrides_rev,
                    ..policy
                };
                self.refresh_policies().await;
                let _ = actor
                    .record(
                        &self.store,
                        Change {
                            action,
                            target: saved.name.as_str(),
                            before: before
                                .as_ref()
                                .map_or(String::new(), |p| view(p).to_string()),
                            after: view(&saved).to_string(),
                            reason,
                        },
                    )
                    .await;
                Ok(saved)
            }
            Saved::Conflict => Err(ChangeError::Conflict {
                name: policy.name.to_string(),
                expected: match write {
                    Write::Version(e) => e.map_or(0, |(v, _)| v),
                    Write::Overrides((v, _)) => v,
                },
            }),
        }
    }

    /// After a save whose answer timed out: watches for a minute whether it landed (the
    /// stored policy moved past `before` and holds `policy`'s document) and, if so, records
    /// it as the save would have, saying the answer was lost; the cache follows too.
    fn audit_if_landed(
        &self,
        actor: &Actor,
        policy: &Policy,
        before: Option<&Policy>,
        action: &str,
        reason: &str,
    ) {
        let (service, actor, policy) = (self.clone(), actor.clone(), policy.clone());
        let before = before.cloned();
        let (action, reason) = (action.to_owned(), reason.to_owned());
        tokio::spawn(async move {
            let was = before.as_ref().map_or((0, 0), Policy::revision);
            for _ in 0..60 {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let Ok(stored) = service.store.get_policy(&policy.name).await else {
                    continue;
                };
                let landed = stored
                    .as_ref()
                    .filter(|s| s.revision() > was && s.document() == policy.document());
                if let Some(saved) = landed {
                    service.refresh_policies().await;
                    let reason = format!(
                        "{reason}{}(saved after its answer timed out)",
                        if reason.is_empty() { "" } else { " " }
                    );
                    let _ = actor
                        .record(
                            &service.store,
                            Change {
                                action: &action,
                                target: saved.name.as_str(),
                                before: before
                                    .as_ref()
                                    .map_or(String::new(), |p| view(p).to_string()),
                                after: view(saved).to_string(),
                                reason: &reason,
                            },
                        )
                        .await;
                    return;
                }
                if stored.is_some_and(|s| s.revision() > was) {
                    return; // another write came; this one did not land
                }
            }
        });
    }

    /// Saves a policy document its editor wrote whole (the admin API's PUT) as `save_policy`
    /// does, first refusing overrides it adds that could never apply
    /// ([`Policy::refuse_dead_overrides`]). Not for what restores a document that was stored
    /// (a rollback, an import) or keeps the stored overrides (the dashboard's editor, an
    /// Envoy file): those save what they held.
    pub async fn save_policy_document(
        &self,
        actor: &Actor,
        policy: Policy,
        expected: Option<(u64, Option<u64>)>,
    ) -> Result<Policy, ChangeError> {
        let before = self.store.get_policy_for_change(&policy.name).await?;
        policy
            .refuse_dead_overrides(before.as_ref())
            .map_err(|e| ChangeError::Invalid {
                field: e.field,
                message: e.message,
            })?;
        self.write_policy(actor, policy, Write::Version(expected), "policy.save", "")
            .await
    }

    /// Reads `name`, applies `edit`, and saves the result as the next version (refused if
    /// someone saved meanwhile). `edit` may refuse with its own error.
    pub async fn change_policy<E: From<ChangeError>>(
        &self,
        actor: &Actor,
        name: &Name,
        action: &str,
        reason: &str,
        edit: impl FnOnce(&Policy) -> Result<Policy, E>,
    ) -> Result<Policy, E> {
        let current = self
            .store
            .get_policy_for_change(name)
            .await
            .map_err(ChangeError::from)?
            .ok_or_else(|| ChangeError::UnknownPolicy(name.to_string()))?;
        let next = edit(&current)?;
        // An override is not a new version of the rules: written in place, audited apart.
        let write = if action.starts_with("override.") {
            Write::Overrides(current.revision())
        } else {
            Write::Version(Some((current.version, None)))
        };
        Ok(self
            .write_policy(actor, next, write, action, reason)
            .await?)
    }

    /// Deletes `name` (its history stays), refreshes the cache and records it.
    pub async fn delete_policy(&self, actor: &Actor, name: &Name) -> Result<(), ChangeError> {
        let before = self.store.get_policy_for_change(name).await?;
        if let Some(source) = before.as_ref().and_then(|b| b.managed_by.as_deref()) {
            return Err(managed(name, source));
        }
        if !self.remove_policy(actor, name, before.as_ref()).await? {
            return Err(ChangeError::UnknownPolicy(name.to_string()));
        }
        Ok(())
    }

    /// Deletes `name`, refreshes the cache and records it with its last version `before`:
    /// whether there was a policy to delete.
    async fn remove_policy(
        &self,
        actor: &Actor,
        name: &Name,
        before: Option<&Policy>,
    ) -> Result<bool, ChangeError> {
        if !self.store.delete_policy(name).await? {
            return Ok(false);
        }
        // A policy made again under the name starts a record of its own.
        if let Err(error) = self.store.forget_record(name.as_str()).await {
            tracing::warn!(%error, policy = %name, "could not drop a deleted policy's recorded checks");
        }
        self.refresh_policies().await;
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "policy.delete",
                    target: name.as_str(),
                    before: before.map_or(String::new(), |p| view(p).to_string()),
                    ..Change::default()
                },
            )
            .await;
        Ok(true)
    }

    /// This instance applies a change before answering; others follow by pub/sub.
    async fn refresh_policies(&self) {
        if let Err(error) = self.policies.reload(&self.store).await {
            tracing::warn!(%error, "policy saved, but reloading the cache failed; the refresher will retry");
        }
    }
}

/// The policy a first start creates: 10 per second per IP and per user, 120 per minute,
/// bursts of 20.
pub fn demo_policy() -> Policy {
    let doc = json!({
        "description": "Demo: 10 per second per IP and per user, 120 per minute, bursts of 20",
        "mode": "enforce",
        "failure_mode": "open",
        "strict": true,
        "rules": [
            {"name": "per-second", "algorithm": "fixed_window", "limit": 10, "window_ms": 1000, "dimensions": ["ip", "user"]},
            {"name": "per-minute", "algorithm": "sliding_window", "limit": 120, "window_ms": 60000},
            {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 5, "refill_period_ms": 1000}
        ]
    });
    Policy::from_document("demo", &doc).expect("the demo policy is valid")
}

/// Creates the demo policy unless it exists or existed (a deleted demo stays deleted).
pub async fn seed_demo_policy(store: &Store) -> Result<(), StoreError> {
    let demo = demo_policy();
    if store.get_policy(&demo.name).await?.is_none()
        && store.policy_history(&demo.name, 1).await?.is_empty()
    {
        store.save_policy(&demo, Some(0)).await?;
    }
    Ok(())
}

impl Service {
    /// Brings back policy `name` as it was when it was last deleted (the delete's audit
    /// record keeps it), as a new policy; audited as `policy.restore`. Refused when a policy
    /// of that name exists again, or no delete of it is in the newest records.
    pub async fn restore_policy(&self, actor: &Actor, name: &Name) -> Result<Policy, ChangeError> {
        let deletes = crate::domain::people::AuditFilter {
            action: "policy.delete".into(),
            ..Default::default()
        };
        let records = self.store.read_audit(&deletes, 500, None).await?;
        let before = records
            .iter()
            .find(|e| e.target == name.as_str() && !e.before.is_empty())
            .map(|e| e.before.clone())
            .ok_or_else(|| ChangeError::UnknownPolicy(name.to_string()))?;
        let doc: Value = serde_json::from_str(&before).map_err(|e| ChangeError::Invalid {
            field: "name".into(),
            message: format!("its last version could not be read: {e}"),
        })?;
        let mut policy =
            Policy::from_document(name.as_str(), &doc).map_err(|e| ChangeError::Invalid {
                field: e.field,
                message: e.message,
            })?;
        // As it was: a policy deleted before there was the choice was lenient.
        policy.strict.get_or_insert(false);
        self.save_policy(actor, policy, Some(0), "policy.restore", "")
            .await
    }
}

impl Service {
    /// Every stored policy, read from Redis (not this instance's cache).
    pub async fn stored_policies(&self) -> Result<Vec<Policy>, StoreError> {
        self.store.list_policies().await
    }

    /// The stored policy `name`, read from Redis.
    pub async fn stored_policy(&self, name: &Name) -> Result<Option<Policy>, StoreError> {
        self.store.get_policy(name).await
    }

    /// The last `limit` versions of policy `name`, newest first.
    pub async fn policy_versions(
        &self,
        name: &Name,
        limit: usize,
    ) -> Result<Vec<Policy>, StoreError> {
        self.store.policy_history(name, limit).await
    }

    /// Policy `name`'s stored `version` (among its last 100) as a rollback restores it:
    /// lenient when it was saved before there was the choice. A rollback keeps the overrides
    /// in force (they are not part of the versions). `None`: no such version.
    pub async fn version_to_restore(
        &self,
        name: &Name,
        version: u64,
    ) -> Result<Option<Policy>, StoreError> {
        let old = self
            .policy_versions(name, 100)
            .await?
            .into_iter()
            .find(|p| p.version == version);
        Ok(old.map(|mut old| {
            old.strict.get_or_insert(false);
            old
        }))
    }

    /// Writes `policies` at once, each as its next version, and records the import. An Envoy
    /// domain replaces only its own policy, keeping its failure mode and overrides; a plain
    /// policy never replaces a domain (Envoy's requests would pass unlimited). Returns how many
    /// were written.
    pub async fn import_policies(
        &self,
        actor: &Actor,
        mut policies: Vec<Policy>,
    ) -> Result<usize, ChangeError> {
        for policy in policies.iter_mut() {
            let old = self.store.get_policy(&policy.name).await?;
            // A managed domain's file changes only through its source; an import that
            // holds the same file keeps it managed.
            if let Some(old) = &old
                && let Some(source) = &old.managed_by
                && policy.managed_by.as_ref() != Some(source)
            {
                let file = |p: &Policy| p.envoy.as_ref().map(|t| t.doc.clone());
                if file(old) != file(policy) {
                    return Err(managed(&policy.name, source));
                }
                policy.managed_by = Some(source.clone());
            }
            policy.settle_strict(old.as_ref());
            keep_domain_settings(policy, old)?;
        }
        let written = self.store.import_policies(&policies).await?;
        let names: Vec<String> = policies.iter().map(|p| p.name.to_string()).collect();
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "policy.import",
                    target: &names.join(","),
                    after: json!({ "policies": names }).to_string(),
                    ..Default::default()
                },
            )
            .await;
        Ok(written)
    }
}
