//! History: counts per minute, hour and day and the top lists, written by each instance's
//! flush (never on the check path), read through `GET /api/v1/history` (the top lists as
//! CSV too); every key expires.

use std::time::Duration;

use reqwest::header;
use serde_json::{Value, json};
use spillway::{
    domain::history::{Counts, Step},
    store::{Keys, Store, history::HistoryBatch},
};

use crate::helpers::{ADMIN_KEY, PATIENCE, RedisServer, TestApp, eventually, spawn_app_with};

const FAST_FLUSH: &[(&str, &str)] = &[("SPILLWAY_HISTORY_FLUSH_MS", "150")];

async fn history(app: &TestApp, query: &str) -> (u16, Value) {
    let response = app
        .client
        .get(app.url(&format!("/api/v1/history?{query}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn sums(body: &Value) -> (u64, u64, u64, u64) {
    let points = body["points"].as_array().unwrap();
    let sum = |f: &str| points.iter().map(|p| p[f].as_u64().unwrap()).sum::<u64>();
    (
        sum("allowed"),
        sum("denied"),
        sum("shadow_denied"),
        sum("degraded"),
    )
}

/// Waits until the sums of `query`'s points on `app` are `want`: every flush has reached
/// Redis.
async fn flushed(app: &TestApp, query: &str, want: (u64, u64, u64, u64)) {
    eventually(
        &format!("{query} summing to {want:?}"),
        PATIENCE,
        async || {
            let (status, body) = history(app, query).await;
            (status, (status == 200).then(|| sums(&body)), body)
        },
        |(_, seen, _)| *seen == Some(want),
    )
    .await;
}

/// Runs `n` checks of `policy` for `user` on `app`, 16 at a time.
async fn checks(app: &TestApp, policy: &str, user: &str, n: usize) {
    let body = json!({"policy": policy, "identifiers": {"user": user}});
    for chunk in (0..n).collect::<Vec<_>>().chunks(16) {
        futures_util::future::join_all(chunk.iter().map(|_| app.check(body.clone()))).await;
    }
}

#[tokio::test]
async fn a_load_of_known_size_over_two_instances_is_counted_exactly() {
    let redis = RedisServer::start();
    let a = spawn_app_with(&redis, FAST_FLUSH).await;
    let b = spawn_app_with(&redis, FAST_FLUSH).await;
    a.put_policy(
        "hist",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 50, "window_ms": 3600000}]}),
    )
    .await;
    a.put_policy(
        "quiet",
        json!({"mode": "shadow", "rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 3600000}]}),
    )
    .await;
    // Ground truth: user=1 checked 80 times against a limit of 50 (30 denied, most of them
    // from the over-limit caches), user=2 10 times; the shadow policy 12 times (7 over).
    tokio::join!(
        checks(&a, "hist", "1", 40),
        checks(&b, "hist", "1", 40),
        checks(&a, "hist", "2", 10),
        checks(&b, "quiet", "9", 12),
    );
    // Both instances' flushes (each one atomic, every scope at once) reached Redis.
    flushed(&a, "range=24h", (65, 30, 7, 0)).await;

    let (status, minutes) = history(&a, "policy=hist&range=1h").await;
    assert_eq!(status, 200, "{minutes}");
    assert_eq!(minutes["step"], "minute");
    assert_eq!(minutes["points"].as_array().unwrap().len(), 60);
    assert_eq!(sums(&minutes), (60, 30, 0, 0), "{minutes}");
    let (_, hours) = history(&b, "policy=hist&range=24h&step=hour").await;
    assert_eq!(hours["points"].as_array().unwrap().len(), 24);
    assert_eq!(sums(&hours), (60, 30, 0, 0));
    let (_, days) = history(&b, "policy=hist&range=30d").await;
    assert_eq!(days["step"], "day");
    assert_eq!(sums(&days), (60, 30, 0, 0));
    assert_eq!(days["totals"]["denied"], 30);

    let (_, shadow) = history(&a, "policy=quiet&range=1h").await;
    assert_eq!(sums(&shadow), (5, 0, 7, 0), "{shadow}");
    // Every policy together.
    let (_, all) = history(&a, "range=24h").await;
    assert_eq!(all["policy"], "*");
    assert_eq!(sums(&all), (65, 30, 7, 0));
    assert_eq!(all["top_denied"][0]["policy"], "hist");
    assert_eq!(all["top_denied"][0]["identifier"], "user=1");
    assert_eq!(all["top_denied"][0]["count"], 30);

    // CSV is its own operation's: the JSON one refuses it, naming where it is.
    let refused = a
        .client
        .get(a.url("/api/v1/history?policy=hist&range=24h&format=csv"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["field"], "format", "{problem}");
    assert!(
        (problem["detail"].as_str().unwrap())
            .contains("GET /api/v1/history/csv?policy=hist&range=24h&format=csv"),
        "{problem}"
    );
    // The same series as CSV.
    let csv = a
        .client
        .get(a.url("/api/v1/history/csv?policy=hist&range=24h"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(
        csv.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let text = csv.text().await.unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("time,allowed,denied,shadow_denied,degraded")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 24);
    assert!(rows[0][0].ends_with(":00:00Z"), "{:?}", rows[0]);
    let allowed: u64 = rows.iter().map(|r| r[1].parse::<u64>().unwrap()).sum();
    let denied: u64 = rows.iter().map(|r| r[2].parse::<u64>().unwrap()).sum();
    assert_eq!((allowed, denied), (60, 30));
}

#[tokio::test]
async fn top_lists_match_the_ground_truth_of_a_skewed_load() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, FAST_FLUSH).await;
    app.put_policy(
        "skew",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 20, "window_ms": 3600000}]}),
    )
    .await;
    // Five heavy users and 600 light ones (more than a list keeps), interleaved.
    let heavy = [("h0", 120), ("h1", 90), ("h2", 70), ("h3", 50), ("h4", 35)];
    let mut load = Vec::new();
    for (user, n) in heavy {
        load.extend(std::iter::repeat_n(user.to_owned(), n));
    }
    for i in 0..600 {
        load.push(format!("light{i}"));
        if i % 3 == 0 {
            load.push(format!("light{i}"));
        }
    }
    // A fixed shuffle: heavy and light checks mixed across flushes.
    let mut state = 12345u64;
    for i in (1..load.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        load.swap(i, (state >> 33) as usize % (i + 1));
    }
    for chunk in load.chunks(32) {
        futures_util::future::join_all(
            chunk
                .iter()
                .map(|user| app.check(json!({"policy": "skew", "identifiers": {"user": user}}))),
        )
        .await;
    }
    eventually(
        "every check of the load flushed",
        PATIENCE,
        async || {
            let (_, body) = history(&app, "policy=skew&range=24h").await;
            let (allowed, denied, _, _) = sums(&body);
            allowed + denied
        },
        |counted| *counted == load.len() as u64,
    )
    .await;

    let (status, body) = history(&app, "policy=skew&range=24h&top=5").await;
    assert_eq!(status, 200, "{body}");
    let list = |name: &str| -> Vec<(String, u64)> {
        body[name]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["identifier"].as_str().unwrap().to_owned(),
                    r["count"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let expect_checked: Vec<(String, u64)> = heavy
        .iter()
        .map(|(u, n)| (format!("user={u}"), *n as u64))
        .collect();
    assert_eq!(list("top_checked"), expect_checked);
    // Over a limit of 20 an hour, each heavy user was denied all but 20.
    let expect_denied: Vec<(String, u64)> = heavy
        .iter()
        .map(|(u, n)| (format!("user={u}"), *n as u64 - 20))
        .collect();
    assert_eq!(list("top_denied"), expect_denied);
    assert_eq!(sums(&body).0 + sums(&body).1, load.len() as u64);
}

#[tokio::test]
async fn every_history_key_expires_and_old_data_is_gone() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, FAST_FLUSH).await;
    app.put_policy(
        "ttl",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    checks(&app, "ttl", "1", 3).await;
    flushed(&app, "policy=ttl&range=1h", (1, 2, 0, 0)).await;
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("spw:hist:*")
        .query(&mut conn)
        .unwrap();
    // Counts: 3 steps × (policy, all); top lists: (checked, denied) × (hour, day) × (policy, all).
    assert_eq!(keys.len(), 14, "{keys:?}");
    let (now_s, _): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now = now_s * 1000;
    const H: i64 = 3_600_000;
    const D: i64 = 24 * H;
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        // Kept for the retention past the end of the key's last period, no longer.
        let (min, max) = if key.contains(":top:") && key.contains(":hour:") {
            (8 * D, 8 * D + H)
        } else if key.contains(":top:") {
            (90 * D, 91 * D)
        } else if key.contains(":minute:") {
            (48 * H, 49 * H)
        } else if key.contains(":hour:") {
            (90 * D, 91 * D)
        } else {
            (400 * D, 430 * D)
        };
        assert!(
            ttl > min - 2000 && ttl <= max,
            "{key}: PTTL {ttl} not in ({min}, {max}]"
        );
    }

    // Counts of a minute 49 hours ago: its block of minutes is past its retention and is
    // not kept; its hour and day are.
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(2), Keys::default())
        .await
        .unwrap();
    let minute = Step::Minute.period_of(now - 49 * H);
    let counts = Counts {
        allowed: 7,
        ..Counts::default()
    };
    store
        .add_history(&HistoryBatch {
            counts: vec![("old".into(), minute, counts)],
            top: vec![],
        })
        .await
        .unwrap();
    let keys = Keys::default();
    let minutes = store
        .history_series("old", Step::Minute, minute..=minute)
        .await
        .unwrap();
    assert_eq!(
        minutes[0].1,
        Counts::default(),
        "minutes past 48 h are gone"
    );
    let (block, _) = Step::Minute.block_of(minute);
    let exists: i64 = redis::cmd("EXISTS")
        .arg(keys.history_counts("old", Step::Minute, block))
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, 0);
    let hour = Step::Hour.period_of(minute * 60_000);
    let hours = store
        .history_series("old", Step::Hour, hour..=hour)
        .await
        .unwrap();
    assert_eq!(hours[0].1.allowed, 7);
}

