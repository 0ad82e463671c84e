//! Alert rules and the pure parts of evaluating and delivering them: what a rule says, its
//! validation (each error names its field), when it fires, the webhook's payload, its
//! signature input and the retry schedule.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::Name;

/// The longest a delivery is retried, from its first attempt.
pub const RETRY_FOR_MS: i64 = 3_600_000;

/// What a rule watches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Condition {
    /// `policy` denies more than `per_second` checks a second on average over the last
    /// `for_seconds` seconds (1 to 290: the live counters keep five minutes).
    PolicyDenials {
        policy: String,
        per_second: f64,
        for_seconds: u32,
    },
    /// An identifier is throttled (its checks denied) in each of the last `minutes`
    /// minutes, the current one included (1 to 5); by `policy`, or by any policy.
    IdentifierThrottled {
        #[serde(default)]
        policy: Option<String>,
        minutes: u32,
    },
    /// Checks have failed on Redis (answered by their failure mode: degraded when open,
    /// 503 when closed) for more than `seconds` (1 to 3600). Each instance watches its own
    /// checks and sends its own alert: while Redis is unreachable the instances share no
    /// place to agree in.
    Degraded { seconds: u32 },
}

/// An alert rule as admins write it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertRule {
    #[serde(default)]
    pub name: String,
    pub condition: Condition,
    /// Where firings and resolutions are POSTed: http or https, no redirects followed.
    pub webhook_url: String,
    /// Signs each delivery (HMAC-SHA256); 16 to 256 characters.
    pub secret: String,
    #[serde(default = "enabled")]
    pub enabled: bool,
}

fn enabled() -> bool {
    true
}

/// A rule's invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub field: String,
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> RuleError {
    RuleError {
        field: field.to_owned(),
        message: message.into(),
    }
}

impl AlertRule {
    /// Checks every field; the error names the first wrong one.
    pub fn validate(&self) -> Result<(), RuleError> {
        Name::parse(&self.name).map_err(|m| bad("name", m))?;
        check_url(&self.webhook_url).map_err(|m| bad("webhook_url", m))?;
        if !(16..=256).contains(&self.secret.chars().count()) {
            return Err(bad("secret", "must be 16 to 256 characters"));
        }
        match &self.condition {
            Condition::PolicyDenials {
                policy,
                per_second,
                for_seconds,
            } => {
                Name::parse(policy).map_err(|m| bad("condition.policy", m))?;
                if !per_second.is_finite() || *per_second < 0.0 || *per_second > 1e9 {
                    return Err(bad("condition.per_second", "must be between 0 and 10^9"));
                }
                if !(1..=290).contains(for_seconds) {
                    return Err(bad("condition.for_seconds", "must be 1 to 290"));
                }
            }
            Condition::IdentifierThrottled { policy, minutes } => {
                if let Some(p) = policy {
                    Name::parse(p).map_err(|m| bad("condition.policy", m))?;
                }
                if !(1..=5).contains(minutes) {
                    return Err(bad("condition.minutes", "must be 1 to 5"));
                }
            }
            Condition::Degraded { seconds } => {
                if !(1..=3600).contains(seconds) {
                    return Err(bad("condition.seconds", "must be 1 to 3600"));
                }
            }
        }
        Ok(())
    }
}

/// An http(s) URL with a host, printable ASCII, at most 2048 bytes.
fn check_url(raw: &str) -> Result<(), String> {
    let rest = raw
        .strip_prefix("https://")
        .or_else(|| raw.strip_prefix("http://"))
        .ok_or("must start with http:// or https://")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.contains('@') {
        return Err("must name a host (and no user or password)".into());
    }
    if raw.len() > 2048 || !raw.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be at most 2048 printable ASCII characters without spaces".into());
    }
    Ok(())
}

/// Whether a policy's denials fire: their average a second over `seconds` (each second's
/// denials, complete seconds only) above `per_second`.
pub fn denials_fire(seconds: &[u64], per_second: f64) -> bool {
    !seconds.is_empty() && seconds.iter().sum::<u64>() as f64 / seconds.len() as f64 > per_second
}

