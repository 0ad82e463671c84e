//! An in-memory Spillway for a service's own tests: [`Fake`] is a [`Checker`], so the
//! [`SpillwayLayer`](crate::SpillwayLayer) and code written against `impl Checker` run
//! without a server. It counts, can be told to deny or to be unavailable, and records every
//! call.
//!
//! ```
//! # use std::time::Duration;
//! use spillway_client::{Checker, Identifiers, testing::{Fake, FakePolicy}};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let fake = Fake::new().policy("api", FakePolicy::window(2, Duration::from_secs(60)));
//! let ada = Identifiers::from([("user".to_owned(), "ada".to_owned())]);
//! assert!(fake.check("api", &ada, 1).await.allowed());
//! assert!(fake.check("api", &ada, 1).await.allowed());
//! assert!(!fake.check("api", &ada, 1).await.allowed());
//! assert_eq!(fake.checks("api"), vec![ada.clone(), ada.clone(), ada]);
//! # }
//! ```
//!
//! Each policy is one fixed window (rule `window`) per set of identifiers, and with
//! [`FakePolicy::concurrency`] leases (rule `in-flight`) held until released. Limits sent
//! with a check may set `window`'s `limit` (each number a counter of its own); anything else
//! is misconfigured (400), as an unknown policy is (404). It is a fake: no overrides, no
//! `caller_max`, no denial cache, no breaker.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};
use tokio::time::Instant;

use crate::{
    Answer, BatchCheck, Check, Checker, Decision, Error, FailMode, Failure, Identifiers, Outcome,
    RuleResult,
};

/// A fake policy's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FakePolicy {
    /// Units per window (rule `window`).
    pub limit: u64,
    pub window: Duration,
    /// Requests in flight (rule `in-flight`): each allowed check of cost > 0 holds a lease.
    pub concurrency: Option<u64>,
}

impl FakePolicy {
    /// `limit` units per `window`, a fixed window from when the fake was made.
    pub fn window(limit: u64, window: Duration) -> Self {
        Self {
            limit,
            window,
            concurrency: None,
        }
    }

    /// At most `limit` requests in flight as well.
    pub fn concurrency(mut self, limit: u64) -> Self {
        self.concurrency = Some(limit);
        self
    }
}

/// A call made to a [`Fake`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A check, a peek (cost 0), or one of a batch.
    Check {
        policy: String,
        identifiers: Identifiers,
        check: Check,
    },
    Report {
        policy: String,
        identifiers: Identifiers,
        cost: i64,
    },
    Release {
        leases: Vec<String>,
    },
    Renew {
        leases: Vec<String>,
    },
}

/// An in-memory Spillway; see the module's documentation. Clones share everything.
#[derive(Clone)]
pub struct Fake {
    state: Arc<Mutex<State>>,
    failure: Failure,
}

struct State {
    policies: HashMap<String, FakePolicy>,
    /// Per policy, limit and identifiers: the window counted and what it used.
    windows: HashMap<String, (u128, u64)>,
    /// Lease id → the policy and identifiers holding it.
    leases: HashMap<String, String>,
    next_lease: u64,
    /// Per policy: the Retry-After of each denial still to come.
    denials: HashMap<String, VecDeque<Duration>>,
    unavailable: bool,
    calls: Vec<Call>,
    started: Instant,
    advanced: Duration,
}

impl Default for Fake {
    fn default() -> Self {
        Self::new()
    }
}

