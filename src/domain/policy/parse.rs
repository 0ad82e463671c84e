//! A policy document's fields read one by one: rules and their algorithms, calendars,
//! dimensions, caller-set numbers, local counting, waits, overrides and an Envoy domain,
//! every error naming its field (`rules[2].limit`).

use serde_json::Value;

use super::*;

/// Parses a non-empty array of rule documents found at `path`.
pub fn parse_rules(value: &Value, path: &str) -> Result<Vec<Rule>, PolicyError> {
    let items = value
        .as_array()
        .ok_or_else(|| PolicyError::field(path, "must be an array of rules"))?;
    if items.is_empty() {
        return Err(PolicyError::field(path, "must hold at least one rule"));
    }
    if items.len() > MAX_RULES {
        return Err(PolicyError::field(
            path,
            format!("at most {MAX_RULES} rules"),
        ));
    }
    let mut rules: Vec<Rule> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let rule = parse_rule(item, i, path)?;
        if rules.iter().any(|r| r.name == rule.name) {
            return Err(PolicyError::field(
                format!("{path}[{i}].name"),
                format!("{} is used by another rule", rule.name),
            ));
        }
        rules.push(rule);
    }
    Ok(rules)
}

/// `max_wait_ms`: required with `"on_deny": "wait"`, refused without it.
/// The most checks a policy's what-if record keeps (`record_checks`).
pub const MAX_RECORD_CHECKS: u64 = 10_000_000;

/// A document's `record_checks`: a whole number from 1 to [`MAX_RECORD_CHECKS`], or absent.
pub(super) fn parse_record_checks(
    obj: &serde_json::Map<String, Value>,
) -> Result<Option<u64>, PolicyError> {
    match obj.get("record_checks") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n @ 1..=MAX_RECORD_CHECKS) => Ok(Some(n)),
            _ => Err(PolicyError::field(
                "record_checks",
                format!(
                    "must be a whole number of checks from 1 to {MAX_RECORD_CHECKS} (\"record\": \"off\" records none)"
                ),
            )),
        },
    }
}

pub(super) fn parse_max_wait(
    obj: &serde_json::Map<String, Value>,
    on_deny: OnDeny,
) -> Result<Option<u64>, PolicyError> {
    Ok(match (on_deny, obj.get("max_wait_ms")) {
        (OnDeny::Refuse, None | Some(Value::Null)) => None,
        (OnDeny::Refuse, Some(_)) => {
            return Err(PolicyError::field(
                "max_wait_ms",
                "only goes with \"on_deny\": \"wait\"",
            ));
        }
        (OnDeny::Wait, v) => match v.and_then(Value::as_u64) {
            Some(ms @ 1..=MAX_WAIT_MS) => Some(ms),
            _ => {
                return Err(PolicyError::field(
                    "max_wait_ms",
                    format!(
                        "must be a whole number of ms from 1 to {MAX_WAIT_MS} with \"on_deny\": \"wait\""
                    ),
                ));
            }
        },
    })
}

/// `managed_by`: kept only as the store keeps it, and only on an Envoy domain.
pub(super) fn parse_managed_by(
    obj: &serde_json::Map<String, Value>,
    stored: bool,
    envoy: bool,
) -> Result<Option<String>, PolicyError> {
    Ok(match obj.get("managed_by") {
        None | Some(Value::Null) => None,
        Some(_) if !stored => None,
        Some(Value::String(s)) if envoy => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(PolicyError::field(
                "managed_by",
                "only an Envoy domain is managed by a folder or xDS",
            ));
        }
        Some(_) => return Err(PolicyError::field("managed_by", "must be a string")),
    })
}

