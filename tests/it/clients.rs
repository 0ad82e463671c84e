//! The official Rust client (clients/rust) against a real server and Redis: failure modes,
//! the denial cache, leases, reserve-then-report, limits sent with a check, batches, peeks,
//! the admin helpers, the bounded wait, the circuit breaker, failures that name their cause,
//! and its tower layer in an axum app (with the client, and with the in-memory fake) and in
//! front of a gRPC service. The TypeScript and Python clients are driven from here too, each
//! by its own test script against a server of this test.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_client::testing::{Fake, FakePolicy};
use spillway_client::{
    Admin, BatchCheck, Check, Client, Decision, FailMode, Failure, Identifiers, Outcome, Override,
    Reset, SpillwayLayer,
};

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
    app.put_policy(
        "rc-stream",
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
    // Answers at once, then streams its body for 2.5 s.
    let streamed = axum::routing::get(|| async {
        let parts = futures_util::stream::unfold(0, |sent| async move {
            if sent == 2 {
                return None;
            }
            if sent == 1 {
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
            Some((Ok::<_, std::io::Error>(format!("part {sent};")), sent + 1))
        });
        axum::body::Body::from_stream(parts)
    })
    .layer(SpillwayLayer::new(spillway.clone(), "rc-stream", by_user));
    let service = axum::Router::new()
        .route("/work", axum::routing::get(|| async { "done" }))
        .route("/slow", slow)
        .route("/stream", streamed)
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
    // A streamed body holds its slot until its last part is sent, not only until its
    // response is made: another request 1.5 s into the stream is refused (kim: sam has used
    // the outer policy's two an hour), and the slot is free once the body ends.
    let stream_get = || {
        http.get(format!("http://{addr}/stream"))
            .header("x-user", "kim")
            .send()
    };
    let streaming = stream_get().await.unwrap();
    assert_eq!(streaming.status(), 200);
    let body = tokio::spawn(streaming.text());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        stream_get().await.unwrap().status(),
        429,
        "the lease went back before the body was sent"
    );
    assert_eq!(body.await.unwrap().unwrap(), "part 0;part 1;");
    eventually(
        "the streamed body's lease released once it was sent",
        Duration::from_secs(20),
        async || remaining(&app, "rc-stream", "kim", "one").await,
        |free| *free == 1,
    )
    .await;
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

/// A listener that accepts connections and never answers, counting them, until told to pass
/// them on to a server (`forward`).
struct Hung {
    url: String,
    accepted: Arc<AtomicUsize>,
    forward: Arc<Mutex<Option<std::net::SocketAddr>>>,
}

async fn hung() -> Hung {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (accepted, forward) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None)));
    let (count, to) = (accepted.clone(), forward.clone());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let target: Option<std::net::SocketAddr> = *to.lock().unwrap();
            match target {
                None => held.push(socket),
                Some(addr) => {
                    tokio::spawn(async move {
                        let mut upstream = tokio::net::TcpStream::connect(addr).await.unwrap();
                        let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
                    });
                }
            }
        }
    });
    Hung {
        url,
        accepted,
        forward,
    }
}

/// An unavailable decision, answered by the open breaker or not, whose reason says `says`.
fn assert_unavailable(decision: &Decision, from_breaker: bool, says: &str) {
    assert_eq!(
        decision.from_breaker(),
        from_breaker,
        "{:?}",
        decision.outcome()
    );
    assert!(reason(decision).contains(says), "{}", reason(decision));
}

fn reason(decision: &Decision) -> &str {
    match decision.outcome() {
        Outcome::Unavailable { reason, .. } => reason,
        other => panic!("not unavailable: {other:?}"),
    }
}

