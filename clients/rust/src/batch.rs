//! Batches: many checks in one call (`POST /api/v1/check/batch`, parts of [`MAX_BATCH`]),
//! each decided as a check alone would be: the denial cache, the failure modes and the
//! circuit breaker apply to each.

use http::{HeaderName, HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::client::{Reply, Unreached, problem_detail, settle};
use crate::{Answer, Check, Client, Decision, Identifiers, Outcome, cache, cause};

/// Most checks Spillway takes in one batch; [`Client::check_batch`] sends more in parts.
pub const MAX_BATCH: usize = 100;

const BATCH: &str = "/api/v1/check/batch";

/// One check of a batch.
///
/// ```
/// # use spillway_client::{BatchCheck, Identifiers};
/// let ids = Identifiers::from([("customer".to_owned(), "acme".to_owned())]);
/// let item = BatchCheck::new("api", ids).cost(3).limit("per-customer", "limit", 500);
/// assert_eq!(item.check.cost, 3);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchCheck {
    pub policy: String,
    pub identifiers: Identifiers,
    pub check: Check,
}

impl BatchCheck {
    /// A check of cost 1 under the policy's own limits.
    pub fn new(policy: impl Into<String>, identifiers: Identifiers) -> Self {
        Self {
            policy: policy.into(),
            identifiers,
            check: Check::default(),
        }
    }

    /// Another cost (0 peeks).
    pub fn cost(mut self, cost: u64) -> Self {
        self.check.cost = cost;
        self
    }

    /// With `rule`'s parameter `field` set to `value` for this check (see [`Check::limit`]).
    pub fn limit(mut self, rule: impl Into<String>, field: impl Into<String>, value: u64) -> Self {
        self.check = self.check.limit(rule, field, value);
        self
    }
}

#[derive(Deserialize)]
struct BatchAnswer {
    results: Vec<BatchItem>,
}

#[derive(Deserialize)]
struct BatchItem {
    status: u16,
    body: Value,
}

impl Client {
    /// One [`Decision`] per check, in order, from one call per [`MAX_BATCH`] checks. Each
    /// is decided as [`Client::check_with`] would: a denial remembered is answered without
    /// being sent, and one that fails is unavailable or misconfigured as the client's
    /// [`Failure`](crate::Failure) says. A batch's answer has no RateLimit headers: a denied
    /// item's [`Decision::headers`] hold only `Retry-After`.
    pub async fn check_batch(&self, checks: &[BatchCheck]) -> Vec<Decision> {
        let keys: Vec<String> = (checks.iter())
            .map(|c| cache::key(&c.policy, &c.identifiers, &c.check))
            .collect();
        let mut decisions: Vec<Option<Decision>> =
            keys.iter().map(|key| self.denials.get(key)).collect();
        let todo: Vec<usize> = (0..checks.len())
            .filter(|&i| decisions[i].is_none())
            .collect();
        for part in todo.chunks(MAX_BATCH) {
            let items: Vec<(&BatchCheck, &str)> = part
                .iter()
                .map(|&i| (&checks[i], keys[i].as_str()))
                .collect();
            for (&i, decision) in part.iter().zip(self.batch(&items).await) {
                decisions[i] = Some(decision);
            }
        }
        decisions.into_iter().flatten().collect()
    }

    /// One call of up to [`MAX_BATCH`] checks (with their cache keys).
    async fn batch(&self, items: &[(&BatchCheck, &str)]) -> Vec<Decision> {
        let checks: Vec<Value> = (items.iter())
            .map(|(c, _)| c.check.body(&c.policy, &c.identifiers))
            .collect();
        let body = json!({ "checks": checks });
        let (response, permit) = match self.send(BATCH, &body).await {
            Ok(sent) => sent,
            Err(unreached) => return self.every_one(items, unreached),
        };
        let url = self.url(BATCH);
        let status = response.status();
        if status != StatusCode::OK {
            // The whole batch refused (the key, a malformed request) or failed (5xx): each
            // check is, as one alone would be.
            let detail = problem_detail(response).await;
            let decisions: Vec<Decision> = (items.iter())
                .map(|(c, key)| {
                    let reply = Reply::Problem {
                        status,
                        detail: detail.clone(),
                    };
                    self.judged(&c.policy, key, reply, Vec::new(), &url)
                })
                .collect();
            settle(permit, &decisions[0]);
            return decisions;
        }
        let results = match response.json::<BatchAnswer>().await {
            Ok(answer) if answer.results.len() == items.len() => answer.results,
            Ok(answer) => {
                let why = format!(
                    "unreadable answer: {} results for {} checks from {url}",
                    answer.results.len(),
                    items.len()
                );
                permit.failed(&why);
                return self.every_one(items, Unreached::named(why));
            }
            Err(e) => {
                let why = format!(
                    "unreadable answer: {}",
                    cause::describe(&e, &url, self.timeout)
                );
                permit.failed(&why);
                return self.every_one(items, Unreached::named(why));
            }
        };
        let decisions: Vec<Decision> = (items.iter().zip(results).enumerate())
            .map(|(i, ((c, key), item))| {
                let (reply, headers) = reply(item);
                self.judged(
                    &c.policy,
                    key,
                    reply,
                    headers,
                    &format!("{url} (checks[{i}])"),
                )
            })
            .collect();
        // Spillway answered: the breaker counts a failure only when every check failed (a
        // Redis outage under policies that fail closed), as one check would have.
        let failed = decisions
            .iter()
            .all(|d| matches!(d.outcome(), Outcome::Unavailable { .. }));
        match decisions.first() {
            Some(first) if failed => settle(permit, first),
            _ => permit.succeeded(),
        }
        decisions
    }

    /// Every check of a batch that failed as a whole is unavailable (logged once).
    fn every_one(&self, items: &[(&BatchCheck, &str)], unreached: Unreached) -> Vec<Decision> {
        let policies: Vec<&str> = items.iter().map(|(c, _)| c.policy.as_str()).collect();
        vec![self.unavailable(&policies.join(","), unreached); items.len()]
    }
}

/// A batch item's reply, with the `Retry-After` a denial's own answer would have carried.
fn reply(item: BatchItem) -> (Reply, Vec<(HeaderName, HeaderValue)>) {
    let Ok(status) = StatusCode::from_u16(item.status) else {
        return (
            Reply::Unreadable(format!("a batch item of status {}", item.status)),
            Vec::new(),
        );
    };
    if status != StatusCode::OK && status != StatusCode::TOO_MANY_REQUESTS {
        let detail = (item.body["detail"].as_str().map(str::to_owned))
            .unwrap_or_else(|| item.body.to_string());
        return (Reply::Problem { status, detail }, Vec::new());
    }
    match serde_json::from_value::<Answer>(item.body) {
        Ok(answer) => {
            let headers = (answer.retry_after_ms.filter(|_| !answer.allowed))
                .map(|ms| {
                    (
                        HeaderName::from_static("retry-after"),
                        HeaderValue::from(ms.div_ceil(1000)),
                    )
                })
                .into_iter()
                .collect();
            (Reply::Answer(answer), headers)
        }
        Err(e) => (Reply::Unreadable(format!("a batch item: {e}")), Vec::new()),
    }
}
