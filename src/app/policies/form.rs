//! The editor's fields and the policy document they describe, both ways: through the
//! table of algorithms, so every algorithm's parameters have their inputs.

use super::RuleForm;
use crate::domain::rule::AlgorithmKind;

impl RuleForm {
    /// The editor's input named `input` (see `domain::rule::ALGORITHMS`).
    fn input(&self, input: &str) -> &str {
        match input {
            "limit" => &self.limit,
            "window_ms" => &self.window_ms,
            "bucket_ms" => &self.bucket_ms,
            "capacity" => &self.capacity,
            "tokens" => &self.tokens,
            "period_ms" => &self.period_ms,
            "rate" => &self.rate,
            "burst" => &self.burst,
            "lease_ms" => &self.lease_ms,
            _ => "",
        }
    }

    /// The unit field of a duration input (`window_ms` → `window_unit`).
    fn unit(&self, input: &str) -> Option<&str> {
        match input {
            "window_ms" => Some(&self.window_unit),
            "bucket_ms" => Some(&self.bucket_unit),
            "period_ms" => Some(&self.period_unit),
            "lease_ms" => Some(&self.lease_unit),
            _ => None,
        }
    }

    fn unit_mut(&mut self, input: &str) -> Option<&mut String> {
        match input {
            "window_ms" => Some(&mut self.window_unit),
            "bucket_ms" => Some(&mut self.bucket_unit),
            "period_ms" => Some(&mut self.period_unit),
            "lease_ms" => Some(&mut self.lease_unit),
            _ => None,
        }
    }

    /// Whether the form's rule counts: not marked for removal, and something typed.
    pub fn kept(&self) -> bool {
        self.remove != "on" && (!self.name.trim().is_empty() || !self.limit.trim().is_empty())
    }

    fn input_mut(&mut self, input: &str) -> &mut String {
        match input {
            "limit" => &mut self.limit,
            "window_ms" => &mut self.window_ms,
            "bucket_ms" => &mut self.bucket_ms,
            "capacity" => &mut self.capacity,
            "tokens" => &mut self.tokens,
            "period_ms" => &mut self.period_ms,
            "rate" => &mut self.rate,
            "burst" => &mut self.burst,
            "lease_ms" => &mut self.lease_ms,
            other => unreachable!("the algorithm table names no input {other:?}"),
        }
    }
}

/// The duration units the editor offers: (name, label, milliseconds).
pub const UNITS: [(&str, &str, u64); 5] = [
    ("ms", "ms", 1),
    ("s", "seconds", 1_000),
    ("min", "minutes", 60_000),
    ("h", "hours", 3_600_000),
    ("d", "days", 86_400_000),
];

/// A duration as typed, `raw` in `unit`, in milliseconds: the number itself when it is not
/// a whole number (the policy's parser names the field), or for an unknown unit.
pub(super) fn in_ms(raw: &str, unit: &str) -> serde_json::Value {
    let raw = raw.trim();
    let factor = UNITS.iter().find(|u| u.0 == unit).map_or(1, |u| u.2);
    match raw.parse::<u64>() {
        Ok(n) => n.checked_mul(factor).map_or_else(
            || serde_json::Value::String(raw.to_owned()),
            serde_json::Value::from,
        ),
        Err(_) => serde_json::Value::String(raw.to_owned()),
    }
}

/// `limit=1000, window_ms=3600000` as the document's object; what is not such a list goes
/// as typed, for the policy's parser to name.
fn caller_max_of(raw: &str) -> serde_json::Value {
    let mut caps = serde_json::Map::new();
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((field, n)) = pair.split_once('=') else {
            return serde_json::Value::String(raw.trim().to_owned());
        };
        let n = n.trim();
        caps.insert(
            field.trim().to_owned(),
            n.parse::<u64>().map_or_else(
                |_| serde_json::Value::String(n.to_owned()),
                serde_json::Value::from,
            ),
        );
    }
    serde_json::Value::Object(caps)
}

/// `ms` as (a number, the largest unit that holds it whole).
fn with_unit(ms: &str) -> (String, String) {
    match ms.trim().parse::<u64>() {
        Ok(n) if n > 0 => {
            let (unit, _, factor) = UNITS
                .iter()
                .rev()
                .find(|u| n % u.2 == 0)
                .copied()
                .unwrap_or(UNITS[0]);
            ((n / factor).to_string(), unit.to_owned())
        }
        _ => (ms.to_owned(), "ms".to_owned()),
    }
}

