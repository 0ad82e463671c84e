//! The policies page's server functions: list, read, save, roll back, delete, and the
//! overrides. Each checks the caller's role, then calls the service.

use leptos::prelude::*;

use crate::app::error::AppError;

#[cfg(feature = "ssr")]
use super::{EnvoyCountingView, OverrideRow, VersionRow, document_of, rule_form};
use super::{PolicySummary, PolicyView, RuleForm};
#[cfg(feature = "ssr")]
use crate::domain::people::Action;

mod overrides;
pub use overrides::*;
mod whatif;
pub use whatif::*;

#[cfg(feature = "ssr")]
fn state() -> crate::state::AppState {
    expect_context::<crate::state::AppState>()
}

#[cfg(feature = "ssr")]
fn unavailable(e: impl std::fmt::Display) -> AppError {
    AppError::unavailable("policies page", e)
}

/// A policy change the service refused, as the page shows it (beside its field).
#[cfg(feature = "ssr")]
fn change_refused(e: crate::service::policies::ChangeError) -> AppError {
    use crate::service::policies::ChangeError;
    match e {
        ChangeError::Conflict { .. } => AppError::bad_input(
            "version",
            "someone else changed this policy since you opened it; reload and try again",
        ),
        ChangeError::UnknownPolicy(_) => AppError::bad_input("name", "no such policy"),
        ChangeError::Taken { field, message } | ChangeError::Invalid { field, message } => {
            AppError::bad_input(&field, message)
        }
        ChangeError::Unavailable(e) => unavailable(e),
    }
}

/// A page's error while changing a policy: the service's refusal or the edit's own.
#[cfg(feature = "ssr")]
struct PageError(AppError);

#[cfg(feature = "ssr")]
impl From<crate::service::policies::ChangeError> for PageError {
    fn from(e: crate::service::policies::ChangeError) -> Self {
        PageError(change_refused(e))
    }
}

#[server(prefix = "/fn", endpoint = "policies")]
pub async fn list_policies() -> Result<Vec<PolicySummary>, AppError> {
    crate::app::guard::require(Action::View)?;
    let service = state().service().clone();
    let policies = service.stored_policies().await.map_err(unavailable)?;
    // Traffic and last change help find one among many; the list works without them.
    let (totals, changes) = tokio::join!(
        service.policy_totals(crate::domain::history::Range::Hour),
        service.policy_changes(500),
    );
    let totals = totals.unwrap_or_default();
    let changes = changes.unwrap_or_default();
    Ok(policies
        .into_iter()
        .map(|p| {
            let name = p.name.to_string();
            PolicySummary {
                last_hour: totals
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, c)| (c.total(), c.denied, c.unmatched)),
                changed_ms: changes.get(&name).copied(),
                envoy_domain: p.envoy.as_ref().map(|t| t.doc.domain.clone()),
                managed_by: p.managed_by.clone(),
                description: p.description.clone(),
                shadow: p.mode == crate::domain::Mode::Shadow,
                rules: p.rules.len(),
                overrides: p.overrides.len(),
                version: p.version,
                name,
            }
        })
        .collect())
}

/// A page of the policy list: those matching `q` (name, description or domain), busy ones
/// first, `POLICIES_PER_PAGE` a page.
#[server(prefix = "/fn", endpoint = "policies_page")]
pub async fn policies_page(
    #[server(default)] q: String,
    #[server(default)] page: usize,
) -> Result<super::PoliciesPageData, AppError> {
    crate::app::guard::require(Action::View)?;
    let all = list_policies().await?;
    let total = all.len();
    let needle = q.trim().to_lowercase();
    let mut matching: Vec<PolicySummary> = all
        .into_iter()
        .filter(|p| {
            needle.is_empty()
                || p.name.to_lowercase().contains(&needle)
                || p.description.to_lowercase().contains(&needle)
                || p.envoy_domain
                    .as_ref()
                    .is_some_and(|d| d.to_lowercase().contains(&needle))
        })
        .collect();
    // Busy first: what someone came to look at is more often what is being checked.
    matching.sort_by_key(|p| p.last_hour.is_none_or(|(n, _, _)| n == 0));
    let per = super::POLICIES_PER_PAGE;
    let pages = matching.len().div_ceil(per).max(1);
    let page = page.clamp(1, pages);
    let count = matching.len();
    Ok(super::PoliciesPageData {
        policies: matching
            .into_iter()
            .skip((page - 1) * per)
            .take(per)
            .collect(),
        total,
        matching: count,
        page,
        pages,
    })
}

