//! Shared identifiers in view and overrides where they act: bob blocked through an address
//! used by many users is told with the count of users behind it, exempting bob alone is said
//! to leave the address blocking him, and the inspector lists bob's overrides with Extend
//! and Remove.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::{
    auth::admin,
    helpers::{PATIENCE, RedisServer, clear_of_window_turn, eventually, spawn_app},
    inspector::inspect,
};

#[tokio::test]
async fn bob_blocked_through_a_shared_address_is_told_its_count_and_what_an_exemption_leaves() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "shop",
        json!({"rules": [
            {"name": "per-ip", "algorithm": "fixed_window", "limit": 40, "window_ms": 3600000, "dimensions": ["ip"]},
            {"name": "per-user", "algorithm": "fixed_window", "limit": 100, "window_ms": 3600000, "dimensions": ["user"]}
        ]}),
    )
    .await;
    clear_of_window_turn(Duration::from_secs(3600)).await;
    // 40 users behind one address use up its 40; then bob is refused through it.
    for i in 0..40 {
        app.check(json!({"policy": "shop", "identifiers": {"user": format!("u{i}"), "ip": "198.51.100.7"}}))
            .await;
    }
    let bob = json!({"policy": "shop", "identifiers": {"user": "bob", "ip": "198.51.100.7"}});
    assert_eq!(
        app.check(bob.clone()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut v = admin(&app, &redis).await;
    let seen = eventually(
        "the address's count of users",
        PATIENCE,
        async || inspect(&mut v, "user=bob").await,
        |i| {
            i.companions
                .first()
                .is_some_and(|c| c.companions_seen >= 41)
        },
    )
    .await;
    assert_eq!(seen.companions[0].identifier, "ip=198.51.100.7");
    // Counted, not listed: a HyperLogLog's count is within a few percent.
    assert!(
        seen.companions[0].companions_seen <= 43,
        "{}",
        seen.companions[0].companions_seen
    );

    // Support exempts bob in shop: he is still refused through the address, and the page
    // says so, with the address, its count and a link to act on it.
    let csrf = v.csrf().await;
    let origin = v.origin();
    let form = [
        ("csrf", csrf.as_str()),
        ("name", "shop"),
        ("matcher", "user=bob"),
        ("action", "unlimited"),
        ("expires_minutes", "1440"),
        ("reason", "ticket 77"),
    ];
    let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    let page = v
        .get("/identifiers?id=user%3Dbob")
        .await
        .text()
        .await
        .unwrap();
    let hint = &page[page
        .find("data-testid=\"through-another\"")
        .expect("the hint")..];
    let hint = &hint[..hint.find("</p>").unwrap()];
    for text in [
        "ip=198.51.100.7 was checked with 4",
        "a shared address?",
        "user=bob is exempt in shop, yet",
        "alone leaves ip=198.51.100.7 blocking it",
        "href=\"/identifiers?id=ip%3D198.51.100.7#override\"",
    ] {
        assert!(hint.contains(text), "{text:?} in {hint}");
    }
    // The exemption is listed where it acts, with Extend and Remove.
    let listed = &page[page
        .find("data-testid=\"overrides-here\"")
        .expect("bob's overrides")..];
    assert!(listed.contains("shop: unlimited"), "{listed}");
    assert!(listed.contains("Extend by a day") && listed.contains("Remove"));
    let before = inspect(&mut v, "user=bob").await.overrides[0].document["expires_at_ms"]
        .as_i64()
        .unwrap();
    let change = |change: &'static str, matcher: &'static str| {
        [
            ("csrf", csrf.clone()),
            ("name", "shop".to_owned()),
            ("index", "0".to_owned()),
            ("matcher", matcher.to_owned()),
            ("change", change.to_owned()),
            ("minutes", "1440".to_owned()),
        ]
    };
    let pairs = |f: &[(&'static str, String)]| -> Vec<(&'static str, String)> { f.to_vec() };
    for (form, status) in [
        // A list changed meanwhile is refused, not the wrong override changed.
        (
            pairs(&change("remove", "user=eve")),
            StatusCode::BAD_REQUEST,
        ),
        (pairs(&change("extend", "user=bob")), StatusCode::OK),
    ] {
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = v
            .post_form("/fn/override_change", &form, Some(&origin))
            .await;
        assert_eq!(r.status(), status, "{}", r.text().await.unwrap());
    }
    let after = inspect(&mut v, "user=bob").await.overrides[0].document["expires_at_ms"]
        .as_i64()
        .unwrap();
    assert_eq!(after - before, 86_400_000);
    let form = change("remove", "user=bob");
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = v
        .post_form("/fn/override_change", &form, Some(&origin))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(inspect(&mut v, "user=bob").await.overrides.is_empty());
}
