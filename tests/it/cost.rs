//! How rules count a check's cost (issue 38): a token budget and "2 in flight" share one
//! policy (a concurrency rule counts requests), `cost: "request"` and weights, a cost no
//! rule could ever admit is a 422 naming the rule (not a 429 that never ends), and a
//! concurrency denial's Retry-After is a short hint, not the lease length.

use serde_json::{Value, json};

use crate::helpers::{RedisServer, TestApp, spawn_app};

fn result<'a>(body: &'a Value, rule: &str) -> &'a Value {
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == rule)
        .unwrap_or_else(|| panic!("no {rule} in {body}"))
}

async fn check(app: &TestApp, policy: &str, cost: u64) -> (u16, Option<String>, Value) {
    let r = app
        .check(json!({"policy": policy, "identifiers": {"user": "ada"}, "cost": cost}))
        .await;
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, r.json().await.unwrap())
}

#[tokio::test]
async fn a_token_budget_and_two_in_flight_share_one_policy() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "llm",
        json!({"rules": [
            {"name": "tokens", "algorithm": "fixed_window", "limit": 10000, "window_ms": 3600000},
            {"name": "in-flight", "algorithm": "concurrency", "limit": 2, "lease_ms": 30000}
        ]}),
    )
    .await;
    // 1,000 tokens each: the budget counts the tokens, the concurrency rule the request.
    let (status, _, first) = check(&app, "llm", 1000).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(result(&first, "tokens")["remaining"], 9000);
    assert_eq!(result(&first, "in-flight")["remaining"], 1);
    let (status, _, second) = check(&app, "llm", 1000).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(result(&second, "in-flight")["remaining"], 0);
    // The third waits for a slot: told to come back within a second, not in 30 s (a slot
    // frees whenever a holder releases). Its own result keeps the soonest lease end.
    let (status, retry, third) = check(&app, "llm", 1000).await;
    assert_eq!(status, 429, "{third}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(third["retry_after_ms"], 1000, "{third}");
    assert!(
        result(&third, "in-flight")["retry_after_ms"]
            .as_u64()
            .unwrap()
            > 20_000
    );
    // A released slot is taken by the next check.
    let lease = first["results"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|r| r["lease"].as_str())
        .unwrap()
        .to_owned();
    let (status, _) = app
        .post_as_service("/api/v1/leases/release", json!({"lease": lease}))
        .await;
    assert_eq!(status, 200);
    let (status, _, fourth) = check(&app, "llm", 1000).await;
    assert_eq!(status, 200, "{fourth}");
    assert_eq!(result(&fourth, "tokens")["remaining"], 7000);
}

#[tokio::test]
async fn a_cost_no_rule_could_admit_is_a_422_naming_the_rule() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "api",
        json!({"rules": [
            {"name": "per-minute", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000},
            {"name": "burst", "algorithm": "token_bucket", "capacity": 500, "refill_tokens": 1, "refill_period_ms": 1000}
        ]}),
    )
    .await;
    let (status, retry, body) = check(&app, "api", 101).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(retry, None);
    assert_eq!(body["type"], "https://spillway.dev/problems/cost-too-high");
    assert_eq!(body["field"], "cost");
    assert_eq!(
        body["detail"],
        "cost: 101 is more than api › per-minute ever admits at once (100)"
    );
    // Nothing was counted: the most the rule admits still passes.
    let (status, _, body) = check(&app, "api", 100).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(result(&body, "per-minute")["remaining"], 0);
    // In shadow mode it is a denial like any other: 200, saying it would have denied.
    app.put_policy(
        "api",
        json!({"mode": "shadow", "rules": [
            {"name": "per-minute", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000}
        ]}),
    )
    .await;
    let (status, _, body) = check(&app, "api", 101).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["shadow_denied"], true, "{body}");
}

#[tokio::test]
async fn a_rule_counts_requests_or_weighs_the_cost_as_it_says() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "mixed",
        json!({"rules": [
            {"name": "requests", "algorithm": "fixed_window", "limit": 10, "window_ms": 3600000, "cost": "request"},
            {"name": "bytes", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000},
            {"name": "weighted", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000, "cost": 3},
            {"name": "pooled", "algorithm": "concurrency", "limit": 100, "lease_ms": 1000, "cost": "units"}
        ]}),
    )
    .await;
    let (status, _, body) = check(&app, "mixed", 50).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(result(&body, "requests")["remaining"], 9);
    assert_eq!(result(&body, "bytes")["remaining"], 950);
    assert_eq!(result(&body, "weighted")["remaining"], 850);
    assert_eq!(result(&body, "pooled")["remaining"], 50);
    // The policy reads back as it was written.
    let doc: Value = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/mixed", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(doc["rules"][0]["cost"], "request");
    assert!(doc["rules"][1].get("cost").is_none(), "{doc}");
    assert_eq!(doc["rules"][2]["cost"], 3);
    // A report is units: the request rule takes none of it, the weighted one thrice.
    let (status, reported) = app
        .post_as_service(
            "/api/v1/report",
            json!({"policy": "mixed", "identifiers": {"user": "ada"}, "cost": 10}),
        )
        .await;
    assert_eq!(status, 200, "{reported}");
    assert_eq!(result(&reported, "bytes")["remaining"], 940);
    assert_eq!(result(&reported, "weighted")["remaining"], 820);
    assert_eq!(result(&reported, "requests")["remaining"], 9);
    // What is not a cost model is refused, naming the field.
    for bad in [json!("tokens"), json!(0), json!(1.5), json!(-1)] {
        let r = app
            .as_admin(
                reqwest::Method::PUT,
                "/api/v1/policies/mixed",
                Some(&json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000, "cost": bad}]})),
            )
            .await;
        assert_eq!(r.status(), 400, "{bad}");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["field"], "rules[0].cost", "{bad}: {problem}");
    }
}
