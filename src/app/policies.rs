//! Policies: the list; one policy's editor (fields per algorithm, validation messages beside
//! the fields, shadow mode), a burst preview computed with the domain model (in the browser
//! when hydrated), overrides with expiry, and the version history with diffs and rollback.
//!
//! Every form is an `ActionForm`, so it works with JavaScript off; the rules are posted as
//! `rules[i][field]`.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::{
    components::{A, Form},
    hooks::{use_params_map, use_query_map},
};
use serde::{Deserialize, Serialize};

use super::session::{CsrfField, error_message, use_session};
use crate::domain::{
    people::Action,
    preview::{BurstPreview, burst},
    rule::{ALGORITHMS, AlgorithmKind},
    time::utc_minutes,
};

/// A row of the policy list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySummary {
    pub name: String,
    pub description: String,
    pub shadow: bool,
    pub rules: usize,
    pub overrides: usize,
    pub version: u64,
}

/// One rule as the editor's fields hold it. Which fields count depends on the algorithm.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleForm {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub algorithm: String,
    #[serde(default)]
    pub limit: String,
    #[serde(default)]
    pub window_ms: String,
    #[serde(default)]
    pub bucket_ms: String,
    #[serde(default)]
    pub capacity: String,
    /// Refill (token bucket) or leak (leaky bucket) amount.
    #[serde(default)]
    pub tokens: String,
    /// Refill, leak or GCRA period.
    #[serde(default)]
    pub period_ms: String,
    #[serde(default)]
    pub rate: String,
    #[serde(default)]
    pub burst: String,
    /// Comma-separated; empty for every dimension.
    #[serde(default)]
    pub dimensions: String,
    /// "on" when checked.
    #[serde(default)]
    pub count_denied: String,
}

/// An override as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideRow {
    pub matcher: String,
    pub action: String,
    pub expires_at_ms: Option<i64>,
    pub reason: String,
}

/// One line of a diff: '+', '-' or ' ', and the text.
pub type DiffLine = (char, String);

/// A previous version and what the next version changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRow {
    pub version: u64,
    pub diff: Vec<DiffLine>,
}

/// Everything the editor shows about one policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    pub name: String,
    pub exists: bool,
    pub version: u64,
    pub description: String,
    pub shadow: bool,
    pub failure_closed: bool,
    pub rules: Vec<RuleForm>,
    pub overrides: Vec<OverrideRow>,
    pub history: Vec<VersionRow>,
    /// The policy document (JSON), for the preview.
    pub document: String,
}

impl RuleForm {
    /// The editor's input named `input` (see `domain::rule::ALGORITHMS`).
    fn input(&self, input: &str) -> &str {
        match input {
            "limit" => &self.limit,
            "window_ms" => &self.window_ms,
            "bucket_ms" => &self.bucket_ms,
            "capacity" => &self.capacity,
            "tokens" => &self.tokens,
            "period_ms" => &self.period_ms,
            "rate" => &self.rate,
            "burst" => &self.burst,
            _ => "",
        }
    }

    fn input_mut(&mut self, input: &str) -> &mut String {
        match input {
            "limit" => &mut self.limit,
            "window_ms" => &mut self.window_ms,
            "bucket_ms" => &mut self.bucket_ms,
            "capacity" => &mut self.capacity,
            "tokens" => &mut self.tokens,
            "period_ms" => &mut self.period_ms,
            "rate" => &mut self.rate,
            "burst" => &mut self.burst,
            other => unreachable!("the algorithm table names no input {other:?}"),
        }
    }
}

/// The policy document the editor's fields describe (errors are found by parsing it).
pub fn document_of(
    description: &str,
    shadow: bool,
    failure_closed: bool,
    rules: &[RuleForm],
) -> serde_json::Value {
    use serde_json::{Value, json};
    let num = |raw: &str| -> Value {
        let raw = raw.trim();
        raw.parse::<u64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.to_owned()))
    };
    let rules: Vec<Value> = rules
        .iter()
        .filter(|r| !r.name.trim().is_empty() || !r.limit.trim().is_empty())
        .map(|r| {
            let mut doc = json!({ "name": r.name.trim(), "algorithm": r.algorithm });
            if let Some(kind) = AlgorithmKind::named(&r.algorithm) {
                for p in kind.params {
                    doc[p.field] = num(r.input(p.input));
                }
            }
            let dims: Vec<&str> = r
                .dimensions
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect();
            if !dims.is_empty() {
                doc["dimensions"] = json!(dims);
            }
            if r.count_denied == "on" || r.count_denied == "true" {
                doc["count_denied"] = json!(true);
            }
            doc
        })
        .collect();
    json!({
        "description": description.trim(),
        "mode": if shadow { "shadow" } else { "enforce" },
        "failure_mode": if failure_closed { "closed" } else { "open" },
        "rules": rules,
    })
}

