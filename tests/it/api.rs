//! The HTTP API for services and automation, against a real redis-server: every status
//! code, header and error shape of the check API (docs/services.md), the headers of every
//! answer of the check endpoints, their body limit to the byte, and costs a sliding log
//! counts exactly in one element.

use std::time::{Duration, Instant};

use reqwest::{Method, header};
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_KEY, AppProcess, PATIENCE, RedisServer, SERVICE_KEY, TestApp, eventually, spawn_app,
    spawn_app_with,
};

fn one_rule(limit: u64) -> Value {
    json!({"rules": [{"name": "per-minute", "algorithm": "fixed_window", "limit": limit, "window_ms": 3_600_000}]})
}

async fn problem(response: reqwest::Response, status: u16) -> Value {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["type"].as_str().unwrap().starts_with("https://"));
    assert!(body["title"].is_string() && body["detail"].is_string());
    body
}

#[tokio::test]
async fn an_allowed_check_has_the_spec_shape_and_headers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let response = app
        .check(json!({"policy": "demo", "identifiers": {"ip": "203.0.113.7", "user": "42"}}))
        .await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["allowed"], true);
    assert_eq!(body["policy"], "demo");
    assert_eq!(body["policy_version"], 1);
    assert_eq!(body["mode"], "enforce");
    assert_eq!(body["degraded"], false);
    assert_eq!(body["retry_after_ms"], Value::Null);
    let results = body["results"].as_array().unwrap();
    // per-second for ip and user, per-minute and burst for both: 6 results.
    assert_eq!(results.len(), 6, "{body}");
    let binding: Vec<&Value> = results.iter().filter(|r| r["binding"] == true).collect();
    assert_eq!(binding.len(), 1);
    assert_eq!(binding[0]["rule"], "per-second");
    assert_eq!(binding[0]["remaining"], 9);
    assert_eq!(body["limit"], 10);
    assert_eq!(body["remaining"], 9);

    // Both headers parse as RFC 9651 lists.
    let policy: sfv::List = sfv::Parser::new(headers["ratelimit-policy"].to_str().unwrap())
        .parse()
        .unwrap();
    assert_eq!(
        policy.len(),
        3,
        "one member per rule: {:?}",
        headers["ratelimit-policy"]
    );
    assert_eq!(
        headers["ratelimit-policy"],
        r#""per-second";q=10;w=1, "per-minute";q=120;w=60, "burst";q=20;w=4"#
    );
    let state: sfv::List = sfv::Parser::new(headers["ratelimit"].to_str().unwrap())
        .parse()
        .unwrap();
    assert_eq!(state.len(), 1);
    assert_eq!(headers["ratelimit"], r#""per-second";r=9;t=1"#);
    assert!(headers.get("retry-after").is_none());
}

