//! Alert deliveries: firings queued in Redis, sent by one instance at a time with retries,
//! each signed, and the Redis outage alert sent straight from memory.

use super::*;

/// Puts one delivery (a firing or its resolution) in the outbox.
pub(super) async fn enqueue(
    store: &Store,
    settings: &AlertSettings,
    rule: &AlertRule,
    record: &Value,
    event: &str,
    now: i64,
) -> Result<(), StoreError> {
    let id = format!("{}-{event}", record["id"].as_str().unwrap_or_default());
    let figures = &record["figures"];
    let link = match figures["identifier"].as_str() {
        Some(identifier) => format!(
            "{}/identifiers?id={}",
            settings.public_url,
            crate::domain::percent_encode(identifier)
        ),
        None => format!(
            "{}/history?policy={}&range=1h",
            settings.public_url,
            crate::domain::percent_encode(figures["policy"].as_str().unwrap_or_default())
        ),
    };
    let payload = json!({
        "id": id,
        "event": event,
        "rule": rule.name,
        "condition": rule.condition,
        "subject": record["subject"],
        "figures": figures,
        "since_ms": record["since_ms"],
        "at_ms": now,
        "link": link,
    });
    let delivery = json!({
        "id": id, "rule": rule.name, "event": event, "url": rule.webhook_url,
        "secret": rule.secret, "body": payload.to_string(), "first_ms": now,
        "next_ms": now, "attempts": 0,
    });
    store.put_alert_delivery(&id, &delivery.to_string()).await
}

/// Sends the outbox's due deliveries; each one that fails is retried later, for at most an
/// hour from its first attempt.
pub(super) async fn deliver_due(store: &Store, webhooks: &Webhooks) -> Result<(), StoreError> {
    let now = now_ms();
    let outbox = store.alert_outbox().await?;
    if outbox.is_empty() {
        return Ok(());
    }
    // Read once a round: a delivery goes to its rule's URL with its secret as they are now,
    // and a deleted rule's deliveries are dropped, not sent on with the old secret.
    let current: HashMap<String, AlertRule> = rules(store)
        .await?
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect();
    for (id, raw) in outbox {
        let Ok(mut d) = serde_json::from_str::<Value>(&raw) else {
            store.finish_alert_delivery(&id, "{}").await?;
            continue;
        };
        let Some(rule) = d["rule"].as_str().and_then(|r| current.get(r)) else {
            let log = json!({"id": id, "rule": d["rule"], "event": d["event"], "url": d["url"],
                "attempt": d["attempts"], "outcome": "cancelled",
                "detail": "the rule was deleted", "at_ms": now});
            store.finish_alert_delivery(&id, &log.to_string()).await?;
            continue;
        };
        d["url"] = json!(rule.webhook_url);
        d["secret"] = json!(rule.secret);
        if d["next_ms"].as_i64().unwrap_or_default() > now {
            continue;
        }
        let attempts = d["attempts"].as_u64().unwrap_or_default() as u32 + 1;
        let sent = webhooks
            .deliver(
                d["url"].as_str().unwrap_or_default(),
                d["secret"].as_str().unwrap_or_default(),
                &id,
                d["body"].as_str().unwrap_or_default(),
                now / 1000,
            )
            .await;
        let (rule, event, url) = (d["rule"].clone(), d["event"].clone(), d["url"].clone());
        let log = |outcome: &str, detail: &str| {
            json!({"id": id, "rule": rule, "event": event, "url": url,
                "attempt": attempts, "outcome": outcome, "detail": detail, "at_ms": now})
            .to_string()
        };
        match sent {
            Ok(status) => {
                store
                    .finish_alert_delivery(&id, &log("delivered", &status.to_string()))
                    .await?
            }
            Err(error) => {
                let first = d["first_ms"].as_i64().unwrap_or(now);
                match alerts::next_attempt(first, attempts, now) {
                    Some(next) => {
                        d["attempts"] = json!(attempts);
                        d["next_ms"] = json!(next);
                        store.put_alert_delivery(&id, &d.to_string()).await?;
                        store.log_alert_attempt(&log("retrying", &error)).await?;
                    }
                    None => {
                        store
                            .finish_alert_delivery(&id, &log("failed", &error))
                            .await?
                    }
                }
            }
        }
    }
    Ok(())
}

