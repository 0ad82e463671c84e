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
    store::{CheckEntry, Now, Store, StoreError},
    support::shutdown::Shutdown,
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
    /// Which counter this is: a counter seeded again (a changed rule) or dropped (a reset)
    /// is a new one, and what was on its way for the old one is not applied to it.
    generation: u64,
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
    /// When it was seeded, µs on Redis's clock: a reset of its identifier at or after this
    /// makes Redis drop what it flushes (what it counted was reset).
    seeded_us: i64,
}

impl Slot {
    /// Used since its last flush answered: it has something to learn or send.
    fn busy(&self) -> bool {
        self.last_used_ms >= self.counter.synced_at_ms() || self.counter.unsent() > 0
    }

    /// Unused and unflushed for longer than a flush period: what it knows is old, so the
    /// next check reads Redis first (as a new counter would).
    fn dormant(&self, now: i64) -> bool {
        !self.busy() && !self.flushing && now - self.counter.synced_at_ms() > self.flush_ms as i64
    }
}

/// This instance's counters of local rules.
#[derive(Clone, Default)]
pub struct LocalCounts {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    generations: Arc<std::sync::atomic::AtomicU64>,
}

fn key(policy: &str, entry: &CheckEntry<'_>) -> String {
    // An override's own rules count apart from the policy's, as in Redis.
    let space = if entry.rule.of_override { "o." } else { "" };
    format!(
        "{policy}\u{0}{space}{}\u{0}{}\u{0}{}",
        entry.rule.name,
        entry.identifier,
        entry.limits.unwrap_or_default()
    )
}

/// What an allowed check of local entries holds in their counters until it is settled.
struct Share {
    /// Per entry: its counter's key and generation, its cost, whether its rule counts denials.
    held: Vec<(String, u64, u64, bool)>,
}

/// The local entries' answer to a check: their outcomes, and what an allowed check holds.
/// A held share not settled (the check was dropped half way: a timeout, a caller gone) is
/// let go of, so it never stays taken.
struct Taken<'a> {
    counts: &'a LocalCounts,
    outcomes: Vec<Outcome>,
    allowed: bool,
    share: Option<Share>,
}

impl Taken<'_> {
    /// Keeps the share (`admitted`: the whole check was allowed) or lets go of it; a rule
    /// that counts denials keeps its share of a denied check.
    fn settle(&mut self, admitted: bool) {
        let Some(share) = self.share.take() else {
            return;
        };
        let mut slots = self.counts.lock();
        for (k, generation, cost, count_denied) in share.held {
            let Some(slot) = slots.get_mut(&k).filter(|s| s.generation == generation) else {
                continue; // reset or seeded again meanwhile: its share went with it
            };
            if admitted || count_denied {
                slot.counter.commit(cost);
            } else {
                slot.counter.release(cost);
            }
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.settle(false);
    }
}

/// Why the local entries could not be decided here.
enum NotHere {
    /// Some have no counter yet, one of another rule, or one that has not heard from Redis
    /// for a flush period: seed these.
    Unseeded(Vec<usize>),
    /// A counter has not heard from Redis for longer than its grace (ms): Redis is down.
    Stale(u64),
    /// No room for more counters: decide in Redis.
    Full,
}

/// One counter's flush: what it counts, and what it sends.
struct Due {
    key: String,
    generation: u64,
    seeded_us: i64,
    policy: Name,
    rule: Rule,
    identifier: Identifier,
    limits: Option<String>,
    sent: u64,
}

/// What became of one flush.
enum Flushed {
    /// Counted: the counter's state afterwards, every instance's counts in.
    Counted(Outcome),
    /// Not applied: the identifier was reset after the counter was seeded.
    Discarded,
}

/// Adds what one counter admitted to Redis, unless its identifier was reset since the
/// counter was seeded (a flush on its way must not undo a reset).
async fn flush_one(store: Store, due: Due) -> (Due, Result<Flushed, StoreError>) {
    let entry = CheckEntry {
        limits: due.limits.as_deref(),
        ..CheckEntry::new(&due.rule, &due.identifier)
    };
    let answer = store
        .flush_local(&due.policy, &entry, due.sent, due.seeded_us)
        .await
        .and_then(|reply| match reply.outcomes.into_iter().next() {
            _ if reply.discarded => Ok(Flushed::Discarded),
            Some(outcome) => Ok(Flushed::Counted(outcome)),
            None => Err(StoreError::Reply("a flush came back with no result".into())),
        });
    (due, answer)
}

