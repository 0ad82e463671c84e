//! Rendering a check's answer: the body of the check API (the same for 200 and 429) and
//! the IETF `RateLimit-Policy` / `RateLimit` headers.

use axum::{
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;

use crate::{
    domain::{Algorithm, Decision, Mode},
    service::Checked,
};

/// Set on the answer to a check no rule met (`?1`).
pub const UNMATCHED: HeaderName = HeaderName::from_static("spillway-unmatched");
/// Set on the answer to a check that sent dimensions no rule counts: an RFC 9651 list of
/// strings (`"usr"`).
pub const UNUSED: HeaderName = HeaderName::from_static("spillway-unused");

/// The answer to one check, before it becomes an HTTP response.
pub struct CheckAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: CheckBody,
}

/// The check's answer body (docs/services.md, "The API"), the same for 200 and 429. Typed rather
/// than a `serde_json::Value`: the check path is hot, and a struct serializes without
/// building maps.
#[derive(Debug, Serialize)]
pub struct CheckBody {
    pub allowed: bool,
    pub policy: String,
    pub policy_version: u64,
    pub mode: Mode,
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub reset_ms: Option<u64>,
    pub retry_after_ms: Option<u64>,
    pub degraded: bool,
    /// No rule of the policy met any identifier: let through, and nothing was counted (a
    /// caller's misspelt dimension, say). Never an allow by a limit.
    pub unmatched: bool,
    /// Dimensions the check sent that none of the policy's rules counts (a misspelt `usr`
    /// beside a correct `ip`): those identifiers limited nothing. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unused: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow_denied: Option<bool>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refunded: bool,
    pub results: Vec<ResultBody>,
}

/// One rule × identifier in a check's body.
#[derive(Debug, Serialize)]
pub struct ResultBody {
    pub rule: String,
    pub identifier: String,
    pub algorithm: String,
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: Option<u64>,
    pub binding: bool,
    /// Leaky bucket only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Concurrency rules of an allowed check: the lease it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Denied by the rule's penalty box (`block_ms`): held until `retry_after_ms`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub penalty: bool,
}

