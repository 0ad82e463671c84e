//! Users and API keys in Redis: two hashes under the `{people}` tag (no TTL), with a
//! generation counter every instance polls, so a revoked key stops working everywhere
//! within a poll interval. Sessions are `sessions.rs`, the audit log `audit.rs`.

use serde::{Deserialize, Serialize};

use super::{Store, StoreError};
use crate::domain::people::{KeyRole, Role, Username};

/// A user as stored: the password only as an Argon2id PHC string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub username: Username,
    pub role: Role,
    pub password_hash: String,
    pub created_at_ms: i64,
}

/// An API key as stored: its SHA-256 digest, never the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub id: String,
    pub name: String,
    pub role: KeyRole,
    /// Hex SHA-256 of the key.
    pub digest: String,
    pub created_at_ms: i64,
    pub created_by: String,
    #[serde(default)]
    pub revoked_at_ms: Option<i64>,
    /// Read from the last-used hash; not part of the record.
    #[serde(skip)]
    pub last_used_ms: Option<i64>,
}

pub(super) fn bad_record(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Reply(format!("unreadable {what} record: {e}"))
}

impl Store {
    // ----- users -----

    pub async fn list_users(&self) -> Result<Vec<UserRecord>, StoreError> {
        let raw: Vec<(String, String)> = self
            .query(redis::cmd("HGETALL").arg(self.keys.users()))
            .await?;
        let mut users = raw
            .into_iter()
            .map(|(_, json)| serde_json::from_str(&json).map_err(|e| bad_record("user", e)))
            .collect::<Result<Vec<UserRecord>, _>>()?;
        users.sort_by(|a, b| a.username.cmp(&b.username));
        Ok(users)
    }

    pub async fn get_user(&self, name: &Username) -> Result<Option<UserRecord>, StoreError> {
        let raw: Option<String> = self
            .query(redis::cmd("HGET").arg(self.keys.users()).arg(name.as_str()))
            .await?;
        raw.map(|json| serde_json::from_str(&json).map_err(|e| bad_record("user", e)))
            .transpose()
    }

    /// Adds a user unless the name is taken; `false` when it was.
    pub async fn add_user(&self, user: &UserRecord) -> Result<bool, StoreError> {
        let json = serde_json::to_string(user).expect("a user serializes");
        let added: bool = self
            .query_for_write(
                redis::cmd("HSETNX")
                    .arg(self.keys.users())
                    .arg(user.username.as_str())
                    .arg(json),
            )
            .await?;
        if added {
            self.bump_people_generation().await?;
        }
        Ok(added)
    }

    /// Replaces a user's record (new password or role) and ends all their sessions.
    pub async fn update_user(&self, user: &UserRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(user).expect("a user serializes");
        let _: i64 = self
            .query_for_write(
                redis::cmd("HSET")
                    .arg(self.keys.users())
                    .arg(user.username.as_str())
                    .arg(json),
            )
            .await?;
        self.end_user_sessions(&user.username).await?;
        self.bump_people_generation().await
    }

    /// Removes a user and ends their sessions; `false` when there was no such user.
    pub async fn remove_user(&self, name: &Username) -> Result<bool, StoreError> {
        let removed: bool = self
            .query_for_write(redis::cmd("HDEL").arg(self.keys.users()).arg(name.as_str()))
            .await?;
        self.end_user_sessions(name).await?;
        if removed {
            self.bump_people_generation().await?;
        }
        Ok(removed)
    }

    // ----- API keys -----

    pub async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let raw: Vec<(String, String)> = self
            .query(redis::cmd("HGETALL").arg(self.keys.api_keys()))
            .await?;
        let used: std::collections::HashMap<String, i64> = self
            .query(redis::cmd("HGETALL").arg(self.keys.api_key_last_used()))
            .await?;
        let mut keys = raw
            .into_iter()
            .map(|(_, json)| {
                serde_json::from_str::<ApiKeyRecord>(&json).map_err(|e| bad_record("API key", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for k in &mut keys {
            k.last_used_ms = used.get(&k.id).copied();
        }
        keys.sort_by_key(|k| std::cmp::Reverse(k.created_at_ms));
        Ok(keys)
    }

    pub async fn add_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(key).expect("a key serializes");
        let _: i64 = self
            .query_for_write(
                redis::cmd("HSET")
                    .arg(self.keys.api_keys())
                    .arg(&key.id)
                    .arg(json),
            )
            .await?;
        self.bump_people_generation().await
    }

    /// Marks a key revoked; returns the record as it was, or `None` for an unknown id.
    pub async fn revoke_api_key(
        &self,
        id: &str,
        at_ms: i64,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let raw: Option<String> = self
            .query_for_write(redis::cmd("HGET").arg(self.keys.api_keys()).arg(id))
            .await?;
        let Some(raw) = raw else { return Ok(None) };
        let before: ApiKeyRecord =
            serde_json::from_str(&raw).map_err(|e| bad_record("API key", e))?;
        let mut after = before.clone();
        after.revoked_at_ms.get_or_insert(at_ms);
        let json = serde_json::to_string(&after).expect("a key serializes");
        let _: i64 = self
            .query_for_write(
                redis::cmd("HSET")
                    .arg(self.keys.api_keys())
                    .arg(id)
                    .arg(json),
            )
            .await?;
        self.bump_people_generation().await?;
        Ok(Some(before))
    }

    /// Records when keys were last used (one HSET for all of them).
    pub async fn record_key_use(&self, uses: &[(String, i64)]) -> Result<(), StoreError> {
        if uses.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.api_key_last_used());
        for (id, ms) in uses {
            cmd.arg(id).arg(ms);
        }
        let _: i64 = self.query(&cmd).await?;
        Ok(())
    }

    /// The counter bumped on every user or key change.
    pub async fn people_generation(&self) -> Result<u64, StoreError> {
        let g: Option<u64> = self
            .query(redis::cmd("GET").arg(self.keys.people_generation()))
            .await?;
        Ok(g.unwrap_or(0))
    }

    async fn bump_people_generation(&self) -> Result<(), StoreError> {
        let _: i64 = self
            .query_for_write(redis::cmd("INCR").arg(self.keys.people_generation()))
            .await?;
        Ok(())
    }
}
