//! Every identifier accounted for: a dimension no rule counts, sent beside one that is
//! counted, is said (`unused` in the body, `Spillway-Unused`), counted per policy for its
//! page, the overview and the metrics; a strict policy refuses it naming it and what its
//! rules count; and dimensions declared `optional` make an anonymous check a normal one.

use reqwest::StatusCode;
use serde_json::{Value, json};
use spillway::domain::people::Role;

use crate::{
    auth::{Visitor, add_user, store},
    helpers::{PATIENCE, RedisServer, TestApp, eventually, spawn_app_with},
};

/// `per-user` 2 a minute and `per-ip` 100 a minute, strict or not.
fn user_and_ip(strict: bool) -> Value {
    json!({"strict": strict, "rules": [
        {"name": "per-user", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "dimensions": ["user"]},
        {"name": "per-ip", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000, "dimensions": ["ip"]}
    ]})
}

/// One check: its status, its `Spillway-Unused` header and its body.
async fn check(
    app: &TestApp,
    policy: &str,
    identifiers: Value,
) -> (StatusCode, Option<String>, Value) {
    crate::unmatched::check_saying(app, policy, identifiers, "spillway-unused").await
}

#[tokio::test]
async fn a_misspelt_dimension_beside_a_correct_one_is_said_counted_and_shown() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_HISTORY_FLUSH_MS", "200")]).await;
    app.put_policy("typo", user_and_ip(false)).await;
    // `usr` for `user`: four times through (only the address was counted), and said each time.
    for _ in 0..4 {
        let (status, header, body) =
            check(&app, "typo", json!({"ip": "198.51.100.5", "usr": "bob"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(header.as_deref(), Some("\"usr\""));
        assert_eq!(body["unused"], json!(["usr"]), "{body}");
        assert_eq!(body["unmatched"], false, "{body}");
        let rules: Vec<&str> = (body["results"].as_array().unwrap().iter())
            .map(|r| r["rule"].as_str().unwrap())
            .collect();
        assert_eq!(rules, ["per-ip"], "{body}");
    }
    // Named right, nothing is said.
    let (status, header, body) =
        check(&app, "typo", json!({"ip": "198.51.100.5", "user": "bob"})).await;
    assert_eq!((status.as_u16(), header), (200, None), "{body}");
    assert!(body.get("unused").is_none(), "{body}");
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("spillway_unused_dimensions_total")
                && l.contains("policy=\"typo\"")
                && l.ends_with(" 4")),
        "{metrics}"
    );
    // Counted for the policy's page and the overview's status strip (every instance
    // writes once a second).
    add_user(&store(&redis).await, "ada", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "ada").await;
    eventually(
        "the policy's page counting the 4 checks that sent usr",
        PATIENCE,
        async || {
            let detail: Value = (v.post_form("/fn/policy", &[("name", "typo")], None).await)
                .json()
                .await
                .unwrap();
            detail["unused"].clone()
        },
        |unused| *unused == json!([["usr", 4]]),
    )
    .await;
    let page = v.get("/policy?name=typo").await.text().await.unwrap();
    assert!(
        page.contains("4 checks in the last hour sent a dimension no rule counts: usr (4)"),
        "the policy's page names it"
    );
    let overview = v.get("/").await.text().await.unwrap();
    assert!(
        overview.contains(r#"data-testid="status-unused""#),
        "the strip shows it"
    );
    assert!(overview.contains("4 in typo"), "the strip counts it");
    assert!(
        overview.contains("/policy?name=typo#unused"),
        "and links to it"
    );
}

#[tokio::test]
async fn a_strict_policy_refuses_a_dimension_no_rule_counts_and_counts_nothing() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[]).await;
    app.put_policy("strictp", user_and_ip(true)).await;
    let (status, _, body) =
        check(&app, "strictp", json!({"ip": "198.51.100.6", "usr": "bob"})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["type"],
        "https://spillway.dev/problems/unknown-dimensions"
    );
    assert_eq!(body["field"], "identifiers");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(
            "usr is not counted by any rule of strictp, whose rules count ip or user, and user is missing"
        ),
        "{detail}"
    );
    // The refused check counted nothing: the address has all of its 100.
    let (status, _, body) = check(
        &app,
        "strictp",
        json!({"ip": "198.51.100.6", "user": "bob"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let ip = (body["results"].as_array().unwrap().iter())
        .find(|r| r["rule"] == "per-ip")
        .unwrap();
    assert_eq!(ip["remaining"], 99, "{body}");
    // Sent beside every dimension the rules count, one they do not is only said: a caller
    // may pass along what it knows (the ip-only policies of a service that sends user too).
    let (status, header, body) = check(
        &app,
        "strictp",
        json!({"ip": "198.51.100.6", "user": "bob", "team": "x"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header.as_deref(), Some("\"team\""));
    assert_eq!(body["unused"], json!(["team"]), "{body}");
    // Only unknown dimensions: nothing met, said as such.
    let (status, _, body) = check(&app, "strictp", json!({"usr": "bob"})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["type"],
        "https://spillway.dev/problems/unmatched-identifiers"
    );
    // A dimension an override names is the policy's: not refused.
    let r = app
        .as_admin(
            reqwest::Method::POST,
            "/api/v1/policies/strictp/overrides",
            Some(&json!({"match": "team=core", "action": "unlimited", "reason": "ours"})),
        )
        .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let (status, header, body) = check(
        &app,
        "strictp",
        json!({"ip": "198.51.100.6", "team": "core"}),
    )
    .await;
    assert_eq!((status.as_u16(), header), (200, None), "{body}");
    // In shadow mode, said and let through.
    let mut shadow = user_and_ip(true);
    shadow["mode"] = json!("shadow");
    app.put_policy("strictp", shadow).await;
    let (status, header, body) =
        check(&app, "strictp", json!({"ip": "198.51.100.6", "usr": "bob"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header.as_deref(), Some("\"usr\""));
    // Forward-auth, through a proxy: a gate set up wrong is a 500 with the problem in a
    // header (nginx's auth_request would make anything but 2xx, 401 and 403 a 500 anyway).
    let r = app
        .client
        .get(app.url("/api/v1/forward-auth?policy=no-such-policy"))
        .header("X-Spillway-Key", crate::helpers::SERVICE_KEY)
        .header("X-Forwarded-For", "198.51.100.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let said = r.headers()["spillway-problem"].to_str().unwrap().to_owned();
    assert!(
        said.starts_with("unknown-policy; policy: no policy named"),
        "{said}"
    );
}

#[tokio::test]
async fn optional_dimensions_make_an_anonymous_check_a_normal_one() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[]).await;
    let per_user = |optional: Option<Value>| {
        let mut doc = json!({"rules": [
            {"name": "per-user", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000, "dimensions": ["user"]}
        ]});
        if let Some(o) = optional {
            doc["optional"] = o;
        }
        doc
    };
    app.put_policy("members", per_user(None)).await;
    // Strict, and the caller is anonymous: refused, saying how to let it through.
    let (status, _, body) = check(&app, "members", json!({})).await;
    assert_eq!(status, 400, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.starts_with("identifiers: none given"), "{detail}");
    assert!(detail.contains("`optional`"), "{detail}");
    // Declared optional: anonymous passes, uncounted and not unmatched; a member is counted.
    let saved = app
        .put_policy("members", per_user(Some(json!(["user"]))))
        .await;
    assert_eq!(saved["optional"], json!(["user"]), "{saved}");
    assert_eq!(saved["strict"], true, "{saved}");
    for _ in 0..3 {
        let (status, _, body) = check(&app, "members", json!({})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            (&body["unmatched"], &body["results"]),
            (&json!(false), &json!([]))
        );
    }
    let (status, ..) = check(&app, "members", json!({"user": "ann"})).await;
    assert_eq!(status, 200);
    let (status, ..) = check(&app, "members", json!({"user": "ann"})).await;
    assert_eq!(status, 429, "a member is still limited");
    // A typo is still refused: optional is about what is left out, not misspelt.
    let (status, _, body) = check(&app, "members", json!({"usr": "ann"})).await;
    assert_eq!(status, 400, "{body}");
    // A name no rule counts cannot be optional; the field is named.
    let r = app
        .as_admin(
            reqwest::Method::PUT,
            "/api/v1/policies/members",
            Some(&per_user(Some(json!(["usr"])))),
        )
        .await;
    assert_eq!(r.status(), 400);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "optional[0]", "{problem}");
    // The editor keeps it: saved from the dashboard's form, and a bad one named there.
    add_user(&store(&redis).await, "ada", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "ada").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let form = |optional: &'static str, version: &'static str| {
        vec![
            ("name", "members"),
            ("version", version),
            ("strict", "on"),
            ("optional", optional),
            ("rules[0][name]", "per-user"),
            ("rules[0][algorithm]", "fixed_window"),
            ("rules[0][limit]", "1"),
            ("rules[0][window_ms]", "1"),
            ("rules[0][window_unit]", "min"),
            ("rules[0][dimensions]", "user"),
            ("rules[0][cost]", "request"),
        ]
    };
    let mut bad = form("usr", "2");
    bad.push(("csrf", &csrf));
    let r = v.post_form("/fn/policy_save", &bad, Some(&origin)).await;
    let said = r.text().await.unwrap();
    assert!(said.contains("optional") && said.contains("usr"), "{said}");
    let mut good = form("user", "2");
    good.push(("csrf", &csrf));
    let r = v.post_form("/fn/policy_save", &good, Some(&origin)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let doc: Value = (app.as_admin(reqwest::Method::GET, "/api/v1/policies/members", None))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&doc["version"], &doc["optional"]),
        (&json!(3), &json!(["user"])),
        "{doc}"
    );
    let page = v.get("/policy?name=members").await.text().await.unwrap();
    assert!(
        page.contains(r#"name="optional" value="user""#),
        "the editor shows it"
    );
}
