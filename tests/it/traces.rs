//! OpenTelemetry traces: the real binary sends its spans over OTLP/HTTP to a receiver this
//! test serves itself, and the spans have the parents, links and attributes they should: a
//! server span under the caller's `traceparent` (HTTP header and gRPC metadata), a check
//! span under it with the policy and the outcome, a Redis call span under a check that links
//! every check it carried; an admin action's span names the action. A setting that cannot
//! be used stops the start with a line naming it.

use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{AnyValue, any_value},
    trace::v1::Span,
};
use prost::Message;
use serde_json::json;

use crate::{
    envoy::{descriptor, load, request},
    helpers::{
        ADMIN_KEY, AppProcess, PATIENCE, RedisServer, SERVICE_KEY, TestApp, eventually, free_port,
    },
};

/// Every span received, from every export.
type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP traces receiver on a free port; its base URL and what it received.
async fn receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let store = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP export");
                let mut spans = store.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        spans.extend(scope.spans);
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            other => Some(format!(
                "{:?}",
                AnyValue {
                    value: Some(other.clone())
                }
            )),
        }
    })
}

/// A W3C `traceparent` of a sampled caller span: (header, trace id, span id), in hex.
fn traceparent(n: u32) -> (String, String, String) {
    let trace = format!("4bf92f3577b34da6a3ce929d{n:08x}");
    let span = format!("00f067aa{n:08x}");
    (format!("00-{trace}-{span}-01"), trace, span)
}

/// The spans received so far, shown by name, id and parent when a wait for them fails.
struct Spans(Vec<Span>);

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<_> = self
            .0
            .iter()
            .map(|s| (&s.name, hex(&s.span_id), hex(&s.parent_span_id)))
            .collect();
        write!(f, "{} spans: {shown:#?}", self.0.len())
    }
}

/// Waits until `found` holds for the spans received (the batch processor sends every
/// 100 ms here), and returns them.
async fn spans_until(
    received: &Received,
    what: &str,
    found: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    eventually(
        &format!("a {what}"),
        PATIENCE,
        async || Spans(received.lock().unwrap().clone()),
        |spans| found(&spans.0),
    )
    .await
    .0
}

/// The one span named `name` whose parent is `parent` (hex), in trace `trace`.
fn child<'a>(spans: &'a [Span], name: &str, trace: &str, parent: &str) -> Option<&'a Span> {
    spans
        .iter()
        .find(|s| s.name == name && hex(&s.trace_id) == trace && hex(&s.parent_span_id) == parent)
}

