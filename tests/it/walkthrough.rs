//! docs/services.md's "A policy for a typical API, step by step" runs as printed: its shell
//! blocks marked `<!-- walkthrough -->`, in one shell, against a fresh server (only the
//! address differs from `make run`'s), from a folder holding `.spillway/keys.env` as
//! `make run` writes it. Each answer is then held to what the page says it is.

use serde_json::Value;

use crate::helpers::{ADMIN_KEY, RedisServer, SERVICE_KEY, spawn_app};

/// The marked shell blocks of `markdown`, in order.
fn walkthrough_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("<!-- walkthrough -->\n```sh\n") {
        let body = &rest[at + "<!-- walkthrough -->\n```sh\n".len()..];
        let end = body.find("\n```").expect("a closed block");
        blocks.push(body[..end].to_owned());
        rest = &body[end..];
    }
    blocks
}

#[tokio::test]
async fn the_services_walkthrough_runs_as_printed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/services.md")).unwrap();
    let blocks = walkthrough_blocks(&page);
    assert_eq!(blocks.len(), 3, "the page's walkthrough blocks");
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let dir = std::env::temp_dir().join(format!("spillway-walkthrough-{}", app.addr.port()));
    std::fs::create_dir_all(dir.join(".spillway")).unwrap();
    std::fs::write(
        dir.join(".spillway/keys.env"),
        format!("SPILLWAY_SERVICE_KEYS={SERVICE_KEY}\nSPILLWAY_ADMIN_KEYS={ADMIN_KEY}\n"),
    )
    .unwrap();
    let script = blocks
        .join("\n")
        .replace("http://127.0.0.1:3000", &format!("http://{}", app.addr));
    let run = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("bash")
                .args(["-euo", "pipefail", "-c", &script])
                .current_dir(dir)
                .output()
                .unwrap()
        })
    };
    let out = run.await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let [saved, checked, reported, released, anonymous] = answers.as_slice() else {
        panic!("five answers expected: {stdout}");
    };
    assert_eq!(
        (&saved["name"], &saved["version"]),
        (&"api".into(), &1.into())
    );
    let rule = |answer: &Value, name: &str| -> Value {
        let list = answer["results"].as_array().or(answer["rules"].as_array());
        (list.unwrap().iter())
            .find(|r| r["rule"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {answer}"))
    };
    // One request from the rate rules, 1,500 from the budget, one slot of four.
    assert_eq!(checked["allowed"], true, "{checked}");
    assert_eq!(rule(checked, "per-user")["remaining"], 599);
    assert_eq!(rule(checked, "tokens")["remaining"], 198_500);
    assert_eq!(rule(checked, "in-flight")["remaining"], 3);
    assert!(rule(checked, "in-flight")["lease"].is_string());
    // 300 given back; the lease released; the anonymous caller counted by its address.
    assert_eq!(rule(reported, "tokens")["remaining"], 198_800, "{reported}");
    assert_eq!(released["results"][0]["released"], true, "{released}");
    assert_eq!(anonymous["allowed"], true, "{anonymous}");
    let anonymous_rules: Vec<&str> = (anonymous["results"].as_array().unwrap().iter())
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert_eq!(anonymous_rules, ["per-ip"], "{anonymous}");
}
