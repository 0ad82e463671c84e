//! envoyproxy/ratelimit's environment and its runtime folder: the real binary started with
//! Istio's guide's variables (and nothing of Spillway's own), and a domains folder swapped
//! the way Kubernetes swaps a mounted ConfigMap.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    envoy::{OK, OVER, ask, client, descriptor, request},
    helpers::{ADMIN_KEY, PATIENCE, RedisServer, TestApp, eventually, free_port, spawn_app_with},
    listeners_tls::Folder,
};

/// A domain file of one `user` rule of `limit` an hour.
fn domain(name: &str, limit: u32) -> String {
    format!(
        "domain: {name}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    )
}

/// Lays `files` out as Kubernetes mounts a ConfigMap: each a symlink into `..data`, itself a
/// symlink to a timestamped folder that is swapped whole (rename over `..data`).
fn configmap(dir: &Path, version: u32, files: &[(&str, &str)]) {
    let target = format!("..{version}");
    std::fs::create_dir_all(dir.join(&target)).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(&target).join(name), text).unwrap();
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// The limit the domain's `user` rule has as stored (`None` while it is not loaded).
pub(crate) async fn limit_of(app: &TestApp, domain: &str) -> Option<u64> {
    let r = app
        .client
        .get(app.url(&format!("/api/v1/envoy/domains/{domain}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    if !r.status().is_success() {
        return None;
    }
    let doc: Value = r.json().await.unwrap();
    doc["descriptors"][0]["rate_limit"]["requests_per_unit"].as_u64()
}

/// Waits until `domain`'s stored limit reads `want`.
async fn until_stored(app: &TestApp, domain: &str, want: u64) {
    eventually(
        &format!("{domain} stored with limit {want}"),
        PATIENCE,
        async || limit_of(app, domain).await,
        |limit| *limit == Some(want),
    )
    .await;
}

/// Whether `app` lets `hits` hits of a user never seen before through `domain`: whether the
/// limit this instance enforces is at least `hits`.
pub(crate) async fn allows(app: &TestApp, domain: &str, hits: u32) -> bool {
    static USERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let user = format!(
        "probe-{}",
        USERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut c = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", app.grpc.unwrap()),
    )
    .await
    .unwrap();
    let mut message = request(domain, vec![descriptor(&[("user", &user)])]);
    message.hits_addend = hits;
    ask(&mut c, message).await.overall_code == OK
}

/// Waits until every app enforces a limit of at least `hits`; how long it took.
async fn until_enforced(apps: &[&TestApp], domain: &str, hits: u32) -> Duration {
    let started = Instant::now();
    eventually(
        &format!("{hits} hits of {domain} allowed by each instance"),
        PATIENCE,
        async || {
            let mut allowed = Vec::new();
            for app in apps {
                allowed.push(allows(app, domain, hits).await);
            }
            allowed
        },
        |allowed| allowed.iter().all(|a| *a),
    )
    .await;
    started.elapsed()
}

/// The domains folder's problem as /readyz shows it, once there is one.
async fn problem_shown(app: &TestApp) -> String {
    eventually(
        "a domains folder problem on /readyz",
        PATIENCE,
        async || readyz(app).await["domains_folder"]["problem"].clone(),
        Value::is_string,
    )
    .await
    .as_str()
    .unwrap()
    .to_owned()
}

async fn readyz(app: &TestApp) -> Value {
    app.client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_domains_folder_follows_a_configmap_swap_on_every_instance_and_keeps_a_good_set() {
    let redis = RedisServer::start();
    let folder = Folder::new("domains-folder");
    configmap(&folder.0, 1, &[("folder.yaml", &domain("folder", 2))]);
    let dir = folder.0.to_str().unwrap();
    let one = spawn_app_with(&redis, &[("SPILLWAY_DOMAINS_DIR", dir)]).await;
    let two = spawn_app_with(&redis, &[("SPILLWAY_DOMAINS_DIR", dir)]).await;
    until_stored(&one, "folder", 2).await;
    // Loaded, it limits.
    let mut grpc = client(&one).await;
    let ask_bob = || request("folder", vec![descriptor(&[("user", "bob")])]);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut grpc, ask_bob()).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER]);
    // The folder keeps its file: the API refuses to change or delete it, naming why.
    let put = crate::envoy::put_domain(&one, "folder", &domain("folder", 100)).await;
    assert_eq!(put.status(), 409);
    let problem: Value = put.json().await.unwrap();
    assert!(
        problem.to_string().contains("managed by folder:"),
        "{problem}"
    );
    let deleted = one
        .client
        .delete(one.url("/api/v1/policies/folder?reason=test"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 409, "{}", deleted.text().await.unwrap());

    // The ConfigMap is updated: both instances enforce the new limit within 2 s.
    configmap(&folder.0, 2, &[("folder.yaml", &domain("folder", 5))]);
    let took = until_enforced(&[&one, &two], "folder", 5).await;
    // The folder and the stream are read every second or at once: about a second on an
    // idle machine (printed); the bound is loose so a busy machine does not decide.
    println!("in force on both instances after {took:?}");
    assert!(took < Duration::from_secs(6), "in force after {took:?}");

    // A broken file (and a good one beside it) loads nothing: the previous set stays, and
    // /readyz names the file and the field.
    configmap(
        &folder.0,
        3,
        &[
            ("folder.yaml", &domain("folder", 9)),
            (
                "broken.yaml",
                "domain: broken\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            ),
        ],
    );
    let problem = problem_shown(&two).await;
    assert!(
        problem.contains("broken.yaml") && problem.contains("unit"),
        "{problem}"
    );
    assert_eq!(limit_of(&one, "folder").await, Some(5));
    assert!(!allows(&one, "folder", 6).await);
    assert_eq!(limit_of(&one, "broken").await, None);

    // Fixed, the whole set loads.
    configmap(
        &folder.0,
        4,
        &[
            ("folder.yaml", &domain("folder", 9)),
            ("broken.yaml", &domain("broken", 1)),
        ],
    );
    until_enforced(&[&one, &two], "folder", 9).await;
    until_stored(&one, "broken", 1).await;
    assert_eq!(readyz(&one).await["domains_folder"]["problem"], Value::Null);

    // A file removed takes its domain with it: the folder is the whole set.
    std::fs::remove_file(folder.0.join("broken.yaml")).unwrap();
    configmap(&folder.0, 5, &[("folder.yaml", &domain("folder", 9))]);
    eventually(
        "broken deleted",
        PATIENCE,
        async || limit_of(&one, "broken").await,
        Option::is_none,
    )
    .await;
    assert_eq!(limit_of(&two, "folder").await, Some(9));
}

/// The real binary as Istio's guide deploys envoyproxy/ratelimit: its variables only.
struct Upstream {
    child: Child,
    http: u16,
    grpc: u16,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn istios_guide_environment_serves_as_envoyproxy_ratelimit_would() {
    // The test's own HTTP client needs rustls's provider (no app is started in-process).
    spillway::install_tls_provider();
    let redis = RedisServer::start();
    let root = Folder::new("runtime-root");
    let config = root.0.join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), domain("ratelimit", 2)).unwrap();
    let redis_address = redis.url().trim_start_matches("redis://").to_owned();
    let (http, grpc) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs([
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis_address.as_str()),
            ("USE_STATSD", "false"),
            ("RUNTIME_ROOT", root.0.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("HOST", "127.0.0.1"),
            ("PORT", &http.to_string()),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", &grpc.to_string()),
            // The binary's own Leptos.toml (its site), as the image has it.
            (
                "SPILLWAY_LEPTOS_TOML",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Leptos.toml"),
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Upstream { child, http, grpc };
    let http_client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", server.http);
    // upstream's probe: GET /healthcheck answers OK once started (500 while it connects).
    let answer = eventually(
        "the start on PORT (/healthcheck's status and text)",
        PATIENCE,
        async || match http_client.get(format!("{base}/healthcheck")).send().await {
            Ok(r) => Some((r.status().as_u16(), r.text().await.unwrap_or_default())),
            Err(_) => None,
        },
        |answer| answer.as_ref().is_some_and(|(status, _)| *status != 500),
    )
    .await;
    assert_eq!(answer, Some((200, "OK".to_owned())));
    // /json on PORT, without a key, from the runtime folder's domain: three in one hour's
    // window.
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    let body = json!({"domain": "ratelimit", "descriptors": [{"entries": [{"key": "user", "value": "carol"}]}]});
    let json = async || {
        let r = http_client
            .post(format!("{base}/json"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    // Until the folder's domain is loaded, a descriptor meets no limit (OK, without a
    // currentLimit): the folder is read within a second of the start (5 s allowed).
    let first = eventually(
        "the folder's domain limiting /json",
        Duration::from_secs(5),
        json,
        |(_, answer)| !answer["statuses"][0]["currentLimit"].is_null(),
    )
    .await;
    let mut codes = Vec::new();
    for (status, answer) in [first, json().await, json().await] {
        codes.push((
            status,
            answer["overallCode"].as_str().unwrap_or("").to_owned(),
        ));
    }
    assert_eq!(
        codes,
        [
            (200, "OK".to_owned()),
            (200, "OK".to_owned()),
            (429, "OVER_LIMIT".to_owned())
        ]
    );
    // gRPC on GRPC_PORT, without a key.
    let mut grpc = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://127.0.0.1:{}", server.grpc),
    )
    .await
    .unwrap();
    // No key sent: upstream has none.
    let answer = grpc
        .should_rate_limit(request("ratelimit", vec![descriptor(&[("user", "carol")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, OVER);
}

#[test]
fn what_upstream_has_and_spillway_does_not_stops_the_start_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .env_clear()
        .envs([("CONFIG_TYPE", "FILE"), ("REDIS_PERSECOND", "true")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("spillway: reading the configuration: REDIS_PERSECOND: "),
        "{stderr}"
    );
}

#[test]
fn policy_validate_checks_files_without_a_server() {
    let folder = Folder::new("validate");
    let good = folder.write("good.yaml", &domain("good", 3));
    let bad = folder.write(
        "bad.yaml",
        "domain: bad\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: -1}\n",
    );
    let twice = folder.write("twice.yaml", &domain("good", 4));
    let run = |files: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_spillway"))
            .env_clear()
            .args(["policy", "validate"])
            .args(files)
            .output()
            .unwrap()
    };
    let ok = run(&[&good]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout),
        format!("ok {good}: good\n")
    );
    let failed = run(&[&good, &bad]);
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("requests_per_unit"),
        "{stderr}"
    );
    let duplicate = run(&[&good, &twice]);
    assert!(!duplicate.status.success());
    let stderr = String::from_utf8_lossy(&duplicate.stderr);
    assert!(stderr.contains("also in"), "{stderr}");
}

/// upstream's MERGE_DOMAIN_CONFIG: a domain in two files is one, its descriptors added
/// together; a top-level key both files hold is refused, as upstream refuses it.
#[tokio::test]
async fn merged_domain_files_are_one_domain() {
    let folder = Folder::new("merge");
    let users = folder.write("users.yaml", &domain("shop", 3));
    let paths = folder.write(
        "paths.yaml",
        "domain: shop\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
    );
    let validate = |merge: &str, files: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_spillway"))
            .env_clear()
            // Upstream's environment (USE_STATSD marks it), where its variable is read.
            .envs([("USE_STATSD", "false"), ("MERGE_DOMAIN_CONFIG", merge)])
            .args(["policy", "validate"])
            .args(files)
            .output()
            .unwrap()
    };
    let merged = validate("true", &[&users, &paths]);
    assert!(
        merged.status.success(),
        "{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    assert!(!validate("false", &[&users, &paths]).status.success());
    let again = folder.write("again.yaml", &domain("shop", 5));
    let clash = validate("true", &[&users, &again]);
    let stderr = String::from_utf8_lossy(&clash.stderr);
    assert!(
        !clash.status.success()
            && stderr.contains("appears twice")
            && stderr.contains("again.yaml")
            && stderr.contains("users.yaml"),
        "{stderr}"
    );
    std::fs::remove_file(&again).unwrap();
    // The server reading the folder merges alike: both descriptors limit.
    let redis = RedisServer::start();
    let dir = folder.0.to_str().unwrap();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_DOMAINS_DIR", dir),
            ("SPILLWAY_ENVOY_MERGE_DOMAINS", "true"),
        ],
    )
    .await;
    let keys = eventually(
        "the merged domain stored",
        PATIENCE,
        async || {
            let r = app
                .client
                .get(app.url("/api/v1/envoy/domains/shop"))
                .bearer_auth(ADMIN_KEY)
                .send()
                .await
                .unwrap();
            let doc: Value = r.json().await.unwrap_or(Value::Null);
            doc["descriptors"].as_array().map(|d| {
                d.iter()
                    .map(|d| d["key"].as_str().unwrap_or("").to_owned())
                    .collect::<Vec<_>>()
            })
        },
        |keys| keys.as_ref().is_some_and(|k| k.len() == 2),
    )
    .await;
    // The folder's files are read in name order: paths.yaml's descriptors come first.
    assert_eq!(keys.unwrap(), ["path", "user"]);
}

/// The dashboard says who keeps a domain, refuses to save its file, and says when the
/// folder does not load.
#[tokio::test]
async fn the_dashboard_shows_a_folders_domains_as_managed_and_its_problem() {
    use crate::auth::{Visitor, add_user, store};
    let redis = RedisServer::start();
    let folder = Folder::new("domains-dashboard");
    folder.write("kept.yaml", &domain("kept", 3));
    let app = spawn_app_with(
        &redis,
        &[("SPILLWAY_DOMAINS_DIR", folder.0.to_str().unwrap())],
    )
    .await;
    until_stored(&app, "kept", 3).await;
    add_user(
        &store(&redis).await,
        "root",
        spillway::domain::people::Role::Admin,
    )
    .await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let page = v.get("/policy?name=kept").await.text().await.unwrap();
    assert!(
        page.contains("Managed by folder:") && page.contains("edits here are refused"),
        "no managed notice"
    );
    let csrf = v.csrf().await;
    let origin = v.origin();
    let saved = v
        .post_form(
            "/fn/envoy_save",
            &[
                ("csrf", csrf.as_str()),
                ("name", "kept"),
                ("version", "1"),
                ("file", &domain("kept", 300)),
                ("counting", "default"),
            ],
            Some(&origin),
        )
        .await;
    let status = saved.status();
    let body = saved.text().await.unwrap();
    assert!(
        status.is_client_error() && body.contains("managed by folder:"),
        "{status}: {body}"
    );
    assert_eq!(limit_of(&app, "kept").await, Some(3));

    folder.write("broken.yaml", "domain: [\n");
    eventually(
        "the folder's problem on the dashboard (does not load, broken.yaml)",
        PATIENCE,
        async || {
            let page = v.get("/policies").await.text().await.unwrap();
            (page.contains("does not load"), page.contains("broken.yaml"))
        },
        |shown| *shown == (true, true),
    )
    .await;
}

/// A folder keeps only what it created: a domain made through the API is not taken (the
/// folder's set is refused, naming who holds it) and so is never deleted with a file; once
/// deleted through the API (handed over), the folder creates it. A file over 1 MiB is
/// refused unread, and /readyz, which anyone may read, names the file and field without
/// quoting what the file holds.
#[tokio::test]
async fn a_folder_never_takes_a_domain_it_did_not_create() {
    let redis = RedisServer::start();
    let folder = Folder::new("domains-owner");
    let app = spawn_app_with(
        &redis,
        &[("SPILLWAY_DOMAINS_DIR", folder.0.to_str().unwrap())],
    )
    .await;
    let put = app
        .client
        .put(app.url("/api/v1/envoy/domains/owned"))
        .bearer_auth(ADMIN_KEY)
        .header("content-type", "application/yaml")
        .body(domain("owned", 3))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    configmap(&folder.0, 1, &[("owned.yaml", &domain("owned", 50))]);
    let problem = problem_shown(&app).await;
    assert!(problem.contains("does not load"), "{problem}");
    assert_eq!(
        limit_of(&app, "owned").await,
        Some(3),
        "the API's domain stays"
    );
    // Removing the file deletes nothing the folder did not create.
    std::fs::remove_file(folder.0.join("owned.yaml")).unwrap();
    configmap(&folder.0, 2, &[]);
    eventually(
        "the empty set loaded (no problem on /readyz)",
        PATIENCE,
        async || readyz(&app).await["domains_folder"]["problem"].clone(),
        Value::is_null,
    )
    .await;
    assert_eq!(limit_of(&app, "owned").await, Some(3));

    // Handed over: deleted through the API, then the folder creates it.
    let deleted = app
        .client
        .delete(app.url("/api/v1/policies/owned"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    configmap(&folder.0, 3, &[("owned.yaml", &domain("owned", 50))]);
    until_stored(&app, "owned", 50).await;

    // A secret-looking value in a broken file is not on /readyz; a huge file is refused.
    configmap(
        &folder.0,
        4,
        &[
            ("owned.yaml", &domain("owned", 50)),
            (
                "leak.yaml",
                "domain: leak\ndescriptors: s3cr3t-token-value\n",
            ),
        ],
    );
    let problem = problem_shown(&app).await;
    assert!(problem.contains("leak.yaml"), "{problem}");
    assert!(!problem.contains("s3cr3t"), "{problem}");
    let huge = "#".repeat(1024 * 1024 + 1);
    std::fs::remove_file(folder.0.join("leak.yaml")).unwrap();
    configmap(
        &folder.0,
        5,
        &[("owned.yaml", &domain("owned", 50)), ("huge.yaml", &huge)],
    );
    eventually(
        "huge.yaml named on /readyz",
        PATIENCE,
        async || readyz(&app).await["domains_folder"]["problem"].clone(),
        |problem| problem.as_str().is_some_and(|p| p.contains("huge.yaml")),
    )
    .await;
    assert_eq!(
        limit_of(&app, "owned").await,
        Some(50),
        "the good set stays"
    );
}
