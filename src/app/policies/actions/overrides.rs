//! Overrides from the policy page: adding one (block, exempt or a limit of its own),
//! removing one, and how each reads in the list.

use leptos::prelude::*;

use super::*;
#[cfg(feature = "ssr")]
use crate::domain::people::Action;

/// The policy's overrides as its page lists them.
#[cfg(feature = "ssr")]
pub(super) fn override_rows(policy: &crate::domain::Policy) -> Vec<OverrideRow> {
    policy
        .overrides
        .iter()
        .map(|o| {
            let v = serde_json::to_value(o).unwrap_or_default();
            OverrideRow {
                matcher: v["match"].as_str().unwrap_or_default().to_owned(),
                action: override_action_words(&v),
                expires_at_ms: o.expires_at_ms,
                reason: o.reason.clone(),
                limit_form: crate::app::policies::own_limit_fields(&v),
            }
        })
        .collect()
}

pub use override_add::*;

/// Adding an override, in a module of its own: a server function takes one argument a form
/// field, more than clippy's default allows, and the lint is on code the macro writes.
mod override_add {
    #![allow(clippy::too_many_arguments)]
    use super::AppError;
    #[cfg(feature = "ssr")]
    use super::{Action, change_policy, own_limit};
    use leptos::prelude::*;

    /// Adds an override (support may): `matcher` such as `user=vip-*`, an action (`unlimited`,
    /// `block`, or `limit`: `limit` requests per `window` in `window_unit`, counted apart from
    /// the policy's rules), and an expiry in minutes (0 = never).
    #[server(prefix = "/fn", endpoint = "override_add")]
    pub async fn add_override(
        #[server(default)] csrf: String,
        #[server(default)] name: String,
        #[server(default)] matcher: String,
        #[server(default)] action: String,
        #[server(default)] limit: String,
        #[server(default)] window: String,
        #[server(default)] window_unit: String,
        #[server(default)] expires_minutes: String,
        #[server(default)] reason: String,
    ) -> Result<(), AppError> {
        use crate::domain::overrides::Override;
        let caller = crate::app::guard::require_change(Action::ManageOverrides, &csrf)?;
        // Ten years at most: anything larger would overflow the expiry time (and is "never").
        const MAX_MINUTES: u64 = 10 * 366 * 24 * 60;
        let minutes: u64 = match expires_minutes.trim() {
            "" => 0,
            raw => raw
                .parse()
                .ok()
                .filter(|m| *m <= MAX_MINUTES)
                .ok_or_else(|| {
                    AppError::bad_input(
                        "expires_minutes",
                        format!(
                            "must be a whole number of minutes from 0 (never) to {MAX_MINUTES}"
                        ),
                    )
                })?,
        };
        let mut doc = serde_json::json!({ "match": matcher.trim(), "action": action, "reason": reason.trim() });
        if action == "limit" {
            doc["rules"] = serde_json::json!([own_limit(&limit, &window, &window_unit)?]);
        }
        if minutes > 0 {
            doc["expires_at_ms"] =
                serde_json::json!(crate::support::clock::now_ms() + (minutes as i64) * 60_000);
        }
        let added = Override::from_document(&doc, "override")
            .and_then(|o| o.refuse_unmatchable("override").map(|()| o))
            .map_err(|e| {
                // The rule is the form's two fields: name them, not the document's path.
                let field = match e.field.rsplit_once('.') {
                    Some((_, "limit")) if e.field.contains("rules") => "limit",
                    Some((_, "window_ms")) if e.field.contains("rules") => "window",
                    _ if e.field == "override.match" => "matcher",
                    _ => e.field.as_str(),
                };
                AppError::bad_input(field, e.message)
            })?;
        if added.loosens_broadly() && !caller.role.may(Action::EditPolicies) {
            return Err(AppError::refused(
                axum::http::StatusCode::FORBIDDEN,
                "an override that lifts or changes the limit for a wildcard, or for a network wider than an IPv4 /16 or an IPv6 /48, can turn the policy off for everyone; only an admin may add one",
            ));
        }
        change_policy(&caller, &name, "override.add", reason.trim(), |current| {
            if current.overrides.len() >= crate::domain::overrides::MAX_OVERRIDES {
                return Err(AppError::bad_input(
                    "matcher",
                    "this policy has the most overrides allowed",
                ));
            }
            current
                .refuse_shadowed(&added, "override")
                .map_err(|e| AppError::bad_input(&e.field, e.message))?;
            let mut next = current.clone();
            next.overrides.push(added);
            Ok(next)
        })
        .await?;
        crate::app::guard::back_done("override");
        Ok(())
    }
}

