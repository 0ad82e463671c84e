//! Envoy's rate limit protocol: domains loaded in envoyproxy/ratelimit's file format (a
//! duplicate key refused saying where), and `ShouldRateLimit` over gRPC (a tonic client
//! with the official messages) and upstream's `/json` against real Redis, on the same
//! engine as the JSON check.

use std::time::Duration;

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus},
            rate_limit_service_client::RateLimitServiceClient,
        },
    },
    google::protobuf::UInt64Value,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::helpers::{
    ADMIN_KEY, PATIENCE, RedisServer, SERVICE_KEY, TestApp, clear_of_window_turn, eventually,
    spawn_app, spawn_app_with,
};

pub(crate) const OK: i32 = Code::Ok as i32;
pub(crate) const OVER: i32 = Code::OverLimit as i32;

/// A client of `app`'s gRPC port, made when a minute's turn is not near: most domains here
/// count per minute, and a test's requests must not straddle a turn.
pub(crate) async fn client(app: &TestApp) -> RateLimitServiceClient<Channel> {
    clear_of_window_turn(Duration::from_secs(60)).await;
    RateLimitServiceClient::connect(format!("http://{}", app.grpc.unwrap()))
        .await
        .unwrap()
}

/// A client of a gRPC port served over TLS with a certificate `ca_pem` signed (for
/// localhost), once the port accepts (a process just started).
pub(crate) async fn client_over_tls(port: u16, ca_pem: &str) -> RateLimitServiceClient<Channel> {
    let tls = tonic::transport::ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem));
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap();
    let channel = crate::helpers::eventually(
        "the gRPC port accepting TLS connections",
        crate::helpers::PATIENCE,
        async || endpoint.connect().await.map_err(|e| e.to_string()),
        Result::is_ok,
    )
    .await
    .unwrap();
    RateLimitServiceClient::new(channel)
}

pub(crate) fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn with_key(message: RateLimitRequest) -> tonic::Request<RateLimitRequest> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {SERVICE_KEY}").parse().unwrap(),
    );
    request
}

pub(crate) fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// `ShouldRateLimit` with the service key; panics on a gRPC error.
pub(crate) async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    message: RateLimitRequest,
) -> RateLimitResponse {
    c.should_rate_limit(with_key(message))
        .await
        .unwrap()
        .into_inner()
}

/// One descriptor's answer.
async fn one(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    pairs: &[(&str, &str)],
) -> DescriptorStatus {
    let r = ask(c, request(domain, vec![descriptor(pairs)])).await;
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.overall_code, r.statuses[0].code);
    r.statuses[0].clone()
}

pub(crate) async fn put_domain(app: &TestApp, domain: &str, yaml: &str) -> reqwest::Response {
    put_domain_with(app, domain, yaml).await
}

/// `PUT /api/v1/envoy/domains/<path>` (the domain and any query) with `yaml`, as an admin.
pub(crate) async fn put_domain_with(app: &TestApp, path: &str, yaml: &str) -> reqwest::Response {
    app.client
        .put(app.url(&format!("/api/v1/envoy/domains/{path}")))
        .bearer_auth(ADMIN_KEY)
        .header("content-type", "application/yaml")
        .body(yaml.to_owned())
        .send()
        .await
        .unwrap()
}

pub(crate) async fn load(app: &TestApp, domain: &str, yaml: &str) {
    let r = put_domain(app, domain, yaml).await;
    let status = r.status();
    assert!(status.is_success(), "{status}: {}", r.text().await.unwrap());
}

/// Loads a domain that counts all or nothing (a request over any limit counts nowhere): what
/// the tests written before every hit counted by default expect.
pub(crate) async fn load_all_or_nothing(app: &TestApp, domain: &str, yaml: &str) {
    let r = put_domain_with(app, &format!("{domain}?counting=all_or_nothing"), yaml).await;
    let status = r.status();
    assert!(status.is_success(), "{status}: {}", r.text().await.unwrap());
}

pub(crate) const PER_IP: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      name: per-ip
      unit: minute
      requests_per_unit: 3
  - key: remote_address
    value: 10.0.0.9
    rate_limit:
      unit: minute
      requests_per_unit: 5
"#;

#[tokio::test]
async fn a_domain_file_limits_each_descriptor_value_separately_and_says_why() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    let mut c = client(&app).await;
    for expected_left in [2, 1, 0] {
        let s = one(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "10.0.0.1")],
        )
        .await;
        assert_eq!(s.code, OK);
        assert_eq!(s.limit_remaining, expected_left);
        let limit = s.current_limit.unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per-ip", 3, 2)
        );
        let reset = s.duration_until_reset.unwrap();
        assert!((0..=60).contains(&reset.seconds), "{reset:?}");
    }
    let r = ask(
        &mut c,
        request(
            "edge_proxy_per_ip",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // What Envoy adds to its answer: the IETF headers and a problem body.
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert!(
        headers.contains(&("ratelimit-policy".into(), "\"per-ip\";q=3;w=60".into())),
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "ratelimit" && v.starts_with("\"per-ip\";r=0;t=")),
        "{headers:?}"
    );
    let body: Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["status"], 429);
    // Another address has its own count; the exact value has its own, larger limit.
    let s = one(
        &mut c,
        "edge_proxy_per_ip",
        &[("remote_address", "10.0.0.2")],
    )
    .await;
    assert_eq!((s.code, s.limit_remaining), (OK, 2));
    let s = one(
        &mut c,
        "edge_proxy_per_ip",
        &[("remote_address", "10.0.0.9")],
    )
    .await;
    assert_eq!((s.code, s.limit_remaining), (OK, 4));
    assert_eq!(s.current_limit.unwrap().requests_per_unit, 5);
}

#[tokio::test]
async fn callers_need_a_service_key_unless_that_is_turned_off() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut c = client(&app).await;
    let message = request("any", vec![descriptor(&[("k", "v")])]);
    let no_key = c.should_rate_limit(message.clone()).await.unwrap_err();
    assert_eq!(no_key.code(), tonic::Code::Unauthenticated);
    let mut wrong = tonic::Request::new(message.clone());
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer not-a-key".parse().unwrap());
    assert_eq!(
        c.should_rate_limit(wrong).await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let mut other_header = tonic::Request::new(message.clone());
    other_header
        .metadata_mut()
        .insert("x-spillway-key", SERVICE_KEY.parse().unwrap());
    assert_eq!(
        c.should_rate_limit(other_header)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        OK
    );

    let open = spawn_app_with(&redis, &[("SPILLWAY_GRPC_AUTH", "none")]).await;
    let mut c = client(&open).await;
    assert_eq!(
        c.should_rate_limit(message)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        OK
    );
}

#[tokio::test]
async fn matching_follows_envoyproxy_ratelimit() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "rl",
        r#"
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bank_service
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: destination_cluster
        value: mock
        rate_limit: {unit: second, requests_per_unit: 0}
      - key: destination_cluster
        rate_limit: {unlimited: true}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2, name: api-prefix}
  - key: path
    value: /api/login
    rate_limit: {unit: hour, requests_per_unit: 1, name: login}
  - key: user
