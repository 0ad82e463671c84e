//! The audit log: writing one record per change (who did it, from where and why) and
//! reading it with the filters the audit page and the admin API share: actor,
//! action (a prefix), a UTC time range to the minute, and paging from a record id.

use super::Service;
use crate::{
    domain::{
        people::{AuditEntry, AuditFilter},
        time::parse_utc,
    },
    store::StoreError,
};

/// Who is acting: a signed-in person, an API key or the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Actor {
    /// `user:<name>`, `key:<name>`, `cli:<os user>`, or the user name a failed login tried.
    pub name: String,
    pub role: String,
    pub ip: String,
}

/// What one change did: `before` and `after` are JSON (or empty).
#[derive(Clone, Debug, Default)]
pub struct Change<'a> {
    pub action: &'a str,
    pub target: &'a str,
    pub before: String,
    pub after: String,
    pub reason: &'a str,
}

impl Actor {
    /// Appends the record. A failure is logged and returned: the change itself already
    /// happened, and the caller decides whether to report it.
    pub(in crate::service) async fn record(
        &self,
        store: &crate::store::Store,
        change: Change<'_>,
    ) -> Result<String, StoreError> {
        let entry = AuditEntry {
            id: String::new(),
            time_ms: 0,
            actor: self.name.clone(),
            role: self.role.clone(),
            action: change.action.to_owned(),
            target: change.target.to_owned(),
            before: change.before,
            after: change.after,
            ip: self.ip.clone(),
            reason: change.reason.to_owned(),
        };
        // The request's span (with traces on) says which admin action it was.
        crate::telemetry::traces::record(|| {
            use opentelemetry::KeyValue;
            vec![
                KeyValue::new("spillway.action", entry.action.clone()),
                KeyValue::new("spillway.target", entry.target.clone()),
                KeyValue::new("spillway.actor", entry.actor.clone()),
            ]
        });
        let written = store.append_audit(&entry).await;
        if let Err(error) = &written {
            tracing::error!(%error, action = change.action, target = change.target, actor = %self.name,
                "could not write an audit record");
        }
        written
    }
}

/// The filters as a person or a client writes them (empty: no filter).
#[derive(Clone, Debug, Default)]
pub struct AuditQuery<'a> {
    pub actor: &'a str,
    pub action: &'a str,
    /// From this UTC time (`2026-11-22 10:58`).
    pub since: &'a str,
    /// Up to the end of this UTC minute.
    pub until: &'a str,
    /// Only records older than this record id (`<ms>-<seq>`).
    pub before: &'a str,
}

/// A page of the log: its records, newest first, and the id to page on from when there may
/// be older ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    pub older: Option<String>,
}

/// Why the log was not read.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

impl Service {
    /// Up to `page` records matching `query`, newest first.
    pub async fn read_audit(
        &self,
        query: &AuditQuery<'_>,
        page: usize,
    ) -> Result<AuditPage, AuditError> {
        let time = |field: &'static str, raw: &str| -> Result<Option<i64>, AuditError> {
            match raw.trim() {
                "" => Ok(None),
                raw => parse_utc(raw)
                    .map(Some)
                    .map_err(|message| AuditError::Invalid { field, message }),
            }
        };
        let filter = AuditFilter {
            actor: query.actor.trim().to_owned(),
            action: query.action.trim().to_owned(),
            since_ms: time("since", query.since)?,
            until_ms: time("until", query.until)?.map(|t| t + 59_999),
        };
        let before = query.before.trim();
        let id = before
            .split_once('-')
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
        if !before.is_empty() && id.is_none() {
            return Err(AuditError::Invalid {
                field: "before",
                message: "is not a record id (<milliseconds>-<sequence>)".into(),
            });
        }
        // Nothing is older than the first id there can be (Redis refuses a range below it).
        if id == Some((0, 0)) {
            return Ok(AuditPage {
                entries: Vec::new(),
                older: None,
            });
        }
        let entries = self
            .store
            .read_audit(&filter, page, (!before.is_empty()).then_some(before))
            .await?;
        let older = (entries.len() == page).then(|| entries[page - 1].id.clone());
        // Every role reads the log: alert rules' webhook URLs (often credentials) show as
        // their host, in records written before they were cut too.
        let mut entries = entries;
        for entry in entries
            .iter_mut()
            .filter(|e| e.action.starts_with("alert."))
        {
            for document in [&mut entry.before, &mut entry.after] {
                if let Some(redacted) = super::alerts::redact_audited(document) {
                    *document = redacted;
                }
            }
        }
        Ok(AuditPage { entries, older })
    }
}

impl Service {
    /// When each policy was last changed, as far as the newest `records` records of the
    /// audit log tell (saves, rollbacks, overrides, Envoy files, imports).
    pub async fn policy_changes(
        &self,
        records: usize,
    ) -> Result<std::collections::HashMap<String, i64>, StoreError> {
        let entries = self
            .store
            .read_audit(&AuditFilter::default(), records, None)
            .await?;
        let mut out = std::collections::HashMap::new();
        for e in entries {
            let changes_policies = ["policy.", "override.", "envoy."]
                .iter()
                .any(|p| e.action.starts_with(p));
            if changes_policies {
                for name in e.target.split(',') {
                    out.entry(name.trim().to_owned()).or_insert(e.time_ms);
                }
            }
        }
        Ok(out)
    }
}