/// Each previous version of `policy` (`history`, newest first) with the change the version
/// after it made, as the lines its document lost and gained.
#[cfg(feature = "ssr")]
fn version_rows(
    policy: &crate::domain::Policy,
    history: &[crate::domain::Policy],
) -> Vec<VersionRow> {
    let pretty =
        |p: &crate::domain::Policy| serde_json::to_string_pretty(&p.document()).unwrap_or_default();
    let mut newer = pretty(policy);
    let mut rows = Vec::new();
    for old in history {
        let text = pretty(old);
        let diff = similar::TextDiff::from_lines(&text, &newer)
            .iter_all_changes()
            .filter_map(|c| {
                let tag = match c.tag() {
                    similar::ChangeTag::Delete => '-',
                    similar::ChangeTag::Insert => '+',
                    similar::ChangeTag::Equal => return None,
                };
                Some((tag, c.value().trim_end().to_owned()))
            })
            .collect();
        rows.push(VersionRow {
            version: old.version,
            diff,
        });
        newer = text;
    }
    rows
}

/// The domains folder, when one is read and its latest files are not in force: where, and
/// why (file and field).
#[server(prefix = "/fn", endpoint = "domains_folder")]
pub async fn domains_folder_problem() -> Result<Option<(String, String)>, AppError> {
    crate::app::guard::require(Action::View)?;
    Ok(state()
        .service()
        .domains_folder()
        .and_then(|f| f.problem.map(|p| (f.dir, p))))
}

/// An Envoy domain's counting: as set, as it counts, and the server's default.
#[cfg(feature = "ssr")]
fn envoy_counting(
    service: &crate::service::Service,
    policy: &crate::domain::Policy,
) -> Option<EnvoyCountingView> {
    policy.envoy.as_ref().map(|t| EnvoyCountingView {
        set: t.counting.map(|c| c.as_str().to_owned()),
        counts: service
            .envoy_counting(policy)
            .map_or_else(String::new, |c| c.as_str().to_owned()),
        server_default: service.envoy_counting_default().as_str().to_owned(),
    })
}

