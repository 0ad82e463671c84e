//! Coalescing counted checks on a single Redis: checks that arrive while Redis is busy with
//! earlier ones go together in one call of the check script in mode `batch` (see
//! `lua/check.lua`), each still its own all-or-nothing decision, evaluated in arrival order
//! inside the one atomic script, so the answers are the ones the checks would have had one
//! by one. Redis then runs the script's fixed part (the call, `TIME`, the counters of the
//! overview) once for all of them.
//!
//! Nothing waits on a timer: a check that finds a call free goes at once, with the checks
//! waiting beside it. Up to four calls are out at once, and calls out together never share
//! a state key: a check that would share one with a call out waits for that call (and the
//! checks of its keys queued after it wait behind it). So every key sees its checks in the
//! order they were queued whatever order the calls reach Redis in, including a call sent
//! again after NOSCRIPT, after a reconnect, or behind a full connection queue. Checks that
//! share no key commute: their live counters only add up (but for the near-limit set, where
//! the later of two checks of one label sets the percentage shown). One gap, as with one
//! call out: a call whose caller timed out frees its keys, though Redis may still run it
//! later; the next call of those keys follows it on the same connection, so it is still
//! run after it, unless the connection was replaced in between.

use std::time::Instant;

use std::collections::{HashSet, VecDeque};

use futures_util::{StreamExt, stream::FuturesUnordered};
use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError};
use crate::domain::{Algorithm, Outcome};

/// Calls of the batch script out at once: four rather than one kept Redis busy while a
/// reply travelled back (measured in benches/DESIGN.md).
const IN_FLIGHT: usize = 4;

/// Work in one call at most, so no one script holds Redis (which runs one script at a time)
/// for long: a unit is about what an ordinary entry costs Redis (2 µs), and costly entries
/// count for more ([`work_of`]), so a call holds Redis about half a millisecond at most.
const MAX_WORK: usize = 256;

/// A check whose entries weigh this much or more goes in a call of its own: the checks of
/// other policies behind it do not wait on it, and it does not wait on them.
const ALONE: usize = 64;

/// The work of one entry of `algorithm` in the check script, in units of an ordinary
/// entry, at its worst: a bucketed window reads the buckets that left it since its last
/// write (all of them, up to 3,600, after a window idle; a denial reads from the oldest), a
/// sliding log
/// searches its list (up to 100,000 elements); the rest touch one key a fixed number of
/// times.
pub(super) fn work_of(algorithm: &Algorithm) -> usize {
    match *algorithm {
        Algorithm::BucketedWindow {
            window_ms,
            bucket_ms,
            ..
        } => 1 + (window_ms / bucket_ms.max(1)) as usize / 32,
        // Each LINDEX of a long log walks its list's nodes: a log weighs by its length,
        // and one of 100,000 goes alone (benches/DESIGN.md).
        Algorithm::SlidingLog { limit, .. } => (1 + limit as usize / 1500).min(ALONE),
        _ => 1,
    }
}

/// Checks waiting in the queue, at most, and checks left pending, at most: a caller beyond
/// that waits to be queued (within its timeout).
const QUEUE: usize = 4096;

/// A check's answer from its call: the Redis time the script ran at (µs), and one outcome
/// per entry.
pub(super) type Answer = (i64, Vec<Outcome>);

/// One counted check, waiting for a call.
pub(super) struct Counted {
    pub keys: Vec<String>,
    /// The keys' hashes (`key_hash`), worked out once by the caller's task.
    hashes: Vec<u64>,
    /// What its entries weigh in a call ([`work_of`]).
    work: usize,
    /// Set once its call is sent: a caller that times out after that may still see Redis
    /// apply it.
    sent: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub rules: Vec<(Algorithm, super::check::Counting)>,
    /// One per entry: `<policy>|<dimension>=<value>`.
    pub labels: Vec<String>,
    /// The rate hash of the check's policy.
    pub rate_key: String,
    pub cost: u64,
    pub context: super::CheckContext,
    /// The check's span, when it is traced: the call that carries it links it.
    trace: Option<opentelemetry::trace::SpanContext>,
    queued: Instant,
    reply: oneshot::Sender<Result<Answer, StoreError>>,
}

/// The queue in front of the batch calls; its task ends when the last store clone is gone.
pub(super) struct Coalescer {
    queue: mpsc::Sender<Counted>,
    /// The Redis timeout: the longest a check waits, queue and call together.
    timeout: std::time::Duration,
}