#[tokio::test]
async fn a_denied_check_is_429_with_retry_after_and_consumes_nothing() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("tight", one_rule(3)).await;
    for _ in 0..3 {
        assert_eq!(
            app.check(json!({"policy": "tight", "identifiers": {"user": "1"}}))
                .await
                .status(),
            200
        );
    }
    let denied = app
        .check(json!({"policy": "tight", "identifiers": {"user": "1"}}))
        .await;
    assert_eq!(denied.status(), 429);
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["allowed"], false);
    assert_eq!(body["remaining"], 0);
    assert!(body["retry_after_ms"].as_u64().unwrap() > 0);

    // A cost no rule could ever admit: not a wait (a 429 that never ends) but the
    // caller's mistake, naming the rule.
    let never = app
        .check(json!({"policy": "tight", "identifiers": {"user": "2"}, "cost": 4}))
        .await;
    assert_eq!(never.status(), 422);
    assert!(never.headers().get("retry-after").is_none());
    let body: Value = never.json().await.unwrap();
    assert_eq!(body["field"], "cost", "{body}");
    // ...and it consumed nothing; cost 0 peeks.
    let peek: Value = app
        .check(json!({"policy": "tight", "identifiers": {"user": "2"}, "cost": 0}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(peek["remaining"], 3);
}

#[tokio::test]
async fn shadow_mode_lets_through_and_says_so() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut doc = one_rule(1);
    doc["mode"] = json!("shadow");
    app.put_policy("quiet", doc).await;
    let first: Value = app
        .check(json!({"policy": "quiet", "identifiers": {"user": "1"}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first["shadow_denied"], false);
    let second = app
        .check(json!({"policy": "quiet", "identifiers": {"user": "1"}}))
        .await;
    assert_eq!(second.status(), 200);
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["allowed"], true);
    assert_eq!(body["shadow_denied"], true);
    assert_eq!(body["mode"], "shadow");
}

#[tokio::test]
async fn bad_input_is_400_naming_the_field_never_500() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let long = "x".repeat(257);
    let cases = [
        (json!([]), "body"),
        (json!({"identifiers": {"ip": "1"}}), "policy"),
        (json!({"policy": 5, "identifiers": {"ip": "1"}}), "policy"),
        (json!({"policy": "demo"}), "identifiers"),
        (json!({"policy": "demo", "identifiers": {}}), "identifiers"),
        (
            json!({"policy": "demo", "identifiers": {"ip": ""}}),
            "identifiers.ip",
        ),
        (
            json!({"policy": "demo", "identifiers": {"ip": long}}),
            "identifiers.ip",
        ),
        (
            json!({"policy": "demo", "identifiers": {"IP!": "1"}}),
            "identifiers.IP!",
        ),
        (
            json!({"policy": "demo", "identifiers": {"ip": ["1"]}}),
            "identifiers.ip",
        ),
        (
            json!({"policy": "demo", "identifiers": {"ip": "1"}, "cost": -1}),
            "cost",
        ),
        (
            json!({"policy": "demo", "identifiers": {"ip": "1"}, "cost": 1.5}),
            "cost",
        ),
        (
            json!({"policy": "demo", "identifiers": {"ip": "1"}, "extra": 1}),
            "extra",
        ),
    ];
    for (body, field) in cases {
        let response = app.check(body.clone()).await;
        let problem = problem(response, 400).await;
        assert_eq!(problem["field"], field, "{body}");
        assert!(
            problem["detail"].as_str().unwrap().starts_with(field),
            "{problem}"
        );
    }
    let malformed = app
        .client
        .post(app.url("/api/v1/check"))
        .bearer_auth(SERVICE_KEY)
        .header("content-type", "application/json")
        .body("{\"policy\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(problem(malformed, 400).await["field"], "body");
    let not_json = app
        .client
        .post(app.url("/api/v1/check"))
        .bearer_auth(SERVICE_KEY)
        .body("policy=demo")
        .send()
        .await
        .unwrap();
    problem(not_json, 415).await;
    let huge = json!({"policy": "demo", "identifiers": {"ip": "1"}, "pad": "x".repeat(70_000)});
    problem(app.check(huge).await, 413).await;
    let unknown = app
        .check(json!({"policy": "nope", "identifiers": {"ip": "1"}}))
        .await;
    assert!(
        problem(unknown, 404).await["detail"]
            .as_str()
            .unwrap()
            .contains("nope")
    );
}

#[tokio::test]
async fn keys_are_required_and_roles_enforced() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let body = json!({"policy": "demo", "identifiers": {"ip": "1"}});
    let none = app
        .client
        .post(app.url("/api/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(none, 401).await;
    let wrong = app
        .client
        .post(app.url("/api/v1/check"))
        .bearer_auth("spw_svc_wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(wrong, 401).await;
    let admin_may_check = app
        .client
        .post(app.url("/api/v1/check"))
        .bearer_auth(ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(admin_may_check.status(), 200);
    let service_may_not_admin = app
        .client
        .get(app.url("/api/v1/policies"))
        .bearer_auth(SERVICE_KEY)
        .send()
        .await
        .unwrap();
    problem(service_may_not_admin, 403).await;
    let anonymous_admin = app
        .client
        .get(app.url("/api/v1/policies"))
        .send()
        .await
        .unwrap();
    problem(anonymous_admin, 401).await;
}

#[tokio::test]
async fn redis_down_follows_the_policys_failure_mode() {
    let mut redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "100")]).await;
    let mut closed = one_rule(10);
    closed["failure_mode"] = json!("closed");
    app.put_policy("strict", closed).await;
    app.put_policy("lenient", one_rule(10)).await;
    redis.kill();
    let open = app
        .check(json!({"policy": "lenient", "identifiers": {"user": "1"}}))
        .await;
    assert_eq!(open.status(), 200);
    let body: Value = open.json().await.unwrap();
    assert_eq!(body["degraded"], true);
    assert_eq!(body["allowed"], true);
    let refused = app
        .check(json!({"policy": "strict", "identifiers": {"user": "1"}}))
        .await;
    assert!(refused.headers().contains_key("retry-after"));
    problem(refused, 503).await;

    // Back without a restart of Spillway.
    redis.restart();
    eventually(
        "the strict policy allowing again",
        PATIENCE,
        async || {
            app.check(json!({"policy": "strict", "identifiers": {"user": "1"}}))
                .await
                .status()
        },
        |status| *status == 200,
    )
    .await;
}

#[tokio::test]
async fn batch_answers_each_check_in_order() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("one", one_rule(1)).await;
    let body = json!({"checks": [
        {"policy": "one", "identifiers": {"user": "a"}},
        {"policy": "one", "identifiers": {"user": "a"}},
        {"policy": "missing", "identifiers": {"user": "a"}},
        {"policy": "one", "identifiers": {"user": ""}},
    ]});
    let response = app
        .client
        .post(app.url("/api/v1/check/batch"))
        .bearer_auth(SERVICE_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let statuses: Vec<u64> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 429, 404, 400]);
    assert_eq!(
        body["results"][3]["body"]["field"],
        "checks[3].identifiers.user"
    );
    let too_many =
        json!({"checks": vec![json!({"policy": "one", "identifiers": {"user": "a"}}); 101]});
    let response = app
        .client
        .post(app.url("/api/v1/check/batch"))
        .bearer_auth(SERVICE_KEY)
        .json(&too_many)
        .send()
        .await
        .unwrap();
    assert_eq!(problem(response, 400).await["field"], "checks");
}

