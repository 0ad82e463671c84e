//! Local counting (`sync: local`): an instance answers a rule's checks from its own counter
//! and adds what it admitted to Redis every `flush_ms`, learning the other instances' totals
//! in the same call.
//!
//! The counter holds what Redis said at the last flush (what was left of the rule for this
//! identifier) and what this instance admitted since. A check is allowed while what it
//! admitted since, plus the check, fits in what was left. So one instance alone never
//! overshoots; instances together can, because each spends the same "left" before it hears
//! of the others.
//!
//! **The bound.** Take N instances, and a the most one instance admits for one identifier
//! in one flush period (its share of the load × `flush_ms`, at most the rule's limit). Each
//! instance admits at most a before it flushes and learns the others' counts, and the first
//! of them is within the limit, so what all admit beyond the limit is at most
//! `(N − 1) × a` per flush period. Rules that refill (buckets, GCRA, sliding windows) only
//! hand out refills at a flush, so between flushes an instance never admits more than the
//! exact rule would have.
//!
//! Time is the instance's clock, ms; Redis's answers carry durations, never instants.

use super::{Outcome, rule::Algorithm};

/// One rule × identifier as one instance counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalCounter {
    /// The rule's limit, as Redis answered it.
    limit: u64,
    /// What was left in Redis at the last flush, every instance's counts included.
    remaining: u64,
    /// When the rule was full again, as of the last flush (ms on this instance's clock).
    full_at_ms: i64,
    /// When the last flush answered (ms on this instance's clock).
    synced_at_ms: i64,
    /// Admitted here since the last flush's answer was taken (reservations included).
    used: u64,
    /// Admitted here and not sent to Redis yet.
    unsent: u64,
    /// Sent by the flush now on its way, not yet answered.
    in_flight: u64,
}

impl LocalCounter {
    /// A counter seeded from Redis's answer to a peek (or a flush) at `now_ms`.
    pub fn seeded(answer: &Outcome, now_ms: i64) -> Self {
        let mut counter = Self {
            limit: answer.limit,
            remaining: 0,
            full_at_ms: now_ms,
            synced_at_ms: now_ms,
            used: 0,
            unsent: 0,
            in_flight: 0,
        };
        counter.learn(answer, now_ms);
        counter
    }

    /// When the last flush answered (ms on this instance's clock).
    pub fn synced_at_ms(&self) -> i64 {
        self.synced_at_ms
    }

    /// What it admitted and has not sent to Redis yet.
    pub fn unsent(&self) -> u64 {
        self.unsent
    }

    /// Takes on what a counter it replaces (its rule changed) admitted and had not sent:
    /// sent with its next flush, and counted against what is left.
    pub fn carry(&mut self, unsent: u64) {
        self.used = self.used.saturating_add(unsent);
        self.unsent = self.unsent.saturating_add(unsent);
    }

    fn learn(&mut self, answer: &Outcome, now_ms: i64) {
        self.limit = answer.limit;
        self.remaining = answer.remaining;
        self.full_at_ms = now_ms.saturating_add(answer.reset_ms.min(i64::MAX as u64) as i64);
        self.synced_at_ms = now_ms;
    }

    /// What this instance may still admit before the next flush.
    pub fn budget(&self) -> u64 {
        self.remaining.saturating_sub(self.used)
    }

    /// What a check of `cost` gets now, without taking anything: allowed when it fits in the
    /// budget. A denial's wait is what the rule needs to give `cost` back (`algorithm`),
    /// at least 1 ms; `None` when the cost is more than the rule ever admits.
    pub fn outcome(&self, algorithm: &Algorithm, cost: u64, now_ms: i64) -> Outcome {
        let budget = self.budget();
        let reset_ms = (self.full_at_ms - now_ms).max(0) as u64;
        let allowed = cost <= budget;
        let retry_after_ms = (!allowed && cost <= algorithm.max_admissible())
            .then(|| give_back_ms(algorithm, cost, reset_ms).max(1));
        Outcome {
            allowed,
            limit: self.limit,
            remaining: if allowed { budget - cost } else { budget },
            reset_ms,
            retry_after_ms,
            delay_ms: 0,
            penalty: false,
        }
    }

