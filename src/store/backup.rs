//! A backup of the keys without a TTL (`domain::backup`), read and written back. Each
//! group shares a hash tag ({policies}, {people}, {alerts}), so each is written in one
//! MULTI on one slot, and its generation moves on so every instance reloads it.

use std::collections::BTreeMap;

use super::{Store, StoreError};
use crate::domain::{Name, backup::Backup};

impl Store {
    /// What this Redis holds now, as a backup.
    pub async fn backup(&self) -> Result<Backup, StoreError> {
        let hash = |key: String| async move {
            self.query::<BTreeMap<String, String>>(redis::cmd("HGETALL").arg(key))
                .await
        };
        let policy_versions = hash(self.keys.policy_versions()).await?;
        let mut policy_history = BTreeMap::new();
        for name in policy_versions.keys() {
            let Ok(parsed) = Name::parse(name) else {
                continue;
            };
            let versions: Vec<String> = self
                .query(
                    redis::cmd("LRANGE")
                        .arg(self.keys.policy_history(&parsed))
                        .arg(0)
                        .arg(-1),
                )
                .await?;
            if !versions.is_empty() {
                policy_history.insert(name.clone(), versions);
            }
        }
        Ok(Backup {
            format: crate::domain::backup::FORMAT.into(),
            version: crate::domain::backup::VERSION,
            taken_at_ms: crate::support::clock::now_ms(),
            policies: hash(self.keys.policies()).await?,
            policy_versions,
            policy_history,
            users: hash(self.keys.users()).await?,
            api_keys: hash(self.keys.api_keys()).await?,
            alert_rules: hash(self.keys.alert_rules()).await?,
        })
    }

    /// Replaces what this Redis holds (`now`, as [`Store::backup`] read it) with `backup`.
    pub async fn restore(&self, backup: &Backup, now: &Backup) -> Result<(), StoreError> {
        let mut policies = redis::pipe();
        policies.atomic();
        policies.cmd("DEL").arg(self.keys.policies()).ignore();
        policies
            .cmd("DEL")
            .arg(self.keys.policy_versions())
            .ignore();
        for name in now
            .policy_history
            .keys()
            .chain(backup.policy_history.keys())
        {
            if let Ok(parsed) = Name::parse(name) {
                policies
                    .cmd("DEL")
                    .arg(self.keys.policy_history(&parsed))
                    .ignore();
            }
        }
        hset(&mut policies, self.keys.policies(), &backup.policies);
        hset(
            &mut policies,
            self.keys.policy_versions(),
            &backup.policy_versions,
        );
        for (name, versions) in &backup.policy_history {
            if let Ok(parsed) = Name::parse(name) {
                policies
                    .cmd("RPUSH")
                    .arg(self.keys.policy_history(&parsed))
                    .arg(versions)
                    .ignore();
            }
        }
        policies
            .cmd("INCR")
            .arg(self.keys.policy_generation())
            .ignore();
        let () = self.query_pipe(&policies).await?;
        let mut people = redis::pipe();
        people.atomic();
        people.cmd("DEL").arg(self.keys.users()).ignore();
        people.cmd("DEL").arg(self.keys.api_keys()).ignore();
        hset(&mut people, self.keys.users(), &backup.users);
        hset(&mut people, self.keys.api_keys(), &backup.api_keys);
        people
            .cmd("INCR")
            .arg(self.keys.people_generation())
            .ignore();
        let () = self.query_pipe(&people).await?;
        let mut alerts = redis::pipe();
        alerts.atomic();
        alerts.cmd("DEL").arg(self.keys.alert_rules()).ignore();
        hset(&mut alerts, self.keys.alert_rules(), &backup.alert_rules);
        let () = self.query_pipe(&alerts).await?;
        // The instances hear of the policies at once (they also poll the generation).
        let () = self
            .query(
                redis::cmd("PUBLISH")
                    .arg(self.keys.policy_channel())
                    .arg("*"),
            )
            .await?;
        Ok(())
    }
}

/// `HSET key field value…` of `map`, when it holds any.
fn hset(pipe: &mut redis::Pipeline, key: String, map: &BTreeMap<String, String>) {
    if map.is_empty() {
        return;
    }
    let cmd = pipe.cmd("HSET").arg(key);
    for (field, value) in map {
        cmd.arg(field).arg(value);
    }
    cmd.ignore();
}
