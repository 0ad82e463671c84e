//! The identifier inspector: who is blocked now and why (bob, through the address he was
//! checked with), a bare value that could be several identifiers, resets of what blocks
//! and their undo (counters back with the time each had left, once; never leases), a
//! value reset exactly as given, and a limit of one identifier's own given by support.

use std::time::Duration;

use reqwest::{StatusCode, header};
use serde_json::{Value, json};
use spillway::domain::{
    inspection::{Inspection, Verdict},
    people::Role,
};

use crate::{
    auth::{Visitor, add_user, admin, store},
    helpers::{PATIENCE, RedisServer, TestApp, clear_of_window_turn, eventually, spawn_app},
};

/// The inspector's answer to what support typed (`bob`, `user=bob`).
pub(crate) async fn inspect(v: &mut Visitor, id: &str) -> Inspection {
    let r = v.post_form("/fn/inspect", &[("id", id)], None).await;
    r.json().await.unwrap()
}

#[tokio::test]
async fn bob_is_blocked_through_his_address_and_one_reset_frees_both() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "shop",
        json!({"rules": [
            {"name": "per-ip", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000, "dimensions": ["ip"]},
            {"name": "per-user", "algorithm": "fixed_window", "limit": 100, "window_ms": 3600000, "dimensions": ["user"]}
        ]}),
    )
    .await;
    clear_of_window_turn(Duration::from_secs(3600)).await;
    for _ in 0..2 {
        app.check(json!({"policy": "shop", "identifiers": {"user": "bob", "ip": "203.0.113.11"}}))
            .await;
    }
    let mut v = admin(&app, &redis).await;
    // Support types what bob said: "bob".
    let inspection: Inspection = eventually(
        "bob's companions",
        PATIENCE,
        async || inspect(&mut v, "bob").await,
        |i| !i.companions.is_empty(),
    )
    .await;
    assert_eq!(inspection.identifier, "user=bob");
    assert_eq!(inspection.typed.as_deref(), Some("bob"));
    assert_eq!(inspection.companions[0].identifier, "ip=203.0.113.11");
    match inspection.verdict() {
        Verdict::Blocked {
            policy,
            rule,
            identifier,
            passes_in_ms,
            penalty_ms: None,
        } => {
            assert_eq!((policy.as_str(), rule.as_str()), ("shop", "per-ip"));
            assert_eq!(identifier, "ip=203.0.113.11");
            assert!(passes_in_ms.is_some_and(|ms| ms <= 3_600_000));
        }
        other => panic!("bob is blocked through his address: {other:?}"),
    }
    let page = v.get("/identifiers?id=bob").await.text().await.unwrap();
    assert!(page.contains("Blocked now"), "the verdict comes first");
    assert!(page.contains("by shop › per-ip on ip=203.0.113.11 (checked together with user=bob)"));
    // The reset's default is what blocks when the button is pressed; the rule is offered too.
    assert!(
        page.contains(r#"<option value="now" selected"#)
            && page.contains(r#"<option value="shop/per-ip ip=203.0.113.11""#),
        "{}",
        &page[page.find("name=\"what\"").unwrap_or(0)..][..600.min(page.len())]
    );

    // One action resets bob and the address he was checked with. Without JavaScript, the
    // page comes back to the address saying what went, with the undo.
    let csrf = v.csrf().await;
    let origin = v.origin();
    let form = [
        ("csrf", csrf.as_str()),
        ("id", "bob"),
        ("what", "* user=bob\n* ip=203.0.113.11"),
        ("reason", "ticket 4711"),
    ];
    let no_js = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_js
        .post(app.url("/fn/reset"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, &origin)
        .header(header::ACCEPT, "text/html,application/xhtml+xml")
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    let back = r
        .headers()
        .get(header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        back.starts_with("/identifiers?id=bob&reset=2&what=") && back.contains("&undo="),
        "{back}"
    );
    let page = v.get(&back).await.text().await.unwrap();
    assert!(
        page.contains(
            "Reset done (everything of user=bob, everything of ip=203.0.113.11): 2 keys deleted."
        ),
        "{page}"
    );
    assert!(page.contains("Undo (for a minute)"));
    let r = v
        .post_form("/fn/inspect", &[("id", "user=bob")], None)
        .await;
    let after: Inspection = r.json().await.unwrap();
    assert!(
        matches!(after.verdict(), Verdict::NotBlocked { .. }),
        "{:?}",
        after.verdict()
    );
    // A hydrated page is answered where it is: what went, and the undo's token.
    let r = v.post_form("/fn/reset", &form, Some(&origin)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get(header::LOCATION).is_none());
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["deleted"], 0, "nothing left to delete: {answer}");
    assert!(answer["undo"].is_null());
    let token = back.rsplit_once("undo=").unwrap().1.to_owned();
    // Undo: bob is blocked through his address again, as before the reset; once only.
    let undo = [
        ("csrf", csrf.as_str()),
        ("id", "user=bob"),
        ("token", token.as_str()),
    ];
    let r = v.post_form("/fn/reset_undo", &undo, Some(&origin)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(r.json::<u64>().await.unwrap(), 2);
    let r = v
        .post_form("/fn/inspect", &[("id", "user=bob")], None)
        .await;
    let undone: Inspection = r.json().await.unwrap();
    assert!(
        matches!(undone.verdict(), Verdict::Blocked { .. }),
        "{:?}",
        undone.verdict()
    );
    let r = v.post_form("/fn/reset_undo", &undo, Some(&origin)).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("no reset to undo"));
    let r = v.post_form("/fn/reset", &form, Some(&origin)).await;
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["deleted"], 2, "{answer}");
    assert!(answer["undo"].is_string());
    // With no state left, "bob" is still bob (from recent traffic), not blocked.
    let again: Inspection = eventually(
        "bob in the recent traffic",
        PATIENCE,
        async || inspect(&mut v, "bob").await,
        |i| i.identifier == "user=bob",
    )
    .await;
    assert!(matches!(again.verdict(), Verdict::NotBlocked { .. }));
}

