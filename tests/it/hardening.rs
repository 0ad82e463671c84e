//! What a black-box probe of the running service found, each kept fixed: slow and idle
//! connections, redirects after sign-in, oversized forms, overflowing inputs, and the
//! headers of responses that are not pages.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use reqwest::{StatusCode, header};
use spillway::domain::people::Role;

use crate::{
    auth::{PASSWORD, Visitor, add_user, store},
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

/// After signing in, `next` goes only to a path of this site: a tab or a newline that the
/// browser would drop, or that cannot be a header, goes to `/` (it answered 500 after the
/// session was made).
#[tokio::test]
async fn sign_in_redirects_only_to_a_path_of_this_site() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "ann", Role::Viewer).await;
    for (next, to) in [
        ("/people", "/people"),
        ("/\t/evil.example/x", "/"),
        ("/\r\nSet-Cookie: x=1", "/"),
        ("/\u{b}/evil.example", "/"),
        ("/\u{c}/evil.example", "/"),
        ("//evil.example", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example/", "/"),
    ] {
        let mut v = Visitor::new(&app);
        v.get("/login").await;
        let csrf = v.csrf().await;
        let origin = v.origin();
        let form = [
            ("username", "ann"),
            ("password", PASSWORD),
            ("csrf", csrf.as_str()),
            ("next", next),
        ];
        let r = v.post_form("/auth/login", &form, Some(&origin)).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{next:?}");
        assert_eq!(r.headers()[header::LOCATION], to, "{next:?}");
    }
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

/// An override's expiry that would overflow is refused with its field named, not stored
/// already expired.
#[tokio::test]
async fn an_override_expiry_that_overflows_is_refused() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    add_user(&store(&redis).await, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    for (minutes, status) in [
        ("18446744073709551615", 400),
        ("9223372036854775807", 400),
        ("5270401", 400),
        ("60", 200),
    ] {
        let form = [
            ("csrf", csrf.as_str()),
            ("name", "demo"),
            ("matcher", "user=vip"),
            ("action", "unlimited"),
            ("expires_minutes", minutes),
        ];
        let r = v.post_form("/fn/override_add", &form, Some(&origin)).await;
        assert_eq!(r.status().as_u16(), status, "{minutes}");
        if status == 400 {
            assert!(
                r.text().await.unwrap().contains("expires_minutes"),
                "{minutes}"
            );
        }
    }
    let policy = app.get_policy("demo").await;
    let overrides = policy["overrides"].as_array().unwrap();
    assert_eq!(overrides.len(), 1, "{policy}");
    let expires = overrides[0]["expires_at_ms"].as_i64().unwrap();
    let now = spillway::support::clock::now_ms();
    assert!(
        expires > now + 59 * 60_000 && expires <= now + 60 * 60_000,
        "{expires}"
    );
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

/// With SPILLWAY_SECURE_COOKIES the cookies stay Secure even when a trusted proxy says the
/// last hop was plain http (TLS ended further out).
#[tokio::test]
async fn secure_cookies_stay_secure_behind_a_proxy_that_says_http() {
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_SECURE_COOKIES", "1"),
            ("SPILLWAY_TRUSTED_PROXIES", "127.0.0.1"),
        ],
    )
    .await;
    let r = reqwest::Client::new()
        .get(app.url("/login"))
        .header("x-forwarded-proto", "http")
        .send()
        .await
        .unwrap();
    let cookie = r.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("Secure"), "{cookie}");
}

