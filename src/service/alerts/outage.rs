//! Redis's outages as the instance lives them: when checks began failing, how many failed,
//! said once when it starts and once when it ends (never per check), and watched by the
//! outage alerts.

use super::*;

/// Since when this instance's checks have failed on Redis (0: they have not), for the
/// `degraded` alerts. Set by the check path, cleared by the next check Redis answers.
///
/// It also writes the log of an outage by its changes of state, not a line per check (in
/// one outage 2,221 failed checks wrote 4,400 WARN lines in 2 s, and the one line that
/// mattered drowned): one WARN when checks start failing, one every 10 s with the count
/// while they go on, one INFO with the total when Redis answers again.
#[derive(Clone, Debug, Default)]
pub struct RedisOutage(Arc<OutageState>);

#[derive(Debug, Default)]
pub(super) struct OutageState {
    since_ms: AtomicI64,
    /// Failed checks since the outage began, and since the last "still failing" line.
    failed: AtomicI64,
    unreported: AtomicI64,
    /// When the last "still failing" line was written.
    reported_ms: AtomicI64,
}

impl RedisOutage {
    /// One check failed on Redis with `error`.
    pub fn failed(&self, now_ms: i64, error: &StoreError) {
        let state = &self.0;
        state.failed.fetch_add(1, Ordering::Relaxed);
        state.unreported.fetch_add(1, Ordering::Relaxed);
        if state
            .since_ms
            .compare_exchange(0, now_ms.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            state.reported_ms.store(now_ms, Ordering::Relaxed);
            state.unreported.store(0, Ordering::Relaxed);
            tracing::warn!(%error, "checks are failing on Redis: each policy answers by its failure mode until Redis answers again");
            return;
        }
        let reported = state.reported_ms.load(Ordering::Relaxed);
        if now_ms - reported >= OUTAGE_LOG_EVERY_MS
            && state
                .reported_ms
                .compare_exchange(reported, now_ms, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let since = state.since_ms.load(Ordering::Relaxed);
            let recent = state.unreported.swap(0, Ordering::Relaxed);
            tracing::warn!(
                %error,
                failed_checks = recent,
                outage_seconds = (now_ms - since) / 1000,
                "checks still failing on Redis"
            );
        }
    }

    /// A check Redis answered.
    pub fn answered(&self) {
        let state = &self.0;
        if state.since_ms.load(Ordering::Acquire) == 0 {
            return;
        }
        let since = state.since_ms.swap(0, Ordering::AcqRel);
        if since != 0 {
            let failed = state.failed.swap(0, Ordering::Relaxed);
            let now = now_ms();
            tracing::info!(
                failed_checks = failed,
                outage_seconds = (now - since) / 1000,
                "Redis answers checks again"
            );
        }
    }

    pub fn since(&self) -> Option<i64> {
        Some(self.0.since_ms.load(Ordering::Acquire)).filter(|s| *s != 0)
    }
}