impl IntoResponse for CheckAnswer {
    fn into_response(self) -> Response {
        // Serialized into one buffer sized for a typical body (axum's `Json` writes through
        // a growing `BytesMut`, a third of the cost of a check's answer).
        let mut body = Vec::with_capacity(256 + 256 * self.body.results.len());
        if let Err(error) = serde_json::to_writer(&mut body, &self.body) {
            tracing::error!(%error, "could not serialize a check's answer");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        // The answer's own header map becomes the response's (a tuple response would
        // copy it into another), with room for the security headers added later.
        let mut response = Response::new(axum::body::Body::from(body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// Builds the check's answer body and its RateLimit headers from a decision.
pub(super) fn answer(checked: &Checked, deny_status: StatusCode) -> CheckAnswer {
    let (policy, decision, degraded) = (&*checked.policy, &checked.decision, checked.degraded);
    let binding = decision.binding();
    let shadow = policy.mode == Mode::Shadow;
    let denied = !decision.allowed;
    let status = if denied && !shadow {
        deny_status
    } else {
        StatusCode::OK
    };
    let results = decision
        .results
        .iter()
        .map(|r| ResultBody {
            rule: r.rule.to_string(),
            identifier: r.identifier.to_string(),
            algorithm: r.algorithm_name().to_owned(),
            allowed: r.outcome.allowed,
            limit: r.outcome.limit,
            remaining: r.outcome.remaining,
            reset_ms: r.outcome.reset_ms,
            retry_after_ms: r.outcome.retry_after_ms,
            binding: r.binding,
            delay_ms: matches!(r.algorithm, Some(Algorithm::LeakyBucket { .. }))
                .then_some(r.outcome.delay_ms),
            lease: r.lease.clone(),
            penalty: r.outcome.penalty,
        })
        .collect();
    let body = CheckBody {
        allowed: decision.allowed || shadow,
        policy: policy.name.to_string(),
        policy_version: policy.version,
        mode: policy.mode,
        limit: binding.map(|b| b.outcome.limit),
        remaining: binding.map(|b| b.outcome.remaining),
        reset_ms: binding.map(|b| b.outcome.reset_ms),
        retry_after_ms: binding.and_then(retry_hint),
        degraded,
        unmatched: checked.unmatched,
        unused: checked.unused.iter().map(ToString::to_string).collect(),
        shadow_denied: shadow.then_some(denied),
        refunded: decision.refunded,
        results,
    };
    let mut headers = rate_limit_headers(decision);
    if status != StatusCode::OK
        && let Some(retry) = binding.and_then(retry_hint)
    {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(retry.div_ceil(1000).max(1)),
        );
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if checked.unmatched {
        // An RFC 9651 boolean: a proxy or middleware can tell without reading the body.
        headers.insert(UNMATCHED, HeaderValue::from_static("?1"));
    }
    if !checked.unused.is_empty() {
        let list: Vec<String> = checked.unused.iter().map(|d| format!("\"{d}\"")).collect();
        if let Ok(value) = HeaderValue::from_str(&list.join(", ")) {
            headers.insert(UNUSED, value);
        }
    }
    CheckAnswer {
        status,
        headers,
        body,
    }
}

/// The longest a concurrency denial tells a caller to wait: a slot frees whenever a holder
/// releases, which no one knows in advance, so the soonest lease end (often the whole lease
/// length, for leases just taken) would keep callers away long after a slot freed.
pub const CONCURRENCY_RETRY_HINT_MS: u64 = 1000;

/// When the binding rule says to try again: its own answer, but at most
/// [`CONCURRENCY_RETRY_HINT_MS`] for a concurrency rule (its result keeps the soonest
/// lease end).
fn retry_hint(binding: &crate::domain::RuleResult) -> Option<u64> {
    let retry = binding.outcome.retry_after_ms?;
    Some(match binding.algorithm {
        Some(Algorithm::Concurrency { .. }) => retry.min(CONCURRENCY_RETRY_HINT_MS),
        _ => retry,
    })
}

/// `RateLimit-Policy` lists every rule evaluated (`"per-second";q=10;w=1`); `RateLimit` gives
/// the binding one's state (`"per-second";r=9;t=1`), both as RFC 9651 structured fields in
/// the form of the IETF httpapi ratelimit-headers draft.
/// Each rule's window is that of the rule that was evaluated (an override's own, when it
/// replaces the policy's rule of the same name).
pub fn rate_limit_headers(decision: &Decision) -> HeaderMap {
    // Room for these, the answer's own and the API's security headers: no regrowth.
    let mut headers = HeaderMap::with_capacity(16);
    let mut seen: Vec<&str> = Vec::new();
    let mut list = String::with_capacity(48);
    for r in &decision.results {
        let Some(algorithm) = &r.algorithm else {
            continue;
        };
        if seen.contains(&r.rule.as_str()) {
            continue;
        }
        seen.push(r.rule.as_str());
        if !list.is_empty() {
            list.push_str(", ");
        }
        if matches!(algorithm, Algorithm::Concurrency { .. }) {
            // The draft's quota unit for requests in flight: no window.
            sf_item(&mut list, r.rule.as_str(), [('q', r.outcome.limit)]);
            list.push_str(";qu=\"concurrent-requests\"");
        } else {
            sf_item(
                &mut list,
                r.rule.as_str(),
                [('q', r.outcome.limit), ('w', algorithm.window_seconds())],
            );
        }
    }
    if let Ok(value) = HeaderValue::from_str(&list)
        && !list.is_empty()
    {
        headers.insert(HeaderName::from_static("ratelimit-policy"), value);
    }
    if let Some(b) = decision.binding() {
        let mut item = String::with_capacity(32);
        sf_item(
            &mut item,
            b.rule.as_str(),
            [
                ('r', b.outcome.remaining),
                ('t', b.outcome.reset_ms.div_ceil(1000)),
            ],
        );
        if let Ok(value) = HeaderValue::from_str(&item) {
            headers.insert(HeaderName::from_static("ratelimit"), value);
        }
    }
    headers
}

/// One structured-field item (RFC 9651): the string `name` with integer parameters.
/// Written by hand, on the check path: a rule's name is `[a-z0-9][a-z0-9_-]*` (`Name`), a
/// string that needs no escaping, and integers are capped at the format's 15 digits. The
/// tests read these headers back with the `sfv` parser.
fn sf_item<const N: usize>(out: &mut String, name: &str, params: [(char, u64); N]) {
    debug_assert!(
        name.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    );
    out.push('"');
    out.push_str(name);
    out.push('"');
    let mut digits = itoa::Buffer::new();
    for (key, value) in params {
        out.push(';');
        out.push(key);
        out.push('=');
        out.push_str(digits.format(value.min(999_999_999_999_999)));
    }
}
