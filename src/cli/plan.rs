//! Policies as code with a plan: `spillway policy plan FILE` says what a file would change
//! against what is stored and what its rules would have done to the recorded checks;
//! `spillway policy test FILE CASES` checks expected decisions for sequences of checks with
//! the reference model, offline, so limits can be unit-tested in a repository.

use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::Value;

use crate::domain::whatif::{Model, Verdict, WhatIf};
use crate::domain::{Identifier, Policy};
use crate::service::Service;

/// Reads `1h`, `30m`, `90s` or a number of ms as ms.
pub fn look_back_ms(raw: &str) -> Result<i64, String> {
    let raw = raw.trim();
    let (digits, unit) = match raw.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => raw.split_at(i),
        None => (raw, "ms"),
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("--last: expected 1h, 30m, 90s or ms, got {raw:?}"))?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("--last: expected 1h, 30m, 90s or ms, got {raw:?}")),
    };
    Ok(n.saturating_mul(unit_ms))
}

/// What each policy of `text` (as `policy import` takes it) would change: its document
/// against the stored one, and a replay of its rules over the last `look_back_ms` of
/// recorded checks. The report, and whether any check would newly be denied.
pub async fn plan(
    service: &Service,
    text: &str,
    look_back_ms: i64,
) -> anyhow::Result<(String, bool)> {
    let policies = super::parse_document(text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut out = String::new();
    let mut denies = false;
    for mut policy in policies {
        let stored = service.stored_policy(&policy.name).await?;
        // As an import would save it: a file that does not say keeps the stored strictness.
        policy.settle_strict(stored.as_ref());
        let Some(stored) = stored else {
            writeln!(
                out,
                "{}: new policy (nothing recorded to replay)",
                policy.name
            )?;
            continue;
        };
        let changes = changed_fields(&stored.document(), &policy.document());
        if changes.is_empty() {
            writeln!(
                out,
                "{}: unchanged (version {})",
                policy.name, stored.version
            )?;
            continue;
        }
        writeln!(out, "{}: changes version {}", policy.name, stored.version)?;
        for line in changes {
            writeln!(out, "  {line}")?;
        }
        let name = policy.name.clone();
        let answer = service
            .what_if_policy(
                &super::cli_actor(),
                &name,
                crate::service::record::Candidate::Whole(policy),
                look_back_ms,
            )
            .await
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        denies |= answer.newly_denied > 0;
        out.push_str(&replay_words(&answer));
    }
    Ok((out, denies))
}

/// The top-level fields of `after` that differ from `before`, and for rules each rule
/// added, removed or changed, as `field: before → after` lines.
fn changed_fields(before: &Value, after: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (b, a) = (
        before.as_object().unwrap_or(&empty),
        after.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut lines = Vec::new();
    for key in keys {
        let (was, is) = (b.get(key), a.get(key));
        if was == is {
            continue;
        }
        if key == "rules" {
            lines.extend(changed_rules(was, is));
            continue;
        }
        lines.push(format!("{key}: {} → {}", shown(was), shown(is)));
    }
    lines
}

fn changed_rules(before: Option<&Value>, after: Option<&Value>) -> Vec<String> {
    let named = |v: Option<&Value>| -> Vec<(String, Value)> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|r| (r["name"].as_str().unwrap_or("").to_owned(), r.clone()))
            .collect()
    };
    let (was, is) = (named(before), named(after));
    let mut lines = Vec::new();
    for (name, rule) in &was {
        match is.iter().find(|(n, _)| n == name) {
            None => lines.push(format!("rules.{name}: removed ({rule})")),
            Some((_, now)) if now != rule => {
                lines.push(format!("rules.{name}: {rule} → {now}"));
            }
            Some(_) => {}
        }
    }
    for (name, rule) in &is {
        if !was.iter().any(|(n, _)| n == name) {
            lines.push(format!("rules.{name}: added ({rule})"));
        }
    }
    lines
}

fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "(none)".to_owned(), Value::to_string)
}

/// The replay's answer in a few lines.
fn replay_words(answer: &WhatIf) -> String {
    let mut out = format!(
        "  over {} recorded checks: {} newly denied, {} newly allowed ({} denied then, {} now)\n",
        answer.checks, answer.newly_denied, answer.newly_allowed, answer.denied_then, answer.denied
    );
    for who in &answer.newly_throttled {
        let _ = writeln!(
            out,
            "    newly throttled: {} ({} checks)",
            who.identifier, who.checks
        );
    }
    for who in &answer.newly_freed {
        let _ = writeln!(
            out,
            "    newly freed: {} ({} checks)",
            who.identifier, who.checks
        );
    }
    if !answer.not_replayed.is_empty() {
        let _ = writeln!(
            out,
            "    not replayed (concurrency): {}",
            answer.not_replayed.join(", ")
        );
    }
    if !answer.complete {
        out.push_str("    (the replay's budget ran out: this covers part of the record)\n");
    }
    out
}

/// A file of cases for `policy test`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    policy: String,
    checks: Vec<CaseCheck>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseCheck {
    /// When, in ms from the case's start (a UTC midnight); the one before's when left out.
    at_ms: Option<i64>,
    #[serde(default = "one")]
    cost: u64,
    identifiers: std::collections::BTreeMap<String, String>,
    /// `allowed` or `denied`.
    expect: String,
    /// With `expect = "denied"`: the rule that must deny.
    rule: Option<String>,
}

