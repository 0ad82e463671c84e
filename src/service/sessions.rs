//! People's sessions and signing in and out: the use cases behind the sign-in form, the
//! dashboard's session middleware and the account page. A session is kept under the SHA-256
//! of its id (the cookie's value), so Redis never holds an id someone could replay; its TTL
//! is the idle timeout, renewed on each read, never past the absolute expiry. Every sign-in,
//! refusal and sign-out writes an audit record here.

use super::{
    Service, StoreError, keys, password,
    signin::{Attempt, Charged},
};
use crate::{
    config::SessionSettings,
    domain::people::{Role, Username},
    service::audit::{Actor, Change},
    store::sessions::SessionRecord,
    support::clock::now_ms,
    support::ids::{random_bytes, to_hex},
};

/// A live session: its record, and the hex SHA-256 of its id (the key Redis keeps it under).
#[derive(Clone, Debug)]
pub struct Session {
    pub digest: String,
    pub record: SessionRecord,
}

impl Session {
    /// The signed-in user and role, if this session has one.
    pub fn user(&self) -> Option<(&Username, Role)> {
        Some((self.record.user.as_ref()?, self.record.role?))
    }

    /// Whether `token` is this session's CSRF token (compared in constant time).
    pub fn csrf_matches(&self, token: &str) -> bool {
        use subtle::ConstantTimeEq;
        !self.record.csrf.is_empty()
            && bool::from(self.record.csrf.as_bytes().ct_eq(token.as_bytes()))
    }
}

/// The digest a session id is kept under.
pub fn digest_of(id: &str) -> String {
    to_hex(&keys::digest(id))
}

/// Why a sign-in did not start a session.
#[derive(Debug)]
pub enum SignInRefused {
    /// Unknown user or wrong password (one answer for both, after the same work).
    Invalid,
    /// Too many failures: try again in this many seconds.
    Limited(u64),
    /// Redis did not answer.
    Unavailable(StoreError),
}

/// Who is signing in, with what, from where.
pub struct SignIn<'a> {
    /// The name as typed (trimmed, lower-cased and cut to 65 characters here).
    pub username: &'a str,
    pub password: String,
    pub ip: &'a str,
}

impl Service {
    /// Creates and stores a signed-in session; returns its id (for the cookie only).
    pub async fn start_session(
        &self,
        (user, role): (Username, Role),
        settings: SessionSettings,
    ) -> Result<(String, Session), StoreError> {
        let id = to_hex(&random_bytes::<32>());
        let digest = digest_of(&id);
        let now = now_ms();
        let record = SessionRecord {
            user: Some(user),
            role: Some(role),
            csrf: to_hex(&random_bytes::<32>()),
            created_ms: now,
            expires_ms: now + settings.absolute.as_millis() as i64,
        };
        self.store
            .create_session(&digest, &record, settings.idle.as_millis() as u64)
            .await?;
        Ok((id, Session { digest, record }))
    }

    /// The live session of id `id`, its idle timeout renewed; `None` when there is none.
    /// Read twice before giving up: one slow answer must not sign anyone out.
    pub async fn touch_session(
        &self,
        id: &str,
        settings: SessionSettings,
    ) -> Result<Option<Session>, StoreError> {
        let digest = digest_of(id);
        let record = self.touch_digest(&digest, settings).await?;
        Ok(record.map(|record| Session { digest, record }))
    }

    /// Whether the session kept under `digest` is still signed in (renewing it).
    pub async fn still_signed_in(&self, digest: &str, settings: SessionSettings) -> bool {
        matches!(self.touch_digest(digest, settings).await, Ok(Some(s)) if s.user.is_some())
    }

    async fn touch_digest(
        &self,
        digest: &str,
        settings: SessionSettings,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let idle = settings.idle.as_millis() as u64;
        match self.store.touch_session(digest, now_ms(), idle).await {
            Ok(record) => Ok(record),
            Err(_) => self.store.touch_session(digest, now_ms(), idle).await,
        }
    }

