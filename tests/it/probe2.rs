//! What the second black-box probe found beyond the gRPC port (`grpc_port`), each kept
//! fixed: costly checks, event streams, webhooks, catch-all overrides, slow writes, sign-in
//! budgets, and the small things (YAML keys, audit bounds, the Bearer scheme, `/json`,
//! session reads).

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};
use spillway::domain::people::Role;

use crate::{
    auth::{PASSWORD, Visitor, add_user, store},
    helpers::{ADMIN_KEY, RedisServer, SERVICE_KEY, spawn_app, spawn_app_with},
};

/// N2: a sliding log's check of cost 100,000 wrote 100,000 list elements (12-27 ms of
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

/// N2: a check that timed out after its call went out (Redis may still apply it) is
/// counted as such, apart from one that timed out in the queue.
#[tokio::test]
async fn checks_that_time_out_in_flight_are_counted() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "100")]).await;
    app.put_policy(
        "slow",
        json!({"failure_mode": "open", "rules": [{"name": "r", "algorithm": "fixed_window",
               "limit": 10, "window_ms": 60000}]}),
    )
    .await;
    redis.pause(400);
    let r = app
        .check(json!({"policy": "slow", "identifiers": {"user": "a"}}))
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["degraded"], true);
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("spillway_check_timeouts_total{stage=\"sent\"}")),
        "{metrics}"
    );
}

