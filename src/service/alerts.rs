//! Alerts: admins keep rules (audited); one instance at a time (the holder of a lease in
//! Redis) evaluates them every `SPILLWAY_ALERT_EVAL_MS` against the live counters, records
//! what starts and stops firing, and delivers each change once as a signed webhook from an
//! outbox in Redis, retried with backoff for at most an hour (so a delivery survives the
//! holder's crash: the next holder sends it).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};

use super::Service;
use crate::{
    domain::alerts::{self, AlertRule, Condition},
    net::webhooks::Webhooks,
    service::audit::{Actor, Change},
    store::{Store, StoreError},
    support::clock::now_ms,
    support::shutdown::Shutdown,
};

mod outage;
pub use outage::RedisOutage;

mod delivery;
use delivery::*;

/// How alerts are evaluated and where their links point.
#[derive(Clone, Debug)]
pub struct AlertSettings {
    pub every: Duration,
    /// The dashboard's address as the receivers reach it, for the links in the payloads.
    pub public_url: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("no alert rule named {0:?}")]
    Unknown(String),
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

/// How often an outage that goes on is logged again.
const OUTAGE_LOG_EVERY_MS: i64 = 10_000;

/// A rule as the API and the pages show it: the secret is never shown again.
pub fn shown(rule: &AlertRule) -> Value {
    let mut v = serde_json::to_value(rule).unwrap_or_default();
    v["secret"] = json!("(set)");
    v
}

/// A rule as the audit log keeps it, which every role reads: no secret, and the webhook URL
/// cut to its host (the URL is often a credential).
fn audited(rule: &AlertRule) -> String {
    let mut v = shown(rule);
    v["webhook_url"] = json!(host_only(&rule.webhook_url));
    v.to_string()
}

/// An audit record's document with any webhook URL in it cut to its host: records written
/// before URLs were cut are read this way.
pub fn redact_audited(document: &str) -> Option<String> {
    let mut v: Value = serde_json::from_str(document).ok()?;
    let url = v.get("webhook_url")?.as_str()?.to_owned();
    v["webhook_url"] = json!(host_only(&url));
    Some(v.to_string())
}

/// What the alerts page and `GET /api/v1/alerts` show.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AlertsView {
    pub rules: Vec<Value>,
    /// What fires now: rule, subject, since, figures.
    pub firing: Vec<Value>,
    /// The latest deliveries and attempts, newest first.
    pub deliveries: Vec<Value>,
}

