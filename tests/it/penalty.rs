//! The penalty box (issue 36, item 1): a rule's `block_ms` holds an identifier denied for
//! that long after the rule denied it, on every instance, until a reset lifts it; an undo
//! puts it back. Refused with the field named when it is out of range; kept by export.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{RedisServer, TestApp, spawn_app};

/// 2 a user per 300 ms window, then a minute in the box.
fn boxed() -> Value {
    json!({"strict": false, "rules": [
        {"name": "per-user", "algorithm": "fixed_window", "limit": 2, "window_ms": 300,
         "dimensions": ["user"], "block_ms": 60000}
    ]})
}

async fn check(app: &TestApp, user: &str) -> (u16, Value) {
    let r = app
        .check(json!({"policy": "boxed", "identifiers": {"user": user}}))
        .await;
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn a_denial_holds_the_identifier_on_every_instance_until_a_reset() {
    let redis = RedisServer::start();
    let (a, b) = (spawn_app(&redis).await, spawn_app(&redis).await);
    a.put_policy("boxed", boxed()).await;
    assert_eq!(check(&a, "bob").await.0, 200);
    assert_eq!(check(&a, "bob").await.0, 200);
    let (status, tripped) = check(&a, "bob").await;
    assert_eq!(status, 429, "{tripped}");
    assert_eq!(tripped["results"][0]["penalty"], true, "{tripped}");
    let retry = tripped["retry_after_ms"].as_u64().unwrap();
    assert!(
        (59_000..=60_000).contains(&retry),
        "the penalty's wait, not the window's: {retry}"
    );
    // The window has turned over, but the other instance still finds bob in the box.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, held) = check(&b, "bob").await;
    assert_eq!(status, 429, "{held}");
    assert_eq!(held["results"][0]["penalty"], true);
    assert_eq!(held["results"][0]["remaining"], 0);
    let retry = held["results"][0]["retry_after_ms"].as_u64().unwrap();
    assert!((50_000..60_000).contains(&retry), "{retry}");
    // Someone else is not held.
    assert_eq!(check(&b, "carol").await.0, 200);

    // The inspector says why, and for how long.
    let r = a
        .as_admin(Method::GET, "/api/v1/identifiers/user/bob", None)
        .await;
    let inspection: Value = r.json().await.unwrap();
    let rule = &inspection["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "boxed")
        .unwrap()["rules"][0];
    assert_eq!(
        (rule["penalty"].clone(), rule["block_ms"].clone()),
        (json!(true), json!(60000)),
        "{rule}"
    );

    // A reset lifts it on every instance; its undo puts it back.
    let token = a
        .reset("user=bob", "policy=boxed&reason=support%20ticket")
        .await;
    assert_eq!(
        check(&b, "bob").await.0,
        200,
        "the reset lifted the penalty"
    );
    a.undo_reset(&token).await;
    let (status, held) = check(&b, "bob").await;
    assert_eq!(
        (status, &held["results"][0]["penalty"]),
        (429, &json!(true)),
        "{held}"
    );
}

#[tokio::test]
async fn a_penalty_out_of_range_is_refused_naming_the_field_and_export_keeps_it() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    for bad in [json!(0), json!(-5), json!("1m"), json!(34_560_000_001_u64)] {
        let mut doc = boxed();
        doc["rules"][0]["block_ms"] = bad.clone();
        let r = app
            .as_admin(Method::PUT, "/api/v1/policies/boxed", Some(&doc))
            .await;
        assert_eq!(r.status(), 400, "{bad}");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["field"], "rules[0].block_ms", "{bad}: {problem}");
    }
    app.put_policy("boxed", boxed()).await;
    let r = app
        .as_admin(Method::GET, "/api/v1/policies/boxed", None)
        .await;
    let stored: Value = r.json().await.unwrap();
    assert_eq!(stored["rules"][0]["block_ms"], 60000, "{stored}");
}