#[tokio::test]
async fn limits_sent_with_a_check_count_apart_within_the_rules_caller_max() {
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-plans",
        json!({"rules": [{"name": "per-customer", "algorithm": "fixed_window", "limit": 2,
            "window_ms": 3600000, "dimensions": ["user"], "caller_max": {"limit": 10}}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    for _ in 0..2 {
        assert!(spillway.check("rc-plans", &user("acme"), 1).await.allowed());
    }
    assert!(!spillway.check("rc-plans", &user("acme"), 1).await.allowed());
    // A plan of 4 is a counter of its own: neither the 2 used nor the denial remembered.
    let pro = Check::cost(1).limit("per-customer", "limit", 4);
    for i in 0..4 {
        let d = spillway
            .check_with("rc-plans", &user("acme"), pro.clone())
            .await;
        assert!(d.allowed() && !d.from_cache(), "{i}: {:?}", d.outcome());
        assert_eq!(d.answer().unwrap().limit, Some(4));
        assert!(header(&d, "ratelimit-policy").unwrap().contains("q=4"));
    }
    let denied = spillway.check_with("rc-plans", &user("acme"), pro).await;
    assert!(matches!(denied.outcome(), Outcome::Limited { .. }));
    // Past the rule's caller_max: a configuration error, named by its field.
    let too_high = Check::cost(1).limit("per-customer", "limit", 50);
    let d = spillway
        .check_with("rc-plans", &user("acme"), too_high)
        .await;
    assert!(
        matches!(d.outcome(), Outcome::Misconfigured { status, detail, .. }
            if *status == 400 && detail.contains("limits.per-customer")),
        "{:?}",
        d.outcome()
    );
}

#[tokio::test]
async fn a_batch_answers_each_check_as_one_alone_would() {
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-batch",
        json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000, "dimensions": ["user"]}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    assert!(spillway.check("rc-batch", &user("bob"), 1).await.allowed());
    let batch = spillway
        .check_batch(&[
            BatchCheck::new("rc-batch", user("ada")),
            BatchCheck::new("rc-batch", user("bob")),
            BatchCheck::new("rc-missing", user("ada")),
            BatchCheck::new("rc-batch", user("cy")).cost(5),
            BatchCheck::new("rc-batch", user("cy")).limit("hourly", "limit", 9),
        ])
        .await;
    let outcomes: Vec<&Outcome> = batch.iter().map(Decision::outcome).collect();
    assert_eq!(outcomes.len(), 5);
    assert_eq!(outcomes[0], &Outcome::Allowed);
    assert!(matches!(
        outcomes[1],
        Outcome::Limited {
            retry_after: Some(_)
        }
    ));
    assert!(header(&batch[1], "retry-after").is_some());
    assert!(matches!(outcomes[2], Outcome::Misconfigured { status, .. } if *status == 404));
    assert!(matches!(outcomes[3], Outcome::TooCostly { .. }));
    assert!(matches!(outcomes[4], Outcome::Misconfigured { status, .. } if *status == 400));
    // bob's denial is remembered: answered without being sent.
    let denied = counted(&app, "rc-batch", "denied").await;
    assert!(denied >= 1);
    let again = spillway
        .check_batch(&[BatchCheck::new("rc-batch", user("bob"))])
        .await;
    assert!(again[0].from_cache() && !again[0].allowed());
    assert_eq!(counted(&app, "rc-batch", "denied").await, denied);
    // More than a batch holds goes in parts, answered in order.
    let many: Vec<BatchCheck> = (0..150)
        .map(|i| BatchCheck::new("rc-batch", user(&format!("u{i}"))).cost(0))
        .collect();
    let peeks = spillway.check_batch(&many).await;
    assert_eq!(peeks.len(), 150);
    assert!(peeks.iter().all(Decision::allowed));
    // Spillway unreachable: every check is unavailable, as the failure mode says.
    let down = Client::new(
        format!("http://127.0.0.1:{}", free_port()),
        SERVICE_KEY,
        CLOSED,
    )
    .unwrap();
    let failed = down.check_batch(&many[..3]).await;
    assert_eq!(failed.len(), 3);
    for d in &failed {
        assert!(!d.allowed());
        assert!(reason(d).contains("/api/v1/check/batch"), "{}", reason(d));
    }
}

#[tokio::test]
async fn a_peek_reads_what_is_left_and_counts_nothing() {
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-peek",
        json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 3, "window_ms": 3600000}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    spillway.check("rc-peek", &user("ada"), 1).await;
    for _ in 0..3 {
        let peek = spillway.peek("rc-peek", &user("ada")).await;
        assert!(peek.allowed());
        assert_eq!(peek.answer().unwrap().remaining, Some(2));
    }
    assert_eq!(remaining(&app, "rc-peek", "ada", "hourly").await, 2);
}

#[tokio::test]
async fn admin_resets_an_identifier_and_adds_and_removes_overrides() {
    crate::helpers::clear_of_window_turn(Duration::from_secs(3600)).await;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-admin",
        json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000, "dimensions": ["user"]}]}),
    )
    .await;
    let admin = Admin::new(format!("http://{}", app.addr), crate::helpers::ADMIN_KEY).unwrap();
    // Each step asks with a new client: none remembers an earlier denial.
    let check = async |who: &str| client(&app, CLOSED).check("rc-admin", &user(who), 1).await;
    assert!(check("ada").await.allowed());
    assert!(!check("ada").await.allowed());
    let reset = Reset::reason("ticket 1234").policy("rc-admin");
    let done = admin.reset("user", "ada", &reset).await.unwrap();
    assert_eq!(done.identifier, "user=ada");
    assert_eq!(done.policies, ["rc-admin"]);
    assert!(done.deleted_keys >= 1);
    let audit = app
        .as_admin(
            reqwest::Method::GET,
            "/api/v1/audit?action=identifier.reset",
            None,
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(audit.contains("ticket 1234"), "{audit}");
    assert!(check("ada").await.allowed());
    // Undone: the counters are back as before the reset.
    let undone = admin.undo_reset(&done.undo.unwrap().token).await.unwrap();
    assert_eq!(undone.identifiers, ["user=ada"]);
    assert!(!check("ada").await.allowed());
    // An override lifts the limit for vip-*; removed, the limit is back.
    let vip = Override::unlimited("user=vip-*").reason("partners");
    let list = admin.add_override("rc-admin", &vip).await.unwrap();
    assert_eq!(list.overrides, [vip]);
    for _ in 0..3 {
        assert!(check("vip-1").await.allowed());
    }
    let index = list.index_of("user=vip-*").unwrap();
    let list = admin.remove_override("rc-admin", index).await.unwrap();
    assert!(list.overrides.is_empty());
    assert!(check("vip-2").await.allowed());
    assert!(!check("vip-2").await.allowed());
    // Refusals say why: no such policy, a service key.
    assert!(matches!(
        admin.add_override("rc-missing", &Override::block("user=x")).await,
        Err(spillway_client::Error::Refused { status, .. }) if status == 404
    ));
    let service = Admin::new(format!("http://{}", app.addr), SERVICE_KEY).unwrap();
    let refused = service.reset("user", "ada", &Reset::default()).await;
    assert!(
        matches!(&refused, Err(spillway_client::Error::Refused { status, .. }) if status.as_u16() == 401 || status.as_u16() == 403),
        "{refused:?}"
    );
}

