//! The check use case behind every front door: a denial answered from memory looks exactly
//! like one answered by Redis, rules that count denials always reach Redis, the headers
//! describe the rule that was evaluated, and the admin API says when Redis is down.

use serde_json::{Value, json};

use crate::helpers::{ADMIN_KEY, PATIENCE, RedisServer, eventually, spawn_app};

/// A 3-rule policy checked for 2 identifiers answers with 6 results and lists the 3 rules,
/// whether the denial came from Redis or from the over-limit cache (which it did: no script
/// ran for it).
#[tokio::test]
async fn a_cached_denial_has_the_shape_of_one_from_redis() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "three",
        json!({"rules": [
            {"name": "hourly", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000},
            {"name": "daily", "algorithm": "sliding_window", "limit": 100, "window_ms": 86_400_000},
            {"name": "bucket", "algorithm": "token_bucket", "capacity": 50, "refill_tokens": 1, "refill_period_ms": 60_000}
        ]}),
    )
    .await;
    let check = || {
        app.check(json!({"policy": "three", "identifiers": {"ip": "198.51.100.3", "user": "7"}}))
    };
    for _ in 0..2 {
        assert_eq!(check().await.status(), 200);
    }
    let from_redis = check().await;
    assert_eq!(from_redis.status(), 429);
    let redis_headers = from_redis.headers().clone();
    let redis_body: Value = from_redis.json().await.unwrap();
    let calls = redis.script_calls();
    let from_cache = check().await;
    assert_eq!(from_cache.status(), 429);
    assert_eq!(
        redis.script_calls(),
        calls,
        "the second denial came from the cache"
    );
    let cache_headers = from_cache.headers().clone();
    let cache_body: Value = from_cache.json().await.unwrap();
    let shape = |body: &Value| -> Vec<(String, String, String, bool, bool)> {
        body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["rule"].as_str().unwrap().to_owned(),
                    r["identifier"].as_str().unwrap().to_owned(),
                    r["algorithm"].as_str().unwrap().to_owned(),
                    r["allowed"].as_bool().unwrap(),
                    r["binding"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(shape(&redis_body).len(), 6, "{redis_body}");
    assert_eq!(shape(&cache_body), shape(&redis_body), "{cache_body}");
    for r in cache_body["results"].as_array().unwrap() {
        let same = redis_body["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["rule"] == r["rule"] && x["identifier"] == r["identifier"])
            .unwrap();
        assert_eq!(r["limit"], same["limit"]);
        assert_eq!(r["remaining"], same["remaining"]);
    }
    for key in ["limit", "remaining", "allowed", "policy_version"] {
        assert_eq!(cache_body[key], redis_body[key], "{key}");
    }
    assert_eq!(
        cache_headers["ratelimit-policy"],
        redis_headers["ratelimit-policy"]
    );
    assert!(cache_headers.contains_key("retry-after"));
}

/// An override's rule that counts denials is never answered from the cache: every denied
/// check reaches Redis (and is counted there).
#[tokio::test]
async fn an_override_rule_that_counts_denials_always_reaches_redis() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut doc = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 100, "window_ms": 3_600_000}]});
    doc["overrides"] = json!([{"match": "user=greedy", "action": "limit", "rules": [
        {"name": "r", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000, "count_denied": true}
    ]}]);
    app.put_policy("counted", doc).await;
    let check = || app.check(json!({"policy": "counted", "identifiers": {"user": "greedy"}}));
    for _ in 0..2 {
        assert_eq!(check().await.status(), 200);
    }
    let before = redis.script_calls();
    for _ in 0..5 {
        assert_eq!(check().await.status(), 429);
    }
    assert_eq!(
        redis.script_calls() - before,
        5,
        "every counted denial ran the script"
    );
}

/// `RateLimit-Policy`'s window is the evaluated rule's: an override's rule that shares its
/// name with the policy's advertises its own window.
#[tokio::test]
async fn the_headers_describe_the_rule_that_was_evaluated() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut doc = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 100, "window_ms": 3_600_000}]});
    doc["overrides"] = json!([{"match": "user=fast", "action": "limit", "rules": [
        {"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}
    ]}]);
    app.put_policy("windows", doc).await;
    let header = |user: &'static str| {
        let app = &app;
        async move {
            let r = app
                .check(json!({"policy": "windows", "identifiers": {"user": user}}))
                .await;
            r.headers()["ratelimit-policy"].to_str().unwrap().to_owned()
        }
    };
    assert_eq!(header("slow").await, "\"r\";q=100;w=3600");
    assert_eq!(header("fast").await, "\"r\";q=5;w=1");
}

