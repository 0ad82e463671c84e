//! Managing users and API keys, shared by the dashboard and the command line. Every change
//! writes one audit record; the last admin cannot be removed or demoted.

use serde_json::json;

use super::{keys, password};
use crate::{
    audit::{Actor, Change},
    domain::people::{KeyRole, Role, Username, validate_password},
    store::{
        Store, StoreError,
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

/// Adds a user with `password` (checked for length).
pub async fn add_user(
    store: &Store,
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
        created_at_ms: crate::clock::now_ms(),
    };
    if !store.add_user(&user).await? {
        return Err(PeopleError::Exists(username.to_string()));
    }
    let _ = actor
        .record(
            store,
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

async fn existing(store: &Store, name: &str) -> Result<UserRecord, PeopleError> {
    let username = Username::parse(name.trim()).map_err(|m| invalid("username", m))?;
    store
        .get_user(&username)
        .await?
        .ok_or_else(|| PeopleError::NotFound(username.to_string()))
}

async fn other_admins(store: &Store, except: &Username) -> Result<usize, PeopleError> {
    Ok(store
        .list_users()
        .await?
        .iter()
        .filter(|u| u.role == Role::Admin && &u.username != except)
        .count())
}

/// Sets a new password; ends the user's sessions.
pub async fn set_password(
    store: &Store,
    actor: &Actor,
    name: &str,
    new_password: &str,
) -> Result<(), PeopleError> {
    let mut user = existing(store, name).await?;
    validate_password(new_password).map_err(|m| invalid("password", m))?;
    user.password_hash = password::hash(new_password.to_owned()).await;
    store.update_user(&user).await?;
    let _ = actor
        .record(
            store,
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
pub async fn set_role(
    store: &Store,
    actor: &Actor,
    name: &str,
    role: Role,
) -> Result<(), PeopleError> {
    let mut user = existing(store, name).await?;
    if user.role == Role::Admin
        && role != Role::Admin
        && other_admins(store, &user.username).await? == 0
    {
        return Err(PeopleError::LastAdmin(user.username.to_string()));
    }
    let before = user_view(&user);
    user.role = role;
    store.update_user(&user).await?;
    let _ = actor
        .record(
            store,
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
pub async fn remove_user(store: &Store, actor: &Actor, name: &str) -> Result<(), PeopleError> {
    let user = existing(store, name).await?;
    if user.role == Role::Admin && other_admins(store, &user.username).await? == 0 {
        return Err(PeopleError::LastAdmin(user.username.to_string()));
    }
    store.remove_user(&user.username).await?;
    let _ = actor
        .record(
            store,
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

fn key_view(k: &ApiKeyRecord) -> String {
    json!({ "id": k.id, "name": k.name, "role": k.role, "revoked_at_ms": k.revoked_at_ms })
        .to_string()
}

/// Creates an API key; returns its record and the key itself, which is shown once and
/// never stored.
pub async fn create_key(
    store: &Store,
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
        id: crate::ids::random_hex::<8>(),
        name: name.to_owned(),
        role,
        digest: crate::ids::to_hex(&keys::digest(&secret)),
        created_at_ms: crate::clock::now_ms(),
        created_by: actor.name.clone(),
        revoked_at_ms: None,
        last_used_ms: None,
    };
    store.add_api_key(&record).await?;
    let _ = actor
        .record(
            store,
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
pub async fn revoke_key(store: &Store, actor: &Actor, id: &str) -> Result<(), PeopleError> {
    let before = store
        .revoke_api_key(id.trim(), crate::clock::now_ms())
        .await?
        .ok_or_else(|| PeopleError::NotFound(id.to_owned()))?;
    let mut after = before.clone();
    after.revoked_at_ms.get_or_insert(crate::clock::now_ms());
    let _ = actor
        .record(
            store,
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
