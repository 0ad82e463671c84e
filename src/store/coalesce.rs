//! Coalescing counted checks on a single Redis: a check that arrives while Redis is busy with
//! earlier ones waits for the next call and goes in it with every other check that arrived
//! meanwhile, as one call of the check script in mode `batch` (see `lua/check.lua`).
//!
//! Nothing waits on a timer: when no call is out, a check goes at once, with the checks
//! waiting beside it. Only under load do checks share a call, and then Redis runs the
//! script's fixed part (the call, `TIME`, the counters of the overview) once for all of them; each check is still its own
//! all-or-nothing decision, evaluated in arrival order inside one atomic script, so the
//! answers are the ones the checks would have had one by one.

use std::{sync::Arc, time::Instant};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Store, StoreError};
use crate::domain::{Algorithm, Outcome};

/// Calls of the batch script out at once: one. Every check that arrives during a call waits
/// for its answer and goes in the next, so calls reach Redis in the order they were made
/// and a check is decided after every check queued before it (`Service::check_all` relies
/// on it). Four out was faster (47k against 40k HTTP checks/s at 32 connections, 50k
/// against 40k gRPC at 32 streams, measured side by side), but calls made one after
/// another from separate tasks could reach Redis out of order on a runtime of several
/// threads, and even polling each once as it was made did not keep them in order every
/// time (service::a_batch_split_over_calls_keeps_its_order_on_several_threads failed in
/// about half its runs).
const IN_FLIGHT: usize = 1;

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

async fn drive(store: Store, mut waiting: mpsc::Receiver<Counted>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = waiting.recv().await {
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // Let the tasks already waiting to run go first: checks come in clumps (an HTTP/2
        // read of 16 requests spawns 16 stream tasks; a Redis reply wakes the callers that
        // send the next ones), and the first check's push wakes this task ahead of the rest
        // of its clump (tokio runs a task woken by the running one next). Without this turn
        // a clump went out as a call of one and a call of the rest. Measured with one call
        // out (2 cores, 5 s runs, not one run side by side): gRPC at 32 streams 33-36k ->
        // 40k checks/s; HTTP/1.1 at 32 connections no change beyond the noise (36-40k).
        tokio::task::yield_now().await;
        let mut batch = Vec::new();
        let mut entries = 0;
        let mut next = Some(first);
        while let Some(job) = next {
            // A check whose caller stopped waiting (its timeout passed while Redis stalled)
            // is not sent late: it would consume for an answer nobody reads.
            if job.reply.is_closed() || job.queued.elapsed() >= store.timeout {
                let _ = job.reply.send(Err(StoreError::Timeout(store.timeout)));
            } else {
                entries += job.keys.len();
                batch.push(job);
            }
            next = if entries < MAX_ENTRIES {
                waiting.try_recv().ok()
            } else {
                None
            };
        }
        if batch.is_empty() {
            continue;
        }
        let store = store.clone();
        tokio::spawn(async move {
            store.run_batch(batch).await;
            drop(permit);
        });
    }
}

impl Store {
    /// One call of the batch script for `batch`; every check gets its answer or the error.
    async fn run_batch(&self, batch: Vec<Counted>) {
        let algorithms = batch.iter().flat_map(|c| c.rules.iter().map(|(a, _)| a));
        let script = self.scripts.checks.for_algorithms(algorithms);
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
        let sizes: Vec<usize> = batch.iter().map(|c| c.keys.len()).collect();
        let answers = match self.evalsha::<String>(script, &cmd).await {
            Ok(text) => parse_batch_text(&text, &sizes),
            Err(error) => Err(error),
        };
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
