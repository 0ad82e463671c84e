//! Spillway as Envoy Gateway's rate limit Deployment, with nothing but the image swapped: the
//! binary started with the environment Envoy Gateway's controller renders for
//! envoyproxy/ratelimit (its Redis with client certificates, its xDS server over mutual TLS,
//! its metrics port and tracing variables, a user's `CACHE_KEY_PREFIX`), the domains its
//! translator sends over xDS, and a real Envoy calling the gRPC port over TLS as the
//! gateway's proxies do. Only the ports differ: each is a free one, where Envoy Gateway uses
//! 8080, 8081, 18001 and 19001.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use envoy_types::pb::{
    envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient,
    ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    },
};
use reqwest::StatusCode;
use tonic::transport::Channel;

use crate::{
    envoy::{OK, OVER, descriptor, request},
    gateway::backend,
    helpers::{PATIENCE, clear_of_window_turn, eventually, free_port},
    listeners_tls::{Ca, Folder},
    tls::TlsRedis,
    xds::{Pki, Running},
};

/// The listener's domain, as Envoy Gateway names it (`<namespace>/<gateway>/<listener>`).
const DOMAIN: &str = "default/eg/http";
/// The route rule's descriptor: key and value are the route's name.
const ROUTE: &str = "httproute/default/backend/rule/0/match/0";

/// What Envoy Gateway's translator sends for a route rule limiting each `x-user-id` to
/// `limit` a minute, and a second listener's domain (a ListenerSet's: past 64 characters,
/// starting as a third does).
fn snapshot(limit: u32) -> Vec<RateLimitConfig> {
    let rule = |domain: &str, limit: u32| RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "rule-0-match-0".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Minute as i32,
                    requests_per_unit: limit,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let long = "envoy-gateway-system/eg-with-a-long-gateway-name/listeners/listenerset-number";
    vec![
        rule(DOMAIN, limit),
        rule(&format!("{long}-one/https"), 5),
        rule(&format!("{long}-two/https"), 5),
    ]
}

/// A redis-server on a TLS port that asks clients for a certificate `ca` signed.
fn tls_redis(files: &Folder, ca: &Ca) -> TlsRedis {
    let server = ca.server();
    TlsRedis::start(
        &files.write("redis.crt", &server.cert),
        &files.write("redis.key", &server.key),
        &files.write("redis-ca.crt", &ca.pem),
        true,
    )
}

/// The rate limit Deployment's process, stopped when dropped.
struct Deployment {
    child: Child,
    http: u16,
    grpc: u16,
    metrics: u16,
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary with Envoy Gateway's environment (and `extra`, a user's
/// `rateLimitDeployment.container.env`), its certificates in `certs`.
fn deploy(certs: &Folder, xds: u16, redis: &TlsRedis, extra: &[(&str, &str)]) -> Deployment {
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let data = Folder::new("eg-data");
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let xds_url = format!("127.0.0.1:{xds}");
    let (http_port, grpc_port) = (http.to_string(), grpc.to_string());
    let prometheus = format!(":{metrics}");
    let path = |name: &str| certs.0.join(name).to_str().unwrap().to_owned();
    let child = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs([
            ("RUNTIME_ROOT", data.0.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &path("tls.crt")),
            ("GRPC_SERVER_TLS_KEY", &path("tls.key")),
            ("GRPC_SERVER_TLS_CA_CERT", &path("ca.crt")),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &path("tls.crt")),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &path("tls.key")),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &path("ca.crt")),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &path("redis-client.crt")),
            ("REDIS_TLS_CLIENT_KEY", &path("redis-client.key")),
            // Envoy Gateway sets no CA for Redis (a public CA's certificate is trusted by
            // the system's store); the test's Redis has a private one.
            ("REDIS_TLS_CACERT", &path("redis-ca.crt")),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &prometheus),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d9c5-x2lq"),
            ("TRACING_SAMPLING_RATE", "0.0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("PORT", &http_port),
            ("GRPC_PORT", &grpc_port),
            (
                "SPILLWAY_LEPTOS_TOML",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Leptos.toml"),
            ),
        ])
        .envs(extra.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::mem::forget(data);
    Deployment {
        child,
        http,
        grpc,
        metrics,
    }
}