fn one() -> u64 {
    1
}

/// A UTC midnight, where every window and calendar day starts: a case's time 0.
const CASE_START_US: i64 = 1_700_006_400_000_000;

/// Runs every case of `cases_text` (JSON or TOML) against the policies of `policies_text`,
/// offline. The report (a line per case), or the report with the failures.
pub fn test(policies_text: &str, cases_text: &str) -> Result<String, String> {
    let policies = super::parse_document(policies_text).map_err(|e| format!("policies: {e}"))?;
    let cases: Cases = serde_json::from_str(cases_text).or_else(|json| {
        toml::from_str(cases_text)
            .map_err(|toml| format!("cases: neither JSON ({json}) nor TOML ({toml})"))
    })?;
    let mut out = String::new();
    let mut failed = 0;
    for (i, case) in cases.cases.iter().enumerate() {
        match run_case(&policies, case) {
            Ok(()) => {
                let _ = writeln!(out, "ok: {} ({} checks)", case.name, case.checks.len());
            }
            Err(why) => {
                failed += 1;
                let _ = writeln!(out, "FAILED: cases[{i}] {}: {why}", case.name);
            }
        }
    }
    let _ = writeln!(
        out,
        "{} passed, {failed} failed",
        cases.cases.len() - failed
    );
    if failed > 0 { Err(out) } else { Ok(out) }
}

fn run_case(policies: &[Policy], case: &Case) -> Result<(), String> {
    let policy = policies
        .iter()
        .find(|p| p.name.as_str() == case.policy)
        .ok_or_else(|| format!("policy: the file has no policy {:?}", case.policy))?;
    let mut model = Model::new(policy);
    let mut at_ms = 0;
    for (j, check) in case.checks.iter().enumerate() {
        at_ms = check.at_ms.unwrap_or(at_ms);
        let identifiers = check
            .identifiers
            .iter()
            .map(|(d, v)| Identifier::new(d, v))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("checks[{j}].identifiers: {e}"))?;
        let verdict = model.check(CASE_START_US + at_ms * 1000, check.cost, &identifiers);
        let got = match &verdict {
            Verdict::Allowed => "allowed".to_owned(),
            Verdict::Denied { rule, identifier } => format!("denied by {rule} for {identifier}"),
        };
        let expected_rule = check.rule.as_deref();
        let holds = match (check.expect.as_str(), &verdict) {
            ("allowed", Verdict::Allowed) => true,
            ("denied", Verdict::Denied { rule, .. }) => expected_rule.is_none_or(|r| r == rule),
            ("allowed" | "denied", _) => false,
            (other, _) => {
                return Err(format!(
                    "checks[{j}].expect: {other:?} is neither allowed nor denied"
                ));
            }
        };
        if !holds {
            let expected = match expected_rule {
                Some(r) if check.expect == "denied" => format!("denied by {r}"),
                _ => check.expect.clone(),
            };
            return Err(format!(
                "checks[{j}] at {at_ms} ms: expected {expected}, got {got}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICIES: &str = r#"{"policies": {"api": {"rules": [
        {"name": "per-minute", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000}
    ]}}}"#;

    #[test]
    fn cases_pass_and_fail_with_the_check_named() {
        let cases = r#"
            [[cases]]
            name = "two a minute"
            policy = "api"
            checks = [
              { identifiers = { user = "ann" }, expect = "allowed" },
              { identifiers = { user = "ann" }, at_ms = 10, expect = "allowed" },
              { identifiers = { user = "ann" }, at_ms = 20, expect = "denied", rule = "per-minute" },
              { identifiers = { user = "ann" }, at_ms = 60000, expect = "allowed" },
            ]
        "#;
        let report = test(POLICIES, cases).unwrap();
        assert!(report.contains("ok: two a minute (4 checks)"), "{report}");
        let wrong = cases.replace(
            r#"at_ms = 20, expect = "denied""#,
            r#"at_ms = 20, expect = "allowed""#,
        );
        let report = test(POLICIES, &wrong).unwrap_err();
        assert!(
            report.contains(
                "checks[2] at 20 ms: expected allowed, got denied by per-minute for user=ann"
            ),
            "{report}"
        );
        assert!(test(POLICIES, "[[cases]]\nname = 1").is_err());
    }

    #[test]
    fn a_plan_names_each_changed_rule() {
        let before = serde_json::json!({"mode": "enforce", "rules": [{"name": "a", "limit": 1}, {"name": "b", "limit": 2}]});
        let after = serde_json::json!({"mode": "shadow", "rules": [{"name": "a", "limit": 3}, {"name": "c", "limit": 2}]});
        assert_eq!(
            changed_fields(&before, &after),
            vec![
                r#"mode: "enforce" → "shadow""#.to_owned(),
                r#"rules.a: {"limit":1,"name":"a"} → {"limit":3,"name":"a"}"#.to_owned(),
                r#"rules.b: removed ({"limit":2,"name":"b"})"#.to_owned(),
                r#"rules.c: added ({"limit":2,"name":"c"})"#.to_owned(),
            ]
        );
        assert_eq!(look_back_ms("1h"), Ok(3_600_000));
        assert_eq!(look_back_ms("90s"), Ok(90_000));
        assert_eq!(look_back_ms("250"), Ok(250));
        assert!(look_back_ms("1d").is_err());
    }
}
