//! The record of recent checks that what-if replays read: one Redis stream per policy, an
//! entry a check (field `c`, [`Recorded::to_line`]), appended by each instance about once a
//! second, cut to its newest `max` entries (approximately: `MAXLEN ~`) and to the last day,
//! and gone a day after its last check.

use super::{Store, StoreError};
use crate::domain::whatif::Recorded;

/// How long a recorded check is kept (ms).
pub const KEEP_MS: i64 = 24 * 60 * 60 * 1000;

/// Entries read in one call.
const PAGE: usize = 10_000;

impl Store {
    /// Appends `checks` to `policy`'s record, keeping about its newest `max` and the last
    /// day's.
    pub async fn record_checks(
        &self,
        policy: &str,
        checks: &[Recorded],
        max: u64,
    ) -> Result<(), StoreError> {
        if checks.is_empty() || max == 0 {
            return Ok(());
        }
        let key = self.keys.record(policy);
        let mut pipe = redis::pipe();
        for check in checks {
            pipe.cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(max)
                .arg("*")
                .arg("c")
                .arg(check.to_line())
                .ignore();
        }
        let oldest_ms = crate::support::clock::now_ms() - KEEP_MS;
        pipe.cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg("~")
            .arg(oldest_ms.max(0))
            .ignore();
        // A policy no longer checked leaves no record behind.
        pipe.cmd("PEXPIRE").arg(&key).arg(KEEP_MS).ignore();
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// `policy`'s recorded checks since `since_ms`, as recorded (at most `max`, the oldest
    /// first); lines that do not read back are skipped.
    pub async fn recorded_checks(
        &self,
        policy: &str,
        since_ms: i64,
        max: usize,
    ) -> Result<Vec<Recorded>, StoreError> {
        let key = self.keys.record(policy);
        let mut out = Vec::new();
        // Stream ids are Redis's ms at the append, up to a second after the check.
        let mut start = format!("{}", (since_ms - 2_000).max(0));
        while out.len() < max {
            let page: Vec<(String, Vec<(String, String)>)> = self
                .query(
                    redis::cmd("XRANGE")
                        .arg(&key)
                        .arg(&start)
                        .arg("+")
                        .arg("COUNT")
                        .arg(PAGE.min(max - out.len())),
                )
                .await?;
            let Some((last, _)) = page.last() else { break };
            start = format!("({last}");
            let full = page.len() == PAGE.min(max - out.len());
            out.extend(
                page.iter()
                    .flat_map(|(_, fields)| fields.iter())
                    .filter(|(field, _)| field == "c")
                    .filter_map(|(_, line)| Recorded::from_line(line))
                    .filter(|r| r.at_us >= since_ms.saturating_mul(1000)),
            );
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// Drops `policy`'s record (the policy was deleted).
    pub async fn forget_record(&self, policy: &str) -> Result<(), StoreError> {
        let () = self
            .query(redis::cmd("DEL").arg(self.keys.record(policy)))
            .await?;
        Ok(())
    }
}