#[server(prefix = "/fn", endpoint = "policy")]
pub async fn policy_detail(#[server(default)] name: String) -> Result<PolicyView, AppError> {
    use crate::domain::Name;
    crate::app::guard::require(Action::View)?;
    let name = Name::parse(name.trim()).map_err(|m| AppError::bad_input("name", m))?;
    let service = state().service().clone();
    let Some(policy) = service.stored_policy(&name).await.map_err(unavailable)? else {
        return Ok(PolicyView {
            name: name.to_string(),
            rules: vec![RuleForm {
                algorithm: "fixed_window".into(),
                ..RuleForm::default()
            }],
            ..PolicyView::default()
        });
    };
    let history = service
        .policy_versions(&name, 20)
        .await
        .map_err(unavailable)?;
    let rows = version_rows(&policy, &history);
    let (unused, envoy_unmatched) = service.what_nothing_counted(&policy).await;
    let doc = policy.document();
    // What a change would touch; the page works without it when the counters cannot be read.
    let (last_minute, totals) = tokio::join!(
        service.policy_last_minute(name.as_str()),
        service.policy_totals(crate::domain::history::Range::Hour),
    );
    let last_hour = totals.ok().map(|totals| {
        totals
            .iter()
            .find(|(n, _)| n == name.as_str())
            .map_or((0, 0, 0), |(_, c)| (c.total(), c.denied, c.unmatched))
    });
    Ok(PolicyView {
        name: name.to_string(),
        exists: true,
        version: policy.version,
        description: policy.description.clone(),
        shadow: policy.mode == crate::domain::Mode::Shadow,
        failure_closed: policy.failure_mode == crate::domain::FailureMode::Closed,
        strict: policy.is_strict(),
        optional: (policy.optional.iter())
            .map(crate::domain::Name::as_str)
            .collect::<Vec<_>>()
            .join(", "),
        wait: policy.on_deny == crate::domain::policy::OnDeny::Wait,
        max_wait_ms: policy
            .max_wait_ms
            .map_or_else(String::new, |ms| ms.to_string()),
        rules: doc["rules"]
            .as_array()
            .map(|r| r.iter().map(rule_form).collect())
            .unwrap_or_default(),
        overrides: override_rows(&policy),
        history: rows,
        last_minute: last_minute.ok(),
        last_hour,
        document: doc.to_string(),
        managed_by: policy.managed_by.clone(),
        envoy_file: policy
            .envoy
            .as_ref()
            .map(|t| serde_yaml::to_string(&t.doc).unwrap_or_default()),
        envoy_counting: envoy_counting(&service, &policy),
        unused,
        envoy_unmatched,
        envoy_wiring: policy.envoy.as_ref().map_or_else(Vec::new, |t| {
            let envoy = &state().envoy;
            crate::domain::envoy::wiring(
                &t.doc,
                envoy.grpc_addr.map(|a| a.port()),
                envoy.require_key,
            )
        }),
    })
}

pub use form_save::*;

/// The editor's save, in a module of its own: a server function takes one argument a form
/// field, more than clippy's default allows, and the lint is on code the macro writes.
mod form_save {
    #![allow(clippy::too_many_arguments)]
    #[cfg(feature = "ssr")]
    use super::{Action, keep_the_draft, save_fields};
    use super::{AppError, RuleForm};
    use leptos::prelude::*;

    /// Creates or replaces a policy; `version` is the version the form was read at (0 for a
    /// new one), so two admins cannot overwrite each other silently. One argument a form field.
    #[server(prefix = "/fn", endpoint = "policy_save")]
    pub async fn save_policy(
        #[server(default)] csrf: String,
        #[server(default)] name: String,
        #[server(default)] version: u64,
        #[server(default)] description: String,
        #[server(default)] shadow: String,
        #[server(default)] failure_closed: String,
        #[server(default)] strict: String,
        #[server(default)] optional: String,
        #[server(default)] wait: String,
        #[server(default)] max_wait_ms: String,
        #[server(default)] rules: Vec<RuleForm>,
        #[server(default)] intent: String,
    ) -> Result<u64, AppError> {
        let caller = crate::app::guard::require_change(Action::EditPolicies, &csrf)?;
        let mut typed = crate::app::policies::Draft {
            description,
            shadow: shadow == "on",
            failure_closed: failure_closed == "on",
            strict: strict == "on",
            optional,
            wait: wait == "on",
            max_wait_ms,
            rules,
            ..crate::app::policies::Draft::default()
        };
        // "What would this do?" without JavaScript: nothing is saved; back to the editor
        // with the draft, whose page replays it.
        if intent == "what-if" {
            crate::app::guard::back_from_a_form(&crate::app::policies::whatif::what_if_address(
                name.trim(),
                &typed,
            ));
            return Ok(version);
        }
        let saved = save_fields(&caller, &name, version, &typed).await;
        match &saved {
            // Without JavaScript, back to the policy as saved (the address may still carry the
            // draft of an earlier failed save).
            Ok(_) => crate::app::guard::back_from_a_form(&format!(
                "/policy?name={}",
                crate::domain::percent_encode(name.trim())
            )),
            Err(e) => {
                typed.field = e.field().unwrap_or_default().to_owned();
                typed.message = e.message();
                keep_the_draft(&name, typed);
            }
        }
        saved
    }
}

