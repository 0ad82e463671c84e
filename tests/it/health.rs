//! Liveness and readiness probes.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{AppProcess, PATIENCE, RedisServer, TestApp, eventually, spawn_app};

#[tokio::test]
async fn healthz_answers_without_redis() {
    let mut redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    redis.kill();
    let response = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], "ok");
}

#[tokio::test]
async fn readyz_runs_a_script_on_redis() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let response = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], "ready");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let server_us = body["redis"]["server_time_us"].as_i64().unwrap();
    assert!(
        (server_us - now_us).abs() < 5_000_000,
        "redis clock {server_us} vs ours {now_us}"
    );

    // The probe is a script, so Redis's script cache now holds it.
    let mut conn = redis.connection();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    assert!(
        stats.contains("cmdstat_evalsha") || stats.contains("cmdstat_eval:"),
        "{stats}"
    );
}

/// The log lines in `log` (what the process printed that is not a log line, such as
/// Leptos's note on a binary built without cargo-leptos, aside).
fn log_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            ["ERROR", "WARN", "INFO", "DEBUG"]
                .iter()
                .any(|level| l.contains(level))
        })
        .count()
}

/// `/readyz`: the status and the answer.
async fn readyz(app: &TestApp) -> (u16, Value) {
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

/// A Redis outage keeps the instance ready (readiness means "able to answer"): /readyz and
/// upstream's /healthcheck stay 200 and say Redis is down, each policy answers by its
/// failure mode, and the log says the outage in a handful of lines, not one per request.
#[tokio::test]
async fn a_redis_outage_keeps_the_instance_ready_and_serving_failure_modes() {
    let mut redis = RedisServer::start();
    let process = AppProcess::start(&redis);
    let app = TestApp::remote(process.addr);
    for (name, failure_mode) in [("opens", "open"), ("closes", "closed")] {
        app.put_policy(
            name,
            json!({"failure_mode": failure_mode, "rules": [
                {"name": "per-minute", "algorithm": "fixed_window", "limit": 1000, "window_ms": 60000}]}),
        )
        .await;
    }
    let check =
        |policy: &'static str| app.check(json!({"policy": policy, "identifiers": {"user": "bob"}}));
    assert_eq!(check("opens").await.status(), 200);
    assert_eq!(check("closes").await.status(), 200);

    redis.kill();
    let outage = Instant::now();
    let mut answered = 0;
    while outage.elapsed() < Duration::from_secs(3) {
        let open = check("opens").await;
        assert_eq!(open.status(), 200, "failure_mode open answers 200");
        let body: Value = open.json().await.unwrap();
        assert_eq!(body["degraded"], true, "{body}");
        assert_eq!(
            check("closes").await.status(),
            503,
            "failure_mode closed answers 503"
        );
        let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "ready through the outage");
        let ready: Value = ready.json().await.unwrap();
        assert_eq!(ready["redis"]["status"], "down", "{ready}");
        let upstream = app
            .client
            .get(app.url("/healthcheck"))
            .send()
            .await
            .unwrap();
        assert_eq!(upstream.status(), 200, "upstream's probe too");
        answered += 1;
    }
    assert!(app.metrics().await.contains("spillway_redis_up 0"));

    redis.restart();
    eventually(
        "readyz saying Redis is up",
        PATIENCE,
        async || readyz(&app).await,
        |(_, ready)| ready["redis"]["status"] == "up",
    )
    .await;
    eventually(
        "checks counting again",
        PATIENCE,
        async || check("closes").await.status(),
        |status| *status == 200,
    )
    .await;
    let log = process.log();
    let lines = log_lines(&log);
    eprintln!("{answered} rounds of checks and probes in the outage; the log:\n{log}");
    assert!(
        lines <= 6,
        "a 3 s outage with {} requests wrote {lines} lines:\n{log}",
        answered * 4
    );
}

/// A start while Redis is down does not exit: the process is alive (/healthz 200), not
/// ready (/readyz 503), and becomes ready once Redis answers.
#[tokio::test]
async fn a_start_without_redis_waits_for_it() {
    let mut redis = RedisServer::start();
    redis.kill();
    let process = AppProcess::start_with(&redis, &[("SPILLWAY_GRPC_ADDR", "")]);
    let app = TestApp::remote(process.addr);
    let alive = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(alive.status(), 200);
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(ready.headers()["content-type"], "application/problem+json");
    let body: Value = ready.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://spillway.dev/problems/policies-not-loaded"
    );
    // It says once that it waits (and goes on answering as above meanwhile).
    eventually(
        "the log saying it waits for Redis",
        PATIENCE,
        async || process.log(),
        |log| log.contains("Redis cannot be reached"),
    )
    .await;
    assert_eq!(
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );

    redis.restart();
    eventually(
        "ready once Redis answers",
        PATIENCE,
        async || readyz(&app).await,
        |(status, _)| *status == 200,
    )
    .await;
    app.put_policy(
        "later",
        json!({"rules": [{"name": "per-minute", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000}]}),
    )
    .await;
    let check = || app.check(json!({"policy": "later", "identifiers": {"user": "bob"}}));
    assert_eq!(check().await.status(), 200);
    assert_eq!(check().await.status(), 429);
    let log = process.log();
    assert!(log_lines(&log) <= 3, "{} lines: {log}", log_lines(&log));
}