/// A rule's `caller_max`: the most a caller may set each of its amounts to.
pub(super) fn parse_caller_max(
    obj: &serde_json::Map<String, Value>,
    rule: &Rule,
    at: &impl Fn(&str) -> String,
) -> Result<Option<std::collections::BTreeMap<String, u64>>, PolicyError> {
    Ok(match obj.get("caller_max") {
        None | Some(Value::Null) => None,
        Some(Value::Object(_))
            if matches!(rule.algorithm, crate::domain::Algorithm::Concurrency { .. }) =>
        {
            return Err(PolicyError::field(
                at("caller_max"),
                "a concurrency rule takes no numbers from callers (its leases are released under its own)",
            ));
        }
        Some(Value::Object(caps)) => {
            // Amounts only: a bigger one is a looser rule, so a cap bounds it. (A shorter
            // window or period would loosen it too, and no maximum could stop that.)
            let fields: Vec<&str> = rule
                .algorithm
                .kind()
                .params
                .iter()
                .map(|p| p.field)
                .filter(|f| crate::domain::rule::CALLER_AMOUNTS.contains(f))
                .collect();
            let mut out = std::collections::BTreeMap::new();
            for (field, cap) in caps {
                if !fields.contains(&field.as_str()) {
                    return Err(PolicyError::field(
                        at(&format!("caller_max.{field}")),
                        format!(
                            "is not an amount of {} callers may set: one of {}",
                            rule.algorithm.name(),
                            fields.join(", ")
                        ),
                    ));
                }
                let cap = cap.as_u64().filter(|c| *c >= 1).ok_or_else(|| {
                    PolicyError::field(
                        at(&format!("caller_max.{field}")),
                        "must be a whole number ≥ 1: the most a caller may set it to",
                    )
                })?;
                out.insert(field.clone(), cap);
            }
            if out.is_empty() {
                return Err(PolicyError::field(
                    at("caller_max"),
                    "names no number: leave it out, or give {\"limit\": <most>}",
                ));
            }
            Some(out)
        }
        Some(_) => {
            return Err(PolicyError::field(
                at("caller_max"),
                "must be an object of parameter: most a caller may set it to",
            ));
        }
    })
}

/// A rule's `sync`: exact (in Redis) unless local, which only some rules can be.
pub(super) fn parse_sync(
    obj: &serde_json::Map<String, Value>,
    rule: &Rule,
    at: &impl Fn(&str) -> String,
) -> Result<crate::domain::rule::SyncMode, PolicyError> {
    Ok(match obj.get("sync") {
        None | Some(Value::Null) => crate::domain::rule::SyncMode::Exact,
        Some(Value::String(s)) if s == "exact" => crate::domain::rule::SyncMode::Exact,
        Some(Value::String(s)) if s == "local" => {
            if !Rule::counts_locally(&rule.algorithm) {
                return Err(PolicyError::field(
                    at("sync"),
                    format!(
                        "a {} rule cannot count locally (only one number of what is left can be spent apart on each instance): use exact",
                        rule.algorithm.name()
                    ),
                ));
            }
            if rule.block_ms.is_some() {
                return Err(PolicyError::field(
                    at("sync"),
                    "a rule with a penalty box (block_ms) counts exactly: the denial that starts one must be seen by every instance at once",
                ));
            }
            crate::domain::rule::SyncMode::Local
        }
        Some(_) => {
            return Err(PolicyError::field(
                at("sync"),
                "must be \"exact\" (in Redis, every check) or \"local\" (on each instance, flushed every flush_ms)",
            ));
        }
    })
}

/// Parses rule number `index` of the array at `path`.
pub(super) fn parse_rule(value: &Value, index: usize, path: &str) -> Result<Rule, PolicyError> {
    let at = |f: &str| format!("{path}[{index}].{f}");
    let obj = value
        .as_object()
        .ok_or_else(|| PolicyError::field(format!("{path}[{index}]"), "must be an object"))?;
    let name = required_str(obj, "name", &at)?;
    let (algorithm, params) = parse_algorithm(obj, &at)?;
    let mut allowed = vec![
        "name",
        "algorithm",
        "dimensions",
        "count_denied",
        "cost",
        "block_ms",
        "caller_max",
        "sync",
        "flush_ms",
    ];
    allowed.extend_from_slice(&params);
    reject_unknown(obj, &format!("{path}[{index}]."), &allowed)?;
    let dimensions = parse_dimensions(obj, &at)?;
    let count_denied = match obj.get("count_denied") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(PolicyError::field(
                at("count_denied"),
                "must be true or false",
            ));
        }
    };
    let mut rule = Rule::new(index, name, algorithm, dimensions, count_denied).map_err(|e| {
        // Rule::new names fields as rules[i].x; keep the caller's path.
        PolicyError {
            field: e.field.replacen("rules", path, 1),
            message: e.message,
        }
    })?;
    rule.cost = match obj.get("cost") {
        None | Some(Value::Null) => None,
        Some(v) => Some(crate::domain::rule::CostModel::parse(v, &at("cost"))?),
    };
    rule.caller_max = parse_caller_max(obj, &rule, &at)?;
    rule.block_ms = match obj.get("block_ms") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(ms @ 1..=crate::domain::rule::MAX_BLOCK_MS) => Some(ms),
            _ => {
                return Err(PolicyError::field(
                    at("block_ms"),
                    format!(
                        "must be a whole number of ms from 1 to {} (400 days), or left out for no penalty",
                        crate::domain::rule::MAX_BLOCK_MS
                    ),
                ));
            }
        },
    };
    rule.sync = parse_sync(obj, &rule, &at)?;
    rule.flush_ms = parse_flush(obj, &rule, &at)?;
    Ok(rule)
}

