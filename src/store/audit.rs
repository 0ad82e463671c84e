//! The audit log in Redis: a stream under `{audit}` that nothing here trims or edits;
//! Redis's clock stamps each record, so records from every instance are in one order.

use super::{Store, StoreError};
use crate::domain::people::{AuditEntry, AuditFilter};

impl Store {
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
        // Within the write timeout, as the change it records: a change saved within 5 s
        // must not lose its record to the 50 ms a check has.
        self.query_for_write(&cmd).await
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
