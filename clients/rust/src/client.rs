//! [`Client`]: checks, reports and leases over HTTP, each call with a timeout and through a
//! circuit breaker shared by the client's clones; a failure names its cause.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};

use crate::breaker::{Breaker, Permit, Settings};
use crate::{
    Answer, BatchCheck, Check, Checker, DEFAULT_TIMEOUT, Decision, Error, Failure, Identifiers,
    Outcome, cache, cause, leases,
};

/// Unavailable calls in a row that open the circuit breaker, unless
/// [`Client::with_breaker`] says otherwise.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;

/// How long an open breaker makes no call before one trial.
pub const DEFAULT_BREAKER_PERIOD: Duration = Duration::from_secs(5);

const CHECK: &str = "/api/v1/check";

/// A Spillway client: cheap to clone (clones share the connection pool, the denial cache
/// and the circuit breaker).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Arc<str>,
    key: Arc<str>,
    pub(crate) timeout: Duration,
    failure: Failure,
    pub(crate) denials: Arc<cache::Denials>,
    warned_unmatched: Arc<Mutex<HashSet<String>>>,
    breaker: Arc<Breaker>,
}

/// A call that did not reach Spillway: why, and whether the open breaker answered instead.
pub(crate) struct Unreached {
    pub(crate) reason: String,
    pub(crate) from_breaker: bool,
}

/// What Spillway answered a check (or a batch's item).
pub(crate) enum Reply {
    /// 200 or 429: a decision.
    Answer(Answer),
    /// Any other status, with the problem's `detail`.
    Problem { status: StatusCode, detail: String },
    /// Not Spillway's answer (a proxy's page, a body cut short): why.
    Unreadable(String),
}

