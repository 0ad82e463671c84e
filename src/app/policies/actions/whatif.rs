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
    let policy = super::draft_policy(&name, &typed)?;
    let name = policy.name.clone();
    state()
        .service()
        .what_if_policy(&caller.actor(), &name, Some(policy), WHAT_IF_LAST_MS)
        .await
        .map_err(|e| match e {
            crate::service::record::WhatIfError::Unavailable(e) => unavailable(e),
            e => AppError::bad_input("name", e.to_string()),
        })
}
