//! Managing users and API keys, shared by the dashboard and the command line, and the first
//! admin of a new install. Every change writes one audit record; the last admin cannot be
//! removed or demoted.

use serde_json::json;

use super::{Service, keys, password};
use crate::{
    domain::people::{KeyRole, Role, Username, validate_password},
    service::audit::{Actor, Change},
    store::{
        StoreError,
        people::{ApiKeyRecord, UserRecord},
    },
};

/// Why a change to users or keys was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("there is already a user named {0}")]
    Exists(String),
    #[error("no user or key named {0}")]
    NotFound(String),
    #[error("{0} is the last admin; make someone else admin first")]
    LastAdmin(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PeopleError {
    /// The form field the problem belongs to, for messages shown beside it.
    pub fn field(&self) -> &'static str {
        match self {
            PeopleError::Invalid { field, .. } => field,
            PeopleError::Exists(_) | PeopleError::NotFound(_) | PeopleError::LastAdmin(_) => {
                "username"
            }
            PeopleError::Store(_) => "",
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> PeopleError {
    PeopleError::Invalid {
        field,
        message: message.into(),
    }
}

fn user_view(u: &UserRecord) -> String {
    json!({ "username": u.username, "role": u.role }).to_string()
}

fn key_view(k: &ApiKeyRecord) -> String {
    json!({ "id": k.id, "name": k.name, "role": k.role, "revoked_at_ms": k.revoked_at_ms })
        .to_string()
}

impl Service {
    /// Adds a user with `password` (checked for length).
    pub async fn add_user(
        &self,
        actor: &Actor,
        name: &str,
        role: Role,
        new_password: &str,
    ) -> Result<UserRecord, PeopleError> {
        let username = Username::parse(name.trim()).map_err(|m| invalid("username", m))?;
        validate_password(new_password).map_err(|m| invalid("password", m))?;
        let user = UserRecord {
            username: username.clone(),
            role,
            password_hash: password::hash(new_password.to_owned()).await,
            created_at_ms: crate::support::clock::now_ms(),
        };
        if !self.store.add_user(&user).await? {
            return Err(PeopleError::Exists(username.to_string()));
        }
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "user.add",
                    target: username.as_str(),
                    after: user_view(&user),
                    ..Change::default()
                },
            )
            .await;
        Ok(user)
    }

    async fn existing(&self, name: &str) -> Result<UserRecord, PeopleError> {
        let username = Username::parse(name.trim()).map_err(|m| invalid("username", m))?;
        self.store
            .get_user(&username)
            .await?
            .ok_or_else(|| PeopleError::NotFound(username.to_string()))
    }

    async fn other_admins(&self, except: &Username) -> Result<usize, PeopleError> {
        Ok(self
            .store
            .list_users()
            .await?
            .iter()
            .filter(|u| u.role == Role::Admin && &u.username != except)
            .count())
    }

    /// Sets a new password; ends the user's sessions.
    pub async fn set_password(
        &self,
        actor: &Actor,
        name: &str,
        new_password: &str,
    ) -> Result<(), PeopleError> {
        let mut user = self.existing(name).await?;
        validate_password(new_password).map_err(|m| invalid("password", m))?;
        user.password_hash = password::hash(new_password.to_owned()).await;
        self.store.update_user(&user).await?;
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "user.set-password",
                    target: user.username.as_str(),
                    ..Change::default()
                },
            )
            .await;
        Ok(())
    }

    /// Changes a user's role; ends their sessions so the new role applies at once.
    pub async fn set_role(&self, actor: &Actor, name: &str, role: Role) -> Result<(), PeopleError> {
        let mut user = self.existing(name).await?;
        if user.role == Role::Admin
            && role != Role::Admin
            && self.other_admins(&user.username).await? == 0
        {
            return Err(PeopleError::LastAdmin(user.username.to_string()));
        }
        let before = user_view(&user);
        user.role = role;
        self.store.update_user(&user).await?;
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "user.set-role",
                    target: user.username.as_str(),
                    before,
                    after: user_view(&user),
                    ..Change::default()
                },
            )
            .await;
        Ok(())
    }

    /// Removes a user and ends their sessions.
    pub async fn remove_user(&self, actor: &Actor, name: &str) -> Result<(), PeopleError> {
        let user = self.existing(name).await?;
        if user.role == Role::Admin && self.other_admins(&user.username).await? == 0 {
            return Err(PeopleError::LastAdmin(user.username.to_string()));
        }
        self.store.remove_user(&user.username).await?;
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "user.remove",
                    target: user.username.as_str(),
                    before: user_view(&user),
                    ..Change::default()
                },
            )
            .await;
        Ok(())
    }

    /// Creates an API key; returns its record and the key itself, which is shown once and
    /// never stored.
    pub async fn create_key(
        &self,
        actor: &Actor,
        name: &str,
        role: KeyRole,
    ) -> Result<(ApiKeyRecord, String), PeopleError> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
            return Err(invalid(
                "name",
                "must be 1 to 64 characters without control characters",
            ));
        }
        let prefix = match role {
            KeyRole::Service => "spw_svc",
            KeyRole::Admin => "spw_adm",
        };
        let secret = keys::generate_key(prefix);
        let record = ApiKeyRecord {
            id: crate::support::ids::random_hex::<8>(),
            name: name.to_owned(),
            role,
            digest: crate::support::ids::to_hex(&keys::digest(&secret)),
            created_at_ms: crate::support::clock::now_ms(),
            created_by: actor.name.clone(),
            revoked_at_ms: None,
            last_used_ms: None,
        };
        self.store.add_api_key(&record).await?;
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "key.create",
                    target: &record.id,
                    after: key_view(&record),
                    ..Change::default()
                },
            )
            .await;
        Ok((record, secret))
    }

    /// Revokes an API key: every instance refuses it within a poll interval (250 ms).
    pub async fn revoke_key(&self, actor: &Actor, id: &str) -> Result<(), PeopleError> {
        let before = self
            .store
            .revoke_api_key(id.trim(), crate::support::clock::now_ms())
            .await?
            .ok_or_else(|| PeopleError::NotFound(id.to_owned()))?;
        let mut after = before.clone();
        after
            .revoked_at_ms
            .get_or_insert(crate::support::clock::now_ms());
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "key.revoke",
                    target: &before.id,
                    before: key_view(&before),
                    after: key_view(&after),
                    ..Change::default()
                },
            )
            .await;
        Ok(())
    }

    /// Every user, by name.
    pub async fn users(&self) -> Result<Vec<UserRecord>, StoreError> {
        self.store.list_users().await
    }

    /// Every API key, revoked ones too.
    pub async fn api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        self.store.list_api_keys().await
    }

    /// Creates the user `admin` with a random password when there are no users at all;
    /// returns the name and password to show once. Several instances starting together create
    /// it once (HSETNX).
    pub async fn ensure_first_admin(
        &self,
        given: Option<&str>,
    ) -> Result<Option<(String, String)>, StoreError> {
        if !self.store.list_users().await?.is_empty() {
            return Ok(None);
        }
        let password = given.map_or_else(password::generate_password, str::to_owned);
        let user = UserRecord {
            username: Username::parse("admin").expect("a valid name"),
            role: Role::Admin,
            password_hash: password::hash(password.clone()).await,
            created_at_ms: crate::support::clock::now_ms(),
        };
        if !self.store.add_user(&user).await? {
            return Ok(None);
        }
        let _ = Actor {
            name: "system".into(),
            role: "system".into(),
            ip: String::new(),
        }
        .record(
            &self.store,
            Change {
                action: "user.add",
                target: "admin",
                after: user_view(&user),
                reason: "first start",
                ..Default::default()
            },
        )
        .await;
        Ok(Some(("admin".into(), password)))
    }

    /// [`Service::ensure_first_admin`], with the password `first` says (from a Secret), or
    /// a random one shown once where only its reader sees it: on the terminal when there
    /// is one, otherwise in a file of mode 0600 whose path is logged (a log is read by more
    /// people than the admin, and kept). Never in the log.
    pub(super) async fn announce_first_admin(&self, first: &crate::config::FirstAdmin) {
        use std::io::IsTerminal;
        let (user, password) = match self.ensure_first_admin(first.password.as_deref()).await {
            Ok(Some(created)) => created,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, "could not check for a first admin");
                return;
            }
        };
        // Loud: a Redis that lost Spillway's state (restarted without persistence, flushed,
        // evicted) looks like a first start.
        tracing::warn!(
            "Redis holds no users: made the first admin. If this Redis held Spillway's users and policies before, they are gone: restore them with `spillway restore <backup>` (docs/operations.md, \"Redis for production\")"
        );
        if first.password.is_some() {
            tracing::info!(%user, "first start: created the admin user with the password of SPILLWAY_FIRST_ADMIN_PASSWORD");
        } else if std::io::stdout().is_terminal() {
            println!(
                "\n  First start: created the admin user {user:?} with password\n\n      {password}\n\n  Sign in at the dashboard and keep it safe; it is not shown again.\n  Change it with `spillway user set-password {user}`.\n"
            );
        } else {
            match write_secret(&first.password_file, &password) {
                Ok(()) => tracing::info!(
                    %user,
                    file = %first.password_file.display(),
                    "first start: created the admin user; its password is in the file (mode 0600, read it once and delete it)"
                ),
                Err(error) => tracing::warn!(
                    %user,
                    file = %first.password_file.display(),
                    %error,
                    "first start: created the admin user, but could not write its password; set one with `spillway user set-password admin`"
                ),
            }
        }
    }

    /// Changes `user`'s own password after checking `current`. Guessing the current
    /// password is limited as signing in is (and counts with it); a right guess is forgiven.
    pub async fn change_own_password(
        &self,
        actor: &Actor,
        user: &Username,
        current: String,
        new_password: &str,
    ) -> Result<(), OwnPasswordRefused> {
        use super::signin::{Attempt, Charged};
        let attempt = match Attempt::charge(self, user.as_str(), &actor.ip).await? {
            Charged::Allowed(attempt) => attempt,
            Charged::Limited(wait_s) => return Err(OwnPasswordRefused::Limited(wait_s)),
            Charged::Invalid => return Err(OwnPasswordRefused::WrongPassword),
        };
        let record = self
            .store
            .get_user(user)
            .await?
            .ok_or(OwnPasswordRefused::NoSuchUser)?;
        if !password::verify(Some(record.password_hash), current).await {
            return Err(OwnPasswordRefused::WrongPassword);
        }
        attempt.forgive(self).await;
        self.set_password(actor, user.as_str(), new_password)
            .await
            .map_err(OwnPasswordRefused::Refused)
    }
}

/// Why a person's change of their own password was refused.
#[derive(Debug, thiserror::Error)]
pub enum OwnPasswordRefused {
    #[error("is not your current password")]
    WrongPassword,
    #[error("too many wrong passwords; try again in {0} seconds")]
    Limited(u64),
    #[error("this user no longer exists")]
    NoSuchUser,
    #[error(transparent)]
    Refused(PeopleError),
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// Writes `secret` to a new file at `path` that only this user may read (0600), replacing
/// an older one.
fn write_secret(path: &std::path::Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{secret}")
}
