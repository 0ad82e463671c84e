//! Property tests on what callers send: no input makes request or policy parsing panic, and
//! no accepted identifier can steer its key out of its own hash tag.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use spillway::{
    domain::{Algorithm, Name, Policy},
    service::CheckRequest,
    store::Keys,
};

/// Strings with the characters that matter for keys and JSON.
fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_-]{0,8}",
        "[{}|%=*/:. \\x00-\\x1f\u{80}-\u{10FFFF}a-z]{0,12}",
        Just("}{".to_owned()),
        Just("a".repeat(300)),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        tricky_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((tricky_string(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Check requests that are mostly well formed (most of them parse), with hostile parts.
fn check_like() -> impl Strategy<Value = Value> {
    let dimension = prop_oneof![9 => "[a-z0-9][a-z0-9_-]{0,8}", 1 => tricky_string()];
    let value = prop_oneof![
        9 => prop_oneof!["[ -~]{1,40}", "[^\\x00-\\x1f\\x7f-\\x9f]{1,40}", Just("x".repeat(256))].prop_map(Value::String),
        1 => json_value(),
    ];
    let cost = prop_oneof![
        9 => (0u64..=1_000_000_000).prop_map(|c| json!(c)),
        1 => json_value(),
    ];
    (
        "[a-z0-9][a-z0-9_-]{0,8}",
        prop::collection::vec((dimension, value), 1..4),
        prop::option::weighted(0.8, cost),
    )
        .prop_map(|(policy, ids, cost)| {
            let mut body =
                json!({"policy": policy, "identifiers": ids.into_iter().collect::<Map<_, _>>()});
            if let Some(cost) = cost {
                body["cost"] = cost;
            }
            body
        })
}

/// Every body parses or is refused naming a field; when it parses, no identifier can steer
/// its key out of its hash tag. Most bodies parse (asserted), so the key checks run.
#[test]
fn check_requests_never_panic_and_keys_stay_in_their_tag() {
    let (parsed, total) = (AtomicU64::new(0), AtomicU64::new(0));
    let config = ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(body in prop_oneof![1 => json_value(), 9 => check_like()])| {
        total.fetch_add(1, Ordering::Relaxed);
        match CheckRequest::parse(&body, "") {
            Ok(request) => {
                parsed.fetch_add(1, Ordering::Relaxed);
                let keys = Keys::default();
                let policy = Name::parse("api").unwrap();
                let rule = Name::parse("r").unwrap();
                prop_assert!(!request.identifiers.is_empty());
                for id in &request.identifiers {
                    let key = keys.rule_state(&policy, id, &rule, &Algorithm::FixedWindow { limit: 1, window_ms: 1 });
                    prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
                    prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
                    prop_assert!(key.find('{') < key.find('}'), "{}", key);
                    prop_assert!(id.value().len() <= 256);
                }
            }
            Err(error) => {
                let problem = error.body();
                prop_assert_eq!(problem["status"].as_u64(), Some(400), "{}", problem);
                prop_assert!(problem["field"].as_str().is_some_and(|f| !f.is_empty()), "{}", problem);
            }
        }
    });
    let (parsed, total) = (parsed.into_inner(), total.into_inner());
    eprintln!("{parsed} of {total} generated check bodies parsed");
    assert!(
        parsed * 2 >= total,
        "only {parsed} of {total} bodies parsed: the key checks barely ran"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn policy_documents_never_panic(doc in json_value(), name in tricky_string()) {
        let _ = Policy::from_document(&name, &doc);
        let _ = Policy::from_document("p", &json!({"rules": [doc.clone()]}));
        let _ = Policy::from_document("p", &json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}], "overrides": [doc]}));
    }
}