impl Service {
    /// The `degraded` rules, evaluated by each instance on its own checks and delivered
    /// straight from memory (Redis is what is unreachable): the rules are the last ones
    /// read, a firing is sent once per outage and its resolution once Redis answers again,
    /// each retried with the same backoff for at most an hour.
    pub(super) fn spawn_outage_alerts(&self, settings: AlertSettings, shutdown: &Shutdown) {
        let store = self.store.clone();
        let outage = self.outage.clone();
        let targets = self.webhook_targets.clone();
        let instance = crate::support::ids::random_hex::<6>();
        let tasks = shutdown.clone();
        shutdown.spawn(async move {
            let webhooks = Webhooks::new(targets);
            let known: Arc<Mutex<Vec<AlertRule>>> = Arc::default();
            // rule name → (firing id, outage start)
            let mut fired: HashMap<String, (String, i64)> = HashMap::new();
            let mut tick = tokio::time::interval(settings.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Ok(rules) = rules(&store).await {
                    *known
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = rules;
                }
                let rules: Vec<AlertRule> = known
                    .lock()
                    .expect("rules lock")
                    .iter()
                    .filter(|r| r.enabled && matches!(r.condition, Condition::Degraded { .. }))
                    .cloned()
                    .collect();
                let now = now_ms();
                let since = outage.since();
                for rule in &rules {
                    let Condition::Degraded { seconds } = rule.condition else {
                        continue;
                    };
                    match (since, fired.get(&rule.name)) {
                        (Some(start), None) if now - start > i64::from(seconds) * 1000 => {
                            let id = crate::support::ids::random_hex::<8>();
                            fired.insert(rule.name.clone(), (id.clone(), start));
                            let figures = json!({"instance": instance, "failing_since_ms": start,
                                "failing_for_seconds": (now - start) / 1000});
                            send_direct(
                                &tasks, &webhooks, &settings, rule, &id, "firing", start, figures,
                                now,
                            );
                        }
                        (None, Some(_)) => {
                            let (id, start) = fired.remove(&rule.name).expect("just matched");
                            let figures = json!({"instance": instance, "failing_since_ms": start,
                                "failing_for_seconds": (now - start) / 1000});
                            send_direct(
                                &tasks, &webhooks, &settings, rule, &id, "resolved", start,
                                figures, now,
                            );
                        }
                        _ => {}
                    }
                }
                fired.retain(|name, _| rules.iter().any(|r| &r.name == name));
            }
        });
    }
}

/// Delivers one `degraded` firing or resolution from memory, retrying with the outbox's
/// backoff for at most an hour; the outcome is logged (and added to the delivery log when
/// Redis takes it).
#[allow(clippy::too_many_arguments)]
pub(super) fn send_direct(
    tasks: &Shutdown,
    webhooks: &Webhooks,
    settings: &AlertSettings,
    rule: &AlertRule,
    firing_id: &str,
    event: &'static str,
    since: i64,
    figures: Value,
    now: i64,
) {
    let id = format!("{firing_id}-{event}");
    let body = json!({
        "id": id, "event": event, "rule": rule.name, "condition": rule.condition,
        "subject": figures["instance"], "figures": figures, "since_ms": since, "at_ms": now,
        "link": format!("{}/", settings.public_url),
    })
    .to_string();
    let (webhooks, url, secret, name) = (
        webhooks.clone(),
        rule.webhook_url.clone(),
        rule.secret.clone(),
        rule.name.clone(),
    );
    tasks.spawn(async move {
        let first = now_ms();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let at = now_ms();
            match webhooks.deliver(&url, &secret, &id, &body, at / 1000).await {
                Ok(status) => {
                    tracing::info!(rule = %name, %id, status, "alert delivered");
                    return;
                }
                Err(error) => match alerts::next_attempt(first, attempts, at) {
                    Some(next) => {
                        tracing::warn!(rule = %name, %id, %error, "alert not delivered; retrying");
                        tokio::time::sleep(Duration::from_millis((next - at).max(0) as u64)).await;
                    }
                    None => {
                        tracing::warn!(rule = %name, %id, %error, "alert not delivered within an hour; given up");
                        return;
                    }
                },
            }
        }
    });
}