/// N5: one viewer held 400 live overview streams. Now a user holds 8 at most on an
/// instance, over all their sessions: the 9th is a 429 problem, another user is not held
/// back, and a closed one frees its place.
#[tokio::test]
async fn live_streams_are_capped_per_user() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "vera", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "vera").await;
    let mut open = Vec::new();
    for i in 0..8 {
        let path = if i % 2 == 0 {
            "/events/overview"
        } else {
            "/events/identifier?id=user%3D1"
        };
        let r = v.get(path).await;
        assert_eq!(r.status(), 200, "stream {i}");
        open.push(r);
    }
    let refused = v.get("/events/overview").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body: Value = refused.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("close a tab"));
    // Another session of hers counts with this one (30 sessions of one viewer held 240
    // streams); another user is not held back.
    let mut again = Visitor::signed_in(&app, "vera").await;
    assert_eq!(again.get("/events/overview").await.status(), 429);
    add_user(&store(&redis).await, "walt", Role::Viewer).await;
    let mut other = Visitor::signed_in(&app, "walt").await;
    assert_eq!(other.get("/events/overview").await.status(), 200);
    // One stream closed: its place comes back once the server notices (its next event).
    drop(open.pop());
    let started = Instant::now();
    loop {
        let r = v.get("/events/overview").await;
        if r.status() == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the closed stream's place did not come back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn put_alert(app: &crate::helpers::TestApp, name: &str, url: &str) -> (u16, Value) {
    let r = app
        .as_admin(
            Method::PUT,
            &format!("/api/v1/alerts/{name}"),
            Some(
                &json!({"condition": {"kind": "identifier_throttled", "minutes": 1},
                "webhook_url": url, "secret": "0123456789abcdef0123"}),
            ),
        )
        .await;
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// N6 and N7: webhooks could target loopback, `[::1]`, `localhost`, decimal IPs and the
/// Redis port; viewers saw whole webhook URLs (often credentials) and delivery details.
#[tokio::test]
async fn webhooks_stay_outside_and_their_urls_are_for_admins() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let redis_port = redis.url().rsplit(':').next().unwrap().to_owned();
    for url in [
        format!("http://127.0.0.1:{redis_port}/"),
        "http://[::1]/x".into(),
        "http://localhost/x".into(),
        "http://2130706433/".into(),
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://10.0.0.8/hook".into(),
    ] {
        let (status, body) = put_alert(&app, "inside", &url).await;
        assert_eq!(status, 400, "{url}: {body}");
        assert_eq!(body["field"], "webhook_url", "{url}: {body}");
    }
    let (status, _) = put_alert(
        &app,
        "slack",
        "https://hooks.slack.com/services/T000/B000/SECRETTOKEN",
    )
    .await;
    assert_eq!(status, 200);
    // An admin allows a target inside by setting.
    let allowing = spawn_app_with(
        &redis,
        &[("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "10.0.0.0/8")],
    )
    .await;
    assert_eq!(
        put_alert(&allowing, "inside", "http://10.0.0.8/hook")
            .await
            .0,
        200
    );

    // The admin key sees the whole URL; a viewer's session sees its host.
    let admin: Value = app
        .as_admin(Method::GET, "/api/v1/alerts", None)
        .await
        .json()
        .await
        .unwrap();
    let url_of = |v: &Value| {
        v["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "slack")
            .map(|r| r["webhook_url"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert!(url_of(&admin).ends_with("SECRETTOKEN"));
    add_user(&store(&redis).await, "vic", Role::Viewer).await;
    let mut viewer = Visitor::signed_in(&app, "vic").await;
    let seen: Value = viewer.get("/api/v1/alerts").await.json().await.unwrap();
    assert_eq!(url_of(&seen), "https://hooks.slack.com/…");
    let page = viewer.get("/alerts").await.text().await.unwrap();
    assert!(!page.contains("SECRETTOKEN"));
    assert!(page.contains("hooks.slack.com"));
    // Nor through the audit log, which every role reads (found by the third probe).
    let audit = viewer
        .get("/api/v1/audit?action=alert.")
        .await
        .text()
        .await
        .unwrap();
    assert!(audit.contains("hooks.slack.com"), "{audit}");
    assert!(!audit.contains("SECRETTOKEN"), "{audit}");
    let page = viewer.get("/audit").await.text().await.unwrap();
    assert!(!page.contains("SECRETTOKEN"));
}

/// N8: a deleted rule's queued deliveries kept going out, signed with its old secret, for
/// up to an hour. Now the next round cancels them and logs why.
#[tokio::test]
async fn deleting_an_alert_rule_cancels_its_deliveries() {
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_ALERT_EVAL_MS", "200"),
            ("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "127.0.0.1"),
        ],
    )
    .await;
    // A receiver that always fails: each delivery is retried (backoff from 1 s).
    let (sink, sink_addr) = crate::alerts::start_sink(usize::MAX).await;
    let hits = || sink.seen.lock().unwrap().len();
    app.put_policy(
        "alerted",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    let (status, body) = put_alert(&app, "noisy", &format!("http://{sink_addr}/hook")).await;
    assert_eq!(status, 200, "{body}");
    let started = Instant::now();
    while hits() == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no delivery");
        app.check(json!({"policy": "alerted", "identifiers": {"user": "x"}}))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deleted = app
        .as_admin(Method::DELETE, "/api/v1/alerts/noisy", None)
        .await;
    assert!(deleted.status().is_success());
    // The delivery is cancelled, with its reason in the log.
    let started = Instant::now();
    loop {
        let view: Value = app
            .as_admin(Method::GET, "/api/v1/alerts", None)
            .await
            .json()
            .await
            .unwrap();
        let cancelled = view["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["outcome"] == "cancelled" && d["detail"] == "the rule was deleted");
        if cancelled {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not cancelled: {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = hits();
    // Past the retry the delivery had been given (2 s after its first attempt).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(hits(), after, "a delivery went out after the delete");
}

/// N9: support could add `user=*` unlimited (or `ip=0.0.0.0/0`, or `ip=*.*`, or two /1
/// blocks), which turns a policy off for everyone. Now a loosening override of a wildcard or
/// of a network wider than a v4 /16 or a v6 /48 is an admin's; support lifts named users
/// and networks, and may block any pattern.
#[tokio::test]
async fn catch_all_unlimited_overrides_are_an_admins() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "guarded",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}]}),
    )
    .await;
    add_user(&store(&redis).await, "sue", Role::Support).await;
    let mut support = Visitor::signed_in(&app, "sue").await;
    let csrf = support.csrf().await;
    let origin = support.origin();
    let add = |m: &'static str, action: &'static str| json!({"match": m, "action": action, "reason": "test"});
    for (doc, expected) in [
        (add("user=*", "unlimited"), 403),
        (add("ip=0.0.0.0/0", "unlimited"), 403),
        (add("ip=::/0", "unlimited"), 403),
        (add("user=**", "unlimited"), 403),
        // The second probe's ways around the first rule: wildcards that still match
        // everything, and blocks that cover every address together.
        (add("ip=*.*", "unlimited"), 403),
        (add("ip=*:*", "unlimited"), 403),
        (add("envoy=*=*", "unlimited"), 403),
        (add("user=0*", "unlimited"), 403),
        (add("ip=0.0.0.0/1", "unlimited"), 403),
        (add("ip=2001:db8::/32", "unlimited"), 403),
        // IPv4 clients written as IPv6 (the third probe): as wide as the IPv4 they hold.
        (add("ip=::ffff:0:0/96", "unlimited"), 403),
        (add("ip=64:ff9b::/96", "unlimited"), 403),
        (add("ip=::ffff:203.0.113.0/120", "unlimited"), 201),
        (add("user=bob", "unlimited"), 201),
        (add("ip=203.0.113.0/24", "unlimited"), 201),
        (add("ip=2001:db8:1::/48", "unlimited"), 201),
        (add("user=*", "block"), 201),
    ] {
        let r = reqwest::Client::new()
            .post(app.url("/api/v1/policies/guarded/overrides"))
            .header(header::COOKIE, support.cookie_header().unwrap())
            .header("x-csrf-token", &csrf)
            .header(header::ORIGIN, &origin)
            .json(&doc)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, expected, "{doc}: {body}");
        if expected == 403 {
            assert!(body.contains("only an admin"), "{body}");
        }
    }
    let r = app
        .as_admin(
            Method::POST,
            "/api/v1/policies/guarded/overrides",
            Some(&add("ip=0.0.0.0/0", "unlimited")),
        )
        .await;
    assert_eq!(r.status(), 201);
}

/// N10: a policy write that outlasted the Redis timeout (50 ms) was applied, answered 503
/// and never audited. Writes now have 5 s: one held up 400 ms is answered and audited.
#[tokio::test]
async fn a_slow_policy_write_is_answered_and_audited() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "50")]).await;
    let mut conn = redis.connection();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg("400")
        .arg("WRITE")
        .query(&mut conn)
        .unwrap();
    let started = Instant::now();
    let r = app
        .as_admin(
            Method::PUT,
            "/api/v1/policies/slowly",
            Some(&json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}]})),
        )
        .await;
    let took = started.elapsed();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert!(
        took >= Duration::from_millis(300),
        "Redis was paused: {took:?}"
    );
    // The stall opened the circuit breaker (the stats flush timed out in it): the audit is
    // read once the breaker lets calls through again.
    let mut audit = Value::Null;
    for _ in 0..40 {
        let r = app
            .as_admin(Method::GET, "/api/v1/audit?action=policy.", None)
            .await;
        let status = r.status();
        audit = r.json().await.unwrap();
        if status != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        audit["entries"]
            .as_array()
            .is_some_and(|entries| entries.iter().any(|e| e["target"] == "slowly")),
        "{audit}"
    );
}

