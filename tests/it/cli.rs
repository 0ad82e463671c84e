//! Policies as code: `spillway policy export` and `import` against a real redis-server.

use std::process::Command;

use serde_json::json;

use crate::helpers::{RedisServer, spawn_app};

fn spillway(redis: &RedisServer, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .env("REDIS_URL", redis.url())
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

#[tokio::test]
async fn export_then_import_restores_policies_after_losing_redis() {
    let mut redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy("api", json!({"description": "x", "rules": [{"name": "r", "algorithm": "gcra", "rate": 5, "period_ms": 1000, "burst": 2}],
        "overrides": [{"match": "ip=10.0.0.0/8", "action": "unlimited"}]}))
        .await;
    drop(app);
    let dir = std::env::temp_dir().join(format!("spillway-cli-{}", redis.port));
    std::fs::create_dir_all(&dir).unwrap();
    for format in ["json", "toml"] {
        let file = dir.join(format!("policies.{format}"));
        let out = spillway(
            &redis,
            &[
                "policy",
                "export",
                "--format",
                format,
                "--output",
                file.to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("10.0.0.0/8") && text.contains("gcra"),
            "{text}"
        );
    }

    redis.restart(); // empty: everything lost
    let out = spillway(
        &redis,
        &[
            "policy",
            "import",
            dir.join("policies.toml").to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("imported 2 policies"));
    let app = spawn_app(&redis).await;
    let restored = app
        .client
        .get(app.url("/api/v1/policies/api"))
        .bearer_auth(crate::helpers::ADMIN_KEY)
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = restored.json().await.unwrap();
    assert_eq!(body["rules"][0]["algorithm"], "gcra");
    assert_eq!(body["overrides"][0]["match"], "ip=10.0.0.0/8");

    // A document with one bad policy changes nothing at all.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"policies": {"api": {"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 9, "window_ms": 1000}]},
        "broken": {"rules": []}}}"#).unwrap();
    let out = spillway(&redis, &["policy", "import", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("policies.broken.rules"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let still: serde_json::Value = app
        .client
        .get(app.url("/api/v1/policies/api"))
        .bearer_auth(crate::helpers::ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(still["rules"][0]["algorithm"], "gcra");
    let _ = std::fs::remove_dir_all(&dir);
}