    /// Holds `cost` for a check whose other entries are still being decided.
    pub fn reserve(&mut self, cost: u64) {
        self.used = self.used.saturating_add(cost);
    }

    /// Lets go of a reservation: the check was denied elsewhere.
    pub fn release(&mut self, cost: u64) {
        self.used = self.used.saturating_sub(cost);
    }

    /// Counts `cost` as admitted here (after [`LocalCounter::reserve`]), to be sent to Redis.
    pub fn commit(&mut self, cost: u64) {
        self.unsent = self.unsent.saturating_add(cost);
    }

    /// Counts a denied check of a rule that counts denials: in Redis, and here as used.
    pub fn count_denied(&mut self, cost: u64) {
        self.reserve(cost);
        self.commit(cost);
    }

    /// Starts a flush: what it sends. At most one flush is on its way per counter (its
    /// caller's to keep); were another started, the two would go as one.
    pub fn start_flush(&mut self) -> u64 {
        let sent = std::mem::take(&mut self.unsent);
        self.in_flight = self.in_flight.saturating_add(sent);
        sent
    }

    /// The flush was answered at `now_ms`: Redis holds what it sent, and says what is left
    /// with every instance's counts in. What was admitted meanwhile stays used.
    pub fn flushed(&mut self, answer: &Outcome, now_ms: i64) {
        self.used = self
            .used
            .saturating_sub(std::mem::take(&mut self.in_flight));
        self.learn(answer, now_ms);
    }

    /// The flush failed: what it carried is sent with the next one.
    pub fn flush_failed(&mut self) {
        self.unsent = self
            .unsent
            .saturating_add(std::mem::take(&mut self.in_flight));
    }

    /// Whether it still answers at `now_ms`: within `grace_ms` of the last flush that
    /// reached Redis. Past that, Redis has been unreachable too long and the policy's failure
    /// mode decides.
    pub fn fresh(&self, now_ms: i64, grace_ms: u64) -> bool {
        now_ms - self.synced_at_ms <= grace_ms as i64
    }
}

/// How long a local rule keeps answering from memory while its flushes fail: ten flush
/// periods, at least 5 s and at most a minute.
pub fn grace_ms(flush_ms: u64) -> u64 {
    flush_ms.saturating_mul(10).clamp(5_000, 60_000)
}

