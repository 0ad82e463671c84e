//! The alerts page (`/alerts`): the rules, what fires now, the latest deliveries and their
//! failures; admins add and remove rules here (each change audited). Plain forms, so it
//! works without JavaScript.

// The save form's server function takes its nine fields one by one (a form post), and the
// macro's client half repeats them where an attribute on the function does not reach.
#![allow(clippy::too_many_arguments)]

use leptos::prelude::*;

use crate::app::widgets::ConfirmStep;
use leptos_meta::Title;
use serde::{Deserialize, Serialize};

use super::kept::{use_done, use_kept};
use super::session::{CsrfField, error_message};
use crate::app::error::AppError;

/// A rule as the page lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleRow {
    pub name: String,
    pub watches: String,
    pub webhook_url: String,
    pub enabled: bool,
}

/// What the page shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertsData {
    pub csrf: String,
    pub can_edit: bool,
    pub rules: Vec<RuleRow>,
    /// (rule, subject, since, figures)
    pub firing: Vec<(String, String, String, String)>,
    /// (at, rule, event, attempt, outcome, detail), newest first.
    pub deliveries: Vec<(String, String, String, u64, String, String)>,
    /// Each delivery's id, beside `deliveries` (its attempts share one).
    #[serde(default)]
    pub delivery_ids: Vec<String>,
}

/// What a rule watches, in words.
#[cfg(feature = "ssr")]
fn watches(condition: &crate::domain::alerts::Condition) -> String {
    use crate::domain::alerts::Condition;
    match condition {
        Condition::PolicyDenials {
            policy,
            per_second,
            for_seconds,
        } => format!("{policy}: more than {per_second} denials a second over {for_seconds} s"),
        Condition::IdentifierThrottled { policy, minutes } => format!(
            "an identifier throttled by {} in each of the last {minutes} min",
            policy.as_deref().unwrap_or("any policy")
        ),
        Condition::Degraded { seconds } => {
            format!("checks failing on Redis for more than {seconds} s (each instance)")
        }
    }
}

#[server(prefix = "/fn", endpoint = "alerts")]
pub async fn load_alerts() -> Result<AlertsData, AppError> {
    use crate::{app::guard, domain::people::Action, domain::time::utc_seconds};
    let caller = guard::require(Action::View)?;
    let state = expect_context::<crate::state::AppState>();
    // Webhook URLs and delivery details are for admins (the URLs are often credentials).
    let view = state
        .service()
        .alerts(caller.role.may(Action::ManagePeople))
        .await
        .map_err(|e| AppError::unavailable("alerts page", e))?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    Ok(AlertsData {
        can_edit: caller.role.may(Action::EditPolicies),
        csrf: caller.csrf,
        rules: view
            .rules
            .iter()
            .filter_map(|r| {
                serde_json::from_value::<crate::domain::alerts::AlertRule>(r.clone()).ok()
            })
            .map(|r| RuleRow {
                watches: watches(&r.condition),
                name: r.name,
                webhook_url: r.webhook_url,
                enabled: r.enabled,
            })
            .collect(),
        firing: view
            .firing
            .iter()
            .map(|f| {
                (
                    text(&f["rule"]),
                    text(&f["subject"]),
                    utc_seconds(f["since_ms"].as_i64().unwrap_or_default()),
                    readable_figures(&f["figures"]),
                )
            })
            .collect(),
        deliveries: view
            .deliveries
            .iter()
            .map(|d| {
                (
                    utc_seconds(d["at_ms"].as_i64().unwrap_or_default()),
                    text(&d["rule"]),
                    text(&d["event"]),
                    d["attempt"].as_u64().unwrap_or_default(),
                    text(&d["outcome"]),
                    text(&d["detail"]),
                )
            })
            .collect(),
        delivery_ids: view.deliveries.iter().map(|d| text(&d["id"])).collect(),
    })
}

/// A firing's figures in words: `denials_per_second: 25.3` as "denials per second 25.3".
#[cfg(feature = "ssr")]
fn readable_figures(figures: &serde_json::Value) -> String {
    match figures.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    serde_json::Value::Number(n) => n.as_f64().map_or_else(
                        || n.to_string(),
                        |f| format!("{}", (f * 10.0).round() / 10.0),
                    ),
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                format!("{} {value}", k.replace('_', " "))
            })
            .collect::<Vec<_>>()
            .join(", "),
        None => figures.to_string(),
    }
}