/// A form posted without JavaScript that failed goes back to the editor with what was typed
/// (`draft=`), not to the stored policy: nothing typed is lost. (With JavaScript the page
/// keeps what it sent; this leaves it alone.)
#[cfg(feature = "ssr")]
fn keep_the_draft(name: &str, draft: super::Draft) {
    crate::app::guard::back_from_a_form(&format!(
        "/policy?name={}&draft={}#edit-heading",
        crate::domain::percent_encode(name.trim()),
        draft.to_query()
    ));
}

#[cfg(feature = "ssr")]
async fn save_fields(
    caller: &crate::app::guard::Caller,
    name: &str,
    version: u64,
    typed: &super::Draft,
) -> Result<u64, AppError> {
    let mut policy = whatif::draft_policy(name, typed)?;
    let state = state();
    // Overrides are edited on their own; keep them.
    if let Some(before) = state
        .service()
        .stored_policy(&policy.name)
        .await
        .map_err(unavailable)?
    {
        if before.envoy.is_some() {
            return Err(AppError::bad_input(
                "rules",
                "this policy is an Envoy domain: its limits come from its file, edit that",
            ));
        }
        // So is what is recorded of its checks (set in its document).
        policy.overrides = before.overrides;
        policy.record = before.record;
        policy.record_checks = before.record_checks;
    }
    let saved = state
        .service()
        .save_policy(&caller.actor(), policy, Some(version), "policy.save", "")
        .await
        .map_err(change_refused)?;
    Ok(saved.version)
}

/// Loads one or several new Envoy domain files (pasted or uploaded YAML; several as
/// documents separated by `---`), all or none. Names the domains loaded.
#[server(prefix = "/fn", endpoint = "envoy_import")]
pub async fn import_envoy_files(
    #[server(default)] csrf: String,
    #[server(default)] file: String,
) -> Result<Vec<String>, AppError> {
    let caller = crate::app::guard::require_change(Action::EditPolicies, &csrf)?;
    if file.trim().is_empty() {
        let result = Err(AppError::bad_input(
            "file",
            "is empty: paste a domain file, or choose one",
        ));
        crate::app::kept::answer_form("/policies", "envoy-new", &[], &result);
        return result;
    }
    let result = state()
        .service()
        .load_envoy_files(&caller.actor(), &file)
        .await
        .map_err(change_refused);
    // Without JavaScript the page comes back with the error and what was pasted (when it
    // fits in an address), not the framework's `__err`.
    let kept = if file.len() <= MAX_KEPT_FILE {
        file.as_str()
    } else {
        ""
    };
    crate::app::kept::answer_form("/policies", "envoy-new", &[("file", kept)], &result);
    result
}

/// A pasted domain file kept in the address after a failed load, at most (bytes): longer
/// ones are asked for again.
#[cfg(feature = "ssr")]
const MAX_KEPT_FILE: usize = 6_000;

/// Loads a new version of an Envoy domain's file (YAML, envoyproxy/ratelimit's format) for
/// the policy `name`, which must still be at `version`.
#[server(prefix = "/fn", endpoint = "envoy_save")]
pub async fn save_envoy_file(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] version: u64,
    #[server(default)] file: String,
    #[server(default)] counting: String,
    #[server(default)] intent: String,
) -> Result<u64, AppError> {
    use crate::domain::envoy::Counting;
    let caller = crate::app::guard::require_change(Action::EditPolicies, &csrf)?;
    // "What would this do?" without JavaScript: nothing is saved; back to the page with
    // the file in its address (when it fits), whose page replays it.
    if intent == "what-if" {
        if file.len() > MAX_KEPT_FILE {
            return Err(AppError::bad_input(
                "file",
                format!(
                    "is too long to replay from here (over {MAX_KEPT_FILE} bytes): replay it with the API's what-if"
                ),
            ));
        }
        crate::app::guard::back_from_a_form(&crate::app::policies::whatif::file_what_if_address(
            name.trim(),
            &file,
        ));
        return Ok(version);
    }
    let domain = whatif::domain_file(&name, &file)?;
    // `default`: the server's; left out (an older form): as the domain counts now.
    let counting = match counting.trim() {
        "" => None,
        "default" => Some(None),
        raw => Some(Some(
            Counting::parse(raw).map_err(|m| AppError::bad_input("counting", m))?,
        )),
    };
    let saved = state()
        .service()
        .save_envoy_domain(&caller.actor(), domain, (None, counting), Some(version))
        .await
        .map_err(change_refused)?;
    Ok(saved.version)
}