/// Inspecting an identifier while Redis is down is a 503 with `Retry-After`, as a check is.
#[tokio::test]
async fn inspecting_while_redis_is_down_is_503() {
    let mut redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let inspect = || {
        app.client
            .get(app.url("/api/v1/identifiers/user/42"))
            .bearer_auth(ADMIN_KEY)
            .send()
    };
    assert_eq!(inspect().await.unwrap().status(), 200);
    redis.kill();
    let r = inspect().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

/// A batch's checks share script calls, and checks of one identifier are still decided in
/// the batch's order.
#[tokio::test]
async fn a_batch_shares_calls_and_keeps_its_order() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "batch",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 3, "window_ms": 3_600_000}]}),
    )
    .await;
    let mut checks: Vec<Value> = (0..95)
        .map(|i| json!({"policy": "batch", "identifiers": {"user": format!("u{i}")}}))
        .collect();
    for _ in 0..5 {
        checks.push(json!({"policy": "batch", "identifiers": {"user": "same"}}));
    }
    let before = redis.script_calls();
    let (status, answer) = app
        .post_as_service("/api/v1/check/batch", json!({"checks": checks}))
        .await;
    assert_eq!(status, 200);
    let calls = redis.script_calls() - before;
    assert!(
        calls < 50,
        "{calls} script calls for 100 checks: they did not share calls"
    );
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 100);
    for (i, r) in results.iter().take(95).enumerate() {
        assert_eq!(r["status"], 200, "{i}");
        assert_eq!(r["body"]["results"][0]["identifier"], format!("user=u{i}"));
    }
    let same: Vec<(u64, u64)> = results[95..]
        .iter()
        .map(|r| {
            (
                r["status"].as_u64().unwrap(),
                r["body"]["remaining"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(same, [(200, 2), (200, 1), (200, 0), (429, 0), (429, 0)]);
}

/// Nobody can create a policy under the name Spillway keeps its sign-in limits in.
#[tokio::test]
async fn spillways_own_policy_names_are_refused() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let r = app
        .client
        .put(app.url("/api/v1/policies/spillway-login"))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["field"], "name", "{body}");
}

/// Shutdown is each server's own: draining one leaves another in the same process ready,
/// and stopping one ends its background tasks (and only its: the other still follows
/// policy changes).
#[tokio::test]
async fn each_server_shuts_down_on_its_own_and_stops_its_tasks() {
    use crate::helpers::{app_state, serve};
    let redis = RedisServer::start();
    let (a_state, b_state) = (app_state(&redis, &[]).await, app_state(&redis, &[]).await);
    let (a, b) = (serve(a_state.clone()).await, serve(b_state.clone()).await);
    let ready = |app: &crate::helpers::TestApp| app.client.get(app.url("/readyz")).send();
    assert_eq!(ready(&a).await.unwrap().status(), 200);
    a_state.shutdown.start_draining();
    let draining = ready(&a).await.unwrap();
    assert_eq!(draining.status(), 503);
    assert_eq!(draining.headers()["connection"], "close");
    assert_eq!(ready(&b).await.unwrap().status(), 200);

    a_state.shutdown.stop();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        a_state.shutdown.finished(),
    )
    .await
    .expect("every background task of the stopped server ended");
    // The other server's tasks run on: it learns of a new policy.
    app_put(&a, "later").await;
    eventually(
        "b following policies (knowing the new one)",
        PATIENCE,
        async || b_state.service().known_policy("later").is_some(),
        |known| *known,
    )
    .await;
}

async fn app_put(app: &crate::helpers::TestApp, name: &str) {
    app.put_policy(
        name,
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]}),
    )
    .await;
}

/// The inspector says when a used-up rule lets a request of cost 1 through again (it said
/// "—" for a full sliding window), and nothing for a rule that would let it through now.
#[tokio::test]
async fn the_inspector_says_when_the_next_request_passes() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "window",
        json!({"rules": [{"name": "w", "algorithm": "sliding_window", "limit": 3, "window_ms": 3_600_000}]}),
    )
    .await;
    for _ in 0..3 {
        app.check(json!({"policy": "window", "identifiers": {"user": "busy"}}))
            .await;
    }
    let rule = |user: &'static str| {
        let app = &app;
        async move {
            let body: Value = app
                .client
                .get(app.url(&format!("/api/v1/identifiers/user/{user}")))
                .bearer_auth(ADMIN_KEY)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["policies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["policy"] == "window")
                .unwrap()["rules"][0]
                .clone()
        }
    };
    let busy = rule("busy").await;
    assert_eq!(busy["remaining"], 0, "{busy}");
    let retry = busy["retry_after_ms"]
        .as_u64()
        .expect("a used-up rule says when");
    assert!(retry > 0 && retry <= 7_200_000, "{retry}");
    assert_eq!(rule("idle").await["retry_after_ms"], Value::Null);
    // Looking wrote nothing: the rule is as full as before.
    let again = rule("busy").await;
    assert_eq!(again["remaining"], 0);
    let r = app
        .check(json!({"policy": "window", "identifiers": {"user": "idle"}}))
        .await;
    assert_eq!(r.status(), 200);
}

