//! envoyproxy/ratelimit's HTTP endpoint: `POST /json` takes a `RateLimitRequest` as proto3
//! JSON and answers the `RateLimitResponse` as proto3 JSON, 200 when OK and 429 when over
//! the limit, behind the same service key as the gRPC server. Field names are read in both
//! proto3 JSON spellings (`hitsAddend` and `hits_addend`); 64-bit numbers as strings or
//! numbers; units by name or number.

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use base64::Engine;
use serde::{Deserialize, Deserializer, de::Error as _};
use serde_json::{Map, Value, json};

use crate::{
    domain::envoy::Unit,
    service::envoy::{DescriptorAnswer, EnvoyAnswer, EnvoyDescriptor, EnvoyError, EnvoyRequest},
    state::AppState,
};

/// Largest request body read.
const MAX_BODY: usize = 64 * 1024;

pub fn router() -> Router<AppState> {
    Router::new().route("/json", post(handler))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        deserialize_with = "number"
    )]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        deserialize_with = "number"
    )]
    hits_addend: Option<u64>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        default,
        alias = "requests_per_unit",
        rename = "requestsPerUnit",
        deserialize_with = "number"
    )]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unit: Option<Value>,
}

/// A proto3 JSON integer: a number or a decimal string, exponent notation accepted
/// (`1e3`, `"2.5e1"`) when the value is whole, as protojson accepts it.
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let bad = || D::Error::custom("must be a whole number ≥ 0");
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().and_then(whole))
            .map(Some)
            .ok_or_else(bad),
        Some(Value::String(s)) => s
            .parse::<u64>()
            .ok()
            .or_else(|| s.parse::<f64>().ok().and_then(whole))
            .map(Some)
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// A double that is a whole number a u64 holds exactly (up to 2^53).
fn whole(f: f64) -> Option<u64> {
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0)
        .then_some(f as u64)
}

fn unit_of(value: &Value) -> Option<Unit> {
    match value {
        Value::String(name) => Unit::parse(name),
        Value::Number(n) => Unit::from_code(i32::try_from(n.as_i64()?).ok()?),
        _ => None,
    }
}

/// A problem document typed as the API types its own: `unauthorized`, `invalid-request`,
/// `payload-too-large`, `redis-unavailable`.
fn problem(status: StatusCode, field: &str, detail: String) -> Response {
    let kind = match status {
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::PAYLOAD_TOO_LARGE => "payload-too-large",
        StatusCode::SERVICE_UNAVAILABLE => "redis-unavailable",
        _ => "invalid-request",
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        Json(json!({
            "type": format!("https://spillway.dev/problems/{kind}"),
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": format!("{field}: {detail}"),
            "field": field,
        })),
    )
        .into_response()
}

fn parse(bytes: &[u8]) -> Result<EnvoyRequest, (String, String)> {
    let raw: JsonRequest =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes))
            .map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." { "body".into() } else { path };
                (field, e.inner().to_string())
            })?;
    let descriptors = raw
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            if d.is_negative_hits {
                return Err((
                    format!("descriptors[{i}].isNegativeHits"),
                    "negative hits (giving back) are not supported".into(),
                ));
            }
            let limit = match d.limit {
                None => None,
                Some(l) => {
                    let unit = l.unit.as_ref().and_then(unit_of).ok_or_else(|| {
                        (
                            format!("descriptors[{i}].limit.unit"),
                            "must be SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR".to_owned(),
                        )
                    })?;
                    let rpu = u32::try_from(l.requests_per_unit.unwrap_or(0)).map_err(|_| {
                        (
                            format!("descriptors[{i}].limit.requestsPerUnit"),
                            "must fit in 32 bits".to_owned(),
                        )
                    })?;
                    Some((rpu, unit))
                }
            };
            Ok(EnvoyDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit,
                hits_addend: d.hits_addend,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(EnvoyRequest {
        domain: raw.domain,
        descriptors,
        hits_addend: raw.hits_addend.unwrap_or(0),
        check_only: false,
    })
}

/// A proto3 JSON duration: seconds with up to three decimals, then `s`.
fn duration(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    }
}

fn code(ok: bool) -> &'static str {
    if ok { "OK" } else { "OVER_LIMIT" }
}

/// One status as proto3 JSON (default values left out, as protojson does).
fn status(s: &DescriptorAnswer) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code(s.ok)));
    if let Some(l) = &s.limit {
        let mut limit = Map::new();
        if !l.name.is_empty() {
            limit.insert("name".into(), json!(l.name));
        }
        if l.requests_per_unit > 0 {
            limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
        }
        limit.insert("unit".into(), json!(l.unit.as_str().to_ascii_uppercase()));
        out.insert("currentLimit".into(), Value::Object(limit));
    }
    if s.remaining > 0 {
        out.insert("limitRemaining".into(), json!(s.remaining));
    }
    if let Some(ms) = s.reset_ms {
        out.insert("durationUntilReset".into(), json!(duration(ms)));
    }
    Value::Object(out)
}

/// The answer as proto3 JSON, built from the same message the gRPC server sends.
fn answer(answer: &EnvoyAnswer, style: crate::config::EnvoyHeaders) -> Value {
    let message = super::wire::response(answer, style);
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code(answer.ok)));
    out.insert(
        "statuses".into(),
        Value::Array(answer.statuses.iter().map(status).collect()),
    );
    if !message.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            Value::Array(
                message
                    .response_headers_to_add
                    .iter()
                    .map(|h| json!({"key": h.key, "value": h.value}))
                    .collect(),
            ),
        );
    }
    if !message.raw_body.is_empty() {
        out.insert(
            "rawBody".into(),
            json!(base64::engine::general_purpose::STANDARD.encode(&message.raw_body)),
        );
    }
    Value::Object(out)
}

async fn handler(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    // The key first, from the header alone: no body is read for a caller without one.
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    if state.envoy.require_key
        && crate::auth::keys::caller_of_headers(state.service().keys(), &headers).is_none()
    {
        let mut r = problem(
            StatusCode::UNAUTHORIZED,
            "Authorization",
            "send a service key as 'Bearer <key>' or in X-Spillway-Key".into(),
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            "Bearer".parse().expect("a header"),
        );
        return r;
    }
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body",
            format!("at most {MAX_BODY} bytes"),
        );
    };
    let request = match parse(&body) {
        Ok(r) => r,
        Err((field, message)) => return problem(StatusCode::BAD_REQUEST, &field, message),
    };
    match state.service().should_rate_limit(&request).await {
        Ok(a) => {
            let status = if a.ok {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            (status, Json(answer(&a, state.envoy.headers))).into_response()
        }
        Err(EnvoyError::Invalid { field, message }) => {
            problem(StatusCode::BAD_REQUEST, &field, message)
        }
        Err(e) => {
            let mut r = problem(StatusCode::SERVICE_UNAVAILABLE, "redis", e.to_string());
            r.headers_mut()
                .insert(header::RETRY_AFTER, "1".parse().expect("a header"));
            r
        }
    }
}
