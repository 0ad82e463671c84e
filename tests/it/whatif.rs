//! What if: checks recorded by two instances, replayed in the reference model. The policy in
//! force reproduces every recorded decision (for each algorithm, costs above 1, a penalty
//! box, a weighted rule); a draft that halves a limit names the one heavy user and the exact
//! number of checks it would newly deny; bad drafts are 400s naming the field.

use serde_json::{Value, json};

use crate::cli::spillway;
use crate::helpers::{PATIENCE, RedisServer, TestApp, eventually, spawn_app};

/// `POST /api/v1/policies/{policy}/what-if` with `body`: the status and the answer.
async fn what_if(app: &TestApp, policy: &str, body: Value) -> (u16, Value) {
    let path = format!("/api/v1/policies/{policy}/what-if");
    let r = app
        .as_admin(reqwest::Method::POST, &path, Some(&body))
        .await;
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The replay of `body` once the record holds `checks` checks (instances write it about
/// once a second).
async fn replayed(app: &TestApp, policy: &str, body: Value, checks: u64) -> Value {
    eventually(
        "every check recorded",
        PATIENCE,
        async || what_if(app, policy, body.clone()).await,
        |(status, answer)| *status == 200 && answer["checks"] == checks,
    )
    .await
    .1
}

fn window(name: &str, limit: u64) -> Value {
    json!({"name": name, "algorithm": "fixed_window", "limit": limit, "window_ms": 3_600_000})
}

#[tokio::test]
async fn the_rules_in_force_reproduce_every_recorded_decision_of_two_instances() {
    let redis = RedisServer::start();
    let (a, b) = (spawn_app(&redis).await, spawn_app(&redis).await);
    let rules = [
        json!([window("w", 7)]),
        json!([{"name": "sw", "algorithm": "sliding_window", "limit": 6, "window_ms": 2000}]),
        json!([{"name": "sl", "algorithm": "sliding_log", "limit": 5, "window_ms": 1500}]),
        json!([{"name": "tb", "algorithm": "token_bucket", "capacity": 6, "refill_tokens": 1, "refill_period_ms": 100}]),
        json!([{"name": "lb", "algorithm": "leaky_bucket", "capacity": 5, "leak_tokens": 1, "leak_period_ms": 150}]),
        json!([{"name": "gc", "algorithm": "gcra", "rate": 5, "period_ms": 1000, "burst": 3}]),
        json!([{"name": "bw", "algorithm": "bucketed_window", "limit": 6, "window_ms": 2000, "bucket_ms": 500}]),
        // Two rules, a penalty box, a rule that counts requests and one that counts double.
        json!([
            {"name": "boxed", "algorithm": "fixed_window", "limit": 9, "window_ms": 1000, "block_ms": 700},
            {"name": "requests", "algorithm": "fixed_window", "limit": 6, "window_ms": 3600000, "cost": "request"},
            {"name": "double", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 2, "refill_period_ms": 100, "cost": 2}
        ]),
    ];
    for (i, rules) in rules.iter().enumerate() {
        let policy = format!("wi-{i}");
        a.put_policy(&policy, json!({ "rules": rules })).await;
        // The second instance answers for it once it has read it.
        eventually(
            "the second instance knowing the policy",
            PATIENCE,
            async || {
                b.check(json!({"policy": policy, "identifiers": {"user": "warm"}, "cost": 0}))
                    .await
                    .status()
            },
            |s| s.as_u16() == 200,
        )
        .await;
        let mut made = 0;
        let mut denied = 0;
        for n in 0..60u64 {
            let app = if n % 2 == 0 { &a } else { &b };
            let user = ["ann", "bob", "cy"][(n % 3) as usize];
            let cost = 1 + n % 3;
            let r = app
                .check(json!({"policy": policy, "identifiers": {"user": user}, "cost": cost}))
                .await;
            let status = r.status().as_u16();
            assert!(
                status == 200 || status == 429,
                "{status}: {}",
                r.text().await.unwrap()
            );
            made += 1;
            denied += u64::from(status == 429);
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(
            denied > 0 && denied < made,
            "{policy}: {denied} of {made} denied, a test of nothing"
        );
        let answer = replayed(&a, &policy, json!({}), made).await;
        assert_eq!(answer["denied_then"], denied, "{policy}: {answer}");
        assert_eq!(
            (
                answer["newly_denied"].as_u64(),
                answer["newly_allowed"].as_u64()
            ),
            (Some(0), Some(0)),
            "{policy}: the replay differs from what happened: {answer}"
        );
        assert_eq!(answer["complete"], true);
    }
}

/// An hour of traffic in a few seconds: twelve light users and one heavy one, all allowed
/// under 10 an hour. Halving the limit would deny the heavy user's last five checks and no
/// one else's; the answer says so, and the editor's draft errors name their field.
#[tokio::test]
async fn a_halved_limit_names_the_heavy_user_and_the_exact_count() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("wi-api", json!({"rules": [window("per-hour", 10)]}))
        .await;
    let mut made = 0;
    for round in 0..10 {
        for light in 0..12 {
            if round < 4 {
                let r = app
                    .check(json!({"policy": "wi-api", "identifiers": {"user": format!("light-{light}")}}))
                    .await;
                assert_eq!(r.status(), 200);
                made += 1;
            }
        }
        let r = app
            .check(json!({"policy": "wi-api", "identifiers": {"user": "heavy"}}))
            .await;
        assert_eq!(r.status(), 200);
        made += 1;
    }
    let halved = json!({"policy": {"rules": [window("per-hour", 5)]}, "last_ms": 3_600_000});
    let answer = replayed(&app, "wi-api", halved, made).await;
    assert_eq!(answer["newly_denied"], 5, "{answer}");
    assert_eq!(
        answer["newly_throttled"],
        json!([{"identifier": "user=heavy", "checks": 5}])
    );
    assert_eq!(
        answer["denied_by_rule"],
        json!([{"identifier": "per-hour", "checks": 5}])
    );
    assert_eq!(answer["peak_minute"]["denied"], 5);
    // The suggestion for the top one: the busiest light user's count, 4, throttles only the
    // heavy user (10 in the hour), and its replay denies exactly the heavy user's 6 over it.
    let suggested: Value = app
        .as_admin(
            reqwest::Method::GET,
            "/api/v1/policies/wi-api/suggestions?rule=per-hour",
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        suggested["limits"][0],
        json!({"top": 1, "limit": 4, "throttled": ["user=heavy"], "newly_denied": 6}),
        "{suggested}"
    );
    assert_eq!(
        (suggested["identifiers"].as_u64(), suggested["max"].as_u64()),
        (Some(13), Some(10))
    );
    let r = app
        .as_admin(
            reqwest::Method::GET,
            "/api/v1/policies/wi-api/suggestions?rule=nope",
            None,
        )
        .await;
    assert_eq!(r.status(), 400);
    // The draft's mistakes are the caller's, named under `policy`.
    let (status, problem) = what_if(
        &app,
        "wi-api",
        json!({"policy": {"rules": [window("per-hour", 0)]}}),
    )
    .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (400, Some("policy.rules[0].limit")),
        "{problem}"
    );
    let (status, problem) = what_if(&app, "wi-api", json!({"last_ms": 0})).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (400, Some("last_ms")),
        "{problem}"
    );
    let (status, problem) = what_if(&app, "wi-api", json!({"polcy": {}})).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (400, Some("polcy")),
        "{problem}"
    );
    let (status, _) = what_if(&app, "nope", json!({})).await;
    assert_eq!(status, 404);
    // Audited: who asked, of which policy.
    let audit: Value = app
        .as_admin(
            reqwest::Method::GET,
            "/api/v1/audit?action=policy.what-if",
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(audit["entries"][0]["target"], "wi-api", "{audit}");
}