/// The admin API has the audit log (with the page's filters) and removes an override with a
/// call of its own, audited as the dashboard's removal is.
#[tokio::test]
async fn the_admin_api_reads_the_audit_log_and_removes_overrides() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut doc = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000}]});
    doc["overrides"] = json!([
        {"match": "user=vip", "action": "unlimited"},
        {"match": "user=bad", "action": "block"}
    ]);
    app.put_policy("ov", doc).await;
    let admin = |method: reqwest::Method, path: &str| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(ADMIN_KEY)
    };
    let r = admin(reqwest::Method::DELETE, "/api/v1/policies/ov/overrides/0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["version"], 1, "overrides are written in place");
    assert_eq!(body["overrides"].as_array().unwrap().len(), 1);
    assert_eq!(body["overrides"][0]["match"], "user=bad");
    let vip = app
        .check(json!({"policy": "ov", "identifiers": {"user": "vip"}}))
        .await;
    assert_eq!(vip.status(), 200);
    let vip = app
        .check(json!({"policy": "ov", "identifiers": {"user": "vip"}}))
        .await;
    assert_eq!(vip.status(), 429, "no longer unlimited");
    let r = admin(reqwest::Method::DELETE, "/api/v1/policies/ov/overrides/5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = admin(reqwest::Method::DELETE, "/api/v1/policies/nope/overrides/0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    let audit: Value = admin(reqwest::Method::GET, "/api/v1/audit?action=override.")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{audit}");
    assert_eq!(entries[0]["action"], "override.remove");
    assert_eq!(entries[0]["target"], "ov");
    let all: Value = admin(reqwest::Method::GET, "/api/v1/audit")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(all["entries"].as_array().unwrap().len() >= 2);
    let bad = admin(reqwest::Method::GET, "/api/v1/audit?since=yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let no_key = app
        .client
        .get(app.url("/api/v1/audit"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
}

/// A batch larger than one script call (100 checks of 8 entries: at least 4 calls of at most
/// 256 entries) is still decided in its order on a runtime of several threads, where calls
/// out at once could overtake each other: the checks of four identities, interleaved, each
/// count down without a gap or a swap, round after round. The identities share no key, so
/// calls of different ones are out together; checks of one identity wait for each other.
/// Every other round starts with Redis's scripts flushed, so the first calls find their
/// script missing and are sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_split_over_calls_keeps_its_order_on_several_threads() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = |name: &str| json!({"name": name, "algorithm": "fixed_window", "limit": 20, "window_ms": 3_600_000});
    app.put_policy(
        "wide",
        json!({"rules": [rule("a"), rule("b"), rule("c"), rule("d")]}),
    )
    .await;
    for round in 0..10 {
        let checks: Vec<Value> = (0..100)
            .map(|i| {
                let who = i % 4;
                json!({"policy": "wide", "identifiers": {"user": format!("r{round}u{who}"), "ip": format!("10.0.{round}.{who}")}})
            })
            .collect();
        if round % 2 == 1 {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut redis.connection())
                .unwrap();
        }
        let before = redis.script_calls();
        let (status, answer) = app
            .post_as_service("/api/v1/check/batch", json!({"checks": checks}))
            .await;
        assert_eq!(status, 200);
        assert!(
            redis.script_calls() - before >= 4,
            "the batch took several calls"
        );
        let got: Vec<(u64, u64)> = answer["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["status"].as_u64().unwrap(),
                    r["body"]["remaining"].as_u64().unwrap(),
                )
            })
            .collect();
        // The i-th check is its identity's (i / 4)-th: 20 pass, counting down, then 429.
        let expected: Vec<(u64, u64)> = (0..100)
            .map(|i| {
                let nth = i / 4;
                if nth < 20 { (200, 19 - nth) } else { (429, 0) }
            })
            .collect();
        assert_eq!(got, expected, "round {round}");
    }
}