/// An override's action as the page lists it: `limit` with its numbers ("limit: 1000 per
/// 1 hour").
pub(crate) fn override_action_words(o: &serde_json::Value) -> String {
    let action = o["action"].as_str().unwrap_or_default();
    let Some(rules) = o["rules"].as_array().filter(|_| action == "limit") else {
        return action.to_owned();
    };
    let words: Vec<String> = rules
        .iter()
        .map(|r| {
            let f = crate::app::policies::rule_form(r);
            match f.algorithm.as_str() {
                "fixed_window" | "sliding_window" | "sliding_log" | "bucketed_window" => {
                    let unit = crate::app::policies::UNITS
                        .iter()
                        .find(|u| u.0 == f.window_unit)
                        .map_or("ms", |u| u.1);
                    let unit = if f.window_ms == "1" && unit != "ms" {
                        unit.trim_end_matches('s')
                    } else {
                        unit
                    };
                    format!("{} per {} {unit}", f.limit, f.window_ms)
                }
                other => format!("{} ({other})", f.name),
            }
        })
        .collect();
    format!("limit: {}", words.join(", "))
}

/// The rule of an override's own limit, as the form gives it: `limit` requests per `window`
/// `window_unit`, in fixed windows, under a name of its own (so it counts from a full
/// allowance, apart from the policy's rules).
#[cfg(feature = "ssr")]
pub(super) fn own_limit(
    limit: &str,
    window: &str,
    window_unit: &str,
) -> Result<serde_json::Value, AppError> {
    let limit: u64 = limit
        .trim()
        .parse()
        .map_err(|_| AppError::bad_input("limit", "must be a whole number of requests"))?;
    // The form's units: a label sent for its value, or none, is not taken as milliseconds.
    if !crate::app::policies::UNITS[1..]
        .iter()
        .any(|u| u.0 == window_unit)
    {
        return Err(AppError::bad_input(
            "window_unit",
            "must be one of s, min, h, d",
        ));
    }
    let window_ms = crate::app::policies::form::in_ms(window, window_unit);
    if !window_ms.is_u64() || window_ms == 0 {
        return Err(AppError::bad_input(
            "window",
            "must be a whole number of seconds, minutes, hours or days above 0",
        ));
    }
    Ok(serde_json::json!({
        "name": OWN_LIMIT_RULE,
        "algorithm": "fixed_window",
        "limit": limit,
        "window_ms": window_ms,
    }))
}

/// The name of the rule an override's own limit is counted under.
pub const OWN_LIMIT_RULE: &str = "own-limit";

#[server(prefix = "/fn", endpoint = "override_remove")]
pub async fn remove_override(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] index: usize,
) -> Result<(), AppError> {
    let caller = crate::app::guard::require_change(Action::ManageOverrides, &csrf)?;
    change_policy(&caller, &name, "override.remove", "", |current| {
        if index >= current.overrides.len() {
            return Err(AppError::bad_input("index", "no such override"));
        }
        let mut next = current.clone();
        next.overrides.remove(index);
        Ok(next)
    })
    .await?;
    crate::app::guard::back_done("override-removed");
    Ok(())
}

/// Extends (by `minutes` from its expiry, or from now when it has none left) or removes
/// (`change` = `remove`) the override at `index` of policy `name`, from where it acts (the
/// inspector). `matcher` is what the page showed there: a list changed meanwhile is refused
/// rather than the wrong override changed.
#[server(prefix = "/fn", endpoint = "override_change")]
pub async fn change_override(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] index: usize,
    #[server(default)] matcher: String,
    #[server(default)] change: String,
    #[server(default)] minutes: String,
) -> Result<(), AppError> {
    let caller = crate::app::guard::require_change(Action::ManageOverrides, &csrf)?;
    let extend_ms = match change.as_str() {
        "remove" => None,
        "extend" => Some(
            minutes
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|m| (1..=10_080).contains(m))
                .ok_or_else(|| {
                    AppError::bad_input("minutes", "must be a whole number of minutes, 1 to 10080")
                })?
                * 60_000,
        ),
        _ => return Err(AppError::bad_input("change", "must be extend or remove")),
    };
    let action = if extend_ms.is_some() {
        "override.extend"
    } else {
        "override.remove"
    };
    change_policy(&caller, &name, action, "", |current| {
        let shown = current.overrides.get(index).map(|o| {
            serde_json::to_value(o).unwrap_or_default()["match"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        if shown.as_deref() != Some(matcher.trim()) {
            return Err(AppError::bad_input(
                "index",
                "the policy's overrides changed since the page was read: read it again",
            ));
        }
        let mut next = current.clone();
        match extend_ms {
            None => {
                next.overrides.remove(index);
            }
            Some(ms) => {
                let o = &mut next.overrides[index];
                let Some(expires) = o.expires_at_ms else {
                    return Err(AppError::bad_input(
                        "change",
                        "it does not expire: nothing to extend",
                    ));
                };
                o.expires_at_ms = Some(expires.max(crate::support::clock::now_ms()) + ms);
            }
        }
        Ok(next)
    })
    .await?;
    crate::app::guard::back_done("override-changed");
    Ok(())
}
