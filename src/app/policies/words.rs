//! The editor's words: each field's label and a rule in plain words, from its fields as
//! typed.

use super::{RuleForm, UNITS};

/// A field the save named, as the form labels it: `rules[2].refill_period_ms` is
/// "Rule 3 (per-second) › Period".
pub(super) fn field_label(field: &str, rules: &[RuleForm]) -> String {
    let Some(rest) = field.strip_prefix("rules[") else {
        return match field {
            "" => String::new(),
            "description" => "Description".into(),
            "version" => "Version".into(),
            "name" => "Name".into(),
            "rules" => "Rules".into(),
            "on_deny" => "Wait instead of refusing".into(),
            "max_wait_ms" => "Hold a denied request at most".into(),
            other => other.to_owned(),
        };
    };
    let Some((n, tail)) = rest.split_once(']') else {
        return field.to_owned();
    };
    let i: usize = n.parse().unwrap_or(0);
    let rule = match rules
        .get(i)
        .map(|r| r.name.trim())
        .filter(|n| !n.is_empty())
    {
        Some(name) => format!("Rule {} ({name})", i + 1),
        None => format!("Rule {}", i + 1),
    };
    let input = match tail.trim_start_matches('.') {
        "name" => "Name",
        "algorithm" => "Algorithm",
        "limit" => "Limit",
        "window_ms" => "Window",
        "bucket_ms" => "Bucket",
        "capacity" => "Capacity",
        "refill_tokens" | "leak_tokens" => "Tokens per period",
        "refill_period_ms" | "leak_period_ms" | "period_ms" => "Period",
        "rate" => "Rate",
        "burst" => "Burst",
        "lease_ms" => "Lease",
        "period" => "Quota period",
        "time_zone" => "Time zone",
        "start_day" => "Starts on day",
        "start_month" => "Starts in month",
        "dimensions" => "Dimensions",
        "cost" => "Counts a check as",
        "block_ms" => "Once it denies, block for",
        tail if tail.starts_with("caller_max") => "Callers may set, at most",
        "sync" => "Counted",
        "flush_ms" => "Flush every (ms)",
        "" => return rule,
        other => other,
    };
    format!("{rule} › {input}")
}

/// A rule in plain words ("100 requests per 1 minute, for each ip and user"), from its
/// fields as typed.
pub(super) fn rule_summary(r: &RuleForm) -> String {
    if r.limit.trim().is_empty() && r.name.trim().is_empty() {
        return "Fill in a name and a limit to add this rule; leave it blank to add none.".into();
    }
    let unit = |u: &str| {
        UNITS
            .iter()
            .find(|x| x.0 == u)
            .map_or("ms", |x| x.1)
            .to_owned()
    };
    let per = |n: &str, u: &str| format!("{} {}", n.trim(), unit(u));
    let who = if r.dimensions.trim().is_empty() {
        "each identifier of a check".to_owned()
    } else {
        format!("each {}", r.dimensions.trim())
    };
    let what = rule_amounts(r, &per);
    let removed = if r.remove == "on" {
        " (removed when saved)"
    } else {
        ""
    };
    let (penalty, callers, local) = rule_extras(r, &per);
    format!("{what}, for {who}{penalty}{callers}{local}{removed}.")
}

/// What a rule lets through, in words, from its amounts as typed.
pub(super) fn rule_amounts(r: &RuleForm, per: &impl Fn(&str, &str) -> String) -> String {
    match r.algorithm.as_str() {
        "fixed_window" | "sliding_window" | "sliding_log" => {
            format!(
                "{} requests per {}",
                r.limit.trim(),
                per(&r.window_ms, &r.window_unit)
            )
        }
        "bucketed_window" => format!(
            "{} requests per {}, counted in buckets of {}",
            r.limit.trim(),
            per(&r.window_ms, &r.window_unit),
            per(&r.bucket_ms, &r.bucket_unit)
        ),
        "token_bucket" => format!(
            "bursts of up to {}, refilled by {} every {}",
            r.capacity.trim(),
            r.tokens.trim(),
            per(&r.period_ms, &r.period_unit)
        ),
        "leaky_bucket" => format!(
            "up to {} queued, {} leaving every {}",
            r.capacity.trim(),
            r.tokens.trim(),
            per(&r.period_ms, &r.period_unit)
        ),
        "gcra" => format!(
            "{} requests per {}, bursts of {}",
            r.rate.trim(),
            per(&r.period_ms, &r.period_unit),
            r.burst.trim()
        ),
        "concurrency" => format!("{} at a time", r.limit.trim()),
        "quota" => format!("{} per {}", r.limit.trim(), r.period.trim()),
        other => other.to_owned(),
    }
}

/// A rule's penalty, caller-set numbers and local counting, each a clause or empty.
pub(super) fn rule_extras(
    r: &RuleForm,
    per: &impl Fn(&str, &str) -> String,
) -> (String, String, String) {
    let penalty = if r.block_ms.trim().is_empty() {
        String::new()
    } else {
        format!(
            "; once it denies, the identifier is blocked for {}",
            per(&r.block_ms, &r.block_unit)
        )
    };
    let callers = if r.caller_max.trim().is_empty() {
        String::new()
    } else {
        format!(
            "; a check may set its own numbers, at most {}",
            r.caller_max.trim()
        )
    };
    let local = if r.sync == "local" {
        let every = match r.flush_ms.trim() {
            "" => crate::domain::rule::DEFAULT_FLUSH_MS.to_string(),
            ms => ms.to_owned(),
        };
        format!(
            "; counted on each instance and flushed to Redis every {every} ms (approximate: instances together may pass the limit by about what each admits between its flushes)"
        )
    } else {
        String::new()
    };
    (penalty, callers, local)
}

/// How an Envoy domain's counting reads on its page.
pub(super) fn counting_label(counts: &str) -> &'static str {
    match counts {
        "all_or_nothing" => "a request over any limit counts nowhere",
        _ => "every hit counts, past the limit too",
    }
}
