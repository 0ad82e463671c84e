//! Coalescing counted checks on a single Redis: a check that arrives while Redis is busy with
//! earlier ones waits for the next call and goes in it with every other check that arrived
//! meanwhile, as one call of the check script in mode `batch` (see `lua/check.lua`).
//!
//! Nothing waits on a timer: when no call is out, a check goes at once, with the checks
//! waiting beside it. Only under load do checks share a call, and then Redis runs the
//! script's fixed part (the call, `TIME`, the counters of the overview) once for all of them; each check is still its own
//! all-or-nothing decision, evaluated in arrival order inside one atomic script, so the
//! answers are the ones the checks would have had one by one.

use std::time::Instant;

use futures_util::{StreamExt, stream::FuturesOrdered};
use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError};
use crate::domain::{Algorithm, Outcome};

/// Calls of the batch script out at once. They reach Redis in the order they were made,
/// so a check is decided after every check queued before it (`Service::check_all` relies
/// on it): one task makes them and polls each first in that order (a `FuturesOrdered`),
/// and a call's first poll puts its command on the connection's queue. Spawned, they
/// could overtake one another on a runtime of several threads. A call Redis answers
/// NOSCRIPT (a restart, SCRIPT FLUSH) is not sent again at once: the calls after it were
/// sent before anything loaded the script, so they find it missing too; once every call
/// out is back the task loads the scripts and sends the missing ones again in their
/// order, before any new call. Measured side by side (2 cores): four out against one,
/// 47k against 40k HTTP checks/s at 32 connections, 50k against 40k gRPC at 32 streams.
const IN_FLIGHT: usize = 4;

/// Times a call is sent again after Redis answered NOSCRIPT, before its checks fail: the
/// script was loaded before each, so only a client flushing scripts over and over gets
/// this far.
const RESENDS: u32 = 2;

/// Rule × identifier entries in one call at most, so no one script holds Redis (which runs
/// one script at a time) for long: about 2 µs an entry.
const MAX_ENTRIES: usize = 256;

/// Checks waiting for a call, at most; a caller beyond that waits to be queued.
const QUEUE: usize = 4096;

/// A check's answer from its call: the Redis time the script ran at (µs), and one outcome
/// per entry.
pub(super) type Answer = (i64, Vec<Outcome>);

/// One counted check, waiting for a call.
pub(super) struct Counted {
    pub keys: Vec<String>,
    pub rules: Vec<(Algorithm, bool)>,
    /// One per entry: `<policy>|<dimension>=<value>`.
    pub labels: Vec<String>,
    /// The rate hash of the check's policy.
    pub rate_key: String,
    pub cost: u64,
    pub context: super::CheckContext,
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
        rules: Vec<(Algorithm, bool)>,
        labels: Vec<String>,
        rate_key: String,
        cost: u64,
        context: super::CheckContext,
    ) -> Result<Answer, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Counted {
            keys,
            rules,
            labels,
            rate_key,
            cost,
            context,
            queued: Instant::now(),
            reply,
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        tokio::time::timeout_at(deadline, self.queue.send(job))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|_| stopped())?;
        // The whole wait, in the queue and in the call, within the timeout: a check never
        // waits out one call's timeout and then its own.
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(answer) => answer.map_err(|_| stopped())?,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Reply("the check queue has stopped".into())
}

/// One batch call as it came back: its checks, how many times it was sent, and Redis's
/// answer (`None`: Redis did not have the script).
struct Call {
    batch: Vec<Counted>,
    sent: u32,
    reply: Result<Option<String>, StoreError>,
}

