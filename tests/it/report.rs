//! Usage reported after the fact through `POST /api/v1/report`, against a real
//! redis-server: what is added counts even past the limit, what is given back never goes
//! below nothing, and `remaining` moves by exactly the cost.

use serde_json::{Value, json};

use crate::helpers::{RedisServer, TestApp, spawn_app};

async fn report(app: &TestApp, body: Value) -> (u16, Value) {
    app.post_as_service("/api/v1/report", body).await
}

fn remaining(body: &Value, rule: &str) -> u64 {
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == rule)
        .unwrap_or_else(|| panic!("no {rule} in {body}"))["remaining"]
        .as_u64()
        .unwrap()
}

/// An LLM budget of 100,000 tokens a day per user, on a calendar quota and a token bucket:
/// a check reserves an estimate, the answer's real size is reported after, the
/// over-estimate given back; a report past the limit denies the next check.
#[tokio::test]
async fn reports_and_refunds_change_remaining_exactly() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "llm",
        json!({"rules": [
            {"name": "daily", "algorithm": "quota", "limit": 100000, "period": "day", "time_zone": "Europe/Berlin"},
            {"name": "bucket", "algorithm": "token_bucket", "capacity": 100000, "refill_tokens": 1, "refill_period_ms": 86400000},
        ]}),
    )
    .await;
    let user = json!({"user": "ada"});
    // Reserve 4,000 tokens.
    let r = app
        .check(json!({"policy": "llm", "identifiers": user, "cost": 4000}))
        .await;
    assert_eq!(r.status(), 200);
    let checked: Value = r.json().await.unwrap();
    assert_eq!(checked["results"][0]["remaining"], 96_000);
    // The answer used 2,500: give 1,500 back.
    let (status, body) = report(
        &app,
        json!({"policy": "llm", "identifiers": user, "cost": -1500}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(remaining(&body, "daily"), 97_500);
    assert_eq!(remaining(&body, "bucket"), 97_500);
    // Giving back more than was taken stops at nothing used.
    let (_, body) = report(
        &app,
        json!({"policy": "llm", "identifiers": user, "cost": -1_000_000}),
    )
    .await;
    assert_eq!(remaining(&body, "daily"), 100_000);
    assert_eq!(remaining(&body, "bucket"), 100_000);
    // Usage reported past the limit counts: the next check is denied, even a peek says so.
    let (_, body) = report(
        &app,
        json!({"policy": "llm", "identifiers": user, "cost": 99_999}),
    )
    .await;
    assert_eq!(
        (remaining(&body, "daily"), remaining(&body, "bucket")),
        (1, 1)
    );
    let (_, body) = report(
        &app,
        json!({"policy": "llm", "identifiers": user, "cost": 5}),
    )
    .await;
    assert_eq!(
        (remaining(&body, "daily"), remaining(&body, "bucket")),
        (0, 0)
    );
    let r = app
        .check(json!({"policy": "llm", "identifiers": user, "cost": 1}))
        .await;
    assert_eq!(r.status(), 429);
    // Past the limit, what is given back first pays off the overrun of the quota (a
    // counter: 100,004 used) while the bucket cannot go below empty.
    let (_, body) = report(
        &app,
        json!({"policy": "llm", "identifiers": user, "cost": -10}),
    )
    .await;
    assert_eq!(remaining(&body, "daily"), 6, "{body}");
    assert_eq!(remaining(&body, "bucket"), 10, "{body}");
    let r = app
        .check(json!({"policy": "llm", "identifiers": user, "cost": 6}))
        .await;
    assert_eq!(r.status(), 200, "a give-back ends the denial at once");
    // Another user is untouched.
    let (_, body) = report(
        &app,
        json!({"policy": "llm", "identifiers": {"user": "bob"}, "cost": 0}),
    )
    .await;
    assert_eq!(remaining(&body, "daily"), 100_000);

    // Leases are released, not reported: a report leaves a concurrency rule as it is.
    app.put_policy(
        "jobs",
        json!({"rules": [
            {"name": "running", "algorithm": "concurrency", "limit": 3, "lease_ms": 60000},
            {"name": "hourly", "algorithm": "fixed_window", "limit": 10, "window_ms": 3600000},
        ]}),
    )
    .await;
    let r = app
        .check(json!({"policy": "jobs", "identifiers": user}))
        .await;
    assert_eq!(r.status(), 200);
    let (_, body) = report(
        &app,
        json!({"policy": "jobs", "identifiers": user, "cost": 2}),
    )
    .await;
    assert_eq!(
        (remaining(&body, "running"), remaining(&body, "hourly")),
        (2, 7),
        "{body}"
    );
    let (_, body) = report(
        &app,
        json!({"policy": "jobs", "identifiers": user, "cost": -3}),
    )
    .await;
    assert_eq!(
        (remaining(&body, "running"), remaining(&body, "hourly")),
        (2, 10),
        "{body}"
    );
}

/// Bad reports name their field.
#[tokio::test]
async fn bad_reports_name_the_field() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "llm",
        json!({"rules": [{"name": "daily", "algorithm": "quota", "limit": 10, "period": "day"}]}),
    )
    .await;
    for (body, field, status) in [
        (
            json!({"policy": "llm", "identifiers": {"user": "a"}}),
            "cost",
            400,
        ),
        (
            json!({"policy": "llm", "identifiers": {"user": "a"}, "cost": 1.5}),
            "cost",
            400,
        ),
        (
            json!({"policy": "llm", "identifiers": {"user": "a"}, "cost": 1_000_000_001}),
            "cost",
            400,
        ),
        (
            json!({"policy": "llm", "identifiers": {"user": "a"}, "cost": -1_000_000_001}),
            "cost",
            400,
        ),
        (
            json!({"identifiers": {"user": "a"}, "cost": 1}),
            "policy",
            400,
        ),
        (
            json!({"policy": "llm", "identifiers": {}, "cost": 1}),
            "identifiers",
            400,
        ),
        (
            json!({"policy": "llm", "identifiers": {"user": "a"}, "cost": 1, "extra": 1}),
            "extra",
            400,
        ),
        (json!([1]), "body", 400),
    ] {
        let (got, problem) = report(&app, body.clone()).await;
        assert_eq!(got, status, "{body}: {problem}");
        assert_eq!(problem["field"], field, "{body}: {problem}");
    }
    let (status, _) = report(
        &app,
        json!({"policy": "nope", "identifiers": {"user": "a"}, "cost": 1}),
    )
    .await;
    assert_eq!(status, 404);
}