"#,
    )
    .await;
    let mut c = client(&app).await;
    // A domain that does not exist, and a descriptor that finds no limit: OK, no limit.
    for (domain, pairs) in [
        ("nope", vec![("a", "b")]),
        ("rl", vec![("user", "ann")]),
        ("rl", vec![("source_cluster", "proxy")]),
        (
            "rl",
            vec![
                ("source_cluster", "other"),
                ("destination_cluster", "bank_service"),
            ],
        ),
    ] {
        for _ in 0..3 {
            let s = one(&mut c, domain, &pairs).await;
            assert_eq!(s.code, OK, "{domain} {pairs:?}");
            assert!(s.current_limit.is_none());
        }
    }
    // Nested: key and value at both levels.
    let bank = [
        ("source_cluster", "proxy"),
        ("destination_cluster", "bank_service"),
    ];
    clear_of_window_turn(Duration::from_secs(1)).await;
    assert_eq!(one(&mut c, "rl", &bank).await.code, OK);
    assert_eq!(one(&mut c, "rl", &bank).await.code, OVER);
    // requests_per_unit 0 always denies; unlimited always allows, remaining u32::MAX.
    let mock = [("source_cluster", "proxy"), ("destination_cluster", "mock")];
    let s = one(&mut c, "rl", &mock).await;
    assert_eq!(
        (s.code, s.current_limit.unwrap().requests_per_unit),
        (OVER, 0)
    );
    for _ in 0..5 {
        let s = one(
            &mut c,
            "rl",
            &[("source_cluster", "proxy"), ("destination_cluster", "x")],
        )
        .await;
        assert_eq!((s.code, s.limit_remaining), (OK, u32::MAX));
    }
    // Key and value beat a prefix; the prefix counts each path on its own.
    assert_eq!(
        one(&mut c, "rl", &[("path", "/api/login")])
            .await
            .limit_remaining,
        0
    );
    assert_eq!(
        one(&mut c, "rl", &[("path", "/api/login")]).await.code,
        OVER
    );
    let s = one(&mut c, "rl", &[("path", "/api/users")]).await;
    assert_eq!(
        (s.limit_remaining, s.current_limit.unwrap().name.as_str()),
        (1, "api-prefix")
    );
    assert_eq!(
        one(&mut c, "rl", &[("path", "/api/other")])
            .await
            .limit_remaining,
        1
    );
    assert!(
        one(&mut c, "rl", &[("path", "/web")])
            .await
            .current_limit
            .is_none()
    );
}

/// Istio's global rate limit task ("Enabling Rate Limits using Envoy"): the ingress gateway's
/// rate limit filter sends the request path as the descriptor `PATH` to domain `ratelimit`,
/// whose file allows `/productpage` once a minute, `api` twice, and any other path 100 times.
const ISTIO: &str = r#"
domain: ratelimit
descriptors:
  - key: PATH
    value: "/productpage"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    value: "api"
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

#[tokio::test]
async fn istios_documented_example_answers_as_the_task_says() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load_all_or_nothing(&app, "ratelimit", ISTIO).await;
    let mut c = client(&app).await;
    const MINUTE: i32 = 2;
    // The task's check: the first /productpage of the minute passes, the next is a 429.
    let s = one(&mut c, "ratelimit", &[("PATH", "/productpage")]).await;
    assert_eq!((s.code, s.limit_remaining), (OK, 0));
    let limit = s.current_limit.unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, MINUTE));
    let s = one(&mut c, "ratelimit", &[("PATH", "/productpage")]).await;
    assert_eq!((s.code, s.limit_remaining), (OVER, 0));
    let reset = s.duration_until_reset.unwrap().seconds;
    assert!((0..=60).contains(&reset), "{reset}");
    // `api` has two a minute of its own.
    for (code, left) in [(OK, 1), (OK, 0), (OVER, 0)] {
        let s = one(&mut c, "ratelimit", &[("PATH", "api")]).await;
        assert_eq!((s.code, s.limit_remaining), (code, left));
        assert_eq!(s.current_limit.unwrap().requests_per_unit, 2);
    }
    // Every other path has 100 a minute, counted per path; /productpage being over does not
    // touch them.
    for path in ["/reviews/1", "/details/0", "/static/bootstrap.css"] {
        for left in [99, 98] {
            let s = one(&mut c, "ratelimit", &[("PATH", path)]).await;
            assert_eq!((s.code, s.limit_remaining), (OK, left), "{path}");
            assert_eq!(s.current_limit.unwrap().requests_per_unit, 100);
        }
    }
    // The gateway sends one request's descriptors together: over on /productpage is over.
    let r = ask(
        &mut c,
        request(
            "ratelimit",
            vec![
                descriptor(&[("PATH", "/reviews/1")]),
                descriptor(&[("PATH", "/productpage")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        r.statuses.iter().map(|s| s.code).collect::<Vec<_>>(),
        [OK, OVER]
    );
    // ... and consumed nothing: /reviews/1 still has 98.
    let s = one(&mut c, "ratelimit", &[("PATH", "/reviews/1")]).await;
    assert_eq!(s.limit_remaining, 97);
}

#[tokio::test]
async fn a_request_over_any_limit_consumes_none() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load_all_or_nothing(
        &app,
        "two",
        "domain: two\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
    )
    .await;
    let mut c = client(&app).await;
    let both = || {
        request(
            "two",
            vec![descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
        )
    };
    let first = ask(&mut c, both()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(first.statuses[1].limit_remaining, 9);
    for _ in 0..5 {
        let r = ask(&mut c, both()).await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!((r.statuses[0].code, r.statuses[1].code), (OVER, OK));
        // b was not consumed by the requests a denied.
        assert_eq!(r.statuses[1].limit_remaining, 9);
    }
    let b_alone = one(&mut c, "two", &[("b", "1")]).await;
    assert_eq!(b_alone.limit_remaining, 8);
}

/// Found by a probe: a value holding the identifier's separator (` · `) shared a counter
/// with another descriptor; a repeated descriptor counted once while its key was new and
/// twice after; a descriptor over its limit answered what was left instead of 0.
#[tokio::test]
async fn descriptors_keep_their_own_counters_and_a_repeat_counts_once() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "pairs",
        "domain: pairs\ndescriptors:\n  - key: user\n    descriptors:\n      - key: method\n        rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .await;
    let mut c = client(&app).await;
    clear_of_window_turn(Duration::from_secs(3600)).await;
    let victim = [("user", "v"), ("method", "b · method=c")];
    let attacker = [("user", "v · method=b"), ("method", "c")];
    assert_eq!(one(&mut c, "pairs", &victim).await.limit_remaining, 2);
    for left in [2, 1, 0] {
        let s = one(&mut c, "pairs", &attacker).await;
        assert_eq!((s.code, s.limit_remaining), (OK, left));
    }
    let over = one(&mut c, "pairs", &attacker).await;
    assert_eq!((over.code, over.limit_remaining), (OVER, 0));
    // The victim's counter is its own.
    assert_eq!(one(&mut c, "pairs", &victim).await.limit_remaining, 1);

    // The same descriptor twice: counted once, new key or not; both answer alike.
    let twice = |ip: &str| {
        request(
            "pairs",
            vec![descriptor(&[("ip", ip)]), descriptor(&[("ip", ip)])],
        )
    };
    for left in [2, 1, 0] {
        let r = ask(&mut c, twice("1")).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0], r.statuses[1]);
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    let r = ask(&mut c, twice("1")).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0], r.statuses[1]);
    assert_eq!(r.statuses[1].limit_remaining, 0);

    // Copies with callers' own limits of one unit share a counter: checked under the
    // strictest (2 an hour, not 10), each answering under its own limit.
    let own = |rpu: u32| {
        let mut d = descriptor(&[("ip", "3")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit: 3, // hour
        });
        d
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = ask(&mut c, request("pairs", vec![own(10), own(2)])).await;
        let limits: Vec<u32> = r
            .statuses
            .iter()
            .map(|s| s.current_limit.clone().unwrap().requests_per_unit)
            .collect();
        assert_eq!(limits, [10, 2]);
        assert_eq!(r.statuses[0].code, r.statuses[1].code);
        assert_eq!(r.statuses[0].limit_remaining, r.statuses[1].limit_remaining);
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER]);

    // Over by a part of the hits: 0 remaining, as envoyproxy/ratelimit says.
    let double = || RateLimitRequest {
        hits_addend: 2,
        ..request("pairs", vec![descriptor(&[("ip", "2")])])
    };
    assert_eq!(ask(&mut c, double()).await.statuses[0].limit_remaining, 1);
    let r = ask(&mut c, double()).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
}