#[tokio::test]
async fn forward_auth_reads_identifiers_from_headers() {
    let redis = RedisServer::start();
    // An internal load balancer (10.0.0.1) sits between the client and the calling proxy.
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_FORWARD_AUTH_DENY_STATUS", "403"),
            ("SPILLWAY_TRUSTED_PROXIES", "10.0.0.0/8"),
        ],
    )
    .await;
    app.put_policy("edge", one_rule(2)).await;
    let call = || {
        app.client
            .get(app.url("/api/v1/forward-auth?policy=edge"))
            .header("X-Spillway-Key", SERVICE_KEY)
            .header("X-Forwarded-For", "198.51.100.4, 10.0.0.1")
            .send()
    };
    assert_eq!(call().await.unwrap().status(), 200);
    let second = call().await.unwrap();
    assert_eq!(second.status(), 200);
    assert!(second.headers().contains_key("ratelimit"));
    let denied = call().await.unwrap();
    assert_eq!(denied.status(), 403, "nginx-style deny status");
    assert!(denied.headers().contains_key("retry-after"));
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["results"][0]["identifier"], "ip=198.51.100.4");
    let no_key = app
        .client
        .get(app.url("/api/v1/forward-auth?policy=edge"))
        .send()
        .await
        .unwrap();
    problem(no_key, 401).await;
}

/// A client that writes its own `X-Forwarded-For` gets nowhere: the proxy appends the
/// address it saw, and that (the rightmost entry) is the identifier, so rotating the first
/// address passes a 1-per-hour limit once, not eight times. An entry that is not an address
/// is refused, naming the header.
#[tokio::test]
async fn forward_auth_takes_the_address_the_proxy_added() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("edge", one_rule(1)).await;
    let call = |xff: String| {
        app.client
            .get(app.url("/api/v1/forward-auth?policy=edge"))
            .header("X-Spillway-Key", SERVICE_KEY)
            .header("X-Forwarded-For", xff)
            .send()
    };
    let mut passed = 0;
    for i in 0..8 {
        let response = call(format!("203.0.113.{i}, 198.51.100.77")).await.unwrap();
        if response.status() == 200 {
            passed += 1;
        } else {
            assert_eq!(response.status(), 429);
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["results"][0]["identifier"], "ip=198.51.100.77");
        }
    }
    assert_eq!(
        passed, 1,
        "a rotating first address passed the per-address limit"
    );
    // Refused (403: a proxy passes on only 2xx, 401, 403, 429 and 5xx), the problem in a
    // header as well as the body.
    for bad in ["198.51.100.1, not-an-ip", "<script>", "198.51.100.1:99999"] {
        let r = call(bad.to_owned()).await.unwrap();
        let said = r.headers()["spillway-problem"].to_str().unwrap().to_owned();
        assert!(
            said.starts_with("invalid-request; X-Forwarded-For"),
            "{said}"
        );
        let body = problem(r, 403).await;
        assert_eq!(body["field"], "X-Forwarded-For", "{bad}: {body}");
        assert_eq!(body["status"], 403, "{body}");
    }
}

