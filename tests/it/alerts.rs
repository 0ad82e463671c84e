//! Alerts: rules through the API (audited, fields named), evaluated once across instances,
//! delivered to a local HTTP sink that checks every signature, once per firing and once
//! per resolution, through a sink that fails at first; a test delivery on demand; webhooks
//! kept outside (and their URLs shown to admins only); a deleted rule's deliveries
//! cancelled.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{body::Bytes, extract::State, http::HeaderMap, routing::post};
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::Sha256;
use spillway::domain::people::Role;

use crate::{
    auth::{Visitor, add_user, admin, store},
    helpers::{ADMIN_KEY, PATIENCE, RedisServer, TestApp, eventually, spawn_app, spawn_app_with},
};

pub(crate) const SECRET: &str = "a shared secret of the sink";
/// Evaluated often, delivering to the sink on this machine (loopback is refused unless
/// allowed).
const FAST: &[(&str, &str)] = &[
    ("SPILLWAY_ALERT_EVAL_MS", "200"),
    ("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "127.0.0.1"),
];

/// One request the sink received: delivery id, event, whether the signature was valid and
/// fresh, the body.
type Received = (String, String, bool, Value);

/// What the sink received, in order.
#[derive(Clone, Default)]
pub(crate) struct Sink {
    pub(crate) seen: Arc<Mutex<Vec<Received>>>,
    /// Requests answered 500 before the sink starts accepting.
    fail_first: Arc<Mutex<usize>>,
}

async fn receive(
    State(sink): State<Sink>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::http::StatusCode {
    let text = String::from_utf8_lossy(&body).to_string();
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    // X-Spillway-Signature: t=<seconds>,v1=<hex>, over "<seconds>.<body>".
    let signature = header("x-spillway-signature");
    let (t, v1) = signature
        .split_once(',')
        .map(|(t, v)| {
            (
                t.trim_start_matches("t=").to_owned(),
                v.trim_start_matches("v1=").to_owned(),
            )
        })
        .unwrap_or_default();
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.{text}").as_bytes());
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let fresh = t.parse::<i64>().is_ok_and(|t| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        (now - t).abs() < 60
    });
    let payload: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let id = header("x-spillway-delivery");
    assert_eq!(header("idempotency-key"), id);
    sink.seen.lock().unwrap().push((
        id,
        payload["event"].as_str().unwrap_or_default().to_owned(),
        v1 == expected && fresh,
        payload,
    ));
    let mut fail = sink.fail_first.lock().unwrap();
    if *fail > 0 {
        *fail -= 1;
        return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
    }
    axum::http::StatusCode::OK
}

pub(crate) async fn start_sink(fail_first: usize) -> (Sink, SocketAddr) {
    let sink = Sink {
        fail_first: Arc::new(Mutex::new(fail_first)),
        ..Sink::default()
    };
    let app = axum::Router::new()
        .route("/hook", post(receive))
        .with_state(sink.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (sink, addr)
}

pub(crate) async fn put_alert(app: &TestApp, name: &str, doc: Value) -> (u16, Value) {
    let r = app
        .client
        .put(app.url(&format!("/api/v1/alerts/{name}")))
        .bearer_auth(ADMIN_KEY)
        .json(&doc)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// What the sink has received so far.
fn received(sink: &Sink) -> Vec<Received> {
    sink.seen.lock().unwrap().clone()
}

/// How many of `seen` are of `event`.
fn count(seen: &[Received], event: &str) -> usize {
    seen.iter().filter(|s| s.1 == event).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_fires_once_and_resolves_once_across_two_instances_through_a_failing_sink() {
    let redis = RedisServer::start();
    let a = spawn_app_with(&redis, FAST).await;
    let b = spawn_app_with(&redis, FAST).await;
    let (sink, sink_addr) = start_sink(2).await;
    a.put_policy(
        "flood",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    let (status, saved) = put_alert(
        &b,
        "flood-denials",
        json!({"condition": {"kind": "policy_denials", "policy": "flood", "per_second": 5.0, "for_seconds": 2},
            "webhook_url": format!("http://{sink_addr}/hook"), "secret": SECRET}),
    )
    .await;
    assert_eq!(status, 200, "{saved}");
    assert_eq!(saved["secret"], "(set)", "the secret is not shown again");

    // About 40 denials a second through both instances for 3 seconds.
    let flood = async {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            for app in [&a, &b] {
                for _ in 0..2 {
                    app.check(json!({"policy": "flood", "identifiers": {"user": "bot"}}))
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Two instances run the evaluation loop; one holds the lease throughout.
    let mut conn = redis.connection();
    let mut holders = std::collections::BTreeSet::new();
    let watch = async {
        for _ in 0..30 {
            let holder: Option<String> = redis::cmd("GET")
                .arg("spw:{alerts}:lease")
                .query(&mut conn)
                .unwrap();
            holders.extend(holder);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::join!(flood, watch);
    assert_eq!(holders.len(), 1, "one holder: {holders:?}");
    // Fired, refused twice by the sink, delivered on the third attempt (after 1 s and 2 s).
    eventually(
        "the firing delivered",
        PATIENCE,
        async || received(&sink),
        |seen| count(seen, "firing") >= 3,
    )
    .await;
    // The flood is over: within the 2-second window and an evaluation, it resolves.
    eventually(
        "the resolution delivered",
        PATIENCE,
        async || received(&sink),
        |seen| count(seen, "resolved") >= 1,
    )
    .await;
    // A negative check: nothing more (no second firing or resolution) comes in 1.5 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let seen = sink.seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|s| s.2),
        "every delivery is signed: {seen:?}"
    );
    let firing: Vec<_> = seen.iter().filter(|s| s.1 == "firing").collect();
    let resolved: Vec<_> = seen.iter().filter(|s| s.1 == "resolved").collect();
    // One firing, one delivery id, tried three times; one resolution, delivered once.
    assert_eq!(firing.len(), 3, "{seen:?}");
    assert!(firing.iter().all(|f| f.0 == firing[0].0));
    assert_eq!(resolved.len(), 1, "{seen:?}");
    assert_ne!(resolved[0].0, firing[0].0);
    let body = &firing[0].3;
    assert_eq!(body["rule"], "flood-denials");
    assert_eq!(body["subject"], "flood");
    assert!(
        body["figures"]["denials_per_second"].as_f64().unwrap() > 5.0,
        "{body}"
    );
    assert!(
        body["link"]
            .as_str()
            .unwrap()
            .ends_with("/history?policy=flood&range=1h"),
        "{body}"
    );
    assert_eq!(resolved[0].3["since_ms"], body["since_ms"]);

    // The API lists the attempts: two retries, then delivered; nothing fires now.
    let view: Value = a
        .client
        .get(a.url("/api/v1/alerts"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let outcomes: Vec<&str> = view["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|d| d["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["retrying", "retrying", "delivered", "delivered"],
        "{view}"
    );
    assert_eq!(view["firing"], json!([]));
    assert_eq!(view["rules"][0]["secret"], "(set)");
}

#[tokio::test]
async fn a_throttled_identifier_fires_for_that_identifier() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, FAST).await;
    let (sink, sink_addr) = start_sink(0).await;
    app.put_policy(
        "login",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 2, "window_ms": 3600000}]}),
    )
    .await;
    let (status, body) = put_alert(
        &app,
        "stuck",
        json!({"condition": {"kind": "identifier_throttled", "policy": "login", "minutes": 1},
            "webhook_url": format!("http://{sink_addr}/hook"), "secret": SECRET}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Denied again and again until both fire (so a minute that turns over between the
    // checks and an evaluation still sees them denied in the current minute).
    eventually(
        "both firings",
        PATIENCE,
        async || {
            app.check(json!({"policy": "login", "identifiers": {"user": "mallory"}}))
                .await;
            app.check(json!({"policy": "login", "identifiers": {"user": "alice"}}))
                .await;
            received(&sink)
        },
        |seen| seen.len() >= 2,
    )
    .await;
    // A negative check: no third firing comes in 600 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen = sink.seen.lock().unwrap().clone();
    let subjects: Vec<&str> = seen
        .iter()
        .map(|s| s.3["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects.len(), 2, "{seen:?}");
    assert!(subjects.contains(&"login|user=mallory") && subjects.contains(&"login|user=alice"));
    let mallory = seen
        .iter()
        .find(|s| s.3["subject"] == "login|user=mallory")
        .unwrap();
    assert!(
        mallory.3["link"]
            .as_str()
            .unwrap()
            .ends_with("/identifiers?id=user%3Dmallory")
    );
}

#[tokio::test]
async fn alert_rules_name_their_bad_field_and_are_audited() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, FAST).await;
    let good = json!({"condition": {"kind": "policy_denials", "policy": "api", "per_second": 1.0, "for_seconds": 60},
        "webhook_url": "https://hooks.example.com/x", "secret": SECRET});
    for (edit, field) in [
        (json!({"secret": "short"}), "secret"),
        (json!({"webhook_url": "file:///etc/passwd"}), "webhook_url"),
        (
            json!({"webhook_url": "http://user:pw@host/"}),
            "webhook_url",
        ),
        (
            json!({"condition": {"kind": "policy_denials", "policy": "api", "per_second": 1.0, "for_seconds": 0}}),
            "condition.for_seconds",
        ),
        (
            json!({"condition": {"kind": "identifier_throttled", "minutes": 9}}),
            "condition.minutes",
        ),
        (json!({"condition": {"kind": "nonsense"}}), "condition"),
        (json!({"surprise": true}), "surprise"),
    ] {
        let mut doc = good.clone();
        for (k, v) in edit.as_object().unwrap() {
            doc[k] = v.clone();
        }
        let (status, body) = put_alert(&app, "r1", doc).await;
        assert_eq!(status, 400, "{field}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}: ")),
            "{field}: {body}"
        );
    }
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("secret");
    let (status, body) = put_alert(&app, "r1", missing).await;
    assert_eq!(
        (
            status,
            body["detail"].as_str().unwrap().starts_with("secret: ")
        ),
        (400, true),
        "{body}"
    );
    let (status, _) = put_alert(&app, "Bad Name", good.clone()).await;
    assert_eq!(status, 400);

    assert_eq!(put_alert(&app, "r1", good.clone()).await.0, 200);
    let delete = |name: &str| {
        app.client
            .delete(app.url(&format!("/api/v1/alerts/{name}")))
            .bearer_auth(ADMIN_KEY)
            .send()
    };
    assert_eq!(delete("r1").await.unwrap().status(), 204);
    assert_eq!(delete("r1").await.unwrap().status(), 404);
    let audit: Value = app
        .client
        .get(app.url("/api/v1/audit?action=alert."))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["alert.delete", "alert.save"], "{audit}");
    assert!(
        !audit.to_string().contains(SECRET),
        "the audit log never holds the secret"
    );
}

#[tokio::test]
async fn one_instance_at_a_time_holds_the_evaluation_lease() {
    use spillway::store::{Keys, Store};
    let redis = RedisServer::start();
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(2), Keys::default())
        .await
        .unwrap();
    assert!(store.take_alert_lease("a", 300).await.unwrap());
    assert!(
        !store.take_alert_lease("b", 300).await.unwrap(),
        "a holds it"
    );
    assert!(
        store.take_alert_lease("a", 300).await.unwrap(),
        "a renews it"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(store.take_alert_lease("a", 300).await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !store.take_alert_lease("b", 300).await.unwrap(),
        "renewed: still a's"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store.take_alert_lease("b", 300).await.unwrap(),
        "a stopped renewing: b takes it"
    );
    assert!(!store.take_alert_lease("a", 300).await.unwrap());
}

/// Redis unreachable (paused: every call times out): the instance whose checks fail sends
/// the `degraded` alert itself (from the rules it read last), once, and its resolution
/// once Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_fires_once_from_memory_and_resolves_when_redis_is_back() {
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_ALERT_EVAL_MS", "200"),
            ("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "127.0.0.1"),
            ("SPILLWAY_REDIS_TIMEOUT_MS", "100"),
        ],
    )
    .await;
    let (sink, sink_addr) = start_sink(0).await;
    app.put_policy(
        "open",
        json!({"failure_mode": "open", "rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000}]}),
    )
    .await;
    let (status, body) = put_alert(
        &app,
        "redis-down",
        json!({"condition": {"kind": "degraded", "seconds": 1},
            "webhook_url": format!("http://{sink_addr}/hook"), "secret": SECRET}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The rule is read (every 200 ms, into the instance's memory: nothing outside the
    // process shows it, so this waits 2.5 evaluation periods).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("ALL")
        .query(&mut redis.connection())
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2500) {
        let r = app
            .check(json!({"policy": "open", "identifiers": {"user": "1"}}))
            .await;
        assert_eq!(r.status(), 200, "failing open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually(
        "the outage's firing",
        PATIENCE,
        async || received(&sink),
        |seen| count(seen, "firing") >= 1,
    )
    .await;
    eventually(
        "the pause's end",
        PATIENCE,
        async || redis.answers(),
        |up| *up,
    )
    .await;
    // Checks that Redis answers again end the outage.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        app.check(json!({"policy": "open", "identifiers": {"user": "1"}}))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually(
        "the resolution",
        PATIENCE,
        async || received(&sink),
        |seen| count(seen, "resolved") >= 1,
    )
    .await;
    // A negative check: nothing more comes in 600 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen = sink.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|s| s.2), "signed: {seen:?}");
    let events: Vec<&str> = seen.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(events, ["firing", "resolved"], "{seen:?}");
    assert!(
        seen[0].3["figures"]["failing_for_seconds"]
            .as_i64()
            .unwrap()
            >= 1
    );
    assert_eq!(seen[0].3["rule"], "redis-down");
}

#[tokio::test]
async fn an_alert_rule_sends_a_signed_test_delivery_on_demand() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "127.0.0.1")]).await;
    let (sink, addr) = start_sink(0).await;
    let (status, _) = put_alert(
        &app,
        "pager",
        json!({"condition": {"kind": "degraded", "seconds": 30},
            "webhook_url": format!("http://{addr}/hook"), "secret": SECRET}),
    )
    .await;
    assert!(status < 300);
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let r = v
        .post_form(
            "/fn/alert_test",
            &[("csrf", &csrf), ("name", "pager")],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200);
    let said: String = r.json().await.unwrap();
    assert_eq!(said, "delivered: the receiver answered 200");
    let seen = sink.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (_, event, signed, body) = &seen[0];
    assert_eq!(event, "test");
    assert!(signed, "signed with the rule's secret");
    assert_eq!(body["rule"], "pager");
    // It is listed with the deliveries.
    let page = v.get("/alerts").await.text().await.unwrap();
    assert!(page.contains("test") && page.contains("delivered"));
}

/// Saves alert rule `name`: an identifier throttled for a minute, delivered to `url`.
async fn put_throttled_alert(app: &TestApp, name: &str, url: &str) -> (u16, Value) {
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

/// Webhooks could target loopback, `[::1]`, `localhost`, decimal IPs and the
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
        let (status, body) = put_throttled_alert(&app, "inside", &url).await;
        assert_eq!(status, 400, "{url}: {body}");
        assert_eq!(body["field"], "webhook_url", "{url}: {body}");
    }
    let (status, _) = put_throttled_alert(
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
        put_throttled_alert(&allowing, "inside", "http://10.0.0.8/hook")
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
    // Nor through the audit log, which every role reads.
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

/// A deleted rule's queued deliveries kept going out, signed with its old secret, for
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
    let (sink, sink_addr) = start_sink(usize::MAX).await;
    let hits = || sink.seen.lock().unwrap().len();
    app.put_policy(
        "alerted",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    let (status, body) =
        put_throttled_alert(&app, "noisy", &format!("http://{sink_addr}/hook")).await;
    assert_eq!(status, 200, "{body}");
    eventually(
        "a first delivery (deliveries so far)",
        PATIENCE,
        async || {
            app.check(json!({"policy": "alerted", "identifiers": {"user": "x"}}))
                .await;
            hits()
        },
        |hits| *hits > 0,
    )
    .await;
    let deleted = app
        .as_admin(Method::DELETE, "/api/v1/alerts/noisy", None)
        .await;
    assert!(deleted.status().is_success());
    // The delivery is cancelled, with its reason in the log.
    eventually(
        "the delivery cancelled (the deliveries listed)",
        PATIENCE,
        async || {
            let view: Value = app
                .as_admin(Method::GET, "/api/v1/alerts", None)
                .await
                .json()
                .await
                .unwrap();
            view["deliveries"].clone()
        },
        |deliveries| {
            deliveries
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["outcome"] == "cancelled" && d["detail"] == "the rule was deleted")
        },
    )
    .await;
    let after = hits();
    // A negative check: past the retry the delivery had been given (2 s after its first
    // attempt), nothing more went out.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(hits(), after, "a delivery went out after the delete");
}