impl Fake {
    /// A fake with no policy, failing closed for outages and configuration errors alike.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                policies: HashMap::new(),
                windows: HashMap::new(),
                leases: HashMap::new(),
                next_lease: 0,
                denials: HashMap::new(),
                unavailable: false,
                calls: Vec::new(),
                started: Instant::now(),
                advanced: Duration::ZERO,
            })),
            failure: Failure {
                unavailable: FailMode::Closed,
                misconfigured: FailMode::Closed,
            },
        }
    }

    /// Other failure modes, as a [`Client`](crate::Client) is given.
    pub fn with_failure(mut self, failure: Failure) -> Self {
        self.failure = failure;
        self
    }

    /// Adds (or replaces) a policy.
    pub fn policy(self, name: impl Into<String>, policy: FakePolicy) -> Self {
        self.lock().policies.insert(name.into(), policy);
        self
    }

    /// The next `times` checks of `policy` are denied with this `Retry-After`, counting
    /// nothing (a peek included).
    pub fn deny(&self, policy: &str, retry_after: Duration, times: usize) {
        let mut state = self.lock();
        let queue = state.denials.entry(policy.to_owned()).or_default();
        queue.extend(std::iter::repeat_n(retry_after, times));
    }

    /// From now on every call fails as an unreachable Spillway would: checks are
    /// [`Outcome::Unavailable`] (allowed or not as the failure mode says), reports and
    /// releases [`Error::Unavailable`].
    pub fn unavailable(&self) {
        self.lock().unavailable = true;
    }

    /// Back to counting: available, no denial to come.
    pub fn restore(&self) {
        let mut state = self.lock();
        state.unavailable = false;
        state.denials.clear();
    }

    /// Moves the fake's clock on: windows end as if `by` had passed.
    pub fn advance(&self, by: Duration) {
        self.lock().advanced += by;
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The identifiers of every check of `policy` so far, in order.
    pub fn checks(&self, policy: &str) -> Vec<Identifiers> {
        (self.lock().calls.iter())
            .filter_map(|call| match call {
                Call::Check {
                    policy: p,
                    identifiers,
                    ..
                } if p == policy => Some(identifiers.clone()),
                _ => None,
            })
            .collect()
    }

    /// The leases held now.
    pub fn leases(&self) -> Vec<String> {
        self.lock().leases.keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn decide(&self, policy: &str, identifiers: &Identifiers, check: Check) -> Decision {
        let mut state = self.lock();
        state.calls.push(Call::Check {
            policy: policy.to_owned(),
            identifiers: identifiers.clone(),
            check: check.clone(),
        });
        if state.unavailable {
            return unavailable(self.failure.unavailable);
        }
        let Some(rules) = state.policies.get(policy).copied() else {
            let detail = format!("policy: no policy named \"{policy}\"");
            return self.misconfigured(StatusCode::NOT_FOUND, detail);
        };
        let limit = match caller_limit(&check, rules.limit) {
            Ok(limit) => limit,
            Err(detail) => return self.misconfigured(StatusCode::BAD_REQUEST, detail),
        };
        if check.cost > limit {
            let detail = format!(
                "cost: {} is more than rule window allows ({limit})",
                check.cost
            );
            return Decision::new(Outcome::TooCostly { detail }, None, Vec::new());
        }
        let (used, reset) = state.window(policy, identifiers, limit, rules.window);
        let mut standing = Standing {
            policy,
            rules,
            limit,
            remaining: limit.saturating_sub(used),
            reset,
        };
        if let Some(retry) = state.denials.get_mut(policy).and_then(VecDeque::pop_front) {
            return standing.denied("window", retry);
        }
        if check.cost > standing.remaining {
            return standing.denied("window", reset);
        }
        let lease = match rules.concurrency {
            Some(most) if check.cost > 0 => match state.take_lease(policy, identifiers, most) {
                Some(id) => Some(id),
                None => return standing.denied("in-flight", Duration::from_secs(1)),
            },
            _ => None,
        };
        state.add(policy, identifiers, limit, check.cost as i64);
        standing.remaining -= check.cost;
        standing.allowed(lease)
    }

    fn misconfigured(&self, status: StatusCode, detail: String) -> Decision {
        let fail = self.failure.misconfigured;
        Decision::new(
            Outcome::Misconfigured {
                status,
                detail,
                fail,
            },
            None,
            Vec::new(),
        )
    }

    /// Records a call that is not a check; `Err` when the fake is unavailable.
    fn record(&self, call: Call) -> Result<std::sync::MutexGuard<'_, State>, Error> {
        let mut state = self.lock();
        state.calls.push(call);
        if state.unavailable {
            return Err(Error::Unavailable(
                "fake Spillway: unavailable (Fake::unavailable)".into(),
            ));
        }
        Ok(state)
    }
}

