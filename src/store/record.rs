//! The record of recent checks that what-if replays read: one Redis stream per policy, an
//! entry a check (field `c`, [`Recorded::to_line`]), appended by each instance about once a
//! second, cut to its newest `max` entries (approximately: `MAXLEN ~`) and to the last day,
//! and gone a day after its last check. Beside it, how many checks of the policy the
//! instances saw in each ten seconds, which sets the level its record samples at
//! (`domain::whatif::sample`).

use super::{Store, StoreError};
use crate::domain::whatif::Recorded;

/// How long a recorded check is kept (ms).
pub const KEEP_MS: i64 = 24 * 60 * 60 * 1000;

/// Entries read in one call.
const PAGE: usize = 10_000;

/// The period whose count of checks sets a record's level (ms).
pub const RATE_PERIOD_MS: i64 = 10_000;

impl Store {
    /// Appends `checks` to `policy`'s record, keeping about its newest `max` and the last
    /// day's; adds `seen` (the checks of it this instance saw, recorded or not) to this ten
    /// seconds' count, and says the count of the ten seconds before (all instances').
    pub async fn record_checks(
        &self,
        policy: &str,
        checks: &[Recorded],
        seen: u64,
        max: u64,
    ) -> Result<u64, StoreError> {
        if max == 0 {
            return Ok(0);
        }
        let key = self.keys.record(policy);
        let mut pipe = redis::pipe();
        let now_ms = crate::support::clock::now_ms();
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
        if !checks.is_empty() {
            pipe.cmd("XTRIM")
                .arg(&key)
                .arg("MINID")
                .arg("~")
                .arg((now_ms - KEEP_MS).max(0))
                .ignore();
            // A policy no longer checked leaves no record behind.
            pipe.cmd("PEXPIRE").arg(&key).arg(KEEP_MS).ignore();
        }
        let bucket = now_ms - now_ms.rem_euclid(RATE_PERIOD_MS);
        let rate = self.keys.record_rate(policy, bucket);
        pipe.cmd("INCRBY").arg(&rate).arg(seen).ignore();
        pipe.cmd("PEXPIRE")
            .arg(&rate)
            .arg(3 * RATE_PERIOD_MS)
            .ignore();
        pipe.cmd("GET")
            .arg(self.keys.record_rate(policy, bucket - RATE_PERIOD_MS));
        let (before,): (Option<u64>,) = self.query_pipe(&pipe).await?;
        Ok(before.unwrap_or(0))
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
