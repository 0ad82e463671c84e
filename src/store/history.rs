//! History in Redis: each instance's counts of the last few seconds added to blocks of
//! minutes, hours and days (hashes), and its most checked and denied identifiers to each
//! hour's and day's top lists (sorted sets). Written by the instances' flushes, never on the
//! check path; read by whole keys, never by scanning. Every key has a TTL.
//!
//! Layout (see `Keys::history_counts` and `Keys::history_top`):
//! - counts: `hist:{<scope>}:<step>:<block>`, a hash of `<period in block><code>` → count
//!   (codes a, d, s, g: allowed, denied, shadow-denied, degraded). Kept until the block's
//!   last period ends plus 48 hours (minutes), 90 days (hours) or 400 days (days).
//! - top lists: `hist:{<scope>}:top:<checked|denied>:<hour|day>:<period>`, a sorted set of
//!   `<dimension>=<value>` (for scope `*`: `<policy>|<dimension>=<value>`) → count, cut to
//!   its largest after each addition. Hours kept 8 days, days 90 days. A flush adds each
//!   list's 64 largest of the flush and keeps 64, in one MULTI on a single Redis, so a list
//!   stays a listpack (Redis's compact encoding, up to 128 members of up to 64 bytes).

use std::collections::HashMap;

use super::{Store, StoreError};
use crate::domain::history::{self, ALL, Counts, Step, TopKind};

/// How long an hour's and a day's top lists are kept after the period ends.
const TOP_HOURS_KEPT_MS: i64 = 8 * 24 * 3_600_000;
const TOP_DAYS_KEPT_MS: i64 = 90 * 24 * 3_600_000;

/// An identifier with how often it was checked and denied.
pub type TopEntry = (String, u64, u64);

/// One flush of one instance: what it counted since the last.
#[derive(Clone, Debug, Default)]
pub struct HistoryBatch {
    /// Checks per policy and minute (periods of `Step::Minute`).
    pub counts: Vec<(String, i64, Counts)>,
    /// Per policy and hour (periods of `Step::Hour`): identifiers with how often they were
    /// checked and denied, the largest only (see `history::TOP_SENT`).
    pub top: Vec<(String, i64, Vec<TopEntry>)>,
}

impl HistoryBatch {
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.top.is_empty()
    }
}

impl Store {
    /// Adds one flush to the history: counts to every step's block of the policy and of
    /// every policy together, identifiers to the hour's and day's top lists. One pipeline.
    pub async fn add_history(&self, batch: &HistoryBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        if !self.is_cluster() {
            // One flush at a time: a list never holds more than it keeps plus one flush.
            pipe.atomic();
        }
        let mut expiries = self.add_counts(&mut pipe, batch);
        for (key, (expiry, entries)) in self.top_lists(batch) {
            for (member, n) in history::largest(entries, |n| *n, history::TOP_SENT) {
                pipe.cmd("ZINCRBY").arg(&key).arg(n).arg(member).ignore();
            }
            // Keeps the largest: ranks 0.. are the smallest.
            pipe.cmd("ZREMRANGEBYRANK")
                .arg(&key)
                .arg(0)
                .arg(-(history::TOP_KEPT as i64) - 1)
                .ignore();
            expiries.insert(key, expiry);
        }
        for (key, at) in expiries {
            pipe.cmd("PEXPIREAT").arg(key).arg(at).ignore();
        }
        let () = self.query_pipe(&pipe).await?;
        Ok(())
    }

    /// Adds `batch`'s counts to `pipe`: each policy's, and every policy's together, to the
    /// block of every step. Returns the expiry (ms since the epoch) of each key it adds to.
    fn add_counts(&self, pipe: &mut redis::Pipeline, batch: &HistoryBatch) -> HashMap<String, i64> {
        let mut expiries: HashMap<String, i64> = HashMap::new();
        let mut all: HashMap<i64, Counts> = HashMap::new();
        for (_, minute, counts) in &batch.counts {
            all.entry(*minute).or_default().add(counts);
        }
        let scoped = batch
            .counts
            .iter()
            .map(|(p, m, c)| (p.as_str(), *m, *c))
            .chain(all.iter().map(|(m, c)| (ALL, *m, *c)));
        for (scope, minute, counts) in scoped {
            let ms = minute * Step::Minute.ms();
            for step in Step::ALL {
                let (block, index) = step.block_of(step.period_of(ms));
                let key = self.keys.history_counts(scope, step, block);
                for (code, n) in counts.fields() {
                    if n > 0 {
                        pipe.cmd("HINCRBY")
                            .arg(&key)
                            .arg(format!("{index}{code}"))
                            .arg(n)
                            .ignore();
                    }
                }
                expiries.insert(key, step.block_expiry_ms(block));
            }
        }
        expiries
    }

