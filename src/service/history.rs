//! History: every check this instance answers is counted here, in memory, by policy and
//! minute and by identifier and hour, and added to Redis every few seconds in one pipeline
//! (`Store::add_history`), so a check still costs one round trip. A flush that fails is
//! kept and sent with the next one; the last flush runs when the server stops.
//!
//! Reading: [`Service::history`] gives a policy's (or every policy's) series over a range
//! and its top lists, for the API and the pages.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;

use super::Service;
use crate::{
    domain::{
        Identifier, Name,
        history::{self, ALL, Counts, Outcome, Range, Step, TopKind},
    },
    store::{Store, StoreError, history::HistoryBatch},
    support::shutdown::Shutdown,
};

/// Identifier × policy × hour entries one instance keeps between flushes, at most; checks
/// beyond still count in the totals, not in the top lists.
const MAX_TRACKED: usize = 50_000;

/// Identifier → (checked, denied). Hashed with foldhash: on the check path, and the keys
/// come from the service's own callers, bounded in number (`MAX_TRACKED`).
type Tally = HashMap<String, (u64, u64), foldhash::fast::RandomState>;

#[derive(Default)]
struct PolicyPending {
    /// (minute, counts); a handful at most between two flushes.
    minutes: Vec<(i64, Counts)>,
    /// (hour, identifier → (checked, denied)).
    hours: Vec<(i64, Tally)>,
}

impl PolicyPending {
    fn count(&mut self, minute: i64, counts: &Counts) {
        match self.minutes.iter_mut().find(|(m, _)| *m == minute) {
            Some((_, c)) => c.add(counts),
            None => self.minutes.push((minute, *counts)),
        }
    }

    fn hour(&mut self, hour: i64) -> &mut Tally {
        let i = match self.hours.iter().position(|(h, _)| *h == hour) {
            Some(i) => i,
            None => {
                self.hours.push((hour, Tally::default()));
                self.hours.len() - 1
            }
        };
        &mut self.hours[i].1
    }
}

/// Adds to `identifier`'s tally; a new identifier only while `room`. Whether it added one.
fn bump(tally: &mut Tally, identifier: &str, checked: u64, denied: u64, room: bool) -> bool {
    if let Some(e) = tally.get_mut(identifier) {
        e.0 += checked;
        e.1 += denied;
        false
    } else if room {
        tally.insert(identifier.to_owned(), (checked, denied));
        true
    } else {
        false
    }
}

/// `dimension=value` into `out`.
fn label_into(out: &mut String, id: &Identifier) {
    out.clear();
    out.push_str(id.dimension().as_str());
    out.push('=');
    out.push_str(id.value());
}

#[derive(Default)]
struct Pending {
    policies: HashMap<String, PolicyPending, foldhash::fast::RandomState>,
    tracked: usize,
    /// Reused to build identifier labels without allocating for known ones.
    scratch: String,
}

impl Pending {
    fn policy(&mut self, policy: &str) -> &mut PolicyPending {
        if !self.policies.contains_key(policy) {
            self.policies
                .insert(policy.to_owned(), PolicyPending::default());
        }
        self.policies.get_mut(policy).expect("inserted above")
    }

    /// Adds a flush that could not be written back, so the next one carries it.
    fn merge(&mut self, other: Pending) {
        for (policy, p) in other.policies {
            let room = MAX_TRACKED.saturating_sub(self.tracked);
            let mut added = 0;
            let mine = self.policy(&policy);
            for (minute, counts) in p.minutes {
                mine.count(minute, &counts);
            }
            for (hour, ids) in p.hours {
                let tally = mine.hour(hour);
                for (id, (c, d)) in ids {
                    added += usize::from(bump(tally, &id, c, d, added < room));
                }
            }
            self.tracked += added;
        }
    }

    fn batch(&self) -> HistoryBatch {
        let mut batch = HistoryBatch::default();
        for (policy, p) in &self.policies {
            for (minute, counts) in &p.minutes {
                batch.counts.push((policy.clone(), *minute, *counts));
            }
            for (hour, ids) in &p.hours {
                // The most checked and the most denied of this flush, a list's worth each.
                let pick = |key: fn(&(u64, u64)) -> u64| {
                    history::largest(
                        ids.iter().map(|(id, c)| (id.clone(), *c)),
                        key,
                        history::TOP_SENT,
                    )
                };
                let mut chosen: Vec<String> = pick(|c| c.0).into_iter().map(|(id, _)| id).collect();
                chosen.extend(pick(|c| c.1).into_iter().map(|(id, _)| id));
                chosen.sort_unstable();
                chosen.dedup();
                let entries = chosen
                    .into_iter()
                    .map(|id| {
                        let (c, d) = ids[&id];
                        (id, c, d)
                    })
                    .collect();
                batch.top.push((policy.clone(), *hour, entries));
            }
        }
        batch
    }
}

/// This instance's counts on their way to the history.
#[derive(Clone, Default)]
pub struct HistoryCounts {
    pending: Arc<Mutex<Pending>>,
}