#[tokio::test]
async fn spans_reach_an_otlp_receiver_with_their_parents_links_and_attributes() {
    spillway::install_tls_provider();
    let (collector, received) = receiver().await;
    let redis = RedisServer::start();
    let server = AppProcess::start_with(
        &redis,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "spillway-under-test"),
        ],
    );
    let app = TestApp::remote(server.addr);

    // An admin action, with the caller's traceparent.
    let (header, trace, caller) = traceparent(1);
    let saved = app
        .client
        .put(app.url("/api/v1/policies/traced"))
        .bearer_auth(ADMIN_KEY)
        .header("traceparent", &header)
        .json(&json!({"rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000}]}))
        .send()
        .await
        .unwrap();
    let saved_status = saved.status().as_u16();
    assert!(saved.status().is_success(), "{saved_status}");

    // A check allowed, then one denied, each under its own caller span.
    let check = |n: u32, user: &'static str| {
        let app = app.clone_client();
        async move {
            let (header, _, _) = traceparent(n);
            app.client
                .post(app.url("/api/v1/check"))
                .bearer_auth(SERVICE_KEY)
                .header("traceparent", header)
                .json(&json!({"policy": "traced", "identifiers": {"user": user}}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(check(2, "ada").await, 200);
    assert_eq!(check(3, "ada").await, 429);
    // A caller whose own trace is not sampled: nothing of its check is recorded.
    let (unsampled, unsampled_trace, _) = traceparent(300);
    let answer = app
        .client
        .post(app.url("/api/v1/check"))
        .bearer_auth(SERVICE_KEY)
        .header("traceparent", unsampled.replace("-01", "-00"))
        .json(&json!({"policy": "traced", "identifiers": {"user": "bo"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    // A batch of 12 checks: all 12 join the coalescer's queue in one poll, while Redis is
    // paused, so with at most 4 calls out at once some call carries several of them,
    // however slowly the machine runs.
    redis.pause(1000);
    let (batch_header, batch_trace, _) = traceparent(100);
    let checks: Vec<_> = (0..12)
        .map(|i| json!({"policy": "traced", "identifiers": {"user": format!("u{i}")}}))
        .collect();
    let batch = app
        .client
        .post(app.url("/api/v1/check/batch"))
        .bearer_auth(SERVICE_KEY)
        .header("traceparent", batch_header)
        .json(&json!({ "checks": checks }))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 200);

    // ShouldRateLimit over gRPC, the traceparent in its metadata.
    let domain = r#"
domain: traced_edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#;
    load(&app, "traced_edge", domain).await;
    let mut grpc = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let (grpc_header, grpc_trace, grpc_caller) = traceparent(200);
    let mut call = tonic::Request::new(request(
        "traced_edge",
        vec![descriptor(&[("remote_address", "192.0.2.1")])],
    ));
    call.metadata_mut().insert(
        "authorization",
        format!("Bearer {SERVICE_KEY}").parse().unwrap(),
    );
    call.metadata_mut()
        .insert("traceparent", grpc_header.parse().unwrap());
    grpc.should_rate_limit(call).await.unwrap();

    let spans = spans_until(&received, "gRPC check span", |spans| {
        spans
            .iter()
            .any(|s| s.name == "check" && hex(&s.trace_id) == grpc_trace)
    })
    .await;

    assert!(
        !spans.iter().any(|s| hex(&s.trace_id) == unsampled_trace),
        "spans recorded for a caller whose trace is not sampled"
    );
    assert!(
        !spans
            .iter()
            .any(|s| s.name == "check" && s.parent_span_id.is_empty()),
        "a check traced on its own, outside the request that asked for it"
    );

    // The admin action: a server span under the caller, naming the action.
    // Named by the route's template: no value of the path (an identifier's) in a name.
    let put = child(&spans, "PUT /api/v1/policies/{name}", &trace, &caller)
        .expect("the admin request's span is the caller's child");
    assert_eq!(
        attribute(put, "http.route").as_deref(),
        Some("/api/v1/policies/{name}")
    );
    assert!(
        spans.iter().all(|s| !s.name.contains("traced")
            && s.attributes.iter().all(|a| a.key != "url.path")),
        "no span names a path's value"
    );
    assert_eq!(
        attribute(put, "spillway.action").as_deref(),
        Some("policy.save")
    );
    assert_eq!(attribute(put, "spillway.target").as_deref(), Some("traced"));
    assert_eq!(
        attribute(put, "http.response.status_code"),
        Some(saved_status.to_string())
    );

    // Each check: server span under the caller, check span under it, Redis call under that.
    let mut check_spans = Vec::new();
    for (n, outcome) in [(2, "allowed"), (3, "denied")] {
        let (_, trace, caller) = traceparent(n);
        let server = child(&spans, "POST /api/v1/check", &trace, &caller).unwrap_or_else(|| {
            panic!(
                "no server span for check {n}: {:#?}",
                spans
                    .iter()
                    .map(|s| (&s.name, hex(&s.trace_id), hex(&s.parent_span_id)))
                    .collect::<Vec<_>>()
            )
        });
        let check = child(&spans, "check", &trace, &hex(&server.span_id))
            .unwrap_or_else(|| panic!("no check span under check {n}'s server span"));
        assert_eq!(
            attribute(check, "spillway.policy").as_deref(),
            Some("traced")
        );
        assert_eq!(
            attribute(check, "spillway.outcome").as_deref(),
            Some(outcome)
        );
        check_spans.push(hex(&check.span_id));
    }
    let allowed_check = &check_spans[0];
    let redis_call = spans
        .iter()
        .find(|s| s.name == "redis check.lua" && &hex(&s.parent_span_id) == allowed_check)
        .expect("the allowed check's Redis call is its child");
    assert_eq!(
        attribute(redis_call, "db.system.name").as_deref(),
        Some("redis")
    );
    assert_eq!(
        redis_call
            .links
            .iter()
            .map(|l| hex(&l.span_id))
            .collect::<Vec<_>>(),
        vec![allowed_check.clone()],
        "a call that carried one check links that check"
    );

    // The batch's checks: some call carried several, and links each one's check span; its
    // parent is the first it carried.
    let batch_checks: Vec<String> = spans
        .iter()
        .filter(|s| s.name == "check" && hex(&s.trace_id) == batch_trace)
        .map(|s| hex(&s.span_id))
        .collect();
    assert_eq!(
        batch_checks.len(),
        12,
        "a check span for each of the 12 checks"
    );
    let coalesced = spans
        .iter()
        .filter(|s| s.name == "redis check.lua" && s.links.len() > 1)
        .max_by_key(|s| s.links.len())
        .expect("a Redis call that carried several checks");
    for link in &coalesced.links {
        assert!(
            batch_checks.contains(&hex(&link.span_id)) && hex(&link.trace_id) == batch_trace,
            "a link names a check span of the batch, in its trace"
        );
    }
    assert_eq!(
        hex(&coalesced.parent_span_id),
        hex(&coalesced.links[0].span_id)
    );
    assert_eq!(
        attribute(coalesced, "spillway.checks_carried"),
        Some(coalesced.links.len().to_string())
    );

    // gRPC: the call's server span under the metadata's traceparent, the check under it.
    let call_span = child(
        &spans,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        &grpc_trace,
        &grpc_caller,
    )
    .expect("the gRPC call's span is the caller's child");
    assert_eq!(attribute(call_span, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attribute(call_span, "rpc.grpc.status_code").as_deref(),
        Some("0")
    );
    let envoy_check = child(&spans, "check", &grpc_trace, &hex(&call_span.span_id))
        .expect("the gRPC call's check span");
    assert_eq!(
        attribute(envoy_check, "spillway.envoy_domain").as_deref(),
        Some("traced_edge")
    );
    assert_eq!(
        attribute(envoy_check, "spillway.outcome").as_deref(),
        Some("allowed")
    );
}

#[test]
fn a_trace_setting_that_cannot_be_used_stops_the_start_naming_it() {
    for (name, value) in [
        ("OTEL_TRACES_SAMPLER_ARG", "1%"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
            .env(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:1/v1/traces",
            )
            .env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .env(name, value)
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .env("LEPTOS_SITE_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("SPILLWAY_GRPC_ADDR", format!("127.0.0.1:{}", free_port()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}={value} started");
        assert!(
            stderr.starts_with("spillway: reading the configuration: ") && stderr.contains(name),
            "{name}={value}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
}

/// A collector that is down: the spans lost are counted in a metric, and the log says so
/// once, not once per batch.
#[tokio::test]
async fn failed_exports_are_counted_and_said_once() {
    let redis = RedisServer::start();
    let closed = format!("http://127.0.0.1:{}", free_port());
    let server = AppProcess::start_with(
        &redis,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", closed.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let app = TestApp::remote(server.addr);
    let failed = || async {
        let metrics = app.metrics().await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("spillway_trace_exports_failed_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Each request is a span; each batch of them fails to export.
    eventually(
        "three failed exports counted",
        PATIENCE,
        async || {
            let (header, _, _) = traceparent(7);
            let _ = app
                .client
                .get(app.url("/api/v1/policies"))
                .header("traceparent", header)
                .send()
                .await
                .unwrap();
            failed().await
        },
        |failed| *failed >= 3.0,
    )
    .await;
    let log = server.log();
    assert_eq!(
        log.matches("exporting spans failed").count(),
        1,
        "said once: {log}"
    );
}