#[tokio::test]
async fn policies_are_versioned_validated_and_deletable() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let url = app.url("/api/v1/policies/api");
    let created = app
        .client
        .put(&url)
        .bearer_auth(ADMIN_KEY)
        .json(&one_rule(5))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(created.headers()["etag"], "\"1\"");
    let updated = app.put_policy("api", one_rule(6)).await;
    assert_eq!(updated["version"], 2);
    let read: Value = app
        .client
        .get(&url)
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["rules"][0]["limit"], 6);
    let history: Value = app
        .client
        .get(app.url("/api/v1/policies/api/versions"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(history["previous_versions"][0]["version"], 1);
    assert_eq!(history["previous_versions"][0]["rules"][0]["limit"], 5);

    // Optimistic concurrency with If-Match.
    let stale = app
        .client
        .put(&url)
        .bearer_auth(ADMIN_KEY)
        .header("If-Match", "\"1\"")
        .json(&one_rule(7))
        .send()
        .await
        .unwrap();
    problem(stale, 409).await;
    let fresh = app
        .client
        .put(&url)
        .bearer_auth(ADMIN_KEY)
        .header("If-Match", "\"2\"")
        .json(&one_rule(7))
        .send()
        .await
        .unwrap();
    assert_eq!(fresh.status(), 200);

    // Validation names the field.
    let bad = app
        .client
        .put(&url)
        .bearer_auth(ADMIN_KEY)
        .json(&json!({"rules": [{"name": "r", "algorithm": "gcra"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(bad, 400).await["field"], "rules[0].rate");
    let bad_name = app
        .client
        .put(app.url("/api/v1/policies/Bad%20Name"))
        .bearer_auth(ADMIN_KEY)
        .json(&one_rule(1))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(bad_name, 400).await["field"], "name");

    let list: Value = app
        .client
        .get(app.url("/api/v1/policies"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "demo"]);

    assert_eq!(
        app.client
            .delete(&url)
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    problem(
        app.client
            .get(&url)
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    problem(
        app.check(json!({"policy": "api", "identifiers": {"user": "1"}}))
            .await,
        404,
    )
    .await;

    // Policies have no TTL; the next version number continues after a delete.
    let mut conn = redis.connection();
    let ttl: i64 = redis::cmd("TTL")
        .arg("spw:{policies}:current")
        .query(&mut conn)
        .unwrap();
    assert_eq!(ttl, -1);
    assert_eq!(app.put_policy("api", one_rule(1)).await["version"], 4);
}

#[tokio::test]
async fn overrides_block_unlimit_and_relimit_by_exact_wildcard_and_cidr() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut doc = one_rule(1);
    doc["overrides"] = json!([
        {"match": "ip=10.0.0.0/8", "action": "block", "reason": "internal scanners"},
        {"match": "user=vip-*", "action": "unlimited"},
        {"match": "user=partner", "action": "limit", "rules": [{"name": "partner", "algorithm": "fixed_window", "limit": 3, "window_ms": 3600000}]},
        {"match": "user=expired", "action": "unlimited", "expires_at_ms": 1000},
    ]);
    app.put_policy("ov", doc).await;
    let status = |id: Value| {
        let app = &app;
        async move {
            app.check(json!({"policy": "ov", "identifiers": id}))
                .await
                .status()
                .as_u16()
        }
    };
    assert_eq!(
        status(json!({"ip": "10.1.2.3"})).await,
        429,
        "blocked by CIDR"
    );
    assert_eq!(status(json!({"ip": "11.1.2.3"})).await, 200);
    for _ in 0..5 {
        assert_eq!(
            status(json!({"user": "vip-7"})).await,
            200,
            "unlimited by wildcard"
        );
    }
    for _ in 0..3 {
        assert_eq!(
            status(json!({"user": "partner"})).await,
            200,
            "its own limit of 3"
        );
    }
    assert_eq!(status(json!({"user": "partner"})).await, 429);
    assert_eq!(status(json!({"user": "expired"})).await, 200);
    assert_eq!(
        status(json!({"user": "expired"})).await,
        429,
        "an expired override no longer applies"
    );

    // Adding one through the overrides resource makes a new version.
    let added = app
        .client
        .post(app.url("/api/v1/policies/ov/overrides"))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({"match": "user=bad", "action": "block"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    assert_eq!(
        added.json::<Value>().await.unwrap()["version"],
        1,
        "an override is not a new version"
    );
    assert_eq!(status(json!({"user": "bad"})).await, 429);
}

/// An override that could never apply is refused at its field, where a support person would
/// otherwise believe an identifier blocked or freed: an expiry already past, a CIDR that is
/// not one, a value no identifier can have, a second override of a match an earlier one
/// holds for as long. A policy read back and saved whole keeps what it held.
#[tokio::test]
async fn overrides_that_could_never_apply_are_refused_naming_the_field() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut doc = one_rule(1);
    doc["overrides"] = json!([
        {"match": "user=bob", "action": "unlimited"},
        {"match": "user=old", "action": "unlimited", "expires_at_ms": 1000},
    ]);
    app.put_policy("ov", doc).await;
    let add = |body: Value| {
        let app = &app;
        async move {
            app.as_admin(Method::POST, "/api/v1/policies/ov/overrides", Some(&body))
                .await
        }
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for (body, field) in [
        (
            json!({"match": "user=x", "action": "block", "expires_at_ms": now_ms - 1}),
            "body.expires_at_ms",
        ),
        (
            json!({"match": "ip=10.0.0.0/33", "action": "block"}),
            "body.match",
        ),
        (
            json!({"match": format!("user={}", "v".repeat(257)), "action": "block"}),
            "body.match",
        ),
        (
            json!({"match": "user=bob", "action": "block"}),
            "body.match",
        ),
    ] {
        let body = problem(add(body.clone()).await, 400).await;
        assert_eq!(body["field"], field, "{body}");
    }
    // The refusals wrote nothing; an override that can apply is added.
    let added =
        add(json!({"match": "user=x", "action": "block", "expires_at_ms": now_ms + 60_000})).await;
    assert_eq!(added.status(), 201);
    assert_eq!(
        added.json::<Value>().await.unwrap()["version"],
        1,
        "an override is not a new version"
    );
    assert_eq!(
        app.check(json!({"policy": "ov", "identifiers": {"user": "x"}}))
            .await
            .status(),
        429
    );

    // Saved whole: the expired override it already held passes; a shadowed one it adds does not.
    let mut policy: Value = app
        .as_admin(Method::GET, "/api/v1/policies/ov", None)
        .await
        .json()
        .await
        .unwrap();
    let put = |doc: Value| {
        let app = &app;
        async move {
            app.as_admin(Method::PUT, "/api/v1/policies/ov", Some(&doc))
                .await
        }
    };
    assert_eq!(put(policy.clone()).await.status(), 200);
    policy["overrides"]
        .as_array_mut()
        .unwrap()
        .push(json!({"match": "user=bob", "action": "block"}));
    let body = problem(put(policy).await, 400).await;
    assert_eq!(body["field"], "overrides[3].match", "{body}");
}

/// Two app processes on one Redis (this test's, and the real binary in a process of its
/// own): 2,000 concurrent checks against a limit of 100 admit exactly 100, and a policy
/// change through A is enforced by B within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_limits_and_policies() {
    let redis = RedisServer::start();
    let a = spawn_app(&redis).await;
    // 1,000 clients at once, each on a connection of its own (HTTP/1.1): more than the
    // default cap of a 1 GiB budget (768), whose excess would wait for idle ones to close.
    let process = AppProcess::start_with(&redis, &[("SPILLWAY_MAX_CONNECTIONS", "2000")]);
    let b = TestApp::remote(process.addr);
    a.put_policy("shared", one_rule(100)).await;
    when_policy_reaches(&b, "shared", 1).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..2_000 {
        let (client, url) = if i % 2 == 0 {
            (a.client.clone(), a.url("/api/v1/check"))
        } else {
            (b.client.clone(), b.url("/api/v1/check"))
        };
        tasks.spawn(async move {
            client
                .post(url)
                .bearer_auth(SERVICE_KEY)
                .json(&json!({"policy": "shared", "identifiers": {"user": "hot"}}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        });
    }
    let mut allowed = 0;
    while let Some(status) = tasks.join_next().await {
        match status.unwrap() {
            200 => allowed += 1,
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(allowed, 100);

    let changed_at = Instant::now();
    a.put_policy("shared", one_rule(5000)).await;
    let seen = when_policy_reaches(&b, "shared", 2).await;
    assert!(
        seen - changed_at < Duration::from_secs(1),
        "B enforced the change after {:?}",
        seen - changed_at
    );
}

/// Polls `app` until a check of `policy` reports `version`; returns when.
async fn when_policy_reaches(app: &TestApp, policy: &str, version: u64) -> Instant {
    let (_, _, seen) = eventually(
        &format!("{policy} v{version} reaching this instance"),
        PATIENCE,
        async || {
            let r = app
                .check(json!({"policy": policy, "identifiers": {"user": "probe"}, "cost": 0}))
                .await;
            let status = r.status().as_u16();
            let answer: Value = r.json().await.unwrap_or_default();
            (status, answer["policy_version"].clone(), Instant::now())
        },
        |(status, seen, _)| *status == 200 && *seen == version,
    )
    .await;
    seen
}

#[tokio::test]
async fn metrics_count_checks_by_policy_and_outcome_never_by_identifier() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("metered", one_rule(1)).await;
    app.check(json!({"policy": "metered", "identifiers": {"user": "secret-user-77"}}))
        .await;
    app.check(json!({"policy": "metered", "identifiers": {"user": "secret-user-77"}}))
        .await;
    let text = app.metrics().await;
    let line = |needle: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("spillway_checks_total")
                    && l.contains("policy=\"metered\"")
                    && l.contains(needle)
            })
            .map(str::to_owned)
    };
    let allowed = line("outcome=\"allowed\"").expect(&text);
    assert!(allowed.ends_with(" 1"), "{allowed}");
    assert!(line("outcome=\"denied\"").is_some(), "{text}");
    assert!(
        text.contains("spillway_check_duration_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains("spillway_redis_duration_seconds"), "{text}");
    assert!(!text.contains("secret-user-77"));
}

/// A sliding log takes any cost its limit allows, past what Lua can unpack into one call
/// (about 8,000): counted exactly, never answered "allowed, degraded" with nothing counted.
#[tokio::test]
async fn a_large_cost_on_a_sliding_log_is_counted_exactly() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "tokens",
        json!({"failure_mode": "open", "rules": [{"name": "daily", "algorithm": "sliding_log",
               "limit": 100_000, "window_ms": 86_400_000}]}),
    )
    .await;
    for (cost, status, remaining) in [
        (30_000, 200, 70_000),
        (30_000, 200, 40_000),
        (30_000, 200, 10_000),
        (30_000, 429, 10_000),
        (10_000, 200, 0),
    ] {
        let response = app
            .check(json!({"policy": "tokens", "identifiers": {"user": "7"}, "cost": cost}))
            .await;
        assert_eq!(response.status(), status);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["degraded"], false, "{body}");
        assert_eq!(body["remaining"], remaining, "{body}");
    }
}

/// Services with an HTTP/2 client multiplex their checks: the check port speaks HTTP/2 in
/// cleartext with prior knowledge, and 50 checks sent at once as streams of one connection
/// each get their own exact answer (a limit of 30: 30 allowed with every remaining value
/// from 29 down to 0 once each, 20 denied), with the RateLimit headers.
#[tokio::test]
async fn checks_multiplex_over_http2_cleartext() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("h2", one_rule(30)).await;
    let tcp = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut streams = Vec::new();
    for _ in 0..50 {
        let request = http::Request::post(format!("http://{}/api/v1/check", app.addr))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {SERVICE_KEY}"))
            .body(())
            .unwrap();
        let mut sender = sender.clone().ready().await.unwrap();
        let (response, mut body) = sender.send_request(request, false).unwrap();
        body.send_data(
            bytes::Bytes::from_static(br#"{"policy":"h2","identifiers":{"user":"multiplexed"}}"#),
            true,
        )
        .unwrap();
        streams.push(response);
    }
    let mut remaining = Vec::new();
    let mut denied = 0;
    for response in streams {
        let response = response.await.unwrap();
        let status = response.status().as_u16();
        assert!(response.headers().contains_key("ratelimit-policy"));
        assert_eq!(response.headers()["cache-control"], "no-store");
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        match status {
            200 => remaining.push(answer["remaining"].as_u64().unwrap()),
            429 => {
                assert_eq!(answer["allowed"], false);
                denied += 1;
            }
            other => panic!("status {other}: {answer}"),
        }
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (0..30).collect::<Vec<u64>>());
    assert_eq!(denied, 20);
}

/// A sliding log's check of cost 100,000 wrote 100,000 list elements (12-27 ms of
/// Redis). Now it is one element, whatever the cost; the count is still exact.
#[tokio::test]
async fn a_costly_sliding_log_check_is_one_element() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "tokens",
        json!({"rules": [{"name": "daily", "algorithm": "sliding_log",
               "limit": 100_000, "window_ms": 86_400_000}]}),
    )
    .await;
    for (cost, remaining) in [(99_000, 1000), (1000, 0)] {
        let r = app
            .check(json!({"policy": "tokens", "identifiers": {"user": "big"}, "cost": cost}))
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["remaining"], remaining);
    }
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*tokens|user|big*")
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let len: usize = redis::cmd("LLEN").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(len, 2, "one element per counted check, not per unit");
    let denied = app
        .check(json!({"policy": "tokens", "identifiers": {"user": "big"}}))
        .await;
    assert_eq!(denied.status(), 429);
}

/// The check endpoints are answered before the router (`api::check_endpoint`), so their
/// answers get the API's headers there: every status they answer with carries the API's CSP,
/// no framing, no sniffing, no storing; a body over 64 KiB is still a 413; another method on
/// their paths still reaches the router (405); and while the server drains they ask the
/// client to close the connection, as every other answer does.
#[tokio::test]
async fn the_check_endpoints_answer_with_the_apis_headers() {
    use crate::helpers::{SERVICE_KEY, app_state, serve};
    let redis = RedisServer::start();
    let state = app_state(&redis, &[]).await;
    let app = serve(state.clone()).await;
    app.put_policy(
        "headers",
        serde_json::json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000}]}),
    )
    .await;
    let client = reqwest::Client::new();
    let check = |body: String, key: &'static str, content_type: &'static str| {
        client
            .post(app.url("/api/v1/check"))
            .bearer_auth(key)
            .header(header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
    };
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(60)).await;
    let good = r#"{"policy":"headers","identifiers":{"user":"h"}}"#.to_owned();
    let mut answers = vec![
        (200, check(good.clone(), SERVICE_KEY, "application/json").await.unwrap()),
        (429, check(good.clone(), SERVICE_KEY, "application/json").await.unwrap()),
        (401, check(good.clone(), "nope", "application/json").await.unwrap()),
        (415, check(good.clone(), SERVICE_KEY, "text/plain").await.unwrap()),
        (400, check("{".into(), SERVICE_KEY, "application/json").await.unwrap()),
        (
            404,
            check(
                r#"{"policy":"nope","identifiers":{"user":"h"}}"#.into(),
                SERVICE_KEY,
                "application/json",
            )
            .await
            .unwrap(),
        ),
        (
            // A client of its own: the server closes a connection whose body it did not read.
            413,
            reqwest::Client::new()
                .post(app.url("/api/v1/check"))
                .bearer_auth(SERVICE_KEY)
                .header(header::CONTENT_TYPE, "application/json")
                .body(format!(r#"{{"policy":"{}"}}"#, "x".repeat(70_000)))
                .send()
                .await
                .unwrap(),
        ),
        (
            200,
            client
                .post(app.url("/api/v1/check/batch"))
                .bearer_auth(SERVICE_KEY)
                .json(&serde_json::json!({"checks": [{"policy": "headers", "identifiers": {"user": "b"}}]}))
                .send()
                .await
                .unwrap(),
        ),
        (
            200,
            client
                .get(app.url("/api/v1/forward-auth?policy=headers"))
                .bearer_auth(SERVICE_KEY)
                .header("x-forwarded-for", "192.0.2.1")
                .send()
                .await
                .unwrap(),
        ),
        (
            405,
            client
                .get(app.url("/api/v1/check"))
                .bearer_auth(SERVICE_KEY)
                .send()
                .await
                .unwrap(),
        ),
    ];
    for (i, (status, r)) in answers.drain(..).enumerate() {
        assert_eq!(r.status().as_u16(), status, "answer {i}");
        let h = r.headers();
        assert_eq!(
            h[header::CONTENT_SECURITY_POLICY],
            "default-src 'none'; frame-ancestors 'none'",
            "answer {i}"
        );
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "answer {i}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "answer {i}");
        assert_eq!(h[header::REFERRER_POLICY], "same-origin", "answer {i}");
        assert_eq!(h[header::CACHE_CONTROL], "no-store", "answer {i}");
        assert!(!h.contains_key(header::CONNECTION), "answer {i}");
    }
    state.shutdown.start_draining();
    let r = check(good, SERVICE_KEY, "application/json").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()[header::CONNECTION], "close");
}