impl Service {
    /// Validates and stores `rule` (audited as `alert.save`).
    pub async fn save_alert(
        &self,
        actor: &Actor,
        rule: AlertRule,
    ) -> Result<AlertRule, AlertError> {
        rule.validate().map_err(|e| AlertError::Invalid {
            field: e.field,
            message: e.message,
        })?;
        self.webhook_targets
            .check_url(&rule.webhook_url)
            .map_err(|message| AlertError::Invalid {
                field: "webhook_url".into(),
                message,
            })?;
        // A name is resolved now as well as at each delivery: one that resolves inside is
        // refused here, where the admin sees why (a name that does not resolve yet is
        // taken, and checked when it is used).
        if let Err(message) = self.webhook_targets.check_resolved(&rule.webhook_url).await {
            return Err(AlertError::Invalid {
                field: "webhook_url".into(),
                message,
            });
        }
        let document = serde_json::to_string(&rule).expect("a rule serializes");
        let before = self.store.save_alert_rule(&rule.name, &document).await?;
        let before = before
            .and_then(|b| serde_json::from_str::<AlertRule>(&b).ok())
            .map_or(String::new(), |b| audited(&b));
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "alert.save",
                    target: &rule.name,
                    before,
                    after: audited(&rule),
                    reason: "",
                },
            )
            .await;
        Ok(rule)
    }

    /// Removes rule `name` (audited as `alert.delete`); what fires for it resolves.
    pub async fn delete_alert(&self, actor: &Actor, name: &str) -> Result<(), AlertError> {
        let Some(before) = self.store.delete_alert_rule(name).await? else {
            return Err(AlertError::Unknown(name.to_owned()));
        };
        let before =
            serde_json::from_str::<AlertRule>(&before).map_or(String::new(), |b| audited(&b));
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "alert.delete",
                    target: name,
                    before,
                    after: String::new(),
                    reason: "",
                },
            )
            .await;
        Ok(())
    }

    /// Sends rule `name` a test delivery now, signed as a real one (event `test`), and
    /// lists it with the deliveries; audited as `alert.test`. What the receiver answered.
    pub async fn test_alert(&self, actor: &Actor, name: &str) -> Result<String, AlertError> {
        let rule = rules(&self.store)
            .await?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or_else(|| AlertError::Unknown(name.to_owned()))?;
        let now = now_ms();
        let id = format!("test-{}", crate::support::ids::random_hex::<8>());
        let body = json!({
            "event": "test",
            "rule": rule.name,
            "text": format!("A test delivery of the alert rule {} from Spillway", rule.name),
            "at_ms": now,
        })
        .to_string();
        let sent = Webhooks::new(self.webhook_targets.clone())
            .deliver(&rule.webhook_url, &rule.secret, &id, &body, now / 1000)
            .await;
        let (outcome, detail) = match &sent {
            Ok(status) => ("delivered", status.to_string()),
            Err(error) => ("failed", error.clone()),
        };
        let log = json!({"id": id, "rule": rule.name, "event": "test", "url": rule.webhook_url,
            "attempt": 1, "outcome": outcome, "detail": detail, "at_ms": now});
        self.store.log_alert_attempt(&log.to_string()).await?;
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "alert.test",
                    target: name,
                    after: json!({"outcome": outcome}).to_string(),
                    ..Change::default()
                },
            )
            .await;
        Ok(match sent {
            Ok(status) => format!("delivered: the receiver answered {status}"),
            Err(error) => format!("not delivered: {error}"),
        })
    }

    /// How many alert rules fire now.
    pub async fn alerts_firing(&self) -> Result<usize, StoreError> {
        Ok(self.store.alert_firing().await?.len())
    }

    /// The rules, what fires and the latest deliveries. Webhook URLs are often credentials
    /// (Slack's, Discord's) and a delivery's detail tells what answered at an address: with
    /// `full` false (anyone but an admin) each URL is cut to its scheme and host, and the
    /// deliveries say only when, which rule, which event, which attempt and how it ended.
    pub async fn alerts(&self, full: bool) -> Result<AlertsView, StoreError> {
        let rules = rules(&self.store).await?;
        let mut firing: Vec<Value> = self
            .store
            .alert_firing()
            .await?
            .into_values()
            .filter_map(|r| serde_json::from_str(&r).ok())
            .collect();
        firing.sort_by_key(|f: &Value| f["since_ms"].as_i64().unwrap_or_default());
        let deliveries = self
            .store
            .alert_deliveries(50)
            .await?
            .iter()
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        let mut view = AlertsView {
            rules: rules.iter().map(shown).collect(),
            firing,
            deliveries,
        };
        if !full {
            for rule in &mut view.rules {
                rule["webhook_url"] = json!(host_only(rule["webhook_url"].as_str().unwrap_or("")));
            }
            for delivery in &mut view.deliveries {
                if let Some(d) = delivery.as_object_mut() {
                    d.remove("detail");
                    d.remove("url");
                }
            }
        }
        Ok(view)
    }

    /// Evaluates and delivers every `settings.every` while this instance holds the lease,
    /// until the server stops; and, on every instance, watches its own checks for the
    /// `degraded` rules.
    pub fn spawn_alerts(&self, settings: AlertSettings, shutdown: &Shutdown) {
        self.spawn_outage_alerts(settings.clone(), shutdown);
        let store = self.store.clone();
        let targets = self.webhook_targets.clone();
        let holder = crate::support::ids::random_hex::<12>();
        shutdown.spawn(async move {
            let webhooks = Webhooks::new(targets);
            let lease_ms = (settings.every.as_millis() as u64 * 3).max(1000);
            let mut tick = tokio::time::interval(settings.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match store.take_alert_lease(&holder, lease_ms).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(error) => {
                        tracing::debug!(%error, "alerts: could not take the lease");
                        continue;
                    }
                }
                if let Err(error) = evaluate(&store, &settings).await {
                    tracing::warn!(%error, "alerts: could not evaluate the rules");
                }
                if let Err(error) = deliver_due(&store, &webhooks).await {
                    tracing::warn!(%error, "alerts: could not deliver");
                }
            }
        });
    }
}

