//! "What would this do?" in the editor: the draft as typed, replayed over the policy's
//! recorded checks of the last hour (`service::record`), before anything is saved.

use leptos::prelude::*;

use super::*;
#[cfg(feature = "ssr")]
use crate::domain::people::Action;

/// How far back the editor's replay looks.
pub const WHAT_IF_LAST_MS: i64 = 60 * 60 * 1000;

/// The draft `draft` (a [`super::super::Draft`] as JSON, as the page's address carries it)
/// of policy `name`, replayed over its last hour of recorded checks.
#[server(prefix = "/fn", endpoint = "policy_what_if")]
pub async fn policy_what_if(
    name: String,
    draft: String,
) -> Result<crate::domain::whatif::WhatIf, AppError> {
    let caller = crate::app::guard::require(Action::EditPolicies)?;
    let typed: super::super::Draft = serde_json::from_str(&draft)
        .map_err(|e| AppError::bad_input("draft", format!("is not a draft of the editor: {e}")))?;
    let policy = draft_policy(&name, &typed)?;
    let name = policy.name.clone();
    state()
        .service()
        .what_if_policy(
            &caller.actor(),
            &name,
            crate::service::record::Candidate::Rules(policy),
            WHAT_IF_LAST_MS,
        )
        .await
        .map_err(what_if_refused)
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