async fn drive(store: Store, mut waiting: mpsc::Receiver<Counted>) {
    let mut out = FuturesOrdered::new();
    // Calls Redis answered NOSCRIPT, in the order they were made, with their sends so far.
    let mut missing: Vec<(Vec<Counted>, u32)> = Vec::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(call) = out.next() => {
                let Call { batch, sent, reply } = call;
                match reply {
                    Ok(Some(text)) => {
                        let answers = parse_batch_text(&text, &sizes(&batch));
                        answer(batch, answers);
                    }
                    Ok(None) if sent <= RESENDS => missing.push((batch, sent)),
                    Ok(None) => answer(batch, Err(StoreError::Reply(
                        "Redis lost the check script each time it was loaded".into(),
                    ))),
                    Err(error) => answer(batch, Err(error)),
                }
                if out.is_empty() && !missing.is_empty() {
                    let lost = std::mem::take(&mut missing);
                    match store.load_batch_scripts(lost.iter().map(|(b, _)| b)).await {
                        Ok(()) => {
                            for (batch, sent) in lost {
                                let batch = still_awaited(batch, store.timeout);
                                if !batch.is_empty() {
                                    out.push_back(store.clone().send_batch(batch, sent + 1));
                                }
                            }
                        }
                        Err(error) => {
                            for (batch, _) in lost {
                                answer(batch, Err(error.clone()));
                            }
                        }
                    }
                }
            }
            first = waiting.recv(), if open && missing.is_empty() && out.len() < IN_FLIGHT => {
                let Some(first) = first else {
                    open = false;
                    continue;
                };
                // Let the tasks already waiting to run go first: checks come in clumps (an
                // HTTP/2 read of 16 requests spawns 16 stream tasks; a Redis reply wakes the
                // callers that send the next ones), and the first check's push wakes this
                // task ahead of the rest of its clump (tokio runs a task woken by the
                // running one next). Without this turn a clump went out as a call of one
                // and a call of the rest. Measured with one call out (2 cores, 5 s runs,
                // not side by side): gRPC at 32 streams 33-36k -> 40k checks/s; HTTP/1.1
                // at 32 connections no change beyond the noise (36-40k).
                tokio::task::yield_now().await;
                let mut batch = Vec::new();
                let mut entries = 0;
                let mut next = Some(first);
                while let Some(job) = next {
                    entries += job.keys.len();
                    batch.push(job);
                    next = if entries < MAX_ENTRIES {
                        waiting.try_recv().ok()
                    } else {
                        None
                    };
                }
                let batch = still_awaited(batch, store.timeout);
                if !batch.is_empty() {
                    out.push_back(store.clone().send_batch(batch, 1));
                }
            }
            else => break,
        }
    }
}

