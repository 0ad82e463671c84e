//! Concurrency rules on a real redis-server, through the HTTP API: leases taken by checks,
//! never more held than the limit across two instances, released (twice), renewed, and
//! reclaimed when they run out — not before.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::helpers::{AppProcess, PATIENCE, RedisServer, TestApp, eventually, spawn_app};

fn concurrency(limit: u64, lease_ms: u64) -> Value {
    json!({"rules": [{"name": "running", "algorithm": "concurrency", "limit": limit, "lease_ms": lease_ms}]})
}

/// A check of `customer`; its lease id when allowed.
async fn acquire(app: &TestApp, policy: &str, customer: &str) -> (u16, Value, Option<String>) {
    let (status, body) = app
        .post_as_service(
            "/api/v1/check",
            json!({"policy": policy, "identifiers": {"customer": customer}}),
        )
        .await;
    let lease = body["results"][0]["lease"].as_str().map(str::to_owned);
    (status, body, lease)
}

async fn release(app: &TestApp, leases: &[&str]) -> Vec<bool> {
    let (status, body) = app
        .post_as_service("/api/v1/leases/release", json!({"leases": leases}))
        .await;
    assert_eq!(status, 200, "{body}");
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["released"].as_bool().unwrap())
        .collect()
}

/// 10,000 acquisitions from 200 callers at once, split over two instances (this process and
/// a second one) on one Redis, against a limit of 25: what callers hold never passes 25,
/// and Redis reaches it (grants answered with `remaining` 0 took the 25th slot). A caller counts its lease after the grant and stops counting it before
/// it releases, so the count is never above what Redis holds; Redis's own count (the set's
/// `#` member), read by a watcher throughout, never passes 25 either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_acquisitions_over_two_instances_hold_at_most_the_limit() {
    let redis = RedisServer::start();
    let a = spawn_app(&redis).await;
    let process = AppProcess::start(&redis);
    let b = TestApp::remote(process.addr);
    a.put_policy("exports", concurrency(25, 60_000)).await;
    // The second instance knows the policy once it answers for it.
    eventually(
        "B answering for the policy",
        PATIENCE,
        async || acquire(&b, "exports", "warmup").await,
        |(status, _, _)| *status == 200,
    )
    .await;

    let holding = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    // Grants that took the last slot (`remaining` 0): Redis held exactly 25 then.
    let filled = Arc::new(AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // Redis's own view, sampled throughout.
    let watcher = {
        let done = done.clone();
        let mut conn = redis.connection();
        tokio::task::spawn_blocking(move || {
            let mut most_in_redis = 0i64;
            let mut samples = 0u64;
            while !done.load(Ordering::Relaxed) {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("*running:cc")
                    .query(&mut conn)
                    .unwrap();
                for key in keys {
                    let total: Option<f64> = redis::cmd("ZSCORE")
                        .arg(&key)
                        .arg("#")
                        .query(&mut conn)
                        .unwrap();
                    let held = -total.unwrap_or(0.0) as i64;
                    most_in_redis = most_in_redis.max(held);
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (most_in_redis, samples)
        })
    };

    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..200u64 {
        let app = if worker % 2 == 0 {
            a.clone_client()
        } else {
            b.clone_client()
        };
        let (holding, most, granted, denied, attempts, filled) = (
            holding.clone(),
            most.clone(),
            granted.clone(),
            denied.clone(),
            attempts.clone(),
            filled.clone(),
        );
        tasks.spawn(async move {
            while attempts.fetch_add(1, Ordering::Relaxed) < 10_000 {
                let (status, body, lease) = acquire(&app, "exports", "acme").await;
                match status {
                    200 => {
                        let lease = lease.expect("an allowed check holds a lease");
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        granted.fetch_add(1, Ordering::Relaxed);
                        let remaining = body["results"][0]["remaining"].as_u64().unwrap();
                        assert!(remaining < 25, "{body}");
                        if remaining == 0 {
                            filled.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(Duration::from_micros(worker * 37 % 3000)).await;
                        holding.fetch_sub(1, Ordering::SeqCst);
                        assert_eq!(release(&app, &[&lease]).await, vec![true]);
                    }
                    429 => {
                        assert!(lease.is_none(), "a denied check holds no lease: {body}");
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("status {other}: {body}"),
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let (most_in_redis, samples) = watcher.await.unwrap();
    let (granted, denied) = (
        granted.load(Ordering::Relaxed),
        denied.load(Ordering::Relaxed),
    );
    let filled = filled.load(Ordering::Relaxed);
    println!(
        "granted {granted} ({filled} took the last slot), denied {denied}, most held by callers {}, most in Redis {most_in_redis} ({samples} samples)",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(granted + denied, 10_000);
    assert!(
        most.load(Ordering::SeqCst) <= 25,
        "callers held more than the limit"
    );
    assert!(
        samples > 0 && most_in_redis > 0 && most_in_redis <= 25,
        "Redis held {most_in_redis} at most ({samples} samples)"
    );
    assert!(filled > 0, "the limit was reached");
    // Everything was released: all 25 are free again.
    let (status, body, _) = acquire(&a, "exports", "acme").await;
    assert_eq!(status, 200);
    assert_eq!(body["results"][0]["remaining"], 24, "{body}");
}

/// A lease never released is reclaimed once `lease_ms` has passed, not before; the denial
/// in the meantime says when at the latest.
#[tokio::test]
async fn a_lease_not_released_is_reclaimed_after_lease_ms_not_before() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("jobs", concurrency(1, 700)).await;
    let taken = Instant::now();
    let (status, _, lease) = acquire(&app, "jobs", "crashy").await;
    assert_eq!(status, 200);
    assert!(lease.is_some());
    let (status, body, _) = acquire(&app, "jobs", "crashy").await;
    assert_eq!(status, 429, "{body}");
    let retry = body["retry_after_ms"].as_u64().unwrap();
    assert!((1..=700).contains(&retry), "{body}");
    // Denied until the lease runs out...
    while taken.elapsed() < Duration::from_millis(600) {
        let (status, body, _) = acquire(&app, "jobs", "crashy").await;
        assert_eq!(status, 429, "reclaimed after {:?}: {body}", taken.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ...and allowed once it has.
    tokio::time::sleep(Duration::from_millis(750).saturating_sub(taken.elapsed())).await;
    let (status, body, lease) = acquire(&app, "jobs", "crashy").await;
    assert_eq!(status, 200, "{body}");
    assert!(lease.is_some());
}

/// Releasing frees the slot at once; releasing again says it was not held and changes
/// nothing; a renewed lease outlives its first deadline; a released one cannot be renewed.
/// Another customer's leases are their own.
#[tokio::test]
async fn release_twice_is_harmless_and_renew_extends() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("exports", concurrency(2, 800)).await;
    let (_, _, first) = acquire(&app, "exports", "acme").await;
    let (_, body, second) = acquire(&app, "exports", "acme").await;
    assert_eq!(body["results"][0]["remaining"], 0);
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_ne!(first, second);
    let (status, _, _) = acquire(&app, "exports", "other").await;
    assert_eq!(status, 200, "another customer has slots of its own");
    assert_eq!(acquire(&app, "exports", "acme").await.0, 429);

    assert_eq!(release(&app, &[&first]).await, vec![true]);
    assert_eq!(release(&app, &[&first, &first]).await, vec![false, false]);
    let (status, body, third) = acquire(&app, "exports", "acme").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["remaining"], 0,
        "released twice, freed once: {body}"
    );
    assert_eq!(acquire(&app, "exports", "acme").await.0, 429);

    // Renew the second lease at 500 ms: it holds past its first deadline (800 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = app
        .post_as_service("/api/v1/leases/renew", json!({"lease": second}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["renewed"], true);
    let left = body["results"][0]["expires_in_ms"].as_u64().unwrap();
    assert!((700..=800).contains(&left), "{body}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    // 950 ms after it was taken: the third lease ran out, the renewed second holds.
    let (status, body, fourth) = acquire(&app, "exports", "acme").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["remaining"], 0,
        "the renewed lease still holds: {body}"
    );
    assert_eq!(acquire(&app, "exports", "acme").await.0, 429);
    assert_eq!(
        release(&app, &[&second, &fourth.unwrap()]).await,
        vec![true, true]
    );
    let (_, body) = app
        .post_as_service(
            "/api/v1/leases/renew",
            json!({"leases": [second, third.unwrap()]}),
        )
        .await;
    assert_eq!(body["results"][0]["renewed"], false, "{body}");
    assert_eq!(body["results"][1]["renewed"], false, "{body}");
    assert_eq!(body["results"][0]["expires_in_ms"], Value::Null);
}

/// A lease that ran out is not held: releasing it says so (and tidies it away), renewing
/// it fails, and its slot is free whether or not a check reclaimed it first.
#[tokio::test]
async fn a_lease_that_ran_out_is_neither_released_nor_renewed() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("jobs", concurrency(2, 300)).await;
    let (_, _, first) = acquire(&app, "jobs", "slow").await;
    let (_, _, second) = acquire(&app, "jobs", "slow").await;
    let (first, second) = (first.unwrap(), second.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, body) = app
        .post_as_service("/api/v1/leases/renew", json!({"lease": first}))
        .await;
    assert_eq!(body["results"][0]["renewed"], false, "{body}");
    assert_eq!(release(&app, &[&first]).await, vec![false]);
    // The other ran out too: both slots are free, one reclaimed by this check.
    let (status, body, _) = acquire(&app, "jobs", "slow").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["remaining"], 1, "{body}");
    assert_eq!(release(&app, &[&second]).await, vec![false]);
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*jobs*slow*")
        .query(&mut conn)
        .unwrap();
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl > 0 && ttl <= 301, "{key}: {ttl}");
    }
}

/// All or nothing: a check denied by another rule takes no lease; the headers say the rule
/// counts requests in flight.
#[tokio::test]
async fn a_check_denied_elsewhere_holds_no_lease() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "mixed",
        json!({"rules": [
            {"name": "running", "algorithm": "concurrency", "limit": 5, "lease_ms": 60000},
            {"name": "hourly", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000},
        ]}),
    )
    .await;
    let r = app
        .check(json!({"policy": "mixed", "identifiers": {"customer": "acme"}}))
        .await;
    assert_eq!(r.status(), 200);
    let policy = r.headers()["ratelimit-policy"].to_str().unwrap().to_owned();
    assert!(
        policy.contains(r#""running";q=5;qu="concurrent-requests""#),
        "{policy}"
    );
    let body: Value = r.json().await.unwrap();
    assert!(body["results"][0]["lease"].is_string());
    assert!(body["results"][1].get("lease").is_none(), "{body}");
    for _ in 0..3 {
        let (status, body, lease) = acquire(&app, "mixed", "acme").await;
        assert_eq!(status, 429);
        assert!(lease.is_none());
        assert_eq!(
            body["results"][0]["remaining"], 4,
            "nothing more held: {body}"
        );
    }
}

/// Bad lease requests name their field; a wrong key is refused.
#[tokio::test]
async fn bad_lease_requests_name_the_field() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let cases = [
        (json!({}), "leases"),
        (json!({"leases": []}), "leases"),
        (json!({"leases": "x"}), "leases"),
        (json!({"leases": ["not-a-lease"]}), "leases[0]"),
        (json!({"leases": ["1.1.1.p.r.d.v", 7]}), "leases[1]"),
        (json!({"lease": "1.1.1.p.r.d.v", "leases": []}), "lease"),
        (json!({"leases": vec!["1.1.1.p.r.d.v"; 101]}), "leases"),
    ];
    for path in ["/api/v1/leases/release", "/api/v1/leases/renew"] {
        for (body, field) in &cases {
            let (status, problem) = app.post_as_service(path, body.clone()).await;
            assert_eq!(status, 400, "{path} {body}: {problem}");
            assert_eq!(problem["field"], *field, "{path} {body}: {problem}");
        }
        let r = app
            .client
            .post(app.url(path))
            .bearer_auth("wrong")
            .json(&json!({"lease": "1.1.1.p.r.d.v"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
}