/// A reset's counters are kept for a minute: the undo puts them back with the time each had
/// left, once, and says so in the audit log.
#[tokio::test]
async fn a_reset_is_undone_with_its_counters_and_their_time_left() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "undoable",
        json!({"rules": [
            {"name": "hourly", "algorithm": "fixed_window", "limit": 2, "window_ms": 3600000},
            {"name": "bucket", "algorithm": "token_bucket", "capacity": 2, "refill_tokens": 1, "refill_period_ms": 3600000}
        ]}),
    )
    .await;
    clear_of_window_turn(Duration::from_secs(3600)).await;
    let check = || app.check(json!({"policy": "undoable", "identifiers": {"user": "eve"}}));
    for expected in [200, 200, 429] {
        assert_eq!(check().await.status(), expected);
    }
    let ttl_before: i64 = redis::cmd("PTTL")
        .arg(state_key(&redis, "undoable", "hourly"))
        .query(&mut redis.connection())
        .unwrap();
    let del = |q: &'static str| {
        call(
            &app,
            reqwest::Method::DELETE,
            format!("/api/v1/identifiers/user/eve{q}"),
        )
    };
    let reset: Value = del("?reason=wrong+one").await.json().await.unwrap();
    assert_eq!(reset["deleted_keys"], 2, "{reset}");
    let token = reset["undo"]["token"].as_str().unwrap().to_owned();
    assert!(reset["undo"]["until_ms"].as_i64().unwrap() > 0);
    assert_eq!(check().await.status(), 200, "the reset freed eve");
    let post = |path: String| call(&app, reqwest::Method::POST, path);
    let r = post(format!("/api/v1/resets/{token}/undo")).await;
    assert_eq!(r.status(), 200);
    let undone: Value = r.json().await.unwrap();
    assert_eq!(undone["restored_keys"], 2, "{undone}");
    assert_eq!(undone["identifiers"], json!(["user=eve"]));
    // As before the reset: eve is over, and her window ends when it did.
    assert_eq!(check().await.status(), 429);
    let ttl_after: i64 = redis::cmd("PTTL")
        .arg(state_key(&redis, "undoable", "hourly"))
        .query(&mut redis.connection())
        .unwrap();
    assert!(
        ttl_after <= ttl_before && ttl_after > ttl_before - 60_000,
        "{ttl_before} then {ttl_after}"
    );
    // Once; a token that is not one is the caller's mistake, named.
    let r = post(format!("/api/v1/resets/{token}/undo")).await;
    assert_eq!(r.status(), 404);
    let r = post("/api/v1/resets/not-a-token/undo".into()).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("token"));
    // A reset that deleted nothing offers nothing to undo.
    let none: Value = del("?policy=undoable&rule=hourly")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(none["deleted_keys"], 1);
    let nothing: Value = del("?policy=undoable&rule=hourly")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(nothing["deleted_keys"], 0);
    assert!(nothing["undo"].is_null(), "{nothing}");
    let audit: Value = app
        .as_admin(
            reqwest::Method::GET,
            "/api/v1/audit?action=identifier.reset.undo",
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(audit["entries"][0]["target"], "user=eve", "{audit}");
}