/// A URL cut to its scheme and host (`https://hooks.slack.com/…`).
fn host_only(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            // A backslash ends the host too, as browsers and the URL parser read it.
            let host = rest.split(['/', '?', '#', '\\']).next().unwrap_or_default();
            format!("{scheme}://{host}/…")
        }
        None => "…".into(),
    }
}

async fn rules(store: &Store) -> Result<Vec<AlertRule>, StoreError> {
    Ok(store
        .alert_rules()
        .await?
        .into_iter()
        .filter_map(|(_, doc)| serde_json::from_str::<AlertRule>(&doc).ok())
        .collect())
}

/// What fires for `rule` now: subject → figures.
async fn firing_now(store: &Store, rule: &AlertRule) -> Result<HashMap<String, Value>, StoreError> {
    let mut out = HashMap::new();
    match &rule.condition {
        Condition::PolicyDenials {
            policy,
            per_second,
            for_seconds,
        } => {
            let seconds = i64::from(*for_seconds);
            let (_, rates) = store
                .policy_rates(std::slice::from_ref(policy), seconds + 1)
                .await?;
            // Complete seconds only: the last bucket is still counting.
            let denied: Vec<u64> = rates
                .first()
                .map(|r| r.iter().rev().skip(1).map(|s| s.denied).collect())
                .unwrap_or_default();
            if alerts::denials_fire(&denied, *per_second) {
                let average = denied.iter().sum::<u64>() as f64 / denied.len() as f64;
                out.insert(
                    policy.clone(),
                    json!({"policy": policy, "denials_per_second": average,
                        "threshold_per_second": per_second, "over_seconds": for_seconds}),
                );
            }
        }
        // Watched by each instance on its own checks (see spawn_outage_alerts).
        Condition::Degraded { .. } => {}
        Condition::IdentifierThrottled { policy, minutes } => {
            let sets = store.denied_in_minutes(i64::from(*minutes)).await?;
            for member in alerts::throttled_throughout(&sets, policy.as_deref()) {
                let (p, id) = member.split_once('|').unwrap_or(("", &member));
                out.insert(
                    member.clone(),
                    json!({"policy": p, "identifier": id, "throttled_minutes": minutes}),
                );
            }
        }
    }
    Ok(out)
}

/// Compares what fires now with what fired: new firings and resolutions go to the outbox.
async fn evaluate(store: &Store, settings: &AlertSettings) -> Result<(), StoreError> {
    let rules = rules(store).await?;
    let before = store.alert_firing().await?;
    let mut now_firing: HashMap<String, (AlertRule, String, Value)> = HashMap::new();
    for rule in rules.iter().filter(|r| r.enabled) {
        for (subject, figures) in firing_now(store, rule).await? {
            now_firing.insert(
                format!("{}|{subject}", rule.name),
                (rule.clone(), subject, figures),
            );
        }
    }
    let now = now_ms();
    for (key, (rule, subject, figures)) in &now_firing {
        if before.contains_key(key) {
            continue;
        }
        let id = crate::support::ids::random_hex::<8>();
        let record = json!({"id": id, "rule": rule.name, "subject": subject, "since_ms": now,
            "figures": figures});
        store
            .set_alert_firing(key, Some(&record.to_string()))
            .await?;
        enqueue(store, settings, rule, &record, "firing", now).await?;
    }
    for (key, record) in &before {
        if now_firing.contains_key(key) {
            continue;
        }
        let Ok(record) = serde_json::from_str::<Value>(record) else {
            store.set_alert_firing(key, None).await?;
            continue;
        };
        let rule_name = record["rule"].as_str().unwrap_or_default();
        // Resolved to the rule's address; a rule deleted since resolves nowhere.
        if let Some(rule) = rules.iter().find(|r| r.name == rule_name) {
            enqueue(store, settings, rule, &record, "resolved", now).await?;
        }
        store.set_alert_firing(key, None).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A URL is cut where a browser ends its host: at `/`, `?`, `#` and `\` too (the third
    /// probe showed a path after a backslash to viewers).
    #[test]
    fn a_url_is_cut_to_its_host() {
        assert_eq!(
            super::host_only("https://hooks.slack.com/services/T0/B0/SECRET"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            super::host_only("https://203.0.113.50\\SECRET\\x?token=Q"),
            "https://203.0.113.50/…"
        );
        assert_eq!(super::host_only("https://h?x=SECRET"), "https://h/…");
        assert_eq!(super::host_only("nonsense"), "…");
    }
}
