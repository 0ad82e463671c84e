//! Property tests on what callers send: no input makes request or policy parsing panic, and
//! no accepted identifier can steer its key out of its own hash tag.

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

/// Check requests that are mostly well formed, with hostile parts.
fn check_like() -> impl Strategy<Value = Value> {
    (tricky_string(), prop::collection::vec((tricky_string(), json_value()), 0..4), json_value())
        .prop_map(|(policy, ids, cost)| json!({"policy": policy, "identifiers": ids.into_iter().collect::<Map<_, _>>(), "cost": cost}))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn check_requests_never_panic_and_keys_stay_in_their_tag(body in prop_oneof![json_value(), check_like()]) {
        if let Ok(request) = CheckRequest::parse(&body, "") {
            let keys = Keys::default();
            let policy = Name::parse("api").unwrap();
            let rule = Name::parse("r").unwrap();
            for id in &request.identifiers {
                let key = keys.rule_state(&policy, id, &rule, &Algorithm::FixedWindow { limit: 1, window_ms: 1 });
                prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
                prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
                prop_assert!(key.find('{') < key.find('}'), "{}", key);
                prop_assert!(id.value().len() <= 256);
            }
        }
    }

    #[test]
    fn policy_documents_never_panic(doc in json_value(), name in tricky_string()) {
        let _ = Policy::from_document(&name, &doc);
        let _ = Policy::from_document("p", &json!({"rules": [doc.clone()]}));
        let _ = Policy::from_document("p", &json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}], "overrides": [doc]}));
    }
}
