//! The official Rust client of [Spillway](https://github.com/spillway-rs/spillway), a rate
//! limiter service backed by Redis.
//!
//! What every service calling `POST /api/v1/check` otherwise writes by hand:
//!
//! - a timeout on every call ([`DEFAULT_TIMEOUT`], 100 ms);
//! - an explicit choice, fail open or fail closed, for an unreachable Spillway (network
//!   errors, timeouts, 5xx) and for a configuration error (401 wrong key, 404 unknown
//!   policy, 400 a strict policy's unmatched identifiers): [`Failure`];
//! - the `RateLimit-Policy`, `RateLimit` and `Retry-After` headers to pass on
//!   ([`Decision::headers`]) and an RFC 9457 problem for the end user ([`Decision::problem`]);
//! - a local cache of denials until their `Retry-After`, at most [`MAX_CACHED`] (never for
//!   a `concurrency` rule, whose slot frees at any moment);
//! - leases: [`Client::with_lease`] checks, runs the work, renews the leases while it runs
//!   and releases them however it ends;
//! - reserve, then report: [`Client::reserve`] checks an estimate, then reports the
//!   difference, or gives the whole estimate back when the work fails;
//! - a [`tower`](layer) layer for axum and tonic services.
//!
//! ```no_run
//! use spillway_client::{Client, Failure, FailMode, Identifiers};
//! # async fn run() -> Result<(), spillway_client::Error> {
//! let spillway = Client::new("http://spillway:3000", "sk_live_…", Failure {
//!     unavailable: FailMode::Open,
//!     misconfigured: FailMode::Closed,
//! })?;
//! let decision = spillway.check("api", &Identifiers::from([("user".into(), "42".into())]), 1).await;
//! if !decision.allowed() {
//!     let (status, problem) = decision.problem();
//!     // answer `status` with `problem` and `decision.headers()`
//! }
//! # Ok(()) }
//! ```

mod cache;
mod decision;
#[cfg(feature = "tower")]
pub mod layer;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::json;

pub use cache::MAX_CACHED;
pub use decision::{Answer, Decision, Outcome, RuleResult};
#[cfg(feature = "tower")]
pub use layer::{Grpc, Head, Problem, SpillwayLayer};

/// A check's identifiers: dimension → value (`{"user": "42", "ip": "10.0.0.7"}`).
pub type Identifiers = BTreeMap<String, String>;

/// How long a call to Spillway may take before it counts as unavailable. Spillway answers
/// from one Redis round trip (typically under 2 ms on the same network); keep this well under
/// your own request's budget.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// What a check that could not be decided means for the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    /// Let the request through (and log it): the usual choice for an API.
    Open,
    /// Refuse the request: for a limit that guards money or abuse.
    Closed,
}

/// The two choices a caller must make, explicitly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Spillway unreachable: a network error, a timeout, a 5xx (Redis down with a policy that
    /// fails closed, shutting down).
    pub unavailable: FailMode,
    /// A configuration error: 401 or 403 (the key), 404 (the policy does not exist), 400 (a
    /// strict policy met identifiers none of its rules count, or another bad request).
    pub misconfigured: FailMode,
}

/// An error of a call that is not a check (report, release, renew), or of building a client.
#[derive(Debug)]
pub enum Error {
    /// The call did not reach Spillway or timed out, or Spillway answered 5xx.
    Unavailable(String),
    /// Spillway refused the call: its status and the problem's `detail`.
    Refused { status: StatusCode, detail: String },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(why) => write!(f, "Spillway is unavailable: {why}"),
            Self::Refused { status, detail } => write!(f, "Spillway refused ({status}): {detail}"),
        }
    }
}

impl std::error::Error for Error {}

/// A Spillway client: cheap to clone (clones share the connection pool and the denial cache).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Arc<str>,
    key: Arc<str>,
    timeout: Duration,
    failure: Failure,
    denials: Arc<cache::Denials>,
    warned_unmatched: Arc<Mutex<HashSet<String>>>,
}

