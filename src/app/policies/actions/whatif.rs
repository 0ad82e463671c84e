//! "What would this do?" in the editor: the draft as typed (or a domain's file, or a stored
//! version), replayed over the policy's recorded checks of the last hour or day
//! (`service::record`), with limits suggested for the draft's rules; nothing is saved.

use leptos::prelude::*;

use super::*;
#[cfg(feature = "ssr")]
use crate::domain::people::Action;

/// How far back the editor's replay can look: the last hour (unless the page asks) or day.
pub const LOOK_BACKS: [(&str, &str, i64); 2] = [
    ("hour", "The last hour", 60 * 60 * 1000),
    ("day", "The last day", 24 * 60 * 60 * 1000),
];

/// The look back `last` names (`hour`, `day`; else an hour).
pub fn look_back(last: &str) -> (&'static str, &'static str, i64) {
    LOOK_BACKS
        .into_iter()
        .find(|(key, ..)| *key == last)
        .unwrap_or(LOOK_BACKS[0])
}

/// Policy `name` replayed over its recorded checks of the `last` hour or day, as one of:
/// `draft` (a [`super::super::Draft`] as JSON, as the page's address carries it), the
/// stored `version` (what a rollback would change), or an Envoy domain's `file` as typed.
/// With a draft, suggested limits for its rules with a window, from the same record.
#[server(prefix = "/fn", endpoint = "policy_what_if")]
pub async fn policy_what_if(
    name: String,
    #[server(default)] draft: String,
    #[server(default)] version: u64,
    #[server(default)] file: String,
    #[server(default)] last: String,
) -> Result<EditorWhatIf, AppError> {
    use crate::service::record::Candidate;
    let caller = crate::app::guard::require(Action::EditPolicies)?;
    let parsed =
        crate::domain::Name::parse(name.trim()).map_err(|m| AppError::bad_input("name", m))?;
    let candidate = if version > 0 {
        Candidate::Version(version)
    } else if !file.trim().is_empty() {
        let domain = domain_file(&name, &file)?;
        Candidate::File(
            crate::domain::Policy::from_envoy(domain, Default::default())
                .map_err(|e| AppError::bad_input("file", e.message))?,
        )
    } else {
        let typed: super::super::Draft = serde_json::from_str(&draft).map_err(|e| {
            AppError::bad_input("draft", format!("is not a draft of the editor: {e}"))
        })?;
        Candidate::Rules(draft_policy(&name, &typed)?)
    };
    let last_ms = look_back(&last).2;
    let draft = match &candidate {
        Candidate::Rules(p) => Some(p.clone()),
        _ => None,
    };
    let state = state();
    let service = state.service();
    let answer = service
        .what_if_policy(&caller.actor(), &parsed, candidate, last_ms)
        .await
        .map_err(what_if_refused)?;
    let suggestions = match draft {
        None => Vec::new(),
        Some(draft) => service
            .suggest_limits_for(&parsed, draft, last_ms)
            .await
            .unwrap_or_default(),
    };
    Ok(EditorWhatIf {
        answer,
        suggestions,
    })
}

/// The editor's replay: the answer, and limits suggested for the draft's rules.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct EditorWhatIf {
    pub answer: crate::domain::whatif::WhatIf,
    pub suggestions: Vec<crate::domain::suggest::Suggestion>,
}

/// An Envoy domain's file as typed in policy `name`'s editor, or the first thing wrong.
#[cfg(feature = "ssr")]
pub(super) fn domain_file(
    name: &str,
    file: &str,
) -> Result<crate::domain::envoy::EnvoyDomain, AppError> {
    use crate::domain::envoy::{EnvoyDomain, policy_name};
    let value = crate::service::envoy::domain_yaml(file.as_bytes())
        .map_err(|e| AppError::bad_input("file", e))?;
    let domain = EnvoyDomain::from_value(&value)
        .map_err(|e| AppError::bad_input("file", format!("{}: {}", e.field, e.message)))?;
    if policy_name(&domain.doc.domain)
        .ok()
        .as_ref()
        .map(|n| n.as_str())
        != Some(name.trim())
    {
        return Err(AppError::bad_input(
            "file",
            format!(
                "domain: {:?} is not this policy's domain; load another domain with the API",
                domain.doc.domain
            ),
        ));
    }
    Ok(domain)
}

/// A replay's refusal, named as the editor's form names it.
#[cfg(feature = "ssr")]
pub(super) fn what_if_refused(e: crate::service::record::WhatIfError) -> AppError {
    use crate::service::record::WhatIfError;
    match e {
        WhatIfError::Unavailable(e) => unavailable(e),
        WhatIfError::UnknownPolicy(_) => AppError::bad_input("name", e.to_string()),
        WhatIfError::Draft(ref d) => AppError::bad_input(&d.field, e.to_string()),
        WhatIfError::Invalid { field, .. } => AppError::bad_input(field, e.to_string()),
    }
}

/// The policy the editor's fields describe, or the first field that is wrong (named as the
/// form names it).
#[cfg(feature = "ssr")]
pub(super) fn draft_policy(
    name: &str,
    typed: &super::super::Draft,
) -> Result<crate::domain::Policy, AppError> {
    let rules = typed.rules.as_slice();
    let mut doc = document_of(
        &typed.description,
        typed.shadow,
        typed.failure_closed,
        rules,
    );
    doc["strict"] = serde_json::json!(typed.strict);
    let optional: Vec<&str> = (typed.optional.split([',', ' ']))
        .filter(|d| !d.is_empty())
        .collect();
    if !optional.is_empty() {
        doc["optional"] = serde_json::json!(optional);
    }
    if typed.wait {
        doc["on_deny"] = serde_json::json!("wait");
        let raw = typed.max_wait_ms.trim();
        doc["max_wait_ms"] = raw
            .parse::<u64>()
            .map_or_else(|_| serde_json::json!(raw), serde_json::Value::from);
    }
    crate::domain::Policy::from_document(name.trim(), &doc)
        .and_then(|p| crate::domain::policy::refuse_reserved(&p.name).map(|()| p))
        .map_err(|e| AppError::bad_input(&super::super::field_in_form(&e.field, rules), e.message))
}