/// The record's size: 100,000 checks of two identifiers each (a user of 5,000 and an
/// address) stay 100,000 entries (the newest), in at most the bytes README states.
#[tokio::test]
async fn a_full_record_keeps_its_newest_checks_within_its_stated_size() {
    use spillway::domain::{Identifier, whatif::Recorded};
    use spillway::store::{Keys, Store};
    let redis = RedisServer::start();
    let store = Store::connect_with_keys(
        &redis.url(),
        std::time::Duration::from_secs(5),
        Keys::default(),
    )
    .await
    .unwrap();
    let start_us = spillway::support::clock::now_us() - 3_600_000_000;
    let max = 100_000u64;
    for batch in 0..12i64 {
        let checks: Vec<Recorded> = (0..10_000i64)
            .map(|i| {
                let n = batch * 10_000 + i;
                Recorded {
                    at_us: start_us + n * 1000,
                    cost: 1,
                    allowed: n % 7 != 0,
                    identifiers: vec![
                        Identifier::new("user", &format!("user-{}", n % 5000)).unwrap(),
                        Identifier::new("ip", &format!("10.0.{}.{}", (n / 250) % 250, n % 250))
                            .unwrap(),
                    ],
                    ..Recorded::default()
                }
            })
            .collect();
        store
            .record_checks("sized", &checks, 10_000, max)
            .await
            .unwrap();
    }
    let mut conn = redis.connection();
    let key = Keys::default().record("sized");
    let len: u64 = redis::cmd("XLEN").arg(&key).query(&mut conn).unwrap();
    assert!((max..max + 1000).contains(&len), "{len} entries kept");
    let bytes: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .arg("SAMPLES")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    println!("record of {len} checks: {bytes} bytes");
    assert!(bytes <= 8 * 1024 * 1024, "{bytes} bytes for {len} checks");
    // The newest are kept: the oldest left is from the third batch on.
    let read = store.recorded_checks("sized", 0, 200_000).await.unwrap();
    assert_eq!(read.len() as u64, len);
    assert!(read[0].at_us >= start_us + 19_000 * 1000, "{:?}", read[0]);
    assert_eq!(read.last().unwrap().at_us, start_us + 119_999 * 1000);
}