/// The identifiers throttled in every one of `minutes` (each the set of identifiers denied
/// in that minute); `policy` keeps those of one policy. Members are `policy|identifier`.
pub fn throttled_throughout(minutes: &[BTreeSet<String>], policy: Option<&str>) -> Vec<String> {
    let Some((first, rest)) = minutes.split_first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter(|m| policy.is_none_or(|p| m.split_once('|').is_some_and(|(q, _)| q == p)))
        .filter(|m| rest.iter().all(|set| set.contains(*m)))
        .cloned()
        .collect()
}

/// When a delivery that failed `attempts` times is tried next: 1 s, 2 s, 4 s … at most
/// 5 minutes apart; `None` once an hour has passed since the first attempt.
pub fn next_attempt(first_ms: i64, attempts: u32, now_ms: i64) -> Option<i64> {
    let wait = 1000i64.saturating_mul(1 << attempts.min(20)).min(300_000);
    let at = now_ms + wait;
    (at <= first_ms + RETRY_FOR_MS).then_some(at)
}

/// What an HMAC signs: the timestamp (seconds), a dot, the body.
pub fn signed_text(timestamp_s: i64, body: &str) -> String {
    format!("{timestamp_s}.{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> AlertRule {
        AlertRule {
            name: "floods".into(),
            condition: Condition::PolicyDenials {
                policy: "api".into(),
                per_second: 5.0,
                for_seconds: 60,
            },
            webhook_url: "https://hooks.example.com/spillway".into(),
            secret: "0123456789abcdef".into(),
            enabled: true,
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(rule().validate(), Ok(()));
        type Edit = fn(&mut AlertRule);
        let cases: Vec<(Edit, &str)> = vec![
            (|r| r.name = "Bad Name".into(), "name"),
            (|r| r.webhook_url = "ftp://x".into(), "webhook_url"),
            (|r| r.webhook_url = "https://".into(), "webhook_url"),
            (
                |r| r.webhook_url = "https://u:p@host/".into(),
                "webhook_url",
            ),
            (|r| r.webhook_url = "https://host/a b".into(), "webhook_url"),
            (|r| r.secret = "short".into(), "secret"),
            (
                |r| {
                    r.condition = Condition::PolicyDenials {
                        policy: "api".into(),
                        per_second: f64::NAN,
                        for_seconds: 60,
                    }
                },
                "condition.per_second",
            ),
            (
                |r| {
                    r.condition = Condition::PolicyDenials {
                        policy: "api".into(),
                        per_second: 1.0,
                        for_seconds: 291,
                    }
                },
                "condition.for_seconds",
            ),
            (
                |r| {
                    r.condition = Condition::IdentifierThrottled {
                        policy: Some("X".into()),
                        minutes: 2,
                    }
                },
                "condition.policy",
            ),
            (
                |r| {
                    r.condition = Condition::IdentifierThrottled {
                        policy: None,
                        minutes: 6,
                    }
                },
                "condition.minutes",
            ),
        ];
        for (edit, field) in cases {
            let mut r = rule();
            edit(&mut r);
            assert_eq!(r.validate().unwrap_err().field, field, "{r:?}");
        }
    }

    #[test]
    fn firing_rules() {
        assert!(denials_fire(&[6, 6, 6], 5.0));
        assert!(!denials_fire(&[5, 5, 5], 5.0));
        assert!(!denials_fire(&[], 0.0));
        let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let minutes = [
            m(&["api|user=1", "api|user=2", "web|user=1"]),
            m(&["api|user=1", "web|user=1"]),
        ];
        assert_eq!(
            throttled_throughout(&minutes, None),
            vec!["api|user=1", "web|user=1"]
        );
        assert_eq!(
            throttled_throughout(&minutes, Some("web")),
            vec!["web|user=1"]
        );
    }

    #[test]
    fn retries_back_off_and_stop_after_an_hour() {
        assert_eq!(next_attempt(0, 0, 0), Some(1000));
        assert_eq!(next_attempt(0, 3, 10_000), Some(18_000));
        assert_eq!(next_attempt(0, 30, 100_000), Some(400_000));
        assert_eq!(next_attempt(0, 5, RETRY_FOR_MS - 10), None);
    }
}