    /// The top lists `batch` adds to, by key: each list's expiry (ms since the epoch) and
    /// the entries of this flush for it. Each list gets the largest of this flush only, and
    /// keeps its largest after it.
    fn top_lists(&self, batch: &HistoryBatch) -> HashMap<String, (i64, Vec<(String, u64)>)> {
        let mut lists: HashMap<String, (i64, Vec<(String, u64)>)> = HashMap::new();
        for (policy, hour, identifiers) in &batch.top {
            for (step, period, kept_ms) in [
                (Step::Hour, *hour, TOP_HOURS_KEPT_MS),
                (Step::Day, hour.div_euclid(24), TOP_DAYS_KEPT_MS),
            ] {
                let expiry = (period + 1) * step.ms() + kept_ms;
                for kind in [TopKind::Checked, TopKind::Denied] {
                    let n = |c: u64, d: u64| match kind {
                        TopKind::Checked => c,
                        TopKind::Denied => d,
                    };
                    let own = self.keys.history_top(policy, kind, step, period);
                    let every = self.keys.history_top(ALL, kind, step, period);
                    for (identifier, c, d) in identifiers {
                        if n(*c, *d) == 0 {
                            continue;
                        }
                        lists
                            .entry(own.clone())
                            .or_insert_with(|| (expiry, Vec::new()))
                            .1
                            .push((identifier.clone(), n(*c, *d)));
                        lists
                            .entry(every.clone())
                            .or_insert_with(|| (expiry, Vec::new()))
                            .1
                            .push((history::all_member(policy, identifier), n(*c, *d)));
                    }
                }
            }
        }
        lists
    }

    /// The counts of `scope` for each period of `step` in `periods`, oldest first (zeros
    /// where nothing was counted).
    pub async fn history_series(
        &self,
        scope: &str,
        step: Step,
        periods: std::ops::RangeInclusive<i64>,
    ) -> Result<Vec<(i64, Counts)>, StoreError> {
        let (first, _) = step.block_of(*periods.start());
        let (last, _) = step.block_of(*periods.end());
        let mut pipe = redis::pipe();
        for block in first..=last {
            pipe.cmd("HGETALL")
                .arg(self.keys.history_counts(scope, step, block));
        }
        let blocks: Vec<HashMap<String, u64>> = self.query_pipe(&pipe).await?;
        let mut by_period: HashMap<i64, Counts> = HashMap::new();
        for (block, fields) in (first..=last).zip(blocks) {
            for (field, n) in fields {
                if let Some((period, code)) = parse_field(&field, block, step) {
                    by_period.entry(period).or_default().add_code(code, n);
                }
            }
        }
        Ok(periods
            .map(|p| (p, by_period.get(&p).copied().unwrap_or_default()))
            .collect())
    }

    /// The totals over `periods` of `step` of each of `scopes`, in their order: one
    /// pipeline of whole blocks.
    pub async fn history_totals(
        &self,
        scopes: &[String],
        step: Step,
        periods: std::ops::RangeInclusive<i64>,
    ) -> Result<Vec<Counts>, StoreError> {
        let (first, _) = step.block_of(*periods.start());
        let (last, _) = step.block_of(*periods.end());
        let mut pipe = redis::pipe();
        for scope in scopes {
            for block in first..=last {
                pipe.cmd("HGETALL")
                    .arg(self.keys.history_counts(scope, step, block));
            }
        }
        let blocks: Vec<HashMap<String, u64>> = self.query_pipe(&pipe).await?;
        let per_scope = (last - first + 1) as usize;
        Ok(blocks
            .chunks(per_scope.max(1))
            .map(|chunk| {
                let mut total = Counts::default();
                for (block, fields) in (first..=last).zip(chunk) {
                    for (field, n) in fields {
                        if let Some((period, code)) = parse_field(field, block, step)
                            && periods.contains(&period)
                        {
                            total.add_code(code, *n);
                        }
                    }
                }
                total
            })
            .collect())
    }

    /// The `n` largest of `scope`'s `kind` lists over `periods` of `step` (hour or day),
    /// summed per identifier.
    pub async fn history_top(
        &self,
        scope: &str,
        kind: TopKind,
        step: Step,
        periods: std::ops::RangeInclusive<i64>,
        n: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let lists = self.history_lists(scope, kind, step, periods).await?;
        Ok(history::merge_top(
            lists.iter().map(|(_, l)| l.as_slice()),
            n,
        ))
    }

    /// Each of `scope`'s `kind` lists over `periods` of `step`, oldest first, whole.
    pub async fn history_lists(
        &self,
        scope: &str,
        kind: TopKind,
        step: Step,
        periods: std::ops::RangeInclusive<i64>,
    ) -> Result<Vec<(i64, Vec<(String, u64)>)>, StoreError> {
        let mut pipe = redis::pipe();
        for period in periods.clone() {
            pipe.cmd("ZRANGE")
                .arg(self.keys.history_top(scope, kind, step, period))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let lists: Vec<Vec<(String, f64)>> = self.query_pipe(&pipe).await?;
        Ok(periods
            .zip(lists)
            .map(|(p, l)| (p, l.into_iter().map(|(m, s)| (m, s as u64)).collect()))
            .collect())
    }
}

/// A counts field, `<period in block><code>`: the period and the code.
fn parse_field(field: &str, block: i64, step: Step) -> Option<(i64, char)> {
    let code = field.chars().last()?;
    let index = field[..field.len() - code.len_utf8()].parse::<i64>().ok()?;
    Some((block * step.per_block() + index, code))
}
