//! No silent allow (issue 38): a check whose identifiers meet no rule says so (`unmatched`
//! in the body, `Spillway-Unmatched: ?1`), a strict policy refuses it with a 400 naming the
//! dimensions its rules count, new policies are strict, and a policy stored before there
//! was the choice keeps answering as it did.

use reqwest::StatusCode;
use serde_json::{Value, json};
use spillway::domain::{Policy, people::Role};

use crate::{
    auth::{Visitor, add_user, store},
    helpers::{PATIENCE, RedisServer, TestApp, eventually, spawn_app, spawn_app_with},
};

fn per_user_and_ip(strict: Option<bool>) -> Value {
    let mut doc = json!({"rules": [
        {"name": "per-user", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "dimensions": ["user"]},
        {"name": "per-ip", "algorithm": "fixed_window", "limit": 50, "window_ms": 60000, "dimensions": ["ip"]}
    ]});
    if let Some(strict) = strict {
        doc["strict"] = json!(strict);
    }
    doc
}

async fn check(
    app: &TestApp,
    policy: &str,
    identifiers: Value,
) -> (StatusCode, Option<String>, Value) {
    check_saying(app, policy, identifiers, "spillway-unmatched").await
}

/// One check: its status, its header `header` and its body.
pub(crate) async fn check_saying(
    app: &TestApp,
    policy: &str,
    identifiers: Value,
    header: &str,
) -> (StatusCode, Option<String>, Value) {
    let r = app
        .check(json!({"policy": policy, "identifiers": identifiers}))
        .await;
    let status = r.status();
    let said = r
        .headers()
        .get(header)
        .map(|v| v.to_str().unwrap().to_owned());
    (status, said, r.json().await.unwrap())
}

