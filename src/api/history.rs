//! `GET /api/v1/history`: a policy's checks (or every policy's) over a time range, per
//! minute, hour or day, and the identifiers denied and checked most; as JSON, or as CSV
//! with `format=csv` (or `Accept: text/csv`). Admin keys, or a signed-in session.

use axum::{
    extract::{Query, State},
    http::{HeaderMap, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::json;

use super::{Admin, ApiError, may};
use crate::{
    domain::{
        history::{self, Range, Step},
        time::utc_minutes,
    },
    service::history::{History, HistoryError},
    state::AppState,
};

/// Most identifiers in each top list of an answer.
const MAX_TOP: usize = 100;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct HistoryQuery {
    /// A policy; absent (or `*`): every policy together.
    policy: Option<String>,
    /// `1h`, `24h` (default), `7d`, `30d` or `90d`.
    range: Option<String>,
    /// `minute` (ranges up to 24h), `hour` or `day`; default: minutes for 1h, hours for
    /// 24h and 7d, days beyond.
    step: Option<String>,
    /// Identifiers in each top list, 0 to 100 (default 10).
    #[param(value_type = Option<u32>, minimum = 0, maximum = 100)]
    top: Option<String>,
    /// `json` (default), `csv` (the series) or `csv-top` (the top lists:
    /// list,policy,identifier,count).
    format: Option<String>,
}

/// Checks over time: allowed, denied, shadow-denied and degraded per period, and the
/// identifiers denied and checked most over the range.
#[utoipa::path(get, path = "/api/v1/history", tag = "history", operation_id = "read_history",
    params(HistoryQuery),
    responses((status = 200, description = "The series, oldest first, and the top lists", body = crate::api::openapi::HistoryDocument),
    (status = 400, description = "A parameter is wrong; or CSV was asked for (`format` csv or csv-top, or `Accept: text/csv`), which /api/v1/history/csv answers with the same query: this operation answers only JSON", body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn read(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    headers: HeaderMap,
    Query(query): Query<HistoryQuery>,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    let asked = Asked::parse(&query, &headers)?;
    // One media type an operation: a generated client reads this one's answer as JSON,
    // and is never handed CSV.
    if asked.csv != Csv::No {
        return Err(ApiError::bad(
            if query.format.is_some() {
                "format"
            } else {
                "Accept"
            },
            format!(
                "CSV is answered by GET /api/v1/history/csv?{}; this operation answers JSON",
                raw.unwrap_or_default()
            ),
        ));
    }
    answer(&state, &query, asked).await
}

/// The same as CSV, as its own operation (a generated client parses each operation's
/// answer as one media type): the series, or with `format=csv-top` the top lists.
#[utoipa::path(get, path = "/api/v1/history/csv", tag = "history", operation_id = "read_history_csv",
    params(HistoryQuery),
    responses((status = 200, description = "The series as time,allowed,denied,shadow_denied,degraded; with format=csv-top the top lists as list,policy,identifier,count", body = String, content_type = "text/csv"),
    (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 401, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn read_csv(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    headers: HeaderMap,
    Query(query): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    let mut asked = Asked::parse(&query, &headers)?;
    if asked.csv == Csv::No {
        asked.csv = Csv::Series;
    }
    answer(&state, &query, asked).await
}

/// The history `asked` for, as JSON or CSV.
async fn answer(
    state: &AppState,
    query: &HistoryQuery,
    asked: Asked,
) -> Result<Response, ApiError> {
    let found = state
        .service()
        .history(
            query.policy.as_deref(),
            asked.range,
            asked.step,
            match asked.csv {
                Csv::Series => 0,
                Csv::Top | Csv::No => asked.top,
            },
        )
        .await
        .map_err(|e| match e {
            HistoryError::Invalid { field, message } => ApiError::bad(field, message),
            HistoryError::Store(error) => ApiError::RedisUnavailable(error),
        })?;
    Ok(match asked.csv {
        Csv::Series => csv_answer(&found),
        Csv::Top => csv_top_answer(&found),
        Csv::No => json_answer(&found),
    })
}

/// What a query asks for, once its parameters are parsed.
struct Asked {
    range: Range,
    /// `None`: the range's own step.
    step: Option<Step>,
    /// Identifiers in each top list.
    top: usize,
    /// Whether the answer is CSV (`format=csv`, or no format and `Accept: text/csv`), and
    /// of what.
    csv: Csv,
}

/// Which CSV an answer is, if it is one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Csv {
    No,
    /// The series (`format=csv`).
    Series,
    /// The top lists (`format=csv-top`).
    Top,
}

impl Asked {
    /// Parses the query's range, step, top and format, in that order; `headers` for the
    /// `Accept` a query without a format leaves to.
    fn parse(query: &HistoryQuery, headers: &HeaderMap) -> Result<Self, ApiError> {
        let range = match query.range.as_deref() {
            None | Some("") => Range::Day,
            Some(r) => Range::parse(r).map_err(|m| ApiError::bad("range", m))?,
        };
        let step = match query.step.as_deref() {
            None | Some("") => None,
            Some(s) => Some(Step::parse(s).map_err(|m| ApiError::bad("step", m))?),
        };
        let top = match query.top.as_deref() {
            None | Some("") => 10,
            Some(t) => t
                .parse::<usize>()
                .ok()
                .filter(|t| *t <= MAX_TOP)
                .ok_or_else(|| {
                    ApiError::bad("top", format!("expected 0 to {MAX_TOP}, got {t:?}"))
                })?,
        };
        let csv = match query.format.as_deref() {
            Some("csv") => Csv::Series,
            Some("csv-top") => Csv::Top,
            Some("json") => Csv::No,
            None | Some("") => {
                let asks = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|a| a.contains("text/csv"));
                if asks { Csv::Series } else { Csv::No }
            }
            Some(f) => {
                return Err(ApiError::bad(
                    "format",
                    format!("expected json, csv or csv-top, got {f:?}"),
                ));
            }
        };
        Ok(Self {
            range,
            step,
            top,
            csv,
        })
    }
}

/// The series as a CSV download: time,allowed,denied,shadow_denied,degraded.
fn csv_answer(found: &History) -> Response {
    let mut body = String::from("time,allowed,denied,shadow_denied,degraded\n");
    for (at, c) in &found.points {
        body.push_str(&format!(
            "{},{},{},{},{}\n",
            iso(*at),
            c.allowed,
            c.denied,
            c.shadow_denied,
            c.degraded
        ));
    }
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"history.csv\"",
            ),
        ],
        body,
    )
        .into_response()
}

/// The top lists as a CSV download: list,policy,identifier,count (`denied` then
/// `checked`, most first).
fn csv_top_answer(found: &History) -> Response {
    let mut body = String::from("list,policy,identifier,count\n");
    for (list, rows) in [
        ("denied", &found.top_denied),
        ("checked", &found.top_checked),
    ] {
        for (member, count) in rows {
            let (policy, identifier) = if found.policy == history::ALL {
                history::split_member(member)
            } else {
                (found.policy.as_str(), member.as_str())
            };
            body.push_str(&format!(
                "{list},{},{},{count}\n",
                csv_field(policy),
                csv_field(identifier)
            ));
        }
    }
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"history-top.csv\"",
            ),
        ],
        body,
    )
        .into_response()
}

