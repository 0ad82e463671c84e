//! The protocol's messages and the service's types, both ways; and the rate limit headers
//! an answer asks Envoy to add.

use envoy_types::pb::envoy::{
    config::core::v3::HeaderValue,
    service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse,
        rate_limit_response::{Code, DescriptorStatus, RateLimit},
    },
};

use crate::{
    config::EnvoyHeaders,
    domain::envoy::Unit,
    service::envoy::{DescriptorAnswer, EnvoyAnswer, EnvoyDescriptor, EnvoyError, EnvoyRequest},
};

/// The service's request from the protocol's; the error names the field.
pub fn request(message: RateLimitRequest) -> Result<EnvoyRequest, EnvoyError> {
    let descriptors = message
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            if d.is_negative_hits {
                return Err(EnvoyError::Invalid {
                    field: format!("descriptors[{i}].is_negative_hits"),
                    message: "negative hits (giving back) are not supported".into(),
                });
            }
            let limit = match d.limit {
                None => None,
                Some(l) => Some((
                    l.requests_per_unit,
                    Unit::from_code(l.unit).ok_or_else(|| EnvoyError::Invalid {
                        field: format!("descriptors[{i}].limit.unit"),
                        message: format!("{} is not a unit", l.unit),
                    })?,
                )),
            };
            Ok(EnvoyDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit,
                hits_addend: d.hits_addend.map(|h| h.value),
            })
        })
        .collect::<Result<_, EnvoyError>>()?;
    Ok(EnvoyRequest {
        domain: message.domain,
        descriptors,
        hits_addend: u64::from(message.hits_addend),
        check_only: false,
    })
}

/// The protocol's answer from the service's, with the headers `style` asks for and, when
/// over the limit, a problem+json body.
pub fn response(answer: &EnvoyAnswer, style: EnvoyHeaders) -> RateLimitResponse {
    let statuses = answer.statuses.iter().map(status).collect();
    let raw_body = if answer.ok {
        Vec::new()
    } else {
        problem_body(answer).into_bytes()
    };
    RateLimitResponse {
        overall_code: if answer.ok { Code::Ok } else { Code::OverLimit } as i32,
        statuses,
        response_headers_to_add: headers(answer, style)
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                ..HeaderValue::default()
            })
            .collect(),
        raw_body,
        ..RateLimitResponse::default()
    }
}

fn status(s: &DescriptorAnswer) -> DescriptorStatus {
    DescriptorStatus {
        code: if s.ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: s.limit.as_ref().map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.code(),
        }),
        limit_remaining: s.remaining,
        duration_until_reset: s
            .reset_ms
            .map(|ms| envoy_types::pb::google::protobuf::Duration {
                seconds: (ms / 1000) as i64,
                nanos: ((ms % 1000) * 1_000_000) as i32,
            }),
        ..DescriptorStatus::default()
    }
}

/// The descriptor whose state the `RateLimit` header reports: the first over its limit,
/// else the one with least remaining.
fn binding(answer: &EnvoyAnswer) -> Option<&DescriptorAnswer> {
    let limited = || answer.statuses.iter().filter(|s| s.limit.is_some());
    limited()
        .find(|s| !s.ok)
        .or_else(|| limited().min_by_key(|s| s.remaining))
}

/// A limit's name for the headers: its own, or `<n>-per-<unit>`.
fn label(s: &DescriptorAnswer) -> String {
    let l = s
        .limit
        .as_ref()
        .expect("only limited descriptors are labelled");
    if l.name.is_empty() {
        format!("{}-per-{}", l.requests_per_unit, l.unit.as_str())
    } else {
        l.name.clone()
    }
}

/// An RFC 9651 string: printable ASCII, `"` and `\` escaped, anything else as `?`.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// The rate limit headers of an answer, in the chosen style.
pub fn headers(answer: &EnvoyAnswer, style: EnvoyHeaders) -> Vec<(&'static str, String)> {
    let Some(b) = binding(answer) else {
        return Vec::new();
    };
    let limit = b.limit.as_ref().expect("binding has a limit");
    let reset_s = b.reset_ms.unwrap_or(0).div_ceil(1000);
    match style {
        EnvoyHeaders::None => Vec::new(),
        EnvoyHeaders::Ietf => {
            let mut seen = Vec::new();
            let policy: Vec<String> = answer
                .statuses
                .iter()
                .filter(|s| s.limit.is_some())
                .filter_map(|s| {
                    let l = s.limit.as_ref()?;
                    let item = format!(
                        "{};q={};w={}",
                        sf_string(&label(s)),
                        l.requests_per_unit,
                        l.unit.seconds()
                    );
                    (!seen.contains(&item)).then(|| {
                        seen.push(item.clone());
                        item
                    })
                })
                .collect();
            vec![
                ("ratelimit-policy", policy.join(", ")),
                (
                    "ratelimit",
                    format!("{};r={};t={reset_s}", sf_string(&label(b)), b.remaining),
                ),
            ]
        }
        EnvoyHeaders::Draft03 => vec![
            ("ratelimit-limit", limit.requests_per_unit.to_string()),
            ("ratelimit-remaining", b.remaining.to_string()),
            ("ratelimit-reset", reset_s.to_string()),
        ],
    }
}

/// The body Envoy sends its client when the request is over the limit.
fn problem_body(answer: &EnvoyAnswer) -> String {
    let over: Vec<String> = answer
        .statuses
        .iter()
        .filter(|s| !s.ok)
        .map(|s| match &s.limit {
            Some(_) => label(s),
            None => "blocked".to_owned(),
        })
        .collect();
    let retry = answer
        .statuses
        .iter()
        .filter(|s| !s.ok)
        .filter_map(|s| s.reset_ms)
        .max()
        .unwrap_or(0)
        .div_ceil(1000);
    serde_json::json!({
        "type": "https://spillway.dev/problems/rate-limited",
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!("over the limit: {}; retry in {retry} s", over.join(", ")),
        "retry_after_s": retry,
    })
    .to_string()
}
