//! The check endpoints services call on every request: `POST /api/v1/check`,
//! `POST /api/v1/check/batch` and `GET /api/v1/forward-auth`.

use std::borrow::Cow;

use axum::{
    Json,
    extract::{Query, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{ApiError, JsonBody, JsonBytes, require_key};
use crate::{
    auth::KeyRole,
    domain::{Algorithm, Decision, Identifier, Mode},
    service::{CheckRequest, Checked},
    state::AppState,
};

pub use crate::service::check::{MAX_COST, MAX_IDENTIFIERS};

/// Most checks in one batch.
pub const MAX_BATCH: usize = 100;

impl CheckRequest {
    /// Parses the JSON of SPEC §4 from the bytes of a body. A well-formed request (string
    /// identifiers, no unknown or repeated field) is read straight into its parts; anything
    /// else goes through `parse`, which names the field that is wrong. Both give the same
    /// answer for every input (a property test holds them to it).
    pub fn from_body(bytes: &[u8]) -> Result<Self, ApiError> {
        match serde_json::from_slice::<WellFormed<'_>>(bytes) {
            Ok(body) => Self::from_parts(body.policy.into_owned(), body.identifiers.0, body.cost),
            Err(_) => Self::parse(&super::JsonBody::parse(bytes)?.0, ""),
        }
    }

    /// Parses the JSON of SPEC §4; `path` prefixes field names (batch items).
    pub fn parse(value: &Value, path: &str) -> Result<Self, ApiError> {
        let at = |f: &str| format!("{path}{f}");
        let obj = value.as_object().ok_or_else(|| {
            ApiError::bad(
                if path.is_empty() {
                    "body".into()
                } else {
                    path.trim_end_matches('.').to_owned()
                },
                "must be a JSON object",
            )
        })?;
        if let Some(k) = obj
            .keys()
            .find(|k| !["policy", "identifiers", "cost"].contains(&k.as_str()))
        {
            if k.is_empty() {
                // A member named "" is named by where it is: the body, or this batch item.
                let whole = at("").trim_end_matches('.').to_owned();
                return Err(ApiError::bad(
                    if whole.is_empty() {
                        "body".to_owned()
                    } else {
                        whole
                    },
                    "has a member with an empty name (expected policy, identifiers, cost)",
                ));
            }
            return Err(ApiError::bad(
                at(k),
                "is not a known field (expected policy, identifiers, cost)",
            ));
        }
        let policy = obj
            .get("policy")
            .ok_or_else(|| ApiError::bad(at("policy"), "is required"))?
            .as_str()
            .ok_or_else(|| ApiError::bad(at("policy"), "must be a string"))?
            .to_owned();
        let ids = obj
            .get("identifiers")
            .ok_or_else(|| ApiError::bad(at("identifiers"), "is required"))?
            .as_object()
            .ok_or_else(|| {
                ApiError::bad(at("identifiers"), "must be an object of dimension: value")
            })?;
        if ids.is_empty() || ids.len() > MAX_IDENTIFIERS {
            return Err(ApiError::bad(
                at("identifiers"),
                format!("must hold 1 to {MAX_IDENTIFIERS} identifiers"),
            ));
        }
        // In order of dimension, whatever the order in the body (and whichever map
        // serde_json was built with): the order of the results and of the checks.
        let mut ids: Vec<(&String, &Value)> = ids.iter().collect();
        ids.sort_by(|a, b| a.0.cmp(b.0));
        let identifiers = ids
            .into_iter()
            .map(|(dimension, v)| {
                let field = at(&format!("identifiers.{dimension}"));
                let value = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => return Err(ApiError::bad(field, "must be a string")),
                };
                Identifier::new(dimension, &value).map_err(|m| ApiError::bad(field, m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cost = match obj.get("cost") {
            None | Some(Value::Null) => 1,
            Some(v) => v.as_u64().filter(|c| *c <= MAX_COST).ok_or_else(|| {
                ApiError::bad(
                    at("cost"),
                    format!("must be a whole number from 0 to {MAX_COST}"),
                )
            })?,
        };
        Ok(Self {
            policy,
            identifiers,
            cost,
        })
    }

    /// Validates the parts of a well-formed request, with `parse`'s errors in `parse`'s
    /// order (count, each identifier, cost).
    fn from_parts(
        policy: String,
        mut ids: Vec<(&str, &str)>,
        cost: Option<u64>,
    ) -> Result<Self, ApiError> {
        ids.sort_by(|a, b| a.0.cmp(b.0));
        if ids.is_empty() || ids.len() > MAX_IDENTIFIERS {
            return Err(ApiError::bad(
                "identifiers",
                format!("must hold 1 to {MAX_IDENTIFIERS} identifiers"),
            ));
        }
        let identifiers = ids
            .iter()
            .map(|(dimension, value)| {
                Identifier::new(dimension, value)
                    .map_err(|m| ApiError::bad(format!("identifiers.{dimension}"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cost = match cost {
            None => 1,
            Some(c) if c <= MAX_COST => c,
            Some(_) => {
                return Err(ApiError::bad(
                    "cost",
                    format!("must be a whole number from 0 to {MAX_COST}"),
                ));
            }
        };
        Ok(Self {
            policy,
            identifiers,
            cost,
        })
    }
}

/// A check request in its expected shape, read without building a JSON tree.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WellFormed<'a> {
    #[serde(borrow)]
    policy: Cow<'a, str>,
    #[serde(borrow)]
    identifiers: StringIdentifiers<'a>,
    #[serde(default)]
    cost: Option<u64>,
}

/// `identifiers` as an object of strings, in order, borrowed from the body. A repeated
/// dimension, a value that is not a string, or a string with escapes (which cannot be
/// borrowed) is an error here, and `parse` then gives the answer.
struct StringIdentifiers<'a>(Vec<(&'a str, &'a str)>);

impl<'de: 'a, 'a> Deserialize<'de> for StringIdentifiers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = StringIdentifiers<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of strings")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut ids: Vec<(&'a str, &'a str)> = Vec::with_capacity(2);
                while let Some(key) = map.next_key::<&'de str>()? {
                    if ids.iter().any(|(k, _)| *k == key) {
                        return Err(serde::de::Error::custom("a repeated dimension"));
                    }
                    let value = map.next_value::<&'de str>()?;
                    ids.push((key, value));
                    if ids.len() > MAX_IDENTIFIERS {
                        return Err(serde::de::Error::custom("too many identifiers"));
                    }
                }
                Ok(StringIdentifiers(ids))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// The answer to one check, before it becomes an HTTP response.
pub struct CheckAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: CheckBody,
}

/// The body of SPEC §4, the same for 200 and 429. Typed rather than a `serde_json::Value`:
/// the check path is hot, and a struct serializes without building maps.
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
        let mut headers = self.headers;
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        (self.status, headers, body).into_response()
    }
}

/// Runs one check through the service and renders its answer. `deny_status` is 429 except
/// for forward-auth, where it is configurable.
pub async fn check(
    state: &AppState,
    request: &CheckRequest,
    deny_status: StatusCode,
) -> Result<CheckAnswer, ApiError> {
    let checked = state.check(request).await?;
    Ok(answer(&checked, deny_status))
}

/// Builds the body and headers of SPEC §4 from a decision.
fn answer(checked: &Checked, deny_status: StatusCode) -> CheckAnswer {
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
        retry_after_ms: binding.and_then(|b| b.outcome.retry_after_ms),
        degraded,
        shadow_denied: shadow.then_some(denied),
        refunded: decision.refunded,
        results,
    };
    let mut headers = rate_limit_headers(decision);
    if status != StatusCode::OK
        && let Some(retry) = binding.and_then(|b| b.outcome.retry_after_ms)
    {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(retry.div_ceil(1000).max(1)),
        );
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    CheckAnswer {
        status,
        headers,
        body,
    }
}

/// `RateLimit-Policy` lists every rule evaluated (`"per-second";q=10;w=1`); `RateLimit` gives
/// the binding one's state (`"per-second";r=9;t=1`), both as RFC 9651 structured fields in
/// the form of the IETF httpapi ratelimit-headers draft.
/// Each rule's window is that of the rule that was evaluated (an override's own, when it
/// replaces the policy's rule of the same name).
pub fn rate_limit_headers(decision: &Decision) -> HeaderMap {
    let mut headers = HeaderMap::new();
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
        sf_item(
            &mut list,
            r.rule.as_str(),
            [('q', r.outcome.limit), ('w', algorithm.window_seconds())],
        );
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

/// `POST /api/v1/check`
#[utoipa::path(post, path = "/api/v1/check", tag = "checks", operation_id = "check", request_body = crate::api::openapi::CheckRequest, responses((status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), 
    (status = 200, description = "Allowed (or shadow mode)", body = crate::api::openapi::CheckResponse),
    (status = 429, description = "Denied", body = crate::api::openapi::CheckResponse),
    (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 413, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 503, description = "Redis unreachable and the policy fails closed", body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub async fn check_handler(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: JsonBytes,
) -> Result<CheckAnswer, ApiError> {
    require_key(&state, &headers, KeyRole::Service)?;
    let request = CheckRequest::from_body(&body.0)?;
    check(&state, &request, StatusCode::TOO_MANY_REQUESTS).await
}

/// `POST /api/v1/check/batch`: `{"checks": [...]}`, up to 100, answered in order, each with
/// its own status and body.
#[utoipa::path(post, path = "/api/v1/check/batch", tag = "checks", operation_id = "check_batch", request_body = crate::api::openapi::BatchRequest, responses((status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json"), 
    (status = 200, body = crate::api::openapi::BatchResponse), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub async fn batch_handler(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    require_key(&state, &headers, KeyRole::Service)?;
    let checks = body
        .0
        .get("checks")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("checks", "is required: an array of check requests"))?;
    if checks.is_empty() || checks.len() > MAX_BATCH {
        return Err(ApiError::bad(
            "checks",
            format!("must hold 1 to {MAX_BATCH} checks"),
        ));
    }
    let requests: Vec<Result<CheckRequest, ApiError>> = checks
        .iter()
        .enumerate()
        .map(|(i, item)| CheckRequest::parse(item, &format!("checks[{i}].")))
        .collect();
    // On a single Redis the checks go out together: each is queued for the shared script
    // call as it is first polled, in order, so they share calls and checks of the same
    // identifier are still decided in the batch's order. On a cluster a check is several
    // calls, so they go one after another to keep that order.
    let results = if state.store.is_cluster() {
        let mut results = Vec::with_capacity(requests.len());
        for request in &requests {
            results.push(batch_item(&state, request).await);
        }
        results
    } else {
        futures_util::future::join_all(requests.iter().map(|r| batch_item(&state, r))).await
    };
    Ok(Json(json!({ "results": results })))
}

/// One answer of a batch: its status and body, a check's or a problem's.
async fn batch_item(state: &AppState, request: &Result<CheckRequest, ApiError>) -> Value {
    let problem = |e: &ApiError| json!({ "status": e.status().as_u16(), "body": e.body() });
    match request {
        Ok(request) => match check(state, request, StatusCode::TOO_MANY_REQUESTS).await {
            Ok(a) => {
                json!({ "status": a.status.as_u16(), "body": serde_json::to_value(&a.body).unwrap_or(Value::Null) })
            }
            Err(e) => problem(&e),
        },
        Err(e) => problem(e),
    }
}

/// Query of forward-auth. Both are strings so that parsing the query never fails before
/// our own field-named errors can answer.
#[derive(Deserialize)]
pub struct ForwardAuthQuery {
    policy: Option<String>,
    cost: Option<String>,
}

/// `GET /api/v1/forward-auth?policy=<name>` for Traefik ForwardAuth, Envoy ext_authz and
/// nginx auth_request: identifiers come from the configured headers (`X-Forwarded-For` →
/// `ip`: the address the calling proxy appended, or further left past trusted proxies, see
/// `crate::forwarded`); the key may come as `Authorization: Bearer` or `X-Spillway-Key`.
#[utoipa::path(get, path = "/api/v1/forward-auth", tag = "checks", operation_id = "forward_auth", params(("policy" = String, Query, description = "Policy name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"), ("cost" = Option<u64>, Query, description = "Default 1", maximum = 1000000000), ("X-Forwarded-For" = String, Header, description = "The client address (the default identifier header)", pattern = "^[0-9a-fA-F.:]{2,45}$")), responses(
    (status = 200, description = "Allowed", body = crate::api::openapi::CheckResponse),
    (status = 429, description = "Denied (the status is configurable)", body = crate::api::openapi::CheckResponse), (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"), (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub async fn forward_auth_handler(
    State(state): State<AppState>,
    Query(query): Query<ForwardAuthQuery>,
    headers: HeaderMap,
) -> Result<CheckAnswer, ApiError> {
    let key_ok = state
        .keys
        .caller_of_bearer(
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
        )
        .is_some()
        || headers
            .get("x-spillway-key")
            .and_then(|v| v.to_str().ok())
            .and_then(|k| state.keys.caller_of(k))
            .is_some();
    if !key_ok {
        return Err(ApiError::Unauthorized);
    }
    let policy = query
        .policy
        .ok_or_else(|| ApiError::bad("policy", "is required as a query parameter"))?;
    let cost = match query.cost {
        None => 1,
        Some(raw) => raw
            .parse::<u64>()
            .ok()
            .filter(|c| *c <= MAX_COST)
            .ok_or_else(|| ApiError::bad("cost", "must be a whole number"))?,
    };
    let mut identifiers = Vec::new();
    for (dimension, header_name) in &state.forward_auth.identifiers {
        let Some(raw) = headers
            .get(header_name.as_str())
            .and_then(|v| v.to_str().ok())
        else {
            continue;
        };
        let client;
        let value = if header_name == "x-forwarded-for" {
            // The caller holds a service key: the address it appended (the rightmost) is
            // believed, and so are those further left only while they are trusted proxies.
            // What the client itself wrote there is never the identifier.
            match state
                .trusted_proxies
                .forwarded_client(&headers)
                .map_err(|m| ApiError::bad("X-Forwarded-For", m))?
            {
                Some(ip) => {
                    client = ip.to_string();
                    client.as_str()
                }
                None => continue,
            }
        } else {
            raw.trim()
        };
        if value.is_empty() {
            continue;
        }
        identifiers.push(
            Identifier::new(dimension, value).map_err(|m| ApiError::bad(header_name.clone(), m))?,
        );
    }
    if identifiers.is_empty() {
        let names: Vec<&str> = state
            .forward_auth
            .identifiers
            .iter()
            .map(|(_, h)| h.as_str())
            .collect();
        return Err(ApiError::bad(
            names.join(", "),
            "no identifier header in the request",
        ));
    }
    let deny = StatusCode::from_u16(state.forward_auth.deny_status)
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let request = CheckRequest {
        policy,
        identifiers,
        cost,
    };
    check(&state, &request, deny).await
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What a parse came to, comparable: the request's parts or the error's text.
    fn outcome(r: Result<CheckRequest, ApiError>) -> Result<(String, Vec<String>, u64), String> {
        r.map(|c| {
            (
                c.policy,
                c.identifiers.iter().map(|i| i.to_string()).collect(),
                c.cost,
            )
        })
        .map_err(|e| format!("{e:?}"))
    }

    fn slow(body: &str) -> Result<(String, Vec<String>, u64), String> {
        outcome(JsonBody::parse(body.as_bytes()).and_then(|v| CheckRequest::parse(&v.0, "")))
    }

    fn json_value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"web\"".to_owned()),
            Just("\"\"".to_owned()),
            Just("\"a\\\"b\"".to_owned()),
            Just("\"caf\\u00e9\"".to_owned()),
            Just("\"tab\\there\"".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("[]".to_owned()),
            Just("{}".to_owned()),
            (0u64..3_000_000_000).prop_map(|n| n.to_string()),
            Just("-1".to_owned()),
            Just("2.5".to_owned()),
            Just("1e3".to_owned()),
            "[a-z0-9_]{1,6}".prop_map(|s| format!("\"{s}\"")),
        ]
    }

    fn identifiers() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("user".to_owned()),
            Just("ip".to_owned()),
            Just("User".to_owned()),
            Just("".to_owned()),
            Just("a|b".to_owned()),
            "[a-z]{1,3}",
        ];
        prop_oneof![
            prop::collection::vec((key, json_value()), 0..19).prop_map(|pairs| {
                let members: Vec<String> = pairs
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            }),
            json_value(),
        ]
    }

    /// Mostly the shape a service sends (so the fast path runs, and its checks of names,
    /// values and cost are exercised), with every part sometimes something else.
    fn nearly_well_formed() -> impl Strategy<Value = String> {
        let policy =
            prop_oneof![3 => "[a-z]{1,5}".prop_map(|s| format!("\"{s}\"")), 1 => json_value()];
        let value = prop_oneof![
            4 => "[a-z0-9.]{0,8}".prop_map(|s| format!("\"{s}\"")),
            1 => Just(format!("\"{}\"", "x".repeat(300))),
            1 => json_value(),
        ];
        let key = prop_oneof![4 => "(user|ip|key|org)", 1 => "[A-Za-z|_ -]{0,4}"];
        let ids = prop_oneof![
            4 => prop::collection::vec((key, value), 0..5).prop_map(|pairs| {
                let members: Vec<String> = pairs.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", members.join(","))
            }),
            1 => identifiers(),
        ];
        let cost = prop_oneof![
            2 => Just(None),
            2 => (0u64..1_100_000_000).prop_map(|n| Some(n.to_string())),
            1 => json_value().prop_map(Some),
        ];
        (policy, ids, cost, any::<bool>()).prop_map(|(p, i, c, swap)| {
            let mut members = vec![format!("\"policy\":{p}"), format!("\"identifiers\":{i}")];
            if let Some(c) = c {
                members.push(format!("\"cost\":{c}"));
            }
            if swap {
                members.reverse();
            }
            format!("{{{}}}", members.join(","))
        })
    }

    fn body() -> impl Strategy<Value = String> {
        let member = prop_oneof![
            json_value().prop_map(|v| format!("\"policy\":{v}")),
            identifiers().prop_map(|v| format!("\"identifiers\":{v}")),
            json_value().prop_map(|v| format!("\"cost\":{v}")),
            json_value().prop_map(|v| format!("\"extra\":{v}")),
        ];
        prop_oneof![
            8 => nearly_well_formed(),
            4 => prop::collection::vec(member, 0..5).prop_map(|m| format!("{{{}}}", m.join(","))),
            1 => json_value(),
            1 => Just("{\"policy\":\"web\",".to_owned()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The well-formed fast path and the field-naming parse agree on every body:
        /// the same request, or the same error.
        #[test]
        fn the_fast_parse_agrees_with_the_tree_parse(body in body()) {
            prop_assert_eq!(outcome(CheckRequest::from_body(body.as_bytes())), slow(&body), "{}", body);
        }
    }

    #[test]
    fn a_plain_request_takes_the_fast_path() {
        let body = r#"{"policy":"web","identifiers":{"user":"42","ip":"10.0.0.1"},"cost":2}"#;
        assert!(serde_json::from_slice::<WellFormed<'_>>(body.as_bytes()).is_ok());
        let parsed = CheckRequest::from_body(body.as_bytes()).unwrap();
        assert_eq!(parsed.policy, "web");
        assert_eq!(parsed.cost, 2);
        let ids: Vec<String> = parsed.identifiers.iter().map(|i| i.to_string()).collect();
        // In order of dimension, as the tree parse gives them.
        assert_eq!(ids, ["ip=10.0.0.1", "user=42"]);
    }
}
