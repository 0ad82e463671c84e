//! The overview's live counters: kept by the check path (and the over-limit cache's flush),
//! read from a few keys, all with TTLs; and its live streams, capped per user and sharing
//! one read a second.

use std::time::Duration;

use reqwest::{StatusCode, header};
use serde_json::{Value, json};
use spillway::{
    domain::people::Role,
    store::{Keys, Store},
};

use crate::{
    auth::{Visitor, add_user, store},
    helpers::{PATIENCE, RedisServer, eventually, spawn_app},
};

#[tokio::test]
async fn checks_feed_the_rates_the_throttled_list_and_the_near_list() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "live",
        json!({"rules": [{"name": "per-second", "algorithm": "fixed_window", "limit": 5, "window_ms": 10000}]}),
    )
    .await;
    crate::helpers::clear_of_window_turn(Duration::from_secs(10)).await;
    for _ in 0..8 {
        app.check(json!({"policy": "live", "identifiers": {"user": "1"}}))
            .await;
    }
    app.check(json!({"policy": "live", "identifiers": {"user": "2"}}))
        .await;
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(2), Keys::default())
        .await
        .unwrap();
    // Cached denials reach the counters (flushed every second): all nine checks counted.
    let rates = eventually(
        "the nine checks counted",
        PATIENCE,
        async || store.policy_rates(&["live".into()], 10).await.unwrap().1,
        |rates| rates[0].iter().map(|s| s.allowed + s.denied).sum::<u64>() >= 9,
    )
    .await;
    let allowed: u64 = rates[0].iter().map(|s| s.allowed).sum();
    let denied: u64 = rates[0].iter().map(|s| s.denied).sum();
    assert_eq!((allowed, denied), (6, 3), "{:?}", rates[0]);

    let top = store.top_denied(5, 10).await.unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!(
        (
            top[0].policy.as_str(),
            top[0].identifier.as_str(),
            top[0].value
        ),
        ("live", "user=1", 3)
    );

    let near = store.near_limit(10).await.unwrap();
    assert_eq!(near.len(), 1, "{near:?}");
    assert_eq!(near[0].identifier, "user=1");
    assert_eq!(near[0].value, 100);

    // Every counter key expires.
    // The rates, the denied and near sets, the denials' details with the policy's own list,
    // and the streaks of denials (written by the same flush, a moment after the details).
    let keys: Vec<String> = eventually(
        "every counter key",
        PATIENCE,
        async || {
            redis::cmd("KEYS")
                .arg("spw:{stats}:*")
                .query::<Vec<String>>(&mut redis.connection())
                .unwrap()
        },
        |keys| keys.len() == 6,
    )
    .await;
    let mut conn = redis.connection();
    for k in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
        assert!(ttl > 0, "{k} has no TTL");
    }
}

/// An identifier is near its limit from exactly 80 % used, at the smallest limit and at the
/// largest validation accepts (10^9, reached with one check's cost): one unit less is not.
#[tokio::test]
async fn the_near_list_starts_at_exactly_80_percent_of_a_limit() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    for (policy, limit) in [("small", 5u64), ("large", 1_000_000_000)] {
        app.put_policy(
            policy,
            json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": limit, "window_ms": 3_600_000}]}),
        )
        .await;
    }
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    for (policy, user, cost) in [
        ("small", "at", 4u64),
        ("small", "under", 3),
        ("large", "at", 800_000_000),
        ("large", "under", 799_999_999),
    ] {
        let r = app
            .check(json!({"policy": policy, "identifiers": {"user": user}, "cost": cost}))
            .await;
        assert_eq!(r.status(), 200, "{policy} {user}");
    }
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(2), Keys::default())
        .await
        .unwrap();
    let mut near: Vec<(String, String, u64)> = store
        .near_limit(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.policy, r.identifier, r.value))
        .collect();
    near.sort();
    assert_eq!(
        near,
        [
            ("large".to_owned(), "user=at".to_owned(), 80),
            ("small".to_owned(), "user=at".to_owned(), 80)
        ]
    );
}

#[tokio::test]
async fn a_quiet_spell_does_not_bring_back_old_counts() {
    let redis = RedisServer::start();
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(2), Keys::default())
        .await
        .unwrap();
    // A bucket written 300 s ago sits where the current second's bucket is.
    let mut conn = redis.connection();
    let (now, _): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let i = now % 300;
    // Each bucket holds second * 2^20 + count.
    let stale = (now - 300) << 20;
    let _: () = redis::cmd("HSET")
        .arg(Keys::default().stats_rate("old"))
        .arg(format!("a{i}"))
        .arg(stale + 99)
        .arg(format!("d{i}"))
        .arg(stale + 5)
        .query(&mut conn)
        .unwrap();
    let (_, rates) = store.policy_rates(&["old".into()], 5).await.unwrap();
    assert!(rates[0].iter().all(|s| s.allowed == 0), "{:?}", rates[0]);
    store.add_stats("old", 0, 2, &[]).await.unwrap();
    let (_, rates) = store.policy_rates(&["old".into()], 5).await.unwrap();
    let last = rates[0].last().unwrap();
    assert_eq!(
        (last.allowed, last.denied),
        (0, 2),
        "the stale bucket was zeroed first"
    );
}

/// Live streams are capped per user (over all their sessions) and their views read once a
/// second however many follow them: 8 streams of one view cost Redis about what one does
/// (30 viewers × 8 streams drove a server core before), and a ninth of the same user is
/// refused with a problem that says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_are_capped_and_share_one_read_a_second() {
    use spillway::domain::people::Role;
    let redis = RedisServer::start();
    let app = crate::helpers::spawn_app(&redis).await;
    crate::auth::add_user(&crate::auth::store(&redis).await, "ann", Role::Viewer).await;
    let commands = || {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut redis.connection())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    // Commands Redis runs while `streams` follow the overview for 3 s.
    async fn follow(v: &mut crate::auth::Visitor, streams: usize) -> Vec<reqwest::Response> {
        let mut open = Vec::new();
        for _ in 0..streams {
            let mut stream = v.get("/events/overview").await;
            assert_eq!(stream.status(), 200);
            stream.chunk().await.unwrap();
            open.push(stream);
        }
        open
    }
    let mut v = crate::auth::Visitor::signed_in(&app, "ann").await;
    let one = follow(&mut v, 1).await;
    let before = commands();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let alone = commands() - before;
    drop(one);
    // A second session of the same user counts with the first.
    let mut w = crate::auth::Visitor::signed_in(&app, "ann").await;
    let mut eight = follow(&mut v, 4).await;
    eight.extend(follow(&mut w, 4).await);
    let before = commands();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let together = commands() - before;
    println!("Redis commands in 3 s: one stream {alone}, eight streams {together}");
    assert!(
        together < alone * 2 + 20,
        "eight streams of one view cost {together} commands, one {alone}"
    );
    let ninth = w.get("/events/overview").await;
    assert_eq!(ninth.status(), 429);
    let problem: serde_json::Value = ninth.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("close a tab"),
        "{problem}"
    );
    drop(eight);
}

/// One viewer held 400 live overview streams. Now a user holds 8 at most on an
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
    let _stream = eventually(
        "the closed stream's place back",
        PATIENCE,
        async || v.get("/events/overview").await,
        |r| r.status() == 200,
    )
    .await;
}