/// A CSV field: quoted when it holds a comma, a quote or a line break (RFC 4180); a field
/// a spreadsheet would run as a formula starts with a quote mark.
fn csv_field(raw: &str) -> String {
    let safe = if raw.starts_with(['=', '+', '-', '@']) {
        format!("'{raw}")
    } else {
        raw.to_owned()
    };
    if safe.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", safe.replace('"', "\"\""))
    } else {
        safe
    }
}

/// The series, totals and top lists as the JSON document.
fn json_answer(found: &History) -> Response {
    let ranked = |list: &[(String, u64)]| -> Vec<serde_json::Value> {
        list.iter()
            .map(|(member, count)| {
                if found.policy == history::ALL {
                    let (policy, identifier) = history::split_member(member);
                    json!({"policy": policy, "identifier": identifier, "count": count})
                } else {
                    json!({"policy": found.policy, "identifier": member, "count": count})
                }
            })
            .collect()
    };
    let points: Vec<serde_json::Value> = found
        .points
        .iter()
        .map(|(at, c)| {
            json!({"time": iso(*at), "t_ms": at, "allowed": c.allowed, "denied": c.denied,
                "shadow_denied": c.shadow_denied, "degraded": c.degraded, "unmatched": c.unmatched})
        })
        .collect();
    axum::Json(json!({
        "policy": found.policy,
        "range": found.range,
        "step": found.step,
        "step_ms": found.step.ms(),
        "points": points,
        "totals": found.totals,
        "top_denied": ranked(&found.top_denied),
        "top_checked": ranked(&found.top_checked),
        "top_accuracy": history::TOP_ERROR,
        "from": utc_minutes(found.points.first().map(|p| p.0)),
    }))
    .into_response()
}

/// `2026-11-24T10:00:00Z`.
fn iso(ms: i64) -> String {
    crate::domain::time::utc_seconds(ms)
        .trim_end_matches(" UTC")
        .replacen(' ', "T", 1)
        + "Z"
}