/// The check endpoints are answered before the router (`api::check_endpoint`), so their
/// answers get the API's headers there: every status they answer with carries the API's CSP,
/// no framing, no sniffing, no storing; a body over 64 KiB is still a 413; another method on
/// their paths still reaches the router (405); and while the server drains they ask the
/// client to close the connection, as every other answer does.
#[tokio::test]
async fn the_check_endpoints_answer_with_the_apis_headers() {
    use crate::helpers::{SERVICE_KEY, app_state, serve};
    let redis = RedisServer::start();
    let state = app_state(&redis, &[]).await;
    let app = serve(state.clone()).await;
    app.put_policy(
        "headers",
        serde_json::json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000}]}),
    )
    .await;
    let client = reqwest::Client::new();
    let check = |body: String, key: &'static str, content_type: &'static str| {
        client
            .post(app.url("/api/v1/check"))
            .bearer_auth(key)
            .header(header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
    };
    crate::helpers::clear_of_window_turn(std::time::Duration::from_secs(60)).await;
    let good = r#"{"policy":"headers","identifiers":{"user":"h"}}"#.to_owned();
    let mut answers = vec![
        (200, check(good.clone(), SERVICE_KEY, "application/json").await.unwrap()),
        (429, check(good.clone(), SERVICE_KEY, "application/json").await.unwrap()),
        (401, check(good.clone(), "nope", "application/json").await.unwrap()),
        (415, check(good.clone(), SERVICE_KEY, "text/plain").await.unwrap()),
        (400, check("{".into(), SERVICE_KEY, "application/json").await.unwrap()),
        (
            404,
            check(
                r#"{"policy":"nope","identifiers":{"user":"h"}}"#.into(),
                SERVICE_KEY,
                "application/json",
            )
            .await
            .unwrap(),
        ),
        (
            // A client of its own: the server closes a connection whose body it did not read.
            413,
            reqwest::Client::new()
                .post(app.url("/api/v1/check"))
                .bearer_auth(SERVICE_KEY)
                .header(header::CONTENT_TYPE, "application/json")
                .body(format!(r#"{{"policy":"{}"}}"#, "x".repeat(70_000)))
                .send()
                .await
                .unwrap(),
        ),
        (
            200,
            client
                .post(app.url("/api/v1/check/batch"))
                .bearer_auth(SERVICE_KEY)
                .json(&serde_json::json!({"checks": [{"policy": "headers", "identifiers": {"user": "b"}}]}))
                .send()
                .await
                .unwrap(),
        ),
        (
            200,
            client
                .get(app.url("/api/v1/forward-auth?policy=headers"))
                .bearer_auth(SERVICE_KEY)
                .header("x-forwarded-for", "192.0.2.1")
                .send()
                .await
                .unwrap(),
        ),
        (
            405,
            client
                .get(app.url("/api/v1/check"))
                .bearer_auth(SERVICE_KEY)
                .send()
                .await
                .unwrap(),
        ),
    ];
    for (i, (status, r)) in answers.drain(..).enumerate() {
        assert_eq!(r.status().as_u16(), status, "answer {i}");
        let h = r.headers();
        assert_eq!(
            h[header::CONTENT_SECURITY_POLICY],
            "default-src 'none'; frame-ancestors 'none'",
            "answer {i}"
        );
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "answer {i}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "answer {i}");
        assert_eq!(h[header::REFERRER_POLICY], "same-origin", "answer {i}");
        assert_eq!(h[header::CACHE_CONTROL], "no-store", "answer {i}");
        assert!(!h.contains_key(header::CONNECTION), "answer {i}");
    }
    state.shutdown.start_draining();
    let r = check(good, SERVICE_KEY, "application/json").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()[header::CONNECTION], "close");
}

/// The check endpoint reads its body itself (it is served before the router's body limit):
/// a body of exactly 64 KiB is read and answered (here 404: the policy does not exist), one
/// byte more is a 413, as the router's limit answered before.
#[tokio::test]
async fn the_check_body_limit_is_64_kib_to_the_byte() {
    use crate::helpers::SERVICE_KEY;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let json = r#"{"policy":"absent","identifiers":{"user":"edge"}}"#;
    for (size, status) in [(64 * 1024, 404), (64 * 1024 + 1, 413)] {
        let body = format!("{json}{}", " ".repeat(size - json.len()));
        assert_eq!(body.len(), size);
        let r = reqwest::Client::new()
            .post(app.url("/api/v1/check"))
            .bearer_auth(SERVICE_KEY)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{size} bytes");
    }
}
