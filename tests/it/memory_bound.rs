//! What callers without credentials can make the server hold, measured on the real binary:
//! connections that open every stream they may and send only the start of a message, on
//! health (which needs no key) and on `ShouldRateLimit` with the key check off. The growth
//! of the process's resident memory must stay within the bound `config::capacity` states
//! (connections × PER_CONNECTION + pending calls × PER_PENDING_CALL), and the port must go on
//! answering an honest caller. Also: under a low open-file limit, hostile connections never
//! make the server run out of descriptors.

use std::time::{Duration, Instant};

use bytes::Bytes;
use spillway::config::capacity::{PER_CONNECTION, PER_PENDING_CALL};

use crate::helpers::{AppProcess, RedisServer, eventually};

const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The memory budget the tests give the server: 384 connections a port, 341 pending calls.
const BUDGET_MB: &str = "512";
const PENDING: u64 = 341;

/// One hostile connection: opens up to `streams` calls of `path`, each sending the 5-byte
/// prefix of a 1000-byte message and nothing more, and keeps them (and the connection)
/// open until dropped. Answers how many the server refused at once.
struct Hostile {
    _streams: Vec<h2::SendStream<Bytes>>,
    refused: usize,
}

async fn hostile(addr: std::net::SocketAddr, path: &str, streams: usize) -> Option<Hostile> {
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (sender, connection) = h2::client::handshake(tcp).await.ok()?;
    tokio::spawn(connection);
    let mut sender = sender;
    let mut held = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..streams {
        let Ok(Ok(ready)) = tokio::time::timeout(Duration::from_millis(500), sender.ready()).await
        else {
            break;
        };
        sender = ready;
        let request = http::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let Ok((response, mut stream)) = sender.send_request(request, false) else {
            break;
        };
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&1000u32.to_be_bytes());
        stream.reserve_capacity(prefix.len());
        let _ = stream.send_data(prefix.into(), false);
        held.push(stream);
        answers.push(response);
    }
    // The calls answered at once are the refused ones (RESOURCE_EXHAUSTED).
    let mut refused = 0;
    for response in answers {
        if let Ok(Ok(response)) = tokio::time::timeout(Duration::from_millis(20), response).await
            && response.headers().get("grpc-status").map(|v| v.as_bytes()) == Some(b"8")
        {
            refused += 1;
        }
    }
    Some(Hostile {
        _streams: held,
        refused,
    })
}

/// One hostile HTTP/2 (h2c) connection to the HTTP port: up to `streams` sign-in posts,
/// each sending 8 KB of a form (the most a visitor may send) and never ending it.
async fn hostile_sign_ins(addr: std::net::SocketAddr, streams: usize) -> Option<Hostile> {
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (sender, connection) = h2::client::handshake(tcp).await.ok()?;
    tokio::spawn(connection);
    let mut sender = sender;
    let mut held = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..streams {
        let Ok(Ok(ready)) = tokio::time::timeout(Duration::from_millis(500), sender.ready()).await
        else {
            break;
        };
        sender = ready;
        let request = http::Request::post(format!("http://{addr}/auth/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", format!("http://{addr}"))
            .body(())
            .unwrap();
        let Ok((response, mut stream)) = sender.send_request(request, false) else {
            break;
        };
        let form = Bytes::from(format!("username=x&password={}", "p".repeat(8_000)));
        stream.reserve_capacity(form.len());
        let _ = stream.send_data(form, false);
        held.push(stream);
        answers.push(response);
    }
    let mut refused = 0;
    for response in answers {
        if let Ok(Ok(response)) = tokio::time::timeout(Duration::from_millis(20), response).await
            && response.status() == 503
        {
            refused += 1;
        }
    }
    Some(Hostile {
        _streams: held,
        refused,
    })
}

/// `n` hostile connections at once.
async fn hostile_connections(
    addr: std::net::SocketAddr,
    path: &'static str,
    n: usize,
) -> Vec<Hostile> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(async move { hostile(addr, path, 256).await });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        out.extend(done.unwrap());
    }
    out
}

/// The highest resident memory seen over `over`, sampled every 50 ms.
async fn peak_rss(app: &AppProcess, over: Duration) -> u64 {
    let until = Instant::now() + over;
    let mut peak = app.rss();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(app.rss());
    }
    peak
}

