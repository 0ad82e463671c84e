//! The alerts page (`/alerts`): the rules, what fires now, the latest deliveries and their
//! failures; admins add and remove rules here (each change audited). Plain forms, so it
//! works without JavaScript.

// The save form's server function takes its nine fields one by one (a form post), and the
// macro's client half repeats them where an attribute on the function does not reach.
#![allow(clippy::too_many_arguments)]

use leptos::prelude::*;
use leptos_meta::Title;
use serde::{Deserialize, Serialize};

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
    /// (at, rule, event, attempt, outcome, detail)
    pub deliveries: Vec<(String, String, String, u64, String, String)>,
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
                    f["figures"].to_string(),
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
    #[server(default)] webhook_url: String,
    #[server(default)] secret: String,
) -> Result<(), AppError> {
    use crate::{
        app::guard,
        domain::{
            alerts::{AlertRule, Condition},
            people::Action,
        },
        service::alerts::AlertError,
    };
    let caller = guard::require_change(Action::EditPolicies, &csrf)?;
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
    let condition = match kind.as_str() {
        "policy_denials" => Condition::PolicyDenials {
            policy: policy.trim().to_owned(),
            per_second: number("condition.per_second", &per_second)?,
            for_seconds: whole("condition.for_seconds", &for_seconds)?,
        },
        "degraded" => Condition::Degraded {
            seconds: whole("condition.seconds", &for_seconds)?,
        },
        "identifier_throttled" => Condition::IdentifierThrottled {
            policy: Some(policy.trim().to_owned()).filter(|p| !p.is_empty()),
            minutes: whole("condition.minutes", &minutes)?,
        },
        other => {
            return Err(AppError::bad_input(
                "condition.kind",
                format!("expected policy_denials, identifier_throttled or degraded, got {other:?}"),
            ));
        }
    };
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
            AlertError::Unknown(name) => AppError::bad_input("name", format!("no rule {name:?}")),
            AlertError::Unavailable(e) => AppError::unavailable("saving an alert rule", e),
        })
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
pub fn AlertsPage() -> impl IntoView {
    let save = ServerAction::<SaveAlertRule>::new();
    let delete = ServerAction::<DeleteAlertRule>::new();
    let data = Resource::new(
        move || (save.version().get(), delete.version().get()),
        |_| load_alerts(),
    );
    let save_error = move || save.value().get().and_then(|r| r.err());
    let field_error = move |field: &'static str| {
        move || {
            save_error()
                .filter(|e| e.field() == Some(field))
                .map(|e| view! { <span class="field-error" role="alert">{e.message()}</span> })
        }
    };
    let other_error = move || {
        save_error()
            .filter(|e| {
                !matches!(
                    e.field(),
                    Some(
                        "name"
                            | "webhook_url"
                            | "secret"
                            | "condition.policy"
                            | "condition.per_second"
                            | "condition.for_seconds"
                            | "condition.minutes"
                            | "condition.seconds"
                    )
                )
            })
            .or_else(|| delete.value().get().and_then(|r| r.err()))
            .map(|e| view! { <p class="alert" role="alert">{error_message(&e)}</p> })
    };
    view! {
        <Title text="Alerts"/>
        <h1>"Alerts"</h1>
        {other_error}
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
                                            view! {
                                                <tr>
                                                    <td>{r.name.clone()}{(!r.enabled).then_some(" (off)")}</td>
                                                    <td>{r.watches}</td>
                                                    <td class="url">{r.webhook_url}</td>
                                                    <td>{can_edit.then(|| view! {
                                                        <details class="confirm-step">
                                                            <summary>"Remove…"</summary>
                                                            <p class="small">"It stops watching at once; a firing it sent stays in the deliveries below."</p>
                                                            <ActionForm action=delete attr:class="inline">
                                                                <CsrfField csrf=csrf/>
                                                                <input type="hidden" name="name" value=name/>
                                                                <button type="submit" class="small danger" aria-label=label>"Yes, remove it"</button>
                                                            </ActionForm>
                                                        </details>
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
                                    <tbody>{a.firing.into_iter().map(|(r, s, t, f)| view! {
                                        <tr><td>{r}</td><td>{crate::domain::envoy::readable(&s).to_owned()}</td><td>{t}</td><td class="url">{f}</td></tr>
                                    }).collect_view()}</tbody>
                                </table>
                            }.into_any()
                        };
                        let deliveries = if a.deliveries.is_empty() {
                            view! { <p class="empty" data-testid="deliveries">"No deliveries yet."</p> }.into_any()
                        } else {
                            view! {
                                <table data-testid="deliveries">
                                    <thead><tr><th>"At"</th><th>"Rule"</th><th>"Event"</th><th class="num">"Attempt"</th><th>"Outcome"</th><th>"Detail"</th></tr></thead>
                                    <tbody>{a.deliveries.into_iter().map(|(at, r, e, n, o, d)| view! {
                                        <tr><td>{at}</td><td>{r}</td><td>{e}</td><td class="num">{n}</td><td>{o}</td><td class="url">{d}</td></tr>
                                    }).collect_view()}</tbody>
                                </table>
                            }.into_any()
                        };
                        let form = can_edit.then(|| view! {
                            <section class="card" aria-labelledby="new-alert-heading">
                                <h2 id="new-alert-heading">"Add or replace a rule"</h2>
                                <ActionForm action=save attr:class="stack">
                                    <CsrfField csrf=a.csrf.clone()/>
                                    <label>"Name" <input name="name" required/> {field_error("name")}</label>
                                    <label>"Watch"
                                        <select name="kind">
                                            <option value="policy_denials">"a policy's denials a second"</option>
                                            <option value="identifier_throttled">"an identifier throttled for minutes"</option>
                                            <option value="degraded">"checks failing on Redis (degraded)"</option>
                                        </select>
                                    </label>
                                    <label>"Policy" <input name="policy" placeholder="any (for identifiers)"/> {field_error("condition.policy")}</label>
                                    <label>"Denials a second above" <input name="per_second" inputmode="decimal" value="10"/> {field_error("condition.per_second")}</label>
                                    <label>"Averaged over (s), or failing on Redis for (s)" <input name="for_seconds" inputmode="numeric" value="60"/> {field_error("condition.for_seconds")} {field_error("condition.seconds")}</label>
                                    <label>"Throttled in each of the last (min)" <input name="minutes" inputmode="numeric" value="3"/> {field_error("condition.minutes")}</label>
                                    <label>"Webhook URL" <input name="webhook_url" type="url" required/> {field_error("webhook_url")}</label>
                                    <label>"Secret (16 to 256 characters, signs each delivery)" <input name="secret" type="password" autocomplete="off" required/> {field_error("secret")}</label>
                                    <button type="submit">"Save rule"</button>
                                </ActionForm>
                            </section>
                        });
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
                            {form}
                        }.into_any()
                    }
                }
            })}
        </Suspense>
    }
}