/// Sends a rule a test delivery now; says what the receiver answered.
#[server(prefix = "/fn", endpoint = "alert_test")]
pub async fn test_alert_rule(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
) -> Result<String, AppError> {
    use crate::{app::guard, domain::people::Action, service::alerts::AlertError};
    let caller = guard::require_change(Action::EditPolicies, &csrf)?;
    expect_context::<crate::state::AppState>()
        .service()
        .test_alert(&caller.actor(), &name)
        .await
        .map_err(|e| match e {
            AlertError::Unavailable(e) => AppError::unavailable("a test delivery", e),
            other => AppError::bad_input("name", other),
        })
}

/// How many alert rules fire now (the navigation's badge); none for someone not signed in
/// (every page asks, the sign-in page too, which must stay a 200).
#[server(prefix = "/fn", endpoint = "alerts_firing")]
pub async fn alerts_firing() -> Result<usize, AppError> {
    let viewer = crate::app::guard::caller()
        .is_some_and(|c| c.role.may(crate::domain::people::Action::View));
    if !viewer {
        return Ok(0);
    }
    expect_context::<crate::state::AppState>()
        .service()
        .alerts_firing()
        .await
        .map_err(|e| AppError::unavailable("alerts", e))
}

/// The alert's condition from the form's fields, each error naming its field.
#[cfg(feature = "ssr")]
fn alert_condition(
    kind: &str,
    policy: &str,
    [per_second, for_seconds, minutes, seconds]: [&str; 4],
) -> Result<crate::domain::alerts::Condition, AppError> {
    use crate::domain::alerts::Condition;
    let number = |field: &str, raw: &str| -> Result<f64, AppError> {
        raw.trim()
            .parse::<f64>()
            .map_err(|_| AppError::bad_input(field, format!("must be a number, got {raw:?}")))
    };
    let whole = |field: &str, raw: &str| -> Result<u32, AppError> {
        raw.trim()
            .parse::<u32>()
            .map_err(|_| AppError::bad_input(field, format!("must be a whole number, got {raw:?}")))
    };
    Ok(match kind {
        "policy_denials" => Condition::PolicyDenials {
            policy: policy.trim().to_owned(),
            per_second: number("condition.per_second", per_second)?,
            for_seconds: whole("condition.for_seconds", for_seconds)?,
        },
        "degraded" => Condition::Degraded {
            // Its own field; an older form sent it as for_seconds.
            seconds: whole(
                "condition.seconds",
                if seconds.trim().is_empty() {
                    for_seconds
                } else {
                    seconds
                },
            )?,
        },
        "identifier_throttled" => Condition::IdentifierThrottled {
            policy: Some(policy.trim().to_owned()).filter(|p| !p.is_empty()),
            minutes: whole("condition.minutes", minutes)?,
        },
        other => {
            return Err(AppError::bad_input(
                "condition.kind",
                format!("expected policy_denials, identifier_throttled or degraded, got {other:?}"),
            ));
        }
    })
}

/// Adds or replaces a rule from the page's form.
#[server(prefix = "/fn", endpoint = "alert_save")]
pub async fn save_alert_rule(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] kind: String,
    #[server(default)] policy: String,
    #[server(default)] per_second: String,
    #[server(default)] for_seconds: String,
    #[server(default)] minutes: String,
    #[server(default)] seconds: String,
    #[server(default)] webhook_url: String,
    #[server(default)] secret: String,
) -> Result<(), AppError> {
    use crate::{
        app::guard,
        domain::{alerts::AlertRule, people::Action},
        service::alerts::AlertError,
    };
    let typed = [
        ("name", name.as_str()),
        ("kind", kind.as_str()),
        ("policy", policy.as_str()),
        ("per_second", per_second.as_str()),
        ("for_seconds", for_seconds.as_str()),
        ("minutes", minutes.as_str()),
        ("seconds", seconds.as_str()),
    ];
    let saved = async {
        let caller = guard::require_change(Action::EditPolicies, &csrf)?;
        let condition = alert_condition(
            &kind,
            &policy,
            [&per_second, &for_seconds, &minutes, &seconds],
        )?;
        let rule = AlertRule {
            name: name.trim().to_owned(),
            condition,
            webhook_url: webhook_url.trim().to_owned(),
            secret,
            enabled: true,
        };
        let state = expect_context::<crate::state::AppState>();
        state
            .service()
            .save_alert(&caller.actor(), rule)
            .await
            .map(|_| ())
            .map_err(|e| match e {
                AlertError::Invalid { field, message } => AppError::bad_input(&field, message),
                AlertError::Unknown(name) => {
                    AppError::bad_input("name", format!("no rule {name:?}"))
                }
                AlertError::Unavailable(e) => AppError::unavailable("saving an alert rule", e),
            })
    }
    .await;
    // Without JavaScript a failed save comes back filled in (all but the secret).
    crate::app::kept::answer_form("/alerts", "new-alert", &typed, &saved);
    saved
}