/// N11: guesses at one account spread over addresses were never limited, and an IPv6
/// client had a fresh budget at every address of its /64.
#[tokio::test]
async fn sign_in_budgets_hold_per_account_and_per_ipv6_network() {
    let redis = RedisServer::start();
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    let app = spawn_app_with(&redis, &[("SPILLWAY_TRUSTED_PROXIES", "127.0.0.0/8")]).await;
    let location = |r: &reqwest::Response| {
        r.headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    // Six addresses of one /64: the pair budget (5) holds across them.
    for i in 0..6 {
        let mut v = Visitor::new(&app);
        v.forwarded_for = Some(format!("2001:db8:7:7::{:x}", i + 1));
        let l = location(&v.login("ann", "wrong password!").await);
        let expected = if i < 5 {
            "error=invalid"
        } else {
            "error=limited"
        };
        assert!(l.contains(expected), "{i}: {l}");
    }
    // Twenty guesses at one account from twenty addresses, then the 21st is limited even
    // from a new address, and so is the right password.
    add_user(&store(&redis).await, "bo", Role::Viewer).await;
    for i in 0..21 {
        let mut v = Visitor::new(&app);
        v.forwarded_for = Some(format!("198.51.100.{}", i + 1));
        let l = location(&v.login("bo", "wrong password!").await);
        let expected = if i < 20 {
            "error=invalid"
        } else {
            "error=limited"
        };
        assert!(l.contains(expected), "{i}: {l}");
    }
    let mut fresh = Visitor::new(&app);
    fresh.forwarded_for = Some("203.0.113.99".into());
    assert!(location(&fresh.login("bo", PASSWORD).await).contains("error=limited"));
    // Support may not reset sign-in limits (it could then guess an admin's password
    // without end); an admin lifts the lock-out by resetting the account's identifier.
    add_user(&store(&redis).await, "sam", Role::Support).await;
    let mut support = Visitor::new(&app);
    support.forwarded_for = Some("203.0.113.200".into());
    assert_eq!(location(&support.login("sam", PASSWORD).await), "/people");
    let csrf = support.csrf().await;
    let refused = reqwest::Client::new()
        .delete(app.url("/api/v1/identifiers/login-user/bo"))
        .header(header::COOKIE, support.cookie_header().unwrap())
        .header("x-csrf-token", &csrf)
        .header(header::ORIGIN, support.origin())
        .header("x-forwarded-for", "203.0.113.200")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let reset = app
        .as_admin(Method::DELETE, "/api/v1/identifiers/login-user/bo", None)
        .await;
    assert_eq!(reset.status(), 200);
    let done: Value = reset.json().await.unwrap();
    assert!(done["deleted_keys"].as_u64().unwrap() >= 1, "{done}");
    let mut again = Visitor::new(&app);
    again.forwarded_for = Some("203.0.113.100".into());
    assert_eq!(location(&again.login("bo", PASSWORD).await), "/people");
    // Another account from those addresses is not held back.
    let mut other = Visitor::new(&app);
    other.forwarded_for = Some("198.51.100.1".into());
    assert_eq!(location(&other.login("ann", PASSWORD).await), "/people");
}

/// The info items of the probe.
#[tokio::test]
async fn the_small_findings_stay_fixed() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    // Duplicate keys in an Envoy domain's YAML are refused with where they are.
    let r = app
        .client
        .put(app.url("/api/v1/envoy/domains/dup"))
        .bearer_auth(ADMIN_KEY)
        .header(header::CONTENT_TYPE, "application/yaml")
        .body("domain: dup\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      requests_per_unit: 2\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("duplicate entry with key \"requests_per_unit\"")
            && detail.contains("line"),
        "{detail}"
    );
    // The audit API's bounds: the first id there can be pages to nothing, a year past
    // 9999 is named.
    let r = app
        .as_admin(Method::GET, "/api/v1/audit?before=0-0", None)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["entries"], json!([]));
    let r = app
        .as_admin(
            Method::GET,
            "/api/v1/audit?since=1000000000000000-01-01",
            None,
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "since");
    // The Bearer scheme in any case.
    let r = app
        .client
        .post(app.url("/api/v1/check"))
        .header(header::AUTHORIZATION, format!("bearer {SERVICE_KEY}"))
        .json(&json!({"policy": "demo", "identifiers": {"user": "lower"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // /json takes integers written with an exponent, and its 401 is typed as one.
    let r = app
        .client
        .post(app.url("/json"))
        .bearer_auth(SERVICE_KEY)
        .json(&json!({"domain": "none", "hitsAddend": 1e0,
            "descriptors": [{"entries": [{"key": "k", "value": "v"}], "hits_addend": "2e0"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = app
        .client
        .post(app.url("/json"))
        .json(&json!({"domain": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["type"],
        "https://spillway.dev/problems/unauthorized"
    );
}

/// A session read that times out sent a signed-in user to /login. Now it is read again,
/// and if Redis still does not answer the page says so with a 503; the user stays signed
/// in.
#[tokio::test]
async fn a_session_that_cannot_be_read_is_not_a_sign_out() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "100")]).await;
    add_user(&store(&redis).await, "ida", Role::Viewer).await;
    let mut v = Visitor::signed_in(&app, "ida").await;
    redis.pause(1500);
    let r = v.get("/audit").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get(header::LOCATION).is_none());
    assert!(r.text().await.unwrap().contains("still signed in"));
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(v.get("/audit").await.status(), 200);
}

/// Over HTTP/2 to `addr`: sends `method path` with `headers` and the first 16 KiB of a body
/// that says it is 1 MiB long, and never ends it; the status, answered while it is open.
async fn status_before_the_body_ends(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut sender = sender.ready().await.unwrap();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-length", "1048576");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, mut stream) = sender
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    stream.reserve_capacity(16 * 1024);
    stream
        .send_data(bytes::Bytes::from(vec![b'{'; 16 * 1024]), false)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("answered while the body is still open")
        .unwrap();
    response.status().as_u16()
}

/// The third probe: the API read a body (64 KiB on the check endpoints, 1 MiB for an Envoy
/// domain, 2 MiB on `/json`) before it checked the key, so callers with no credentials at
/// all made the server hold half a gigabyte. Now every one of them is answered 401 from its
/// headers, while its body is still coming.
#[tokio::test]
async fn bodies_are_read_only_for_known_callers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let json = ("content-type", "application/json");
    for (method, path, headers) in [
        ("POST", "/api/v1/check", vec![json]),
        ("POST", "/api/v1/check/batch", vec![json]),
        ("POST", "/json", vec![json]),
        ("PUT", "/api/v1/policies/p", vec![json]),
        (
            "PUT",
            "/api/v1/envoy/domains/d",
            vec![("content-type", "application/yaml")],
        ),
        ("POST", "/api/v1/report", vec![json]),
        ("PUT", "/api/v1/alerts/a", vec![json]),
        (
            "POST",
            "/api/v1/check",
            vec![json, ("authorization", "Bearer not-a-key")],
        ),
        (
            "PUT",
            "/api/v1/policies/p",
            vec![json, ("cookie", "spillway_session=forged")],
        ),
    ] {
        let status = status_before_the_body_ends(app.addr, method, path, &headers).await;
        assert_eq!(status, 401, "{method} {path} {headers:?}");
    }
    // A known caller's body is read as before.
    let ok = app
        .check(json!({"policy": "demo", "identifiers": {"user": "known"}}))
        .await;
    assert_eq!(ok.status(), 200);
}