/// The index in the form of the rule the document's rule `index` came from (the document
/// leaves out blank and removed rules).
pub fn form_index(rules: &[RuleForm], index: usize) -> usize {
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.kept())
        .nth(index)
        .map_or(index, |(i, _)| i)
}

/// A field the policy's parser named (`rules[0].limit`, counting the document's rules) as
/// the form's field (`rules[2].limit`, counting its fieldsets).
pub fn field_in_form(field: &str, rules: &[RuleForm]) -> String {
    // One box holds every optional dimension.
    if field.starts_with("optional") {
        return "optional".to_owned();
    }
    let Some(rest) = field.strip_prefix("rules[") else {
        return field.to_owned();
    };
    match rest.split_once(']') {
        Some((n, tail)) => match n.parse::<usize>() {
            Ok(i) => format!("rules[{}]{tail}", form_index(rules, i)),
            Err(_) => field.to_owned(),
        },
        None => field.to_owned(),
    }
}

/// The rules of the editor's form from its fields as posted (`rules[2][limit]` = `5`), in
/// the order of their numbers: what the burst preview reads while a person types.
pub fn rule_forms_from_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<RuleForm> {
    let mut rules: std::collections::BTreeMap<usize, serde_json::Map<String, serde_json::Value>> =
        Default::default();
    for (key, value) in pairs {
        let Some(rest) = key.strip_prefix("rules[") else {
            continue;
        };
        let Some((index, field)) = rest.split_once("][") else {
            continue;
        };
        let (Ok(index), Some(field)) = (index.parse::<usize>(), field.strip_suffix(']')) else {
            continue;
        };
        rules.entry(index).or_default().insert(
            field.to_owned(),
            serde_json::Value::String(value.to_owned()),
        );
    }
    rules
        .into_values()
        .filter_map(|m| serde_json::from_value(serde_json::Value::Object(m)).ok())
        .collect()
}

/// The policy document the editor's fields describe (errors are found by parsing it).
pub fn document_of(
    description: &str,
    shadow: bool,
    failure_closed: bool,
    rules: &[RuleForm],
) -> serde_json::Value {
    use serde_json::{Value, json};
    let num = |raw: &str| -> Value {
        let raw = raw.trim();
        raw.parse::<u64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.to_owned()))
    };
    let rules: Vec<Value> = rules
        .iter()
        .filter(|r| r.kept())
        .map(|r| {
            let mut doc = json!({ "name": r.name.trim(), "algorithm": r.algorithm });
            if let Some(kind) = AlgorithmKind::named(&r.algorithm) {
                for p in kind.params {
                    doc[p.field] = match r.unit(p.input) {
                        Some(unit) => in_ms(r.input(p.input), unit),
                        None => num(r.input(p.input)),
                    };
                }
            }
            if r.algorithm == "quota" {
                // The calendar fields; empty ones take their defaults (UTC, the 1st).
                doc["period"] = json!(r.period.trim());
                for (field, raw) in [
                    ("time_zone", &r.time_zone),
                    ("start_day", &r.start_day),
                    ("start_month", &r.start_month),
                ] {
                    let raw = raw.trim();
                    if !raw.is_empty() {
                        doc[field] = if field == "time_zone" {
                            json!(raw)
                        } else {
                            num(raw)
                        };
                    }
                }
            }
            let dims: Vec<&str> = r
                .dimensions
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect();
            if !dims.is_empty() {
                doc["dimensions"] = json!(dims);
            }
            if r.count_denied == "on" || r.count_denied == "true" {
                doc["count_denied"] = json!(true);
            }
            if !r.block_ms.trim().is_empty() {
                doc["block_ms"] = in_ms(&r.block_ms, &r.block_unit);
            }
            if !r.caller_max.trim().is_empty() {
                doc["caller_max"] = caller_max_of(&r.caller_max);
            }
            if r.sync == "local" {
                doc["sync"] = json!("local");
            }
            // Sent whatever the counting, for the policy to name when it has no meaning.
            if !r.flush_ms.trim().is_empty() {
                doc["flush_ms"] = num(r.flush_ms.trim());
            }
            // A weight is a number; anything else goes as typed, for the policy to name.
            match r.cost.trim() {
                "" => {}
                weight if weight.bytes().all(|b| b.is_ascii_digit()) => doc["cost"] = num(weight),
                model => doc["cost"] = json!(model),
            }
            doc
        })
        .collect();
    json!({
        "description": description.trim(),
        "mode": if shadow { "shadow" } else { "enforce" },
        "failure_mode": if failure_closed { "closed" } else { "open" },
        "rules": rules,
    })
}

