//! What the live views hear of besides the check script's own counters, gathered in memory
//! and written once a second, off the check path:
//! - denials this instance answers from its over-limit cache never reach Redis, so the
//!   overview would not count them;
//! - what each denial was (the rule that bound, until when, every identifier of the
//!   check), for "Throttled now";
//! - each denied identifier's checks from its first denial on, so a streak of denials is a
//!   state with a since and a share (`live/streaks.rs`, `lua/streaks.lua`);
//! - the Envoy descriptors that found no limit in their domain's file, by their keys
//!   (`live/unmatched.rs`);
//! - which identifiers are checked together (user=bob with ip=203.0.113.11), so the
//!   inspector can tell that bob was denied through his address. A pair is written once
//!   per ten minutes per instance at most.

mod streaks;
mod unmatched;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::{
    domain::Identifier,
    store::{
        Store,
        stats::{DenialNote, label},
    },
    support::shutdown::Shutdown,
};

/// Identifiers whose denials one flush describes per policy, at most; the others are still
/// counted.
const MAX_NOTES: usize = 1_000;
/// Identifiers whose companions one instance writes per ten minutes, at most: a flood of
/// new identifiers costs a bounded number of writes.
const MAX_TOGETHER: usize = 50_000;

#[derive(Default)]
struct Pending {
    /// Checks allowed without Redis (local rules), not yet in its counters.
    allowed: u64,
    denied: u64,
    by_identifier: HashMap<String, u64>,
    /// What the denials were, per identifier that bound.
    notes: HashMap<String, DenialNote>,
}

#[derive(Default)]
struct Together {
    /// The ten minutes `seen` is of.
    slot: i64,
    /// Hashes of the (identifier, companion) pairs written this ten minutes: a check of
    /// known pairs hashes them and allocates nothing.
    seen: HashSet<u64>,
    /// Identifier → companions to write.
    pending: HashMap<String, Vec<String>>,
}

/// A denial as the live views tell it.
#[derive(Clone, Copy, Debug)]
pub struct Denial<'a> {
    /// The identifier that bound.
    pub identifier: &'a Identifier,
    /// The rule it bound under.
    pub rule: &'a str,
    /// When the next request passes, from now (`None`: not known).
    pub retry_after_ms: Option<u64>,
}

/// Cached denials waiting to be counted, and denials and companions waiting to be told.
#[derive(Clone, Default)]
pub struct LiveCounts {
    pending: Arc<Mutex<HashMap<String, Pending>>>,
    together: Arc<Mutex<Together>>,
    watch: Arc<Mutex<streaks::Watch>>,
    unmatched: Arc<Mutex<unmatched::Unmatched>>,
    /// Checks that sent dimensions no rule of their policy counts, by those dimensions.
    unused: Arc<Mutex<unmatched::Unmatched>>,
    /// How many identifiers `watch` holds: an allowed check takes its lock only when some are.
    watching: Arc<AtomicUsize>,
}

impl LiveCounts {
    /// Notes one denial answered from the cache; `identifier` is the one that bound.
    pub fn denied_from_cache(&self, policy: &str, identifier: Option<String>) {
        self.answered_here(policy, false, identifier);
    }

    /// Counts a check this instance answered without Redis (the over-limit cache, local
    /// rules): allowed, or denied with the identifier that bound.
    pub fn answered_here(&self, policy: &str, allowed: bool, identifier: Option<String>) {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // No key allocated per check: local rules answer here at the HTTP floor's rate.
        if !pending.contains_key(policy) {
            pending.insert(policy.to_owned(), Pending::default());
        }
        let p = pending.get_mut(policy).expect("inserted above");
        if allowed {
            p.allowed += 1;
            return;
        }
        p.denied += 1;
        if let Some(id) = identifier {
            // Bounded: a flood of distinct identifiers keeps only the first thousand.
            if p.by_identifier.len() < 1000 || p.by_identifier.contains_key(&id) {
                *p.by_identifier.entry(id).or_default() += 1;
            }
        }
    }