/// A real Envoy whose rate limit filter asks `deployment`'s gRPC port over TLS for domain
/// [`DOMAIN`], with the route's descriptor and the `x-user-id` header, as Envoy Gateway
/// configures its proxies.
struct Proxy {
    child: Child,
    port: u16,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn proxy(certs: &Folder, deployment: &Deployment) -> Proxy {
    let backend = backend().await;
    let port = free_port();
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
          stat_prefix: http
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: {{descriptor_key: "{ROUTE}", descriptor_value: "{ROUTE}"}}
                    - request_headers: {{header_name: x-user-id, descriptor_key: rule-0-match-0}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {DOMAIN}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: ratelimit_cluster}}}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {bport}}}}}}}}}]}}]
  - name: ratelimit_cluster
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates: [{{certificate_chain: {{filename: {cert}}}, private_key: {{filename: {key}}}}}]
          validation_context: {{trusted_ca: {{filename: {ca}}}}}
    load_assignment:
      cluster_name: ratelimit_cluster
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {gport}}}}}}}}}]}}]
"#,
        bport = backend.port(),
        gport = deployment.grpc,
        cert = certs.0.join("tls.crt").display(),
        key = certs.0.join("tls.key").display(),
        ca = certs.0.join("ca.crt").display(),
    );
    let file = certs.write(&format!("envoy-{port}.yaml"), &config);
    let child = Command::new(crate::gateway::envoy_binary())
        .args([
            "-c",
            &file,
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "-l",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let proxy = Proxy { child, port };
    let _listening = eventually(
        "Envoy accepting connections",
        Duration::from_secs(30),
        async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| e.to_string())
        },
        Result::is_ok,
    )
    .await;
    proxy
}

/// The status of a GET through `proxy` as user `user`.
async fn get(http: &reqwest::Client, proxy: &Proxy, user: &str) -> StatusCode {
    http.get(format!("http://127.0.0.1:{}/", proxy.port))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
        .status()
}

