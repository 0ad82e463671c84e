//! Envoy domains as files: one saved from the admin API or the dashboard, a set loaded from
//! files or a folder (ownership and sizes checked), the domains' version recorded, and
//! how a domain counts.

use serde_json::json;

use super::*;

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
                        record: old.record,
                        record_checks: old.record_checks,
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
        let files = crate::service::envoy::domain_files(text).map_err(invalid)?;
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
/// What `spillway policy validate` and a domains folder read. A domain in two files is
/// refused, unless `merge` (upstream's `MERGE_DOMAIN_CONFIG`): then the later files'
/// top-level descriptors are added to the first's, and a top-level key (and value) both
/// hold is refused as upstream refuses it.
pub fn read_envoy_files(files: &[(String, String)], merge: bool) -> Result<Vec<Policy>, String> {
    // Each domain's document and where it was read ("file" or "file: document N").
    let mut documents: Vec<(serde_json::Value, String)> = Vec::new();
    for (file, text) in files {
        let values =
            crate::service::envoy::domain_files(text).map_err(|e| format!("{file}: {e}"))?;
        let several = values.len() > 1;
        for (i, value) in values.into_iter().enumerate() {
            let at = if several {
                format!("{file}: document {}", i + 1)
            } else {
                file.clone()
            };
            let same = |(doc, _): &&mut (serde_json::Value, String)| {
                doc.get("domain").is_some() && doc.get("domain") == value.get("domain")
            };
            match documents.iter_mut().find(|d| same(d)) {
                // The domain's place names every file merged into it (`a.yaml + b.yaml`),
                // its descriptors numbered in that order.
                Some((first, place)) if merge => {
                    merge_descriptors(first, value);
                    place.push_str(&format!(" + {at}"));
                }
                _ => documents.push((value, at)),
            }
        }
    }
    let mut policies: Vec<(Policy, &str)> = Vec::new();
    for (value, place) in &documents {
        let at = |message: String| format!("{place}: {message}");
        let domain = crate::domain::envoy::EnvoyDomain::from_value(value)
            .map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
        let policy = Policy::from_envoy(domain, crate::domain::FailureMode::default())
            .map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
        if let Some((_, first)) = policies.iter().find(|(p, _)| p.name == policy.name) {
            return Err(at(format!(
                "domain: {} is also in {first}; each domain comes from one file \
                 (MERGE_DOMAIN_CONFIG=true adds a file's descriptors to the domain's)",
                policy.name
            )));
        }
        policies.push((policy, place.as_str()));
    }
    Ok(policies.into_iter().map(|(p, _)| p).collect())
}

/// Adds `more`'s top-level descriptors to `first`'s (the domain's parser then refuses a key
/// and value the two both hold).
fn merge_descriptors(first: &mut serde_json::Value, more: serde_json::Value) {
    let Some(added) = more.get("descriptors").and_then(|d| d.as_array()).cloned() else {
        return;
    };
    match first.get_mut("descriptors").and_then(|d| d.as_array_mut()) {
        Some(list) => list.extend(added),
        None => first["descriptors"] = serde_json::Value::Array(added),
    }
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
        let policies = read_envoy_files(files, self.envoy_merge_domains).map_err(|message| {
            ChangeError::Invalid {
                field: "file".into(),
                message,
            }
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

/// What an imported `policy` keeps of the stored one it replaces (`old`): a domain keeps its
/// failure mode, overrides and (unless the file says) counting; a plain policy may not replace a domain, nor a domain a plain
/// policy.
pub(super) fn keep_domain_settings(
    policy: &mut Policy,
    old: Option<Policy>,
) -> Result<(), ChangeError> {
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
            policy.record = old.record;
            policy.record_checks = old.record_checks;
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