#[tokio::test]
async fn counts_made_while_redis_is_down_reach_the_history_when_it_is_back() {
    let mut redis = RedisServer::start();
    let app = spawn_app_with(&redis, FAST_FLUSH).await;
    app.put_policy(
        "down",
        json!({"failure_mode": "open", "rules": [{"name": "r", "algorithm": "fixed_window", "limit": 100, "window_ms": 3600000}]}),
    )
    .await;
    checks(&app, "down", "1", 4).await;
    flushed(&app, "policy=down&range=1h", (4, 0, 0, 0)).await;
    redis.kill();
    // Answered by the failure mode; the flushes fail and keep what they hold (the flushes
    // of these 500 ms, every 150 ms, are the ones that fail).
    checks(&app, "down", "1", 6).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart();
    // The 4 allowed checks were written before Redis went down, and the kill lost them
    // (tests run Redis without persistence): what the history shows is what was held.
    flushed(&app, "policy=down&range=1h", (0, 0, 0, 6)).await;
}

#[tokio::test]
async fn bad_history_queries_name_the_field() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, FAST_FLUSH).await;
    for (query, field) in [
        ("range=2d", "range"),
        ("range=7d&step=minute", "step"),
        ("range=1h&step=day", "step"),
        ("step=week", "step"),
        ("top=101", "top"),
        ("top=-1", "top"),
        ("policy=Bad!", "policy"),
        ("format=xml", "format"),
    ] {
        let (status, body) = history(&app, query).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .starts_with(&format!("{field}: ")),
            "{query}: {body}"
        );
    }
    let anonymous = app
        .client
        .get(app.url("/api/v1/history"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
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
    let body = eventually(
        "the history's top lists",
        PATIENCE,
        async || {
            let r = app
                .as_admin(
                    reqwest::Method::GET,
                    "/api/v1/history/csv?policy=csv&range=1h&format=csv-top",
                    None,
                )
                .await;
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()[header::CONTENT_TYPE], "text/csv; charset=utf-8");
            r.text().await.unwrap()
        },
        |body| body.contains("denied,"),
    )
    .await;
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[0], "list,policy,identifier,count");
    assert!(lines.contains(&"denied,csv,\"user=a,b\",1"), "{body}");
    assert!(lines.contains(&"checked,csv,\"user=a,b\",2"), "{body}");
    assert!(lines.contains(&"checked,csv,user==cmd,1"), "{body}");
}