/// Removes a rule.
#[server(prefix = "/fn", endpoint = "alert_delete")]
pub async fn delete_alert_rule(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
) -> Result<(), AppError> {
    use crate::{app::guard, domain::people::Action, service::alerts::AlertError};
    let caller = guard::require_change(Action::EditPolicies, &csrf)?;
    let state = expect_context::<crate::state::AppState>();
    state
        .service()
        .delete_alert(&caller.actor(), &name)
        .await
        .map_err(|e| match e {
            AlertError::Unavailable(e) => AppError::unavailable("removing an alert rule", e),
            other => AppError::bad_input("name", other),
        })
}

#[component]
#[expect(clippy::too_many_lines, reason = "a page whose body is one view")]
pub fn AlertsPage() -> impl IntoView {
    let save = ServerAction::<SaveAlertRule>::new();
    let delete = ServerAction::<DeleteAlertRule>::new();
    let test = ServerAction::<TestAlertRule>::new();
    let session = super::session::use_session();
    let form_ref = NodeRef::<leptos::html::Form>::new();
    Effect::new(move |_| {
        if let Some(Ok(())) = save.value().get()
            && let Some(form) = form_ref.get()
        {
            form.reset();
        }
    });
    let data = Resource::new(
        move || {
            (
                save.version().get(),
                delete.version().get(),
                test.version().get(),
            )
        },
        |_| load_alerts(),
    );
    // A save that failed without JavaScript: what was typed, and the error, from the address.
    let kept = use_kept("new-alert");
    let saved_without_js = use_done("new-alert");
    let typed = move |field: &'static str| kept.with(|k| k.as_ref().map(|k| k.value(field)));
    let save_error = move || {
        save.value()
            .get()
            .and_then(|r| r.err())
            .map(|e| {
                (
                    e.field().unwrap_or_default().to_owned(),
                    e.message(),
                    error_message(&e),
                )
            })
            .or_else(|| {
                kept.get()
                    .filter(|k| !k.message.is_empty())
                    .map(|k| (k.field.clone(), k.message.clone(), k.error_line()))
            })
    };
    const FIELDS: [&str; 8] = [
        "name",
        "webhook_url",
        "secret",
        "condition.policy",
        "condition.per_second",
        "condition.for_seconds",
        "condition.minutes",
        "condition.seconds",
    ];
    let field_error = move |field: &'static str| {
        move || {
            save_error().filter(|(f, _, _)| f == field).map(
                |(_, message, _)| view! { <span class="field-error" role="alert">{message}</span> },
            )
        }
    };
    let other_error = move || {
        save_error()
            .filter(|(f, _, _)| !FIELDS.contains(&f.as_str()))
            .map(|(_, _, whole)| whole)
            .or_else(|| {
                delete
                    .value()
                    .get()
                    .and_then(|r| r.err())
                    .map(|e| error_message(&e))
            })
            .or_else(|| {
                test.value().get().and_then(|r| match r {
                    Err(e) => Some(error_message(&e)),
                    // Said once, as a failure: the receiver's error already says "not delivered".
                    Ok(outcome) => outcome.strip_prefix("not delivered: ").map(|why| {
                        format!(
                            "Test delivery failed: {}",
                            why.trim_start_matches("not delivered: ")
                        )
                    }),
                })
            })
            .map(|e| view! { <p class="alert" role="alert">{e}</p> })
    };
    let done = move || {
        if let Some(Ok(outcome)) = test.value().get()
            && !outcome.starts_with("not delivered")
        {
            return Some(format!("Test delivery {outcome}."));
        }
        if let Some(Ok(())) = save.value().get() {
            return Some("Rule saved.".to_owned());
        }
        if saved_without_js.get() {
            return Some("Rule saved.".to_owned());
        }
        delete
            .value()
            .get()
            .and_then(|r| r.ok())
            .map(|()| "Rule removed.".to_owned())
    };
    view! {
        <Title text="Alerts"/>
        <h1>"Alerts"</h1>
        {other_error}
        {move || done().map(|t| view! { <p class="notice" role="status">{t}</p> })}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Err(e) => view! { <p class="alert" role="alert">{error_message(&e)}</p> }.into_any(),
                    Ok(a) => {
                        let csrf = a.csrf.clone();
                        let can_edit = a.can_edit;
                        let rules = if a.rules.is_empty() {
                            view! { <p class="empty" data-testid="alert-rules">"No alert rules yet."</p> }.into_any()
                        } else {
                            view! {
                                <table data-testid="alert-rules">
                                    <thead><tr><th>"Rule"</th><th>"Watches"</th><th>"Webhook"</th><th></th></tr></thead>
                                    <tbody>
                                        {a.rules.into_iter().map(|r| {
                                            let csrf = csrf.clone();
                                            let label = format!("Remove {}", r.name);
                                            let name = r.name.clone();
                                            let (test_csrf, test_name) = (csrf.clone(), name.clone());
                                            let test_label = format!("Send {name} a test delivery");
                                            view! {
                                                <tr>
                                                    <td>{r.name.clone()}{(!r.enabled).then_some(" (off)")}</td>
                                                    <td>{r.watches}</td>
                                                    <td class="url">{r.webhook_url}</td>
                                                    <td>{can_edit.then(|| view! {
                                                        <ActionForm action=test attr:class="inline">
                                                            <CsrfField csrf=test_csrf/>
                                                            <input type="hidden" name="name" value=test_name/>
                                                            <button type="submit" class="small quiet" aria-label=test_label>"Send a test"</button>
                                                        </ActionForm>
                                                        <ConfirmStep summary="Remove…" warning="It stops watching at once; a firing it sent stays in the deliveries below.">
                                                            <ActionForm action=delete attr:class="inline">
                                                                <CsrfField csrf=csrf/>
                                                                <input type="hidden" name="name" value=name/>
                                                                <button type="submit" class="small danger" aria-label=label>"Yes, remove it"</button>
                                                            </ActionForm>
                                                        </ConfirmStep>
                                                    })}</td>
                                                </tr>
                                            }
                                        }).collect_view()}
                                    </tbody>
                                </table>
                            }.into_any()
                        };
                        let firing = if a.firing.is_empty() {
                            view! { <p class="empty" data-testid="firing">"Nothing fires now."</p> }.into_any()
                        } else {
                            view! {
                                <table data-testid="firing">
                                    <thead><tr><th>"Rule"</th><th>"Subject"</th><th>"Since"</th><th>"Figures"</th></tr></thead>
                                    <tbody>{a.firing.into_iter().map(|(r, s, t, f)| {
                                        // An identifier links to the inspector.
                                        let subject = if s.contains('=') {
                                            let href = format!("/identifiers?id={}", super::overview::encode(&s));
                                            view! { <a href=href>{crate::domain::envoy::readable(&s).to_owned()}</a> }.into_any()
                                        } else {
                                            view! { {s} }.into_any()
                                        };
                                        view! { <tr><td>{r}</td><td>{subject}</td><td>{t}</td><td>{f}</td></tr> }
                                    }).collect_view()}</tbody>
                                </table>
                            }.into_any()
                        };
                        let deliveries = if a.deliveries.is_empty() {
                            view! { <p class="empty" data-testid="deliveries">"No deliveries yet."</p> }.into_any()
                        } else {
                            view! {
                                <table data-testid="deliveries">
                                    <thead><tr><th>"Last attempt"</th><th>"Rule"</th><th>"Event"</th><th class="num">"Attempts"</th><th>"Outcome"</th><th>"Detail"</th></tr></thead>
                                    <tbody>{grouped(a.deliveries, a.delivery_ids).into_iter().map(|attempts| {
                                        let (at, r, e, n, o, d) = attempts[0].clone();
                                        let earlier = (attempts.len() > 1).then(|| view! {
                                            <details><summary>{format!("{} earlier", attempts.len() - 1)}</summary>
                                                <ul class="small">{attempts[1..].iter().map(|(at, _, _, n, o, d)| view! { <li>{format!("{at}: attempt {n} {o} {d}")}</li> }).collect_view()}</ul>
                                            </details>
                                        });
                                        view! {
                                            <tr><td>{at}</td><td>{r}</td><td>{e}</td><td class="num">{n}</td><td>{o}</td><td class="url">{d}{earlier}</td></tr>
                                        }
                                    }).collect_view()}</tbody>
                                </table>
                            }.into_any()
                        };
                        view! {
                            <div class="grid">
                                <section class="card wide" aria-labelledby="rules-heading">
                                    <h2 id="rules-heading">"Rules"</h2>
                                    {rules}
                                </section>
                                <section class="card wide" aria-labelledby="firing-heading">
                                    <h2 id="firing-heading">"Firing now"</h2>
                                    {firing}
                                </section>
                                <section class="card wide" aria-labelledby="deliveries-heading">
                                    <h2 id="deliveries-heading">"Latest deliveries"</h2>
                                    <p class="muted">"Each firing and resolution is sent once, signed, retried for up to an hour."</p>
                                    {deliveries}
                                </section>
                            </div>
                        }.into_any()
                    }
                }
            })}
        </Suspense>
        // Outside the list's Suspense: a save that fails keeps what was typed; one that
        // succeeds clears the form.
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                s.may(crate::domain::people::Action::EditPolicies).then(|| view! {
                    <section class="card" aria-labelledby="new-alert-heading">
                                <h2 id="new-alert-heading">"Add or replace a rule"</h2>
                                <ActionForm action=save attr:class="stack" attr:id="new-alert" node_ref=form_ref>
                                    <CsrfField csrf=s.csrf.clone()/>
                                    <label>"Name" <input name="name" required value=typed("name")/> {field_error("name")}</label>
                                    <label>"Watch"
                                        <select name="kind">
                                            {[
                                                ("policy_denials", "a policy's denials a second"),
                                                ("identifier_throttled", "an identifier throttled for minutes"),
                                                ("degraded", "checks failing on Redis (degraded)"),
                                            ].map(|(value, text)| view! {
                                                <option value=value selected=move || typed("kind").as_deref() == Some(value)>{text}</option>
                                            })}
                                        </select>
                                    </label>
                                    <label class="k-denials k-throttled">"Policy" <input name="policy" placeholder="any (for identifiers)" value=typed("policy")/> {field_error("condition.policy")}</label>
                                    <label class="k-denials">"Denials a second above" <input name="per_second" inputmode="decimal" value=move || typed("per_second").unwrap_or_else(|| "10".into())/> {field_error("condition.per_second")}</label>
                                    <label class="k-denials">"Averaged over (s)" <input name="for_seconds" inputmode="numeric" value=move || typed("for_seconds").unwrap_or_else(|| "60".into())/> {field_error("condition.for_seconds")}</label>
                                    <label class="k-throttled">"Throttled in each of the last (min)" <input name="minutes" inputmode="numeric" value=move || typed("minutes").unwrap_or_else(|| "3".into())/> {field_error("condition.minutes")}</label>
                                    <label class="k-degraded">"Failing on Redis for more than (s)" <input name="seconds" inputmode="numeric" value=move || typed("seconds").unwrap_or_else(|| "30".into())/> {field_error("condition.seconds")}</label>
                                    <label>"Webhook URL" <input name="webhook_url" type="url" required/> {field_error("webhook_url")}</label>
                                    <label>"Secret (16 to 256 characters, signs each delivery)" <input name="secret" type="password" autocomplete="off" required/> {field_error("secret")}</label>
                                    {move || kept.with(|k| k.is_some()).then(|| view! { <p class="muted">"The webhook URL and the secret are not kept after a failed save (an address is no place for them): type them again."</p> })}
                                    <button type="submit">"Save rule"</button>
                                </ActionForm>
                            </section>
                })
            })}
        </Suspense>
    }
}

/// The deliveries' attempts grouped per delivery (by id), each group newest first, the
/// groups in the order of their newest attempt.
fn grouped<T: Clone>(rows: Vec<T>, ids: Vec<String>) -> Vec<Vec<T>> {
    let mut groups: Vec<(String, Vec<T>)> = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        let id = ids.get(i).cloned().unwrap_or_default();
        match groups.iter_mut().find(|(g, _)| !id.is_empty() && *g == id) {
            Some((_, rows)) => rows.push(row),
            None => groups.push((id, vec![row])),
        }
    }
    groups.into_iter().map(|(_, rows)| rows).collect()
}