#[tokio::test]
async fn shadow_mode_counts_and_answers_ok_and_replaces_drops_a_limit() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "sh",
        r#"
domain: sh
descriptors:
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: tenant}
  - key: generic
    rate_limit: {unit: minute, requests_per_unit: 1, name: generic}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 100, name: vip}
    replaces:
      - name: generic
"#,
    )
    .await;
    let mut c = client(&app).await;
    for i in 0..5 {
        let s = one(&mut c, "sh", &[("tenant", "t1")]).await;
        assert_eq!(s.code, OK, "shadow mode never denies (request {i})");
        assert_eq!(s.limit_remaining, if i < 2 { 1 - i } else { 0 });
    }
    // The shadow denials were counted as denials for the live view.
    let metrics = app.metrics().await;
    assert!(metrics.contains("shadow_denied"), "{metrics}");
    // generic alone: 1 a minute. With vip in the same request, generic is replaced.
    assert_eq!(one(&mut c, "sh", &[("generic", "g")]).await.code, OK);
    assert_eq!(one(&mut c, "sh", &[("generic", "g")]).await.code, OVER);
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request(
                "sh",
                vec![descriptor(&[("generic", "g")]), descriptor(&[("vip", "g")])],
            ),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "vip");
    }
}

#[tokio::test]
async fn hits_addend_caller_limits_and_peeks() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load_all_or_nothing(&app, "h", "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n").await;
    let mut c = client(&app).await;
    let mut r = request("h", vec![descriptor(&[("k", "a")])]);
    r.hits_addend = 4;
    assert_eq!(ask(&mut c, r.clone()).await.statuses[0].limit_remaining, 6);
    // A descriptor's own hits win over the request's; 0 peeks.
    let mut d = descriptor(&[("k", "a")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let peek = ask(
        &mut c,
        RateLimitRequest {
            descriptors: vec![d.clone()],
            ..r.clone()
        },
    )
    .await;
    assert_eq!(
        (peek.overall_code, peek.statuses[0].limit_remaining),
        (OK, 6)
    );
    d.hits_addend = Some(UInt64Value { value: 6 });
    let all = ask(
        &mut c,
        RateLimitRequest {
            descriptors: vec![d.clone()],
            ..r.clone()
        },
    )
    .await;
    assert_eq!((all.overall_code, all.statuses[0].limit_remaining), (OK, 0));
    // Over by request-level hits: denied, nothing consumed.
    assert_eq!(ask(&mut c, r.clone()).await.overall_code, OVER);
    // The caller's own limit for a descriptor is honoured, with or without a tree match.
    let mut own = descriptor(&[("nothing", "here")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: 3, // hour
    });
    let mut answers = Vec::new();
    for _ in 0..3 {
        let a = ask(&mut c, request("h", vec![own.clone()])).await;
        let limit = a.statuses[0].current_limit.clone().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (2, 3));
        answers.push(a.overall_code);
    }
    assert_eq!(answers, [OK, OK, OVER]);
    // Two counted descriptors of one request, each at its own hits: one decision.
    let mut d1 = descriptor(&[("k", "x")]);
    d1.hits_addend = Some(UInt64Value { value: 1 });
    let mut d2 = descriptor(&[("k", "y")]);
    d2.hits_addend = Some(UInt64Value { value: 2 });
    let both = ask(&mut c, request("h", vec![d1.clone(), d2.clone()])).await;
    let left: Vec<u32> = both.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!((both.overall_code, left), (OK, vec![9, 8]));
    // ... all or nothing: over on one (9 more on y), nothing is counted on either.
    d2.hits_addend = Some(UInt64Value { value: 9 });
    let over = ask(&mut c, request("h", vec![d1.clone(), d2])).await;
    assert_eq!(over.overall_code, OVER);
    let x = one(&mut c, "h", &[("k", "x")]).await;
    assert_eq!(
        x.limit_remaining, 8,
        "x counted 1 then this 1, not the denied request's"
    );
}

#[tokio::test]
async fn invalid_files_name_the_field_and_leave_the_domain_as_it_was() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    let cases = [
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "descriptors[0].rate_limit.unit",
        ),
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: a\n  - key: a\n",
            "descriptors[1]",
        ),
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "descriptors[0].rate_limit.unit",
        ),
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, requests_per_unit: 3}\n",
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: x}\n    replaces: [{}]\n",
            "descriptors[0].replaces[0].name",
        ),
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: x}\n    replaces: [{name: x}]\n",
            "descriptors[0].replaces[0].name",
        ),
        (
            "domain: edge_proxy_per_ip\ndescriptors:\n  - value: a\n",
            "descriptors[0].key",
        ),
        ("domain: other\n", "domain"),
        ("domain: [unclosed\n", "body"),
    ];
    for (yaml, field) in cases {
        let r = put_domain(&app, "edge_proxy_per_ip", yaml).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{yaml}");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["field"], field, "{yaml}: {problem}");
    }
    // A reserved name is invalid (400 naming the domain), not a conflict.
    let r = put_domain(
        &app,
        "spillway-x",
        "domain: spillway-x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "domain", "{problem}");
    // A JSON body of the same document works too; a text/plain one is refused.
    let r = app
        .client
        .put(app.url("/api/v1/envoy/domains/edge_proxy_per_ip"))
        .bearer_auth(ADMIN_KEY)
        .header("content-type", "text/plain")
        .body(PER_IP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Still version 1, still enforcing it.
    let r = app
        .client
        .get(app.url("/api/v1/envoy/domains/edge_proxy_per_ip"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["etag"], "\"1\"");
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["descriptors"][0]["rate_limit"]["requests_per_unit"], 3);
    let mut c = client(&app).await;
    let s = one(
        &mut c,
        "edge_proxy_per_ip",
        &[("remote_address", "1.1.1.1")],
    )
    .await;
    assert_eq!(s.current_limit.unwrap().requests_per_unit, 3);
    // The same file as JSON makes version 2; YAML comes back when asked for.
    let as_json: Value = serde_yaml::from_str(PER_IP).unwrap();
    let r = app
        .client
        .put(app.url("/api/v1/envoy/domains/edge_proxy_per_ip"))
        .bearer_auth(ADMIN_KEY)
        .json(&as_json)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["etag"], "\"2\"");
    let yaml = app
        .client
        .get(app.url("/api/v1/envoy/domains/edge_proxy_per_ip"))
        .bearer_auth(ADMIN_KEY)
        .header("accept", "application/yaml")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let back: Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(back, as_json);
}