/// Changes a stored policy through the service (read, `edit`, save as the next version,
/// audit), naming the field that is wrong.
#[cfg(feature = "ssr")]
async fn change_policy(
    caller: &crate::app::guard::Caller,
    name: &str,
    action: &str,
    reason: &str,
    edit: impl FnOnce(&crate::domain::Policy) -> Result<crate::domain::Policy, AppError>,
) -> Result<u64, AppError> {
    let name =
        crate::domain::Name::parse(name.trim()).map_err(|m| AppError::bad_input("name", m))?;
    let saved = state()
        .service()
        .change_policy(&caller.actor(), &name, action, reason, |p| {
            edit(p).map_err(PageError)
        })
        .await
        .map_err(|PageError(e)| e)?;
    Ok(saved.version)
}

/// Saves an earlier version's rules as the newest version.
#[server(prefix = "/fn", endpoint = "policy_rollback")]
pub async fn rollback_policy(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] to_version: u64,
) -> Result<u64, AppError> {
    use crate::domain::Name;
    let caller = crate::app::guard::require_change(Action::EditPolicies, &csrf)?;
    let parsed = Name::parse(name.trim()).map_err(|m| AppError::bad_input("name", m))?;
    let old = state()
        .service()
        .version_to_restore(&parsed, to_version)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| AppError::bad_input("to_version", "no such version"))?;
    let reason = format!("back to version {to_version}");
    // The overrides stay as they are now: they are not part of the versions.
    change_policy(&caller, &name, "policy.rollback", &reason, |current| {
        Ok(crate::domain::Policy {
            overrides: current.overrides.clone(),
            ..old
        })
    })
    .await
}

#[server(prefix = "/fn", endpoint = "policy_delete")]
pub async fn delete_policy(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] confirm: String,
) -> Result<(), AppError> {
    use crate::{domain::Name, service::policies::ChangeError};
    let caller = crate::app::guard::require_change(Action::EditPolicies, &csrf)?;
    let name = Name::parse(name.trim()).map_err(|m| AppError::bad_input("name", m))?;
    if confirm.trim() != name.as_str() {
        return Err(AppError::bad_input(
            "confirm",
            format!("type the policy's name, {name}, to delete it"),
        ));
    }
    match state()
        .service()
        .delete_policy(&caller.actor(), &name)
        .await
    {
        // Already gone: the page goes back to the list all the same.
        Ok(()) | Err(ChangeError::UnknownPolicy(_)) => {}
        Err(other) => return Err(change_refused(other)),
    }
    leptos_axum::redirect(&format!(
        "/policies?deleted={}",
        crate::domain::percent_encode(name.as_str())
    ));
    Ok(())
}

/// Brings a deleted policy back as it was (undo of a delete).
#[server(prefix = "/fn", endpoint = "policy_restore")]
pub async fn restore_policy(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
) -> Result<u64, AppError> {
    let caller = crate::app::guard::require_change(Action::EditPolicies, &csrf)?;
    let name =
        crate::domain::Name::parse(name.trim()).map_err(|m| AppError::bad_input("name", m))?;
    let saved = state()
        .service()
        .restore_policy(&caller.actor(), &name)
        .await
        .map_err(|e| match e {
            crate::service::policies::ChangeError::UnknownPolicy(_) => {
                AppError::bad_input("name", "no delete of it is in the recent audit log")
            }
            crate::service::policies::ChangeError::Conflict { .. } => {
                AppError::bad_input("name", "a policy of that name exists again")
            }
            other => change_refused(other),
        })?;
    leptos_axum::redirect(&format!(
        "/policy?name={}",
        crate::domain::percent_encode(name.as_str())
    ));
    Ok(saved.version)
}
