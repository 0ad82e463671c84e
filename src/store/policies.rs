//! Policies in Redis: the current version of each in one hash, previous versions in a list
//! per policy, a generation counter and a pub/sub channel so every instance notices a change.

use redis::Script;
use serde_json::Value;

use super::{Store, StoreError};
use crate::domain::{Name, Policy};

/// What saving a policy did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Stored as this version.
    Version(u64),
    /// The caller expected another current version; nothing was written.
    Conflict,
}

pub(super) fn save_script() -> Script {
    Script::new(include_str!("../../lua/policy_save.lua"))
}

pub(super) fn import_script() -> Script {
    Script::new(include_str!("../../lua/policy_import.lua"))
}

impl Store {
    /// Every policy, current versions, sorted by name. A stored document that no longer
    /// parses is logged and left out, never served half-understood.
    pub async fn list_policies(&self) -> Result<Vec<Policy>, StoreError> {
        let raw: Vec<(String, String)> = self
            .query(redis::cmd("HGETALL").arg(self.keys.policies()))
            .await?;
        let mut policies: Vec<Policy> = raw
            .iter()
            .filter_map(|(name, json)| parse_stored(name, json))
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(policies)
    }

    /// The current version of `name`, if it exists.
    pub async fn get_policy(&self, name: &Name) -> Result<Option<Policy>, StoreError> {
        self.read_policy(name, false).await
    }

    /// As [`Store::get_policy`], for a change about to be written: read within the write
    /// timeout, so a Redis slow enough to miss a check's timeout does not refuse the save
    /// that its write would have survived.
    pub async fn get_policy_for_change(&self, name: &Name) -> Result<Option<Policy>, StoreError> {
        self.read_policy(name, true).await
    }

    async fn read_policy(
        &self,
        name: &Name,
        for_change: bool,
    ) -> Result<Option<Policy>, StoreError> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(self.keys.policies()).arg(name.as_str());
        let raw: Option<String> = if for_change {
            self.query_for_write(&cmd).await?
        } else {
            self.query(&cmd).await?
        };
        Ok(raw.and_then(|json| parse_stored(name.as_str(), &json)))
    }

    /// Previous versions of `name`, newest first, at most `limit`.
    pub async fn policy_history(
        &self,
        name: &Name,
        limit: usize,
    ) -> Result<Vec<Policy>, StoreError> {
        let raw: Vec<String> = self
            .query(
                redis::cmd("LRANGE")
                    .arg(self.keys.policy_history(name))
                    .arg(0)
                    .arg(limit.saturating_sub(1) as i64),
            )
            .await?;
        Ok(raw
            .iter()
            .filter_map(|json| parse_stored(name.as_str(), json))
            .collect())
    }

    /// Stores `policy` as its next version. With `expected`, only if the current version is
    /// that one (0: only if it does not exist yet).
    pub async fn save_policy(
        &self,
        policy: &Policy,
        expected: Option<u64>,
    ) -> Result<Saved, StoreError> {
        self.save_policy_at(policy, expected.map(|v| (v, None)))
            .await
    }

    /// As [`Store::save_policy`], `expected` also naming how many times its overrides
    /// changed within the version (`Some`: refused unless that many).
    pub async fn save_policy_at(
        &self,
        policy: &Policy,
        expected: Option<(u64, Option<u64>)>,
    ) -> Result<Saved, StoreError> {
        let doc = serde_json::to_string(&policy.document())
            .map_err(|e| StoreError::Encode(e.to_string()))?;
        let expected = expected.map(|(v, r)| match r {
            Some(r) => format!("{v}.{r}"),
            None => v.to_string(),
        });
        let reply: i64 = self
            .run_policy_script(&policy.name, "put", &doc, expected)
            .await?;
        Ok(if reply < 0 {
            Saved::Conflict
        } else {
            Saved::Version(reply as u64)
        })
    }

    /// Stores `policy`'s overrides in place: the same version, its overrides' count within
    /// it one more; refused (`Conflict`) unless the stored policy is still at `expected`
    /// (version, overrides' count).
    pub async fn save_overrides(
        &self,
        policy: &Policy,
        expected: (u64, u64),
    ) -> Result<Saved, StoreError> {
        let doc = serde_json::to_string(&policy.document())
            .map_err(|e| StoreError::Encode(e.to_string()))?;
        let reply: i64 = self
            .run_policy_script(
                &policy.name,
                "overrides",
                &doc,
                Some(format!("{}.{}", expected.0, expected.1)),
            )
            .await?;
        Ok(if reply < 0 {
            Saved::Conflict
        } else {
            Saved::Version(reply as u64)
        })
    }

    /// Stores every policy of `policies` as its next version, all in one atomic script:
    /// either all are written or none is. Policies not in the set are left as they are.
    pub async fn import_policies(&self, policies: &[Policy]) -> Result<usize, StoreError> {
        if policies.is_empty() {
            return Ok(0);
        }
        let mut invocation = self.scripts.policy_import.prepare_invoke();
        invocation
            .key(self.keys.policies())
            .key(self.keys.policy_generation())
            .key(self.keys.policy_versions());
        invocation.arg(self.keys.policy_channel());
        for policy in policies {
            let doc = serde_json::to_string(&policy.document())
                .map_err(|e| StoreError::Encode(e.to_string()))?;
            invocation
                .key(self.keys.policy_history(&policy.name))
                .arg(policy.name.as_str())
                .arg(doc);
        }
        let written: usize = self.invoke_write(&invocation).await?;
        Ok(written)
    }

    /// Deletes `name` (its history is kept). Returns whether it existed.
    pub async fn delete_policy(&self, name: &Name) -> Result<bool, StoreError> {
        let reply: i64 = self.run_policy_script(name, "delete", "", None).await?;
        Ok(reply == 1)
    }

    /// The policy generation: it changes whenever any policy does.
    pub async fn policy_generation(&self) -> Result<u64, StoreError> {
        let raw: Option<u64> = self
            .query(redis::cmd("GET").arg(self.keys.policy_generation()))
            .await?;
        Ok(raw.unwrap_or(0))
    }

    async fn run_policy_script<T: redis::FromRedisValue>(
        &self,
        name: &Name,
        op: &str,
        doc: &str,
        expected: Option<String>,
    ) -> Result<T, StoreError> {
        let mut invocation = self.scripts.policy_save.prepare_invoke();
        invocation
            .key(self.keys.policies())
            .key(self.keys.policy_history(name))
            .key(self.keys.policy_generation())
            .key(self.keys.policy_versions())
            .arg(name.as_str())
            .arg(op)
            .arg(doc)
            .arg(expected.unwrap_or_default())
            .arg(self.keys.policy_channel());
        self.invoke_write(&invocation).await
    }
}

fn parse_stored(name: &str, json: &str) -> Option<Policy> {
    let parsed = serde_json::from_str::<Value>(json).ok().and_then(|v| {
        let version = v.get("version")?.as_u64()?;
        let overrides_rev = v.get("overrides_rev").and_then(Value::as_u64).unwrap_or(0);
        let policy = Policy::from_stored(name, v.get("policy")?).ok()?;
        Some(Policy {
            version,
            overrides_rev,
            ..policy
        })
    });
    if parsed.is_none() {
        tracing::error!(
            policy = name,
            "a stored policy does not parse; it is ignored"
        );
    }
    parsed
}