#[tokio::test]
async fn a_check_no_rule_meets_is_said_unmatched_never_allowed_by_a_limit() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("lenient", per_user_and_ip(Some(false)))
        .await;
    // `userid` for `user`: nothing is counted, and the answer says so.
    let (status, header, body) = check(&app, "lenient", json!({"userid": "42"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header.as_deref(), Some("?1"));
    assert_eq!(body["unmatched"], true, "{body}");
    assert_eq!(body["results"], json!([]));
    assert!(body["limit"].is_null());
    // A check a rule meets is not.
    let (status, header, body) =
        check(&app, "lenient", json!({"user": "42", "device": "d1"})).await;
    assert_eq!(status, 200);
    assert_eq!(header, None);
    assert_eq!(body["unmatched"], false, "{body}");
    assert_eq!(body["results"].as_array().unwrap().len(), 1);
    // An identifier an override exempts is met (by the override): not unmatched.
    let r = app
        .as_admin(
            reqwest::Method::POST,
            "/api/v1/policies/lenient/overrides",
            Some(&json!({"match": "user=vip", "action": "unlimited", "reason": "partner"})),
        )
        .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let (_, header, body) = check(&app, "lenient", json!({"user": "vip"})).await;
    assert_eq!(
        (header, &body["unmatched"]),
        (None, &json!(false)),
        "{body}"
    );
}

#[tokio::test]
async fn a_new_policy_is_strict_and_refuses_naming_the_dimensions_it_counts() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let saved = app.put_policy("fresh", per_user_and_ip(None)).await;
    assert_eq!(saved["strict"], true, "{saved}");
    let (status, header, body) = check(&app, "fresh", json!({"userid": "42"})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(header, None);
    assert_eq!(
        body["type"],
        "https://spillway.dev/problems/unmatched-identifiers"
    );
    assert_eq!(body["field"], "identifiers");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("userid match no rule of fresh"), "{detail}");
    assert!(detail.contains("count ip or user"), "{detail}");
    // In a batch, that check alone is refused.
    let (_, batch) = app
        .post_as_service(
            "/api/v1/check/batch",
            json!({"checks": [
                {"policy": "fresh", "identifiers": {"user": "42"}},
                {"policy": "fresh", "identifiers": {"usr": "42"}}
            ]}),
        )
        .await;
    assert_eq!(batch["results"][0]["status"], 200, "{batch}");
    assert_eq!(batch["results"][1]["status"], 400, "{batch}");
    assert_eq!(batch["results"][1]["body"]["field"], "identifiers");
    // A PUT that does not say keeps what the policy is; one that says changes it.
    let again = app.put_policy("fresh", per_user_and_ip(None)).await;
    assert_eq!(again["strict"], true);
    let relaxed = app.put_policy("fresh", per_user_and_ip(Some(false))).await;
    assert_eq!(relaxed["strict"], false);
    let kept = app.put_policy("fresh", per_user_and_ip(None)).await;
    assert_eq!(kept["strict"], false, "{kept}");
    let (status, _, body) = check(&app, "fresh", json!({"userid": "42"})).await;
    assert_eq!((status.as_u16(), &body["unmatched"]), (200, &json!(true)));
    // Shadow mode never refuses: a strict policy in shadow answers 200, unmatched.
    let mut shadow = per_user_and_ip(Some(true));
    shadow["mode"] = json!("shadow");
    app.put_policy("fresh", shadow).await;
    let (status, header, body) = check(&app, "fresh", json!({"userid": "42"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (header.as_deref(), &body["unmatched"]),
        (Some("?1"), &json!(true))
    );
    // Not true or false: refused, naming the field.
    let r = app
        .as_admin(
            reqwest::Method::PUT,
            "/api/v1/policies/fresh",
            Some(&json!({"strict": "yes", "rules": per_user_and_ip(None)["rules"]})),
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "strict");
}

/// A policy stored before there was the choice (its document has no `strict`) stays lenient
/// through saves that do not say, so no caller starts failing on an upgrade.
#[tokio::test]
async fn a_policy_stored_before_the_choice_keeps_answering_and_counts_its_unmatched() {
    let redis = RedisServer::start();
    let old = Policy::from_document("older", &per_user_and_ip(None)).unwrap();
    assert_eq!(old.strict, None);
    store(&redis)
        .await
        .save_policy(&old, Some(0))
        .await
        .unwrap();
    let app = spawn_app_with(&redis, &[("SPILLWAY_HISTORY_FLUSH_MS", "200")]).await;
    for _ in 0..3 {
        let (status, _, body) = check(&app, "older", json!({"customer": "acme"})).await;
        assert_eq!((status.as_u16(), &body["unmatched"]), (200, &json!(true)));
    }
    let saved = app.put_policy("older", per_user_and_ip(None)).await;
    assert_eq!(saved["strict"], false, "{saved}");
    // The history counts them, and the metrics label them.
    eventually(
        "the history counting the 3 unmatched",
        PATIENCE,
        async || {
            let history: Value = app
                .as_admin(
                    reqwest::Method::GET,
                    "/api/v1/history?policy=older&range=1h",
                    None,
                )
                .await
                .json()
                .await
                .unwrap();
            history["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["unmatched"].as_u64().unwrap_or(0))
                .sum::<u64>()
        },
        |unmatched| *unmatched == 3,
    )
    .await;
    let metrics = app.metrics().await;
    assert!(
        metrics.lines().any(|l| l.contains("policy=\"older\"")
            && l.contains("outcome=\"unmatched\"")
            && l.ends_with(" 3")),
        "{metrics}"
    );
}

/// The editor says whether a policy is strict, keeps a rule's cost model, and the policy
/// list shows how many checks matched no rule in the last hour.
#[tokio::test]
async fn the_dashboard_edits_strictness_and_shows_the_unmatched() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_HISTORY_FLUSH_MS", "200")]).await;
    add_user(&store(&redis).await, "ada", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "ada").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let save = |strict: &'static str| {
        vec![
            ("name", "edited"),
            ("version", "0"),
            ("strict", strict),
            ("rules[0][name]", "per-user"),
            ("rules[0][algorithm]", "fixed_window"),
            ("rules[0][limit]", "5"),
            ("rules[0][window_ms]", "1"),
            ("rules[0][window_unit]", "min"),
            ("rules[0][dimensions]", "user"),
            ("rules[0][cost]", "request"),
        ]
    };
    let mut form = save("on");
    form.push(("csrf", &csrf));
    let r = v.post_form("/fn/policy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let doc: Value = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/edited", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(doc["strict"], true, "{doc}");
    assert_eq!(doc["rules"][0]["cost"], "request", "{doc}");
    // Unticked: lenient, and the checks that match nothing are counted for the list.
    let mut form = save("");
    form[1] = ("version", "1");
    form.push(("csrf", &csrf));
    let r = v.post_form("/fn/policy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for _ in 0..2 {
        let (status, _, body) = check(&app, "edited", json!({"account": "7"})).await;
        assert_eq!(
            (status.as_u16(), &body["unmatched"]),
            (200, &json!(true)),
            "{body}"
        );
    }
    eventually(
        "the policy list's row counting 2 unmatched in the last hour",
        PATIENCE,
        async || {
            let list: Value = v
                .post_form("/fn/policies", &[], None)
                .await
                .json()
                .await
                .unwrap();
            list.as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "edited")
                .cloned()
                .unwrap()
        },
        |row| row["last_hour"][2] == 2,
    )
    .await;
    let page = v.get("/policies").await.text().await.unwrap();
    assert!(page.contains("2 matched no rule"), "the list shows them");
    let page = v.get("/policy?name=edited").await.text().await.unwrap();
    assert!(page.contains(r#"name="strict""#));
}
