//! Users, API keys, sessions and the audit log in Redis.
//!
//! Users and API keys live in two hashes under the `{people}` tag (no TTL), with a
//! generation counter every instance polls, so a revoked key stops working everywhere
//! within a poll interval. Sessions live under `{sessions}`, each a hash whose TTL is the
//! idle timeout (renewed on use, never past the absolute expiry). The audit log is a stream
//! under `{audit}` that nothing here trims or edits.

use redis::Script;
use serde::{Deserialize, Serialize};

use super::{Store, StoreError};
use crate::domain::people::{AuditEntry, AuditFilter, KeyRole, Role, Username};

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

/// A session as stored. `user` is `None` before login (the session then only carries the
/// CSRF token of the login form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    pub user: Option<Username>,
    pub role: Option<Role>,
    pub csrf: String,
    pub created_ms: i64,
    /// The absolute expiry, ms since the epoch.
    pub expires_ms: i64,
}

/// The session-touch script (see its header).
pub(super) fn touch_script() -> Script {
    Script::new(include_str!("../../lua/session_touch.lua"))
}

fn bad_record(what: &str, e: impl std::fmt::Display) -> StoreError {
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
            .query(
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
            .query(
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
            .query(redis::cmd("HDEL").arg(self.keys.users()).arg(name.as_str()))
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
            .query(
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
            .query(redis::cmd("HGET").arg(self.keys.api_keys()).arg(id))
            .await?;
        let Some(raw) = raw else { return Ok(None) };
        let before: ApiKeyRecord =
            serde_json::from_str(&raw).map_err(|e| bad_record("API key", e))?;
        let mut after = before.clone();
        after.revoked_at_ms.get_or_insert(at_ms);
        let json = serde_json::to_string(&after).expect("a key serializes");
        let _: i64 = self
            .query(
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
            .query(redis::cmd("INCR").arg(self.keys.people_generation()))
            .await?;
        Ok(())
    }

    // ----- sessions -----

    /// Stores a new session under the digest of its id, living `idle_ms` unless renewed.
    pub async fn create_session(
        &self,
        digest_hex: &str,
        session: &SessionRecord,
        idle_ms: u64,
    ) -> Result<(), StoreError> {
        let key = self.keys.session(digest_hex);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HSET")
            .arg(&key)
            .arg("user")
            .arg(session.user.as_ref().map_or("", |u| u.as_str()))
            .arg("role")
            .arg(session.role.map_or("", Role::as_str))
            .arg("csrf")
            .arg(&session.csrf)
            .arg("created_ms")
            .arg(session.created_ms)
            .arg("expires_ms")
            .arg(session.expires_ms)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(idle_ms)
            .ignore();
        if let Some(user) = &session.user {
            let index = self.keys.user_sessions(user);
            let lifetime = (session.expires_ms - session.created_ms).max(1);
            pipe.cmd("SADD")
                .arg(&index)
                .arg(digest_hex)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&index)
                .arg(lifetime)
                .ignore();
        }
        self.query_pipe::<()>(&pipe).await
    }

    /// Reads a session and renews its idle timeout; `None` when it is gone or expired.
    pub async fn touch_session(
        &self,
        digest_hex: &str,
        now_ms: i64,
        idle_ms: u64,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let mut invocation = self.scripts.session_touch.prepare_invoke();
        invocation
            .key(self.keys.session(digest_hex))
            .arg(now_ms)
            .arg(idle_ms);
        let raw: Option<Vec<(String, String)>> = self.invoke(&invocation).await?;
        let Some(fields) = raw else { return Ok(None) };
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .unwrap_or("")
        };
        let user = match get("user") {
            "" => None,
            u => Some(Username::parse(u).map_err(|e| bad_record("session", e))?),
        };
        let role = match get("role") {
            "" => None,
            r => Some(Role::parse(r).map_err(|e| bad_record("session", e))?),
        };
        Ok(Some(SessionRecord {
            user,
            role,
            csrf: get("csrf").to_owned(),
            created_ms: get("created_ms").parse().unwrap_or(0),
            expires_ms: get("expires_ms").parse().unwrap_or(0),
        }))
    }

    /// Ends one session.
    pub async fn delete_session(
        &self,
        digest_hex: &str,
        user: Option<&Username>,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(self.keys.session(digest_hex))
            .ignore();
        if let Some(user) = user {
            pipe.cmd("SREM")
                .arg(self.keys.user_sessions(user))
                .arg(digest_hex)
                .ignore();
        }
        self.query_pipe::<()>(&pipe).await
    }

    /// Leaves a one-time message in a session (a new API key to show once, even to a
    /// browser without JavaScript that reloads the page to see it).
    pub async fn set_session_flash(&self, digest_hex: &str, text: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .query(
                redis::cmd("HSET")
                    .arg(self.keys.session(digest_hex))
                    .arg("flash")
                    .arg(text),
            )
            .await?;
        Ok(())
    }

    /// Takes the session's one-time message, if any (it is gone afterwards).
    pub async fn take_session_flash(&self, digest_hex: &str) -> Result<Option<String>, StoreError> {
        let key = self.keys.session(digest_hex);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGET")
            .arg(&key)
            .arg("flash")
            .cmd("HDEL")
            .arg(&key)
            .arg("flash")
            .ignore();
        let (flash,): (Option<String>,) = self.query_pipe(&pipe).await?;
        Ok(flash)
    }

    /// Ends every session of `user`.
    pub async fn end_user_sessions(&self, user: &Username) -> Result<(), StoreError> {
        let index = self.keys.user_sessions(user);
        let digests: Vec<String> = self.query(redis::cmd("SMEMBERS").arg(&index)).await?;
        let mut del = redis::cmd("DEL");
        del.arg(&index);
        for d in &digests {
            del.arg(self.keys.session(d));
        }
        let _: i64 = self.query(&del).await?;
        Ok(())
    }

    // ----- audit -----

    /// Appends one record to the audit log; returns its id. Redis's clock stamps it (the
    /// id is `<ms>-<seq>`), so records from every instance are in one order.
    pub async fn append_audit(&self, entry: &AuditEntry) -> Result<String, StoreError> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.keys.audit_log()).arg("*");
        for (field, value) in [
            ("actor", &entry.actor),
            ("role", &entry.role),
            ("action", &entry.action),
            ("target", &entry.target),
            ("before", &entry.before),
            ("after", &entry.after),
            ("ip", &entry.ip),
            ("reason", &entry.reason),
        ] {
            cmd.arg(field).arg(value);
        }
        self.query(&cmd).await
    }

    /// The newest audit records matching `filter`, newest first, at most `limit`, older than
    /// the record `before_id` when given. Reads the stream backwards in pages and stops
    /// after `MAX_SCANNED` records, so a rare filter cannot make a page slow.
    pub async fn read_audit(
        &self,
        filter: &AuditFilter,
        limit: usize,
        before_id: Option<&str>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        const PAGE: usize = 500;
        const MAX_SCANNED: usize = 50_000;
        let start = filter
            .since_ms
            .map_or("-".to_owned(), |t| format!("{}", t.max(0)));
        let mut end = match (before_id, filter.until_ms) {
            (Some(id), _) => format!("({id}"),
            (None, Some(t)) => format!("{}", t.max(0)),
            (None, None) => "+".to_owned(),
        };
        let mut out = Vec::new();
        let mut scanned = 0;
        loop {
            let page: Vec<(String, Vec<(String, String)>)> = self
                .query(
                    redis::cmd("XREVRANGE")
                        .arg(self.keys.audit_log())
                        .arg(&end)
                        .arg(&start)
                        .arg("COUNT")
                        .arg(PAGE),
                )
                .await?;
            let n = page.len();
            scanned += n;
            for (id, fields) in page {
                end = format!("({id}");
                let entry = entry_from(id, fields);
                if filter.matches(&entry) {
                    out.push(entry);
                    if out.len() >= limit {
                        return Ok(out);
                    }
                }
            }
            if n < PAGE || scanned >= MAX_SCANNED {
                return Ok(out);
            }
        }
    }

    /// How many records the audit log holds.
    pub async fn audit_len(&self) -> Result<u64, StoreError> {
        self.query(redis::cmd("XLEN").arg(self.keys.audit_log()))
            .await
    }
}

fn entry_from(id: String, fields: Vec<(String, String)>) -> AuditEntry {
    let time_ms = id
        .split('-')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let mut e = AuditEntry {
        id,
        time_ms,
        ..Default::default()
    };
    for (k, v) in fields {
        match k.as_str() {
            "actor" => e.actor = v,
            "role" => e.role = v,
            "action" => e.action = v,
            "target" => e.target = v,
            "before" => e.before = v,
            "after" => e.after = v,
            "ip" => e.ip = v,
            "reason" => e.reason = v,
            _ => {}
        }
    }
    e
}