async fn call(app: &TestApp, method: reqwest::Method, path: String) -> reqwest::Response {
    app.as_admin(method, &path, None).await
}

/// The Redis key of `user=eve`'s state under `policy`'s `rule` (a fixed window).
fn state_key(redis: &RedisServer, policy: &str, rule: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{policy}|user|eve*:{rule}:*"))
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].clone()
}

/// A value that is nobody's (or several dimensions') gets candidates, never an error alone.
#[tokio::test]
async fn a_bare_value_with_several_meanings_offers_each() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "api",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 10, "window_ms": 3600000, "dimensions": ["user", "tenant"]}]}),
    )
    .await;
    app.check(json!({"policy": "api", "identifiers": {"user": "acme"}}))
        .await;
    app.check(json!({"policy": "api", "identifiers": {"tenant": "acme"}}))
        .await;
    let mut v = admin(&app, &redis).await;
    let r = v.post_form("/fn/inspect", &[("id", "acme")], None).await;
    let i: Inspection = r.json().await.unwrap();
    let mut found: Vec<&str> = i.candidates.iter().map(|(id, _)| id.as_str()).collect();
    found.sort();
    assert_eq!(found, ["tenant=acme", "user=acme"]);
    let r = v.post_form("/fn/inspect", &[("id", "nobody")], None).await;
    let i: Inspection = r.json().await.unwrap();
    assert!(
        i.error
            .unwrap()
            .contains("nothing with the value “nobody” has state now")
    );
}

/// An undo puts counters back, never leases: a lease released since would hold its slot
/// with no one left to release it. And a value's spaces are its own: resetting `eve ` is
/// not resetting `eve`.
#[tokio::test]
async fn an_undo_leaves_leases_alone_and_a_value_is_reset_as_given() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "jobs",
        json!({"rules": [
            {"name": "hourly", "algorithm": "fixed_window", "limit": 5, "window_ms": 3600000},
            {"name": "running", "algorithm": "concurrency", "limit": 1, "lease_ms": 600000}
        ]}),
    )
    .await;
    clear_of_window_turn(Duration::from_secs(3600)).await;
    let check =
        |user: &'static str| app.check(json!({"policy": "jobs", "identifiers": {"user": user}}));
    assert_eq!(check("eve").await.status(), 200);
    assert_eq!(check("eve ").await.status(), 200);
    assert_eq!(check("eve").await.status(), 429, "her one slot is held");
    let reset: Value = call(
        &app,
        reqwest::Method::DELETE,
        "/api/v1/identifiers/user/eve".into(),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(reset["deleted_keys"], 2, "{reset}");
    let token = reset["undo"]["token"].as_str().unwrap().to_owned();
    let undone: Value = call(
        &app,
        reqwest::Method::POST,
        format!("/api/v1/resets/{token}/undo"),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        undone["restored_keys"], 1,
        "the count, not the lease: {undone}"
    );
    let r = check("eve").await;
    assert_eq!(r.status(), 200, "her slot is free");
    let body: Value = r.json().await.unwrap();
    let hourly = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "hourly")
        .unwrap()
        .clone();
    assert_eq!(
        hourly["remaining"], 3,
        "the count came back (one before, this one): {body}"
    );
    // `eve ` kept her own state through all of it.
    let spaced: Value = call(
        &app,
        reqwest::Method::GET,
        "/api/v1/identifiers/user/eve%20".into(),
    )
    .await
    .json()
    .await
    .unwrap();
    assert!(spaced.to_string().contains("\"remaining\":4"), "{spaced}");
}

