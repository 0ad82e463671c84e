//! The dashboard answers its users' questions (issue 34): who is throttled, by which rule,
//! since and until when, with every identifier of the denied check; is bob blocked right
//! now and why (through his address); a failed save keeps what was typed, without
//! JavaScript too; a delete takes the policy's name typed; the dashboard's files go out
//! compressed and cached by their hashed names.

use std::time::{Duration, Instant};

use reqwest::{StatusCode, header};
use serde_json::{Value, json};
use spillway::domain::{
    inspection::{Inspection, Verdict},
    people::Role,
};

use crate::{
    auth::{Visitor, add_user, store},
    helpers::{RedisServer, TestApp, app_state, clear_of_window_turn, serve, spawn_app},
};

/// Evaluates `$body` (an `Option`) until it is `Some`, for at most 10 s: the live views are
/// written once a second by each instance.
macro_rules! eventually {
    ($what:expr, $body:expr) => {{
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(v) = $body {
                break v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {}", $what);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }};
}

async fn admin(app: &TestApp, redis: &RedisServer) -> Visitor {
    add_user(&store(redis).await, "ada", Role::Admin).await;
    Visitor::signed_in(app, "ada").await
}

async fn overview(v: &mut Visitor, form: &[(&str, &str)]) -> Value {
    let r = v.post_form("/fn/overview", form, None).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn throttled_now_names_the_rule_since_and_until_when_and_every_identifier() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "scrape",
        json!({"rules": [
            {"name": "per-minute", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "dimensions": ["ip"]},
            {"name": "per-hour", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000, "dimensions": ["user"]}
        ]}),
    )
    .await;
    clear_of_window_turn(Duration::from_secs(60)).await;
    for _ in 0..5 {
        app.check(
            json!({"policy": "scrape", "identifiers": {"user": "scraper", "ip": "192.0.2.66"}}),
        )
        .await;
    }
    let mut v = admin(&app, &redis).await;
    let row = eventually!("the denial's details", {
        let o = overview(&mut v, &[]).await;
        let row = o["throttled"][0].clone();
        (row["rule"].is_string() && row["denials"] == 3).then_some(row)
    });
    assert_eq!(row["policy"], "scrape");
    assert_eq!(row["identifier"], "ip=192.0.2.66", "{row}");
    assert_eq!(row["rule"], "per-minute");
    let ids: Vec<&str> = row["identifiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"user=scraper") && ids.contains(&"ip=192.0.2.66"),
        "{ids:?}"
    );
    let (first, last, until) = (
        row["first_ms"].as_i64().unwrap(),
        row["last_ms"].as_i64().unwrap(),
        row["until_ms"].as_i64().unwrap(),
    );
    assert!(first <= last && until > last, "{row}");
    assert!(
        until - last <= 60_000,
        "blocked until the window ends: {row}"
    );
    // The page shows the same, rendered on the server.
    let page = v.get("/").await.text().await.unwrap();
    for text in [
        "user=scraper",
        "scrape › per-minute",
        "blocked",
        "data-testid=\"status-strip\"",
    ] {
        assert!(page.contains(text), "the overview shows {text:?}");
    }
}

#[tokio::test]
async fn a_filtered_overview_lists_its_policy_however_many_others_are_busier() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]});
    app.put_policy("quiet", rule.clone()).await;
    for i in 0..12 {
        app.put_policy(&format!("noisy-{i}"), rule.clone()).await;
    }
    clear_of_window_turn(Duration::from_secs(3600)).await;
    app.check(json!({"policy": "quiet", "identifiers": {"user": "bob"}}))
        .await;
    app.check(json!({"policy": "quiet", "identifiers": {"user": "bob"}}))
        .await;
    for i in 0..12 {
        for _ in 0..4 {
            app.check(json!({"policy": format!("noisy-{i}"), "identifiers": {"user": "x"}}))
                .await;
        }
    }
    let mut v = admin(&app, &redis).await;
    let listed = |o: &Value, policy: &str| {
        o["throttled"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["policy"] == policy)
    };
    let everything = eventually!("every noisy policy's denials", {
        let o = overview(&mut v, &[]).await;
        let rows = o["throttled"].as_array().unwrap();
        (rows.len() == 10 && rows.iter().all(|r| r["denials"] == 3)).then_some(o.clone())
    });
    assert!(!listed(&everything, "quiet"), "crowded out of the top 10");
    let filtered = eventually!("quiet's own list", {
        let o = overview(&mut v, &[("filter", "quiet")]).await;
        listed(&o, "quiet").then_some(o)
    });
    assert_eq!(filtered["throttled"].as_array().unwrap().len(), 1);
    assert_eq!(filtered["throttled"][0]["identifier"], "user=bob");
    // "Show all" lists past the top 10.
    let all = overview(&mut v, &[("all", "true")]).await;
    assert_eq!(all["throttled"].as_array().unwrap().len(), 13);
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
    let inspection: Inspection = eventually!("bob's companions", {
        let r = v.post_form("/fn/inspect", &[("id", "bob")], None).await;
        let i: Inspection = r.json().await.unwrap();
        (!i.companions.is_empty()).then_some(i)
    });
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
    // The reset's default is what blocks.
    assert!(
        page.contains(r#"<option value="shop/per-ip ip=203.0.113.11" selected"#),
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
        back.starts_with("/identifiers?id=bob&reset=2&undo="),
        "{back}"
    );
    let page = v.get(&back).await.text().await.unwrap();
    assert!(page.contains("Reset done: 2 keys deleted."), "{page}");
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
    let again: Inspection = eventually!("bob in the recent traffic", {
        let r = v.post_form("/fn/inspect", &[("id", "bob")], None).await;
        let i: Inspection = r.json().await.unwrap();
        (i.identifier == "user=bob").then_some(i)
    });
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

#[tokio::test]
async fn a_failed_save_without_javascript_comes_back_with_what_was_typed() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    // A form post as a browser without JavaScript sends it (and not following redirects).
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client
        .post(app.url("/fn/policy_save"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, v.origin())
        .header(header::ACCEPT, "text/html,application/xhtml+xml")
        .header(header::REFERER, app.url("/policy?name=typed"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", "typed"),
            ("version", "0"),
            ("description", "typed by hand"),
            ("rules[0][name]", ""),
            ("rules[0][algorithm]", "fixed_window"),
            ("rules[1][name]", "burst"),
            ("rules[1][algorithm]", "token_bucket"),
            ("rules[1][capacity]", "10"),
            ("rules[1][tokens]", "5"),
            ("rules[1][period_ms]", ""),
            ("rules[1][period_unit]", "s"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("/policy?name=typed&draft="),
        "{location}"
    );
    let page = v.get(&location).await.text().await.unwrap();
    for text in [
        "Not saved.",
        "Rule 2 (burst) › Period",
        r#"value="typed by hand""#,
        r#"<option value="token_bucket" selected"#,
        r#"value="10""#,
    ] {
        assert!(page.contains(text), "the page keeps {text:?}");
    }
    // Nothing was stored.
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/typed", None)
        .await;
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn a_delete_takes_the_policys_name_typed() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "keep-me",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]}),
    )
    .await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    for confirm in ["", "keep", "KEEP-ME"] {
        let r = v
            .post_form(
                "/fn/policy_delete",
                &[("csrf", &csrf), ("name", "keep-me"), ("confirm", confirm)],
                Some(&origin),
            )
            .await;
        assert_eq!(r.status(), 400, "{confirm:?}");
        assert!(r.text().await.unwrap().contains("type the policy's name"));
    }
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/keep-me", None)
        .await;
    assert_eq!(r.status(), 200);
    let r = v
        .post_form(
            "/fn/policy_delete",
            &[("csrf", &csrf), ("name", "keep-me"), ("confirm", "keep-me")],
            Some(&origin),
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let r = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/keep-me", None)
        .await;
    assert_eq!(r.status(), 404);
    // Undo: it comes back as it was.
    let r = v
        .post_form(
            "/fn/policy_restore",
            &[("csrf", &csrf), ("name", "keep-me")],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let back: Value = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/keep-me", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(back["rules"][0]["limit"], 1);
    // Once there again, it cannot be restored over.
    let r = v
        .post_form(
            "/fn/policy_restore",
            &[("csrf", &csrf), ("name", "keep-me")],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn assets_go_out_compressed_and_cached_by_their_hashed_names() {
    let redis = RedisServer::start();
    let root = std::env::temp_dir().join(format!("spillway-site-{}", std::process::id()));
    let pkg = root.join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    let wasm = "spillway.Xq3bW9zyjtv1VB1gxHiTeQ.wasm";
    std::fs::write(pkg.join(wasm), vec![0u8; 4096]).unwrap();
    std::fs::write(pkg.join(format!("{wasm}.br")), b"brotli bytes").unwrap();
    std::fs::write(pkg.join(format!("{wasm}.gz")), b"gzip bytes").unwrap();
    std::fs::write(pkg.join("spillway.css"), b"body{}").unwrap();
    let toml = root.join("Leptos.toml");
    std::fs::write(
        &toml,
        format!(
            "[package.metadata.leptos]\noutput-name = \"spillway\"\nsite-root = {:?}\nsite-pkg-dir = \"pkg\"\n",
            root.to_string_lossy()
        ),
    )
    .unwrap();
    let state = app_state(&redis, &[("SPILLWAY_LEPTOS_TOML", &toml.to_string_lossy())]).await;
    let app = serve(state).await;
    let get = |path: String, encoding: &'static str| {
        let client = reqwest::Client::builder().no_gzip().build().unwrap();
        async move {
            client
                .get(path)
                .header(header::ACCEPT_ENCODING, encoding)
                .send()
                .await
                .unwrap()
        }
    };
    let r = get(app.url(&format!("/pkg/{wasm}")), "br, gzip").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[header::CONTENT_ENCODING], "br");
    assert_eq!(
        r.headers()[header::CACHE_CONTROL],
        "public, max-age=31536000, immutable"
    );
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"brotli bytes");
    let r = get(app.url(&format!("/pkg/{wasm}")), "gzip").await;
    assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
    let r = get(app.url(&format!("/pkg/{wasm}")), "identity").await;
    assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(r.bytes().await.unwrap().len(), 4096);
    // A name without a hash is asked for again each time.
    let r = get(app.url("/pkg/spillway.css"), "br").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
    let r = get(app.url("/pkg/missing.js"), "br").await;
    assert_eq!(r.status(), 404);
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test]
async fn a_signed_in_visitor_to_the_sign_in_page_is_sent_on() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let v = admin(&app, &redis).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (path, to) in [
        ("/login", "/"),
        ("/login?next=%2Fpolicies", "/policies"),
        ("/login?next=https%3A%2F%2Fevil.example", "/"),
    ] {
        let r = client
            .get(app.url(path))
            .header(header::COOKIE, v.cookie_header().unwrap())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_redirection(), "{path}: {}", r.status());
        assert_eq!(r.headers()[header::LOCATION], to, "{path}");
    }
}