/// A draft that does not list overrides replays under the ones in force (a blocked user
/// stays blocked); one that lists none frees them; a stored version replays as a rollback
/// would make it; an Envoy domain refuses a draft of plain rules, naming the field.
#[tokio::test]
async fn a_draft_keeps_the_overrides_in_force_and_a_version_replays_as_a_rollback() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("wi-ov", json!({"rules": [window("per-hour", 3)]}))
        .await;
    app.put_policy("wi-ov", json!({"rules": [window("per-hour", 6)]}))
        .await;
    let block = json!({"match": "user=banned", "action": "block"});
    let r = app
        .as_admin(
            reqwest::Method::POST,
            "/api/v1/policies/wi-ov/overrides",
            Some(&block),
        )
        .await;
    assert_eq!(r.status(), 201);
    for (user, n, status) in [("banned", 2, 429), ("ann", 5, 200)] {
        for _ in 0..n {
            let r = app
                .check(json!({"policy": "wi-ov", "identifiers": {"user": user}}))
                .await;
            assert_eq!(r.status().as_u16(), status, "{user}");
        }
    }
    let now = replayed(&app, "wi-ov", json!({}), 7).await;
    assert_eq!(
        (&now["newly_denied"], &now["newly_allowed"]),
        (&json!(0), &json!(0))
    );
    let draft = json!({"rules": [window("per-hour", 6)]});
    let (status, kept) = what_if(&app, "wi-ov", json!({ "policy": draft })).await;
    assert_eq!((status, &kept["newly_allowed"]), (200, &json!(0)), "{kept}");
    let mut bare = draft.clone();
    bare["overrides"] = json!([]);
    let (_, freed) = what_if(&app, "wi-ov", json!({ "policy": bare })).await;
    assert_eq!(freed["newly_allowed"], 2, "{freed}");
    assert_eq!(freed["newly_freed"][0]["identifier"], "user=banned");
    let (status, back) = what_if(&app, "wi-ov", json!({"version": 1})).await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(
        (&back["newly_denied"], &back["newly_allowed"]),
        (&json!(2), &json!(0)),
        "version 1 (3 an hour) denies ann's 4th and 5th; banned stays blocked: {back}"
    );
    for (body, field) in [
        (json!({"version": 9}), "version"),
        (json!({"version": 1, "policy": draft}), "version"),
    ] {
        let (status, problem) = what_if(&app, "wi-ov", body).await;
        assert_eq!((status, problem["field"].as_str()), (400, Some(field)));
    }
    crate::envoy::load(
        &app,
        "wi-edge",
        "domain: wi-edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .await;
    let (status, problem) = what_if(&app, "wi-edge", json!({ "policy": draft })).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (400, Some("policy")),
        "{problem}"
    );
}