#[tokio::test]
async fn a_domain_is_a_versioned_audited_policy_and_its_descriptors_can_be_reset() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    let mut c = client(&app).await;
    for _ in 0..3 {
        one(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "10.0.0.1")],
        )
        .await;
    }
    assert_eq!(
        one(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "10.0.0.1")]
        )
        .await
        .code,
        OVER
    );
    // The policy: its rules are the file's limits.
    let policy: Value = app
        .as_admin(Method::GET, "/api/v1/policies/edge_proxy_per_ip", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(policy["rules"][0]["name"], "per-ip");
    assert_eq!(policy["rules"][0]["window_ms"], 60_000);
    assert_eq!(policy["envoy"]["domain"], "edge_proxy_per_ip");
    // A plain policy is not saved over it (that dropped the domain: Envoy's requests then
    // passed unlimited); the domain is left as it was.
    let plain = json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 100, "window_ms": 1000}]});
    let over = app
        .as_admin(
            Method::PUT,
            "/api/v1/policies/edge_proxy_per_ip",
            Some(&plain),
        )
        .await;
    assert_eq!(over.status(), StatusCode::CONFLICT);
    let problem: Value = over.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("/api/v1/envoy/domains/edge_proxy_per_ip")),
        "{problem}"
    );
    // Nor another domain's document under its name (a reviewer's way past the first check),
    // and a domain's document names the policy it lives under.
    let envoy_doc = |domain: &str| json!({"envoy": {"domain": domain, "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1}}]}});
    for (path, domain, status, field) in [
        ("edge_proxy_per_ip", "other", StatusCode::CONFLICT, None),
        (
            "elsewhere",
            "other",
            StatusCode::BAD_REQUEST,
            Some("envoy.domain"),
        ),
    ] {
        let r = app
            .as_admin(
                Method::PUT,
                &format!("/api/v1/policies/{path}"),
                Some(&envoy_doc(domain)),
            )
            .await;
        assert_eq!(r.status(), status, "{path}");
        if let Some(field) = field {
            let problem: Value = r.json().await.unwrap();
            assert_eq!(problem["field"], field, "{problem}");
        }
    }
    let kept = app
        .as_admin(Method::GET, "/api/v1/envoy/domains/edge_proxy_per_ip", None)
        .await;
    assert_eq!(kept.status(), StatusCode::OK);
    // The inspector reads the descriptor; a reset frees it (and the cached denial).
    let id = "remote_address=10.0.0.1";
    let seen: Value = app
        .client
        .get(app.url(&format!("/api/v1/identifiers/envoy/{id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ours = seen["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "edge_proxy_per_ip")
        .unwrap();
    // Only the limit this descriptor finds, not every limit of the domain.
    assert_eq!(ours["rules"].as_array().unwrap().len(), 1, "{seen}");
    assert_eq!(ours["rules"][0]["rule"], "per-ip", "{seen}");
    assert_eq!(ours["rules"][0]["remaining"], 0, "{seen}");
    let r = app
        .client
        .delete(app.url(&format!(
            "/api/v1/identifiers/envoy/{id}?reason=support+ticket+7"
        )))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let s = one(
        &mut c,
        "edge_proxy_per_ip",
        &[("remote_address", "10.0.0.1")],
    )
    .await;
    assert_eq!((s.code, s.limit_remaining), (OK, 2));
    // Audited: the load and the reset.
    let audit: Value = app
        .client
        .get(app.url("/api/v1/audit"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(actions.contains(&"envoy.domain.save"), "{actions:?}");
    assert!(actions.contains(&"identifier.reset"), "{actions:?}");
    // A policy of the JSON API's kind keeps its name: a domain of that name is refused.
    app.put_policy("api", json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]}))
        .await;
    let r = put_domain(&app, "api", "domain: api\n").await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn redis_down_answers_by_the_domains_failure_mode() {
    let mut redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "100")]).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    let closed = app
        .client
        .put(app.url("/api/v1/envoy/domains/closed_one?failure_mode=closed"))
        .bearer_auth(ADMIN_KEY)
        .header("content-type", "application/yaml")
        .body("domain: closed_one\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), StatusCode::CREATED);
    let mut c = client(&app).await;
    // Let the policy cache hold both before Redis goes.
    assert_eq!(one(&mut c, "closed_one", &[("k", "v")]).await.code, OK);
    redis.kill();
    let open = one(
        &mut c,
        "edge_proxy_per_ip",
        &[("remote_address", "10.0.0.1")],
    )
    .await;
    assert_eq!(open.code, OK);
    let err = c
        .should_rate_limit(with_key(request(
            "closed_one",
            vec![descriptor(&[("k", "v")])],
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    redis.restart();
}

#[tokio::test]
async fn health_is_served() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let channel = Channel::from_shared(format!("http://{}", app.grpc.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
}

/// Two instances on one Redis, many concurrent callers: exactly the limit is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_allow_exactly_the_limit_under_concurrency() {
    let redis = RedisServer::start();
    let a = spawn_app(&redis).await;
    let b = spawn_app(&redis).await;
    load(
        &a,
        "burst",
        "domain: burst\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 50}\n",
    )
    .await;
    // b learns of the new domain by pub/sub.
    let mut cb = client(&b).await;
    eventually(
        "b knowing the domain",
        PATIENCE,
        async || one(&mut cb, "burst", &[("user", "warmup")]).await,
        |s| s.current_limit.is_some(),
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let app = if i % 2 == 0 { &a } else { &b };
        let mut c = client(app).await;
        tasks.push(tokio::spawn(async move {
            ask(&mut c, request("burst", vec![descriptor(&[("user", "u")])]))
                .await
                .overall_code
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() == OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 50);
}

#[tokio::test]
async fn the_json_endpoint_speaks_proto3_json() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    clear_of_window_turn(Duration::from_secs(60)).await;
    let post = |body: Value, key: Option<&str>| {
        let mut r = app.client.post(app.url("/json")).json(&body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let body = json!({"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.1.1.1"}]}], "hitsAddend": 1});
    let r = post(body.clone(), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{:?}", r.text().await);
    for left in [2, 1] {
        let r = post(body.clone(), Some(SERVICE_KEY)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["overallCode"], "OK", "{v}");
        assert_eq!(v["statuses"][0]["limitRemaining"], left, "{v}");
        assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE", "{v}");
        assert!(
            v["statuses"][0]["durationUntilReset"]
                .as_str()
                .unwrap()
                .ends_with('s')
        );
    }
    // The last one, in snake_case and with a 64-bit number as a string.
    let snake = json!({"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.1.1.1"}], "hits_addend": "1"}]});
    let v: Value = post(snake, Some(SERVICE_KEY))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["overallCode"], "OK", "{v}");
    assert!(
        v["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out: {v}"
    );
    let r = post(body.clone(), Some(SERVICE_KEY)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
    assert!(v["rawBody"].is_string());
    // Bad input names the field.
    for (bad, field) in [
        (
            json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "limit": {"requestsPerUnit": 1, "unit": "FORTNIGHT"}}]}),
            "descriptors[0].limit.unit",
        ),
        (
            json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}], "hitsAddend": -1}]}),
            "descriptors[0].hitsAddend",
        ),
        (json!({"domain": "d", "descriptorz": []}), "descriptorz"),
        (json!({"descriptors": []}), "domain"),
    ] {
        let r = post(bad.clone(), Some(SERVICE_KEY)).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["field"], field, "{bad}: {p}");
    }
}

