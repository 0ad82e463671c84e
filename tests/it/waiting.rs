//! Waiting instead of refusing (issue 36, item 4): a policy with `on_deny: wait` has
//! forward-auth hold a denied request until it would pass, within `max_wait_ms`; the JSON
//! check still answers at once; waiters are bounded, and those turned away are counted.

use std::{collections::BTreeMap, time::SystemTime};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{RedisServer, SERVICE_KEY, TestApp, spawn_app, spawn_app_with};

/// 10 a second per client address; a denied request waits up to `max_wait_ms`.
fn ten_a_second(max_wait_ms: u64, window_ms: u64) -> Value {
    json!({"strict": false, "on_deny": "wait", "max_wait_ms": max_wait_ms, "rules": [
        {"name": "per-second", "algorithm": "fixed_window", "limit": 10, "window_ms": window_ms}
    ]})
}

/// One forward-auth request from `ip`: its status, and the window (ms since the epoch, at
/// its end) it was decided in, from the answer's `reset_ms` and the clock when it came.
async fn forward(app: &TestApp, policy: &str, ip: &str) -> (u16, u64) {
    let r = app
        .client
        .get(app.url(&format!("/api/v1/forward-auth?policy={policy}")))
        .header("X-Spillway-Key", SERVICE_KEY)
        .header("X-Forwarded-For", ip)
        .send()
        .await
        .unwrap();
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    let reset = body["reset_ms"].as_u64().unwrap_or(0);
    // Window ends are whole seconds: the clock when the answer came, plus what was left of
    // its window when it was decided, is that end plus the answer's latency (under 1 s).
    let window_end = (now_ms + reset) / 1000 * 1000;
    (status, window_end)
}

/// `n` forward-auth requests from `ip` at once; their answers as [`forward`] gives them.
async fn burst(app: &TestApp, policy: &str, ip: &str, n: usize) -> Vec<(u16, u64)> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (app, policy, ip) = (app.clone_client(), policy.to_owned(), ip.to_owned());
        tasks.spawn(async move { forward(&app, &policy, &ip).await });
    }
    tasks.join_all().await
}