impl State {
    /// What the current window of this counter used, and when it ends.
    fn window(
        &mut self,
        policy: &str,
        identifiers: &Identifiers,
        limit: u64,
        window: Duration,
    ) -> (u64, Duration) {
        let now = self.started.elapsed() + self.advanced;
        let length = window.as_nanos().max(1);
        let index = now.as_nanos() / length;
        let ends = Duration::from_nanos(((index + 1) * length) as u64);
        let counter = self
            .windows
            .entry(counter_key(policy, identifiers, limit))
            .or_insert((index, 0));
        if counter.0 != index {
            *counter = (index, 0);
        }
        (counter.1, ends - now)
    }
}

impl State {
    /// A lease of `policy` for these identifiers, unless `most` are held.
    fn take_lease(&mut self, policy: &str, identifiers: &Identifiers, most: u64) -> Option<String> {
        let holder = counter_key(policy, identifiers, 0);
        let held = self.leases.values().filter(|h| **h == holder).count() as u64;
        if held >= most {
            return None;
        }
        self.next_lease += 1;
        let id = format!("fake-lease-{}", self.next_lease);
        self.leases.insert(id.clone(), holder);
        Some(id)
    }

    /// Counts `cost` (given back when negative, never below nothing) in the current window
    /// (see [`State::window`]).
    fn add(&mut self, policy: &str, identifiers: &Identifiers, limit: u64, cost: i64) {
        let key = counter_key(policy, identifiers, limit);
        if let Some((_, used)) = self.windows.get_mut(&key) {
            *used = used.saturating_add_signed(cost);
        }
    }
}

/// A counter's key: the policy, the limit applied (0: leases) and the identifiers.
fn counter_key(policy: &str, identifiers: &Identifiers, limit: u64) -> String {
    crate::cache::key(policy, identifiers, &Check::cost(limit))
}

/// The `window` limit a check sets, or the policy's; anything else is refused.
fn caller_limit(check: &Check, own: u64) -> Result<u64, String> {
    let mut limit = own;
    for (rule, fields) in &check.limits {
        for (field, value) in fields {
            if rule != "window" || field != "limit" || *value == 0 {
                return Err(format!(
                    "limits.{rule}.{field}: the fake takes only limits.window.limit, from 1"
                ));
            }
            limit = *value;
        }
    }
    Ok(limit)
}

fn unavailable(fail: FailMode) -> Decision {
    Decision::unavailable(
        "fake Spillway: unavailable (Fake::unavailable)".into(),
        fail,
        false,
    )
}

/// A check's counter as it stands: what the answer says.
struct Standing<'a> {
    policy: &'a str,
    rules: FakePolicy,
    limit: u64,
    remaining: u64,
    /// Until the window ends.
    reset: Duration,
}

