//! A circuit breaker in front of Redis: after a few failures in a row, calls fail at once
//! for a short cool-down instead of each waiting for its timeout; then one call probes, and
//! its success closes the circuit again. Callers see `StoreError::CircuitOpen` and answer by
//! the policy's failure mode.

use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// Consecutive failures that open the circuit.
const THRESHOLD: u32 = 3;

#[derive(Debug)]
pub struct Breaker {
    failures: AtomicU32,
    /// Epoch ms until which calls are refused; 0 when closed.
    open_until_ms: AtomicU64,
    cooldown: Duration,
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
        }
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

    pub fn success(&self) {
        if self.failures.swap(0, Ordering::AcqRel) != 0 {
            self.open_until_ms.store(0, Ordering::Release);
        }
    }

    pub fn failure(&self) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= THRESHOLD {
            self.open_until_ms.store(
                now_ms() + self.cooldown.as_millis() as u64,
                Ordering::Release,
            );
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
        b.failure();
        b.failure();
        assert!(b.allow(), "two failures do not open it");
        b.failure();
        assert!(!b.allow(), "three do");
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.allow(), "one probe after the cool-down");
        assert!(!b.allow(), "only one");
        b.success();
        assert!(b.allow() && !b.is_open());
    }
}