impl LocalCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Decides `entries` (all local) at `cost`, all or nothing among them; an allowed check
    /// holds its share until it is settled. `woken`: answer from counters that have not
    /// heard from Redis for a while rather than read it again (Redis is down, and they are
    /// within their grace).
    fn take(
        &self,
        policy: &str,
        entries: &[CheckEntry<'_>],
        cost: u64,
        now: i64,
        woken: bool,
    ) -> Result<Taken<'_>, NotHere> {
        let mut slots = self.lock();
        let keys: Vec<String> = entries.iter().map(|e| key(policy, e)).collect();
        let unseeded: Vec<usize> = keys
            .iter()
            .zip(entries)
            .enumerate()
            .filter(|(_, (k, e))| {
                slots
                    .get(*k)
                    .is_none_or(|s| s.rule != *e.rule || (!woken && s.dormant(now)))
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
            let grace = grace_ms(slot.flush_ms);
            if !slot.counter.fresh(now, grace) {
                return Err(NotHere::Stale(grace));
            }
            slot.last_used_ms = now;
            outcomes.push(slot.counter.outcome(&e.rule.algorithm, c, now));
        }
        let allowed = outcomes.iter().all(|o| o.allowed);
        let mut held = Vec::new();
        for ((k, e), &c) in keys.into_iter().zip(entries).zip(&costs) {
            let slot = slots.get_mut(&k).expect("seeded above");
            if allowed {
                slot.counter.reserve(c);
                held.push((k, slot.generation, c, e.rule.count_denied));
            } else if e.rule.count_denied {
                slot.counter.count_denied(c);
            }
        }
        Ok(Taken {
            counts: self,
            outcomes,
            allowed,
            share: allowed.then_some(Share { held }),
        })
    }

    /// Whether every one of `entries` has a counter of its rule still within its grace:
    /// it may answer without reading Redis first.
    fn all_fresh(&self, policy: &str, entries: &[CheckEntry<'_>], now: i64) -> bool {
        let slots = self.lock();
        entries.iter().all(|e| {
            slots
                .get(&key(policy, e))
                .is_some_and(|s| s.rule == *e.rule && s.counter.fresh(now, grace_ms(s.flush_ms)))
        })
    }

    /// Counters seeded from Redis's answers (`seeds`: each entry with its peek, read at
    /// `at_us` on Redis's clock).
    fn seed(&self, policy: &Name, seeds: &[(&CheckEntry<'_>, &Outcome)], now: i64, at_us: i64) {
        let mut slots = self.lock();
        for (e, answer) in seeds {
            let k = key(policy.as_str(), e);
            let flush_ms = e.rule.local_flush_ms().unwrap_or_default();
            match slots.get_mut(&k) {
                // Another check seeded it meanwhile: keep its counts.
                Some(slot) if slot.rule == *e.rule && !slot.dormant(now) => {}
                // Woken: what Redis says now, with what it holds for checks on their way.
                Some(slot) if slot.rule == *e.rule => {
                    slot.counter.flushed(answer, now);
                    slot.last_used_ms = now;
                }
                existing => {
                    // A changed rule starts from Redis again; what it had admitted and not
                    // sent goes out with its next flush (what is on its way already stays
                    // the old counter's).
                    let unsent = existing.map_or(0, |s| s.counter.unsent());
                    let mut counter = LocalCounter::seeded(answer, now);
                    counter.carry(unsent);
                    let generation = self
                        .generations
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    slots.insert(
                        k,
                        Slot {
                            counter,
                            generation,
                            policy: policy.clone(),
                            rule: e.rule.clone(),
                            identifier: e.identifier.clone(),
                            limits: e.limits.map(str::to_owned),
                            flush_ms,
                            flushing: false,
                            last_used_ms: now,
                            tried_ms: now,
                            seeded_us: at_us,
                        },
                    );
                }
            }
        }
        crate::telemetry::metrics::local_counters(slots.len());
    }

    /// Drops the counters of `identifier` (under `policies`, or all): a reset, wherever it
    /// was made, starts them from Redis again.
    pub fn forget(&self, policies: Option<&[String]>, identifier: &Identifier) {
        let mut slots = self.lock();
        slots.retain(|_, s| {
            s.identifier != *identifier
                || !policies.is_none_or(|ps| ps.iter().any(|p| p == s.policy.as_str()))
        });
        crate::telemetry::metrics::local_counters(slots.len());
    }

    /// Flushes what is due: every counter used since its last flush, `flush_ms` after it,
    /// whether or not it admitted anything (it learns the others' counts and the rule's
    /// refills). A counter nobody asks about is not flushed; it reads Redis again when it is
    /// next asked. `last`: the server is stopping, so everything not sent goes now. One
    /// report call a counter, all on their way together.
    pub async fn flush_due(&self, store: &Store, outage: &super::alerts::RedisOutage, last: bool) {
        let now = now_ms();
        let due: Vec<Due> = {
            let mut slots = self.lock();
            slots.retain(|_, s| s.busy() || s.flushing || now - s.last_used_ms < IDLE_MS);
            slots
                .iter_mut()
                .filter(|(_, s)| {
                    let after = |t: i64| now - t >= s.flush_ms as i64;
                    !s.flushing
                        && s.busy()
                        && (last || (after(s.counter.synced_at_ms()) && after(s.tried_ms)))
                })
                .map(|(k, s)| {
                    s.flushing = true;
                    s.tried_ms = now;
                    Due {
                        key: k.clone(),
                        generation: s.generation,
                        seeded_us: s.seeded_us,
                        policy: s.policy.clone(),
                        rule: s.rule.clone(),
                        identifier: s.identifier.clone(),
                        limits: s.limits.clone(),
                        sent: s.counter.start_flush(),
                    }
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let answers: Vec<(Due, Result<Flushed, StoreError>)> =
            futures_util::stream::iter(due.into_iter().map(|d| flush_one(store.clone(), d)))
                .buffer_unordered(FLUSHES_AT_ONCE)
                .collect()
                .await;
        let now = now_ms();
        let mut slots = self.lock();
        for (due, answer) in answers {
            let Some(slot) = slots
                .get_mut(&due.key)
                .filter(|s| s.generation == due.generation)
            else {
                continue; // reset or seeded again meanwhile
            };
            slot.flushing = false;
            match answer {
                Ok(Flushed::Counted(outcome)) => {
                    slot.counter.flushed(&outcome, now);
                    outage.answered();
                }
                Ok(Flushed::Discarded) => {
                    // Reset since it was seeded (its event may not have come): it starts
                    // from Redis again.
                    slots.remove(&due.key);
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

    /// Flushes every 10 ms what is due, until the server stops; then everything not sent.
    pub fn spawn_flusher(
        &self,
        store: Store,
        outage: super::alerts::RedisOutage,
        shutdown: &Shutdown,
    ) {
        let counts = self.clone();
        let stop = shutdown.clone();
        shutdown.spawn_to_the_end(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(crate::domain::rule::MIN_FLUSH_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    () = stop.stopped() => true,
                };
                counts.flush_due(&store, &outage, stopping).await;
                if stopping {
                    break;
                }
            }
        });
    }
}

/// Whether a check's entry is of a local rule (`sync: local`).
pub(super) fn is_local(entry: &CheckEntry<'_>) -> bool {
    entry.rule.local_flush_ms().is_some()
}

impl Service {
    /// Decides a check some of whose entries are local rules: those from this instance's
    /// counters, the others in Redis, all or nothing. `None` when the local ones cannot be
    /// decided here (too many counters): the caller decides the whole check in Redis.
    pub(super) async fn decide_with_local(
        &self,
        policy: &Policy,
        entries: &[CheckEntry<'_>],
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let (here, there): (Vec<CheckEntry<'_>>, Vec<CheckEntry<'_>>) =
            entries.iter().partition(|e| is_local(e));
        let mut taken = match self.take_local(policy, &here, cost).await {
            Ok(Some(taken)) => taken,
            Ok(None) => return None,
            Err(error) => return Some(Err(error)),
        };
        let exact = match self.decide_exact(policy, &there, cost, taken.allowed).await {
            Ok(exact) => exact,
            Err(error) => return Some(Err(error)), // the share is let go of as `taken` drops
        };
        if exact.is_some() {
            self.outage.answered();
        }
        let counted_there = taken.allowed && exact.is_some();
        let admitted = taken.allowed && exact.as_ref().is_none_or(|d| d.allowed);
        taken.settle(admitted);
        let costs = here.iter().map(|e| e.cost.unwrap_or(cost));
        let mut local_outcomes = std::mem::take(&mut taken.outcomes)
            .into_iter()
            .zip(costs)
            .map(|(mut o, c)| {
                if o.allowed && !admitted {
                    // Not taken after all: its state as a peek shows it.
                    o.remaining += c;
                }
                o
            });
        let mut exact_results = exact.map(|d| d.results).unwrap_or_default().into_iter();
        // Every local entry's result, and the exact ones' when Redis answered for them.
        let results: Vec<RuleResult> = entries
            .iter()
            .filter_map(|e| {
                if is_local(e) {
                    local_outcomes.next().map(|outcome| e.result(outcome))
                } else {
                    exact_results.next()
                }
            })
            .collect();
        let mut decision = Decision::new(results);
        decision.allowed = admitted;
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

    /// This instance's share of the local entries, seeded from Redis first where a counter
    /// has not heard from it. `None` when they cannot be decided here (too many counters).
    async fn take_local<'a>(
        &'a self,
        policy: &Policy,
        here: &[CheckEntry<'_>],
        cost: u64,
    ) -> Result<Option<Taken<'a>>, StoreError> {
        let mut woken = false;
        loop {
            match self
                .local
                .take(policy.name.as_str(), here, cost, now_ms(), woken)
            {
                Ok(taken) => return Ok(Some(taken)),
                Err(NotHere::Full) => return Ok(None),
                Err(NotHere::Stale(grace_ms)) => {
                    return Err(StoreError::NotReached(grace_ms));
                }
                Err(NotHere::Unseeded(missing)) => {
                    let missing: Vec<CheckEntry<'_>> = missing.iter().map(|&i| here[i]).collect();
                    match self
                        .store
                        .report(&policy.name, &missing, 0, Now::Redis)
                        .await
                    {
                        Ok(peek) => {
                            self.outage.answered();
                            let seeds: Vec<_> = missing
                                .iter()
                                .zip(peek.results.iter().map(|r| &r.outcome))
                                .collect();
                            self.local.seed(&policy.name, &seeds, now_ms(), peek.at_us);
                        }
                        // Redis is down, but the counters heard from it within their grace:
                        // they answer, within what they were last told was left.
                        Err(_)
                            if !woken
                                && self.local.all_fresh(
                                    policy.name.as_str(),
                                    &missing,
                                    now_ms(),
                                ) =>
                        {
                            woken = true;
                        }
                        Err(error) => {
                            self.outage.failed(now_ms(), &error);
                            return Err(error);
                        }
                    }
                }
            }
        }
    }

    /// The exact entries: counted in Redis when the local ones allowed; else told of the
    /// denial (rules that count denials count it) and read (the check is denied already,
    /// and stays denied if Redis cannot be asked: `None`).
    async fn decide_exact(
        &self,
        policy: &Policy,
        there: &[CheckEntry<'_>],
        cost: u64,
        allowed_here: bool,
    ) -> Result<Option<Decision>, StoreError> {
        if there.is_empty() {
            Ok(None)
        } else if allowed_here {
            match self.store.check_and_count(&policy.name, there, cost).await {
                Ok(decision) => Ok(Some(decision)),
                Err(error) => {
                    self.outage.failed(now_ms(), &error);
                    Err(error)
                }
            }
        } else {
            Ok(self
                .store
                .denied_elsewhere(&policy.name, there, cost)
                .await
                .ok())
        }
    }
}
