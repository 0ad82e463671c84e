//! A circuit breaker: after `failures` calls in a row that found Spillway unavailable (a
//! network error, a timeout, a 5xx, an answer that is not Spillway's), no call is made for
//! `period`; then one trial call goes through, whose success closes the breaker and whose
//! failure opens it for another period.
//!
//! While Spillway hangs, every call would otherwise wait out the whole timeout; with the
//! breaker a hung Spillway costs one timeout per period, and every other call is answered at
//! once (as the failure mode says). [`State`] is the bookkeeping, with time as a parameter;
//! [`Breaker`] shares it between a client's clones and [`Permit`] settles each call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::cause::millis;

/// When the breaker opens, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Unavailable calls in a row that open it; 0: never.
    pub failures: u32,
    pub period: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    in_a_row: u32,
    /// The last failure's cause, said while the breaker is open.
    last: String,
    open_until: Option<Instant>,
    /// A trial call is under way.
    trial: bool,
}

impl State {
    /// Before a call: `Ok(true)` for the trial that decides whether the breaker closes,
    /// `Ok(false)` for a call through a closed breaker, `Err` why no call may be made.
    pub(crate) fn enter(&mut self, now: Instant) -> Result<bool, String> {
        let Some(until) = self.open_until else {
            return Ok(false);
        };
        let open = format!(
            "circuit breaker open after {} unavailable calls in a row (the last: {})",
            self.in_a_row, self.last
        );
        if until > now {
            return Err(format!(
                "{open}; not calling Spillway for another {}",
                millis(until - now)
            ));
        }
        if self.trial {
            return Err(format!("{open}; a trial call is under way"));
        }
        self.trial = true;
        Ok(true)
    }

    /// Spillway answered (anything but a 5xx). True when that closed the breaker.
    pub(crate) fn succeeded(&mut self) -> bool {
        let was_open = self.open_until.is_some();
        *self = Self::default();
        was_open
    }

    /// Spillway was unavailable to a call. True when that opened the breaker: the
    /// `failures`th in a row, or a failed trial.
    pub(crate) fn failed(
        &mut self,
        trial: bool,
        reason: &str,
        now: Instant,
        settings: Settings,
    ) -> bool {
        self.in_a_row = self.in_a_row.saturating_add(1);
        reason.clone_into(&mut self.last);
        if trial {
            self.trial = false;
        } else if settings.failures == 0
            || self.open_until.is_some()
            || self.in_a_row < settings.failures
        {
            // A call made before the breaker opened, failing late, does not extend it.
            return false;
        }
        self.open_until = Some(now + settings.period);
        true
    }

    /// The call ended with neither (it was dropped): the next call may be the trial.
    pub(crate) fn abandoned(&mut self, trial: bool) {
        if trial {
            self.trial = false;
        }
    }
}

/// A breaker shared by a client's clones.
#[derive(Debug)]
pub(crate) struct Breaker {
    pub(crate) settings: Settings,
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new(settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            settings,
            state: Mutex::default(),
        })
    }

    /// A permit to call Spillway, or why not (the breaker is open).
    pub(crate) fn enter(self: &Arc<Self>) -> Result<Permit, String> {
        let trial = self.state.lock().unwrap().enter(Instant::now())?;
        Ok(Permit {
            breaker: self.clone(),
            trial,
            settled: false,
        })
    }
}

/// One call through the breaker; settle it with what Spillway did. Dropped unsettled (the
/// call was cancelled) it counts for nothing, and frees the trial.
pub(crate) struct Permit {
    breaker: Arc<Breaker>,
    trial: bool,
    settled: bool,
}

impl Permit {
    pub(crate) fn succeeded(mut self) {
        self.settled = true;
        if self.breaker.state.lock().unwrap().succeeded() {
            tracing::info!("Spillway answered again: circuit breaker closed");
        }
    }

    pub(crate) fn failed(mut self, reason: &str) {
        self.settled = true;
        let settings = self.breaker.settings;
        let mut state = self.breaker.state.lock().unwrap();
        if state.failed(self.trial, reason, Instant::now(), settings) {
            tracing::warn!(
                failures = state.in_a_row,
                period = %millis(settings.period),
                reason,
                "circuit breaker open: no call to Spillway for the period, checks answered as the failure mode says"
            );
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.settled {
            self.breaker.state.lock().unwrap().abandoned(self.trial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: Settings = Settings {
        failures: 3,
        period: Duration::from_secs(5),
    };

    /// One step of a table: at `t` seconds, a call enters (what it is allowed) and ends.
    enum Step {
        /// A call that fails; `Ok(trial)` or the breaker refused it.
        Fails(Result<bool, ()>),
        Succeeds(Result<bool, ()>),
        /// Only enters, refused.
        Refused,
    }

    #[test]
    fn the_breaker_opens_after_n_failures_refuses_for_its_period_then_tries_once() {
        use Step::*;
        let start = Instant::now();
        let table: &[(u64, Step)] = &[
            (0, Fails(Ok(false))),
            (0, Succeeds(Ok(false))), // a success resets the run
            (1, Fails(Ok(false))),
            (1, Fails(Ok(false))),
            (1, Fails(Ok(false))), // the third in a row: open until 6
            (2, Refused),
            (5, Refused),
            (6, Fails(Ok(true))), // the trial fails: open until 11
            (7, Refused),
            (10, Refused),
            (11, Succeeds(Ok(true))), // the trial succeeds: closed
            (11, Fails(Ok(false))),
            (11, Succeeds(Ok(false))),
        ];
        let mut state = State::default();
        for (i, (t, step)) in table.iter().enumerate() {
            let now = start + Duration::from_secs(*t);
            let entered = state.enter(now).map_err(|_| ());
            match step {
                Fails(expected) => {
                    assert_eq!(&entered, expected, "step {i}");
                    if let Ok(trial) = entered {
                        state.failed(trial, "timed out", now, SETTINGS);
                    }
                }
                Succeeds(expected) => {
                    assert_eq!(&entered, expected, "step {i}");
                    if entered.is_ok() {
                        state.succeeded();
                    }
                }
                Refused => assert_eq!(entered, Err(()), "step {i}"),
            }
        }
    }

    #[test]
    fn one_trial_at_a_time_and_a_dropped_trial_frees_the_next() {
        let start = Instant::now();
        let mut state = State::default();
        for _ in 0..3 {
            state.failed(false, "refused", start, SETTINGS);
        }
        let later = start + SETTINGS.period;
        assert_eq!(state.enter(later), Ok(true));
        let second = state.enter(later).unwrap_err();
        assert!(second.contains("a trial call is under way"), "{second}");
        assert!(second.contains("the last: refused"), "{second}");
        state.abandoned(true);
        assert_eq!(state.enter(later), Ok(true));
    }

    #[test]
    fn a_late_failure_of_a_call_made_before_the_breaker_opened_does_not_extend_it() {
        let start = Instant::now();
        let mut state = State::default();
        for _ in 0..3 {
            state.failed(false, "x", start, SETTINGS);
        }
        assert!(!state.failed(false, "x", start + Duration::from_secs(4), SETTINGS));
        assert_eq!(state.enter(start + SETTINGS.period), Ok(true));
    }

    #[test]
    fn no_failures_opens_a_breaker_of_zero() {
        let off = Settings {
            failures: 0,
            ..SETTINGS
        };
        let mut state = State::default();
        for _ in 0..100 {
            assert!(!state.failed(false, "x", Instant::now(), off));
            assert_eq!(state.enter(Instant::now()), Ok(false));
        }
    }
}
