//! The inspector's server functions: read an identifier's state and its recent denials,
//! reset it (one rule, one policy or everything, with a reason) and undo that, release a
//! lease.

use leptos::prelude::*;

use super::Inspection;
use crate::app::error::AppError;
#[cfg(feature = "ssr")]
use crate::domain::people::Action;

#[server(prefix = "/fn", endpoint = "inspect")]
pub async fn inspect_identifier(#[server(default)] id: String) -> Result<Inspection, AppError> {
    crate::app::guard::require(Action::View)?;
    Ok(expect_context::<crate::state::AppState>()
        .service()
        .inspect_typed(&id)
        .await)
}

/// When the identifier was throttled over the last 7 days.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Denials {
    /// The server's clock when read.
    pub now_ms: i64,
    /// (hour start ms, policy, denials), oldest first.
    pub hours: Vec<(i64, String, u64)>,
}

#[server(prefix = "/fn", endpoint = "identifier_denials")]
pub async fn identifier_denials(#[server(default)] id: String) -> Result<Denials, AppError> {
    crate::app::guard::require(Action::View)?;
    let id =
        crate::domain::Identifier::parse(id.trim()).map_err(|m| AppError::bad_input("id", m))?;
    let hours = expect_context::<crate::state::AppState>()
        .service()
        .denials_of(&id.to_string())
        .await
        .map_err(|e| AppError::unavailable("identifier history", e))?;
    Ok(Denials {
        now_ms: crate::support::clock::now_ms(),
        hours,
    })
}

/// The reason a person gave for a change to an identifier, trimmed: required, at most 500
/// characters (it goes to the audit log).
#[cfg(feature = "ssr")]
fn reason_given(reason: &str) -> Result<&str, AppError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::bad_input(
            "reason",
            "is required: say why (it goes to the audit log)",
        ));
    }
    if reason.chars().count() > 500 {
        return Err(AppError::bad_input(
            "reason",
            "must be at most 500 characters",
        ));
    }
    Ok(reason)
}

/// Resets counters. `what` (the inspector's choice) is `<scope> <identifier>`, a line
/// per identifier when several are reset together; without it, `id` and `scope`. A scope
/// is `*` (every policy), `<policy>` or `<policy>/<rule>`; an empty `scope` is every policy.
/// All of it is one change, undone together: the page comes back (`id`, else the first
/// identifier) saying how many keys went, with the undo for a minute.
#[server(prefix = "/fn", endpoint = "reset")]
pub async fn reset_identifier(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
    #[server(default)] scope: String,
    #[server(default)] what: String,
    #[server(default)] reason: String,
) -> Result<ResetAnswer, AppError> {
    use crate::service::identifiers::ResetTarget;
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let reason = reason_given(&reason)?;
    let targets = if what.trim() == NOW {
        // Decided as the button is pressed: the page may have been read seconds ago.
        vec![
            state()
                .service()
                .what_denies(id.trim())
                .await
                .map_err(|e| AppError::unavailable("reset", e))?,
        ]
    } else {
        targets_of(&scope, &id, &what)?
    };
    let done = state()
        .service()
        .reset_identifiers(&caller.actor(), &targets, reason)
        .await
        .map_err(reset_refused)?;
    let page_id = if id.trim().is_empty() {
        targets
            .first()
            .map(|t| t.identifier.clone())
            .unwrap_or_default()
    } else {
        id.trim().to_owned()
    };
    let undo = done.undo.map(|u| u.token);
    let what: Vec<String> = targets.iter().map(ResetTarget::words).collect();
    let what = what.join(", ");
    crate::app::guard::back_from_a_form(&format!(
        "/identifiers?id={}&reset={}&what={}{}",
        crate::domain::percent_encode(&page_id),
        done.deleted_keys,
        crate::domain::percent_encode(&what),
        undo.as_ref()
            .map(|t| format!("&undo={t}"))
            .unwrap_or_default()
    ));
    Ok(ResetAnswer {
        deleted: done.deleted_keys,
        undo,
        what,
    })
}

/// The reset form's choice that is decided when the button is pressed.
pub const NOW: &str = "now";

