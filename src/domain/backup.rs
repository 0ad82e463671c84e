//! A backup of what Spillway keeps without a TTL, as one document: the policies (each one's
//! current version, its earlier versions and the last version number given to each name),
//! the dashboard's users, the API keys (their digests, never the keys), and the alert rules.
//! Counters, sessions, history and the audit log are not in it: they are measurements, and
//! come back by themselves. Each record is kept as stored (a JSON text), so a restore writes
//! back exactly what was there.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a backup says it is.
pub const FORMAT: &str = "spillway-backup";
/// The version of its layout this build writes and reads.
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    pub format: String,
    pub version: u32,
    /// When it was taken (ms since the epoch).
    pub taken_at_ms: i64,
    /// Policy name → its current version, as stored.
    pub policies: BTreeMap<String, String>,
    /// Policy name → the last version number given to it (deleted policies too).
    pub policy_versions: BTreeMap<String, String>,
    /// Policy name → its earlier versions, newest first.
    pub policy_history: BTreeMap<String, Vec<String>>,
    /// User name → the user's record (its password's hash, never the password).
    pub users: BTreeMap<String, String>,
    /// Key id → the key's record (its digest, never the key).
    pub api_keys: BTreeMap<String, String>,
    /// Alert rule name → the rule.
    pub alert_rules: BTreeMap<String, String>,
}

impl Backup {
    /// Whether it holds nothing an admin made.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
            && self.users.is_empty()
            && self.api_keys.is_empty()
            && self.alert_rules.is_empty()
    }

    /// What it holds, in words: `3 policies, 2 users, 1 API key, 0 alert rules`.
    pub fn summary(&self) -> String {
        let n = |count: usize, one: &str, many: &str| {
            format!("{count} {}", if count == 1 { one } else { many })
        };
        format!(
            "{}, {}, {}, {}",
            n(self.policies.len(), "policy", "policies"),
            n(self.users.len(), "user", "users"),
            n(self.api_keys.len(), "API key", "API keys"),
            n(self.alert_rules.len(), "alert rule", "alert rules"),
        )
    }

    /// Refuses a document that is not a backup this build can restore, naming the field:
    /// another format or version, or a record that is not JSON.
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.format != FORMAT {
            return Err(("format".into(), format!("must be {FORMAT:?}")));
        }
        if self.version != VERSION {
            return Err((
                "version".into(),
                format!("is {}; this build restores version {VERSION}", self.version),
            ));
        }
        let maps = [
            ("policies", &self.policies),
            ("users", &self.users),
            ("api_keys", &self.api_keys),
            ("alert_rules", &self.alert_rules),
        ];
        for (field, map) in maps {
            if let Some(name) = map
                .iter()
                .find(|(_, v)| serde_json::from_str::<serde_json::Value>(v).is_err())
                .map(|(k, _)| k)
            {
                return Err((
                    format!("{field}.{name}"),
                    "is not a stored record (JSON)".into(),
                ));
            }
        }
        Ok(())
    }
}