/// The checks of `batch` someone still waits for; the others are answered with the
/// timeout. A check whose caller stopped waiting (its timeout passed while Redis stalled)
/// is not sent late: it would consume for an answer nobody reads.
fn still_awaited(batch: Vec<Counted>, timeout: std::time::Duration) -> Vec<Counted> {
    batch
        .into_iter()
        .filter_map(|job| {
            if job.reply.is_closed() || job.queued.elapsed() >= timeout {
                let _ = job.reply.send(Err(StoreError::Timeout(timeout)));
                None
            } else {
                Some(job)
            }
        })
        .collect()
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
    /// The script that runs `batch`: one made for the algorithms it uses.
    fn batch_script(&self, batch: &[Counted]) -> &redis::Script {
        let algorithms = batch.iter().flat_map(|c| c.rules.iter().map(|(a, _)| a));
        self.scripts.checks.for_algorithms(algorithms)
    }

    /// One call of the batch script for `batch`, its `sent`th. Everything up to putting the
    /// command on the connection's queue happens in the first poll (the order of calls
    /// rests on it); a NOSCRIPT comes back as `None`, not as Redis failing.
    async fn send_batch(self, batch: Vec<Counted>, sent: u32) -> Call {
        let script = self.batch_script(&batch);
        let minute = super::stats::minute_of(super::stats::now_ms());
        // EVALSHA written straight into one command buffer (a ScriptInvocation would hold
        // each key and argument in an allocation of its own first).
        let keys = batch.iter().map(|c| c.keys.len() + 1).sum::<usize>() + 2;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        for check in &batch {
            for key in &check.keys {
                cmd.arg(key);
            }
            cmd.arg(&check.rate_key);
        }
        cmd.arg(self.keys.stats_denied(minute))
            .arg(self.keys.stats_near(minute));
        cmd.arg("").arg(batch.len()).arg("batch");
        for check in &batch {
            cmd.arg(check.keys.len()).arg(check.cost);
            for rule in &check.rules {
                super::entry_args(&mut cmd, rule, &check.context);
            }
            for label in &check.labels {
                cmd.arg(label);
            }
        }
        let mut conn = self.backend.clone();
        let reply = self
            .with_timeout(async move {
                match cmd.query_async::<String>(&mut conn).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        Ok(None)
                    }
                    other => other.map(Some),
                }
            })
            .await;
        Call { batch, sent, reply }
    }

    /// Loads the scripts of the calls in `batches` (each once).
    async fn load_batch_scripts<'a>(
        &self,
        batches: impl Iterator<Item = &'a Vec<Counted>>,
    ) -> Result<(), StoreError> {
        let mut scripts: Vec<&redis::Script> = Vec::new();
        for batch in batches {
            let script = self.batch_script(batch);
            if !scripts.iter().any(|s| s.get_hash() == script.get_hash()) {
                scripts.push(script);
            }
        }
        for script in scripts {
            let mut conn = self.backend.clone();
            self.with_timeout(script.load_async(&mut conn)).await?;
        }
        Ok(())
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
mod tests {
    use super::*;

    #[test]
    fn a_batch_reply_is_split_per_check() {
        // now, check 1 (1 entry, allowed), check 2 (2 entries, denied by the second)
        let raw = [
            7, 1, 1, 10, 9, 1000, -1, 0, 0, 1, 5, 4, 500, -1, 0, 0, 3, 0, 200, 200, 0,
        ];
        let out = parse_batch(&raw, &[1, 2]).unwrap();
        assert_eq!(out.len(), 2);
        let (first, second) = (out[0].as_ref().unwrap(), out[1].as_ref().unwrap());
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].remaining, 9);
        assert_eq!(second.len(), 2);
        assert!(second[0].allowed);
        assert!(!second[1].allowed);
        assert_eq!(second[1].retry_after_ms, Some(200));
        // A reply of the wrong length is an error, not a misattributed answer.
        assert!(parse_batch(&raw[..raw.len() - 1], &[1, 2]).is_err());
        assert!(parse_batch(&raw, &[2, 1, 1]).is_err());
    }

    #[test]
    fn a_failed_check_fails_alone() {
        // check 0 (1 entry) failed, check 1 (1 entry) allowed
        let text = "7,-1,0,0,0,0,0,0,1,1,10,9,1000,-1,0\n0:WRONGTYPE Operation against a key";
        let (now, out) = parse_batch_text(text, &[1, 1]).unwrap();
        assert_eq!(now, 7);
        assert!(matches!(&out[0], Err(StoreError::Script(m)) if m.starts_with("WRONGTYPE")));
        assert_eq!(out[1].as_ref().unwrap()[0].remaining, 9);
        // A failure line without its marked check, or the reverse, is a broken reply.
        assert!(
            parse_batch_text("7,1,1,10,9,1000,-1,0,-1,0,0,0,0,0,0", &[1, 1])
                .unwrap()
                .1[1]
                .is_err()
        );
        assert!(parse_batch_text("7,1,1,10,9,1000,-1,0\n3:oops", &[1]).is_err());
        assert!(parse_batch_text("7,1,1,10,9,1000,-1,0\nnonsense", &[1]).is_err());
    }

    #[test]
    fn the_batch_reply_string_reads_as_redis_would_read_lua_numbers() {
        assert_eq!(
            integers("1763860000123456,1,-1,0,2.5,1e+15").unwrap(),
            [1_763_860_000_123_456, 1, -1, 0, 2, 1_000_000_000_000_000]
        );
        assert!(integers("1,,2").is_err());
        assert!(integers("1,nan").is_err());
        assert!(integers("oops").is_err());
    }
}