/// The targets the reset form names: `what`, a line per target (`policy/rule identifier`,
/// `policy identifier`, `* identifier`), or else `scope` and `id`.
#[cfg(feature = "ssr")]
fn targets_of(
    scope: &str,
    id: &str,
    what: &str,
) -> Result<Vec<crate::service::identifiers::ResetTarget>, AppError> {
    use crate::service::identifiers::ResetTarget;
    let pairs: Vec<(&str, &str)> = if what.trim().is_empty() {
        vec![(scope.trim(), id.trim())]
    } else {
        what.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| l.split_once(' ').unwrap_or(("*", l)))
            .collect()
    };
    if pairs.len() > 1 + MAX_RESET_TOGETHER {
        return Err(AppError::bad_input(
            "what",
            "names too many identifiers at once",
        ));
    }
    Ok(pairs
        .iter()
        .map(|(scope, id)| {
            let (policy, rule) = match scope.split_once('/') {
                Some((p, r)) => (Some(p), Some(r)),
                None if scope.is_empty() || *scope == "*" => (None, None),
                None => (Some(*scope), None),
            };
            ResetTarget {
                identifier: id.trim().to_owned(),
                policy: policy.map(str::to_owned),
                rule: rule.map(str::to_owned),
            }
        })
        .collect())
}

/// What a reset did, as the page says it: the keys deleted, and the token that undoes it
/// for a minute (when it deleted any).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResetAnswer {
    pub deleted: u64,
    pub undo: Option<String>,
    /// What was reset, in words.
    #[serde(default)]
    pub what: String,
}

/// Puts back the counters of the reset `token` names (within a minute of it, once), and
/// comes back to `id`'s page saying so.
#[server(prefix = "/fn", endpoint = "reset_undo")]
pub async fn undo_reset(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
    #[server(default)] token: String,
) -> Result<u64, AppError> {
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let done = state()
        .service()
        .undo_reset(&caller.actor(), &token)
        .await
        .map_err(reset_refused)?;
    crate::app::guard::back_from_a_form(&format!(
        "/identifiers?id={}&undone={}",
        crate::domain::percent_encode(id.trim()),
        done.restored_keys
    ));
    Ok(done.restored_keys)
}

/// Identifiers one reset may take with the inspected one (those checked together with it).
#[cfg(feature = "ssr")]
const MAX_RESET_TOGETHER: usize = 8;

#[cfg(feature = "ssr")]
fn state() -> crate::state::AppState {
    expect_context::<crate::state::AppState>()
}

/// A reset or undo refused, as the page says it.
#[cfg(feature = "ssr")]
fn reset_refused(e: crate::service::identifiers::ResetError) -> AppError {
    use crate::service::identifiers::ResetError;
    match e {
        ResetError::Invalid { field, message } => AppError::bad_input(field, message),
        ResetError::UnknownPolicy(_) => AppError::bad_input("scope", "no such policy"),
        ResetError::Forbidden(why) => AppError::refused(axum::http::StatusCode::FORBIDDEN, why),
        ResetError::NothingToUndo => AppError::bad_input(
            "token",
            "no reset to undo: a reset can be undone for a minute, once",
        ),
        ResetError::Unavailable(error) => AppError::unavailable("reset", error),
    }
}

/// Releases one lease of a concurrency rule (its holder crashed, say), with a reason for
/// the audit log. Whether it was still held.
#[server(prefix = "/fn", endpoint = "release_lease")]
pub async fn release_lease(
    #[server(default)] csrf: String,
    #[server(default)] lease: String,
    #[server(default)] reason: String,
) -> Result<bool, AppError> {
    let caller = crate::app::guard::require_change(Action::ResetIdentifier, &csrf)?;
    let state = expect_context::<crate::state::AppState>();
    let lease: crate::domain::lease::LeaseId = lease
        .trim()
        .parse()
        .map_err(|m: String| AppError::bad_input("lease", m))?;
    let reason = reason_given(&reason)?;
    let held = state
        .service()
        .release_lease_by(&caller.actor(), &lease, reason)
        .await
        .map_err(|e| AppError::unavailable("release", e))?;
    crate::app::guard::back_done(if held { "lease" } else { "lease-gone" });
    Ok(held)
}