/// Support gives one identifier a limit of its own from the inspector's form, with an
/// expiry: it is counted apart from the policy's rule, listed with its numbers, and a
/// wrong number is refused naming the form's field.
#[tokio::test]
async fn support_gives_one_identifier_a_limit_of_its_own() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let doc = json!({"rules": [{"name": "per-user", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000, "dimensions": ["user"]}]});
    app.put_policy("own", doc).await;
    add_user(&store(&redis).await, "sam", Role::Support).await;
    let mut v = Visitor::signed_in(&app, "sam").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let add = |matcher: &str, limit: &str, window: &str, unit: &str| {
        [
            ("csrf", csrf.clone()),
            ("name", "own".to_owned()),
            ("matcher", matcher.to_owned()),
            ("action", "limit".to_owned()),
            ("limit", limit.to_owned()),
            ("window", window.to_owned()),
            ("window_unit", unit.to_owned()),
            ("expires_minutes", "60".to_owned()),
            ("reason", "partner load test".to_owned()),
        ]
    };
    for (limit, window, unit, field) in [
        ("", "1", "h", "limit"),
        ("many", "1", "h", "limit"),
        // Refused by the rule's own checks, named as the form's fields.
        ("0", "1", "h", "limit"),
        ("5", "401", "d", "window"),
        // The edges: past the largest limit, past a whole number, a window that overflows.
        ("1000000001", "1", "h", "limit"),
        ("99999999999999999999", "1", "h", "limit"),
        ("5", "99999999999999999", "d", "window"),
        ("5", "0", "h", "window"),
        ("5", "an", "h", "window"),
        // A unit's label, or none, is not taken for milliseconds.
        ("5", "1", "hours", "window_unit"),
        ("5", "1", "", "window_unit"),
    ] {
        let form = add("user=partner", limit, window, unit);
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
        let what = format!("{limit:?} per {window:?} {unit:?}");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{what}");
        let body = r.text().await.unwrap();
        assert!(
            body.contains(&format!("\"field\":\"{field}\"")),
            "{what}: {body}"
        );
    }
    // Support may not change the limit of a whole wildcard.
    let form = add("user=partner-*", "5", "1", "h");
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    let form = add("user=partner", "5", "1", "h");
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    // A match that is not dimension=value is refused under the form's own field.
    let form = add("partner", "5", "1", "h");
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body = r.text().await.unwrap();
    assert!(body.contains("\"field\":\"matcher\""), "{body}");

    let status = |user: &'static str| {
        let app = &app;
        async move {
            app.check(json!({"policy": "own", "identifiers": {"user": user}}))
                .await
                .status()
                .as_u16()
        }
    };
    clear_of_window_turn(Duration::from_secs(3600)).await;
    for _ in 0..5 {
        assert_eq!(status("partner").await, 200, "its own limit of 5 an hour");
    }
    assert_eq!(status("partner").await, 429);
    for _ in 0..2 {
        assert_eq!(status("someone").await, 200);
    }
    assert_eq!(
        status("someone").await,
        429,
        "the policy's 2 for everyone else"
    );

    let policy = app.get_policy("own").await;
    let o = &policy["overrides"][0];
    assert_eq!(o["action"], "limit", "{policy}");
    assert_eq!(o["rules"][0]["limit"], 5, "{policy}");
    assert_eq!(o["rules"][0]["window_ms"], 3_600_000, "{policy}");
    assert!(o["expires_at_ms"].as_i64().is_some(), "{policy}");
    let page = v
        .get("/policy?name=own")
        .await
        .text()
        .await
        .unwrap()
        .replace("<!>", "");
    assert!(page.contains("limit: 5 per 1 hour"), "{page}");
}
