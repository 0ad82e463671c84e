//! "Blocked" as a state over time, not an instant: a client denied most of its checks is
//! blocked with its share and a since as old as the data (the streak of `lua/streaks.lua`),
//! the inspector says it beside the instant verdict, and a reset decided when the button is
//! pressed frees what refuses now, while one that would delete nothing says so.

use std::time::Duration;

use reqwest::header;
use serde_json::json;

use crate::{
    auth::{Visitor, admin},
    dashboard::overview,
    helpers::{PATIENCE, RedisServer, TestApp, clear_of_window_turn, eventually, spawn_app},
    inspector::inspect,
};

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn a_client_denied_most_of_the_time_is_blocked_with_its_share_and_a_real_since() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "scrape",
        json!({"rules": [{"name": "per-minute", "algorithm": "fixed_window", "limit": 3, "window_ms": 60000, "dimensions": ["ip"]}]}),
    )
    .await;
    // The scraper has been at it for 18 minutes, as an instance wrote it: 873 of 900 checks
    // denied, the last 10 s ago. (The overview's own lists go back 5 minutes.)
    let now = now_ms();
    let hour = now.div_euclid(3_600_000);
    redis::cmd("HSET")
        .arg(format!("spw:{{stats}}:streak:scrape:{hour}"))
        .arg("ip=192.0.2.66")
        .arg(format!("{},{},900,873", now - 18 * 60_000, now - 10_000))
        .query::<()>(&mut redis.connection())
        .unwrap();
    clear_of_window_turn(Duration::from_secs(60)).await;
    // 100 checks: 3 pass, 97 are denied; from the first denial on, each is counted.
    for _ in 0..100 {
        app.check(
            json!({"policy": "scrape", "identifiers": {"user": "scraper", "ip": "192.0.2.66"}}),
        )
        .await;
    }
    let mut v = admin(&app, &redis).await;
    let row = eventually(
        "the scraper's streak",
        PATIENCE,
        async || overview(&mut v, &[]).await["throttled"][0].clone(),
        |row| row["streak"]["checks"] == 997,
    )
    .await;
    assert_eq!(row["identifier"], "ip=192.0.2.66", "{row}");
    assert_eq!(row["streak"]["denials"], 970, "{row}");
    assert_eq!(row["streak"]["since_ms"], now - 18 * 60_000, "{row}");
    let page = v.get("/").await.text().await.unwrap();
    let row_html = &page[page.find("data-testid=\"throttled\"").unwrap()..];
    for text in [
        "blocked: denied 97 % of 997 checks for 18 min",
        "18 min ago",
    ] {
        assert!(
            row_html.contains(text),
            "the overview shows {text:?}: {row_html}"
        );
    }
    // The identifier it was checked with is credited every denial too.
    let inspection = inspect(&mut v, "user=scraper").await;
    let (policy, streak) = inspection.steady().expect("the scraper's own streak");
    assert_eq!((policy, streak.checks, streak.denials), ("scrape", 97, 97));
}

/// Posts the inspector's reset form for `id` with `what`, without JavaScript: where the
/// page comes back to.
async fn reset(app: &TestApp, v: &mut Visitor, id: &str, what: &str) -> String {
    let csrf = v.csrf().await;
    let form = [
        ("csrf", csrf.as_str()),
        ("id", id),
        ("what", what),
        ("reason", "ticket 12"),
    ];
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(app.url("/fn/reset"))
        .header(header::COOKIE, v.cookie_header().unwrap())
        .header(header::ORIGIN, v.origin())
        .header(header::ACCEPT, "text/html")
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    r.headers()[header::LOCATION].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_reset_decided_when_pressed_frees_bob_and_one_that_deletes_nothing_says_so() {
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
    let bob = json!({"policy": "shop", "identifiers": {"user": "bob", "ip": "203.0.113.11"}});
    for _ in 0..2 {
        app.check(bob.clone()).await;
    }
    let mut v = admin(&app, &redis).await;
    let _ = eventually(
        "bob's companions",
        PATIENCE,
        async || inspect(&mut v, "bob").await,
        |i| !i.companions.is_empty(),
    )
    .await;
    // Blocked over time: bob's streak is written within a second.
    let _ = eventually(
        "bob's streak",
        PATIENCE,
        async || inspect(&mut v, "user=bob").await,
        |i| i.steady().is_some(),
    )
    .await;
    // The form's default is decided on the server when pressed: the address's rule.
    let back = reset(&app, &mut v, "bob", "now").await;
    assert!(
        back.starts_with("/identifiers?id=bob&reset=1&what="),
        "{back}"
    );
    let page = v.get(&back).await.text().await.unwrap();
    assert!(
        page.contains("Reset done (shop › per-ip on ip=203.0.113.11): 1 key deleted."),
        "{back}"
    );
    assert_eq!(app.check(bob.clone()).await.status(), 200);
    // Freed is not "blocked over time": the reset ended the address's streak, and bob's
    // own (checked with it) is over without a denial for the rest of the minute.
    let freed = inspect(&mut v, "ip=203.0.113.11").await;
    assert!(
        freed.steady().is_none(),
        "the address still blocked over time"
    );
    // Nothing counted for eve: the page says so before, and the reset says so after.
    app.check(json!({"policy": "shop", "identifiers": {"user": "eve"}}))
        .await;
    let page = v
        .get("/identifiers?id=user%3Dmallory")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("a reset would delete nothing"), "before");
    let back = reset(&app, &mut v, "user=mallory", "now").await;
    let page = v.get(&back).await.text().await.unwrap();
    assert!(
        page.contains("Nothing was reset: no counters were held for everything of user=mallory."),
        "after: {back}"
    );
    assert!(!page.contains("Reset done"));
}