/// About how long `algorithm` takes to give back `cost`: a window at its turn, a bucket or
/// GCRA at its rate; never more than until it is full (`reset_ms`) when that is known.
fn give_back_ms(algorithm: &Algorithm, cost: u64, reset_ms: u64) -> u64 {
    let per = |units: u64, period_ms: u64| {
        ((cost as f64) * (period_ms as f64) / (units.max(1) as f64)).ceil() as u64
    };
    let estimate = match *algorithm {
        Algorithm::TokenBucket {
            refill_tokens,
            refill_period_ms,
            ..
        } => per(refill_tokens, refill_period_ms),
        Algorithm::Gcra {
            rate, period_ms, ..
        } => per(rate, period_ms),
        Algorithm::SlidingWindow { limit, window_ms }
        | Algorithm::BucketedWindow {
            limit, window_ms, ..
        } => per(limit, window_ms),
        _ => reset_ms,
    };
    if reset_ms > 0 {
        estimate.min(reset_ms)
    } else {
        estimate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(limit: u64, remaining: u64, reset_ms: u64) -> Outcome {
        Outcome {
            allowed: true,
            limit,
            remaining,
            reset_ms,
            retry_after_ms: None,
            delay_ms: 0,
            penalty: false,
        }
    }

    const WINDOW: Algorithm = Algorithm::FixedWindow {
        limit: 10,
        window_ms: 60_000,
    };

    #[test]
    fn one_instance_admits_what_was_left_and_no_more() {
        let mut c = LocalCounter::seeded(&answer(10, 3, 40_000), 1_000);
        for _ in 0..3 {
            let o = c.outcome(&WINDOW, 1, 1_000);
            assert!(o.allowed);
            c.reserve(1);
            c.commit(1);
        }
        let denied = c.outcome(&WINDOW, 1, 2_000);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        assert_eq!(
            denied.retry_after_ms,
            Some(39_000),
            "a fixed window: at its turn"
        );
        assert_eq!(c.unsent, 3);
    }

    #[test]
    fn a_flush_sends_what_was_admitted_and_keeps_what_came_meanwhile() {
        let mut c = LocalCounter::seeded(&answer(10, 10, 0), 0);
        c.reserve(4);
        c.commit(4);
        assert_eq!(c.start_flush(), 4);
        // Two more while the flush is on its way, one of them still a reservation.
        c.reserve(2);
        c.commit(1);
        // Redis: 10 − 4 of ours − 3 of another instance's.
        c.flushed(&answer(10, 3, 50_000), 100);
        assert_eq!((c.used, c.unsent, c.in_flight), (2, 1, 0));
        assert_eq!(c.budget(), 1);
        c.release(1);
        assert_eq!(c.budget(), 2);
    }

    #[test]
    fn a_failed_flush_is_sent_again() {
        let mut c = LocalCounter::seeded(&answer(10, 10, 0), 0);
        c.reserve(5);
        c.commit(5);
        c.start_flush();
        c.reserve(1);
        c.commit(1);
        c.flush_failed();
        assert_eq!((c.unsent, c.in_flight, c.used), (6, 0, 6));
        assert!(c.fresh(5_000, grace_ms(100)));
        assert!(!c.fresh(5_001, grace_ms(100)));
    }

    /// One instance of the simulation: its counter, its flush (sent, then Redis's answer
    /// once Redis has applied it), and what it admitted.
    struct Instance {
        counter: LocalCounter,
        flush: Flush,
        admitted: u64,
        /// What Redis had taken from each instance's flushes when it answered the flush
        /// this instance last learned from (all 0: seeded before any), and the same for the
        /// flush on its way.
        learned_from: Vec<u64>,
        on_its_way: Vec<u64>,
    }

    enum Flush {
        Idle,
        Sent(u64),
        Applied(Outcome),
    }

    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// A check of 1; the bool: the policy's exact rules deny it after the local ones
        /// allowed (the share is let go of).
        Check(bool),
        StartFlush,
        /// Redis runs the flush (counts what was sent, answers what is left).
        Apply,
        Answer,
        /// The flush never reached Redis.
        Fail,
    }

    fn step_strategy() -> impl proptest::strategy::Strategy<Value = (usize, Step)> {
        use proptest::prelude::*;
        (
            0usize..4,
            prop_oneof![
                6 => Just(Step::Check(false)),
                1 => any::<bool>().prop_map(Step::Check),
                2 => Just(Step::StartFlush),
                2 => Just(Step::Apply),
                2 => Just(Step::Answer),
                1 => Just(Step::Fail),
            ],
        )
    }

    proptest::proptest! {
        /// Instances checking, flushing, failing and learning in any order against one
        /// Redis (a window of `limit`): no count is lost or counted twice, no instance alone
        /// admits more than the limit, and together they pass it by at most what the other
        /// instances had admitted and Redis had not heard of when it answered the flush the
        /// last admitting instance acted on (docs/architecture.md's bound: at most (N − 1) × what one
        /// instance admits in two flush periods and their round trips).
        #[test]
        fn instances_stay_within_the_stated_bound_and_lose_no_count(
            limit in 1u64..40,
            n in 2usize..5,
            steps in proptest::collection::vec(step_strategy(), 0..400),
        ) {
            let answer = |count: u64| Outcome {
                allowed: true,
                limit,
                remaining: limit.saturating_sub(count),
                reset_ms: 60_000,
                retry_after_ms: None,
                delay_ms: 0,
                penalty: false,
            };
            let mut redis = 0u64;
            let mut instances: Vec<Instance> = (0..n)
                .map(|_| Instance {
                    counter: LocalCounter::seeded(&answer(0), 0),
                    flush: Flush::Idle,
                    admitted: 0,
                    learned_from: vec![0; n],
                    on_its_way: vec![0; n],
                })
                .collect();
            // What Redis has taken from each instance's flushes.
            let mut taken = vec![0u64; n];
            // Who admitted last, and what Redis had taken from each when it answered the
            // flush that instance had then learned from.
            let mut last_admission: Option<(usize, Vec<u64>)> = None;
            for (who, step) in steps {
                let who = who % n;
                let i = &mut instances[who];
                match (step, &i.flush) {
                    (Step::Check(exact_denies), _) if i.counter.outcome(&WINDOW, 1, 0).allowed => {
                        i.counter.reserve(1);
                        if exact_denies {
                            i.counter.release(1);
                        } else {
                            i.counter.commit(1);
                            i.admitted += 1;
                            last_admission = Some((who, i.learned_from.clone()));
                        }
                    }
                    (Step::StartFlush, Flush::Idle) => i.flush = Flush::Sent(i.counter.start_flush()),
                    (Step::Apply, Flush::Sent(sent)) => {
                        redis += sent;
                        taken[who] += sent;
                        i.flush = Flush::Applied(answer(redis));
                        i.on_its_way = taken.clone();
                    }
                    (Step::Answer, Flush::Applied(outcome)) => {
                        let outcome = *outcome;
                        i.counter.flushed(&outcome, 0);
                        i.flush = Flush::Idle;
                        i.learned_from = std::mem::take(&mut i.on_its_way);
                    }
                    (Step::Fail, Flush::Sent(_)) => {
                        i.counter.flush_failed();
                        i.flush = Flush::Idle;
                    }
                    _ => {}
                }
            }
            // One instance alone never passes the limit. All together pass it by at most
            // what the others had admitted that Redis had not heard of when it answered the
            // flush the last instance to admit had learned from: that instance's own
            // admissions, plus the others' Redis had then, fit in the limit.
            let admitted: Vec<u64> = instances.iter().map(|i| i.admitted).collect();
            let total: u64 = admitted.iter().sum();
            for (j, &a) in admitted.iter().enumerate() {
                proptest::prop_assert!(a <= limit, "instance {j} alone admitted {a} > {limit}");
            }
            if let Some((j, known)) = last_admission {
                let unknown: u64 = (0..n).filter(|&k| k != j).map(|k| admitted[k] - known[k]).sum();
                proptest::prop_assert!(
                    total <= limit + unknown,
                    "{total} admitted: more than {limit} + {unknown} unknown to instance {j}"
                );
            }
            // Every flush lands, then every instance sends what is left.
            for i in &mut instances {
                if let Flush::Sent(sent) = i.flush {
                    redis += sent;
                    i.counter.flushed(&answer(redis), 0);
                } else if let Flush::Applied(outcome) = i.flush {
                    i.counter.flushed(&outcome, 0);
                }
                redis += i.counter.start_flush();
                i.counter.flushed(&answer(redis), 0);
            }
            proptest::prop_assert_eq!(redis, total, "a count lost or counted twice");
        }
    }

    #[test]
    fn buckets_wait_for_their_rate_and_an_impossible_cost_never_passes() {
        let bucket = Algorithm::TokenBucket {
            capacity: 100,
            refill_tokens: 10,
            refill_period_ms: 1_000,
        };
        let c = LocalCounter::seeded(&answer(100, 0, 10_000), 0);
        assert_eq!(c.outcome(&bucket, 5, 0).retry_after_ms, Some(500));
        assert_eq!(c.outcome(&bucket, 101, 0).retry_after_ms, None);
    }
}
