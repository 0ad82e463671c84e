//! A circuit breaker in front of Redis: after a few failures in a row, calls fail at once
//! for a short cool-down instead of each waiting for its timeout; then one call probes, and
//! its success closes the circuit again. Callers see `StoreError::CircuitOpen` and answer by
//! the policy's failure mode.
//!
//! "In a row" means one after another: calls out at the same time (the coalescer keeps
//! several out, and other tasks call too) that fail together, a dropped connection or one
//! stall, are one failure. A failure counts only when its call began after the last
//! counted failure, so the circuit opens after three attempts failed, as it did when calls
//! went one at a time, not after one incident that took four calls with it.

use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

/// Consecutive failures that open the circuit.
const THRESHOLD: u32 = 3;

#[derive(Debug)]
pub struct Breaker {
    failures: AtomicU32,
    /// Epoch ms until which calls are refused; 0 when closed.
    open_until_ms: AtomicU64,
    cooldown: Duration,
    /// When the last counted failure was recorded, in µs since `base` (0: none yet).
    last_failure_us: AtomicU64,
    base: Instant,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Breaker {
    pub fn new(cooldown: Duration) -> Self {
        Self {
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            cooldown,
            last_failure_us: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// A call's start, to hand back to `failure` if it fails.
    pub fn started(&self) -> u64 {
        self.base.elapsed().as_micros() as u64 + 1
    }

    /// Whether a call may go to Redis now. While open, only one caller per cool-down gets
    /// through, as the probe.
    pub fn allow(&self) -> bool {
        let until = self.open_until_ms.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = now_ms();
        now >= until
            && self
                .open_until_ms
                .compare_exchange(
                    until,
                    now + self.cooldown.as_millis() as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// A call that began at `started` succeeded. A call begun before the last counted
    /// failure says nothing of Redis since: it neither resets the count nor closes the
    /// circuit (with several calls out, an older call's late success would).
    pub fn success(&self, started: u64) {
        if started < self.last_failure_us.load(Ordering::Acquire) {
            return;
        }
        if self.failures.swap(0, Ordering::AcqRel) != 0 {
            self.open_until_ms.store(0, Ordering::Release);
            crate::telemetry::metrics::breaker_open(false);
        }
    }

    /// A call that began at `started` (from `started`) failed. It counts unless a failure
    /// was counted after it began: then it failed in the same incident.
    pub fn failure(&self, started: u64) {
        let counted =
            self.last_failure_us
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                    (started >= last).then(|| self.started().max(last))
                });
        if counted.is_err() {
            return;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= THRESHOLD {
            self.open_until_ms.store(
                now_ms() + self.cooldown.as_millis() as u64,
                Ordering::Release,
            );
            crate::telemetry::metrics::breaker_open(true);
        }
    }

    pub fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_repeated_failures_and_closes_after_a_successful_probe() {
        let b = Breaker::new(Duration::from_millis(30));
        assert!(b.allow());
        b.failure(b.started());
        b.failure(b.started());
        assert!(b.allow(), "two failures do not open it");
        let older = b.started();
        std::thread::sleep(Duration::from_micros(10));
        b.failure(b.started());
        assert!(!b.allow(), "three do");
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.allow(), "one probe after the cool-down");
        assert!(!b.allow(), "only one");
        b.success(older);
        assert!(
            b.is_open(),
            "a call begun before the last failure does not close it"
        );
        b.success(b.started());
        assert!(b.allow() && !b.is_open());
    }

    #[test]
    fn calls_that_fail_together_are_one_failure() {
        let b = Breaker::new(Duration::from_secs(60));
        // Four calls out at once, failing one after another: one incident.
        let together: Vec<u64> = (0..4).map(|_| b.started()).collect();
        std::thread::sleep(Duration::from_micros(10));
        for started in &together {
            b.failure(*started);
        }
        assert!(b.allow(), "one incident does not open it");
        // Two more attempts, each begun after the last failure, fail: three in a row.
        for _ in 0..2 {
            let started = b.started();
            std::thread::sleep(Duration::from_micros(10));
            b.failure(started);
        }
        assert!(!b.allow(), "three attempts failed one after another");
    }
}