/// A busy policy's record samples whole identifiers: with room for 1,000,000 checks, 200 to
/// 400 in ten seconds is 1.7M to 3.5M a day, so the instances record the checks of one user
/// in 2 or more from then on; the rules in force replayed over the sample still reproduce every kept
/// decision, the counts scaled by the sample's rate. `record: off` records none.
#[tokio::test]
async fn a_busy_policy_records_a_sample_of_whole_identifiers() {
    let redis = RedisServer::start();
    let app =
        crate::helpers::spawn_app_with(&redis, &[("SPILLWAY_RECORD_CHECKS", "1000000")]).await;
    let per_user = json!({"name": "per-user", "algorithm": "fixed_window", "limit": 3, "window_ms": 3_600_000, "dimensions": ["user"]});
    app.put_policy("wi-busy", json!({ "rules": [per_user] }))
        .await;
    app.put_policy("wi-off", json!({"record": "off", "rules": [per_user]}))
        .await;
    let send = async || {
        for u in 0..200 {
            for policy in ["wi-busy", "wi-off"] {
                let r = app
                    .check(json!({"policy": policy, "identifiers": {"user": format!("u{u}"), "ip": "192.0.2.1"}}))
                    .await;
                assert!([200, 429].contains(&r.status().as_u16()));
            }
        }
    };
    // Checks go on until the instances sample (the ten seconds after a full one), however
    // fast this machine sends them.
    let answer = eventually(
        "a sampled replay",
        std::time::Duration::from_secs(60),
        async || {
            send().await;
            what_if(&app, "wi-busy", json!({})).await
        },
        |(status, answer)| *status == 200 && answer["one_in"].as_u64() > Some(1),
    )
    .await
    .1;
    assert_eq!(
        (&answer["newly_denied"], &answer["newly_allowed"]),
        (&json!(0), &json!(0)),
        "{answer}"
    );
    assert!(answer["denied_then"].as_u64() > Some(0), "{answer}");
    let mut conn = redis.connection();
    let off: u64 = redis::cmd("EXISTS")
        .arg(spillway::store::Keys::default().record("wi-off"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(off, 0, "record: off records nothing");
}

/// `spillway policy plan` in a pipeline: a file that halves a limit names the rule it
/// changes and the heavy user it would throttle, and exits 3; the file of the rules in force
/// exits 0. `spillway policy test` checks cases offline, and exits 1 naming a wrong one.
#[tokio::test]
async fn a_plan_exits_3_when_a_file_would_deny_what_was_let_through() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("wi-plan", json!({"rules": [window("per-hour", 4)]}))
        .await;
    for who in ["heavy", "heavy", "heavy", "heavy", "light"] {
        let r = app
            .check(json!({"policy": "wi-plan", "identifiers": {"user": who}}))
            .await;
        assert_eq!(r.status(), 200);
    }
    replayed(&app, "wi-plan", json!({}), 5).await;
    let dir = std::env::temp_dir().join(format!("spillway-plan-{}", redis.port));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, limit: u64| {
        let path = dir.join(name);
        let doc = json!({"policies": {"wi-plan": {"rules": [window("per-hour", limit)]}}});
        std::fs::write(&path, doc.to_string()).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let halved = spillway(
        &redis,
        &["policy", "plan", &file("halved.json", 2), "--last", "1h"],
    );
    let said = String::from_utf8_lossy(&halved.stdout);
    assert_eq!(
        halved.status.code(),
        Some(3),
        "{said}{}",
        String::from_utf8_lossy(&halved.stderr)
    );
    assert!(said.contains("rules.per-hour:"), "{said}");
    assert!(said.contains("2 newly denied"), "{said}");
    assert!(
        said.contains("newly throttled: user=heavy (2 checks)"),
        "{said}"
    );
    let same = spillway(&redis, &["policy", "plan", &file("same.json", 4)]);
    assert_eq!(same.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&same.stdout).contains("wi-plan: unchanged"));
    // Offline: no Redis is asked (the address given is closed).
    let cases = dir.join("cases.toml");
    std::fs::write(
        &cases,
        r#"
[[cases]]
name = "two an hour, then denied"
policy = "wi-plan"
checks = [
  { identifiers = { user = "ann" }, expect = "allowed" },
  { identifiers = { user = "ann" }, expect = "allowed" },
  { identifiers = { user = "ann" }, expect = "denied", rule = "per-hour" },
  { identifiers = { user = "ann" }, at_ms = 3600000, expect = "allowed" },
]
"#,
    )
    .unwrap();
    let tested = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args([
            "policy",
            "test",
            &file("halved.json", 2),
            cases.to_str().unwrap(),
        ])
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    assert!(
        tested.status.success(),
        "{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    assert!(
        String::from_utf8_lossy(&tested.stdout).contains("ok: two an hour, then denied (4 checks)")
    );
    let wrong = spillway(
        &redis,
        &[
            "policy",
            "test",
            &file("same.json", 4),
            cases.to_str().unwrap(),
        ],
    );
    assert_eq!(wrong.status.code(), Some(1));
    let why = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        why.contains("checks[2] at 0 ms: expected denied by per-hour, got allowed"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A policy's own budget: `record_checks: 100` samples where the server's 100,000 records
/// every check of the same traffic; a budget out of range is refused naming the field.
#[tokio::test]
async fn a_policys_own_budget_samples_sooner() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let per_user = json!({"name": "per-user", "algorithm": "fixed_window", "limit": 5, "window_ms": 3_600_000, "dimensions": ["user"]});
    app.put_policy("wi-big", json!({ "rules": [per_user] }))
        .await;
    app.put_policy(
        "wi-small",
        json!({"record_checks": 100, "rules": [per_user]}),
    )
    .await;
    for u in 0..300 {
        for policy in ["wi-big", "wi-small"] {
            let r = app
                .check(json!({"policy": policy, "identifiers": {"user": format!("u{u}")}}))
                .await;
            assert_eq!(r.status().as_u16(), 200);
        }
    }
    let big = replayed(&app, "wi-big", json!({}), 300).await;
    assert_eq!(big["one_in"], 1, "{big}");
    let small = eventually(
        "the small record written",
        PATIENCE,
        async || what_if(&app, "wi-small", json!({})).await,
        |(status, answer)| *status == 200 && answer["one_in"].as_u64() > Some(1),
    )
    .await
    .1;
    assert_eq!(
        (&small["newly_denied"], &small["newly_allowed"]),
        (&json!(0), &json!(0)),
        "{small}"
    );
    let mut conn = redis.connection();
    let kept: u64 = redis::cmd("XLEN")
        .arg(spillway::store::Keys::default().record("wi-small"))
        .query(&mut conn)
        .unwrap();
    assert!(kept < 300, "{kept} of 300 checks kept with room for 100");
    let r = app
        .as_admin(
            reqwest::Method::PUT,
            "/api/v1/policies/wi-small",
            Some(&json!({"record_checks": 0, "rules": [per_user]})),
        )
        .await;
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "record_checks", "{problem}");
}