/// The check endpoint reads its body itself (it is served before the router's body limit):
/// a body of exactly 64 KiB is read and answered (here 404: the policy does not exist), one
/// byte more is a 413, as the router's limit answered before.
#[tokio::test]
async fn the_check_body_limit_is_64_kib_to_the_byte() {
    use crate::helpers::SERVICE_KEY;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let json = r#"{"policy":"absent","identifiers":{"user":"edge"}}"#;
    for (size, status) in [(64 * 1024, 404), (64 * 1024 + 1, 413)] {
        let body = format!("{json}{}", " ".repeat(size - json.len()));
        assert_eq!(body.len(), size);
        let r = reqwest::Client::new()
            .post(app.url("/api/v1/check"))
            .bearer_auth(SERVICE_KEY)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{size} bytes");
    }
}

/// The Bearer scheme is read in any case.
#[tokio::test]
async fn the_bearer_scheme_is_read_in_any_case() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let r = app
        .client
        .post(app.url("/api/v1/check"))
        .header(
            reqwest::header::AUTHORIZATION,
            format!("bearer {SERVICE_KEY}"),
        )
        .json(&json!({"policy": "demo", "identifiers": {"user": "lower"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Overrides are not versions of the rules: written in place (the version and the list of
/// versions stay), yet every instance's over-limit cache and the entity tag follow them, a
/// write over overrides changed meanwhile is refused by the tag, and a rollback keeps them.
#[tokio::test]
async fn overrides_change_in_place_and_a_rollback_keeps_them() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("ov", one_rule(1)).await;
    let bob = json!({"policy": "ov", "identifiers": {"user": "bob"}});
    app.check(bob.clone()).await;
    // Denied, and the next denial answered from the over-limit cache.
    for _ in 0..2 {
        assert_eq!(app.check(bob.clone()).await.status(), 429);
    }
    let added = app
        .client
        .post(app.url("/api/v1/policies/ov/overrides"))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({"match": "user=bob", "action": "unlimited", "reason": "ticket 5"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    assert_eq!(added.json::<Value>().await.unwrap()["version"], 1);
    // The cached denial went with the change.
    assert_eq!(app.check(bob.clone()).await.status(), 200);
    let read = app
        .client
        .get(app.url("/api/v1/policies/ov"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(read.headers()[header::ETAG], "\"1.1\"");
    let versions: Value = app
        .client
        .get(app.url("/api/v1/policies/ov/versions"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        versions["previous_versions"].as_array().map(Vec::len),
        Some(0),
        "{versions}"
    );
    // A write whose tag predates the override is refused; one with the current tag lands.
    let put = |tag: &'static str| {
        app.client
            .put(app.url("/api/v1/policies/ov"))
            .bearer_auth(ADMIN_KEY)
            .header(header::IF_MATCH, tag)
            .json(&json!({"rules": one_rule(2)["rules"], "overrides": [{"match": "user=bob", "action": "unlimited"}]}))
            .send()
    };
    problem(put("\"1.0\"").await.unwrap(), 409).await;
    assert_eq!(put("\"1.1\"").await.unwrap().status(), 200);
    // Version 1 was kept with bob's exemption; it is removed now, and a rollback to version
    // 1 brings its rules back, not the exemption.
    let removed = app
        .client
        .delete(app.url("/api/v1/policies/ov/overrides/0"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.json::<Value>().await.unwrap()["version"], 2);
    let mut v = crate::auth::admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let r = v
        .post_form(
            "/fn/policy_rollback",
            &[("csrf", csrf.as_str()), ("name", "ov"), ("to_version", "1")],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let now: Value = app
        .client
        .get(app.url("/api/v1/policies/ov"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(now["version"], 3);
    assert_eq!(now["rules"][0]["limit"], 1, "{now}");
    assert_eq!(now["overrides"].as_array().map_or(0, Vec::len), 0, "{now}");
}
