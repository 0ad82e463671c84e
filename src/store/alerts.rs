//! Alerts in Redis: the rules (a hash without TTL, like the policies), the lease that lets
//! one instance evaluate them, what fires now, the outbox of deliveries still to send, and
//! the log of the latest deliveries. Everything but the rules has a TTL.

use std::collections::{BTreeSet, HashMap};

use super::{Store, StoreError, stats};

/// How long the firing records, the outbox and the delivery log live after their last
/// write (longer than a delivery is retried).
const KEPT_MS: i64 = 7 * 24 * 3_600_000;
/// Deliveries the log keeps.
const LOG_LENGTH: isize = 200;

impl Store {
    /// Every alert rule's document, by name.
    pub async fn alert_rules(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut rules: Vec<(String, String)> = self
            .query(redis::cmd("HGETALL").arg(self.keys.alert_rules()))
            .await?;
        rules.sort();
        Ok(rules)
    }

    /// Stores `document` as rule `name`; its previous document, if any.
    pub async fn save_alert_rule(
        &self,
        name: &str,
        document: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGET")
            .arg(self.keys.alert_rules())
            .arg(name)
            .cmd("HSET")
            .arg(self.keys.alert_rules())
            .arg(name)
            .arg(document)
            .ignore();
        let (before,): (Option<String>,) = self.query_pipe_for_write(&pipe).await?;
        Ok(before)
    }

    /// Removes rule `name`; its document, if it existed.
    pub async fn delete_alert_rule(&self, name: &str) -> Result<Option<String>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGET")
            .arg(self.keys.alert_rules())
            .arg(name)
            .cmd("HDEL")
            .arg(self.keys.alert_rules())
            .arg(name)
            .ignore();
        let (before,): (Option<String>,) = self.query_pipe_for_write(&pipe).await?;
        Ok(before)
    }

    /// Takes or renews the evaluation lease for `holder`; whether it holds it now.
    pub async fn take_alert_lease(&self, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.alerts_lease.prepare_invoke();
        invocation
            .key(self.keys.alert_lease())
            .arg(holder)
            .arg(ttl_ms);
        let held: i64 = self.invoke(&invocation).await?;
        Ok(held == 1)
    }

    /// What fires now: `<rule>|<subject>` → record.
    pub async fn alert_firing(&self) -> Result<HashMap<String, String>, StoreError> {
        self.query(redis::cmd("HGETALL").arg(self.keys.alert_firing()))
            .await
    }

    /// Records a firing (`record: Some`) or its end (`None`).
    pub async fn set_alert_firing(
        &self,
        key: &str,
        record: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        match record {
            Some(r) => pipe
                .cmd("HSET")
                .arg(self.keys.alert_firing())
                .arg(key)
                .arg(r)
                .ignore(),
            None => pipe
                .cmd("HDEL")
                .arg(self.keys.alert_firing())
                .arg(key)
                .ignore(),
        };
        pipe.cmd("PEXPIRE")
            .arg(self.keys.alert_firing())
            .arg(KEPT_MS)
            .ignore();
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// Puts a delivery in the outbox (or replaces it, after an attempt).
    pub async fn put_alert_delivery(&self, id: &str, delivery: &str) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HSET")
            .arg(self.keys.alert_outbox())
            .arg(id)
            .arg(delivery)
            .ignore()
            .cmd("PEXPIRE")
            .arg(self.keys.alert_outbox())
            .arg(KEPT_MS)
            .ignore();
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// The deliveries in the outbox: id → delivery.
    pub async fn alert_outbox(&self) -> Result<HashMap<String, String>, StoreError> {
        self.query(redis::cmd("HGETALL").arg(self.keys.alert_outbox()))
            .await
    }

    /// Takes a delivery out of the outbox and logs how it ended.
    pub async fn finish_alert_delivery(&self, id: &str, log: &str) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HDEL")
            .arg(self.keys.alert_outbox())
            .arg(id)
            .ignore();
        self.push_alert_log(&mut pipe, log);
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// Logs an attempt that will be retried (the delivery stays in the outbox).
    pub async fn log_alert_attempt(&self, log: &str) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        self.push_alert_log(&mut pipe, log);
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// Adds `log` to the delivery log, keeping its newest `LOG_LENGTH` and its TTL.
    fn push_alert_log(&self, pipe: &mut redis::Pipeline, log: &str) {
        pipe.cmd("LPUSH")
            .arg(self.keys.alert_deliveries())
            .arg(log)
            .ignore()
            .cmd("LTRIM")
            .arg(self.keys.alert_deliveries())
            .arg(0)
            .arg(LOG_LENGTH - 1)
            .ignore()
            .cmd("PEXPIRE")
            .arg(self.keys.alert_deliveries())
            .arg(KEPT_MS)
            .ignore();
    }

    /// The latest deliveries and attempts, newest first.
    pub async fn alert_deliveries(&self, n: usize) -> Result<Vec<String>, StoreError> {
        self.query(
            redis::cmd("LRANGE")
                .arg(self.keys.alert_deliveries())
                .arg(0)
                .arg(n.saturating_sub(1)),
        )
        .await
    }

    /// The identifiers denied in each of the last `minutes` minutes (the current one
    /// last): `<policy>|<dimension>=<value>` sets from the live counters.
    pub async fn denied_in_minutes(
        &self,
        minutes: i64,
    ) -> Result<Vec<BTreeSet<String>>, StoreError> {
        let current = stats::minute_of(stats::now_ms());
        let mut pipe = redis::pipe();
        for m in (current - minutes + 1)..=current {
            pipe.cmd("ZRANGE")
                .arg(self.keys.stats_denied(m))
                .arg(0)
                .arg(-1);
        }
        let sets: Vec<Vec<String>> = self.query_pipe(&pipe).await?;
        Ok(sets.into_iter().map(|s| s.into_iter().collect()).collect())
    }
}