impl Coalescer {
    /// Starts the task that sends batches through `store` (a store without a coalescer).
    pub(super) fn start(store: Store) -> Self {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let timeout = store.timeout;
        tokio::spawn(drive(store, waiting));
        Self { queue, timeout }
    }

    /// Queues one check and waits for its outcomes (one per entry, in order).
    pub(super) async fn check(
        &self,
        keys: Vec<String>,
        rules: Vec<(Algorithm, super::check::Counting)>,
        labels: Vec<String>,
        rate_key: String,
        cost: u64,
        context: super::CheckContext,
    ) -> Result<Answer, StoreError> {
        let (reply, answer) = oneshot::channel();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let job = Counted {
            hashes: keys.iter().map(|k| key_hash(k)).collect(),
            work: rules.iter().map(|(a, _)| work_of(a)).sum(),
            sent: sent.clone(),
            keys,
            rules,
            labels,
            rate_key,
            cost,
            context,
            trace: crate::telemetry::traces::current_sampled(),
            queued: Instant::now(),
            reply,
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        if tokio::time::timeout_at(deadline, self.queue.send(job))
            .await
            .is_err()
        {
            crate::telemetry::metrics::check_timed_out(false);
            return Err(StoreError::Timeout(self.timeout));
        }
        // The whole wait, in the queue and in the call, within the timeout: a check never
        // waits out one call's timeout and then its own.
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(answer) => answer.map_err(|_| stopped())?,
            Err(_) => {
                crate::telemetry::metrics::check_timed_out(
                    sent.load(std::sync::atomic::Ordering::Acquire),
                );
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Stopped
}

/// One batch call as it came back: its checks (whose keys it held) and Redis's answer.
struct Call {
    batch: Vec<Counted>,
    reply: Result<String, StoreError>,
}

/// The checks received and not yet sent, and the state keys of the calls out.
struct Calls {
    /// Checks left for later, oldest first: each shares a key with a call out or with a
    /// check left before it, or a full call cut it off. At most QUEUE.
    pending: VecDeque<Counted>,
    /// The hashes of every key of the checks in `pending`: a check that arrives with one of
    /// them waits behind them.
    pending_keys: HashSet<u64>,
    /// Hashes of the state keys of every call out (a collision only makes a check wait).
    busy: HashSet<u64>,
    /// The Redis timeout: the longest a check waits, queue and call together.
    timeout: std::time::Duration,
}

impl Calls {
    /// The next call's checks, in order, up to MAX_WORK of work (a check of ALONE or more
    /// alone): with `rescan` (a call came back, so keys are free) the pending checks first;
    /// then `first` and the queue. A check that shares a key with a call out or with a
    /// pending check is left pending;
    /// a check nobody waits for any more is answered with the timeout and dropped. The keys
    /// of the checks returned are busy from now on, until `returned`.
    fn next_batch(
        &mut self,
        rescan: bool,
        first: Option<Counted>,
        waiting: &mut mpsc::Receiver<Counted>,
    ) -> Vec<Counted> {
        let mut batch = Vec::new();
        let mut work = 0;
        let mut earlier = VecDeque::new();
        if rescan {
            earlier = std::mem::take(&mut self.pending);
            self.pending_keys.clear();
        }
        let mut first = first;
        loop {
            let job = if let Some(job) = earlier.pop_front() {
                job
            } else if let Some(job) = first.take() {
                job
            } else if work < MAX_WORK && self.pending.len() < QUEUE {
                match waiting.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            } else {
                break;
            };
            // A check whose caller stopped waiting (its timeout passed while Redis stalled)
            // is not sent late: it would consume for an answer nobody reads.
            if job.reply.is_closed() || job.queued.elapsed() >= self.timeout {
                let _ = job.reply.send(Err(StoreError::Timeout(self.timeout)));
                continue;
            }
            let costly = job.work >= ALONE;
            let waits = work >= MAX_WORK
                || (costly && !batch.is_empty())
                || job
                    .hashes
                    .iter()
                    .any(|h| self.busy.contains(h) || self.pending_keys.contains(h));
            if waits {
                self.pending_keys.extend(job.hashes.iter().copied());
                self.pending.push_back(job);
            } else {
                // A costly check fills its call: what follows waits for the next one.
                work = if costly { MAX_WORK } else { work + job.work };
                batch.push(job);
            }
        }
        // Busy once the call is made, not before: checks of one key go in one call together.
        self.busy
            .extend(batch.iter().flat_map(|c| c.hashes.iter().copied()));
        batch
    }

    /// The keys of `batch`, a call that came back, are free again.
    fn returned(&mut self, batch: &[Counted]) {
        for hash in batch.iter().flat_map(|c| &c.hashes) {
            self.busy.remove(hash);
        }
    }
}

fn key_hash(key: &str) -> u64 {
    use std::hash::BuildHasher;
    KEY_HASHER.hash_one(key)
}

/// One hasher for the process: a key's hash is the same for every call.
static KEY_HASHER: std::sync::LazyLock<std::collections::hash_map::RandomState> =
    std::sync::LazyLock::new(std::collections::hash_map::RandomState::new);

async fn drive(store: Store, mut waiting: mpsc::Receiver<Counted>) {
    let mut out = FuturesUnordered::new();
    let mut calls = Calls {
        pending: VecDeque::new(),
        pending_keys: HashSet::new(),
        busy: HashSet::new(),
        timeout: store.timeout,
    };
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(call) = out.next() => {
                let Call { batch, reply } = call;
                calls.returned(&batch);
                let answers = reply.and_then(|text| parse_batch_text(&text, &sizes(&batch)));
                answer(batch, answers);
                // The keys it held are free: checks left for them may go now. (A pending
                // check always waits for a call out: it shares a key with one, or with a
                // pending check that does, or the call that cut it off is out.)
                while out.len() < IN_FLIGHT && !calls.pending.is_empty() {
                    let batch = calls.next_batch(true, None, &mut waiting);
                    if batch.is_empty() {
                        break;
                    }
                    out.push(store.clone().send_batch(batch));
                }
            }
            first = waiting.recv(), if open && out.len() < IN_FLIGHT && calls.pending.len() < QUEUE => {
                let Some(first) = first else {
                    open = false;
                    continue;
                };
                // Let the tasks already waiting to run go first: checks come in clumps (an
                // HTTP/2 read of 16 requests spawns 16 stream tasks; a Redis reply wakes the
                // callers that send the next ones), and the first check's push wakes this
                // task ahead of the rest of its clump (tokio runs a task woken by the
                // running one next). Without this turn a clump went out as a call of one
                // and a call of the rest (benches/DESIGN.md).
                tokio::task::yield_now().await;
                // No key was freed since the last call was made: the pending checks still
                // wait, and a new one only needs to know their keys.
                let batch = calls.next_batch(false, Some(first), &mut waiting);
                if !batch.is_empty() {
                    out.push(store.clone().send_batch(batch));
                }
            }
            else => break,
        }
    }
}

fn sizes(batch: &[Counted]) -> Vec<usize> {
    batch.iter().map(|c| c.keys.len()).collect()
}

/// Gives every check of `batch` its outcomes, or the error.
fn answer(batch: Vec<Counted>, answers: Result<(i64, Vec<CheckOutcomes>), StoreError>) {
    match answers {
        Ok((now_us, outcomes)) => {
            for (check, outcomes) in batch.into_iter().zip(outcomes) {
                let _ = check.reply.send(outcomes.map(|o| (now_us, o)));
            }
        }
        Err(error) => {
            for check in batch {
                let _ = check.reply.send(Err(error.clone()));
            }
        }
    }
}

impl Store {
    /// One call of the batch script for `batch`.
    async fn send_batch(self, batch: Vec<Counted>) -> Call {
        crate::telemetry::metrics::checks_per_call(batch.len());
        for check in &batch {
            check.sent.store(true, std::sync::atomic::Ordering::Release);
        }
        let algorithms = batch.iter().flat_map(|c| c.rules.iter().map(|(a, _)| a));
        let script = self.scripts.checks.for_algorithms(algorithms);
        let minute = super::stats::minute_of(super::stats::now_ms());
        // EVALSHA written straight into one command buffer (a ScriptInvocation would hold
        // each key and argument in an allocation of its own first).
        let penalties: Vec<Vec<String>> = batch
            .iter()
            .map(|c| super::penalty_keys(&c.keys, &c.rules))
            .collect();
        let keys = batch
            .iter()
            .zip(&penalties)
            .map(|(c, p)| c.keys.len() + p.len() + 1)
            .sum::<usize>()
            + 2;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        for (check, penalties) in batch.iter().zip(&penalties) {
            for key in check.keys.iter().chain(penalties) {
                cmd.arg(key);
            }
            cmd.arg(&check.rate_key);
        }
        cmd.arg(self.keys.stats_denied(minute))
            .arg(self.keys.stats_near(minute));
        cmd.arg("").arg(batch.len()).arg("batch");
        for (check, penalties) in batch.iter().zip(&penalties) {
            if penalties.is_empty() {
                cmd.arg(check.keys.len());
            } else {
                cmd.arg(format!("{}:{}", check.keys.len(), penalties.len()));
            }
            cmd.arg(check.cost);
            let mut penalty_at = super::penalty_offsets(check.keys.len());
            for rule in &check.rules {
                super::entry_args(&mut cmd, rule, &check.context, penalty_at(rule));
            }
            for label in &check.labels {
                cmd.arg(label);
            }
        }
        let carried: Vec<_> = batch.iter().filter_map(|c| c.trace.clone()).collect();
        let reply = Store::traced_script_call(&carried, self.evalsha::<String>(script, &cmd)).await;
        Call { batch, reply }
    }
}

/// One check's outcomes from a batch call, or its own failure.
type CheckOutcomes = Result<Vec<Outcome>, StoreError>;

/// The batch reply: the integers, then a line per check whose script failed
/// (`<index>:<error>`); the time the script ran at, and for each check its outcomes or its
/// own error.
fn parse_batch_text(text: &str, sizes: &[usize]) -> Result<(i64, Vec<CheckOutcomes>), StoreError> {
    let mut lines = text.split('\n');
    let raw = integers(lines.next().unwrap_or_default())?;
    let mut failures = std::collections::HashMap::new();
    for line in lines {
        let (index, message) = line
            .split_once(':')
            .and_then(|(i, m)| Some((i.parse::<usize>().ok()?, m)))
            .ok_or_else(|| {
                StoreError::Reply(format!("check.lua answered {line:?} for a failure"))
            })?;
        failures.insert(index, message);
    }
    let mut out = Vec::with_capacity(sizes.len());
    for (i, outcomes) in parse_batch(&raw, sizes)?.into_iter().enumerate() {
        out.push(match (outcomes, failures.remove(&i)) {
            (_, Some(message)) => {
                tracing::error!(
                    error = message,
                    "the check script failed for one check of a batch"
                );
                Err(StoreError::Script(message.to_owned()))
            }
            (Some(outcomes), None) => Ok(outcomes),
            (None, None) => Err(StoreError::Reply(
                "check.lua marked a check failed without saying why".into(),
            )),
        });
    }
    if let Some(index) = failures.keys().next() {
        return Err(StoreError::Reply(format!(
            "check.lua reported a failure of check {index}, which the batch does not have"
        )));
    }
    Ok((raw[0], out))
}

/// The batch reply's integers, from the one string it comes as: joined by ',', each as
/// Lua wrote it (digits, or a fraction, truncated toward zero as Redis would).
fn integers(text: &str) -> Result<Vec<i64>, StoreError> {
    text.split(',')
        .map(|v| {
            v.parse::<i64>()
                .ok()
                .or_else(|| {
                    v.parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .map(|f| f.trunc() as i64)
                })
                .ok_or_else(|| StoreError::Reply(format!("check.lua answered {v:?} for a number")))
        })
        .collect()
}

/// The batch reply: `now`, then per check `allowed` and 6 integers per entry; `None` for a
/// check whose script failed (`allowed` -1).
fn parse_batch(raw: &[i64], sizes: &[usize]) -> Result<Vec<Option<Vec<Outcome>>>, StoreError> {
    let expected = 1 + sizes.iter().map(|n| 1 + 6 * n).sum::<usize>();
    if raw.len() != expected {
        return Err(StoreError::Reply(format!(
            "check.lua answered {} integers for a batch that needs {expected}",
            raw.len()
        )));
    }
    let mut at = 1;
    let mut out = Vec::with_capacity(sizes.len());
    for &n in sizes {
        let check = &raw[at..at + 1 + 6 * n];
        at += 1 + 6 * n;
        if check[0] == -1 {
            out.push(None);
            continue;
        }
        // The same layout as a single check's reply without `now`: reuse its parser.
        let mut single = Vec::with_capacity(2 + 6 * n);
        single.push(check[0]);
        single.push(raw[0]);
        single.extend_from_slice(&check[1..]);
        out.push(Some(super::parse_reply(&single, n)?.outcomes));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
