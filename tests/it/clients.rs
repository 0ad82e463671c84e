//! The official Rust client (clients/rust) against a real server and Redis: failure modes,
//! the denial cache, leases, reserve-then-report and its tower layer in an axum app and in
//! front of a gRPC service. The TypeScript and Python clients are driven from here too, each
//! by its own test script against a server of this test.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_client::{Client, Decision, FailMode, Failure, Identifiers, Outcome, SpillwayLayer};

use crate::helpers::{
    PATIENCE, RedisServer, SERVICE_KEY, TestApp, eventually, free_port, spawn_app,
};

const OPEN: Failure = Failure {
    unavailable: FailMode::Open,
    misconfigured: FailMode::Open,
};
const CLOSED: Failure = Failure {
    unavailable: FailMode::Closed,
    misconfigured: FailMode::Closed,
};

fn client(app: &TestApp, failure: Failure) -> Client {
    Client::new(format!("http://{}", app.addr), SERVICE_KEY, failure).unwrap()
}

fn user(name: &str) -> Identifiers {
    BTreeMap::from([("user".to_owned(), name.to_owned())])
}

fn header<'a>(decision: &'a Decision, name: &str) -> Option<&'a str> {
    decision
        .headers()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.to_str().unwrap())
}

/// `spillway_checks_total` of one policy and outcome, from `/metrics`.
async fn counted(app: &TestApp, policy: &str, outcome: &str) -> u64 {
    let text = app.metrics().await;
    text.lines()
        .find(|l| {
            l.starts_with("spillway_checks_total")
                && l.contains(&format!("policy=\"{policy}\""))
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .map_or(0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// What is left of a rule for `user` (a peek, counting nothing).
async fn remaining(app: &TestApp, policy: &str, user: &str, rule: &str) -> u64 {
    let r = app
        .as_admin(
            reqwest::Method::GET,
            &format!("/api/v1/identifiers/user/{user}"),
            None,
        )
        .await;
    let body: Value = r.json().await.unwrap();
    let text = body.to_string();
    body["policies"]
        .as_array()
        .and_then(|ps| {
            ps.iter()
                .filter(|p| p["policy"] == policy)
                .flat_map(|p| p["rules"].as_array().into_iter().flatten())
                .find(|r| r["rule"] == rule)
        })
        .and_then(|r| r["remaining"].as_u64())
        .unwrap_or_else(|| panic!("no {policy}/{rule} for {user} in {text}"))
}

#[tokio::test]
async fn a_denial_is_remembered_until_retry_after_and_its_headers_passed_on() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-cache",
        json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 2, "window_ms": 3600000}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    let first = spillway.check("rc-cache", &user("ada"), 1).await;
    assert_eq!(first.outcome(), &Outcome::Allowed);
    assert!(first.allowed() && !first.from_cache() && !first.unmatched());
    assert!(
        header(&first, "ratelimit-policy")
            .unwrap()
            .contains("hourly")
    );
    assert!(header(&first, "ratelimit").is_some());
    assert_eq!(header(&first, "retry-after"), None);
    spillway.check("rc-cache", &user("ada"), 1).await;
    let denied = spillway.check("rc-cache", &user("ada"), 1).await;
    assert!(!denied.allowed());
    assert!(
        matches!(denied.outcome(), Outcome::Limited { retry_after: Some(after) } if *after > Duration::from_secs(1))
    );
    // The window is the clock's hour: what is left of it, in whole seconds.
    let retry: u64 = header(&denied, "retry-after").unwrap().parse().unwrap();
    assert_eq!(Some(retry), denied.retry_after_secs());
    assert!(retry > 1 && retry <= 3600, "{retry}");
    let (status, problem) = denied.problem();
    assert_eq!(status, 429);
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(problem["retry_after"], retry);
    assert_eq!(counted(&app, "rc-cache", "denied").await, 1);
    // The same check again is denied from the cache: no call, the server counts nothing.
    let again = spillway.check("rc-cache", &user("ada"), 1).await;
    assert!(again.from_cache() && !again.allowed());
    assert!(header(&again, "retry-after").is_some());
    assert_eq!(counted(&app, "rc-cache", "denied").await, 1);
    // Another identifier (or cost) is its own check.
    assert!(spillway.check("rc-cache", &user("bob"), 1).await.allowed());
    let costlier = spillway.check("rc-cache", &user("ada"), 2).await;
    assert!(!costlier.from_cache());
    assert_eq!(counted(&app, "rc-cache", "denied").await, 2);
}

#[tokio::test]
async fn a_concurrency_denial_is_never_cached_and_a_lease_is_held_renewed_and_released() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    // A lease of 2 s: work of 5 s keeps its slot only if the client renews it (every 667 ms,
    // a third of the time left: a renewal may run 1.3 s late on a busy machine).
    app.put_policy(
        "rc-lease",
        json!({"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 2000}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    let other = spillway.clone();
    let out = spillway
        .with_lease("rc-lease", &user("ada"), |decision| {
            assert_eq!(decision.leases().len(), 1);
            async move {
                let (mut denied, mut allowed) = (0, 0);
                let started = Instant::now();
                while started.elapsed() < Duration::from_millis(5000) {
                    let d = other.check("rc-lease", &user("ada"), 1).await;
                    assert!(!d.from_cache(), "a concurrency denial was cached");
                    if d.allowed() {
                        allowed += 1;
                        other.release(&d.leases()).await.unwrap();
                    } else {
                        assert_eq!(d.retry_after_secs(), Some(1));
                        denied += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (denied, allowed)
            }
        })
        .await
        .unwrap();
    // Every check during the 5 s was denied: the slot was renewed past its 2 s.
    let (denied, allowed) = out;
    assert_eq!(
        allowed, 0,
        "the lease ran out while the work held it ({denied} denied)"
    );
    assert!(denied >= 3, "{denied}");
    // Released when the work ended: the slot is free at once.
    let after = spillway.check("rc-lease", &user("ada"), 1).await;
    assert!(after.allowed(), "{:?}", after.outcome());
    spillway.release(&after.leases()).await.unwrap();

    // Work that panics still gives its slot back: released, long before its 60 s lease ends.
    app.put_policy(
        "rc-lease-long",
        json!({"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 60000}]}),
    )
    .await;
    let panicking = spillway.clone();
    let task = tokio::spawn(async move {
        panicking
            .with_lease("rc-lease-long", &user("ada"), |_| async {
                panic!("the work failed");
            })
            .await
    });
    assert!(task.await.unwrap_err().is_panic());
    let d = eventually(
        "the panicked work's lease released",
        PATIENCE,
        async || spillway.check("rc-lease-long", &user("ada"), 1).await,
        Decision::allowed,
    )
    .await;
    spillway.release(&d.leases()).await.unwrap();
}

#[tokio::test]
async fn reserve_then_report_settles_the_estimate_and_gives_it_back_on_failure() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    // A token budget and one call in flight (its lease ends with the work).
    app.put_policy(
        "rc-tokens",
        json!({"rules": [
            {"name": "tokens", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000},
            {"name": "one-at-a-time", "algorithm": "concurrency", "limit": 1, "lease_ms": 60000}
        ]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    let answer = spillway
        .reserve("rc-tokens", &user("ada"), 300, |d| {
            let tokens = d
                .answer()
                .unwrap()
                .results
                .iter()
                .find(|r| r.rule == "tokens");
            assert_eq!(tokens.unwrap().remaining, 700);
            async { Ok::<_, String>(("done", 120)) }
        })
        .await
        .unwrap();
    assert_eq!(answer, Ok("done"));
    assert_eq!(remaining(&app, "rc-tokens", "ada", "tokens").await, 880);
    // Failed work gives the whole estimate back.
    let failed = spillway
        .reserve("rc-tokens", &user("ada"), 500, |_| async {
            Err::<((), u64), _>("upstream failed")
        })
        .await
        .unwrap();
    assert_eq!(failed, Err("upstream failed"));
    assert_eq!(remaining(&app, "rc-tokens", "ada", "tokens").await, 880);
    // Each reserve released its lease: the one slot is free.
    assert_eq!(
        remaining(&app, "rc-tokens", "ada", "one-at-a-time").await,
        1
    );
    // A shadow-denied check consumed nothing, so failed work gives nothing back.
    app.put_policy(
        "rc-shadow",
        json!({"mode": "shadow", "rules": [{"name": "tokens", "algorithm": "fixed_window", "limit": 100, "window_ms": 3600000}]}),
    )
    .await;
    assert!(
        spillway
            .check("rc-shadow", &user("ada"), 60)
            .await
            .allowed()
    );
    let shadowed = spillway
        .reserve("rc-shadow", &user("ada"), 50, |d| {
            assert_eq!(d.answer().unwrap().shadow_denied, Some(true));
            async { Err::<((), u64), _>("upstream failed") }
        })
        .await
        .unwrap();
    assert!(shadowed.is_err());
    assert_eq!(remaining(&app, "rc-shadow", "ada", "tokens").await, 40);
    // A cost no rule could ever allow is not a limit to wait for.
    let too_much = spillway.check("rc-tokens", &user("ada"), 5000).await;
    assert!(
        matches!(too_much.outcome(), Outcome::TooCostly { detail } if detail.contains("tokens"))
    );
    assert_eq!(too_much.problem().0, 422);
    let refused = spillway
        .reserve("rc-tokens", &user("ada"), 5000, |_| async {
            Ok::<_, ()>(((), 0))
        })
        .await;
    assert!(refused.is_err());
}

/// A reservation whose work outlasts its concurrency lease keeps the slot: the client renews
/// it while the work runs, and releases it when the work ends.
#[tokio::test]
async fn a_reservation_holds_its_lease_as_long_as_its_work() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-budget",
        json!({"rules": [
            {"name": "tokens", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3600000},
            {"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}
        ]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    let other = spillway.clone();
    let during = spillway
        .reserve("rc-budget", &user("ada"), 10, |_| async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let during = other.check("rc-budget", &user("ada"), 1).await;
            tokio::time::sleep(Duration::from_millis(1000)).await;
            Ok::<_, ()>((during, 10))
        })
        .await
        .unwrap()
        .unwrap();
    assert!(
        !during.allowed(),
        "the reservation's lease ran out while its work ran"
    );
    let refused_by: Vec<&str> = (during.answer().unwrap().results.iter())
        .filter(|r| !r.allowed)
        .map(|r| r.rule.as_str())
        .collect();
    assert_eq!(refused_by, ["one"]);
    let after = spillway.check("rc-budget", &user("ada"), 1).await;
    assert!(after.allowed(), "released when the work ended");
    spillway.release(&after.leases()).await.unwrap();
}

#[tokio::test]
async fn failure_modes_are_the_callers_choice_for_outages_and_for_configuration_errors() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-strict",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "dimensions": ["user"]}]}),
    )
    .await;
    app.put_policy(
        "rc-lenient",
        json!({"strict": false, "rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "dimensions": ["user"]}]}),
    )
    .await;
    let ip = BTreeMap::from([("ip".to_owned(), "10.0.0.7".to_owned())]);
    for (failure, goes_on) in [(OPEN, true), (CLOSED, false)] {
        let spillway = client(&app, failure);
        // A strict policy's unmatched identifiers, an unknown policy, a wrong key: each a
        // configuration error, let through or not as chosen.
        for (policy, status) in [("rc-strict", 400), ("rc-missing", 404)] {
            let d = spillway.check(policy, &ip, 1).await;
            assert!(
                matches!(d.outcome(), Outcome::Misconfigured { status: s, .. } if *s == status),
                "{policy}: {:?}",
                d.outcome()
            );
            assert_eq!(d.allowed(), goes_on);
        }
        let wrong_key =
            Client::new(format!("http://{}", app.addr), "spw_svc_wrong", failure).unwrap();
        let d = wrong_key.check("rc-strict", &user("ada"), 1).await;
        assert!(matches!(d.outcome(), Outcome::Misconfigured { status, .. } if *status == 401));
        assert_eq!(d.allowed(), goes_on);
        if !goes_on {
            assert_eq!(d.problem().0, 503);
        }
        // A lenient policy lets it through and says it was unmatched.
        let d = spillway.check("rc-lenient", &ip, 1).await;
        assert!(d.allowed() && d.unmatched());
    }
    // Nothing listening, and a listener that never answers: unavailable within the timeout.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    for url in [closed, silent_url] {
        for (failure, goes_on) in [(OPEN, true), (CLOSED, false)] {
            let spillway = Client::new(url.clone(), SERVICE_KEY, failure)
                .unwrap()
                .with_timeout(Duration::from_millis(200));
            let started = Instant::now();
            let d = spillway.check("rc-strict", &user("ada"), 1).await;
            assert!(
                matches!(d.outcome(), Outcome::Unavailable { .. }),
                "{url}: {:?}",
                d.outcome()
            );
            assert_eq!(d.allowed(), goes_on);
            // The timeout holds (200 ms; the bound leaves room for a busy machine).
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
        }
    }
    // A 200 that is not Spillway's answer is not an allow either.
    let stub = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stub_url = format!("http://{}", stub.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = stub.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5\r\n\r\nhello",
                )
                .await;
        }
    });
    let d = Client::new(stub_url, SERVICE_KEY, CLOSED)
        .unwrap()
        .check("rc-strict", &user("ada"), 1)
        .await;
    assert!(
        matches!(d.outcome(), Outcome::Unavailable { .. }),
        "{:?}",
        d.outcome()
    );
    assert!(!d.allowed());
    let spillway = client(&app, CLOSED);
    assert!(matches!(
        spillway.report("rc-missing", &user("ada"), 3).await,
        Err(spillway_client::Error::Refused { status, .. }) if status == 404
    ));
}

/// The tower layer in an axum app served on a free port: identifiers from a header, headers
/// passed on, a 429 problem for the end user, unidentified requests unchecked.
#[tokio::test]
async fn the_tower_layer_limits_an_axum_app() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-axum",
        json!({"rules": [
            {"name": "per-hour", "algorithm": "fixed_window", "limit": 2, "window_ms": 3600000},
            {"name": "in-flight", "algorithm": "concurrency", "limit": 5, "lease_ms": 30000}
        ]}),
    )
    .await;
    app.put_policy(
        "rc-slow",
        json!({"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    let by_user = |head: &spillway_client::Head<'_>| {
        let user = head.headers.get("x-user")?.to_str().ok()?;
        Some(BTreeMap::from([("user".to_owned(), user.to_owned())]))
    };
    let slow = axum::routing::get(|| async {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        "slow"
    })
    .layer(SpillwayLayer::new(spillway.clone(), "rc-slow", by_user));
    let service = axum::Router::new()
        .route("/work", axum::routing::get(|| async { "done" }))
        .route("/slow", slow)
        .layer(SpillwayLayer::new(spillway, "rc-axum", |head| {
            let user = head.headers.get("x-user")?.to_str().ok()?;
            Some(BTreeMap::from([("user".to_owned(), user.to_owned())]))
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    let http = reqwest::Client::new();
    let get = |who: Option<&'static str>| {
        let mut r = http.get(format!("http://{addr}/work"));
        if let Some(who) = who {
            r = r.header("x-user", who);
        }
        r.send()
    };
    for _ in 0..2 {
        let r = get(Some("ada")).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("per-hour")
        );
        assert!(r.headers().contains_key("ratelimit"));
        assert_eq!(r.text().await.unwrap(), "done");
    }
    let r = get(Some("ada")).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 1 && retry <= 3600, "{retry}");
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["retry_after"], retry);
    // No identifiers named: unchecked.
    assert_eq!(get(None).await.unwrap().status(), 200);
    // A request longer than its 1 s lease keeps its slot (renewed): another at 1.5 s is refused.
    let slow_get = || {
        http.get(format!("http://{addr}/slow"))
            .header("x-user", "sam")
            .send()
    };
    let first = tokio::spawn(slow_get());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        slow_get().await.unwrap().status(),
        429,
        "the slow request's lease ran out"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    // The leases of allowed requests were released (in the background, after each
    // response): 5 in flight are free again, long before the leases' own 30 s end (the
    // wait gives up at 20 s).
    eventually(
        "every lease of the allowed requests released",
        Duration::from_secs(20),
        async || remaining(&app, "rc-axum", "ada", "in-flight").await,
        |free| *free == 5,
    )
    .await;
}

/// The layer's gRPC refusal in front of a service answering tonic bodies: a trailers-only
/// RESOURCE_EXHAUSTED with the rate-limit headers, and UNAVAILABLE when failing closed.
#[tokio::test]
async fn the_tower_layer_refuses_grpc_with_a_status() {
    use tower_service::Service;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-grpc",
        json!({"rules": [{"name": "per-hour", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    let layer = |client: Client| {
        SpillwayLayer::new(client, "rc-grpc", |head| {
            let user = head.headers.get("x-user")?.to_str().ok()?;
            Some(BTreeMap::from([("user".to_owned(), user.to_owned())]))
        })
        .grpc()
    };
    let inner = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::default()))
    });
    let request = || {
        http::Request::builder()
            .uri("/grpc.health.v1.Health/Check")
            .header("x-user", "ada")
            .body(())
            .unwrap()
    };
    let mut service = tower_layer::Layer::layer(&layer(client(&app, CLOSED)), inner);
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let ok = service.call(request()).await.unwrap();
    assert!(ok.headers().get("grpc-status").is_none());
    assert!(ok.headers().contains_key("ratelimit"));
    let denied = service.call(request()).await.unwrap();
    assert_eq!(denied.status(), 200);
    assert_eq!(denied.headers()["grpc-status"], "8");
    assert_eq!(denied.headers()["content-type"], "application/grpc");
    assert!(denied.headers().contains_key("retry-after"));
    let down = Client::new(
        format!("http://127.0.0.1:{}", free_port()),
        SERVICE_KEY,
        CLOSED,
    )
    .unwrap();
    let mut service = tower_layer::Layer::layer(&layer(down), inner);
    let unavailable = service.call(request()).await.unwrap();
    assert_eq!(unavailable.headers()["grpc-status"], "14");
}

/// Runs a client's own test script (Python or TypeScript) against a fresh server; it prints
/// one line per part and exits 0 only if every assertion held.
async fn script_against_server(program: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tool = root.join(program);
    let installed = root.join(match program {
        "npm" => "clients/typescript/node_modules/.bin/tsc",
        _ => program,
    });
    assert!(
        installed.exists(),
        "{} is not installed: run `scripts/deps.sh test` (make test does)",
        installed.display()
    );
    let tool = if program.contains('/') {
        tool
    } else {
        program.into()
    };
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut command = std::process::Command::new(tool);
    command
        .args(args)
        .current_dir(root)
        .env("SPILLWAY_URL", format!("http://{}", app.addr))
        .env("SPILLWAY_ADMIN_KEY", crate::helpers::ADMIN_KEY)
        .env("SPILLWAY_SERVICE_KEY", SERVICE_KEY);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The Python client (clients/python): the same behaviours, plus its ASGI middleware and
/// FastAPI dependency, from the package's source.
#[tokio::test]
async fn the_python_client_against_a_real_server() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = script_against_server(
        ".tools/py/bin/python",
        &["clients/python/tests/against_server.py"],
        &[(
            "PYTHONPATH",
            root.join("clients/python/src").display().to_string(),
        )],
    )
    .await;
    for part in [
        "denial cache: ok",
        "leases: ok",
        "reserve then report: ok",
        "failure modes: ok",
        "ASGI middleware: ok",
        "FastAPI dependency: ok",
        "caller limits: ok",
        "batch: ok",
        "peek: ok",
        "admin reset and overrides: ok",
        "wait until allowed: ok",
        "circuit breaker: ok",
        "error causes: ok",
        "fake under the ASGI middleware: ok",
    ] {
        assert!(out.contains(part), "{out}");
    }
}

/// The TypeScript client (clients/typescript): type-checked by a strict `tsc` (its build),
/// then the same behaviours, plus its Express and Hono middleware. Then a client generated
/// from the served OpenAPI document (openapi-typescript, openapi-fetch) passes a strict `tsc`
/// with no hand edits and calls every operation.
#[tokio::test]
async fn the_typescript_client_against_a_real_server() {
    let out = script_against_server("npm", &["--prefix", "clients/typescript", "test"], &[]).await;
    for part in [
        "denial cache: ok",
        "leases: ok",
        "reserve then report: ok",
        "failure modes: ok",
        "Express middleware: ok",
        "Hono middleware: ok",
        "generated client: called 30 operations",
    ] {
        assert!(out.contains(part), "{out}");
    }
}
