//! Limits sent with the request (issue 36, item 2): `"limits": {"<rule>": {"limit": N}}`
//! sets a rule's numbers for one check, within the `caller_max` its policy declares;
//! counters are kept per limit; the headers describe the limit applied; mistakes are
//! refused naming the field.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{RedisServer, TestApp, spawn_app};

/// 10 a minute per customer by default; a caller may say up to 1000.
fn plans() -> Value {
    json!({"strict": false, "rules": [
        {"name": "per-customer", "algorithm": "fixed_window", "limit": 10, "window_ms": 60000,
         "dimensions": ["customer"], "caller_max": {"limit": 1000}},
        {"name": "per-ip", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000,
         "dimensions": ["ip"]}
    ]})
}

async fn check(app: &TestApp, customer: &str, limits: Option<Value>) -> reqwest::Response {
    let mut body = json!({"policy": "plans", "identifiers": {"customer": customer}});
    if let Some(limits) = limits {
        body["limits"] = limits;
    }
    app.check(body).await
}

/// How many of `n` checks pass.
async fn passes(app: &TestApp, customer: &str, limits: Option<Value>, n: usize) -> usize {
    let mut allowed = 0;
    for _ in 0..n {
        if check(app, customer, limits.clone()).await.status() == 200 {
            allowed += 1;
        }
    }
    allowed
}

#[tokio::test]
async fn a_caller_sets_a_rules_numbers_for_its_check_with_counters_of_their_own() {
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("plans", plans()).await;
    let pro = json!({"per-customer": {"limit": 30}});
    let r = check(&app, "acme", Some(pro.clone())).await;
    assert_eq!(r.status(), 200);
    // The headers and the body describe the limit applied, not the rule's own.
    let policy_header = r.headers()["ratelimit-policy"].to_str().unwrap().to_owned();
    assert!(
        policy_header.contains("\"per-customer\";q=30;w=60"),
        "{policy_header}"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["limit"].clone(), body["remaining"].clone()),
        (json!(30), json!(29))
    );
    assert_eq!(passes(&app, "acme", Some(pro.clone()), 35).await, 29);
    // Another caller's numbers for the same customer: a counter of their own.
    assert_eq!(
        passes(&app, "acme", Some(json!({"per-customer": {"limit": 5}})), 8).await,
        5
    );
    // The rule's own numbers: its own counter, untouched by either.
    assert_eq!(passes(&app, "acme", None, 12).await, 10);
    // Numbers equal to the rule's are the rule's own counter.
    assert_eq!(
        passes(
            &app,
            "acme",
            Some(json!({"per-customer": {"limit": 10}})),
            1
        )
        .await,
        0
    );
    // A reset clears the counters under callers' numbers too; its undo puts them back.
    let token = app.reset("customer=acme", "reason=plan%20upgrade").await;
    let five = || Some(json!({"per-customer": {"limit": 5}}));
    assert_eq!(check(&app, "acme", Some(pro.clone())).await.status(), 200);
    assert_eq!(check(&app, "acme", five()).await.status(), 200);
    app.undo_reset(&token).await;
    assert_eq!(check(&app, "acme", five()).await.status(), 429);
}

#[tokio::test]
async fn limits_a_policy_does_not_allow_are_refused_naming_the_field() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("plans", plans()).await;
    for (limits, field, says) in [
        (
            json!({"per-customer": {"limit": 1001}}),
            "limits.per-customer.limit",
            "from 1 to 1000",
        ),
        (
            json!({"per-customer": {"limit": 0}}),
            "limits.per-customer.limit",
            "from 1 to 1000",
        ),
        (
            json!({"per-customer": {"burst": 5}}),
            "limits.per-customer.burst",
            "only limit",
        ),
        (
            json!({"per-customer": {"window_ms": 1}}),
            "limits.per-customer.window_ms",
            "only limit",
        ),
        (
            json!({"per-ip": {"limit": 5}}),
            "limits.per-ip",
            "takes no limits from callers",
        ),
        (json!({"nope": {"limit": 5}}), "limits.nope", "no rule"),
        (
            json!({"per-customer": {"limit": "5"}}),
            "limits.per-customer.limit",
            "whole number",
        ),
        (json!({"per-customer": 5}), "limits.per-customer", "object"),
        (json!([1]), "limits", "object"),
    ] {
        let r = check(&app, "acme", Some(limits.clone())).await;
        assert_eq!(r.status(), 400, "{limits}");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["field"], field, "{limits}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{limits}: {problem}"
        );
    }
    // The policy's own caller_max is checked when it is saved: amounts only (a shorter
    // window would loosen the rule, and no maximum stops that), never a concurrency rule.
    let concurrency = json!({"strict": false, "rules": [{"name": "running",
        "algorithm": "concurrency", "limit": 2, "lease_ms": 1000, "caller_max": {"limit": 5}}]});
    let mut capacity = plans();
    capacity["rules"][0]["caller_max"] = json!({"capacity": 5});
    let mut window = plans();
    window["rules"][0]["caller_max"] = json!({"window_ms": 3600000});
    let mut zero = plans();
    zero["rules"][0]["caller_max"] = json!({"limit": 0});
    for (bad, field) in [
        (capacity, "rules[0].caller_max.capacity"),
        (window, "rules[0].caller_max.window_ms"),
        (zero, "rules[0].caller_max.limit"),
        (concurrency, "rules[0].caller_max"),
    ] {
        let r = app
            .as_admin(Method::PUT, "/api/v1/policies/plans", Some(&bad))
            .await;
        assert_eq!(r.status(), 400, "{bad}");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["field"], field, "{problem}");
    }
    // Export keeps it.
    let stored: Value = app
        .as_admin(Method::GET, "/api/v1/policies/plans", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stored["rules"][0]["caller_max"], json!({"limit": 1000}));
    // In a batch too, each check with its own.
    let (_, batch) = app
        .post_as_service(
            "/api/v1/check/batch",
            json!({"checks": [
                {"policy": "plans", "identifiers": {"customer": "b"}, "limits": {"per-customer": {"limit": 2}}},
                {"policy": "plans", "identifiers": {"customer": "b"}, "limits": {"per-customer": {"limit": 2000}}}
            ]}),
        )
        .await;
    assert_eq!(batch["results"][0]["status"], 200, "{batch}");
    assert_eq!(batch["results"][0]["body"]["limit"], 2, "{batch}");
    assert_eq!(batch["results"][1]["status"], 400, "{batch}");
    assert_eq!(
        batch["results"][1]["body"]["field"], "checks[1].limits.per-customer.limit",
        "{batch}"
    );
}