/// An engineer pastes two domain files at once: both load, or, when one is wrong, neither,
/// with the document named; the list tells domains from policies, with traffic.
#[tokio::test]
async fn envoy_domains_are_loaded_from_the_dashboard_all_or_none() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut v = admin(&app, &redis).await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let two = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n---\ndomain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let broken = format!(
        "{two}---\ndomain: third\ndescriptors:\n  - key: user\n    rate_limit: {{unit: fortnight, requests_per_unit: 5}}\n"
    );
    let r = v
        .post_form(
            "/fn/envoy_import",
            &[("csrf", &csrf), ("file", &broken)],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(text.contains("document 3"), "{text}");
    for name in ["edge", "api", "third"] {
        let r = app
            .as_admin(
                reqwest::Method::GET,
                &format!("/api/v1/policies/{name}"),
                None,
            )
            .await;
        assert_eq!(r.status(), 404, "{name}: all or none");
    }
    let r = v
        .post_form(
            "/fn/envoy_import",
            &[("csrf", &csrf), ("file", two)],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200);
    let names: Vec<String> = r.json().await.unwrap();
    assert_eq!(names, ["edge", "api"]);
    let list: Value = v
        .post_form("/fn/policies", &[], None)
        .await
        .json()
        .await
        .unwrap();
    let row = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(row("edge")["envoy_domain"], "edge");
    assert!(row("demo")["envoy_domain"].is_null());
    assert!(
        row("edge")["changed_ms"].as_i64().is_some(),
        "the import is in the audit log"
    );
    // The domain's page says how to wire Envoy to it.
    let page = v.get("/policy?name=edge").await.text().await.unwrap();
    assert!(page.contains("Wire Envoy to this domain"));
    assert!(page.contains("envoy.filters.http.ratelimit"));
    assert!(page.contains("remote_address: {}"));
}