/// The string a rule's `field` must hold; `at` names the rule's fields.
pub(super) fn required_str<'a>(
    obj: &'a Map<String, Value>,
    field: &str,
    at: &impl Fn(&str) -> String,
) -> Result<&'a str, PolicyError> {
    obj.get(field)
        .ok_or_else(|| PolicyError::field(at(field), "is required"))?
        .as_str()
        .ok_or_else(|| PolicyError::field(at(field), "must be a string"))
}

/// A rule's algorithm with its parameters, and the names of the fields they were read from.
pub(super) fn parse_algorithm(
    obj: &Map<String, Value>,
    at: &impl Fn(&str) -> String,
) -> Result<(Algorithm, Vec<&'static str>), PolicyError> {
    let algorithm_name = required_str(obj, "algorithm", at)?;
    let int = |field: &str| -> Result<u64, PolicyError> {
        match obj.get(field) {
            None => Err(PolicyError::field(
                at(field),
                format!("is required for {algorithm_name}"),
            )),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| PolicyError::field(at(field), "must be a whole number ≥ 0")),
        }
    };
    let kind = AlgorithmKind::named(algorithm_name).ok_or_else(|| {
        let names: Vec<&str> = ALGORITHMS.iter().map(|k| k.name).collect();
        PolicyError::field(
            at("algorithm"),
            format!(
                "unknown algorithm {algorithm_name:?}; one of {}",
                names.join(", ")
            ),
        )
    })?;
    let values = kind
        .params
        .iter()
        .map(|p| int(p.field))
        .collect::<Result<Vec<u64>, PolicyError>>()?;
    let mut algorithm = kind.with(&values).expect("one value per parameter");
    let mut params: Vec<&'static str> = kind.params.iter().map(|p| p.field).collect();
    params.extend_from_slice(parse_calendar(obj, at, &mut algorithm)?);
    Ok((algorithm, params))
}

/// Reads a quota's calendar (`period`, `time_zone`, `start_day`, `start_month`) into
/// `algorithm`. Returns the names of the fields it reads: none for other algorithms.
pub(super) fn parse_calendar(
    obj: &Map<String, Value>,
    at: &impl Fn(&str) -> String,
    algorithm: &mut Algorithm,
) -> Result<&'static [&'static str], PolicyError> {
    let Algorithm::Quota {
        period,
        time_zone,
        start_day,
        start_month,
        ..
    } = algorithm
    else {
        return Ok(&[]);
    };
    let raw = obj
        .get("period")
        .ok_or_else(|| PolicyError::field(at("period"), "is required for quota"))?;
    *period = raw
        .as_str()
        .and_then(Period::parse)
        .ok_or_else(|| PolicyError::field(at("period"), "must be one of day, week, month, year"))?;
    if let Some(raw) = obj.get("time_zone").filter(|v| !v.is_null()) {
        let name = raw
            .as_str()
            .ok_or_else(|| PolicyError::field(at("time_zone"), "must be a string"))?;
        *time_zone = ZoneName::new(name).map_err(|m| PolicyError::field(at("time_zone"), m))?;
    }
    let small = |field: &str| -> Result<u8, PolicyError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=255).contains(n))
                .map(|n| n as u8)
                .ok_or_else(|| PolicyError::field(at(field), "must be a whole number from 1")),
        }
    };
    *start_day = small("start_day")?;
    *start_month = small("start_month")?;
    Ok(&["period", "time_zone", "start_day", "start_month"])
}