/// The editor's fields for a stored rule document.
pub fn rule_form(rule: &serde_json::Value) -> RuleForm {
    let s = |k: &str| match rule.get(k) {
        Some(serde_json::Value::String(v)) => v.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    let mut form = RuleForm {
        name: s("name"),
        algorithm: s("algorithm"),
        ..RuleForm::default()
    };
    if let Some(kind) = AlgorithmKind::named(&form.algorithm) {
        for p in kind.params {
            *form.input_mut(p.input) = s(p.field);
        }
    }
    RuleForm {
        dimensions: rule
            .get("dimensions")
            .and_then(|d| d.as_array())
            .map(|d| {
                d.iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default(),
        count_denied: if rule.get("count_denied") == Some(&serde_json::Value::Bool(true)) {
            "on".into()
        } else {
            String::new()
        },
        ..form
    }
}

#[cfg(feature = "ssr")]
fn state() -> crate::state::AppState {
    expect_context::<crate::state::AppState>()
}

#[cfg(feature = "ssr")]
fn unavailable(e: impl std::fmt::Display) -> ServerFnError {
    tracing::warn!(error = %e, "policies page: Redis call failed");
    crate::auth::guard::set_status(axum::http::StatusCode::SERVICE_UNAVAILABLE);
    ServerFnError::new("Redis is unavailable; try again")
}

/// A policy change the service refused, as the page shows it (beside its field).
#[cfg(feature = "ssr")]
fn change_refused(e: crate::service::policies::ChangeError) -> ServerFnError {
    use crate::service::policies::ChangeError;
    match e {
        ChangeError::Conflict { .. } => super::people::bad_input(
            "version",
            "someone else changed this policy since you opened it; reload and try again",
        ),
        ChangeError::UnknownPolicy(_) => super::people::bad_input("name", "no such policy"),
        ChangeError::Unavailable(e) => unavailable(e),
    }
}

/// A page's error while changing a policy: the service's refusal or the edit's own.
#[cfg(feature = "ssr")]
struct PageError(ServerFnError);

#[cfg(feature = "ssr")]
impl From<crate::service::policies::ChangeError> for PageError {
    fn from(e: crate::service::policies::ChangeError) -> Self {
        PageError(change_refused(e))
    }
}

#[server(prefix = "/fn", endpoint = "policies")]
pub async fn list_policies() -> Result<Vec<PolicySummary>, ServerFnError> {
    crate::auth::guard::require(Action::View)?;
    let policies = state().store.list_policies().await.map_err(unavailable)?;
    Ok(policies
        .into_iter()
        .map(|p| PolicySummary {
            name: p.name.to_string(),
            description: p.description.clone(),
            shadow: p.mode == crate::domain::Mode::Shadow,
            rules: p.rules.len(),
            overrides: p.overrides.len(),
            version: p.version,
        })
        .collect())
}

#[server(prefix = "/fn", endpoint = "policy")]
pub async fn policy_detail(#[server(default)] name: String) -> Result<PolicyView, ServerFnError> {
    use crate::{domain::Name, store::policies::document};
    crate::auth::guard::require(Action::View)?;
    let name = Name::parse(name.trim()).map_err(|m| super::people::bad_input("name", m))?;
    let store = state().store.clone();
    let Some(policy) = store.get_policy(&name).await.map_err(unavailable)? else {
        return Ok(PolicyView {
            name: name.to_string(),
            rules: vec![RuleForm {
                algorithm: "fixed_window".into(),
                ..RuleForm::default()
            }],
            ..PolicyView::default()
        });
    };
    let history = store.policy_history(&name, 20).await.map_err(unavailable)?;
    let pretty =
        |p: &crate::domain::Policy| serde_json::to_string_pretty(&document(p)).unwrap_or_default();
    // Each previous version with the change the version after it made.
    let mut newer = pretty(&policy);
    let mut rows = Vec::new();
    for old in &history {
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
    let doc = document(&policy);
    Ok(PolicyView {
        name: name.to_string(),
        exists: true,
        version: policy.version,
        description: policy.description.clone(),
        shadow: policy.mode == crate::domain::Mode::Shadow,
        failure_closed: policy.failure_mode == crate::domain::FailureMode::Closed,
        rules: doc["rules"]
            .as_array()
            .map(|r| r.iter().map(rule_form).collect())
            .unwrap_or_default(),
        overrides: policy
            .overrides
            .iter()
            .map(|o| {
                let v = serde_json::to_value(o).unwrap_or_default();
                OverrideRow {
                    matcher: v["match"].as_str().unwrap_or_default().to_owned(),
                    action: v["action"].as_str().unwrap_or_default().to_owned(),
                    expires_at_ms: o.expires_at_ms,
                    reason: o.reason.clone(),
                }
            })
            .collect(),
        history: rows,
        document: doc.to_string(),
    })
}

/// Creates or replaces a policy; `version` is the version the form was read at (0 for a
/// new one), so two admins cannot overwrite each other silently.
#[server(prefix = "/fn", endpoint = "policy_save")]
pub async fn save_policy(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] version: u64,
    #[server(default)] description: String,
    #[server(default)] shadow: String,
    #[server(default)] failure_closed: String,
    #[server(default)] rules: Vec<RuleForm>,
) -> Result<u64, ServerFnError> {
    use crate::domain::Policy;
    let caller = crate::auth::guard::require_change(Action::EditPolicies, &csrf)?;
    let doc = document_of(&description, shadow == "on", failure_closed == "on", &rules);
    let mut policy = Policy::from_document(name.trim(), &doc)
        .and_then(|p| crate::domain::policy::refuse_reserved(&p.name).map(|()| p))
        .map_err(|e| super::people::bad_input(&e.field, e.message))?;
    let state = state();
    // Overrides are edited on their own; keep them.
    if let Some(before) = state
        .store
        .get_policy(&policy.name)
        .await
        .map_err(unavailable)?
    {
        policy.overrides = before.overrides;
    }
    let saved = state
        .save_policy(&caller.actor(), policy, Some(version), "policy.save", "")
        .await
        .map_err(change_refused)?;
    Ok(saved.version)
}

/// Changes a stored policy through the service (read, `edit`, save as the next version,
/// audit), naming the field that is wrong.
#[cfg(feature = "ssr")]
async fn change_policy(
    caller: &crate::auth::guard::Caller,
    name: &str,
    action: &str,
    reason: &str,
    edit: impl FnOnce(&crate::domain::Policy) -> Result<crate::domain::Policy, ServerFnError>,
) -> Result<u64, ServerFnError> {
    let name =
        crate::domain::Name::parse(name.trim()).map_err(|m| super::people::bad_input("name", m))?;
    let saved = state()
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
) -> Result<u64, ServerFnError> {
    use super::people::bad_input;
    use crate::domain::Name;
    let caller = crate::auth::guard::require_change(Action::EditPolicies, &csrf)?;
    let parsed = Name::parse(name.trim()).map_err(|m| bad_input("name", m))?;
    let old = state()
        .store
        .policy_history(&parsed, 100)
        .await
        .map_err(unavailable)?
        .into_iter()
        .find(|p| p.version == to_version)
        .ok_or_else(|| bad_input("to_version", "no such version"))?;
    let reason = format!("back to version {to_version}");
    change_policy(&caller, &name, "policy.rollback", &reason, |_| Ok(old)).await
}

#[server(prefix = "/fn", endpoint = "policy_delete")]
pub async fn delete_policy(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
) -> Result<(), ServerFnError> {
    use crate::{domain::Name, service::policies::ChangeError};
    let caller = crate::auth::guard::require_change(Action::EditPolicies, &csrf)?;
    let name = Name::parse(name.trim()).map_err(|m| super::people::bad_input("name", m))?;
    match state().delete_policy(&caller.actor(), &name).await {
        // Already gone: the page goes back to the list all the same.
        Ok(()) | Err(ChangeError::UnknownPolicy(_)) => {}
        Err(other) => return Err(change_refused(other)),
    }
    leptos_axum::redirect("/policies");
    Ok(())
}

/// Adds an override (support may): `matcher` such as `user=vip-*`, an action, and an expiry
/// in minutes (0 = never).
#[server(prefix = "/fn", endpoint = "override_add")]
pub async fn add_override(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] matcher: String,
    #[server(default)] action: String,
    #[server(default)] expires_minutes: String,
    #[server(default)] reason: String,
) -> Result<(), ServerFnError> {
    use crate::domain::overrides::Override;
    let caller = crate::auth::guard::require_change(Action::ManageOverrides, &csrf)?;
    // Ten years at most: anything larger would overflow the expiry time (and is "never").
    const MAX_MINUTES: u64 = 10 * 366 * 24 * 60;
    let minutes: u64 = match expires_minutes.trim() {
        "" => 0,
        raw => raw
            .parse()
            .ok()
            .filter(|m| *m <= MAX_MINUTES)
            .ok_or_else(|| {
                super::people::bad_input(
                    "expires_minutes",
                    format!("must be a whole number of minutes from 0 (never) to {MAX_MINUTES}"),
                )
            })?,
    };
    let mut doc =
        serde_json::json!({ "match": matcher.trim(), "action": action, "reason": reason.trim() });
    if minutes > 0 {
        doc["expires_at_ms"] =
            serde_json::json!(crate::auth::keys::now_ms() + (minutes as i64) * 60_000);
    }
    let added = Override::from_document(&doc, "override")
        .map_err(|e| super::people::bad_input(&e.field, e.message))?;
    change_policy(&caller, &name, "override.add", reason.trim(), |current| {
        if current.overrides.len() >= crate::domain::overrides::MAX_OVERRIDES {
            return Err(super::people::bad_input(
                "matcher",
                "this policy has the most overrides allowed",
            ));
        }
        let mut next = current.clone();
        next.overrides.push(added);
        Ok(next)
    })
    .await
    .map(|_| ())
}

#[server(prefix = "/fn", endpoint = "override_remove")]
pub async fn remove_override(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] index: usize,
) -> Result<(), ServerFnError> {
    let caller = crate::auth::guard::require_change(Action::ManageOverrides, &csrf)?;
    change_policy(&caller, &name, "override.remove", "", |current| {
        if index >= current.overrides.len() {
            return Err(super::people::bad_input("index", "no such override"));
        }
        let mut next = current.clone();
        next.overrides.remove(index);
        Ok(next)
    })
    .await
    .map(|_| ())
}

#[component]
pub fn PoliciesPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| list_policies());
    let session = use_session();
    view! {
        <Title text="Policies"/>
        <h1>"Policies"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(list) => view! {
                        {s.may(Action::EditPolicies).then(|| view! {
                            <form method="get" action="/policy" class="row card">
                                <label>"New policy name"<input name="name" required pattern="[a-z0-9][a-z0-9_\\-]{0,63}" placeholder="checkout"/></label>
                                <button type="submit">"Create"</button>
                            </form>
                        })}
                        {if list.is_empty() {
                            view! { <p class="empty">"No policies yet."</p> }.into_any()
                        } else {
                            view! {
                                <table data-testid="policies">
                                    <thead><tr><th>"Name"</th><th>"Description"</th><th>"Mode"</th><th class="num">"Rules"</th><th class="num">"Overrides"</th><th class="num">"Version"</th></tr></thead>
                                    <tbody>
                                        {list.into_iter().map(|p| view! {
                                            <tr>
                                                <td><A href=format!("/policy?name={}", p.name)>{p.name.clone()}</A></td>
                                                <td>{p.description}</td>
                                                <td>{if p.shadow { view! { <span class="badge warn">"shadow"</span> }.into_any() } else { view! { "enforce" }.into_any() }}</td>
                                                <td class="num">{p.rules}</td>
                                                <td class="num">{p.overrides}</td>
                                                <td class="num">{p.version}</td>
                                            </tr>
                                        }).collect_view()}
                                    </tbody>
                                </table>
                            }.into_any()
                        }}
                    }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// `field: message` of a failed save, split so the message can sit beside its field.
fn field_error(e: &ServerFnError) -> (String, String) {
    let m = error_message(e);
    match m.split_once(": ") {
        Some((f, rest)) if !f.contains(' ') => (f.to_owned(), rest.to_owned()),
        _ => (String::new(), m),
    }
}

#[component]
pub fn PolicyPage() -> impl IntoView {
    let query = use_query_map();
    let _ = use_params_map();
    let name = move || query.with(|q| q.get("name").unwrap_or_default());
    let save = ServerAction::<SavePolicy>::new();
    let rollback = ServerAction::<RollbackPolicy>::new();
    let add_ov = ServerAction::<AddOverride>::new();
    let remove_ov = ServerAction::<RemoveOverride>::new();
    let delete = ServerAction::<DeletePolicy>::new();
    let data = Resource::new(
        move || {
            (
                name(),
                save.version().get(),
                rollback.version().get(),
                add_ov.version().get(),
                remove_ov.version().get(),
            )
        },
        |(n, ..)| policy_detail(n),
    );
    let session = use_session();
    let save_error = move || {
        save.value()
            .get()
            .and_then(|r| r.err())
            .map(|e| field_error(&e))
    };
    let error_for = move |field: String| {
        move || {
            save_error()
                .filter(|(f, _)| *f == field)
                .map(|(_, m)| view! { <span class="field-error" role="alert">{m}</span> })
        }
    };
    let other_errors = move || {
        [
            rollback.value().get().and_then(|r| r.err()),
            add_ov.value().get().and_then(|r| r.err()),
            remove_ov.value().get().and_then(|r| r.err()),
            delete.value().get().and_then(|r| r.err()),
        ]
        .into_iter()
        .flatten()
        .map(|e| error_message(&e))
        .chain(
            save_error()
                .filter(|(f, _)| f.is_empty() || f == "version" || f == "name" || f == "body")
                .map(|(f, m)| if f.is_empty() { m } else { format!("{f}: {m}") }),
        )
        .collect::<Vec<_>>()
    };

    view! {
        <Title text="Policy"/>
        <p><A href="/policies">"← Policies"</A></p>
        {move || other_errors().into_iter().map(|e| view! { <p class="alert" role="alert">{e}</p> }).collect_view()}
        {move || save.value().get().and_then(|r| r.ok()).map(|v| view! { <p class="notice" role="status">{format!("Saved as version {v}.")}</p> })}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(p) => {
                        let can_edit = s.may(Action::EditPolicies);
                        let can_override = s.may(Action::ManageOverrides);
                        let csrf = s.csrf.clone();
                        let title = if p.exists { format!("Policy {}", p.name) } else { format!("New policy {}", p.name) };
                        let mut rows = p.rules.clone();
                        rows.push(RuleForm { algorithm: "fixed_window".into(), ..RuleForm::default() });
                        let rule_rows = rows.into_iter().enumerate().map(|(i, r)| {
                            let f = |k: &str| format!("rules[{i}][{k}]");
                            let e = |k: &str| error_for(format!("rules[{i}].{k}"));
                            let alg = r.algorithm.clone();
                            view! {
                                <fieldset class="rule" disabled=!can_edit>
                                    <legend>{if r.name.is_empty() { "Add a rule".to_owned() } else { format!("Rule {}", r.name) }}</legend>
                                    <label>"Name"<input name=f("name") value=r.name.clone() placeholder="per-second"/>{e("name")}</label>
                                    <label>"Algorithm"
                                        <select name=f("algorithm")>
                                            {ALGORITHMS.iter().map(|k| view! { <option value=k.name selected=alg == k.name>{k.label}</option> }).collect_view()}
                                        </select>{e("algorithm")}
                                    </label>
                                    <label class="f-limit">"Limit"<input name=f("limit") value=r.limit inputmode="numeric"/>{e("limit")}</label>
                                    <label class="f-window">"Window (ms)"<input name=f("window_ms") value=r.window_ms inputmode="numeric"/>{e("window_ms")}</label>
                                    <label class="f-bucket">"Bucket (ms)"<input name=f("bucket_ms") value=r.bucket_ms inputmode="numeric"/>{e("bucket_ms")}</label>
                                    <label class="f-capacity">"Capacity"<input name=f("capacity") value=r.capacity inputmode="numeric"/>{e("capacity")}</label>
                                    <label class="f-tokens">"Tokens per period"<input name=f("tokens") value=r.tokens inputmode="numeric"/>{e("refill_tokens")}{e("leak_tokens")}</label>
                                    <label class="f-period">"Period (ms)"<input name=f("period_ms") value=r.period_ms inputmode="numeric"/>{e("refill_period_ms")}{e("leak_period_ms")}{e("period_ms")}</label>
                                    <label class="f-rate">"Rate"<input name=f("rate") value=r.rate inputmode="numeric"/>{e("rate")}</label>
                                    <label class="f-burst">"Burst"<input name=f("burst") value=r.burst inputmode="numeric"/>{e("burst")}</label>
                                    <label>"Dimensions"<input name=f("dimensions") value=r.dimensions placeholder="all, or ip, user"/>{e("dimensions")}</label>
                                    <label class="check"><input type="checkbox" name=f("count_denied") checked=r.count_denied == "on"/>"Count denied requests"</label>
                                </fieldset>
                            }.into_any()
                        }).collect_view();
                        let overrides = p.overrides.iter().enumerate().map(|(i, o)| {
                            let c = csrf.clone();
                            let n = p.name.clone();
                            view! {
                                <tr>
                                    <td><code>{o.matcher.clone()}</code></td>
                                    <td>{o.action.clone()}</td>
                                    <td>{o.expires_at_ms.map_or("never".to_owned(), |t| utc_minutes(Some(t)))}</td>
                                    <td>{o.reason.clone()}</td>
                                    <td>{can_override.then(|| view! {
                                        <ActionForm action=remove_ov attr:class="inline">
                                            <CsrfField csrf=c/>
                                            <input type="hidden" name="name" value=n/>
                                            <input type="hidden" name="index" value=i.to_string()/>
                                            <button type="submit" class="small danger">"Remove"</button>
                                        </ActionForm>
                                    })}</td>
                                </tr>
                            }.into_any()
                        }).collect_view();
                        let history = p.history.clone().into_iter().map(|h| {
                            let c = csrf.clone();
                            let n = p.name.clone();
                            let version = h.version;
                            let lines = h.diff.into_iter().map(|(tag, text)| {
                                let class = if tag == '+' { "add" } else { "del" };
                                view! { <span class=class>{format!("{tag} {text}")}"\n"</span> }
                            }).collect_view();
                            view! {
                                <li>
                                    <details>
                                        <summary>{format!("Version {} → {}", version, version + 1)}</summary>
                                        <pre class="diff">{lines}</pre>
                                    </details>
                                    {can_edit.then(|| view! {
                                        <ActionForm action=rollback attr:class="inline">
                                            <CsrfField csrf=c/>
                                            <input type="hidden" name="name" value=n/>
                                            <input type="hidden" name="to_version" value=version.to_string()/>
                                            <button type="submit" class="small">{format!("Roll back to version {version}")}</button>
                                        </ActionForm>
                                    })}
                                </li>
                            }.into_any()
                        }).collect_view();
                        let (c1, c2, c3) = (csrf.clone(), csrf.clone(), csrf.clone());
                        let (n1, n2, n3) = (p.name.clone(), p.name.clone(), p.name.clone());
                        let document = p.document.clone();
                        let preview_name = p.name.clone();
                        view! {
                            <h1>{title}</h1>
                            <section class="card" aria-labelledby="edit-heading">
                                <h2 id="edit-heading">{if p.exists { format!("Version {}", p.version) } else { "Not saved yet".to_owned() }}</h2>
                                <ActionForm action=save attr:class="stack policy-form">
                                    <CsrfField csrf=c1/>
                                    <input type="hidden" name="name" value=n1/>
                                    <input type="hidden" name="version" value=p.version.to_string()/>
                                    <label>"Description"<input name="description" value=p.description.clone() disabled=!can_edit/>{error_for("description".into())}</label>
                                    <label class="check"><input type="checkbox" name="shadow" checked=p.shadow disabled=!can_edit/>"Shadow mode: report denials, let requests through"</label>
                                    <label class="check"><input type="checkbox" name="failure_closed" checked=p.failure_closed disabled=!can_edit/>"Fail closed: refuse checks while Redis is unreachable"</label>
                                    {error_for("rules".into())}
                                    {rule_rows}
                                    {can_edit.then(|| view! { <button type="submit">"Save policy"</button> })}
                                </ActionForm>
                            </section>
                            {p.exists.then(|| view! { <Preview name=preview_name document=document/> }.into_any())}
                            {p.exists.then(|| view! {
                                <section class="card" aria-labelledby="overrides-heading">
                                    <h2 id="overrides-heading">"Overrides"</h2>
                                    <table>
                                        <thead><tr><th>"Match"</th><th>"Action"</th><th>"Expires"</th><th>"Reason"</th><th></th></tr></thead>
                                        <tbody>{overrides}</tbody>
                                    </table>
                                    {can_override.then(|| view! {
                                        <ActionForm action=add_ov attr:class="row">
                                            <CsrfField csrf=c2/>
                                            <input type="hidden" name="name" value=n2/>
                                            <label>"Match"<input name="matcher" required placeholder="user=vip-*, ip=10.0.0.0/8"/></label>
                                            <label>"Action"<select name="action"><option value="unlimited">"unlimited"</option><option value="block">"block"</option></select></label>
                                            <label>"Expires in (minutes, 0 = never)"<input name="expires_minutes" inputmode="numeric" value="60"/></label>
                                            <label>"Reason"<input name="reason"/></label>
                                            <button type="submit">"Add override"</button>
                                        </ActionForm>
                                    })}
                                </section>
                                <section class="card" aria-labelledby="history-heading">
                                    <h2 id="history-heading">"History"</h2>
                                    <ul class="history-list">{history}</ul>
                                </section>
                            }.into_any())}
                            {(p.exists && can_edit).then(|| view! {
                                <ActionForm action=delete attr:class="inline">
                                    <CsrfField csrf=c3/>
                                    <input type="hidden" name="name" value=n3/>
                                    <button type="submit" class="danger">"Delete policy"</button>
                                </ActionForm>
                            }.into_any())}
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}

/// How a burst would be treated: a GET form (`burst_n`, `burst_s`), computed with the
/// domain model from the saved policy — in the browser when hydrated.
#[component]
fn Preview(name: String, document: String) -> impl IntoView {
    let query = use_query_map();
    let n = move || {
        query.with(|q| {
            q.get("burst_n")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(50)
        })
    };
    let secs = move || {
        query.with(|q| {
            q.get("burst_s")
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(1.0)
        })
    };
    let rules = serde_json::from_str::<serde_json::Value>(&document)
        .ok()
        .and_then(|d| crate::domain::Policy::from_document(&name, &d).ok())
        .map(|p| p.rules)
        .unwrap_or_default();
    let result = move || -> BurstPreview {
        let ms = (secs().clamp(0.0, 86_400.0) * 1000.0) as u64;
        burst(&rules, n(), ms)
    };
    view! {
        <section class="card" aria-labelledby="preview-heading">
            <h2 id="preview-heading">"Burst preview"</h2>
            <Form method="GET" action="" attr:class="row">
                <input type="hidden" name="name" value=name.clone()/>
                <label>"Requests"<input name="burst_n" inputmode="numeric" value=move || n().to_string() prop:value=move || n().to_string()/></label>
                <label>"Over (seconds)"<input name="burst_s" inputmode="decimal" value=move || secs().to_string() prop:value=move || secs().to_string()/></label>
                <button type="submit">"Preview"</button>
            </Form>
            {move || {
                let r = result();
                let first = r.first_denied.map_or("none is denied".to_owned(), |(k, ms)| format!("the first denial is request {k}, at {ms} ms"));
                let by_rule = r.denials_by_rule.iter().filter(|(_, d)| *d > 0).map(|(rule, d)| format!("{rule}: {d}")).collect::<Vec<_>>().join(", ");
                view! {
                    <p data-testid="preview">
                        {format!("{} requests: {} allowed, {} denied; {first}.", r.requests, r.allowed, r.denied)}
                        {(!by_rule.is_empty()).then(|| format!(" Denied by {by_rule}."))}
                    </p>
                }
            }}
        </section>
    }
}