impl Client {
    /// A client of the Spillway at `base_url` (`http://spillway:3000`) calling with a service
    /// key, with the [`DEFAULT_TIMEOUT`].
    pub fn new(
        base_url: impl Into<String>,
        key: impl Into<String>,
        failure: Failure,
    ) -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        Ok(Self {
            http,
            base: base_url.into().trim_end_matches('/').into(),
            key: key.into().into(),
            timeout: DEFAULT_TIMEOUT,
            failure,
            denials: Arc::new(cache::Denials::default()),
            warned_unmatched: Arc::default(),
        })
    }

    /// Another timeout for every call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The failure choices this client was built with.
    pub fn failure(&self) -> Failure {
        self.failure
    }

    fn post(&self, path: &str, body: serde_json::Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .timeout(self.timeout)
            .json(&body)
    }

    /// Checks `cost` units against `policy` for these identifiers. Never fails: a check that
    /// could not be decided is a [`Decision`] whose [`Outcome`] says why, allowed or not as
    /// the client's [`Failure`] says.
    pub async fn check(&self, policy: &str, identifiers: &Identifiers, cost: u64) -> Decision {
        let key = cache::key(policy, identifiers, cost);
        if let Some(denied) = self.denials.get(&key) {
            return denied;
        }
        let sent = self
            .post(
                "/api/v1/check",
                json!({"policy": policy, "identifiers": identifiers, "cost": cost}),
            )
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => return self.unavailable(policy, e.to_string()),
        };
        let status = response.status();
        let headers = passed_on(response.headers());
        match status.as_u16() {
            200 | 429 => match response.json::<Answer>().await {
                Ok(answer) => self.decided(&key, answer, headers),
                Err(e) => self.unavailable(policy, format!("unreadable answer: {e}")),
            },
            422 => Decision::new(
                Outcome::TooCostly {
                    detail: problem_detail(response).await,
                },
                None,
                Vec::new(),
            ),
            500.. => {
                let detail = problem_detail(response).await;
                self.unavailable(policy, format!("{status}: {detail}"))
            }
            _ => {
                let detail = problem_detail(response).await;
                tracing::error!(policy, %status, detail, "Spillway refused the check: a configuration error");
                Decision::new(
                    Outcome::Misconfigured {
                        status,
                        detail,
                        fail: self.failure.misconfigured,
                    },
                    None,
                    Vec::new(),
                )
            }
        }
    }

    fn unavailable(&self, policy: &str, reason: String) -> Decision {
        tracing::warn!(policy, reason, fail = ?self.failure.unavailable, "Spillway unavailable");
        Decision::new(
            Outcome::Unavailable {
                reason,
                fail: self.failure.unavailable,
            },
            None,
            Vec::new(),
        )
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

    async fn call(&self, path: &str, body: serde_json::Value) -> Result<(), Error> {
        let response = self
            .post(path, body)
            .send()
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let detail = problem_detail(response).await;
        Err(if status.is_server_error() {
            Error::Unavailable(format!("{status}: {detail}"))
        } else {
            Error::Refused { status, detail }
        })
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
        let decision = self.check(policy, identifiers, 1).await;
        if !decision.allowed() {
            return Err(decision);
        }
        let mut held = Leases::renewed(self.clone(), &decision);
        let out = work(&decision).await;
        held.release().await;
        Ok(out)
    }

    /// Reserve, then report: checks `estimate`, runs `work` if allowed; `work` answers what it
    /// really used, and the difference is reported. When `work` fails (or is dropped) the whole
    /// estimate is given back. A refusal is `Err` with the decision to answer with.
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
        let decision = self.check(policy, identifiers, estimate).await;
        if !decision.allowed() {
            return Err(decision);
        }
        // Only what Spillway counted is settled: not a check let through open, degraded or
        // shadow-denied (which consumed nothing).
        let counted = decision
            .answer()
            .is_some_and(|a| !a.degraded && a.shadow_denied != Some(true));
        // The check's own leases (a policy with a concurrency rule too) are renewed while the
        // work runs, however long it takes, and end with it.
        let mut held = Leases::renewed(self.clone(), &decision);
        let mut pending = counted.then(|| Reservation {
            client: self.clone(),
            policy: policy.to_owned(),
            identifiers: identifiers.clone(),
            estimate,
            settled: false,
        });
        let out = work(&decision).await;
        if let Some(reservation) = pending.as_mut() {
            let delta = match &out {
                Ok((_, used)) => *used as i64 - estimate as i64,
                Err(_) => -(estimate as i64),
            };
            reservation.settle(delta).await;
        }
        held.release().await;
        Ok(out.map(|(value, _)| value))
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

async fn problem_detail(response: reqwest::Response) -> String {
    let text = response.text().await.unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|p| p["detail"].as_str().map(str::to_owned))
        .unwrap_or(text)
}

/// Leases held while work runs; released when dropped if not released before. Those of
/// [`Leases::renewed`] are renewed meanwhile.
struct Leases {
    client: Client,
    ids: Vec<String>,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl Leases {
    fn new(client: Client, ids: Vec<String>) -> Self {
        Self {
            client,
            ids,
            renewer: None,
        }
    }

    /// A decision's leases, renewed every third of the shortest time one has left until they
    /// are released (or dropped).
    fn renewed(client: Client, decision: &Decision) -> Self {
        let mut held = Self::new(client, decision.leases());
        if let (Some(every), false) = (decision.renew_every(), held.ids.is_empty()) {
            let (client, ids) = (held.client.clone(), held.ids.clone());
            held.renewer = Some(tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tick.tick().await;
                    if let Err(e) = client.renew(&ids).await {
                        tracing::warn!(error = %e, "renewing leases failed");
                    }
                }
            }));
        }
        held
    }

    async fn release(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let ids = std::mem::take(&mut self.ids);
        if !ids.is_empty()
            && let Err(e) = self.client.release(&ids).await
        {
            tracing::warn!(error = %e, "releasing leases failed (they end with their lease time)");
        }
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let ids = std::mem::take(&mut self.ids);
        if ids.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            runtime.spawn(async move {
                if let Err(e) = client.release(&ids).await {
                    tracing::warn!(error = %e, "releasing leases failed (they end with their lease time)");
                }
            });
        }
    }
}

/// An estimate checked and not yet settled: given back whole if dropped unsettled (the work
/// panicked or the request was cancelled).
struct Reservation {
    client: Client,
    policy: String,
    identifiers: Identifiers,
    estimate: u64,
    settled: bool,
}

impl Reservation {
    async fn settle(&mut self, delta: i64) {
        self.settled = true;
        if delta != 0
            && let Err(e) = self
                .client
                .report(&self.policy, &self.identifiers, delta)
                .await
        {
            tracing::warn!(error = %e, policy = self.policy, delta, "reporting usage failed");
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, policy, identifiers) = (
            self.client.clone(),
            std::mem::take(&mut self.policy),
            std::mem::take(&mut self.identifiers),
        );
        let delta = -(self.estimate as i64);
        runtime.spawn(async move {
            if let Err(e) = client.report(&policy, &identifiers, delta).await {
                tracing::warn!(error = %e, policy, delta, "giving back a reservation failed");
            }
        });
    }
}