impl Client {
    /// A client of the Spillway at `base_url` (`http://spillway:3000`) calling with a service
    /// key, with the [`DEFAULT_TIMEOUT`] and a breaker of [`DEFAULT_BREAKER_FAILURES`] and
    /// [`DEFAULT_BREAKER_PERIOD`].
    pub fn new(
        base_url: impl Into<String>,
        key: impl Into<String>,
        failure: Failure,
    ) -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| {
                Error::Unavailable(format!("building the HTTP client: {}", cause::chain(&e)))
            })?;
        Ok(Self {
            http,
            base: base_url.into().trim_end_matches('/').into(),
            key: key.into().into(),
            timeout: DEFAULT_TIMEOUT,
            failure,
            denials: Arc::new(cache::Denials::default()),
            warned_unmatched: Arc::default(),
            breaker: Breaker::new(Settings {
                failures: DEFAULT_BREAKER_FAILURES,
                period: DEFAULT_BREAKER_PERIOD,
            }),
        })
    }

    /// Another timeout for every call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Another circuit breaker: after `failures` unavailable calls in a row (a network
    /// error, a timeout, a 5xx), no call for `period`; checks meanwhile are answered at once
    /// as [`Failure::unavailable`] says ([`Decision::from_breaker`]), reports and releases
    /// are [`Error::Unavailable`]. Then one trial call, whose success closes it. Clones made
    /// after this share the new breaker.
    pub fn with_breaker(mut self, failures: u32, period: Duration) -> Self {
        self.breaker = Breaker::new(Settings { failures, period });
        self
    }

    /// No circuit breaker: every call is made, however many failed before.
    pub fn without_breaker(self) -> Self {
        self.with_breaker(0, Duration::ZERO)
    }

    /// The failure choices this client was built with.
    pub fn failure(&self) -> Failure {
        self.failure
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs `body` through the breaker; the caller settles the permit with what came back.
    pub(crate) async fn send(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(reqwest::Response, Permit), Unreached> {
        let permit = self.breaker.enter().map_err(|reason| Unreached {
            reason,
            from_breaker: true,
        })?;
        let url = self.url(path);
        let sent = (self.http.post(&url))
            .bearer_auth(&self.key)
            .timeout(self.timeout)
            .json(body)
            .send()
            .await;
        match sent {
            Ok(response) => Ok((response, permit)),
            Err(e) => {
                let reason = cause::describe(&e, &url, self.timeout);
                permit.failed(&reason);
                Err(Unreached::named(reason))
            }
        }
    }

    /// Checks `cost` units against `policy` for these identifiers. Never fails: a check that
    /// could not be decided is a [`Decision`] whose [`Outcome`] says why, allowed or not as
    /// the client's [`Failure`] says.
    pub async fn check(&self, policy: &str, identifiers: &Identifiers, cost: u64) -> Decision {
        self.check_with(policy, identifiers, Check::cost(cost))
            .await
    }

    /// A check with limits of its own (`Check::cost(1).limit("per-customer", "limit",
    /// 500)`): the named rule counts with these numbers, apart from its own; a number past
    /// the rule's `caller_max` (or a rule without one) is a configuration error (400).
    pub async fn check_with(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        check: Check,
    ) -> Decision {
        let key = cache::key(policy, identifiers, &check);
        if let Some(denied) = self.denials.get(&key) {
            return denied;
        }
        let (response, permit) = match self.send(CHECK, &check.body(policy, identifiers)).await {
            Ok(sent) => sent,
            Err(unreached) => return self.unavailable(policy, unreached),
        };
        let url = self.url(CHECK);
        let status = response.status();
        let headers = passed_on(response.headers());
        let reply = if status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS {
            match response.json::<Answer>().await {
                Ok(answer) => Reply::Answer(answer),
                Err(e) => Reply::Unreadable(cause::describe(&e, &url, self.timeout)),
            }
        } else {
            let detail = problem_detail(response).await;
            Reply::Problem { status, detail }
        };
        let decision = self.judged(policy, &key, reply, headers, &url);
        settle(permit, &decision);
        decision
    }

    /// The decision of Spillway's reply to a check of `policy` (called at `whence`).
    pub(crate) fn judged(
        &self,
        policy: &str,
        key: &str,
        reply: Reply,
        headers: Vec<(HeaderName, HeaderValue)>,
        whence: &str,
    ) -> Decision {
        let (status, detail) = match reply {
            Reply::Answer(answer) => return self.decided(key, answer, headers),
            Reply::Unreadable(why) => {
                return self.unavailable(
                    policy,
                    Unreached::named(format!("unreadable answer: {why}")),
                );
            }
            Reply::Problem { status, detail } => (status, detail),
        };
        match status.as_u16() {
            422 => Decision::new(Outcome::TooCostly { detail }, None, Vec::new()),
            500.. => self.unavailable(
                policy,
                Unreached::named(format!("{status} from {whence}: {detail}")),
            ),
            _ => {
                tracing::error!(policy, %status, detail, "Spillway refused the check: a configuration error");
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
        }
    }

    pub(crate) fn unavailable(&self, policy: &str, unreached: Unreached) -> Decision {
        let fail = self.failure.unavailable;
        let reason = unreached.reason;
        if unreached.from_breaker {
            // Said once when it opened; not again for every check it answers.
            tracing::debug!(
                policy,
                reason,
                ?fail,
                "Spillway unavailable (circuit breaker)"
            );
        } else {
            tracing::warn!(policy, reason, ?fail, "Spillway unavailable");
        }
        Decision::unavailable(reason, fail, unreached.from_breaker)
    }

    fn decided(
        &self,
        key: &str,
        answer: Answer,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Decision {
        if answer.unmatched
            && self
                .warned_unmatched
                .lock()
                .unwrap()
                .insert(answer.policy.clone())
        {
            tracing::warn!(
                policy = answer.policy,
                "no rule of this policy counts the identifiers sent: nothing is limited (fix the identifiers or the policy's dimensions)"
            );
        }
        let outcome = if answer.allowed {
            Outcome::Allowed
        } else {
            Outcome::Limited {
                retry_after: answer.retry_after_ms.map(Duration::from_millis),
            }
        };
        let decision = Decision::new(outcome, Some(answer), headers);
        self.denials.remember(key, &decision);
        decision
    }

    /// The identifiers' state under `policy` without consuming anything: a check of cost 0
    /// (no lease taken); `decision.answer()` says what is left.
    pub async fn peek(&self, policy: &str, identifiers: &Identifiers) -> Decision {
        Checker::peek(self, policy, identifiers).await
    }

    /// Checks (cost 1); while denied by a limit, sleeps the denial's `Retry-After` and checks
    /// again, never past `max_wait`: see [`Checker::wait_until_allowed_with`].
    pub async fn wait_until_allowed(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        max_wait: Duration,
    ) -> Decision {
        Checker::wait_until_allowed(self, policy, identifiers, max_wait).await
    }

    /// [`Client::wait_until_allowed`] of any [`Check`].
    pub async fn wait_until_allowed_with(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        check: Check,
        max_wait: Duration,
    ) -> Decision {
        Checker::wait_until_allowed_with(self, policy, identifiers, check, max_wait).await
    }

    /// Usage known after the fact (tokens, bytes) added to every rule of the policy; a
    /// negative `cost` gives back what a check over-estimated.
    pub async fn report(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        cost: i64,
    ) -> Result<(), Error> {
        self.call(
            "/api/v1/report",
            json!({"policy": policy, "identifiers": identifiers, "cost": cost}),
        )
        .await
    }

    /// Releases leases (idempotent).
    pub async fn release(&self, leases: &[String]) -> Result<(), Error> {
        self.call("/api/v1/leases/release", json!({ "leases": leases }))
            .await
    }

    /// Extends leases by their rule's lease length from now.
    pub async fn renew(&self, leases: &[String]) -> Result<(), Error> {
        self.call("/api/v1/leases/renew", json!({ "leases": leases }))
            .await
    }

    async fn call(&self, path: &str, body: Value) -> Result<(), Error> {
        let (response, permit) = (self.send(path, &body).await)
            .map_err(|unreached| Error::Unavailable(unreached.reason))?;
        let status = response.status();
        if status.is_success() {
            permit.succeeded();
            return Ok(());
        }
        let detail = problem_detail(response).await;
        if status.is_server_error() {
            let reason = format!("{status} from {}: {detail}", self.url(path));
            permit.failed(&reason);
            return Err(Error::Unavailable(reason));
        }
        permit.succeeded();
        Err(Error::Refused { status, detail })
    }

    /// Checks `policy` (cost 1), runs `work` if allowed, renews the check's leases while it
    /// runs, and releases them however it ends (returned, panicked or dropped). A refusal is
    /// `Err` with the decision to answer with.
    pub async fn with_lease<T, F, Fut>(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        work: F,
    ) -> Result<T, Decision>
    where
        F: FnOnce(&Decision) -> Fut,
        Fut: Future<Output = T>,
    {
        leases::with_lease(self, policy, identifiers, work).await
    }

    /// Reserve, then report: checks `estimate`, runs `work` if allowed; `work` answers what it
    /// really used, and the difference is reported. When `work` fails (or is dropped) the
    /// whole estimate is given back. A refusal is `Err` with the decision to answer with.
    pub async fn reserve<T, E, F, Fut>(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        estimate: u64,
        work: F,
    ) -> Result<Result<T, E>, Decision>
    where
        F: FnOnce(&Decision) -> Fut,
        Fut: Future<Output = Result<(T, u64), E>>,
    {
        leases::reserve(self, policy, identifiers, estimate, work).await
    }
}

impl Unreached {
    /// Spillway was unavailable to the call itself (not the breaker).
    pub(crate) fn named(reason: String) -> Self {
        Self {
            reason,
            from_breaker: false,
        }
    }
}

/// Settles a call's permit with the decision it came to: unavailable is a failure.
pub(crate) fn settle(permit: Permit, decision: &Decision) {
    match decision.outcome() {
        Outcome::Unavailable { reason, .. } => permit.failed(reason),
        _ => permit.succeeded(),
    }
}

impl Checker for Client {
    fn check_with(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        check: Check,
    ) -> impl Future<Output = Decision> + Send {
        Client::check_with(self, policy, identifiers, check)
    }

    fn check_batch(&self, checks: &[BatchCheck]) -> impl Future<Output = Vec<Decision>> + Send {
        Client::check_batch(self, checks)
    }

    fn report(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        cost: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        Client::report(self, policy, identifiers, cost)
    }

    fn release(&self, leases: &[String]) -> impl Future<Output = Result<(), Error>> + Send {
        Client::release(self, leases)
    }

    fn renew(&self, leases: &[String]) -> impl Future<Output = Result<(), Error>> + Send {
        Client::renew(self, leases)
    }
}

/// The headers a service passes on to its own caller.
fn passed_on(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    const NAMES: [&str; 3] = ["ratelimit-policy", "ratelimit", "retry-after"];
    NAMES
        .iter()
        .flat_map(|name| {
            headers
                .get_all(*name)
                .iter()
                .map(|v| (HeaderName::from_static(name), v.clone()))
        })
        .collect()
}

pub(crate) async fn problem_detail(response: reqwest::Response) -> String {
    let text = response.text().await.unwrap_or_default();
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|p| p["detail"].as_str().map(str::to_owned))
        .unwrap_or(text)
}