#[tokio::test]
async fn wait_until_allowed_sleeps_the_retry_after_and_never_past_max_wait() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-wait",
        json!({"rules": [{"name": "two-seconds", "algorithm": "fixed_window", "limit": 1, "window_ms": 2000}]}),
    )
    .await;
    app.put_policy(
        "rc-wait-long",
        json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}]}),
    )
    .await;
    let spillway = client(&app, CLOSED);
    // Denied now (however the window's turn falls), allowed once the window turns.
    eventually(
        "a denial",
        PATIENCE,
        async || spillway.check("rc-wait", &user("ada"), 1).await,
        |d| !d.allowed(),
    )
    .await;
    let waited = spillway
        .wait_until_allowed("rc-wait", &user("ada"), Duration::from_secs(10))
        .await;
    assert!(waited.allowed(), "{:?}", waited.outcome());
    // Denied for up to an hour: a wait of 300 ms gives up (the outer bound only stops a
    // wait that would not end).
    spillway.check("rc-wait-long", &user("ada"), 1).await;
    let ada = user("ada");
    let started = Instant::now();
    let wait = spillway.wait_until_allowed("rc-wait-long", &ada, Duration::from_millis(300));
    let last = tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("waited past max_wait");
    assert!(matches!(last.outcome(), Outcome::Limited { .. }));
    assert!(started.elapsed() < Duration::from_millis(300) + Duration::from_secs(5));
}