/// A penalty box on a later rule of a check with several entries, through the coalesced
/// call the API uses: its key comes after the check's state keys, where its flag says.
#[tokio::test]
async fn a_penalty_on_a_later_rule_of_a_composite_check_holds() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "two",
        json!({"strict": false, "rules": [
            {"name": "per-ip", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000, "dimensions": ["ip"]},
            {"name": "per-user", "algorithm": "token_bucket", "capacity": 1, "refill_tokens": 1,
             "refill_period_ms": 100, "dimensions": ["user"], "block_ms": 60000}
        ]}),
    )
    .await;
    let check =
        || app.check(json!({"policy": "two", "identifiers": {"ip": "192.0.2.1", "user": "dan"}}));
    // Two checks within the bucket's 100 ms trip it (however slow the machine, one pair
    // of the next few does).
    let (mut tripped, mut allowed) = (Value::Null, 0);
    for _ in 0..20 {
        let answer: Value = check().await.json().await.unwrap();
        if answer["allowed"] == false {
            tripped = answer;
            break;
        }
        allowed += 1;
    }
    assert_eq!(tripped["allowed"], false, "never denied");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held: Value = check().await.json().await.unwrap();
    assert_eq!(
        held["allowed"], false,
        "the bucket refilled, the penalty holds: {held}"
    );
    let per_user = held["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "per-user")
        .unwrap()
        .clone();
    assert_eq!(per_user["penalty"], true, "{held}");
    // The per-ip rule counted the allowed checks only.
    let per_ip = held["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "per-ip")
        .unwrap()
        .clone();
    assert_eq!(per_ip["remaining"], 100 - allowed, "{held}");
}

/// A denial in shadow mode writes no penalty: switched to enforce, the identifier starts
/// with its allowance, not with a day in the box (it was 429 with 24 h left).
#[tokio::test]
async fn shadow_mode_never_writes_a_penalty() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let policy = |mode: &str| {
        json!({"mode": mode, "rules": [
            {"name": "per-user", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000,
             "dimensions": ["user"], "block_ms": 86_400_000}
        ]})
    };
    app.put_policy("boxed", policy("shadow")).await;
    // More than the limit at once: a denial of its own at a cost, which would trip the box.
    let r = app
        .check(json!({"policy": "boxed", "identifiers": {"user": "bob"}, "cost": 3}))
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["shadow_denied"], true, "{body}");
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(
        !keys.iter().any(|k| k.ends_with(":pb")),
        "no penalty key written in shadow mode: {keys:?}"
    );
    app.put_policy("boxed", policy("enforce")).await;
    let (status, body) = check(&app, "bob").await;
    assert_eq!(status, 200, "no penalty from the shadow denial: {body}");
    assert_eq!(body["results"][0]["remaining"], 1, "{body}");
}

/// An override's own rules count apart from the policy's rules, even under the same name:
/// bob's "5 an hour" starts from a full allowance though the policy's `own-limit` rule has
/// counted him to its limit (it admitted 2 of support's 5).
#[tokio::test]
async fn an_overrides_rules_have_a_key_space_of_their_own() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = |limit: u64| {
        json!({"name": "own-limit", "algorithm": "fixed_window", "limit": limit,
               "window_ms": 3_600_000, "dimensions": ["user"]})
    };
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    app.put_policy("boxed", json!({"rules": [rule(2)]})).await;
    for expected in [200, 200, 429] {
        assert_eq!(check(&app, "bob").await.0, expected);
    }
    app.put_policy(
        "boxed",
        json!({"rules": [rule(2)], "overrides": [
            {"match": "user=bob", "action": "limit", "rules": [rule(5)]}]}),
    )
    .await;
    let mut allowed = 0;
    while check(&app, "bob").await.0 == 200 {
        allowed += 1;
        assert!(allowed <= 5, "more than the override's 5");
    }
    assert_eq!(allowed, 5, "the override's counter starts full");
    // The policy's own counter is untouched: carol is counted on it as before.
    assert_eq!(check(&app, "carol").await.0, 200);
}
