//! One policy's page: the editor, its overrides, its versions with diffs and rollback.

use leptos::prelude::*;

use crate::app::widgets::{ConfirmStep, CopyButton};

use crate::app::error::AppError;
use leptos_meta::Title;
use leptos_router::{
    components::A,
    hooks::{use_params_map, use_query_map},
};

use super::preview::*;
use super::whatif::{WhatIfButton, WhatIfCard};
use super::words::*;
use super::{
    AddOverride, DeletePolicy, Draft, RemoveOverride, RollbackPolicy, RuleForm, SaveEnvoyFile,
    SavePolicy, UNITS, policy_detail, rule_form,
};
use crate::{
    app::session::{CsrfField, error_message, use_session},
    domain::{calendar::Period, people::Action, rule::ALGORITHMS, time::utc_minutes},
};

/// The fields of an override's own limit (`limit` requests per `window` `window_unit`),
/// shown by the stylesheet only while that action is chosen in an `.override-form`: filled
/// as the last own limit saved (`last`: limit, window, unit), and saying what it replaces.
#[component]
pub fn OwnLimitFields(
    #[prop(optional_no_strip)] last: Option<(String, String, String)>,
    /// The policy's rules it would replace, in words (none: not said).
    #[prop(optional)]
    replaces: Vec<String>,
) -> impl IntoView {
    let (limit, window, unit) = last.unwrap_or_else(|| (String::new(), "1".into(), "h".into()));
    let replaces = (!replaces.is_empty()).then(|| {
        view! {
            <p class="muted small limit-only" data-testid="own-limit-replaces">
                "A limit of its own is counted in place of the policy's rules, not beside them: "
                {replaces.join("; ")}
                ". To keep those and allow more, raise the policy's limits instead."
            </p>
        }
    });
    view! {
        <label class="limit-only">"Requests"<input name="limit" inputmode="numeric" size="6" placeholder="1000" value=limit/></label>
        <label class="limit-only">"per"<input name="window" inputmode="numeric" size="4" value=window/></label>
        <label class="limit-only">"Unit"<select name="window_unit">
            {UNITS.iter().skip(1).map(|(u, l, _)| view! { <option value=*u selected=*u == unit>{*l}</option> }).collect_view()}
        </select></label>
        {replaces}
    }
}

/// An override document's own limit as the form's fields (limit, window, unit), if it has one.
pub fn own_limit_fields(document: &serde_json::Value) -> Option<(String, String, String)> {
    let rule = document["rules"].as_array()?.first()?;
    let f = rule_form(rule);
    (!f.limit.is_empty()).then_some((f.limit, f.window_ms, f.window_unit))
}

/// A policy's rules in words, as an own limit would replace them: "per-second: 10 per 1
/// seconds".
pub fn rules_replaced(policy: &str, rules: &[RuleForm]) -> String {
    let words: Vec<String> = rules
        .iter()
        .map(|f| {
            let unit = UNITS
                .iter()
                .find(|u| u.0 == f.window_unit)
                .map_or("", |u| u.1);
            if f.window_ms.is_empty() {
                format!("{} ({})", f.name, f.algorithm)
            } else {
                format!("{} ({} per {} {unit})", f.name, f.limit, f.window_ms)
            }
        })
        .collect();
    format!("in {policy} it replaces {}", words.join(", "))
}