/// A hung Spillway (accepts, never answers) with a timeout of 100 ms and a breaker of 3
/// failures: after 3 calls none until the period ends, then one trial; once Spillway
/// answers, the trial closes the breaker. Counted by the connections the listener accepted.
#[tokio::test]
async fn a_circuit_breaker_stops_calling_a_hung_spillway_for_its_period() {
    const PERIOD: Duration = Duration::from_secs(2);
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    app.put_policy(
        "rc-breaker",
        json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 100, "window_ms": 3600000}]}),
    )
    .await;
    let hung = hung().await;
    let spillway = Client::new(hung.url.clone(), SERVICE_KEY, OPEN)
        .unwrap()
        .with_timeout(Duration::from_millis(100))
        .with_breaker(3, PERIOD);
    let accepted = || hung.accepted.load(Ordering::SeqCst);
    let ada = user("ada");
    for _ in 0..3 {
        let d = spillway.check("rc-breaker", &ada, 1).await;
        assert_unavailable(&d, false, "timed out after 100 ms");
    }
    let opened = Instant::now();
    // Clones share the breaker: answered at once, as the failure mode says, naming why.
    let clone = spillway.clone();
    for _ in 0..20 {
        let d = clone.check("rc-breaker", &ada, 1).await;
        assert!(d.allowed());
        assert_unavailable(&d, true, "circuit breaker open after 3");
    }
    let report = clone.report("rc-breaker", &ada, 1).await.unwrap_err();
    assert!(
        report.to_string().contains("circuit breaker open"),
        "{report}"
    );
    assert!(
        opened.elapsed() < PERIOD,
        "the machine is too slow for this test"
    );
    tokio::time::sleep_until((opened + PERIOD).into()).await;
    assert_eq!(accepted(), 3, "calls were made while the breaker was open");
    // The period over: one trial (it times out too), the others answered by the breaker.
    let (a, b, c) = tokio::join!(
        spillway.check("rc-breaker", &ada, 1),
        clone.check("rc-breaker", &ada, 1),
        spillway.check("rc-breaker", &ada, 1)
    );
    let reopened = Instant::now();
    let (trials, answered): (Vec<Decision>, Vec<Decision>) =
        [a, b, c].into_iter().partition(|d| !d.from_breaker());
    assert_eq!(trials.len(), 1, "one trial call");
    assert_unavailable(&trials[0], false, "timed out");
    for d in &answered {
        assert_unavailable(d, true, "a trial call is under way");
    }
    assert!(spillway.check("rc-breaker", &ada, 1).await.from_breaker());
    eventually(
        "the trial's connection",
        PATIENCE,
        async || accepted(),
        |n| *n == 4,
    )
    .await;
    // Spillway answers again: after the period, the trial succeeds and closes the breaker.
    *hung.forward.lock().unwrap() = Some(app.addr);
    tokio::time::sleep_until((reopened + PERIOD).into()).await;
    for _ in 0..5 {
        let d = clone.check("rc-breaker", &ada, 1).await;
        assert_eq!(d.outcome(), &Outcome::Allowed);
    }
    assert_eq!(remaining(&app, "rc-breaker", "ada", "hourly").await, 95);
}

