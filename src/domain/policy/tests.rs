//! The unit tests of `src/domain/policy.rs`.

use super::*;
use crate::domain::Algorithm;
use serde_json::json;

fn err(doc: Value) -> PolicyError {
    Policy::from_document("api", &doc).unwrap_err()
}

#[test]
fn the_spec_example_parses() {
    let doc = json!({"description": "public API", "mode": "enforce", "failure_mode": "open",
     "rules": [
       {"name": "per-second", "algorithm": "fixed_window", "limit": 10, "window_ms": 1000, "dimensions": ["ip", "user"]},
       {"name": "per-minute", "algorithm": "sliding_window", "limit": 120, "window_ms": 60000},
       {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 5, "refill_period_ms": 1000},
       {"name": "smooth", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 10}]});
    let policy = Policy::from_document("api", &doc).unwrap();
    assert_eq!(policy.rules.len(), 4);
    assert_eq!(
        policy.rules[3].algorithm,
        Algorithm::Gcra {
            rate: 100,
            period_ms: 60000,
            burst: 10
        }
    );
    assert!(policy.rules[0].applies_to("ip") && !policy.rules[0].applies_to("key"));
    assert!(policy.rules[1].applies_to("anything"));
}

#[test]
fn every_message_names_its_field() {
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), "body"),
        (json!({}), "rules"),
        (json!({"rules": []}), "rules"),
        (json!({"rules": [{"algorithm": "gcra"}]}), "rules[0].name"),
        (json!({"rules": [{"name": "a"}]}), "rules[0].algorithm"),
        (
            json!({"rules": [{"name": "a", "algorithm": "magic"}]}),
            "rules[0].algorithm",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "window_ms": 10}]}),
            "rules[0].limit",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": -1, "window_ms": 10}]}),
            "rules[0].limit",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 0, "window_ms": 10}]}),
            "rules[0].limit",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 0}]}),
            "rules[0].window_ms",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1, "capacity": 3}]}),
            "rules[0].capacity",
        ),
        (
            json!({"rules": [{"name": "A", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]}),
            "rules[0].name",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}, {"name": "a", "algorithm": "gcra", "rate": 1, "period_ms": 1, "burst": 0}]}),
            "rules[1].name",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "bucketed_window", "limit": 1, "window_ms": 1000, "bucket_ms": 300}]}),
            "rules[0].bucket_ms",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1, "dimensions": []}]}),
            "rules[0].dimensions",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1, "dimensions": ["IP"]}]}),
            "rules[0].dimensions[0]",
        ),
        (
            json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1, "count_denied": "yes"}]}),
            "rules[0].count_denied",
        ),
        (
            json!({"mode": "loud", "rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]}),
            "mode",
        ),
        (
            json!({"failure_mode": 1, "rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]}),
            "failure_mode",
        ),
        (
            json!({"colour": "red", "rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]}),
            "colour",
        ),
        (
            json!({"description": 5, "rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]}),
            "description",
        ),
    ];
    for (doc, field) in cases {
        assert_eq!(err(doc.clone()).field, field, "{doc}");
    }
}

#[test]
fn bad_policy_names_are_refused() {
    let doc =
        json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]});
    for bad in ["", "API", "a|x", "-a", &"a".repeat(65)] {
        assert_eq!(
            Policy::from_document(bad, &doc).unwrap_err().field,
            "name",
            "{bad:?}"
        );
    }
}

#[test]
fn spillways_own_names_are_reserved() {
    let doc =
        json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}]});
    let reserved = |name: &str| refuse_reserved(&Policy::from_document(name, &doc).unwrap().name);
    let err = reserved("spillway-login").unwrap_err();
    assert_eq!(err.field, "name");
    assert!(err.message.contains("reserved"), "{}", err.message);
    assert!(reserved("spillway").is_ok());
    assert!(reserved("my-spillway-x").is_ok());
}

#[test]
fn overrides_a_version_adds_that_could_never_apply_are_refused_kept_ones_are_not() {
    let with = |overrides: Value| {
        Policy::from_document(
            "api",
            &json!({"rules": [{"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}],
                "overrides": overrides}),
        )
        .unwrap()
    };
    let bob =
        |expiry: Value| json!({"match": "user=bob", "action": "block", "expires_at_ms": expiry});
    let refused =
        |p: &Policy, before: Option<&Policy>| p.refuse_dead_overrides(before).unwrap_err().field;

    // The second of two with the same match never applies while the first lasts.
    let shadowed = with(json!([bob(json!(null)), bob(json!(5))]));
    assert_eq!(refused(&shadowed, None), "overrides[1].match");
    // One that takes over when the first expires does.
    assert!(
        with(json!([bob(json!(5)), bob(json!(null))]))
            .refuse_dead_overrides(None)
            .is_ok()
    );
    // What a stored version already held is saved back as it was: expired, shadowed, all.
    assert!(shadowed.refuse_dead_overrides(Some(&shadowed)).is_ok());
    let mut more = shadowed.clone();
    more.overrides
        .push(with(json!([{"match": "ip=10.0.0.0/33", "action": "block"}])).overrides[0].clone());
    assert_eq!(refused(&more, Some(&shadowed)), "overrides[2].match");
    // An override put ahead of one the version held, which it would shadow, is refused
    // at the one that stops applying; so is a second copy of one it held.
    let held = with(json!([bob(json!(5))]));
    let ahead = with(json!([bob(json!(null)), bob(json!(5))]));
    assert_eq!(refused(&ahead, Some(&held)), "overrides[1].match");
    let twice = with(json!([bob(json!(5)), bob(json!(5))]));
    assert_eq!(refused(&twice, Some(&held)), "overrides[1].match");
    // An expiry in the past is not this check's business (a file applied again keeps it).
    assert!(
        with(json!([bob(json!(1))]))
            .refuse_dead_overrides(None)
            .is_ok()
    );
}
