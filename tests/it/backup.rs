//! `spillway backup` and `spillway restore`: what admins made (a policy with its versions
//! and an override, users, an API key, an alert rule) survives a Redis that lost it; a
//! restore over a Redis that holds anything is refused unless asked to replace it; a file
//! that is not a backup is refused naming the field.

use serde_json::json;

use crate::cli::{spillway, spillway_stdin};
use crate::helpers::{PATIENCE, RedisServer, eventually, spawn_app};

#[tokio::test]
async fn a_backup_brings_back_policies_versions_users_keys_and_alerts_into_an_empty_redis() {
    let mut redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = |limit: u64| json!({"name": "per-hour", "algorithm": "fixed_window", "limit": limit, "window_ms": 3_600_000});
    app.put_policy("bk", json!({"rules": [rule(2)]})).await;
    app.put_policy(
        "bk",
        json!({"rules": [rule(3)], "overrides": [{"match": "user=vip", "action": "unlimited"}]}),
    )
    .await;
    let (status, _saved) = crate::alerts::put_alert(
        &app,
        "bk-denials",
        json!({"condition": {"kind": "policy_denials", "policy": "bk", "per_second": 5.0, "for_seconds": 2},
            "webhook_url": "https://hooks.example.com/spillway", "secret": "a-secret-of-enough-length-0123456789"}),
    )
    .await;
    assert_eq!(status, 200, "{_saved}");
    let added = spillway_stdin(
        &redis,
        &[
            "user",
            "add",
            "ops",
            "--role",
            "support",
            "--password-stdin",
        ],
        "a long enough password\n",
    );
    assert!(added.status.success());
    let out = spillway(&redis, &["key", "add", "billing", "--role", "service"]);
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let key = printed
        .split_whitespace()
        .find(|w| w.starts_with("spw_svc_"))
        .expect("the key is printed")
        .to_owned();
    drop(app);

    let dir = std::env::temp_dir().join(format!("spillway-backup-{}", redis.port));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("backup.json");
    let out = spillway(&redis, &["backup", "-o", file.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("2 policies, 2 users, 1 API key, 1 alert rule"),
        "{said}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "a backup holds password hashes");

    redis.restart(); // empty: everything lost
    let out = spillway(&redis, &["restore", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let app = spawn_app(&redis).await;
    // bk and the demo policy the first start seeded.
    let policy = app.get_policy("bk").await;
    assert_eq!(
        (
            &policy["version"],
            &policy["rules"][0]["limit"],
            &policy["overrides"][0]["match"]
        ),
        (&json!(2), &json!(3), &json!("user=vip")),
        "{policy}"
    );
    let versions = app
        .as_admin(reqwest::Method::GET, "/api/v1/policies/bk/versions", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        versions.contains("\"limit\":2"),
        "version 1 is back: {versions}"
    );
    let users = String::from_utf8_lossy(&spillway(&redis, &["user", "list"]).stdout).to_string();
    assert!(
        users.contains("ops") && users.contains("support"),
        "{users}"
    );
    let check = async || {
        app.client
            .post(app.url("/api/v1/check"))
            .bearer_auth(&key)
            .json(&json!({"policy": "bk", "identifiers": {"user": "ann"}}))
            .send()
            .await
            .unwrap()
            .status()
    };
    eventually("the key made before working", PATIENCE, check, |s| {
        *s == 200
    })
    .await;
    let alerts = app
        .as_admin(reqwest::Method::GET, "/api/v1/alerts", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(alerts.contains("bk-denials"), "{alerts}");

    // Over a Redis that holds something: refused, unless asked to replace it.
    let out = spillway(&redis, &["restore", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--replace"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = spillway(&redis, &["restore", "--replace", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a backup: the field is named.
    let wrong = dir.join("wrong.json");
    std::fs::write(&wrong, r#"{"format": "other", "version": 1, "taken_at_ms": 0, "policies": {}, "policy_versions": {}, "policy_history": {}, "users": {}, "api_keys": {}, "alert_rules": {}}"#).unwrap();
    let out = spillway(&redis, &["restore", "--replace", wrong.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("format"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