#[tokio::test]
async fn a_burst_through_forward_auth_comes_out_at_the_rate_none_refused() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("smooth", ten_a_second(8_000, 1000)).await;
    let answers = burst(&app, "smooth", "198.51.100.7", 50).await;
    let mut per_window: BTreeMap<u64, u32> = BTreeMap::new();
    for (status, window) in &answers {
        assert_eq!(*status, 200, "{answers:?}");
        *per_window.entry(*window).or_default() += 1;
    }
    assert!(
        per_window.len() >= 5,
        "50 at 10 a second take five windows: {per_window:?}"
    );
    assert!(per_window.values().all(|n| *n <= 10), "{per_window:?}");
    // Those denied at first waited and passed (how many depends on when each arrived);
    // none was turned away.
    let metrics = app.metrics().await;
    let waits: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with(r#"spillway_waits_total{policy="smooth""#))
        .collect();
    assert!(
        waits
            .iter()
            .any(|l| l.starts_with(r#"spillway_waits_total{policy="smooth",outcome="passed"}"#)),
        "{waits:?}"
    );
    assert!(
        waits.iter().all(|l| l.contains(r#"outcome="passed""#)),
        "{waits:?}"
    );
    // The JSON check answers at once: its caller decides whether to wait.
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(1)).await;
    let r = app
        .check(json!({"policy": "smooth", "identifiers": {"ip": "198.51.100.8"}}))
        .await;
    assert_eq!(r.status(), 200);
    for _ in 0..10 {
        app.check(json!({"policy": "smooth", "identifiers": {"ip": "198.51.100.8"}}))
            .await;
    }
    let r = app
        .check(json!({"policy": "smooth", "identifiers": {"ip": "198.51.100.8"}}))
        .await;
    assert_eq!(r.status(), 429);
    assert!(
        r.json::<Value>().await.unwrap()["retry_after_ms"]
            .as_u64()
            .unwrap()
            <= 1000
    );
}

#[tokio::test]
async fn waiters_are_bounded_and_a_wait_past_max_wait_is_refused_at_once() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_MAX_WAITING", "5")]).await;
    // A minute's window (with at least 10 s of it left): none of its denials can pass
    // within a 3 s wait, so each is refused at once (counted too_long, never waited).
    app.put_policy("patient", ten_a_second(3_000, 60_000)).await;
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(60)).await;
    let answers = burst(&app, "patient", "198.51.100.9", 15).await;
    assert_eq!(answers.iter().filter(|(s, _)| *s == 200).count(), 10);
    assert_eq!(answers.iter().filter(|(s, _)| *s == 429).count(), 5);
    let metrics = app.metrics().await;
    assert!(metrics.contains(r#"spillway_waits_total{policy="patient",outcome="too_long"} 5"#));

    // A second's window: the denials could pass, but only 5 may wait at once; the rest
    // are refused at once, each counted.
    app.put_policy("bounded", ten_a_second(3_000, 1000)).await;
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(1)).await;
    let answers = burst(&app, "bounded", "198.51.100.10", 30).await;
    let refused = answers.iter().filter(|(s, _)| *s == 429).count();
    let metrics = app.metrics().await;
    let full = metrics
        .lines()
        .find(|l| l.starts_with(r#"spillway_waits_total{policy="bounded",outcome="full"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .unwrap_or(0);
    assert!(refused >= 1, "30 against 10 now and 5 waiting: {answers:?}");
    assert_eq!(
        full, refused,
        "every refusal for want of a place is counted"
    );
}

#[tokio::test]
async fn max_wait_is_refused_naming_the_field_unless_waiting() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    for (doc, field) in [
        (json!({"on_deny": "wait"}), "max_wait_ms"),
        (json!({"on_deny": "wait", "max_wait_ms": 0}), "max_wait_ms"),
        (
            json!({"on_deny": "wait", "max_wait_ms": 60_001}),
            "max_wait_ms",
        ),
        (json!({"max_wait_ms": 500}), "max_wait_ms"),
        (json!({"on_deny": "later"}), "on_deny"),
    ] {
        let mut body = doc.clone();
        body["rules"] =
            json!([{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]);
        let r = app
            .as_admin(Method::PUT, "/api/v1/policies/w", Some(&body))
            .await;
        assert_eq!(r.status(), 400, "{doc}");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["field"], field, "{doc}: {problem}");
    }
    app.put_policy("w", ten_a_second(250, 1000)).await;
    let stored: Value = app
        .as_admin(Method::GET, "/api/v1/policies/w", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (stored["on_deny"].clone(), stored["max_wait_ms"].clone()),
        (json!("wait"), json!(250))
    );
}

/// Envoy's gRPC: a domain that waits holds an over-limit request until its window ends,
/// within the call's `grpc-timeout`; a file saved again keeps the domain's waiting.
#[tokio::test]
async fn envoy_requests_wait_for_the_window_within_their_grpc_timeout() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let domain = json!({"on_deny": "wait", "max_wait_ms": 5000, "envoy": {"domain": "waits",
        "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 2}}]}});
    let r = app
        .as_admin(Method::PUT, "/api/v1/policies/waits", Some(&domain))
        .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    // The file alone saved again: the domain still waits.
    crate::envoy::load(&app, "waits", "domain: waits\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n").await;
    let grpc = tonic::transport::Channel::from_shared(format!("http://{}", app.grpc.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client =
        envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(grpc);
    let ask = |timeout: &'static str| {
        let mut c = client.clone();
        async move {
            let mut request = tonic::Request::new(crate::envoy::request(
                "waits",
                vec![crate::envoy::descriptor(&[("k", "v")])],
            ));
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {SERVICE_KEY}").parse().unwrap(),
            );
            request
                .metadata_mut()
                .insert("grpc-timeout", timeout.parse().unwrap());
            c.should_rate_limit(request)
                .await
                .unwrap()
                .into_inner()
                .overall_code
        }
    };
    // Six at once against 2 a second: all pass, over three windows.
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        tasks.spawn(ask("4S"));
    }
    let codes = tasks.join_all().await;
    assert!(codes.iter().all(|c| *c == Code::Ok as i32), "{codes:?}");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1000),
        "two windows at least"
    );
    // A window that ends past max_wait_ms (a minute's, with at least 10 s of it left): over
    // the limit at once, whatever the caller's deadline.
    let minute = json!({"on_deny": "wait", "max_wait_ms": 5000, "envoy": {"domain": "waits",
        "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 1}}]}});
    let r = app
        .as_admin(Method::PUT, "/api/v1/policies/waits", Some(&minute))
        .await;
    assert!(r.status().is_success());
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(60)).await;
    assert_eq!(ask("4S").await, Code::Ok as i32);
    let started = std::time::Instant::now();
    assert_eq!(ask("4S").await, Code::OverLimit as i32);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "refused at once"
    );
}

/// A gRPC call that names no `grpc-timeout` is still bounded by the server's request
/// timeout (`SPILLWAY_REQUEST_TIMEOUT_MS`), on the short path as on tonic's: a domain that
/// may wait a minute for its window answers within the timeout, not at the window's end.
#[tokio::test]
async fn a_grpc_call_without_a_deadline_ends_within_the_request_timeout() {
    use envoy_types::pb::envoy::service::ratelimit::v3::{
        rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient,
    };
    let redis = RedisServer::start();
    let app =
        crate::helpers::spawn_app_with(&redis, &[("SPILLWAY_REQUEST_TIMEOUT_MS", "500")]).await;
    let domain = json!({"on_deny": "wait", "max_wait_ms": 60_000, "envoy": {"domain": "slow",
        "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 1}}]}});
    let r = app
        .as_admin(Method::PUT, "/api/v1/policies/slow", Some(&domain))
        .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let grpc = tonic::transport::Channel::from_shared(format!("http://{}", app.grpc.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = RateLimitServiceClient::new(grpc);
    let ask = || {
        let mut c = client.clone();
        async move {
            let mut request = tonic::Request::new(crate::envoy::request(
                "slow",
                vec![crate::envoy::descriptor(&[("k", "v")])],
            ));
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {SERVICE_KEY}").parse().unwrap(),
            );
            c.should_rate_limit(request).await
        }
    };
    // At least 10 s before the minute turns: a wait for the window would last that long.
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(60)).await;
    assert_eq!(
        ask().await.unwrap().into_inner().overall_code,
        Code::Ok as i32
    );
    let started = std::time::Instant::now();
    let second = ask().await;
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "answered after {took:?}: the request timeout is 500 ms, the window's end 10 s or more away"
    );
    match second {
        Ok(answer) => assert_eq!(answer.into_inner().overall_code, Code::OverLimit as i32),
        Err(status) => assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}"),
    }
}

/// Waiting has a budget of its own, well under the connection cap: with 300 connections,
/// 320 forward-auth requests that would all wait (a window of 10 a 2 s window, waits of up
/// to 8 s) hold at most a quarter of the connections, the rest are answered at once, and
/// another service's checks, each on a new connection, are answered promptly and counted
/// meanwhile (with the wait budget equal to the cap, they waited 7.5 s for a connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_never_hold_up_another_policys_checks() {
    use std::time::{Duration, Instant};
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_MAX_CONNECTIONS", "300"),
            ("SPILLWAY_HEADER_READ_TIMEOUT_MS", "2000"),
        ],
    )
    .await;
    app.put_policy(
        "patient",
        json!({"strict": false, "on_deny": "wait", "max_wait_ms": 8000, "rules": [
            {"name": "slow", "algorithm": "fixed_window", "limit": 10, "window_ms": 2000}]}),
    )
    .await;
    app.put_policy(
        "other",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3_600_000}]}),
    )
    .await;
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    // The flood: each request on a connection of its own.
    let flood: Vec<_> = (0..320)
        .map(|_| {
            let url = app.url("/api/v1/forward-auth?policy=patient");
            tokio::spawn(async move {
                reqwest::Client::new()
                    .get(url)
                    .header("X-Spillway-Key", SERVICE_KEY)
                    .header("X-Forwarded-For", "198.51.100.77")
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another service meanwhile, a new connection per check.
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = Instant::now();
        let r = reqwest::Client::new()
            .post(app.url("/api/v1/check"))
            .bearer_auth(SERVICE_KEY)
            .json(&json!({"policy": "other", "identifiers": {"user": format!("u{i}")}}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        slowest = slowest.max(started.elapsed());
    }
    println!("the other service's slowest check during the flood: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "a check waited {slowest:?} behind the waiting requests"
    );
    let mut answered = 0;
    for request in flood {
        if let Ok(Ok(_)) = request.await {
            answered += 1;
        }
    }
    assert_eq!(answered, 320, "every waiting request was answered");
    let metrics = app.metrics().await;
    let full = metrics
        .lines()
        .find(|l| l.starts_with(r#"spillway_waits_total{policy="patient",outcome="full"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        full > 0,
        "past the wait budget (75) requests were answered at once"
    );
}