    /// Notes what a denial of a check of `identifiers` under `policy` was, at `now_ms`.
    pub fn denied<'a>(
        &self,
        policy: &str,
        denial: Denial<'_>,
        identifiers: impl IntoIterator<Item = &'a Identifier>,
        now_ms: i64,
    ) {
        let bound = denial.identifier.to_string();
        let until_ms = denial
            .retry_after_ms
            .map(|r| now_ms.saturating_add(i64::try_from(r).unwrap_or(i64::MAX)));
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let p = pending.entry(policy.to_owned()).or_default();
        if let Some(note) = p.notes.get_mut(&bound) {
            note.denials += 1;
            note.last_ms = note.last_ms.max(now_ms);
            note.until_ms = until_ms;
            denial.rule.clone_into(&mut note.rule);
            return;
        }
        if p.notes.len() >= MAX_NOTES {
            return;
        }
        let mut all: Vec<String> = identifiers.into_iter().map(Identifier::to_string).collect();
        if !all.contains(&bound) {
            all.push(bound.clone());
        }
        p.notes.insert(
            bound.clone(),
            DenialNote {
                identifier: bound,
                denials: 1,
                first_ms: now_ms,
                last_ms: now_ms,
                until_ms,
                rule: denial.rule.to_owned(),
                identifiers: all,
            },
        );
    }

    /// Counts a check of `identifiers` under `policy` toward their streaks of denials: a
    /// denial (every identifier of the check credited) starts watching them, an allowed check
    /// counts for those watched. No lock while none is watched.
    pub fn streak_check<'a>(
        &self,
        policy: &str,
        identifiers: impl IntoIterator<Item = &'a Identifier>,
        denied: bool,
        now_ms: i64,
    ) {
        if !denied && self.watching.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut watch = self
            .watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        watch.checked(policy, identifiers, denied, now_ms);
        self.watching.store(watch.len(), Ordering::Relaxed);
    }

    /// Counts an Envoy descriptor of `policy`'s domain that found no limit, by its keys.
    pub fn unmatched(&self, policy: &str, entries: &[(String, String)]) {
        self.unmatched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count(policy, entries);
    }

    /// Counts a check of `policy` that sent `dimensions`, which none of its rules counts.
    pub fn unused(&self, policy: &str, dimensions: &[crate::domain::Name]) {
        let shape: Vec<&str> = dimensions.iter().map(crate::domain::Name::as_str).collect();
        self.unused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count_shape(policy, shape.join(", "));
    }

    /// Notes that `identifiers` were checked together (nothing for a single one).
    pub fn checked_together(&self, identifiers: &[Identifier], now_ms: i64) {
        if identifiers.len() < 2 {
            return;
        }
        let slot = now_ms.div_euclid(600_000);
        let mut t = self
            .together
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if t.slot != slot {
            t.slot = slot;
            t.seen.clear();
        }
        let hasher = foldhash::fast::FixedState::with_seed(0x5b1_11a7);
        for id in identifiers {
            for other in identifiers.iter().filter(|o| *o != id) {
                let pair = std::hash::BuildHasher::hash_one(&hasher, (id, other));
                if t.seen.len() >= MAX_TOGETHER || !t.seen.insert(pair) {
                    continue;
                }
                t.pending
                    .entry(id.to_string())
                    .or_default()
                    .push(other.to_string());
            }
        }
    }

    /// Flushes every second until the server stops.
    pub fn spawn_flusher(&self, store: Store, shutdown: &Shutdown) {
        let counts = self.clone();
        shutdown.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                counts.flush(&store).await;
            }
        });
    }

    /// Writes what waits: cached denials, denial details, streaks, unmatched descriptors,
    /// companions.
    pub async fn flush(&self, store: &Store) {
        let drained: Vec<(String, Pending)> = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .collect();
        for (policy, p) in drained {
            if p.denied > 0 || p.allowed > 0 {
                let labels: Vec<(String, u64)> = p
                    .by_identifier
                    .into_iter()
                    .map(|(id, n)| (label(&policy, &id), n))
                    .collect();
                if let Err(error) = store.add_stats(&policy, p.allowed, p.denied, &labels).await {
                    tracing::debug!(%error, "could not add checks answered here to the counters");
                }
            }
            let notes: Vec<DenialNote> = p.notes.into_values().collect();
            if let Err(error) = store.add_denial_details(&policy, &notes).await {
                tracing::debug!(%error, "could not write what the denials were");
            }
        }
        let streaks = {
            let mut watch = self
                .watch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let drained = watch.drain(crate::service::now_ms());
            self.watching.store(watch.len(), Ordering::Relaxed);
            drained
        };
        for (policy, notes) in streaks {
            if let Err(error) = store.add_streaks(&policy, &notes).await {
                tracing::debug!(%error, "could not write the streaks of denials");
            }
        }
        // What nothing counted: Envoy descriptors that met no limit, dimensions no rule counts.
        for (kept, unused) in [(&self.unmatched, false), (&self.unused, true)] {
            let drained = kept
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .drain();
            for (policy, shapes) in drained {
                let added = if unused {
                    store.add_unused(&policy, &shapes).await
                } else {
                    store.add_unmatched(&policy, &shapes).await
                };
                if let Err(error) = added {
                    tracing::debug!(%error, "could not count what nothing counted");
                }
            }
        }
        let pairs: Vec<(String, Vec<String>)> = std::mem::take(
            &mut self
                .together
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pending,
        )
        .into_iter()
        .collect();
        if let Err(error) = store.add_companions(&pairs).await {
            tracing::debug!(%error, "could not write which identifiers were checked together");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(raw: &[&str]) -> Vec<Identifier> {
        raw.iter().map(|r| Identifier::parse(r).unwrap()).collect()
    }

    #[test]
    fn a_pair_is_written_once_per_ten_minutes() {
        let live = LiveCounts::default();
        let both = ids(&["user=bob", "ip=203.0.113.11"]);
        live.checked_together(&both, 1_000);
        live.checked_together(&both, 2_000);
        let pending = std::mem::take(&mut live.together.lock().unwrap().pending);
        assert_eq!(pending.len(), 2);
        assert_eq!(pending["user=bob"], vec!["ip=203.0.113.11".to_owned()]);
        live.checked_together(&both, 3_000);
        assert!(live.together.lock().unwrap().pending.is_empty());
        // A new ten minutes writes it again; a single identifier has no companion.
        live.checked_together(&both, 600_000);
        live.checked_together(&ids(&["user=eve"]), 600_000);
        assert_eq!(live.together.lock().unwrap().pending.len(), 2);
    }

    #[test]
    fn a_denial_keeps_its_first_and_last_and_every_identifier() {
        let live = LiveCounts::default();
        let check = ids(&["user=scraper", "ip=192.0.2.66"]);
        for (at, retry) in [(1_000, Some(500)), (1_200, None)] {
            live.denied(
                "demo",
                Denial {
                    identifier: &check[1],
                    rule: "per-minute",
                    retry_after_ms: retry,
                },
                &check,
                at,
            );
        }
        let pending = live.pending.lock().unwrap();
        let note = &pending["demo"].notes["ip=192.0.2.66"];
        assert_eq!(
            (note.denials, note.first_ms, note.last_ms, note.until_ms),
            (2, 1_000, 1_200, None)
        );
        assert_eq!(note.identifiers, vec!["user=scraper", "ip=192.0.2.66"]);
    }
}
