//! Leases of concurrency rules outside a check: releasing and renewing them by id, and
//! listing an identifier's (the inspector). The check takes them (`lua/concurrency.lua`);
//! `lua/leases.lua` releases and renews, in one call on a single Redis.

use redis::Script;

use super::{Store, StoreError};
use crate::domain::{Identifier, Name, lease::LeaseId};

pub(super) fn script() -> Script {
    Script::new(
        &[
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/leases.lua"),
        ]
        .join("\n"),
    )
}

/// Most leases the inspector lists per rule (a rule may hold up to 100,000): those that
/// ran out but were not reclaimed yet come first in the set, so a few more are read.
pub const LISTED: usize = 50;

/// A lease as its rule's set holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLease {
    pub token: u64,
    pub cost: u64,
    pub taken_us: i64,
    pub expires_us: i64,
}

/// A lease's member in its rule's sorted set, `<token>:<cost>:<taken µs>` (as
/// `lua/concurrency.lua` writes it).
fn member(lease: &LeaseId) -> String {
    format!("{}:{}:{}", lease.token, lease.cost, lease.taken_us)
}

/// A member read back, with its score (when it runs out).
fn held(member: &str, expires_us: i64) -> Option<HeldLease> {
    let mut parts = member.splitn(3, ':');
    Some(HeldLease {
        token: parts.next()?.parse().ok()?,
        cost: parts.next()?.parse().ok()?,
        taken_us: parts.next()?.parse().ok()?,
        expires_us,
    })
}

impl Store {
    /// Releases each lease; whether each was held (releasing twice is harmless).
    pub async fn release_leases(&self, leases: &[LeaseId]) -> Result<Vec<bool>, StoreError> {
        let replies = self
            .lease_calls("release", leases.iter().map(|l| (l, None)))
            .await?;
        Ok(replies.into_iter().map(|r| r == 1).collect())
    }

    /// Renews each lease by its `lease_ms` from now: the milliseconds until each runs out,
    /// or `None` for one no longer held.
    pub async fn renew_leases(
        &self,
        leases: &[(LeaseId, u64)],
    ) -> Result<Vec<Option<u64>>, StoreError> {
        let replies = self
            .lease_calls("renew", leases.iter().map(|(l, ms)| (l, Some(*ms))))
            .await?;
        Ok(replies.into_iter().map(|r| u64::try_from(r).ok()).collect())
    }

    /// One script call for every lease on a single Redis; one per lease on a cluster
    /// (each identifier is its own slot).
    async fn lease_calls<'a>(
        &self,
        mode: &str,
        leases: impl Iterator<Item = (&'a LeaseId, Option<u64>)>,
    ) -> Result<Vec<i64>, StoreError> {
        let leases: Vec<_> = leases.collect();
        let per_call = if self.is_cluster() {
            1
        } else {
            leases.len().max(1)
        };
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(per_call) {
            let script = &self.scripts.leases;
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.get_hash()).arg(chunk.len());
            for (lease, _) in chunk {
                cmd.arg(
                    self.keys
                        .leases(&lease.policy, &lease.identifier, &lease.rule),
                );
            }
            cmd.arg(mode).arg("");
            for (lease, ms) in chunk {
                cmd.arg(member(lease)).arg(lease.cost);
                if let Some(ms) = ms {
                    cmd.arg(*ms);
                }
            }
            let replies: Vec<i64> = self.evalsha(script, &cmd).await?;
            out.extend(replies);
        }
        Ok(out)
    }

    /// The leases `rule` of `policy` holds for `identifier` that have not run out, the
    /// [`LISTED`] soonest to run out, and Redis's time (µs) they were read at.
    pub async fn leases_of(
        &self,
        policy: &Name,
        identifier: &Identifier,
        rule: &Name,
    ) -> Result<(i64, Vec<HeldLease>), StoreError> {
        let key = self.keys.leases(policy, identifier, rule);
        let (time, members): ((i64, i64), Vec<(String, f64)>) = {
            let mut pipe = redis::pipe();
            pipe.cmd("TIME")
                .cmd("ZRANGE")
                .arg(&key)
                .arg("(0")
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(LISTED)
                .arg("WITHSCORES");
            self.query_pipe(&pipe).await?
        };
        let now = time.0 * 1_000_000 + time.1;
        let leases = members
            .into_iter()
            .filter(|(_, expires)| *expires as i64 > now)
            .filter_map(|(member, expires)| held(&member, expires as i64))
            .collect();
        Ok((now, leases))
    }
}