impl HistoryCounts {
    /// Counts one answered check of `policy`: its outcome, and each identifier it checked,
    /// each credited a denial when the check was denied (whichever bound; `denied_by` is the
    /// one that did, counted even when it is not among `identifiers`).
    pub fn record<'a>(
        &self,
        policy: &str,
        outcome: Outcome,
        identifiers: impl IntoIterator<Item = &'a Identifier>,
        denied_by: Option<&Identifier>,
    ) {
        let now = super::now_ms();
        let minute = Step::Minute.period_of(now);
        let hour = Step::Hour.period_of(now);
        let mut guard = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pending = &mut *guard;
        let room = pending.tracked < MAX_TRACKED;
        let mut scratch = std::mem::take(&mut pending.scratch);
        let p = pending.policy(policy);
        p.count(minute, &outcome.counts());
        let tally = p.hour(hour);
        let mut added = 0;
        let mut denied_listed = false;
        // A denied check is a denial of each of its identifiers (bob denied through his
        // address was denied), not only of the one that bound.
        let denied = u64::from(denied_by.is_some());
        for id in identifiers {
            label_into(&mut scratch, id);
            denied_listed |= denied_by == Some(id);
            added += usize::from(bump(tally, &scratch, 1, denied, room));
        }
        if let Some(id) = denied_by
            && !denied_listed
        {
            // A denial whose identifier was not among those listed.
            label_into(&mut scratch, id);
            added += usize::from(bump(tally, &scratch, 0, 1, room));
        }
        pending.tracked += added;
        pending.scratch = scratch;
    }

    /// Writes what was counted since the last flush; on failure keeps it for the next.
    pub async fn flush(&self, store: &Store) -> Result<(), StoreError> {
        let drained = std::mem::take(
            &mut *self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let batch = drained.batch();
        if batch.is_empty() {
            return Ok(());
        }
        let result = store.add_history(&batch).await;
        if result.is_err() {
            self.pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .merge(drained);
        }
        result
    }

    /// Flushes every `every` until the server stops, and once more then.
    pub fn spawn_flusher(&self, store: Store, every: Duration, shutdown: &Shutdown) {
        let counts = self.clone();
        let stop = shutdown.clone();
        shutdown.spawn_to_the_end(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    () = stop.stopped() => true,
                };
                if let Err(error) = counts.flush(&store).await {
                    tracing::warn!(%error, "could not add this instance's counts to the history");
                }
                if stopping {
                    break;
                }
            }
        });
    }
}

/// A history read: a policy's (or every policy's) checks over a range, and its top lists.
#[derive(Clone, Debug, Serialize)]
pub struct History {
    /// The policy, or `*` for every policy together.
    pub policy: String,
    pub range: Range,
    pub step: Step,
    /// Each period's start (ms since the epoch) and counts, oldest first.
    pub points: Vec<(i64, Counts)>,
    pub totals: Counts,
    /// Identifiers denied and checked most over the range (`policy|dimension=value` for
    /// every policy together).
    pub top_denied: Vec<(String, u64)>,
    pub top_checked: Vec<(String, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Service {
    /// The history of `policy` (`None`: every policy together) over `range` in steps of
    /// `step` (the range's own when `None`), with the `top` identifiers denied and checked
    /// most.
    pub async fn history(
        &self,
        policy: Option<&str>,
        range: Range,
        step: Option<Step>,
        top: usize,
    ) -> Result<History, HistoryError> {
        let scope = match policy {
            None | Some("") | Some(ALL) => ALL.to_owned(),
            Some(p) => Name::parse(p)
                .map_err(|message| HistoryError::Invalid {
                    field: "policy",
                    message,
                })?
                .to_string(),
        };
        let step = step.unwrap_or(range.default_step());
        range
            .check_step(step)
            .map_err(|message| HistoryError::Invalid {
                field: "step",
                message,
            })?;
        let now = super::now_ms();
        let series = self
            .store
            .history_series(&scope, step, range.periods(step, now))
            .await?;
        let mut totals = Counts::default();
        for (_, c) in &series {
            totals.add(c);
        }
        let top_step = range.top_step();
        let periods = range.periods(top_step, now);
        let (top_denied, top_checked) = if top == 0 {
            (Vec::new(), Vec::new())
        } else {
            (
                self.store
                    .history_top(&scope, TopKind::Denied, top_step, periods.clone(), top)
                    .await?,
                self.store
                    .history_top(&scope, TopKind::Checked, top_step, periods, top)
                    .await?,
            )
        };
        Ok(History {
            policy: scope,
            range,
            step,
            points: series
                .into_iter()
                .map(|(p, c)| (p * step.ms(), c))
                .collect(),
            totals,
            top_denied,
            top_checked,
        })
    }
}

impl Service {
    /// When `identifier` (`dimension=value`) was denied over the last 7 days, by hour and
    /// policy, oldest first: from the hourly lists of every policy's most denied (so only
    /// the hours it was among them; a count is a lower bound, see `history::TOP_ERROR`).
    pub async fn denials_of(
        &self,
        identifier: &str,
    ) -> Result<Vec<(i64, String, u64)>, StoreError> {
        let periods = Range::Week.periods(Step::Hour, super::now_ms());
        let lists = self
            .store
            .history_lists(ALL, TopKind::Denied, Step::Hour, periods)
            .await?;
        let mut out = Vec::new();
        for (hour, list) in lists {
            for (member, n) in list {
                let (policy, id) = history::split_member(&member);
                if id == identifier {
                    out.push((hour * Step::Hour.ms(), policy.to_owned(), n));
                }
            }
        }
        Ok(out)
    }
}

impl Service {
    /// Each policy this instance holds, with its totals over `range` (at the range's
    /// default step), read in one go.
    pub async fn policy_totals(&self, range: Range) -> Result<Vec<(String, Counts)>, StoreError> {
        let names: Vec<String> = self
            .policies
            .all()
            .iter()
            .map(|p| p.name.to_string())
            .collect();
        let step = range.default_step();
        let totals = self
            .store
            .history_totals(&names, step, range.periods(step, super::now_ms()))
            .await?;
        Ok(names.into_iter().zip(totals).collect())
    }
}