impl Standing<'_> {
    fn allowed(&self, lease: Option<String>) -> Decision {
        self.decision(None, lease)
    }

    /// Denied by `rule` (`window` or `in-flight`) until `retry`.
    fn denied(&self, rule: &'static str, retry: Duration) -> Decision {
        self.decision(Some((rule, retry)), None)
    }

    fn decision(&self, denied: Option<(&str, Duration)>, lease: Option<String>) -> Decision {
        let retry = denied.map(|(_, after)| after);
        let answer = Answer {
            allowed: denied.is_none(),
            policy: self.policy.to_owned(),
            policy_version: 1,
            mode: "enforce".into(),
            limit: Some(self.limit),
            remaining: Some(self.remaining),
            reset_ms: Some(ms(self.reset)),
            retry_after_ms: retry.map(ms),
            degraded: false,
            unmatched: false,
            shadow_denied: None,
            results: self.results(denied, lease),
        };
        let outcome = match retry {
            None => Outcome::Allowed,
            Some(after) => Outcome::Limited {
                retry_after: Some(after),
            },
        };
        Decision::new(outcome, Some(answer), self.headers(retry))
    }

    fn results(&self, denied: Option<(&str, Duration)>, lease: Option<String>) -> Vec<RuleResult> {
        let by = |rule: &str| {
            denied
                .filter(|(r, _)| *r == rule)
                .map(|(_, after)| ms(after))
        };
        let window = RuleResult {
            rule: "window".into(),
            identifier: String::new(),
            algorithm: "fixed_window".into(),
            allowed: by("window").is_none(),
            limit: self.limit,
            remaining: self.remaining,
            reset_ms: ms(self.reset),
            retry_after_ms: by("window"),
            binding: true,
            lease: None,
        };
        let in_flight = self.rules.concurrency.map(|most| RuleResult {
            rule: "in-flight".into(),
            algorithm: "concurrency".into(),
            allowed: by("in-flight").is_none(),
            limit: most,
            remaining: 0,
            retry_after_ms: by("in-flight"),
            binding: false,
            lease,
            ..window.clone()
        });
        std::iter::once(window).chain(in_flight).collect()
    }

    /// `RateLimit-Policy`, `RateLimit` and, denied, `Retry-After`, as Spillway writes them.
    fn headers(&self, retry: Option<Duration>) -> Vec<(HeaderName, HeaderValue)> {
        let (limit, secs) = (self.limit, self.rules.window.as_secs().max(1));
        let mut policy = format!("\"window\";q={limit};w={secs}");
        if let Some(most) = self.rules.concurrency {
            policy.push_str(&format!(
                ", \"in-flight\";q={most};qu=\"concurrent-requests\""
            ));
        }
        let state = format!(
            "\"window\";r={};t={}",
            self.remaining,
            ms(self.reset).div_ceil(1000)
        );
        let mut headers: Vec<(HeaderName, HeaderValue)> =
            [("ratelimit-policy", policy), ("ratelimit", state)]
                .into_iter()
                .map(|(name, value)| {
                    (
                        HeaderName::from_static(name),
                        HeaderValue::from_str(&value).expect("ASCII"),
                    )
                })
                .collect();
        if let Some(after) = retry {
            headers.push((
                HeaderName::from_static("retry-after"),
                HeaderValue::from(ms(after).div_ceil(1000)),
            ));
        }
        headers
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Checker for Fake {
    fn check_with(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        check: Check,
    ) -> impl Future<Output = Decision> + Send {
        std::future::ready(self.decide(policy, identifiers, check))
    }

    fn check_batch(&self, checks: &[BatchCheck]) -> impl Future<Output = Vec<Decision>> + Send {
        let decisions = (checks.iter())
            .map(|c| self.decide(&c.policy, &c.identifiers, c.check.clone()))
            .collect();
        std::future::ready(decisions)
    }

    fn report(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        cost: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let call = Call::Report {
            policy: policy.to_owned(),
            identifiers: identifiers.clone(),
            cost,
        };
        let done = self.record(call).and_then(|mut state| {
            let Some(rules) = state.policies.get(policy).copied() else {
                let detail = format!("policy: no policy named \"{policy}\"");
                return Err(Error::Refused {
                    status: StatusCode::NOT_FOUND,
                    detail,
                });
            };
            state.window(policy, identifiers, rules.limit, rules.window);
            state.add(policy, identifiers, rules.limit, cost);
            Ok(())
        });
        std::future::ready(done)
    }

    fn release(&self, leases: &[String]) -> impl Future<Output = Result<(), Error>> + Send {
        let call = Call::Release {
            leases: leases.to_vec(),
        };
        let done = self.record(call).map(|mut state| {
            for id in leases {
                state.leases.remove(id);
            }
        });
        std::future::ready(done)
    }

    fn renew(&self, leases: &[String]) -> impl Future<Output = Result<(), Error>> + Send {
        let call = Call::Renew {
            leases: leases.to_vec(),
        };
        std::future::ready(self.record(call).map(drop))
    }
}
