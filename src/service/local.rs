//! Local counting (`sync: local`, see `domain::local`): this instance's counters of local
//! rules, the part of a check they decide, and the flusher that adds what they counted to
//! Redis every `flush_ms` and learns the other instances' totals.
//!
//! A check whose entries are all local is answered from memory, without Redis. A check that
//! also has exact entries holds its local share first, asks Redis for the exact ones, and
//! keeps or lets go of the local share by Redis's answer: still all or nothing.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::StreamExt;

use super::{Service, now_ms};
use crate::{
    domain::{
        Decision, Identifier, Name, Outcome, Policy, Rule, RuleResult,
        local::{LocalCounter, grace_ms},
    },
    shutdown::Shutdown,
    store::{CheckEntry, Now, Store, StoreError},
};

/// A counter unused this long, with nothing left to send, is dropped (it is seeded again
/// from Redis when its identifier comes back).
const IDLE_MS: i64 = 60_000;
/// Most counters kept; past that, new identifiers are decided in Redis, exactly.
const MAX_COUNTERS: usize = 100_000;
/// Flushes on their way at once.
const FLUSHES_AT_ONCE: usize = 64;

struct Slot {
    counter: LocalCounter,
    policy: Name,
    rule: Rule,
    identifier: Identifier,
    /// The caller's numbers (`limit=500`) this counter is of, when it is of some.
    limits: Option<String>,
    flush_ms: u64,
    flushing: bool,
    last_used_ms: i64,
    /// When a flush last set out (failed ones are tried again a flush period later).
    tried_ms: i64,
}

impl Slot {
    /// Used since its last flush answered: it has something to learn or send.
    fn busy(&self) -> bool {
        self.last_used_ms >= self.counter.synced_at_ms || self.counter.unsent > 0
    }

    /// Unused and unflushed for longer than a flush period: what it knows is old, so the
    /// next check reads Redis first (as a new counter would).
    fn dormant(&self, now: i64) -> bool {
        !self.busy() && !self.flushing && now - self.counter.synced_at_ms > self.flush_ms as i64
    }
}