    /// Signs `attempt` in: charges the sign-in limits first, checks the password (an unknown
    /// user costs the same Argon2 work), forgives the charge when it was right, ends the
    /// session the browser had (`previous`, a digest) and starts a new one. Refusals and the
    /// success are audited.
    pub async fn sign_in(
        &self,
        attempt: SignIn<'_>,
        previous: Option<&str>,
        settings: SessionSettings,
    ) -> Result<(String, Session), SignInRefused> {
        // User names are at most 64 characters; a longer one is wrong, but still charged.
        let attempted: String = attempt
            .username
            .trim()
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !c.is_control())
            .take(65)
            .collect();
        let actor = Actor {
            name: attempted.clone(),
            role: String::new(),
            ip: attempt.ip.to_owned(),
        };
        let charged = self.charge_sign_in(&actor, &attempted).await?;
        let user = match Username::parse(&attempted) {
            Ok(name) => self
                .store
                .get_user(&name)
                .await
                .map_err(SignInRefused::Unavailable)?,
            Err(_) => None,
        };
        let stored_hash = user.as_ref().map(|u| u.password_hash.clone());
        let user = match (password::verify(stored_hash, attempt.password).await, user) {
            (true, Some(user)) => user,
            _ => {
                self.audit(&actor, "login.failure", &attempted).await;
                return Err(SignInRefused::Invalid);
            }
        };
        charged.forgive(self).await;
        if let Some(previous) = previous {
            let _ = self.store.delete_session(previous, None).await;
        }
        let started = self
            .start_session((user.username.clone(), user.role), settings)
            .await
            .map_err(SignInRefused::Unavailable)?;
        let signed_in = Actor {
            name: format!("user:{}", user.username),
            role: user.role.to_string(),
            ip: attempt.ip.to_owned(),
        };
        self.audit(&signed_in, "login.success", user.username.as_str())
            .await;
        Ok(started)
    }

    /// Charges a sign-in attempt before its password is looked at; a refusal for too many
    /// failures is audited.
    async fn charge_sign_in(
        &self,
        actor: &Actor,
        attempted: &str,
    ) -> Result<Attempt, SignInRefused> {
        match Attempt::charge(self, attempted, &actor.ip).await {
            Ok(Charged::Allowed(attempt)) => Ok(attempt),
            Ok(Charged::Invalid) => Err(SignInRefused::Invalid),
            Ok(Charged::Limited(wait_s)) => {
                let _ = actor
                    .record(
                        &self.store,
                        Change {
                            action: "login.limited",
                            target: attempted,
                            reason: "too many failed sign-ins",
                            ..Change::default()
                        },
                    )
                    .await;
                Err(SignInRefused::Limited(wait_s))
            }
            Err(error) => Err(SignInRefused::Unavailable(error)),
        }
    }

    /// Ends `session` and audits the sign-out of its user (`ip`: where the request came
    /// from).
    pub async fn sign_out(&self, session: &Session, ip: &str) -> Result<(), StoreError> {
        self.store
            .delete_session(&session.digest, session.record.user.as_ref())
            .await?;
        if let (Some(user), Some(role)) = (&session.record.user, session.record.role) {
            let actor = Actor {
                name: format!("user:{user}"),
                role: role.to_string(),
                ip: ip.to_owned(),
            };
            self.audit(&actor, "logout", user.as_str()).await;
        }
        Ok(())
    }

    /// Leaves `text` in the session kept under `digest`, for the next read to take once.
    pub async fn set_session_flash(&self, digest: &str, text: &str) -> Result<(), StoreError> {
        self.store.set_session_flash(digest, text).await
    }

    /// The text left in the session kept under `digest`, taken (a second read gets `None`).
    pub async fn take_session_flash(&self, digest: &str) -> Result<Option<String>, StoreError> {
        self.store.take_session_flash(digest).await
    }

    async fn audit(&self, actor: &Actor, action: &'static str, target: &str) {
        let _ = actor
            .record(
                &self.store,
                Change {
                    action,
                    target,
                    ..Change::default()
                },
            )
            .await;
    }
}