#[tokio::test]
async fn draft03_headers_and_requests_envoyproxy_ratelimit_refuses() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_ENVOY_HEADERS", "draft03")]).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    let mut c = client(&app).await;
    let r = ask(
        &mut c,
        request(
            "edge_proxy_per_ip",
            vec![descriptor(&[("remote_address", "1.2.3.4")])],
        ),
    )
    .await;
    let headers: std::collections::HashMap<String, String> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(headers["ratelimit-limit"], "3");
    assert_eq!(headers["ratelimit-remaining"], "2");
    let reset: u64 = headers["ratelimit-reset"].parse().unwrap();
    assert!((1..=60).contains(&reset));
    // No descriptors, or no domain: INVALID_ARGUMENT. A descriptor without entries finds
    // no limit.
    for bad in [
        request("edge_proxy_per_ip", vec![]),
        request("", vec![descriptor(&[("a", "b")])]),
    ] {
        let e = c.should_rate_limit(with_key(bad)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
    let s = one(&mut c, "edge_proxy_per_ip", &[]).await;
    assert_eq!(s.code, OK);
    assert!(s.current_limit.is_none());
}

/// The dashboard edits a domain's file (not its rules), refuses a bad one beside the file,
/// and keeps the previous version in force.
#[tokio::test]
async fn the_dashboard_edits_a_domain_through_its_file() {
    use crate::auth::{Visitor, add_user, store};
    use spillway::domain::people::Role;
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    add_user(&store(&redis).await, "root", Role::Admin).await;
    let mut v = Visitor::signed_in(&app, "root").await;
    let csrf = v.csrf().await;
    let origin = v.origin();
    let page = v
        .get("/policy?name=edge_proxy_per_ip")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("Envoy domain file"), "{page}");
    assert!(page.contains("requests_per_unit: 3"), "{page}");
    let bad = PER_IP.replace("unit: minute", "unit: fortnight");
    let form = [
        ("csrf", csrf.as_str()),
        ("name", "edge_proxy_per_ip"),
        ("version", "1"),
        ("file", bad.as_str()),
    ];
    let r = v.post_form("/fn/envoy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["Field"]["field"], "file", "{e}");
    assert!(
        e["Field"]["message"]
            .as_str()
            .unwrap()
            .contains("descriptors[0].rate_limit.unit"),
        "{e}"
    );
    // The rule editor cannot turn it into an ordinary policy.
    let rules = [
        ("csrf", csrf.as_str()),
        ("name", "edge_proxy_per_ip"),
        ("version", "1"),
        ("rules[0][name]", "r"),
        ("rules[0][algorithm]", "fixed_window"),
        ("rules[0][limit]", "5"),
        ("rules[0][window_ms]", "1000"),
    ];
    let r = v.post_form("/fn/policy_save", &rules, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let good = PER_IP.replace("requests_per_unit: 3", "requests_per_unit: 7");
    let form = [
        ("csrf", csrf.as_str()),
        ("name", "edge_proxy_per_ip"),
        ("version", "1"),
        ("file", good.as_str()),
    ];
    let r = v.post_form("/fn/envoy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    let mut c = client(&app).await;
    let s = one(
        &mut c,
        "edge_proxy_per_ip",
        &[("remote_address", "9.9.9.9")],
    )
    .await;
    assert_eq!(s.current_limit.unwrap().requests_per_unit, 7);
    // A stale form is refused.
    let r = v.post_form("/fn/envoy_save", &form, Some(&origin)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

/// Reflection lists the services and describes the rate limit protocol, so grpcurl needs
/// no .proto files.
#[tokio::test]
async fn reflection_describes_the_rate_limit_service() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let channel = Channel::from_shared(format!("http://{}", app.grpc.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut r = ServerReflectionClient::new(channel);
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".into(),
        )),
    ];
    // Reflection needs a service key, as every method but health does.
    let mut call = tonic::Request::new(futures_util::stream::iter(requests.clone()));
    assert_eq!(
        r.server_reflection_info(call).await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    call = tonic::Request::new(futures_util::stream::iter(requests));
    call.metadata_mut().insert(
        "authorization",
        format!("Bearer {SERVICE_KEY}").parse().unwrap(),
    );
    let mut answers = r.server_reflection_info(call).await.unwrap().into_inner();
    let mut services = Vec::new();
    let mut files = 0;
    while let Some(answer) = answers.message().await.unwrap() {
        match answer.message_response.unwrap() {
            MessageResponse::ListServicesResponse(l) => {
                services = l.service.into_iter().map(|s| s.name).collect()
            }
            MessageResponse::FileDescriptorResponse(f) => files += f.file_descriptor_proto.len(),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        services.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_owned()),
        "{services:?}"
    );
    assert!(
        services.contains(&"grpc.health.v1.Health".to_owned()),
        "{services:?}"
    );
    assert!(files >= 1);
}

/// On a Redis Cluster: exactly the limit under concurrency from two instances, and a
/// request over one limit consumes nothing of another whose key lives in another slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_keeps_the_same_guarantees() {
    let cluster = crate::helpers::RedisCluster::start();
    let unused = RedisServer::start();
    let urls = cluster.urls().join(",");
    let a = spawn_app_with(&unused, &[("REDIS_CLUSTER_URLS", urls.as_str())]).await;
    let b = spawn_app_with(&unused, &[("REDIS_CLUSTER_URLS", urls.as_str())]).await;
    load_all_or_nothing(
        &a,
        "two",
        "domain: two\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 30}\n",
    )
    .await;
    let mut cb = client(&b).await;
    eventually(
        "b knowing the domain",
        PATIENCE,
        async || one(&mut cb, "two", &[("b", "warmup")]).await,
        |s| s.current_limit.is_some(),
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..90 {
        let app = if i % 2 == 0 { &a } else { &b };
        let mut c = client(app).await;
        tasks.push(tokio::spawn(async move {
            ask(&mut c, request("two", vec![descriptor(&[("b", "u")])]))
                .await
                .overall_code
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap() == OK);
    }
    assert_eq!(ok, 30);
    // a=1 and b=v live in different slots; once a is used up, b=v is never consumed.
    let keys = spillway::store::Keys::default();
    let policy = spillway::domain::Name::parse("two").unwrap();
    let mut conn = redis::Client::open(cluster.urls()[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut slot = |value: &str| -> i64 {
        let id = spillway::domain::Identifier::new("envoy", value).unwrap();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(keys.tag(&policy, &id))
            .query(&mut conn)
            .unwrap()
    };
    assert_ne!(slot("a=1"), slot("b=v"));
    let mut ca = client(&a).await;
    let both = || {
        request(
            "two",
            vec![descriptor(&[("a", "1")]), descriptor(&[("b", "v")])],
        )
    };
    assert_eq!(ask(&mut ca, both()).await.overall_code, OK);
    for _ in 0..5 {
        let r = ask(&mut ca, both()).await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!(r.statuses[1].limit_remaining, 29, "{r:?}");
    }
    assert_eq!(one(&mut ca, "two", &[("b", "v")]).await.limit_remaining, 28);
}

/// Every caller limit and hit count at the edges of what the protocol can carry: each is
/// answered (OK or OVER_LIMIT, exactly as the counts say) or refused as INVALID_ARGUMENT
/// naming the field; the server never fails, and keeps answering.
#[tokio::test]
async fn caller_limits_and_hits_at_the_edges_are_answered_or_refused_by_name() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "edges", "domain: edges\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1000000000}\n").await;
    let mut c = client(&app).await;
    let max = 1_000_000_000u64;
    let mut n = 0;
    for rpu in [0u32, 1, 1_000_000_000, 1_000_000_001, u32::MAX] {
        for unit in 0..=8 {
            for hits in [0u64, 1, max, max + 1, u64::MAX] {
                n += 1;
                let mut d = descriptor(&[("k", &format!("v{n}"))]);
                d.limit = Some(RateLimitOverride {
                    requests_per_unit: rpu,
                    unit,
                });
                d.hits_addend = Some(UInt64Value { value: hits });
                let answer = c
                    .should_rate_limit(with_key(request("edges", vec![d])))
                    .await;
                let valid_unit = (1..=7).contains(&unit);
                match answer {
                    Ok(r) => {
                        let r = r.into_inner();
                        assert!(
                            valid_unit && u64::from(rpu) <= max && hits <= max,
                            "{rpu} {unit} {hits}: {r:?}"
                        );
                        let expect_ok = hits == 0 || hits <= u64::from(rpu);
                        assert_eq!(
                            r.overall_code == OK,
                            expect_ok,
                            "{rpu} {unit} {hits}: {r:?}"
                        );
                    }
                    Err(e) => {
                        assert_eq!(
                            e.code(),
                            tonic::Code::InvalidArgument,
                            "{rpu} {unit} {hits}: {e:?}"
                        );
                        let field = if !valid_unit {
                            "descriptors[0].limit.unit"
                        } else if u64::from(rpu) > max {
                            "descriptors[0].limit.requests_per_unit"
                        } else {
                            "descriptors[0].hits_addend"
                        };
                        assert!(
                            e.message().contains(field),
                            "{rpu} {unit} {hits}: {}",
                            e.message()
                        );
                    }
                }
            }
        }
    }
    // The domain's own limit at its largest, with the largest hits validation accepts.
    let mut d = descriptor(&[("k", "big")]);
    d.hits_addend = Some(UInt64Value { value: max });
    let r = ask(&mut c, request("edges", vec![d.clone()])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    d.hits_addend = Some(UInt64Value { value: 1 });
    assert_eq!(
        ask(&mut c, request("edges", vec![d])).await.overall_code,
        OVER
    );
    // Request-level hits beyond the largest cost are refused too.
    let mut r = request("edges", vec![descriptor(&[("k", "x")])]);
    r.hits_addend = u32::MAX;
    let e = c.should_rate_limit(with_key(r)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

/// One `ShouldRateLimit` call over raw HTTP/2 (the `h2` crate), so a test can send what a
/// tonic client never would: `body` is the whole request body, frames and all. Answers
/// the gRPC status (from the trailers, or the headers of a trailers-only answer), how long
/// it took, and the message. Every answer is a 200 of `application/grpc`; an error is a
/// trailers-only answer (its status in the headers, no body).
async fn raw_call(
    app: &TestApp,
    headers: &[(&str, &str)],
    body: bytes::Bytes,
) -> (String, std::time::Duration, Vec<u8>) {
    raw_call_in_frames(app, headers, vec![body]).await
}

/// `raw_call` with the request's body sent as one DATA frame per chunk.
async fn raw_call_in_frames(
    app: &TestApp,
    headers: &[(&str, &str)],
    chunks: Vec<bytes::Bytes>,
) -> (String, std::time::Duration, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(app.grpc.unwrap())
        .await
        .unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        app.grpc.unwrap()
    ))
    .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let started = std::time::Instant::now();
    let mut sender = sender.ready().await.unwrap();
    let (response, mut stream) = sender
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        stream.reserve_capacity(chunk.len());
        stream.send_data(chunk, i == last).unwrap();
    }
    let response = response.await.unwrap();
    let status = |h: &http::HeaderMap| h.get("grpc-status").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(response.status(), http::StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/grpc");
    if let Some(code) = status(response.headers()) {
        // A trailers-only answer: the status in the headers, and nothing after them.
        assert!(
            response.body().is_end_stream(),
            "a trailers-only answer has no body"
        );
        return (code, started.elapsed(), Vec::new());
    }
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    (
        status(&trailers).unwrap_or_default(),
        started.elapsed(),
        data,
    )
}

/// A message in gRPC's framing: the compression flag, the length, the bytes.
fn framed(compressed: u8, declared: usize, message: &[u8]) -> bytes::Bytes {
    let mut out = vec![compressed];
    out.extend_from_slice(&(declared as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

/// `ShouldRateLimit` is answered without tonic's server stack; these are the cases that
/// stack handled and the short way must too: gRPC's framing, a compressed message, a
/// message too large, a missing key, and the caller's `grpc-timeout`.
#[tokio::test]
async fn grpc_framing_keys_and_deadlines_are_kept_on_the_short_way() {
    use prost::Message;
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_REDIS_TIMEOUT_MS", "3000")]).await;
    load(&app, "edge_proxy_per_ip", PER_IP).await;
    clear_of_window_turn(Duration::from_secs(60)).await;
    let message = request(
        "edge_proxy_per_ip",
        vec![descriptor(&[("remote_address", "10.9.9.9")])],
    )
    .encode_to_vec();
    let bearer = format!("Bearer {SERVICE_KEY}");
    let grpc = [
        ("content-type", "application/grpc"),
        ("authorization", bearer.as_str()),
    ];

    // The plain call: a message, then `grpc-status: 0` in the trailers.
    let (code, _, answer) = raw_call(&app, &grpc, framed(0, message.len(), &message)).await;
    assert_eq!(code, "0");
    assert_eq!(answer[0], 0, "an uncompressed answer");
    assert_eq!(
        u32::from_be_bytes(answer[1..5].try_into().unwrap()) as usize,
        answer.len() - 5
    );
    let decoded = RateLimitResponse::decode(&answer[5..]).unwrap();
    assert_eq!(decoded.overall_code, OK);
    assert_eq!(decoded.statuses[0].limit_remaining, 2);
    // The same with `application/grpc+proto`.
    let proto = [grpc[1], ("content-type", "application/grpc+proto")];
    assert_eq!(
        raw_call(&app, &proto, framed(0, message.len(), &message))
            .await
            .0,
        "0"
    );

    // A message in DATA frames of one byte each (the prefix too is split) is read whole.
    let split = request(
        "edge_proxy_per_ip",
        vec![descriptor(&[("remote_address", "10.9.9.7")])],
    )
    .encode_to_vec();
    for left in [2, 1] {
        let bytes = framed(0, split.len(), &split);
        let chunks = (0..bytes.len()).map(|i| bytes.slice(i..i + 1)).collect();
        let (code, _, answer) = raw_call_in_frames(&app, &grpc, chunks).await;
        assert_eq!(code, "0");
        let decoded = RateLimitResponse::decode(&answer[5..]).unwrap();
        assert_eq!(decoded.statuses[0].limit_remaining, left);
    }
    // A message of exactly 64 KiB is read and decoded: its long value is what is refused,
    // by name (INVALID_ARGUMENT), not its size.
    let of_length = |n: usize| {
        request(
            "edge_proxy_per_ip",
            vec![descriptor(&[("remote_address", &"x".repeat(n))])],
        )
        .encode_to_vec()
    };
    // The fields around the value take the same bytes for any value of about 64 KiB.
    let around = of_length(60_000).len() - 60_000;
    let largest = of_length(64 * 1024 - around);
    assert_eq!(largest.len(), 64 * 1024);

    // Refused, each with gRPC's code, as trailers-only answers; none of them counted.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bytes::Bytes);
    let cases: [Case; 9] = [
        // a message of no bytes is an empty request: its domain is missing
        ("3", &grpc, framed(0, 0, &[])),
        ("3", &grpc, framed(0, largest.len(), &largest)),
        ("16", &grpc[..1], framed(0, message.len(), &message)),
        ("13", &grpc, framed(1, message.len(), &message)),
        ("13", &grpc, framed(0, message.len() + 10, &message)),
        ("13", &grpc, bytes::Bytes::from_static(&[0, 0, 0])),
        (
            "13",
            &grpc,
            // more bytes than declared (they would decode: a message twice is one message)
            [&framed(0, message.len(), &message)[..], &message[..]]
                .concat()
                .into(),
        ),
        ("13", &grpc, framed(0, 3, &[0xff, 0xff, 0xff])),
        (
            "11",
            &grpc,
            framed(0, 64 * 1024 + 1, &vec![0; 64 * 1024 + 1]),
        ),
    ];
    for (expected, headers, body) in cases {
        let (code, _, answer) = raw_call(&app, headers, body).await;
        assert_eq!(code, expected, "{headers:?}");
        assert!(answer.is_empty());
    }
    // A compressed call goes to tonic's service, which has no compression either.
    let gzip = [grpc[0], grpc[1], ("grpc-encoding", "gzip")];
    assert_eq!(raw_call(&app, &gzip, framed(1, 3, b"abc")).await.0, "12");
    let (code, _, answer) = raw_call(&app, &grpc, framed(0, message.len(), &message)).await;
    assert_eq!(code, "0");
    let decoded = RateLimitResponse::decode(&answer[5..]).unwrap();
    // The limit is 3 and this is the third good call: had a refused one counted, it
    // would be over the limit.
    assert_eq!(decoded.overall_code, OK, "only the good calls counted");
    assert_eq!(decoded.statuses[0].limit_remaining, 0);

    // The caller's deadline: with Redis paused, a call given 100 ms ends at 100 ms with
    // DEADLINE_EXCEEDED, not at the Redis timeout (3 s); a bad deadline is named.
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let timed = [grpc[0], grpc[1], ("grpc-timeout", "100m")];
    let other = request(
        "edge_proxy_per_ip",
        vec![descriptor(&[("remote_address", "10.9.9.8")])],
    )
    .encode_to_vec();
    let (code, took, _) = raw_call(&app, &timed, framed(0, other.len(), &other)).await;
    assert_eq!(code, "4");
    assert!(
        took >= std::time::Duration::from_millis(100)
            && took < std::time::Duration::from_millis(1000),
        "{took:?}"
    );
    let bad = [grpc[0], grpc[1], ("grpc-timeout", "soon")];
    assert_eq!(
        raw_call(&app, &bad, framed(0, message.len(), &message))
            .await
            .0,
        "3"
    );
}

/// A token budget enforced at the gateway (Envoy's `apply_on_stream_done` with
/// `hits_addend` from a response header): each request peeks (0 hits) before it runs, and
/// its cost is reported once the response is done.
async fn budget_run(c: &mut RateLimitServiceClient<Channel>, domain: &str) -> Vec<i32> {
    clear_of_window_turn(Duration::from_secs(60)).await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let mut peek = descriptor(&[("user", "alice")]);
        peek.hits_addend = Some(UInt64Value { value: 0 });
        let before = ask(c, request(domain, vec![peek])).await;
        codes.push(before.overall_code);
        if before.overall_code == OK {
            let mut used = descriptor(&[("user", "alice")]);
            used.hits_addend = Some(UInt64Value { value: 60 });
            // Envoy ignores this answer: the response is gone already.
            ask(c, request(domain, vec![used])).await;
        }
    }
    codes
}

const BUDGET: &str = "domain: tokens\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

#[tokio::test]
async fn a_cost_reported_after_the_response_always_lands() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "tokens", BUDGET).await;
    let mut c = client(&app).await;
    // 100 tokens a minute, 60 a response: as envoyproxy/ratelimit answers.
    assert_eq!(budget_run(&mut c, "tokens").await, [OK, OK, OVER, OVER]);
}

#[tokio::test]
async fn stop_cache_key_increment_when_overlimit_makes_all_or_nothing_the_default() {
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    )
    .await;
    load(&app, "tokens", BUDGET).await;
    let mut c = client(&app).await;
    // All or nothing: the second report (60 with 40 left) counts nowhere, so the budget is
    // never seen spent. This is why it is not the default.
    assert_eq!(budget_run(&mut c, "tokens").await, [OK, OK, OK, OK]);
    // A domain that says how it counts wins over the server's default.
    let r = put_domain_with(
        &app,
        "tokens2?counting=every_hit",
        &BUDGET.replace("tokens", "tokens2"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(budget_run(&mut c, "tokens2").await, [OK, OK, OVER, OVER]);
    // A new file without `counting` keeps the domain's.
    load(
        &app,
        "tokens2",
        &BUDGET.replace("tokens", "tokens2").replace("100", "1000"),
    )
    .await;
    let policy: Value = app
        .as_admin(Method::GET, "/api/v1/policies/tokens2", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(policy["envoy"]["counting"], "every_hit", "{policy}");
    let bad = put_domain_with(
        &app,
        "tokens2?counting=sometimes",
        &BUDGET.replace("tokens", "tokens2"),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let problem: Value = bad.json().await.unwrap();
    assert_eq!(problem["field"], "counting", "{problem}");
}

/// Files written as envoyproxy/ratelimit's README and loader read them (our own fixtures,
/// one per rule): every field upstream accepts loads, with its meaning.
#[tokio::test]
async fn upstreams_fields_load_with_their_meaning() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let accepted = [
        // `replaces` inside `rate_limit`, as upstream writes it.
        "domain: r\ndescriptors:\n  - key: a\n    rate_limit:\n      name: a\n      unit: minute\n      requests_per_unit: 1\n  - key: b\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n      replaces:\n        - name: a\n",
        // Every optional descriptor field.
        "domain: f\ndescriptors:\n  - key: files\n    value: \"f/*\"\n    share_threshold: true\n    value_to_metric: true\n    detailed_metric: true\n    quota_mode: true\n    metadata:\n      owner: team-a\n      tags: [x, y]\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n",
        // No descriptors at all: every request is OK.
        "domain: e\ndescriptors: []\n",
        // ... written as upstream's duplicate_domain.yaml writes it.
        "domain: n\ndescriptors:\n",
    ];
    for file in accepted {
        let domain = file[8..9].to_owned();
        let r = put_domain(&app, &domain, file).await;
        let status = r.status();
        assert!(
            status.is_success(),
            "{file}\n{status}: {}",
            r.text().await.unwrap()
        );
    }
    let mut c = client(&app).await;
    clear_of_window_turn(Duration::from_secs(60)).await;
    // Empty: OK, nothing counted.
    assert_eq!(one(&mut c, "e", &[("any", "thing")]).await.code, OK);
    // `replaces`: b replaces a when both apply, so a (1 a minute) is not checked.
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request(
                "r",
                vec![descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
            ),
        )
        .await;
        assert_eq!(r.overall_code, OK);
    }
    // `share_threshold`: every file under f/ shares one counter of 2.
    let mut codes = Vec::new();
    for file in ["f/a.pdf", "f/b.csv", "f/c.txt"] {
        codes.push(one(&mut c, "f", &[("files", file)]).await.code);
    }
    assert_eq!(codes, [OK, OK, OVER]);
    // `detailed_metric`: statistics under the request's values, the shared wildcard's prefix.
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"spillway_envoy_hits_total{key="f.files_f/",status="within_limit"} 2"#),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("envoy_hits"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Refused as upstream refuses them, the field named.
    let refused = [
        (
            "domain: x\ndescriptors:\n  - key: a\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "descriptors[0].share_threshold",
        ),
        (
            "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n",
            "descriptors[0].rate_limit.replaces[0].name",
        ),
        (
            "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n",
            "descriptors[0].rate_limit.replaces[0].name",
        ),
        (
            "domain: x\ndescriptors:\n  - key: a\n    metadata: 5\n",
            "descriptors[0].metadata",
        ),
        (
            "domain: x\ndescriptors:\n  - key: a\n    quota_mod: true\n",
            "descriptors[0]",
        ),
    ];
    for (file, field) in refused {
        let r = put_domain(&app, "x", file).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{file}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["field"]
                .as_str()
                .unwrap_or_default()
                .starts_with(field),
            "{file}: {problem}"
        );
    }
}

/// `quota_mode`: a descriptor over its quota says so, but fails the request only when
/// every quota descriptor of it is over.
#[tokio::test]
async fn quota_mode_fails_a_request_only_when_every_quota_is_over() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "q",
        "domain: q\ndescriptors:\n  - key: small\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: big\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .await;
    let mut c = client(&app).await;
    let both = || {
        request(
            "q",
            vec![descriptor(&[("small", "s")]), descriptor(&[("big", "b")])],
        )
    };
    clear_of_window_turn(Duration::from_secs(3600)).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = ask(&mut c, both()).await;
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        seen.push((r.overall_code, codes));
    }
    assert_eq!(
        seen,
        [
            (OK, vec![OK, OK]),
            (OK, vec![OVER, OK]),
            (OK, vec![OVER, OK]),
            (OVER, vec![OVER, OVER]),
        ]
    );
}

/// One call of Kuadrant's `kuadrant.service.ratelimit.v1.RateLimitService/<method>` (the
/// messages are Envoy's), with the service key.
async fn kuadrant(app: &TestApp, method: &str, message: RateLimitRequest) -> RateLimitResponse {
    let channel = Channel::from_shared(format!("http://{}", app.grpc.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = format!("/kuadrant.service.ratelimit.v1.RateLimitService/{method}")
        .parse()
        .unwrap();
    let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
    grpc.unary(with_key(message), path, codec)
        .await
        .unwrap()
        .into_inner()
}

/// Kuadrant's extension, with Limitador's semantics: `CheckRateLimit` says whether one more
/// hit fits and counts nothing; `Report` adds the request's hits, past the limit too.
#[tokio::test]
async fn kuadrants_check_and_report_count_a_token_budget() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(&app, "llm", "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n").await;
    clear_of_window_turn(Duration::from_secs(3600)).await;
    let alice = || request("llm", vec![descriptor(&[("user", "alice")])]);
    let mut codes = Vec::new();
    for _ in 0..4 {
        let check = kuadrant(&app, "CheckRateLimit", alice()).await;
        codes.push(check.overall_code);
        assert!(
            check.statuses.is_empty(),
            "Limitador answers the overall code only"
        );
        if check.overall_code == OK {
            let mut used = alice();
            used.hits_addend = 60;
            assert_eq!(kuadrant(&app, "Report", used).await.overall_code, OK);
        }
    }
    assert_eq!(codes, [OK, OK, OVER, OVER]);
    // Checking counted nothing: 120 of 100 used, all by the two reports.
    let mut c = client(&app).await;
    let mut peek = descriptor(&[("user", "alice")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let state = ask(&mut c, request("llm", vec![peek])).await.statuses[0].clone();
    assert_eq!((state.code, state.limit_remaining), (OVER, 0));
    let mut fresh = request("llm", vec![descriptor(&[("user", "bob")])]);
    fresh.hits_addend = 99;
    kuadrant(&app, "Report", fresh).await;
    let bob = kuadrant(
        &app,
        "CheckRateLimit",
        request("llm", vec![descriptor(&[("user", "bob")])]),
    )
    .await;
    assert_eq!(bob.overall_code, OK, "99 of 100 used: one more fits");
    // No domain: UNKNOWN, as Limitador answers; an unknown domain is OK and counts nothing.
    assert_eq!(
        kuadrant(&app, "CheckRateLimit", request("", vec![]))
            .await
            .overall_code,
        0
    );
    let other = kuadrant(
        &app,
        "Report",
        request("nowhere", vec![descriptor(&[("a", "b")])]),
    )
    .await;
    assert_eq!(other.overall_code, OK);
}

/// The JSON check of an Envoy domain's descriptor (the `envoy` dimension) is counted by the
/// one limit its entries find, as over gRPC, however many limits the domain has (every one
/// of a 4,000-descriptor domain was applied: a 1.2 MB answer, a 308 KB header); a
/// descriptor that finds none counts nothing.
#[tokio::test]
async fn a_json_check_of_a_descriptor_applies_the_one_limit_it_finds() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let mut yaml = String::from("domain: wide\ndescriptors:\n");
    for i in 0..400 {
        yaml.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: {}}}\n",
            i + 1
        ));
    }
    load(&app, "wide", &yaml).await;
    let check = |value: &str| app.check(json!({"policy": "wide", "identifiers": {"envoy": value}}));
    let r = check("k7=x").await;
    assert_eq!(r.status(), 200);
    let header = r.headers()["ratelimit-policy"].len();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["results"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["results"][0]["limit"], 8, "{body}");
    assert!(header < 200, "a header of {header} bytes");
    let r = check("nothing=here").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert!(body["results"].as_array().unwrap().is_empty(), "{body}");
}

/// Duplicate keys in a domain's YAML are refused, saying where they are.
#[tokio::test]
async fn a_domain_with_a_duplicate_key_is_refused_saying_where() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let r = app
        .client
        .put(app.url("/api/v1/envoy/domains/dup"))
        .bearer_auth(ADMIN_KEY)
        .header(reqwest::header::CONTENT_TYPE, "application/yaml")
        .body("domain: dup\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      requests_per_unit: 2\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("duplicate entry with key \"requests_per_unit\"")
            && detail.contains("line"),
        "{detail}"
    );
}

/// `/json` takes integers written with an exponent, and its 401 is typed as one.
#[tokio::test]
async fn json_takes_integers_with_an_exponent_and_types_its_401() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let r = app
        .client
        .post(app.url("/json"))
        .bearer_auth(SERVICE_KEY)
        .json(&json!({"domain": "none", "hitsAddend": 1e0,
            "descriptors": [{"entries": [{"key": "k", "value": "v"}], "hits_addend": "2e0"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = app
        .client
        .post(app.url("/json"))
        .json(&json!({"domain": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["type"],
        "https://spillway.dev/problems/unauthorized"
    );
}

/// The server's quota mode (upstream's `QUOTA_MODE`): a descriptor over its limit says so,
/// and the request fails only when every descriptor with a limit is over; one that found
/// no limit counts as within its quota.
#[tokio::test]
async fn with_every_limit_in_quota_mode_a_request_fails_only_when_all_are_over() {
    let redis = RedisServer::start();
    let app =
        crate::helpers::spawn_app_with(&redis, &[("SPILLWAY_ENVOY_QUOTA_MODE", "true")]).await;
    load(
        &app,
        "quota",
        "domain: quota\ndescriptors:\n  - key: backend\n    value: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: backend\n    value: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .await;
    let mut c = client(&app).await;
    let both = || {
        request(
            "quota",
            vec![
                descriptor(&[("backend", "a")]),
                descriptor(&[("backend", "b")]),
            ],
        )
    };
    let first = ask(&mut c, both()).await;
    assert_eq!((first.overall_code, first.statuses[0].code), (OK, OK));
    // a is over, b has one left: the request passes, a's status says it is over.
    let second = ask(&mut c, both()).await;
    assert_eq!(
        (
            second.overall_code,
            second.statuses[0].code,
            second.statuses[1].code
        ),
        (OK, OVER, OK)
    );
    // A descriptor with no limit is a quota within its limit: still OK.
    let mut with_unknown = both();
    with_unknown
        .descriptors
        .push(descriptor(&[("backend", "z")]));
    assert_eq!(ask(&mut c, with_unknown).await.overall_code, OK);
    // Both over: over.
    assert_eq!(ask(&mut c, both()).await.overall_code, OVER);
}