/// This instance's counters of local rules.
#[derive(Clone, Default)]
pub struct LocalCounts {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

fn key(policy: &str, entry: &CheckEntry<'_>) -> String {
    format!(
        "{policy}\u{0}{}\u{0}{}\u{0}{}",
        entry.rule.name,
        entry.identifier,
        entry.limits.unwrap_or_default()
    )
}

/// What the local entries of a check made of it.
struct Taken {
    outcomes: Vec<Outcome>,
    keys: Vec<String>,
    costs: Vec<u64>,
    allowed: bool,
}

/// Why the local entries could not be decided here.
enum NotHere {
    /// Some have no counter yet (or one of another rule's numbers): seed these.
    Unseeded(Vec<usize>),
    /// A counter has not heard from Redis for longer than its grace: Redis is down.
    Stale,
    /// No room for more counters: decide in Redis.
    Full,
}

/// A counter's flush: its key, what it counts, and what it sends.
type Due = (String, Name, Rule, Identifier, Option<String>, u64);

/// Adds what one counter admitted to Redis; Redis's answer is its state afterwards, every
/// instance's counts in.
async fn flush_one(store: Store, due: Due) -> (String, Result<Outcome, StoreError>) {
    let (k, policy, rule, identifier, limits, sent) = due;
    let entry = CheckEntry {
        limits: limits.as_deref(),
        ..CheckEntry::new(&rule, &identifier)
    };
    let answer = store
        .report(&policy, &[entry], sent as i64, Now::Redis)
        .await
        .and_then(|d| {
            d.results
                .into_iter()
                .next()
                .map(|r| r.outcome)
                .ok_or_else(|| StoreError::Reply("a flush came back with no result".into()))
        });
    (k, answer)
}

impl LocalCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Decides `entries` (all local) at `cost`, all or nothing among them, holding what an
    /// allowed check takes until [`LocalCounts::settle`].
    fn take(
        &self,
        policy: &str,
        entries: &[CheckEntry<'_>],
        cost: u64,
        now: i64,
    ) -> Result<Taken, NotHere> {
        let mut slots = self.lock();
        let keys: Vec<String> = entries.iter().map(|e| key(policy, e)).collect();
        let unseeded: Vec<usize> = keys
            .iter()
            .zip(entries)
            .enumerate()
            .filter(|(_, (k, e))| {
                slots
                    .get(*k)
                    .is_none_or(|s| s.rule.algorithm != e.rule.algorithm || s.dormant(now))
            })
            .map(|(i, _)| i)
            .collect();
        if !unseeded.is_empty() {
            return Err(if slots.len() + unseeded.len() > MAX_COUNTERS {
                NotHere::Full
            } else {
                NotHere::Unseeded(unseeded)
            });
        }
        let costs: Vec<u64> = entries.iter().map(|e| e.cost.unwrap_or(cost)).collect();
        let mut outcomes = Vec::with_capacity(entries.len());
        for ((k, e), &c) in keys.iter().zip(entries).zip(&costs) {
            let slot = slots.get_mut(k).expect("seeded above");
            if !slot.counter.fresh(now, grace_ms(slot.flush_ms)) {
                return Err(NotHere::Stale);
            }
            slot.last_used_ms = now;
            outcomes.push(slot.counter.outcome(&e.rule.algorithm, c, now));
        }
        let allowed = outcomes.iter().all(|o| o.allowed);
        for ((k, e), &c) in keys.iter().zip(entries).zip(&costs) {
            let counter = &mut slots.get_mut(k).expect("seeded above").counter;
            if allowed {
                counter.reserve(c);
            } else if e.rule.count_denied {
                counter.count_denied(c);
            }
        }
        Ok(Taken {
            outcomes,
            keys,
            costs,
            allowed,
        })
    }

    /// Keeps (`admitted`) or lets go of what an allowed [`LocalCounts::take`] held.
    fn settle(&self, taken: &Taken, admitted: bool) {
        let mut slots = self.lock();
        for (k, &c) in taken.keys.iter().zip(&taken.costs) {
            if let Some(slot) = slots.get_mut(k) {
                if admitted {
                    slot.counter.commit(c);
                } else {
                    slot.counter.release(c);
                }
            }
        }
    }

    /// Counters seeded from Redis's answers (`seeds`: each entry with its peek).
    fn seed(&self, policy: &Name, seeds: &[(&CheckEntry<'_>, &Outcome)], now: i64) {
        let mut slots = self.lock();
        for (e, answer) in seeds {
            let k = key(policy.as_str(), e);
            let flush_ms = e.rule.local_flush_ms().unwrap_or_default();
            match slots.get_mut(&k) {
                // Another check seeded it meanwhile: keep its counts.
                Some(slot) if slot.rule.algorithm == e.rule.algorithm && !slot.dormant(now) => {}
                // Woken: what Redis says now, with what it holds for checks on their way.
                Some(slot) if slot.rule.algorithm == e.rule.algorithm => {
                    slot.counter.flushed(answer, now);
                    slot.last_used_ms = now;
                }
                existing => {
                    // A changed rule starts from Redis again; what it had not sent yet
                    // still goes out with the next flush.
                    let unsent = existing.map_or(0, |s| s.counter.unsent + s.counter.in_flight);
                    let mut counter = LocalCounter::seeded(answer, now);
                    counter.unsent = unsent;
                    slots.insert(
                        k,
                        Slot {
                            counter,
                            policy: policy.clone(),
                            rule: e.rule.clone(),
                            identifier: e.identifier.clone(),
                            limits: e.limits.map(str::to_owned),
                            flush_ms,
                            flushing: false,
                            last_used_ms: now,
                            tried_ms: now,
                        },
                    );
                }
            }
        }
        crate::metrics::local_counters(slots.len());
    }

    /// Drops the counters of `identifier` (under `policies`, or all): a reset, wherever it
    /// was made, starts them from Redis again.
    pub fn forget(&self, policies: Option<&[String]>, identifier: &Identifier) {
        let mut slots = self.lock();
        slots.retain(|_, s| {
            s.identifier != *identifier
                || !policies.is_none_or(|ps| ps.iter().any(|p| p == s.policy.as_str()))
        });
        crate::metrics::local_counters(slots.len());
    }

    /// Flushes what is due: every counter used since its last flush, `flush_ms` after it,
    /// whether or not it admitted anything (it learns the others' counts and the rule's
    /// refills). A counter nobody asks about is not flushed; it reads Redis again when it is
    /// next asked. One report call a counter, all on their way together.
    pub async fn flush_due(&self, store: &Store, outage: &super::alerts::RedisOutage) {
        let now = now_ms();
        let due: Vec<Due> = {
            let mut slots = self.lock();
            slots.retain(|_, s| s.busy() || s.flushing || now - s.last_used_ms < IDLE_MS);
            slots
                .iter_mut()
                .filter(|(_, s)| {
                    !s.flushing
                        && s.busy()
                        && now - s.counter.synced_at_ms >= s.flush_ms as i64
                        && now - s.tried_ms >= s.flush_ms as i64
                })
                .map(|(k, s)| {
                    s.flushing = true;
                    s.tried_ms = now;
                    let sent = s.counter.start_flush();
                    (
                        k.clone(),
                        s.policy.clone(),
                        s.rule.clone(),
                        s.identifier.clone(),
                        s.limits.clone(),
                        sent,
                    )
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let answers: Vec<(String, Result<Outcome, StoreError>)> =
            futures_util::stream::iter(due.into_iter().map(|d| flush_one(store.clone(), d)))
                .buffer_unordered(FLUSHES_AT_ONCE)
                .collect()
                .await;
        let now = now_ms();
        let mut slots = self.lock();
        for (k, answer) in answers {
            let Some(slot) = slots.get_mut(&k) else {
                continue; // reset meanwhile
            };
            slot.flushing = false;
            match answer {
                Ok(outcome) => {
                    slot.counter.flushed(&outcome, now);
                    outage.answered();
                }
                Err(error) => {
                    slot.counter.flush_failed();
                    outage.failed(now, &error);
                    tracing::debug!(%error, "a local rule's flush failed; kept for the next");
                }
            }
        }
    }

    /// Flushes every 10 ms what is due, until the server stops.
    pub fn spawn_flusher(
        &self,
        store: Store,
        outage: super::alerts::RedisOutage,
        shutdown: &Shutdown,
    ) {
        let counts = self.clone();
        shutdown.spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(crate::domain::rule::MIN_FLUSH_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                counts.flush_due(&store, &outage).await;
            }
        });
    }
}

impl Service {
    /// Decides a check some of whose entries are local rules (`local[i]`: whether entry `i`
    /// is): the local ones from this instance's counters, the others in Redis, all or
    /// nothing. `None` when the local ones cannot be decided here (too many counters): the
    /// caller decides the whole check in Redis.
    pub(super) async fn decide_with_local(
        &self,
        policy: &Policy,
        entries: &[CheckEntry<'_>],
        cost: u64,
        local: &[bool],
    ) -> Option<Result<Decision, StoreError>> {
        let (here, there): (Vec<_>, Vec<_>) = entries
            .iter()
            .zip(local)
            .partition(|(_, is_local)| **is_local);
        let here: Vec<CheckEntry<'_>> = here.into_iter().map(|(e, _)| *e).collect();
        let there: Vec<CheckEntry<'_>> = there.into_iter().map(|(e, _)| *e).collect();
        let taken = loop {
            match self.local.take(policy.name.as_str(), &here, cost, now_ms()) {
                Ok(taken) => break taken,
                Err(NotHere::Full) => return None,
                Err(NotHere::Stale) => {
                    return Some(Err(StoreError::Reply(
                        "a local rule has not reached Redis for longer than its grace".into(),
                    )));
                }
                Err(NotHere::Unseeded(missing)) => {
                    let missing: Vec<CheckEntry<'_>> = missing.iter().map(|&i| here[i]).collect();
                    let peek = match self
                        .store
                        .report(&policy.name, &missing, 0, Now::Redis)
                        .await
                    {
                        Ok(peek) => peek,
                        Err(error) => {
                            self.outage.failed(now_ms(), &error);
                            return Some(Err(error));
                        }
                    };
                    let seeds: Vec<_> = missing
                        .iter()
                        .zip(peek.results.iter().map(|r| &r.outcome))
                        .collect();
                    self.local.seed(&policy.name, &seeds, now_ms());
                }
            }
        };
        // The exact entries: counted in Redis when the local ones allowed, else a peek there
        // (the check is denied already).
        let (exact, counted_there) = if there.is_empty() {
            (None, false)
        } else if taken.allowed {
            let answer = self.store.check_and_count(&policy.name, &there, cost).await;
            if answer.is_err() {
                self.local.settle(&taken, false);
            }
            (Some(answer), true)
        } else {
            (
                Some(self.store.probe(&policy.name, &there, cost).await),
                false,
            )
        };
        let exact = match exact.transpose() {
            Ok(exact) => exact,
            Err(error) => {
                self.outage.failed(now_ms(), &error);
                return Some(Err(error));
            }
        };
        let admitted = taken.allowed && exact.as_ref().is_none_or(|d| d.allowed);
        if taken.allowed {
            self.local.settle(&taken, admitted);
        }
        let mut local_outcomes = taken
            .outcomes
            .into_iter()
            .zip(&taken.costs)
            .map(|(mut o, &c)| {
                if o.allowed && !admitted {
                    // Not taken after all: its state as a peek shows it.
                    o.remaining += c;
                }
                o
            });
        let mut exact_results = exact.map(|d| d.results).unwrap_or_default().into_iter();
        let results: Vec<RuleResult> = entries
            .iter()
            .zip(local)
            .filter_map(|(e, &is_local)| {
                if is_local {
                    let outcome = local_outcomes.next()?;
                    Some(RuleResult {
                        rule: e.rule.name.clone(),
                        identifier: e.identifier.clone(),
                        algorithm: Some(e.rule.algorithm),
                        outcome,
                        binding: false,
                        lease: None,
                    })
                } else {
                    exact_results.next()
                }
            })
            .collect();
        let mut decision = Decision::new(results);
        if !taken.allowed {
            // The local entries denied: the exact ones were only looked at.
            decision.allowed = false;
        }
        if !counted_there {
            // No script call counted this check for the overview: it is counted here and
            // flushed with the others.
            self.live.answered_here(
                policy.name.as_str(),
                decision.allowed,
                decision.binding().map(|b| b.identifier.to_string()),
            );
        }
        Some(Ok(decision))
    }
}
