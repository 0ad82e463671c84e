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
        mut policy: Policy,
        expected: Option<u64>,
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
        // An Envoy domain is changed through its file: a plain policy (or another domain's)
        // saved over it would drop its descriptors, and Envoy's requests would pass
        // unlimited. And a domain lives under the policy name it maps to, or no request
        // finds it.
        let domain_of = |p: &Policy| p.envoy.as_ref().map(|t| t.doc.domain.clone());
        if let Some(domain) = before.as_ref().and_then(domain_of)
            && domain_of(&policy).as_ref() != Some(&domain)
        {
            return Err(ChangeError::Taken {
                field: "name".into(),
                message: format!(
                    "{} is the Envoy domain {domain:?}; change it through /api/v1/envoy/domains/{domain}",
                    policy.name
                ),
            });
        }
        if let Some(domain) = domain_of(&policy)
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
        let saved = match self.store.save_policy(&policy, expected).await {
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
                let saved = Policy { version, ..policy };
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
                expected: expected.unwrap_or_default(),
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
            let was = before.as_ref().map_or(0, |p| p.version);
            for _ in 0..60 {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let Ok(stored) = service.store.get_policy(&policy.name).await else {
                    continue;
                };
                let landed = stored
                    .as_ref()
                    .filter(|s| s.version > was && s.document() == policy.document());
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
                if stored.is_some_and(|s| s.version > was) {
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
        expected: Option<u64>,
    ) -> Result<Policy, ChangeError> {
        let before = self.store.get_policy_for_change(&policy.name).await?;
        policy
            .refuse_dead_overrides(before.as_ref())
            .map_err(|e| ChangeError::Invalid {
                field: e.field,
                message: e.message,
            })?;
        self.save_policy(actor, policy, expected, "policy.save", "")
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
        Ok(self
            .save_policy(actor, next, Some(current.version), action, reason)
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
    /// Loads an Envoy domain's file as its policy's next version (audited as
    /// `envoy.domain.save`), only if the stored one is still `expected` when given. The policy keeps its failure mode unless `failure_mode` is
    /// given (a new one fails open). Refused when the name is held by a policy that is not
    /// this domain's.
    pub async fn save_envoy_domain(
        &self,
        actor: &Actor,
        mut domain: crate::domain::envoy::EnvoyDomain,
        (failure_mode, counting): (Option<crate::domain::FailureMode>, Option<Option<Counting>>),
        expected: Option<u64>,
    ) -> Result<Policy, ChangeError> {
        let keep_counting = counting.is_none() && domain.counting.is_none();
        if let Some(counting) = counting {
            domain.counting = counting;
        }
        let wanted = domain.doc.domain.clone();
        let policy = Policy::from_envoy(domain, failure_mode.unwrap_or_default()).map_err(|e| {
            ChangeError::Invalid {
                field: e.field,
                message: e.message,
            }
        })?;
        let before = self.store.get_policy_for_change(&policy.name).await?;
        let policy = match &before {
            None => policy,
            Some(old) => match &old.envoy {
                Some(tree) if tree.doc.domain == wanted => {
                    // A file says nothing of these: the domain keeps them.
                    let mut policy = Policy {
                        failure_mode: failure_mode.unwrap_or(old.failure_mode),
                        overrides: old.overrides.clone(),
                        on_deny: old.on_deny,
                        max_wait_ms: old.max_wait_ms,
                        ..policy
                    };
                    // A file that does not say how it counts keeps the domain's setting.
                    if keep_counting && let Some(domain) = &mut policy.envoy {
                        domain.counting = tree.counting;
                    }
                    policy
                }
                Some(tree) => {
                    return Err(ChangeError::Taken {
                        field: "domain".into(),
                        message: format!(
                            "its policy name {} is held by the domain {:?}",
                            policy.name, tree.doc.domain
                        ),
                    });
                }
                None => {
                    return Err(ChangeError::Taken {
                        field: "domain".into(),
                        message: format!(
                            "a policy named {} exists and is not an Envoy domain",
                            policy.name
                        ),
                    });
                }
            },
        };
        let expected = expected.or(before.as_ref().map(|p| p.version));
        self.save_policy(actor, policy, expected, "envoy.domain.save", "")
            .await
    }
}

impl Service {
    /// Loads one or several Envoy domain files from `text` (YAML, upstream's format;
    /// several as documents separated by `---`), all or none: a new domain fails open, one
    /// that exists keeps its failure mode, overrides and counting. Names the domains loaded.
    pub async fn load_envoy_files(
        &self,
        actor: &Actor,
        text: &str,
    ) -> Result<Vec<String>, ChangeError> {
        let invalid = |message: String| ChangeError::Invalid {
            field: "file".into(),
            message,
        };
        let files = super::envoy::domain_files(text).map_err(invalid)?;
        let several = files.len() > 1;
        let mut policies = Vec::with_capacity(files.len());
        for (i, value) in files.iter().enumerate() {
            let at = |message: String| {
                if several {
                    invalid(format!("document {}: {message}", i + 1))
                } else {
                    invalid(message)
                }
            };
            let domain = crate::domain::envoy::EnvoyDomain::from_value(value)
                .map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
            let policy = Policy::from_envoy(domain, crate::domain::FailureMode::default())
                .map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
            if policies.iter().any(|p: &Policy| p.name == policy.name) {
                return Err(at(format!(
                    "the domain {} is in the text twice",
                    policy.name
                )));
            }
            policies.push(policy);
        }
        let names = policies.iter().map(|p| p.name.to_string()).collect();
        self.import_policies(actor, policies).await?;
        Ok(names)
    }
}

/// The Envoy domains of a set of files (name and text; a file may hold several domains as
/// YAML documents), each validated, all or none: the error names the file and the field.
/// What `spillway policy validate` and a domains folder read.
pub fn read_envoy_files(files: &[(String, String)]) -> Result<Vec<Policy>, String> {
    let mut policies: Vec<(Policy, &str)> = Vec::new();
    for (file, text) in files {
        let values = super::envoy::domain_files(text).map_err(|e| format!("{file}: {e}"))?;
        let several = values.len() > 1;
        for (i, value) in values.iter().enumerate() {
            let at = |message: String| {
                if several {
                    format!("{file}: document {}: {message}", i + 1)
                } else {
                    format!("{file}: {message}")
                }
            };
            let domain = crate::domain::envoy::EnvoyDomain::from_value(value)
                .map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
            let policy = Policy::from_envoy(domain, crate::domain::FailureMode::default())
                .map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
            if let Some((_, first)) = policies.iter().find(|(p, _)| p.name == policy.name) {
                return Err(at(format!(
                    "domain: {} is also in {first}; each domain comes from one file",
                    policy.name
                )));
            }
            policies.push((policy, file));
        }
    }
    Ok(policies.into_iter().map(|(p, _)| p).collect())
}

impl Service {
    /// Keeps the domains of `files` loaded (see [`read_envoy_files`]), all or none, as
    /// managed by `source` (their file changes only there): writes only the domains whose
    /// stored version differs, so every instance reading the same files converges on one
    /// version each. A domain `source` kept before and `files` no longer hold is deleted.
    /// Returns the names written, and `-name` for each deleted.
    pub async fn sync_envoy_files(
        &self,
        actor: &Actor,
        source: &str,
        files: &[(String, String)],
    ) -> Result<Vec<String>, ChangeError> {
        let policies = read_envoy_files(files).map_err(|message| ChangeError::Invalid {
            field: "file".into(),
            message,
        })?;
        let kept: Vec<Name> = policies.iter().map(|p| p.name.clone()).collect();
        let mut changed = Vec::new();
        for mut policy in policies {
            let old = self.store.get_policy(&policy.name).await?;
            // A source keeps only the domains it created: one made through the API or the
            // dashboard, or kept by another source, is not taken (its history and settings
            // would change hands silently, and removing the file would delete it).
            if let Some(old) = &old
                && old.managed_by.as_deref() != Some(source)
            {
                let holder = old
                    .managed_by
                    .as_deref()
                    .unwrap_or("the API (made through the API or the dashboard)");
                return Err(ChangeError::Taken {
                    field: "domain".into(),
                    message: format!(
                        "{} is held by {holder}; {source} does not take a domain it did not \
                         create. To hand it over, delete it where it is held (its history \
                         stays) and this source creates it on its next reading",
                        policy.name
                    ),
                });
            }
            policy.settle_strict(old.as_ref());
            policy.managed_by = Some(source.to_owned());
            let stored = old
                .as_ref()
                .map(|o| (o.envoy.clone(), o.managed_by.clone()));
            keep_domain_settings(&mut policy, old)?;
            if stored != Some((policy.envoy.clone(), policy.managed_by.clone())) {
                changed.push(policy);
            }
        }
        let mut names: Vec<String> = changed.iter().map(|p| p.name.to_string()).collect();
        if !changed.is_empty() {
            self.import_policies(actor, changed).await?;
        }
        // The set is the whole set: a domain the source kept before and holds no more goes.
        for gone in self.store.list_policies().await? {
            if gone.managed_by.as_deref() == Some(source) && !kept.contains(&gone.name) {
                // Another instance reading the same set may have deleted it already.
                self.remove_policy(actor, &gone.name, Some(&gone)).await?;
                names.push(format!("-{}", gone.name));
            }
        }
        Ok(names)
    }
}

impl Service {
    /// Records that version `version` of the domains `source` keeps arrived here: taken
    /// (`Ok`, the domains it wrote) or refused (`Err`, why); audited as `domains.version`
    /// or `domains.version.refused` with the source as target.
    pub async fn record_domains_version(
        &self,
        actor: &Actor,
        source: &str,
        version: &str,
        outcome: Result<&[String], &str>,
    ) {
        let (action, after) = match outcome {
            Ok(written) => (
                "domains.version",
                json!({ "version": version, "written": written }),
            ),
            Err(problem) => (
                "domains.version.refused",
                json!({ "version": version, "problem": problem }),
            ),
        };
        let _ = actor
            .record(
                &self.store,
                Change {
                    action,
                    target: source,
                    after: after.to_string(),
                    ..Change::default()
                },
            )
            .await;
    }
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

/// What an imported `policy` keeps of the stored one it replaces (`old`): a domain keeps its
/// failure mode, overrides and (unless the file says) counting; a plain policy may not replace a domain, nor a domain a plain
/// policy.
fn keep_domain_settings(policy: &mut Policy, old: Option<Policy>) -> Result<(), ChangeError> {
    let taken = |message: String| ChangeError::Taken {
        field: "domain".into(),
        message,
    };
    match (&policy.envoy, old) {
        (None, Some(old)) => match old.envoy {
            Some(tree) => Err(ChangeError::Taken {
                field: "policy".into(),
                message: format!(
                    "{} is the Envoy domain {:?}; import its domain file instead",
                    policy.name, tree.doc.domain
                ),
            }),
            None => Ok(()),
        },
        (Some(_), Some(old)) if old.envoy.is_none() => Err(taken(format!(
            "a policy named {} exists and is not an Envoy domain",
            policy.name
        ))),
        (Some(_), Some(old)) => {
            policy.failure_mode = old.failure_mode;
            policy.overrides = old.overrides;
            // A file that does not say how it counts keeps the domain's setting.
            if let (Some(domain), Some(was)) = (&mut policy.envoy, &old.envoy)
                && domain.counting.is_none()
            {
                domain.counting = was.counting;
            }
            Ok(())
        }
        (_, None) => Ok(()),
    }
}

impl Service {
    /// How `policy`, an Envoy domain, counts a request over its limit: as it says, or as
    /// this server does by default (`None` for a policy that is no domain).
    pub fn envoy_counting(&self, policy: &Policy) -> Option<Counting> {
        let domain = policy.envoy.as_ref()?;
        Some(domain.counting.unwrap_or(self.policies.envoy_counting()))
    }

    /// How an Envoy domain that does not say counts on this server
    /// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    pub fn envoy_counting_default(&self) -> Counting {
        self.policies.envoy_counting()
    }
}
