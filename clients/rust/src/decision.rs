//! What a check decided, and what to tell the end user.

use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::FailMode;

/// Spillway's answer to a check (the fields a service acts on).
#[derive(Clone, Debug, Deserialize)]
pub struct Answer {
    pub allowed: bool,
    pub policy: String,
    #[serde(default)]
    pub policy_version: u64,
    /// `enforce` or `shadow`.
    pub mode: String,
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub reset_ms: Option<u64>,
    pub retry_after_ms: Option<u64>,
    #[serde(default)]
    pub degraded: bool,
    /// No rule of the policy counts these identifiers: nothing was limited.
    #[serde(default)]
    pub unmatched: bool,
    pub shadow_denied: Option<bool>,
    #[serde(default)]
    pub results: Vec<RuleResult>,
}

/// One rule's verdict within an answer.
#[derive(Clone, Debug, Deserialize)]
pub struct RuleResult {
    pub rule: String,
    pub identifier: String,
    pub algorithm: String,
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: Option<u64>,
    #[serde(default)]
    pub binding: bool,
    /// A `concurrency` rule's lease: release it when the work ends.
    pub lease: Option<String>,
}

/// Why a check came out as it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed by the policy's limits (or in shadow mode).
    Allowed,
    /// Denied by a limit; `retry_after` is when to come back.
    Limited { retry_after: Option<Duration> },
    /// The cost asked for is more than a rule could ever allow (422): retrying cannot help.
    TooCostly { detail: String },
    /// Spillway could not be reached in time, or answered 5xx.
    Unavailable { reason: String, fail: FailMode },
    /// Spillway refused the call itself (401, 403, 404, 400): a configuration error.
    Misconfigured {
        status: StatusCode,
        detail: String,
        fail: FailMode,
    },
}

/// A check's decision: whether to go on, the headers to pass on, and Spillway's answer.
#[derive(Clone, Debug)]
pub struct Decision {
    outcome: Outcome,
    answer: Option<Answer>,
    headers: Vec<(HeaderName, HeaderValue)>,
    from_cache: bool,
    from_breaker: bool,
}

impl Decision {
    pub(crate) fn new(
        outcome: Outcome,
        answer: Option<Answer>,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        Self {
            outcome,
            answer,
            headers,
            from_cache: false,
            from_breaker: false,
        }
    }

    /// Spillway could not be reached (or the open circuit breaker answered for it).
    pub(crate) fn unavailable(reason: String, fail: FailMode, from_breaker: bool) -> Self {
        Self {
            from_breaker,
            ..Self::new(Outcome::Unavailable { reason, fail }, None, Vec::new())
        }
    }

    pub(crate) fn cached(
        outcome: Outcome,
        answer: Option<Answer>,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        Self {
            from_cache: true,
            ..Self::new(outcome, answer, headers)
        }
    }

    /// Whether the request goes on: allowed by Spillway, or undecided and failing open.
    pub fn allowed(&self) -> bool {
        match &self.outcome {
            Outcome::Allowed => true,
            Outcome::Limited { .. } | Outcome::TooCostly { .. } => false,
            Outcome::Unavailable { fail, .. } | Outcome::Misconfigured { fail, .. } => {
                *fail == FailMode::Open
            }
        }
    }

    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Spillway's answer, when it gave one (not for a timeout or a refusal).
    pub fn answer(&self) -> Option<&Answer> {
        self.answer.as_ref()
    }

    /// Answered from the local denial cache, without a call.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// Answered by the open circuit breaker, without a call: Spillway was unavailable to the
    /// last calls ([`Outcome::Unavailable`]'s `reason` says what they met).
    pub fn from_breaker(&self) -> bool {
        self.from_breaker
    }

    /// No rule counted the identifiers (a lenient policy let the check through).
    pub fn unmatched(&self) -> bool {
        self.answer.as_ref().is_some_and(|a| a.unmatched)
    }

    /// `RateLimit-Policy`, `RateLimit` and (denied) `Retry-After`, to copy onto the response.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The leases of the check's `concurrency` rules.
    pub fn leases(&self) -> Vec<String> {
        self.answer
            .iter()
            .flat_map(|a| a.results.iter().filter_map(|r| r.lease.clone()))
            .collect()
    }

    /// How often to renew the leases while work runs: a third of the shortest time a lease
    /// has left (at least 50 ms).
    pub(crate) fn renew_every(&self) -> Option<Duration> {
        self.answer
            .iter()
            .flat_map(|a| {
                a.results
                    .iter()
                    .filter(|r| r.lease.is_some())
                    .map(|r| r.reset_ms)
            })
            .min()
            .map(|ms| Duration::from_millis((ms / 3).max(50)))
    }

    /// The status and RFC 9457 problem to answer an end user who is not let through. For an
    /// allowed decision it is still a well-formed 429 (a caller should not ask).
    pub fn problem(&self) -> (StatusCode, serde_json::Value) {
        let (status, detail) = match &self.outcome {
            Outcome::TooCostly { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "This request asks for more than the rate limit allows at once.".to_owned(),
            ),
            Outcome::Unavailable { .. } | Outcome::Misconfigured { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The request could not be checked against its rate limit; try again shortly."
                    .to_owned(),
            ),
            Outcome::Allowed | Outcome::Limited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                match self.retry_after_secs() {
                    Some(secs) => format!("Too many requests: try again in {secs} s."),
                    None => "Too many requests: try again later.".to_owned(),
                },
            ),
        };
        let mut problem = json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or_default(),
            "status": status.as_u16(),
            "detail": detail,
        });
        if let (StatusCode::TOO_MANY_REQUESTS, Some(secs)) = (status, self.retry_after_secs()) {
            problem["retry_after"] = json!(secs);
        }
        (status, problem)
    }

    /// Whole seconds until a retry may pass (rounded up), when a limit said.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match &self.outcome {
            Outcome::Limited {
                retry_after: Some(after),
            } => Some(after.as_millis().div_ceil(1000) as u64),
            _ => None,
        }
    }
}
