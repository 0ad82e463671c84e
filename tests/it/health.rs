//! Liveness and readiness probes.

use crate::helpers::{RedisServer, spawn_app};

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

#[tokio::test]
async fn readyz_is_503_problem_json_while_redis_is_down_and_recovers() {
    let mut redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    redis.kill();
    let response = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], 503);
    assert!(body["detail"].as_str().unwrap().contains("Redis"));

    redis.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let status = app
            .client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status();
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "readyz did not recover: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
