//! The HTTP server around every route, against callers that stall, idle or send too much:
//! connections that send nothing, trickle headers or sit idle are closed at the header-read
//! timeout; a stalled body is a 504 problem at the request timeout; forms over their limit
//! are 413; bodies are read only for callers whose credentials pass, answered 401 while the
//! body is still coming; and every response, page or not, carries the security headers.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use reqwest::{StatusCode, header};
use serde_json::json;
use spillway::domain::people::Role;

use crate::{
    auth::{Visitor, add_user, store},
    helpers::{self, RedisServer, spawn_app, spawn_app_with},
};

/// Reads until the server closes the connection; returns what came and how long it took.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the connection was still open after {limit:?}: {e}"),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// A connection that sends nothing, one that trickles header lines, and one left idle after
/// a request are all closed after the header-read timeout, not kept for ever.
#[tokio::test]
async fn slow_and_idle_connections_are_closed() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_HEADER_READ_TIMEOUT_MS", "600")]).await;
    let addr = app.addr;
    tokio::task::spawn_blocking(move || {
        // Nothing at all.
        let mut silent = TcpStream::connect(addr).unwrap();
        let (_, took) = read_until_closed(&mut silent, Duration::from_secs(5));
        assert!(took < Duration::from_secs(3), "{took:?}");

        // A header line every 200 ms, for longer than the timeout.
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        let started = Instant::now();
        let mut closed = false;
        for i in 0..25 {
            std::thread::sleep(Duration::from_millis(200));
            if slow
                .write_all(format!("X-Slow-{i}: y\r\n").as_bytes())
                .is_err()
            {
                closed = true;
                break;
            }
        }
        if !closed {
            let (_, _) = read_until_closed(&mut slow, Duration::from_secs(1));
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );

        // Part of the HTTP/2 preface, then nothing.
        let mut partial = TcpStream::connect(addr).unwrap();
        partial.write_all(b"PRI * HT").unwrap();
        let (_, took) = read_until_closed(&mut partial, Duration::from_secs(5));
        assert!(
            took < Duration::from_secs(3),
            "partial preface kept {took:?}"
        );

        // A whole request, answered, then idle.
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let (answer, took) = read_until_closed(&mut idle, Duration::from_secs(5));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            took < Duration::from_secs(3),
            "idle keep-alive kept {took:?}"
        );
    })
    .await
    .unwrap();
    // A request answered slowly (Redis stalls for 1.5 s) is not cut off for being quiet.
    let mut conn = redis.connection();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg("1500")
        .query(&mut conn)
        .unwrap();
    let started = Instant::now();
    let slow = app
        .check(serde_json::json!({"policy": "demo", "identifiers": {"user": "patient"}}))
        .await;
    assert_eq!(slow.status(), 200);
    assert!(
        started.elapsed() > Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // A connection that keeps sending whole requests is served throughout.
    let client = reqwest::Client::new();
    for _ in 0..5 {
        assert_eq!(
            client
                .get(app.url("/healthz"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A request whose body stalls is answered at the request timeout with a 504 problem
/// document naming the setting, on the check path and on the admin API alike (it was an
/// empty 504).
#[tokio::test]
async fn a_stalled_body_is_a_504_problem_at_the_request_timeout() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REQUEST_TIMEOUT_MS", "700")]).await;
    let addr = app.addr;
    tokio::task::spawn_blocking(move || {
        for (method, path) in [("POST", "/api/v1/check"), ("PUT", "/api/v1/policies/stalled")] {
            let mut stream = TcpStream::connect(addr).unwrap();
            let started = Instant::now();
            stream
                .write_all(
                    format!(
                        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
                         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"policy\":",
                        if method == "POST" { helpers::SERVICE_KEY } else { helpers::ADMIN_KEY }
                    )
                    .as_bytes(),
                )
                .unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("SPILLWAY_REQUEST_TIMEOUT_MS") {
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => panic!("{path}: no answer: {e}"),
                }
            }
            let answer = String::from_utf8_lossy(&got);
            let took = started.elapsed();
            assert!(answer.starts_with("HTTP/1.1 504"), "{path}: {answer}");
            assert!(
                answer.to_ascii_lowercase().contains("content-type: application/problem+json"),
                "{path}: {answer}"
            );
            assert!(answer.contains("\"status\":504"), "{path}: {answer}");
            assert!(
                answer.to_ascii_lowercase().contains("x-content-type-options: nosniff"),
                "{path}: {answer}"
            );
            assert!(
                took >= Duration::from_millis(650) && took < Duration::from_secs(3),
                "{path}: {took:?}"
            );
        }
    })
    .await
    .unwrap();
}

/// A server function's body over the limit is 413, not 500.
#[tokio::test]
async fn oversized_forms_are_refused_with_413() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let big = "x".repeat(spillway::auth::forms::MAX_FORM_BODY + 1);
    for path in ["/fn/user_add", "/auth/login"] {
        let r = v
            .post_form(
                path,
                &[("csrf", csrf.as_str()), ("username", &big)],
                Some(&origin),
            )
            .await;
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    }
    // Sent in chunks, without a length.
    let chunks =
        futures_util::stream::iter((0..40).map(|_| Ok::<_, std::io::Error>(vec![b'a'; 8 * 1024])));
    let r = reqwest::Client::new()
        .post(app.url("/fn/whoami"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // A form of ordinary size still works.
    let r = v.post_form("/fn/whoami", &[], None).await;
    assert_eq!(r.status(), 200);
}

/// Unknown paths under `/api/` are problem documents; missing assets a plain 404; every
/// response, page or not, carries a CSP, `X-Frame-Options` and `nosniff`.
#[tokio::test]
async fn every_response_carries_the_security_headers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let client = reqwest::Client::new();
    let r = client.get(app.url("/api/v2/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let r = client.post(app.url("/api/v1/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    // A served path with a method it does not take: 405 as a problem, with `Allow`.
    for (method, path, allow) in [
        (reqwest::Method::PATCH, "/api/v1/check", "POST"),
        (reqwest::Method::GET, "/api/v1/check", "POST"),
        (reqwest::Method::PATCH, "/api/v1/policies/x", "GET"),
        (reqwest::Method::GET, "/json", "POST"),
    ] {
        let r = client
            .request(method.clone(), app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "application/problem+json",
            "{method} {path}"
        );
        let allowed = r.headers()[header::ALLOW].to_str().unwrap().to_owned();
        assert!(allowed.contains(allow), "{method} {path}: Allow {allowed}");
        let problem: serde_json::Value = r.json().await.unwrap();
        assert_eq!(
            problem["detail"],
            format!("method: this path does not take {method} (see Allow)")
        );
    }
    let r = client.get(app.url("/pkg/missing.js")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(
        !r.text().await.unwrap().contains("<html"),
        "a missing asset is not a page"
    );
    for path in [
        "/api/v2/nothing",
        "/pkg/missing.js",
        "/healthz",
        "/metrics",
        "/api/openapi.json",
        "/login",
        "/no-such-page",
    ] {
        let r = client.get(app.url(path)).send().await.unwrap();
        let h = r.headers();
        assert!(h.contains_key(header::CONTENT_SECURITY_POLICY), "{path}");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "{path}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
    }
}

/// Over HTTP/2 to `addr`: sends `method path` with `headers` and the first 16 KiB of a body
/// that says it is 1 MiB long, and never ends it; the status, answered while it is open.
async fn status_before_the_body_ends(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut sender = sender.ready().await.unwrap();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-length", "1048576");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, mut stream) = sender
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    stream.reserve_capacity(16 * 1024);
    stream
        .send_data(bytes::Bytes::from(vec![b'{'; 16 * 1024]), false)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("answered while the body is still open")
        .unwrap();
    response.status().as_u16()
}

/// The API read a body (64 KiB on the check endpoints, 1 MiB for an Envoy
/// domain, 2 MiB on `/json`) before it checked the key, so callers with no credentials at
/// all made the server hold half a gigabyte. Now every one of them is answered 401 from its
/// headers, while its body is still coming.
#[tokio::test]
async fn bodies_are_read_only_for_known_callers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let json = ("content-type", "application/json");
    for (method, path, headers) in [
        ("POST", "/api/v1/check", vec![json]),
        ("POST", "/api/v1/check/batch", vec![json]),
        ("POST", "/json", vec![json]),
        ("PUT", "/api/v1/policies/p", vec![json]),
        (
            "PUT",
            "/api/v1/envoy/domains/d",
            vec![("content-type", "application/yaml")],
        ),
        ("POST", "/api/v1/report", vec![json]),
        ("PUT", "/api/v1/alerts/a", vec![json]),
        (
            "POST",
            "/api/v1/check",
            vec![json, ("authorization", "Bearer not-a-key")],
        ),
        (
            "PUT",
            "/api/v1/policies/p",
            vec![json, ("cookie", "spillway_session=forged")],
        ),
    ] {
        let status = status_before_the_body_ends(app.addr, method, path, &headers).await;
        assert_eq!(status, 401, "{method} {path} {headers:?}");
    }
    // A known caller's body is read as before.
    let ok = app
        .check(json!({"policy": "demo", "identifiers": {"user": "known"}}))
        .await;
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn pages_are_sent_compressed_and_checks_as_they_are() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let rule = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}]});
    for i in 0..40 {
        app.put_policy(&format!("policy-{i:02}"), rule.clone())
            .await;
    }
    add_user(&store(&redis).await, "ada", Role::Admin).await;
    let v = Visitor::signed_in(&app, "ada").await;
    let cookie = v.cookie_header().unwrap();
    let raw = reqwest::Client::builder().build().unwrap();
    // The policies page, signed in: a page of some size.
    let page = |encoding: &'static str| {
        raw.get(app.url("/policies"))
            .header(header::COOKIE, &cookie)
            .header(header::ACCEPT_ENCODING, encoding)
            .send()
    };
    let plain = page("identity").await.unwrap();
    assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
    let plain_len = plain.bytes().await.unwrap().len();
    for (asked, sent) in [("br, gzip", "br"), ("gzip", "gzip")] {
        let r = page(asked).await.unwrap();
        assert_eq!(r.headers()[header::CONTENT_ENCODING], sent);
        let len = r.bytes().await.unwrap().len();
        assert!(len * 4 < plain_len, "{sent}: {len} bytes of {plain_len}");
    }
    // A check's answer is small: sent as it is, whatever the caller takes.
    let r = raw
        .post(app.url("/api/v1/check"))
        .bearer_auth(helpers::SERVICE_KEY)
        .header(header::ACCEPT_ENCODING, "br, gzip")
        .json(&json!({"policy": "policy-00", "identifiers": {"user": "u"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
}