/// Failures name their cause in the decision, the error and the warning logged: the
/// connection refused and the address, or the timeout and the URL.
#[tokio::test]
async fn failures_name_their_cause() {
    let logs = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || LogSink(sink.clone()))
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let port = free_port();
    let closed = Client::new(format!("http://127.0.0.1:{port}"), SERVICE_KEY, OPEN).unwrap();
    let d = closed.check("rc-any", &user("ada"), 1).await;
    let why = reason(&d);
    assert!(why.contains("Connection refused"), "{why}");
    assert!(
        why.ends_with(&format!("calling http://127.0.0.1:{port}/api/v1/check")),
        "{why}"
    );
    let e = closed.report("rc-any", &user("ada"), 1).await.unwrap_err();
    assert!(e.to_string().contains("Connection refused"), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("127.0.0.1:{port}/api/v1/report")),
        "{e}"
    );
    let hung = hung().await;
    let silent = Client::new(hung.url.clone(), SERVICE_KEY, OPEN)
        .unwrap()
        .with_timeout(Duration::from_millis(100));
    let d = silent.check("rc-any", &user("ada"), 1).await;
    let timed_out = format!("timed out after 100 ms calling {}/api/v1/check", hung.url);
    assert_eq!(reason(&d), timed_out);
    let logged = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("Connection refused"), "{logged}");
    assert!(logged.contains(&timed_out), "{logged}");
}

/// Log lines written to a buffer.
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An axum app serving `/work` under the policy `api` and `/pool` under `pool`, checked by
/// `fake` through the tower layer (identifiers from `x-user`), on a free port.
async fn serve_behind(fake: &Fake) -> std::net::SocketAddr {
    let by_user = |head: &spillway_client::Head<'_>| {
        let name = head.headers.get("x-user")?.to_str().ok()?;
        Some(user(name))
    };
    let pool = axum::routing::get(|| async { "pooled" }).layer(SpillwayLayer::new(
        fake.clone(),
        "pool",
        by_user,
    ));
    let service = axum::Router::new()
        .route("/work", axum::routing::get(|| async { "done" }))
        .layer(SpillwayLayer::new(fake.clone(), "api", by_user))
        .route("/pool", pool);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    addr
}

/// The fake in place of Spillway under the tower layer of an axum app: counted, denied on
/// demand, unavailable on demand, every check recorded, leases released.
#[tokio::test]
async fn the_fake_stands_in_for_spillway_under_the_tower_layer() {
    // No server here installs the TLS provider the test's own HTTP client needs.
    spillway::install_tls_provider();
    let fake = Fake::new()
        .policy("api", FakePolicy::window(2, Duration::from_secs(3600)))
        .policy(
            "pool",
            FakePolicy::window(100, Duration::from_secs(3600)).concurrency(1),
        );
    let addr = serve_behind(&fake).await;
    let http = reqwest::Client::new();
    let get = |path: &'static str, who: Option<&'static str>| {
        let mut r = http.get(format!("http://{addr}{path}"));
        if let Some(who) = who {
            r = r.header("x-user", who);
        }
        r.send()
    };
    for _ in 0..2 {
        let r = get("/work", Some("ada")).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("q=2")
        );
    }
    let r = get("/work", Some("ada")).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(get("/work", None).await.unwrap().status(), 200);
    fake.deny("api", Duration::from_secs(5), 1);
    let r = get("/work", Some("bob")).await.unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["retry-after"].to_str().unwrap()
        ),
        (429, "5")
    );
    fake.unavailable();
    assert_eq!(get("/work", Some("bob")).await.unwrap().status(), 503);
    fake.restore();
    assert_eq!(get("/work", Some("bob")).await.unwrap().status(), 200);
    let (ada, bob) = (user("ada"), user("bob"));
    assert_eq!(
        fake.checks("api"),
        [ada.clone(), ada.clone(), ada, bob.clone(), bob.clone(), bob]
    );
    // A request's lease is released once it is answered.
    assert_eq!(
        get("/pool", Some("cy"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "pooled"
    );
    eventually(
        "the lease released",
        PATIENCE,
        async || fake.leases(),
        Vec::is_empty,
    )
    .await;
    assert_eq!(get("/pool", Some("cy")).await.unwrap().status(), 200);
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
        "caller limits: ok",
        "batch: ok",
        "peek: ok",
        "admin reset and overrides: ok",
        "wait until allowed: ok",
        "circuit breaker: ok",
        "error causes: ok",
        "fake under the Express middleware: ok",
        "generated client: called 32 operations",
    ] {
        assert!(out.contains(part), "{out}");
    }
}
