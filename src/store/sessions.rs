//! Dashboard sessions in Redis: under `{sessions}`, each a hash whose TTL is the idle
//! timeout (renewed on use, never past the absolute expiry), indexed per user so a password
//! change can end them all.

use redis::Script;

use super::{Store, StoreError, people::bad_record};
use crate::domain::people::{Role, Username};

/// A session as stored. Every session is signed in now (a visitor's sign-in form keeps its
/// token in a cookie); `user` and `role` stay optional to read records written before that,
/// which carried only the form's CSRF token and are treated as no session.
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

impl Store {
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
        let digests: Vec<String> = self
            .query_for_write(redis::cmd("SMEMBERS").arg(&index))
            .await?;
        let mut del = redis::cmd("DEL");
        del.arg(&index);
        for d in &digests {
            del.arg(self.keys.session(d));
        }
        let _: i64 = self.query_for_write(&del).await?;
        Ok(())
    }
}