/// The editor's fields for a stored rule document.
pub fn rule_form(rule: &serde_json::Value) -> RuleForm {
    let s = |k: &str| match rule.get(k) {
        Some(serde_json::Value::String(v)) => v.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    let mut form = RuleForm {
        name: s("name"),
        algorithm: s("algorithm"),
        ..RuleForm::default()
    };
    if let Some(kind) = AlgorithmKind::named(&form.algorithm) {
        for p in kind.params {
            let value = s(p.field);
            match form.unit_mut(p.input) {
                Some(unit) => {
                    let (n, u) = with_unit(&value);
                    *unit = u;
                    *form.input_mut(p.input) = n;
                }
                None => *form.input_mut(p.input) = value,
            }
        }
    }
    if form.algorithm == "quota" {
        form.period = s("period");
        form.time_zone = s("time_zone");
        form.start_day = s("start_day");
        form.start_month = s("start_month");
    }
    let (block_ms, block_unit) = match s("block_ms") {
        none if none.is_empty() => (String::new(), String::new()),
        ms => with_unit(&ms),
    };
    RuleForm {
        block_ms,
        block_unit,
        sync: s("sync"),
        flush_ms: s("flush_ms"),
        caller_max: rule
            .get("caller_max")
            .and_then(|c| c.as_object())
            .map(|caps| {
                caps.iter()
                    .map(|(field, n)| format!("{field}={n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default(),
        dimensions: rule
            .get("dimensions")
            .and_then(|d| d.as_array())
            .map(|d| {
                d.iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default(),
        count_denied: if rule.get("count_denied") == Some(&serde_json::Value::Bool(true)) {
            "on".into()
        } else {
            String::new()
        },
        cost: s("cost"),
        ..form
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{
        Algorithm, Policy,
        calendar::{Period, ZoneName},
        rule::CostModel,
    };

    /// The editor's fields of a concurrency rule and of an anniversary quota make a document
    /// that parses to those rules, and read back into the same fields; empty calendar fields
    /// take their defaults.
    #[test]
    fn concurrency_and_quota_fields_round_trip() {
        let lease = RuleForm {
            name: "running".into(),
            algorithm: "concurrency".into(),
            limit: "10".into(),
            lease_ms: "30".into(),
            lease_unit: "s".into(),
            ..RuleForm::default()
        };
        let quota = RuleForm {
            name: "monthly".into(),
            algorithm: "quota".into(),
            limit: "10000".into(),
            period: "month".into(),
            time_zone: "America/New_York".into(),
            start_day: "15".into(),
            cost: "request".into(),
            ..RuleForm::default()
        };
        let daily = RuleForm {
            name: "daily".into(),
            algorithm: "quota".into(),
            limit: "5".into(),
            period: "day".into(),
            cost: "3".into(),
            ..RuleForm::default()
        };
        let forms = [lease, quota, daily];
        let doc = document_of("", false, false, &forms);
        let policy = Policy::from_document("jobs", &doc).unwrap();
        assert_eq!(
            policy.rules.iter().map(|r| r.algorithm).collect::<Vec<_>>(),
            [
                Algorithm::Concurrency {
                    limit: 10,
                    lease_ms: 30_000
                },
                Algorithm::Quota {
                    limit: 10_000,
                    period: Period::Month,
                    time_zone: ZoneName::new("America/New_York").unwrap(),
                    start_day: 15,
                    start_month: 0,
                },
                Algorithm::Quota {
                    limit: 5,
                    period: Period::Day,
                    time_zone: ZoneName::UTC,
                    start_day: 0,
                    start_month: 0,
                },
            ]
        );
        assert_eq!(
            policy
                .rules
                .iter()
                .map(|r| r.cost_model())
                .collect::<Vec<_>>(),
            [CostModel::Request, CostModel::Request, CostModel::Weight(3)],
            "a rule's cost survives the editor (concurrency counts requests by default)"
        );
        for (form, rule) in forms.iter().zip(doc["rules"].as_array().unwrap()) {
            assert_eq!(&rule_form(rule), form);
        }
        // A duration typed in ms reads back in the largest unit that holds it whole.
        let typed = RuleForm {
            name: "per-minute".into(),
            algorithm: "fixed_window".into(),
            limit: "100".into(),
            window_ms: "60000".into(),
            ..RuleForm::default()
        };
        let doc = document_of("", false, false, std::slice::from_ref(&typed));
        assert_eq!(doc["rules"][0]["window_ms"], 60_000);
        let back = rule_form(&doc["rules"][0]);
        assert_eq!(
            (back.window_ms.as_str(), back.window_unit.as_str()),
            ("1", "min")
        );
        // A penalty box in its unit, and back; none when left empty.
        let boxed = RuleForm {
            block_ms: "10".into(),
            block_unit: "min".into(),
            ..typed.clone()
        };
        let doc = document_of("", false, false, std::slice::from_ref(&boxed));
        assert_eq!(doc["rules"][0]["block_ms"], 600_000);
        let policy = Policy::from_document("boxed", &doc).unwrap();
        assert_eq!(policy.rules[0].block_ms, Some(600_000));
        let back = rule_form(&policy.document()["rules"][0]);
        assert_eq!(
            (back.block_ms.as_str(), back.block_unit.as_str()),
            ("10", "min")
        );
        // What callers may set, as typed and back.
        let plan = RuleForm {
            caller_max: "limit=1000".into(),
            ..typed.clone()
        };
        let doc = document_of("", false, false, std::slice::from_ref(&plan));
        let policy = Policy::from_document("plans", &doc).unwrap();
        assert_eq!(
            policy.rules[0].caller_max,
            Some([("limit".to_owned(), 1000)].into())
        );
        assert_eq!(
            rule_form(&policy.document()["rules"][0]).caller_max,
            "limit=1000"
        );
        assert!(
            document_of("", false, false, std::slice::from_ref(&typed))["rules"][0]
                .get("block_ms")
                .is_none()
        );
        // Counted locally, flushed every 250 ms, and back; exact when left as it is.
        let hot = RuleForm {
            sync: "local".into(),
            flush_ms: "250".into(),
            ..typed.clone()
        };
        let doc = document_of("", false, false, std::slice::from_ref(&hot));
        let policy = Policy::from_document("hot", &doc).unwrap();
        assert_eq!(policy.rules[0].local_flush_ms(), Some(250));
        let back = rule_form(&policy.document()["rules"][0]);
        assert_eq!(
            (back.sync.as_str(), back.flush_ms.as_str()),
            ("local", "250")
        );
        let exact = RuleForm {
            sync: "exact".into(),
            ..typed.clone()
        };
        let doc = document_of("", false, false, std::slice::from_ref(&exact));
        assert!(doc["rules"][0].get("sync").is_none());
        assert_eq!(
            Policy::from_document("exact", &doc).unwrap().rules[0].local_flush_ms(),
            None
        );
        // Blank and removed rules are left out; an error's index maps back to the form's.
        let removed = RuleForm {
            remove: "on".into(),
            ..typed.clone()
        };
        let with_gaps = [RuleForm::default(), removed, typed];
        assert_eq!(
            document_of("", false, false, &with_gaps)["rules"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(form_index(&with_gaps, 0), 2);
        assert_eq!(
            field_in_form("rules[0].limit", &with_gaps),
            "rules[2].limit"
        );
        // The fields as a form posts them read back as its rules, in their numbers' order.
        let read = rule_forms_from_pairs([
            ("rules[1][name]", "b"),
            ("rules[0][name]", "a"),
            ("rules[0][limit]", "5"),
            ("rules[0][window_unit]", "s"),
            ("csrf", "x"),
        ]);
        assert_eq!(read.len(), 2);
        assert_eq!(
            (
                read[0].name.as_str(),
                read[0].limit.as_str(),
                read[0].window_unit.as_str()
            ),
            ("a", "5", "s")
        );
        assert_eq!(read[1].name, "b");
        // A zone the server does not know is named.
        let bad = RuleForm {
            time_zone: "Mars/Olympus".into(),
            ..forms[1].clone()
        };
        let err =
            Policy::from_document("jobs", &document_of("", false, false, &[bad])).unwrap_err();
        assert_eq!(err.field, "rules[0].time_zone");
    }
}
