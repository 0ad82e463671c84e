//! Writing the audit log: one record per change, with who did it, from where and why.
//! Reading it is the store's `read_audit`; nothing in the app edits or deletes records.

use crate::{domain::people::AuditEntry, store::Store};

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
    pub async fn record(
        &self,
        store: &Store,
        change: Change<'_>,
    ) -> Result<String, crate::store::StoreError> {
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
        crate::traces::record(|| {
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