/// An honest health check on a fresh connection answers SERVING within `within`. While an
/// attack holds the health budget a call is refused at once (RESOURCE_EXHAUSTED), and asked
/// again: the attack's calls end when their message does not come within a second.
async fn health_answers(addr: std::net::SocketAddr, within: Duration) {
    let deadline = Instant::now() + within;
    // The status answered, or the call's error (`None`: no answer before the deadline).
    let answer = eventually(
        "an honest health check answered (refused while an attack holds the budget)",
        within,
        async || {
            let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let asked = health.check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            });
            match tokio::time::timeout_at(deadline.into(), asked).await {
                Ok(Ok(answer)) => Ok(answer.into_inner().status),
                Ok(Err(status)) => Err(Some(status)),
                Err(_) => Err(None),
            }
        },
        |answer| {
            !matches!(answer, Err(Some(status)) if status.code() == tonic::Code::ResourceExhausted)
        },
    )
    .await;
    match answer {
        Ok(status) => assert_eq!(status, 1, "SERVING"),
        Err(Some(status)) => panic!("health failed: {status:?}"),
        Err(None) => panic!("no honest health check answered within {within:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_credentials_hold_bounded_memory() {
    spillway::config::capacity::raise_open_files();
    let redis = RedisServer::start();
    let app = AppProcess::start_with(
        &redis,
        &[
            ("SPILLWAY_MEMORY_BUDGET_MB", BUDGET_MB),
            ("SPILLWAY_GRPC_AUTH", "none"),
            ("SPILLWAY_HEADER_READ_TIMEOUT_MS", "8000"),
        ],
    );
    // Warm: the first calls allocate the server's lasting structures.
    health_answers(app.grpc, Duration::from_secs(5)).await;
    let base = app.rss();
    for (connections, path) in [
        (40usize, HEALTH_WATCH),
        (40, SHOULD_RATE_LIMIT),
        (400, HEALTH_WATCH),
    ] {
        let attack = hostile_connections(app.grpc, path, connections).await;
        let opened = attack.len();
        let refused: usize = attack.iter().map(|h| h.refused).sum();
        let peak = peak_rss(&app, Duration::from_secs(2)).await;
        let bound = connections as u64 * PER_CONNECTION + PENDING * PER_PENDING_CALL;
        let grown = peak.saturating_sub(base);
        eprintln!(
            "{connections} connections × 256 calls of {path}: {opened} opened, {refused} calls refused, \
             RSS {} MiB → peak {} MiB (+{} KiB, bound {} KiB)",
            base >> 20,
            peak >> 20,
            grown >> 10,
            bound >> 10
        );
        assert!(
            opened >= connections * 9 / 10,
            "{opened} of {connections} connected"
        );
        assert!(
            refused > 0,
            "past the budgets calls are refused at once with RESOURCE_EXHAUSTED"
        );
        assert!(
            grown <= bound,
            "RSS grew by {} KiB, over the bound of {} KiB",
            grown >> 10,
            bound >> 10
        );
        // The port still answers an honest caller while the attack holds its calls.
        health_answers(app.grpc, Duration::from_secs(5)).await;
        drop(attack);
    }
}

/// Under an open-file limit of 1,024, 2,000 connections that send nothing leave the server
/// able to answer: the connection caps fit the descriptors (no EMFILE, which would refuse
/// Redis and files too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_connections_never_exhaust_descriptors() {
    spillway::config::capacity::raise_open_files();
    spillway::install_tls_provider();
    let redis = RedisServer::start();
    let app = AppProcess::start_under(
        &redis,
        &[("SPILLWAY_HEADER_READ_TIMEOUT_MS", "2000")],
        &["prlimit", "--nofile=1024:1024"],
    );
    let client = reqwest::Client::new();
    let mut silent = Vec::new();
    for i in 0..2000 {
        let addr = if i % 2 == 0 { app.addr } else { app.grpc };
        // Past the caps connections wait in the kernel's backlog, or are refused by it.
        if let Ok(Ok(stream)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            silent.push(stream);
        }
    }
    let fds = std::fs::read_dir(format!("/proc/{}/fd", app.pid()))
        .unwrap()
        .count();
    eprintln!(
        "{} hostile connections made; the server holds {fds} descriptors",
        silent.len()
    );
    assert!(fds < 1024, "{fds} descriptors open, at the limit");
    // An honest check gets through while they are held (past the cap it would wait for a
    // silent connection's 2 s timeout at most).
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(15),
        client.get(format!("http://{}/healthz", app.addr)).send(),
    )
    .await
    .expect("answered while 2,000 connections are held")
    .unwrap();
    assert_eq!(answer.status(), 200);
    eprintln!("an honest /healthz answered in {:?}", started.elapsed());
    let fds = std::fs::read_dir(format!("/proc/{}/fd", app.pid()))
        .unwrap()
        .count();
    assert!(fds < 1024, "{fds} descriptors open, at the limit");
}

/// The HTTP port, as the issue measured it: 100 h2c connections × 128 sign-in posts of 8 KB
/// that never end (343 MB before, 3.4 MB a connection). Streams past the port's budget are
/// answered 503 at once; the growth stays within the formula.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_floods_on_the_http_port_hold_bounded_memory() {
    spillway::config::capacity::raise_open_files();
    let redis = RedisServer::start();
    let app = AppProcess::start_with(
        &redis,
        &[
            ("SPILLWAY_MEMORY_BUDGET_MB", BUDGET_MB),
            ("SPILLWAY_HEADER_READ_TIMEOUT_MS", "8000"),
        ],
    );
    let client = reqwest::Client::new();
    let healthz = |client: reqwest::Client| async move {
        client
            .get(format!("http://{}/healthz", app.addr))
            .send()
            .await
            .map(|r| r.status().as_u16())
    };
    assert_eq!(healthz(client.clone()).await.unwrap(), 200);
    let base = app.rss();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let addr = app.addr;
        tasks.spawn(async move { hostile_sign_ins(addr, 128).await });
    }
    let mut attack = Vec::new();
    while let Some(done) = tasks.join_next().await {
        attack.extend(done.unwrap());
    }
    let refused: usize = attack.iter().map(|h| h.refused).sum();
    let peak = peak_rss(&app, Duration::from_secs(2)).await;
    // The port's budget: pending calls and the waiting budget beside them.
    let bound = 100 * PER_CONNECTION + (PENDING + 96) * PER_PENDING_CALL;
    let grown = peak.saturating_sub(base);
    eprintln!(
        "100 h2c connections × 128 sign-ins of 8 KB: {} connected, {refused} refused, +{} KiB (bound {} KiB)",
        attack.len(),
        grown >> 10,
        bound >> 10
    );
    assert!(attack.len() >= 90, "{} of 100 connected", attack.len());
    assert!(refused > 0, "streams past the budget are refused at once");
    assert!(
        grown <= bound,
        "RSS grew by {} KiB, over the bound of {} KiB",
        grown >> 10,
        bound >> 10
    );
    // An honest caller on a connection of its own is still answered.
    let started = Instant::now();
    assert_eq!(healthz(reqwest::Client::new()).await.unwrap(), 200);
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(attack);
}