#[tokio::test]
async fn an_alert_rule_sends_a_signed_test_delivery_on_demand() {
    let redis = RedisServer::start();
    let app = crate::helpers::spawn_app_with(
        &redis,
        &[("SPILLWAY_WEBHOOK_ALLOWED_TARGETS", "127.0.0.1")],
    )
    .await;
    let (sink, addr) = crate::alerts::start_sink(0).await;
    let (status, _) = crate::alerts::put_alert(
        &app,
        "pager",
        json!({"condition": {"kind": "degraded", "seconds": 30},
            "webhook_url": format!("http://{addr}/hook"), "secret": crate::alerts::SECRET}),
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

#[tokio::test]
async fn the_top_identifiers_download_as_csv() {
    let redis = RedisServer::start();
    let app = crate::helpers::spawn_app_with(&redis, &[("SPILLWAY_HISTORY_FLUSH_MS", "100")]).await;
    app.put_policy(
        "csv",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    for user in ["a,b", "=cmd", "a,b"] {
        app.check(json!({"policy": "csv", "identifiers": {"user": user}}))
            .await;
    }
    let body = eventually!("the history's top lists", {
        let r = app
            .as_admin(
                reqwest::Method::GET,
                "/api/v1/history?policy=csv&range=1h&format=csv-top",
                None,
            )
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/csv; charset=utf-8");
        let body = r.text().await.unwrap();
        body.contains("denied,").then_some(body)
    });
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[0], "list,policy,identifier,count");
    assert!(lines.contains(&"denied,csv,\"user=a,b\",1"), "{body}");
    assert!(lines.contains(&"checked,csv,\"user=a,b\",2"), "{body}");
    assert!(lines.contains(&"checked,csv,user==cmd,1"), "{body}");
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