/// A rule's `dimensions`: `None` when not given (every dimension of the check).
pub(super) fn parse_dimensions(
    obj: &Map<String, Value>,
    at: &impl Fn(&str) -> String,
) -> Result<Option<Vec<String>>, PolicyError> {
    match obj.get("dimensions") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(
            items
                .iter()
                .enumerate()
                .map(|(j, d)| {
                    d.as_str().map(str::to_owned).ok_or_else(|| {
                        PolicyError::field(format!("{}[{j}]", at("dimensions")), "must be a string")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        )),
        Some(_) => Err(PolicyError::field(
            at("dimensions"),
            "must be an array of dimension names",
        )),
    }
}

pub(super) fn reject_unknown(
    obj: &Map<String, Value>,
    prefix: &str,
    known: &[&str],
) -> Result<(), PolicyError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(PolicyError::field(
            format!("{prefix}{k}"),
            format!(
                "is not a known field (expected one of {})",
                known.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

pub(super) fn enum_field<T: Copy + Default>(
    obj: &Map<String, Value>,
    field: &str,
    options: &[(&str, T)],
) -> Result<T, PolicyError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(Value::String(s)) => options
            .iter()
            .find(|(n, _)| n == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                PolicyError::field(
                    field,
                    format!("must be one of {}, got {s:?}", names.join(", ")),
                )
            }),
        Some(_) => Err(PolicyError::field(field, "must be a string")),
    }
}

/// A document's `description`: empty when not given.
pub(super) fn parse_description(obj: &Map<String, Value>) -> Result<String, PolicyError> {
    match obj.get("description") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) if s.len() <= MAX_DESCRIPTION => Ok(s.clone()),
        Some(Value::String(_)) => Err(PolicyError::field(
            "description",
            format!("at most {MAX_DESCRIPTION} bytes"),
        )),
        Some(_) => Err(PolicyError::field("description", "must be a string")),
    }
}

/// A document's `envoy` domain, for a policy made from an Envoy domain's file.
pub(super) fn parse_envoy(
    obj: &Map<String, Value>,
) -> Result<Option<crate::domain::envoy::EnvoyDomain>, PolicyError> {
    match obj.get("envoy") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(
            crate::domain::envoy::EnvoyDomain::from_value(v)
                .map_err(|e| PolicyError::field(format!("envoy.{}", e.field), e.message))?,
        )),
    }
}

/// A document's `overrides`: none when not given.
pub(super) fn parse_overrides(obj: &Map<String, Value>) -> Result<Vec<Override>, PolicyError> {
    match obj.get("overrides") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| Override::from_document(v, &format!("overrides[{i}]")))
            .collect(),
        Some(_) => Err(PolicyError::field("overrides", "must be an array")),
    }
}

/// A local rule's `flush_ms`: only with `"sync": "local"`, within the bounds.
fn parse_flush(
    obj: &Map<String, Value>,
    rule: &Rule,
    at: &impl Fn(&str) -> String,
) -> Result<Option<u64>, PolicyError> {
    use crate::domain::rule::{MAX_FLUSH_MS, MIN_FLUSH_MS};
    Ok(match obj.get("flush_ms") {
        None | Some(Value::Null) => None,
        Some(_) if rule.sync.is_exact() => {
            return Err(PolicyError::field(
                at("flush_ms"),
                "only a local rule flushes: add \"sync\": \"local\", or leave flush_ms out",
            ));
        }
        Some(v) => match v.as_u64() {
            Some(ms @ MIN_FLUSH_MS..=MAX_FLUSH_MS) => Some(ms),
            _ => {
                return Err(PolicyError::field(
                    at("flush_ms"),
                    format!(
                        "must be a whole number of ms from {} to {}",
                        MIN_FLUSH_MS, MAX_FLUSH_MS
                    ),
                ));
            }
        },
    })
}