/// The field a failed save names (empty for none) and its message, to sit beside the field.
fn field_error(e: &AppError) -> (String, String) {
    (e.field().unwrap_or_default().to_owned(), e.message())
}

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn PolicyPage() -> impl IntoView {
    let query = use_query_map();
    let _ = use_params_map();
    let name = move || query.with(|q| q.get("name").unwrap_or_default());
    let save = ServerAction::<SavePolicy>::new();
    let save_envoy = ServerAction::<SaveEnvoyFile>::new();
    let rollback = ServerAction::<RollbackPolicy>::new();
    let add_ov = ServerAction::<AddOverride>::new();
    let (ov_added, ov_removed) = (
        crate::app::kept::use_done("override"),
        crate::app::kept::use_done("override-removed"),
    );
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
                save_envoy.version().get(),
            )
        },
        |(n, ..)| policy_detail(n),
    );
    let session = use_session();
    // What was typed, kept when a save fails: with JavaScript the page holds what it sent;
    // without, the server sends the form back in the address (`draft=`).
    let sent = RwSignal::new(None::<Draft>);
    Effect::new(move |_| {
        if let Some(input) = save.input().get() {
            sent.set(Some(Draft {
                description: input.description,
                shadow: input.shadow == "on",
                failure_closed: input.failure_closed == "on",
                strict: input.strict == "on",
                optional: input.optional,
                wait: input.wait == "on",
                max_wait_ms: input.max_wait_ms,
                rules: input.rules,
                ..Draft::default()
            }));
        }
    });
    let location = leptos_router::hooks::use_location();
    let draft = move || -> Option<Draft> {
        match save.value().get() {
            Some(Err(e)) => sent.get().map(|d| {
                let (field, message) = field_error(&e);
                Draft {
                    field,
                    message,
                    ..d
                }
            }),
            Some(Ok(_)) => None,
            None => location.search.with(|s| Draft::from_search(s)),
        }
    };
    let save_error = move || {
        draft()
            .filter(|d| !d.message.is_empty())
            .map(|d| (d.field, d.message))
    };
    // The rules as typed so far (hydrated: read from the form at each change), for the
    // burst preview before saving.
    let draft_rules = RwSignal::new(None::<Result<Vec<crate::domain::Rule>, String>>);
    let read_draft = move |ev: leptos::ev::Event| {
        #[cfg(feature = "hydrate")]
        if let Some(pairs) = form_pairs(&ev) {
            let name = query.with_untracked(|q| q.get("name").unwrap_or_default());
            let forms =
                super::rule_forms_from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            draft_rules.set(Some(rules_of(&name, &forms)));
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = (&ev, draft_rules);
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
            save_envoy.value().get().and_then(|r| r.err()),
        ]
        .into_iter()
        .flatten()
        .map(|e| error_message(&e))
        .collect::<Vec<_>>()
    };
    // A failed save, said at the top under the field's label; what was typed stays below.
    let save_summary = move || {
        draft().filter(|d| !d.message.is_empty()).map(|d| {
            let label = field_label(&d.field, &d.rules);
            view! {
                <div class="alert" role="alert" data-testid="save-error">
                    <strong>"Not saved. "</strong>
                    {if label.is_empty() { d.message.clone() } else { format!("{label}: {}", d.message) }}
                    " What you typed is kept below; correct it and save again."
                </div>
            }
        })
    };

    view! {
        <Title text="Policy"/>
        <p><A href="/policies">"← Policies"</A></p>
        {move || other_errors().into_iter().map(|e| view! { <p class="alert" role="alert">{e}</p> }).collect_view()}
        {save_summary}
        {move || save.value().get().and_then(|r| r.ok()).or_else(|| save_envoy.value().get().and_then(|r| r.ok())).map(|v| view! { <p class="notice" role="status">{format!("Saved as version {v}.")}</p> })}
        {move || rollback.value().get().and_then(|r| r.ok()).map(|v| view! { <p class="notice" role="status">{format!("Rolled back: saved as version {v}.")}</p> })}
        // Hydrated, from the action's answer; without JavaScript, from the address it came
        // back to (`done=`).
        {move || (matches!(add_ov.value().get(), Some(Ok(()))) || (add_ov.value().with(Option::is_none) && ov_added.get())).then(|| view! { <p class="notice" role="status">"Override added."</p> })}
        {move || (matches!(remove_ov.value().get(), Some(Ok(()))) || (remove_ov.value().with(Option::is_none) && ov_removed.get())).then(|| view! { <p class="notice" role="status">"Override removed."</p> })}
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
                        let kept = draft();
                        let (description, shadow, failure_closed, strict) = match &kept {
                            Some(d) => (d.description.clone(), d.shadow, d.failure_closed, d.strict),
                            None => (p.description.clone(), p.shadow, p.failure_closed, p.strict || !p.exists),
                        };
                        let (wait, max_wait_ms, optional) = match &kept {
                            Some(d) => (d.wait, d.max_wait_ms.clone(), d.optional.clone()),
                            None => (p.wait, p.max_wait_ms.clone(), p.optional.clone()),
                        };
                        let mut rows = kept.map_or_else(|| p.rules.clone(), |d| d.rules);
                        // Two blank slots: a policy of two rules is saved whole, not half-built
                        // first (blank slots are left out when saving).
                        if rows.iter().all(RuleForm::kept) {
                            for _ in 0..2 {
                                rows.push(RuleForm { algorithm: "fixed_window".into(), ..RuleForm::default() });
                            }
                        }
                        let first_blank = rows.iter().position(|r| r.name.is_empty() && r.limit.is_empty());
                        let rule_rows = rows.into_iter().enumerate().map(|(i, r)| {
                            let f = |k: &str| format!("rules[{i}][{k}]");
                            let e = |k: &str| error_for(format!("rules[{i}].{k}"));
                            let alg = r.algorithm.clone();
                            let unit = |name: String, chosen: String, label: &'static str| view! {
                                <select name=name aria-label=label class="unit">
                                    {UNITS.iter().map(|(u, l, _)| view! { <option value=*u selected=chosen == *u || (chosen.is_empty() && *u == "ms")>{*l}</option> }).collect_view()}
                                </select>
                            };
                            let blank = r.name.is_empty() && r.limit.is_empty();
                            let summary = rule_summary(&r);
                            let lease_unit = if r.lease_unit.is_empty() && r.lease_ms.is_empty() { "s".to_owned() } else { r.lease_unit.clone() };
                            view! {
                                <fieldset class="rule" disabled=!can_edit>
                                    <legend>{if blank { if Some(i) == first_blank { "Add a rule".to_owned() } else { "Add another rule".to_owned() } } else { format!("Rule {}", if r.name.is_empty() { (i + 1).to_string() } else { r.name.clone() }) }}</legend>
                                    <label>"Name"<input name=f("name") value=r.name.clone() placeholder="per-second"/>{e("name")}</label>
                                    <label>"Algorithm"
                                        <select name=f("algorithm")>
                                            {ALGORITHMS.iter().map(|k| view! { <option value=k.name selected=alg == k.name>{k.label}</option> }).collect_view()}
                                        </select>{e("algorithm")}
                                    </label>
                                    <label class="f-limit">"Limit"<input name=f("limit") value=r.limit inputmode="numeric"/>{e("limit")}</label>
                                    <span class="f-window duration"><label>"Window"<input name=f("window_ms") value=r.window_ms inputmode="numeric"/>{e("window_ms")}</label>{unit(f("window_unit"), r.window_unit.clone(), "Window unit")}</span>
                                    <span class="f-bucket duration"><label>"Bucket"<input name=f("bucket_ms") value=r.bucket_ms inputmode="numeric"/>{e("bucket_ms")}</label>{unit(f("bucket_unit"), r.bucket_unit.clone(), "Bucket unit")}</span>
                                    <label class="f-capacity">"Capacity"<input name=f("capacity") value=r.capacity inputmode="numeric"/>{e("capacity")}</label>
                                    <label class="f-tokens">"Tokens per period"<input name=f("tokens") value=r.tokens inputmode="numeric"/>{e("refill_tokens")}{e("leak_tokens")}</label>
                                    <span class="f-period duration"><label>"Period"<input name=f("period_ms") value=r.period_ms inputmode="numeric"/>{e("refill_period_ms")}{e("leak_period_ms")}{e("period_ms")}</label>{unit(f("period_unit"), r.period_unit.clone(), "Period unit")}</span>
                                    <label class="f-rate">"Rate"<input name=f("rate") value=r.rate inputmode="numeric"/>{e("rate")}</label>
                                    <label class="f-burst">"Burst"<input name=f("burst") value=r.burst inputmode="numeric"/>{e("burst")}</label>
                                    <span class="f-lease duration"><label>"Lease"<input name=f("lease_ms") value=r.lease_ms inputmode="numeric" placeholder="30"/>{e("lease_ms")}</label>{unit(f("lease_unit"), lease_unit, "Lease unit")}</span>
                                    <label class="f-calendar">"Quota period"
                                        <select name=f("period")>
                                            {Period::ALL.iter().map(|p| view! { <option value=p.name() selected=r.period == p.name()>{p.name()}</option> }).collect_view()}
                                        </select>{e("period")}
                                    </label>
                                    <label class="f-calendar">"Time zone"<input name=f("time_zone") value=r.time_zone placeholder="UTC"/>{e("time_zone")}</label>
                                    <label class="f-calendar">"Starts on day"<input name=f("start_day") value=r.start_day inputmode="numeric" placeholder="1"/>{e("start_day")}</label>
                                    <label class="f-calendar">"Starts in month"<input name=f("start_month") value=r.start_month inputmode="numeric" placeholder="1"/>{e("start_month")}</label>
                                    <label>"Dimensions"<input name=f("dimensions") value=r.dimensions placeholder="all, or ip, user"/>{e("dimensions")}</label>
                                    <label>"Counts a check as"<input name=f("cost") value=r.cost list="cost-models" placeholder="its cost (1 per request for concurrency)"/>{e("cost")}</label>
                                    <span class="duration"><label>"Once it denies, block for"<input name=f("block_ms") value=r.block_ms.clone() inputmode="numeric" placeholder="no penalty"/>{e("block_ms")}</label>{unit(f("block_unit"), if r.block_unit.is_empty() { "s".to_owned() } else { r.block_unit.clone() }, "Block unit")}</span>
                                    <label>"Callers may set, at most"<input name=f("caller_max") value=r.caller_max.clone() placeholder="none, or limit=1000"/>{e("caller_max")}</label>
                                    <label>"Counted"
                                        <select name=f("sync")>
                                            <option value="exact" selected=r.sync != "local">"exactly, in Redis, every check"</option>
                                            <option value="local" selected=r.sync == "local">"on each instance, flushed to Redis (approximate, for hot keys)"</option>
                                        </select>{e("sync")}
                                    </label>
                                    <label>"Flush every (ms)"<input name=f("flush_ms") value=r.flush_ms.clone() inputmode="numeric" placeholder="100 (local only)"/>{e("flush_ms")}</label>
                                    <label class="check"><input type="checkbox" name=f("count_denied") checked=r.count_denied == "on"/>"Count denied requests"</label>
                                    {(!blank).then(|| view! { <label class="check remove"><input type="checkbox" name=f("remove") checked=r.remove == "on"/>"Remove this rule when saving"</label> })}
                                    <p class="muted rule-summary">{summary}</p>
                                </fieldset>
                            }.into_any()
                        }).collect_view();
                        // The form keeps the last own limit saved (its unit too).
                        let last_limit = p.overrides.iter().rev().find_map(|o| o.limit_form.clone());
                        let replaced = rules_replaced(&p.name, &p.rules);
                        let overrides = p.overrides.iter().enumerate().map(|(i, o)| {
                            let c = csrf.clone();
                            let n = p.name.clone();
                            view! {
                                <tr>
                                    <td data-label="Match"><code>{o.matcher.clone()}</code></td>
                                    <td data-label="Action">{o.action.clone()}</td>
                                    <td data-label="Expires">{o.expires_at_ms.map_or("never".to_owned(), |t| utc_minutes(Some(t)))}</td>
                                    <td data-label="Reason">{o.reason.clone()}</td>
                                    <td>{can_override.then(|| view! {
                                        <ConfirmStep summary="Remove…">
                                            <ActionForm action=remove_ov attr:class="inline">
                                                <CsrfField csrf=c/>
                                                <input type="hidden" name="name" value=n/>
                                                <input type="hidden" name="index" value=i.to_string()/>
                                                <button type="submit" class="small danger">"Yes, remove it"</button>
                                            </ActionForm>
                                        </ConfirmStep>
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
                                        <a class="small" href=super::whatif::version_what_if_address(&n, version)>{format!("What would rolling back to version {version} do?")}</a>
                                        <ConfirmStep summary={format!("Roll back to version {version}…")} warning={format!("Saves version {version}'s rules as a new version; the current rules stay in this history, so you can roll forward again.")}>
                                            <ActionForm action=rollback attr:class="inline">
                                                <CsrfField csrf=c/>
                                                <input type="hidden" name="name" value=n/>
                                                <input type="hidden" name="to_version" value=version.to_string()/>
                                                <button type="submit" class="small">{format!("Yes, roll back to version {version}")}</button>
                                            </ActionForm>
                                        </ConfirmStep>
                                    })}
                                </li>
                            }.into_any()
                        }).collect_view();
                        let (c1, c2, c3) = (csrf.clone(), csrf.clone(), csrf.clone());
                        let (n1, n2, n3) = (p.name.clone(), p.name.clone(), p.name.clone());
                        let document = p.document.clone();
                        // Without JavaScript a draft that came back in the address is
                        // previewed on the server; hydrated, the form is read as it changes.
                        let typed_rules = draft().map(|d| rules_of(&p.name, &d.rules));
                        let preview_name = p.name.clone();
                        let (what_if_name, what_if_card) = (p.name.clone(), p.name.clone());
                        let counting = p.envoy_counting.clone().unwrap_or_default();
                        let wiring = p.envoy_wiring.clone();
                        let unmatched = p.envoy_unmatched.clone();
                        let require_key = p.envoy_wiring.first().is_some_and(|(_, filter)| filter.contains("initial_metadata"));
                        let managed = p.managed_by.clone();
                        let can_edit = can_edit && managed.is_none();
                        let envoy_editor = p.envoy_file.clone().map(|file| {
                            let c = csrf.clone();
                            let managed = managed.clone().map(|m| view! {
                                <p class="notice" role="note" data-testid="managed">
                                    {format!("Managed by {m}: this file changes there, and edits here are refused. Inspect, reset and overrides work as for any policy.")}
                                </p>
                            });
                            let (n, file_name) = (p.name.clone(), p.name.clone());
                            let set = counting.set.clone().unwrap_or_else(|| "default".into());
                            let server_default = counting_label(&counting.server_default);
                            view! {
                                <section class="card" aria-labelledby="envoy-heading">
                                    <h2 id="envoy-heading">{format!("Envoy domain file · version {}", p.version)}</h2>
                                    {managed}
                                    <p class="muted">"envoyproxy/ratelimit's format. Its limits are this policy's rules (fixed windows); Envoy's requests are checked against them."</p>
                                    <ActionForm action=save_envoy attr:class="stack">
                                        <CsrfField csrf=c/>
                                        <input type="hidden" name="name" value=n/>
                                        <input type="hidden" name="version" value=p.version.to_string()/>
                                        <label>"File (YAML)"
                                            <textarea name="file" rows="16" spellcheck="false" class="code" disabled=!can_edit>{file}</textarea>
                                        </label>
                                        <label>"A request over a limit"
                                            <select name="counting" disabled=!can_edit>
                                                <option value="default" selected=set == "default">"This server's default"</option>
                                                <option value="every_hit" selected=set == "every_hit">"Every hit counts"</option>
                                                <option value="all_or_nothing" selected=set == "all_or_nothing">"All or nothing"</option>
                                            </select>
                                        </label>
                                        <p class="muted">{format!("Now: {}. This server's default: {server_default}.", counting_label(&counting.counts))}</p>
                                        <p class="muted">"Every hit counts, past the limit too, as envoyproxy/ratelimit counts: a cost reported after the response always lands. All or nothing: a request over any limit counts nowhere, so a request that would overspend is turned away whole."</p>
                                        {can_edit.then(|| view! { <div class="row"><button type="submit">"Save file"</button><WhatIfButton name=file_name file=true/></div> })}
                                    </ActionForm>
                                </section>
                                <section class="card" aria-labelledby="wire-heading" data-testid="wire-envoy">
                                    <h2 id="wire-heading">"Wire Envoy to this domain"</h2>
                                    <p class="muted">"Add these to Envoy's configuration. Each entry of rate_limits is one descriptor, made of its actions in order: one entry per path of the file's tree with a limit. Adjust the header names to your requests."</p>
                                    {(!unmatched.is_empty()).then(|| {
                                        let total: u64 = unmatched.iter().map(|(_, n)| n).sum();
                                        let shapes: Vec<String> = unmatched.iter().take(5).map(|(k, n)| format!("{k} ({n})")).collect();
                                        view! {
                                            <p class="alert" role="note" data-testid="unmatched-descriptors">
                                                {format!("{total} descriptor{} in the last hour matched no limit of this file and limited nothing: {}. Each entry of rate_limits below is one descriptor; its keys, in order, must meet a limit.", if total == 1 { "" } else { "s" }, shapes.join(", "))}
                                            </p>
                                        }
                                    })}
                                    {require_key.then(|| view! {
                                        <p class="muted">"Envoy needs a service key to call this server: "<a href="/people">"create one under Users & keys"</a>" and put it in the filter's initial_metadata."</p>
                                    })}
                                    {wiring.into_iter().map(|(title, yaml)| view! {
                                        <h3 class="small">{title}" "<CopyButton text=yaml.clone()/></h3>
                                        <pre class="code">{yaml}</pre>
                                    }).collect_view()}
                                </section>
                            }
                        });
                        let is_envoy = envoy_editor.is_some();
                        let traffic = p.last_hour.map(|(all, denied, unmatched)| view! {
                            <p class="muted" data-testid="traffic">
                                {format!("Last hour: {all} check{}, {denied} denied", if all == 1 { "" } else { "s" })}
                                {(unmatched > 0).then(|| view! {
                                    ", "<span class="badge warn">{format!("{unmatched} matched no rule")}</span>
                                    {if p.strict { " (refused with 400: the policy is strict)" } else { " (let through uncounted: check their identifiers' names, or make the policy strict)" }}
                                })}
                                "."
                            </p>
                        });
                        // Why the editor is read-only, where it is.
                        let read_only = (!s.may(Action::EditPolicies)).then(|| view! {
                            <p class="notice" role="note" data-testid="read-only">
                                {format!(
                                    "You may read this policy; changing its rules takes the admin role (you are {}).{}",
                                    s.role.map_or("signed out".to_owned(), |r| r.to_string()),
                                    if can_override { " You may add and remove its overrides below." } else { "" }
                                )}
                            </p>
                        });
                        let shadow_badge = p.shadow.then(|| view! {
                            " "<span class="badge warn" data-testid="shadow-badge" title="Its denials are counted and shown, but every request is let through.">"shadow mode"</span>
                        });
                        view! {
                            <h1>{title}{shadow_badge}</h1>
                            {read_only}
                            {traffic}
                            {unused_note(&p.unused, p.strict)}
                            {envoy_editor}
                            {(p.exists && can_edit).then(|| view! { <WhatIfCard name=what_if_card/> })}
                            <section class="card" aria-labelledby="edit-heading" hidden=is_envoy>
                                <h2 id="edit-heading">{if p.exists { format!("Version {}", p.version) } else { "Not saved yet".to_owned() }}</h2>
                                <ActionForm action=save attr:class="stack policy-form">
                                    <CsrfField csrf=c1/>
                                    <input type="hidden" name="name" value=n1/>
                                    <input type="hidden" name="version" value=p.version.to_string()/>
                                    <label>"Description"<input name="description" value=description disabled=!can_edit/>{error_for("description".into())}</label>
                                    <label class="check"><input type="checkbox" name="shadow" checked=shadow disabled=!can_edit/>"Shadow mode: report denials, let requests through"</label>
                                    <label class="check"><input type="checkbox" name="failure_closed" checked=failure_closed disabled=!can_edit/>"Fail closed: refuse checks while Redis is unreachable"</label>
                                    <label class="check"><input type="checkbox" name="strict" checked=strict disabled=!can_edit/>"Strict: refuse (400) a check that meets no rule, or sends a dimension no rule counts in place of one they count, rather than let it through uncounted"</label>
                                    <label>"Optional dimensions: a check may leave these out (anonymous callers of a per-user policy pass uncounted when every dimension is optional)"<input name="optional" value=optional placeholder="e.g. user" disabled=!can_edit/>{error_for("optional".into())}</label>
                                    <label class="check"><input type="checkbox" name="wait" checked=wait disabled=!can_edit/>"Wait instead of refusing: forward-auth and Envoy hold a denied request until it would pass (the JSON check still answers at once)"</label>{error_for("on_deny".into())}
                                    <label>"Hold a denied request at most (ms)"<input name="max_wait_ms" value=max_wait_ms inputmode="numeric" placeholder="e.g. 2000" disabled=!can_edit/>{error_for("max_wait_ms".into())}</label>
                                    {error_for("rules".into())}
                                    <datalist id="cost-models"><option value="units"/><option value="request"/></datalist>
                                    <div class="rules" on:input=read_draft on:change=read_draft>{rule_rows}</div>
                                    {can_edit.then(|| view! { <div class="row"><button type="submit">"Save policy"</button><WhatIfButton name=what_if_name/></div> })}
                                </ActionForm>
                            </section>
                            <Preview name=preview_name document=document typed=typed_rules draft=draft_rules/>
                            {p.exists.then(|| view! {
                                <section class="card" id="override" aria-labelledby="overrides-heading">
                                    <h2 id="overrides-heading">"Overrides"</h2>
                                    <table class="cards-on-phone">
                                        <thead><tr><th>"Match"</th><th>"Action"</th><th>"Expires"</th><th>"Reason"</th><th></th></tr></thead>
                                        <tbody>{overrides}</tbody>
                                    </table>
                                    {can_override.then(|| view! {
                                        <ActionForm action=add_ov attr:class="row override-form">
                                            <CsrfField csrf=c2/>
                                            <input type="hidden" name="name" value=n2/>
                                            <label>"Match"<input name="matcher" required placeholder="user=vip-*, ip=10.0.0.0/8"/></label>
                                            <label>"Action"<select name="action">
                                                <option value="unlimited">"unlimited"</option>
                                                <option value="block">"block"</option>
                                                <option value="limit">"a limit of its own"</option>
                                            </select></label>
                                            <OwnLimitFields last=last_limit.clone() replaces=vec![replaced.clone()]/>
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
                            {(p.exists && can_edit).then(|| {
                                let radius = match p.last_minute {
                                    Some((a, d)) if a + d > 0 => format!(
                                        "{} answered {} checks in the last minute ({:.1}/s, {d} denied). Once it is deleted, every check that names it is refused as an unknown policy (404), and the services that call it allow or refuse by their own error handling.",
                                        p.name, a + d, (a + d) as f64 / 60.0
                                    ),
                                    Some(_) => format!("{} answered no check in the last minute. Once it is deleted, a check that names it is refused as an unknown policy (404).", p.name),
                                    None => format!("Once {} is deleted, every check that names it is refused as an unknown policy (404).", p.name),
                                };
                                let overrides = p.overrides.len();
                                view! {
                                    <details class="card confirm" data-testid="delete">
                                        <summary>"Delete this policy…"</summary>
                                        <p>{radius}</p>
                                        <p>{format!("Its {overrides} override{} and its counters go with it. The audit log keeps its last version.", if overrides == 1 { "" } else { "s" })}</p>
                                        <ActionForm action=delete attr:class="row">
                                            <CsrfField csrf=c3/>
                                            <input type="hidden" name="name" value=n3.clone()/>
                                            <label>{format!("Type {n3} to confirm")}<input name="confirm" required autocomplete="off"/></label>
                                            <button type="submit" class="danger">"Delete policy"</button>
                                        </ActionForm>
                                    </details>
                                }.into_any()
                            })}
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}

/// What the policy's checks sent over the last hour that no rule counts, by dimension: a
/// typo beside a correct name (`usr` by `ip`) limits nothing, and is said here.
fn unused_note(unused: &[(String, u64)], strict: bool) -> Option<impl IntoView + use<>> {
    let total: u64 = unused.iter().map(|(_, n)| n).sum();
    (total > 0).then(|| {
        let shapes: Vec<String> = unused.iter().take(5).map(|(d, n)| format!("{d} ({n})")).collect();
        view! {
            <p class="alert" role="note" id="unused" data-testid="unused-dimensions">
                {format!(
                    "{total} check{} in the last hour sent a dimension no rule counts: {}. {}",
                    if total == 1 { "" } else { "s" },
                    shapes.join(", "),
                    if strict {
                        "Where a dimension the rules count was missing beside it, the check was refused with 400 (the policy is strict); otherwise it was counted by the rest, and that identifier limited nothing."
                    } else {
                        "Those identifiers limited nothing: check the names the callers send, or make the policy strict."
                    }
                )}
            </p>
        }
    })
}
