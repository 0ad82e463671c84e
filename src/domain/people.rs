//! People and what they may do: roles, user names, and the audit record every change
//! leaves. Pure, so the dashboard shows exactly the controls the server will accept; the
//! server still checks every call itself.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a signed-in person may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, including users and API keys.
    Admin,
    /// View, reset identifiers, manage overrides.
    Support,
    /// Read only.
    Viewer,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Support, Role::Viewer];

    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "admin" => Ok(Role::Admin),
            "support" => Ok(Role::Support),
            "viewer" => Ok(Role::Viewer),
            _ => Err(format!(
                "must be one of admin, support, viewer; got {raw:?}"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Support => "support",
            Role::Viewer => "viewer",
        }
    }

    /// May this role do `action`?
    pub fn may(self, action: Action) -> bool {
        match action {
            Action::View => true,
            Action::ResetIdentifier | Action::ManageOverrides => {
                matches!(self, Role::Admin | Role::Support)
            }
            Action::EditPolicies | Action::ManagePeople => self == Role::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an API key may do: service keys only call the check endpoints; admin keys act as
/// admins on the JSON API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyRole {
    Service,
    Admin,
}

impl KeyRole {
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "service" => Ok(KeyRole::Service),
            "admin" => Ok(KeyRole::Admin),
            _ => Err(format!("must be service or admin; got {raw:?}")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Service => "service",
            KeyRole::Admin => "admin",
        }
    }
}

/// Everything the dashboard lets a person do, for `Role::may`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    View,
    ResetIdentifier,
    ManageOverrides,
    EditPolicies,
    ManagePeople,
}

/// A user name: `[a-z0-9][a-z0-9._-]{0,63}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Username(String);

impl Username {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if !super::is_slug(raw, b"._-") {
            return Err(
                "must be 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
                    .into(),
            );
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Username {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::parse(&raw)
    }
}

impl From<Username> for String {
    fn from(u: Username) -> String {
        u.0
    }
}

impl fmt::Display for Username {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The shortest password accepted.
pub const MIN_PASSWORD_LEN: usize = 12;

/// Checks a new password; the error is shown beside the field.
pub fn validate_password(password: &str) -> Result<(), String> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(format!("must be at least {MIN_PASSWORD_LEN} characters"));
    }
    if password.len() > 1024 {
        return Err("must be at most 1024 bytes".into());
    }
    Ok(())
}

/// One audit record: who did what to what, when, from where and why. `before` and `after`
/// are JSON documents (empty when there is nothing to show).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The stream id (`<ms>-<seq>`); empty before it is written.
    #[serde(default)]
    pub id: String,
    pub time_ms: i64,
    /// `user:<name>`, `key:<name>`, `cli:<os user>` or, for a failed login, the name tried.
    pub actor: String,
    pub role: String,
    /// Dotted verb: `policy.save`, `identifier.reset`, `login.failure`, ...
    pub action: String,
    pub target: String,
    #[serde(default)]
    pub before: String,
    #[serde(default)]
    pub after: String,
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub reason: String,
}

/// What the audit page filters on; empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFilter {
    #[serde(default)]
    pub actor: String,
    #[serde(default)]
    pub action: String,
    /// Only entries at or after this time (ms since the epoch).
    #[serde(default)]
    pub since_ms: Option<i64>,
    /// Only entries at or before this time.
    #[serde(default)]
    pub until_ms: Option<i64>,
}

impl AuditFilter {
    pub fn matches(&self, e: &AuditEntry) -> bool {
        (self.actor.is_empty() || e.actor.contains(self.actor.as_str()))
            && (self.action.is_empty() || e.action.starts_with(self.action.as_str()))
            && self.since_ms.is_none_or(|t| e.time_ms >= t)
            && self.until_ms.is_none_or(|t| e.time_ms <= t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_grant_what_the_spec_says() {
        use Action::*;
        for action in [
            View,
            ResetIdentifier,
            ManageOverrides,
            EditPolicies,
            ManagePeople,
        ] {
            assert!(Role::Admin.may(action));
        }
        assert!(Role::Support.may(ResetIdentifier) && Role::Support.may(ManageOverrides));
        assert!(!Role::Support.may(EditPolicies) && !Role::Support.may(ManagePeople));
        assert!(Role::Viewer.may(View));
        assert!(!Role::Viewer.may(ResetIdentifier) && !Role::Viewer.may(ManageOverrides));
    }

    #[test]
    fn role_names_round_trip_and_bad_ones_are_named() {
        for r in Role::ALL {
            assert_eq!(Role::parse(r.as_str()), Ok(r));
        }
        assert!(
            Role::parse("root")
                .unwrap_err()
                .contains("admin, support, viewer")
        );
    }

    #[test]
    fn usernames_are_checked() {
        assert!(Username::parse("alice.b-2_x").is_ok());
        for bad in ["", "Alice", ".x", "a b", &"a".repeat(65)] {
            assert!(Username::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn short_passwords_are_refused() {
        assert!(validate_password("short").unwrap_err().contains("12"));
        assert!(validate_password("correct horse battery").is_ok());
    }

    #[test]
    fn audit_filter_matches_actor_action_and_time() {
        let e = AuditEntry {
            time_ms: 1000,
            actor: "user:alice".into(),
            action: "identifier.reset".into(),
            ..Default::default()
        };
        assert!(AuditFilter::default().matches(&e));
        let f = |actor: &str, action: &str, since, until| AuditFilter {
            actor: actor.into(),
            action: action.into(),
            since_ms: since,
            until_ms: until,
        };
        assert!(f("alice", "identifier", Some(1000), Some(1000)).matches(&e));
        assert!(!f("bob", "", None, None).matches(&e));
        assert!(!f("", "policy", None, None).matches(&e));
        assert!(!f("", "", Some(1001), None).matches(&e));
        assert!(!f("", "", None, Some(999)).matches(&e));
    }
}