/// The value of the series `name{labels}` on the metrics port (0 when absent).
async fn series(http: &reqwest::Client, deployment: &Deployment, name: &str, labels: &str) -> f64 {
    let text = http
        .get(format!("http://127.0.0.1:{}/metrics", deployment.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| labels.split(',').all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn envoy_gateways_rate_limit_deployment_runs_with_only_the_image_swapped() {
    spillway::install_tls_provider();
    let ca = Ca::new("envoy-gateway CA");
    let certs = Folder::new("envoy-gateway-certs");
    // One certificate for the gRPC port and the xDS client, as Envoy Gateway's Secret holds.
    let pki = Pki {
        server: ca.server_and_client(),
        ca,
    };
    certs.write("tls.crt", &pki.server.cert);
    certs.write("tls.key", &pki.server.key);
    certs.write("ca.crt", &pki.ca.pem);
    let redis_ca = Ca::new("redis CA");
    let redis = tls_redis(&certs, &redis_ca);
    let client = redis_ca.client("envoy-ratelimit");
    certs.write("redis-client.crt", &client.cert);
    certs.write("redis-client.key", &client.key);
    let xds_port = free_port();
    let xds = Running::start(
        ([127, 0, 0, 1], xds_port).into(),
        &pki,
        ("1".into(), snapshot(2)),
    )
    .await;
    let deployment = deploy(&certs, xds_port, &redis, &[("CACHE_KEY_PREFIX", "eg:rl:")]);
    let http = reqwest::Client::new();
    // Envoy Gateway's probes: GET /healthcheck on the HTTP port.
    let health = eventually(
        "/healthcheck answering 200",
        PATIENCE,
        async || match http
            .get(format!("http://127.0.0.1:{}/healthcheck", deployment.http))
            .send()
            .await
        {
            Ok(r) => Some(r.status().as_u16()),
            Err(_) => None,
        },
        |status| *status == Some(200),
    )
    .await;
    assert_eq!(health, Some(200));
    let envoy = proxy(&certs, &deployment).await;
    // The route's limit, once the xDS set is in force: 2 a minute for each user. Each try
    // is a user of its own, its three requests clear of a minute's turn.
    let tries = std::sync::atomic::AtomicU32::new(0);
    let first = eventually(
        "the xDS domain limiting through Envoy",
        PATIENCE,
        async || {
            let user = format!(
                "alice-{}",
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            clear_of_window_turn(Duration::from_secs(60)).await;
            let mut codes = Vec::new();
            for _ in 0..3 {
                codes.push(get(&http, &envoy, &user).await);
            }
            codes
        },
        |codes| {
            codes[..]
                == [
                    StatusCode::OK,
                    StatusCode::OK,
                    StatusCode::TOO_MANY_REQUESTS,
                ]
        },
    )
    .await;
    assert_eq!(first.len(), 3);
    assert_eq!(get(&http, &envoy, "bob").await, StatusCode::OK);

    // Where and as Envoy Gateway scrapes: upstream's series on the Prometheus port, labelled
    // as its statsd mapper labels them, beside Spillway's own.
    let labels = format!("domain=\"{DOMAIN}\",key1=\"{ROUTE}_{ROUTE}\",key2=\"rule-0-match-0\"");
    let over = series(
        &http,
        &deployment,
        "ratelimit_service_rate_limit_over_limit",
        &labels,
    )
    .await;
    let within = series(
        &http,
        &deployment,
        "ratelimit_service_rate_limit_within_limit",
        &labels,
    )
    .await;
    let total = series(
        &http,
        &deployment,
        "ratelimit_service_rate_limit_total_hits",
        &labels,
    )
    .await;
    assert!(over >= 1.0 && within >= 2.0, "over {over}, within {within}");
    assert_eq!(total, over + within);
    assert!(
        series(
            &http,
            &deployment,
            "spillway_checks_total",
            "policy=\"default-eg-http\""
        )
        .await
            >= 4.0
    );

    // The two long domains are two policies (cut at 64 characters, they were one name and
    // the whole set was refused), and the redis keys carry the user's prefix.
    let mut grpc = crate::envoy::client_over_tls(deployment.grpc, &pki.ca.pem).await;
    let long = "envoy-gateway-system/eg-with-a-long-gateway-name/listeners/listenerset-number";
    clear_of_window_turn(Duration::from_secs(60)).await;
    for domain in [format!("{long}-one/https"), format!("{long}-two/https")] {
        let mut answers = Vec::new();
        for _ in 0..6 {
            let answer = grpc
                .should_rate_limit(request(
                    &domain,
                    vec![descriptor(&[(ROUTE, ROUTE), ("rule-0-match-0", "carol")])],
                ))
                .await
                .unwrap()
                .into_inner();
            answers.push(answer.overall_code);
        }
        assert_eq!(answers, [OK, OK, OK, OK, OK, OVER], "{domain}");
    }
    let keys = redis_keys(&certs, &redis);
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("eg:rl:spw:")), "{keys:?}");

    // Upstream's SHADOW_MODE on a second instance: over its limit, the request is OK, each
    // descriptor still says OVER_LIMIT.
    let shadow = deploy(
        &certs,
        xds_port,
        &redis,
        &[("CACHE_KEY_PREFIX", "eg:rl:"), ("SHADOW_MODE", "true")],
    );
    let mut shadowed = crate::envoy::client_over_tls(shadow.grpc, &pki.ca.pem).await;
    let ask = async |client: &mut RateLimitServiceClient<Channel>, user: &str| {
        client
            .should_rate_limit(request(
                DOMAIN,
                vec![descriptor(&[(ROUTE, ROUTE), ("rule-0-match-0", user)])],
            ))
            .await
            .map(|r| r.into_inner())
            .ok()
    };
    let _loaded = eventually(
        "the shadow instance holding the xDS set",
        PATIENCE,
        async || ask(&mut shadowed, "probe").await,
        |answer| {
            answer
                .as_ref()
                .is_some_and(|a| !a.statuses.is_empty() && a.statuses[0].current_limit.is_some())
        },
    )
    .await;
    // dave spends his 2 on the first instance; the shadow instance, in the same minute,
    // finds him over.
    clear_of_window_turn(Duration::from_secs(60)).await;
    for _ in 0..2 {
        assert_eq!(ask(&mut grpc, "dave").await.unwrap().overall_code, OK);
    }
    let answer = ask(&mut shadowed, "dave").await.unwrap();
    assert_eq!(
        (answer.overall_code, answer.statuses[0].code),
        (OK, OVER),
        "{answer:?}"
    );
    xds.stop().await;
}

/// Every key in the TLS Redis, read with the client certificate.
fn redis_keys(certs: &Folder, redis: &TlsRedis) -> Vec<String> {
    let out = Command::new("redis-cli")
        .args(["--tls", "-p", &redis.port.to_string()])
        .args(["--cacert", certs.0.join("redis-ca.crt").to_str().unwrap()])
        .args(["--cert", certs.0.join("redis-client.crt").to_str().unwrap()])
        .args(["--key", certs.0.join("redis-client.key").to_str().unwrap()])
        .args(["--scan"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}
