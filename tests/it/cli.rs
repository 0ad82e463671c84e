//! Policies as code: `spillway policy export` and `import` against a real redis-server.

use std::process::Command;

use serde_json::json;

use crate::helpers::{PATIENCE, RedisServer, eventually, spawn_app};

pub(crate) fn spillway(redis: &RedisServer, args: &[&str]) -> std::process::Output {
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

pub(crate) fn spillway_stdin(
    redis: &RedisServer,
    args: &[&str],
    input: &str,
) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .env("REDIS_URL", redis.url())
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn users_and_keys_are_managed_from_the_command_line() {
    let redis = RedisServer::start();
    let out = spillway_stdin(
        &redis,
        &[
            "user",
            "add",
            "ann",
            "--role",
            "support",
            "--password-stdin",
        ],
        "a long enough password\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A short password is refused, naming the field.
    let out = spillway_stdin(
        &redis,
        &["user", "add", "bob", "--password-stdin"],
        "short\n",
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("password"));
    // Without --password-stdin a password is generated and printed once.
    let out = spillway(&redis, &["user", "add", "cat", "--role", "admin"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("added cat (admin) with password"), "{text}");
    let list = String::from_utf8_lossy(&spillway(&redis, &["user", "list"]).stdout).to_string();
    assert!(
        list.contains("ann") && list.contains("support") && list.contains("cat"),
        "{list}"
    );
    // The last admin cannot be removed; a support user can.
    let out = spillway(&redis, &["user", "remove", "cat"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("last admin"));
    assert!(
        spillway(&redis, &["user", "remove", "ann"])
            .status
            .success()
    );

    // A key made on the command line works on a running server, and revoking it stops it.
    let app = spawn_app(&redis).await;
    let out = spillway(&redis, &["key", "add", "billing", "--role", "service"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let key = text
        .split_whitespace()
        .find(|w| w.starts_with("spw_svc_"))
        .expect("the key is printed")
        .to_owned();
    let id = text
        .split("(id ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .to_owned();
    let check = async || {
        app.client
            .post(app.url("/api/v1/check"))
            .bearer_auth(&key)
            .json(&json!({"policy": "demo", "identifiers": {"user": "1"}}))
            .send()
            .await
            .unwrap()
            .status()
    };
    eventually("the new key working", PATIENCE, check, |s| *s == 200).await;
    assert!(spillway(&redis, &["key", "revoke", &id]).status.success());
    eventually("the revoked key refused", PATIENCE, check, |s| *s == 401).await;
    let keys = String::from_utf8_lossy(&spillway(&redis, &["key", "list"]).stdout).to_string();
    assert!(
        keys.contains("billing") && keys.contains("revoked"),
        "{keys}"
    );
    // Every change is in the audit log, by the command line.
    let mut conn = redis.connection();
    let actions: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("spw:{audit}:log")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let actions: Vec<String> = actions
        .iter()
        .map(|(_, f)| f.iter().find(|(k, _)| k == "action").unwrap().1.clone())
        .collect();
    assert_eq!(
        actions,
        [
            "user.add",
            "user.add",
            "user.remove",
            "key.create",
            "key.revoke"
        ],
        "the app's first start found users and created no admin"
    );
}

/// `spillway policy import` takes envoyproxy/ratelimit's files: several domains in one YAML
/// file, all or nothing.
#[tokio::test]
async fn import_loads_envoy_domain_files_all_or_nothing() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let dir = std::env::temp_dir().join(format!("spillway-cli-envoy-{}", redis.port));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("config.yaml");
    std::fs::write(
        &good,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n---\ndomain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit: {unit: second, requests_per_unit: 500}\n",
    )
    .unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: other\ndescriptors:\n  - key: a\n---\ndomain: broken\ndescriptors:\n  - key: a\n    rate_limit: {unit: lightyear, requests_per_unit: 1}\n",
    )
    .unwrap();
    let out = spillway(&redis, &["policy", "import", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("documents[1].descriptors[0].rate_limit.unit"),
        "{err}"
    );
    let out = spillway(&redis, &["policy", "import", good.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("imported 2 policies"));
    for (domain, missing) in [("edge", false), ("mongo_cps", false), ("other", true)] {
        let r = app
            .client
            .get(app.url(&format!("/api/v1/envoy/domains/{domain}")))
            .bearer_auth(crate::helpers::ADMIN_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status() == 404, missing, "{domain}");
    }
    // A plain policy in an export does not replace a domain: nothing imported.
    let plain = dir.join("plain.json");
    std::fs::write(&plain, r#"{"policies": {"edge": {"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 9, "window_ms": 1000}]}}}"#).unwrap();
    let out = spillway(&redis, &["policy", "import", plain.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is the Envoy domain \"edge\""), "{err}");
    let r = app
        .client
        .get(app.url("/api/v1/envoy/domains/edge"))
        .bearer_auth(crate::helpers::ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// How an Envoy domain counts a request over its limit survives export and import, and a
/// domain file imported without saying keeps the domain's setting.
#[tokio::test]
async fn a_domains_counting_survives_export_and_import() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let file = "domain: tokens\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let r = crate::envoy::put_domain_with(&app, "tokens?counting=all_or_nothing", file).await;
    assert_eq!(r.status(), 201);
    let out = spillway(&redis, &["policy", "export"]);
    assert!(out.status.success());
    let export = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        export.contains(r#""counting": "all_or_nothing""#),
        "{export}"
    );
    let counting = |app: &crate::helpers::TestApp| {
        let request = app
            .client
            .get(app.url("/api/v1/policies/tokens"))
            .bearer_auth(crate::helpers::ADMIN_KEY)
            .send();
        async move {
            let policy: serde_json::Value = request.await.unwrap().json().await.unwrap();
            policy["envoy"]["counting"].clone()
        }
    };
    // Into a Redis that has lost everything.
    let other = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("spillway-cli-counting-{}", other.port));
    std::fs::create_dir_all(&dir).unwrap();
    let exported = dir.join("policies.json");
    std::fs::write(&exported, &export).unwrap();
    let out = spillway(&other, &["policy", "import", exported.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored = spawn_app(&other).await;
    assert_eq!(counting(&restored).await, "all_or_nothing");
    // The domain's file again, without `counting`: the domain keeps its setting.
    let yaml = dir.join("tokens.yaml");
    std::fs::write(&yaml, file).unwrap();
    let out = spillway(&other, &["policy", "import", yaml.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counting(&restored).await, "all_or_nothing");
}
