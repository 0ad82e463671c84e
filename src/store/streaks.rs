//! Denials as a state (`lua/streaks.lua`): each instance adds what it saw of a denied
//! identifier's checks in the last second; the overview and the inspector read an
//! identifier's streak back. Two hashes per policy at most (this hour's, the last).

use super::{Store, StoreError, stats::now_ms};
use crate::domain::throttle::Streak;

/// What one instance saw of an identifier under a policy in the last second, from its first
/// denial of it on: its checks and denials, the first and last denial (0 when none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreakNote {
    pub identifier: String,
    pub checks: u64,
    pub denials: u64,
    pub first_ms: i64,
    pub last_ms: i64,
}

fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(3_600_000)
}

impl Store {
    /// Adds `notes` to `policy`'s streaks.
    pub async fn add_streaks(&self, policy: &str, notes: &[StreakNote]) -> Result<(), StoreError> {
        if notes.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let hour = hour_of(now);
        let mut invocation = self.scripts.streaks.prepare_invoke();
        invocation
            .key(self.keys.stats_streaks(policy, hour))
            .key(self.keys.stats_streaks(policy, hour - 1))
            .arg(now);
        for n in notes {
            invocation
                .arg(&n.identifier)
                .arg(n.checks)
                .arg(n.denials)
                .arg(n.first_ms)
                .arg(n.last_ms);
        }
        let _: i64 = self.invoke(&invocation).await?;
        Ok(())
    }

    /// Ends `identifier`'s streaks under `policies` (a reset frees it: "blocked over time"
    /// would otherwise outlive it by up to a minute). A later denial starts a new one.
    pub async fn end_streaks(
        &self,
        policies: &[String],
        identifier: &str,
    ) -> Result<(), StoreError> {
        let hour = hour_of(now_ms());
        let mut pipe = redis::pipe();
        for policy in policies {
            for h in [hour, hour - 1] {
                pipe.cmd("HDEL")
                    .arg(self.keys.stats_streaks(policy, h))
                    .arg(identifier)
                    .ignore();
            }
        }
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// The streak of each (policy, identifier) of `of`, the latest known (`None`: no denial in
    /// the last hour or two).
    pub async fn streaks(&self, of: &[(&str, &str)]) -> Result<Vec<Option<Streak>>, StoreError> {
        if of.is_empty() {
            return Ok(Vec::new());
        }
        let hour = hour_of(now_ms());
        let mut pipe = redis::pipe();
        for (policy, identifier) in of {
            for h in [hour, hour - 1] {
                pipe.cmd("HGET")
                    .arg(self.keys.stats_streaks(policy, h))
                    .arg(*identifier);
            }
        }
        let found: Vec<Option<String>> = self.query_pipe(&pipe).await?;
        Ok(found
            .chunks(2)
            .map(|pair| pair.iter().flatten().find_map(|raw| Streak::parse(raw)))
            .collect())
    }
}
