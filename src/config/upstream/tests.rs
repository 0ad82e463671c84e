//! The unit tests of `src/config/upstream.rs`.

use super::*;

fn read(pairs: &[(&str, &str)]) -> Result<Option<Upstream>, Problem> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Upstream::read(&|name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

#[test]
fn spillways_own_environment_is_not_upstreams() {
    assert!(
        read(&[("REDIS_URL", "redis://x:6379"), ("PORT", "9000")])
            .unwrap()
            .is_none()
    );
    assert!(
        read(&[("SPILLWAY_UPSTREAM_ENV", "false"), ("USE_STATSD", "false")])
            .unwrap()
            .is_none()
    );
    // Kubernetes's service links are not upstream's environment.
    assert!(
        read(&[("GRPC_PORT", "tcp://10.0.0.1:8081")])
            .unwrap()
            .is_none()
    );
}

#[test]
fn envoy_gateways_environment_reads_as_spillways() {
    let u = read(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.infra:6379"),
        ("REDIS_AUTH", "app:p@ss"),
        ("REDIS_TLS", "true"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(u.get("LEPTOS_SITE_ADDR").unwrap(), "0.0.0.0:8080");
    assert_eq!(u.get("SPILLWAY_GRPC_ADDR").unwrap(), "0.0.0.0:8081");
    assert_eq!(
        u.get("REDIS_URL").unwrap(),
        "rediss://app:p%40ss@redis.infra:6379"
    );
    assert_eq!(
        u.get("SPILLWAY_GRPC_TLS_CERT_FILE").unwrap(),
        "/certs/tls.crt"
    );
    assert_eq!(u.get("SPILLWAY_GRPC_TLS_CLIENT_CA_FILE"), None);
    assert_eq!(u.get("SPILLWAY_GRPC_AUTH").unwrap(), "none");
    assert_eq!(u.get("SPILLWAY_ENVOY_HEADERS").unwrap(), "none");
    assert_eq!(u.get("SPILLWAY_LOG_LEVEL").unwrap(), "info");
    assert_eq!(
        u.get("SPILLWAY_DOMAINS_DIR").unwrap(),
        "/data/ratelimit/config"
    );
    assert!(
        u.ignored
            .iter()
            .any(|l| l.starts_with("GRPC_SERVER_TLS_CA_CERT=")),
        "{:?}",
        u.ignored
    );
}

#[test]
fn what_would_change_a_decision_is_refused_by_name() {
    let refused = |pairs: &[(&str, &str)]| match read(pairs) {
        Err((name, _)) => name,
        Ok(_) => panic!("{pairs:?} was taken"),
    };
    assert_eq!(
        refused(&[("USE_STATSD", "false"), ("BACKEND_TYPE", "memcache")]),
        "BACKEND_TYPE"
    );
    assert_eq!(
        refused(&[("USE_STATSD", "false"), ("REDIS_PERSECOND", "true")]),
        "REDIS_PERSECOND"
    );
    assert_eq!(
        refused(&[
            ("USE_STATSD", "false"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc")
        ]),
        "TRACING_EXPORTER_PROTOCOL"
    );
    assert_eq!(
        refused(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "19001")
        ]),
        "PROMETHEUS_ADDR"
    );
    assert_eq!(refused(&[("CONFIG_TYPE", "XDS")]), "CONFIG_TYPE");
    assert_eq!(
        refused(&[("USE_STATSD", "false"), ("REDIS_SOCKET_TYPE", "unix")]),
        "REDIS_SOCKET_TYPE"
    );
    assert_eq!(
        refused(&[("GRPC_SERVER_USE_TLS", "true")]),
        "GRPC_SERVER_TLS_CERT"
    );
    assert_eq!(
        refused(&[("USE_STATSD", "false"), ("GRPC_PORT", "x")]),
        "GRPC_PORT"
    );
    // Upstream's defaults are accepted.
    assert!(
        read(&[
            ("USE_STATSD", "false"),
            ("SHADOW_MODE", "false"),
            ("CACHE_KEY_PREFIX", "")
        ])
        .is_ok()
    );
}

#[test]
fn envoy_gateways_xds_settings() {
    let u = read(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        u.get("SPILLWAY_XDS_SERVER").unwrap(),
        "https://envoy-gateway:18001"
    );
    assert_eq!(u.get("SPILLWAY_XDS_NODE_ID").unwrap(), "envoy-ratelimit");
    assert_eq!(u.get("SPILLWAY_XDS_TLS_CA_FILE").unwrap(), "/certs/ca.crt");
    assert_eq!(u.get("SPILLWAY_DOMAINS_DIR"), None);
}

#[test]
fn a_cluster_reads_as_a_whole_configuration() {
    let config = crate::config::Config::from_lookup(|name| match name {
        "USE_STATSD" => Some("false".into()),
        "REDIS_TYPE" => Some("cluster".into()),
        "REDIS_URL" => Some("a:7000,b:7001".into()),
        "HOST" => Some("localhost".into()),
        _ => None,
    })
    .map_err(|e| e.to_string())
    .unwrap();
    assert_eq!(
        config.redis_cluster_urls,
        ["redis://a:7000", "redis://b:7001"]
    );
    assert_eq!(
        config.leptos_options.site_addr.to_string(),
        "127.0.0.1:8080"
    );
}

#[test]
fn a_cluster_and_a_password_alone() {
    let u = read(&[
        ("USE_STATSD", "false"),
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_URL", "a:7000,b:7001"),
        ("REDIS_AUTH", "secret"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        u.get("REDIS_CLUSTER_URLS").unwrap(),
        "redis://:secret@a:7000,redis://:secret@b:7001"
    );
}

#[test]
fn sentinel_as_upstream_writes_it() {
    let u = read(&[
        ("USE_STATSD", "false"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ("REDIS_AUTH", "secret"),
        ("REDIS_SENTINEL_AUTH", "spw"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        u.get("REDIS_URL").unwrap(),
        "redis+sentinel://:secret@s1:26379,s2:26379/mymaster"
    );
    assert_eq!(u.get("REDIS_SENTINEL_PASSWORD").unwrap(), "spw");
    let only_master = read(&[
        ("USE_STATSD", "false"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster"),
    ]);
    assert_eq!(only_master.map(|_| ()).unwrap_err().0, "REDIS_URL");
}

#[test]
fn envoy_gateways_metrics_tracing_and_redis_certificates_are_honoured() {
    let u = read(&[
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.infra:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d9f-x2"),
        ("TRACING_SAMPLING_RATE", "0.5"),
        ("SHADOW_MODE", "true"),
        ("CACHE_KEY_PREFIX", "eg:rl:"),
    ])
    .unwrap()
    .unwrap();
    let pairs = [
        ("SPILLWAY_METRICS_ADDR", "0.0.0.0:19001"),
        ("SPILLWAY_METRICS_UPSTREAM_NAMES", "true"),
        ("REDIS_URL", "rediss://redis.infra:6380"),
        ("REDIS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_CLIENT_KEY", "/redis-certs/tls.key"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_SERVICE_NAME", "envoy-ratelimit"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.namespace=envoy-gateway-system,service.instance.id=envoy-ratelimit-5d9f-x2",
        ),
        ("SPILLWAY_ENVOY_SHADOW_MODE", "true"),
        ("SPILLWAY_KEY_PREFIX", "eg:rl:"),
    ];
    for (name, value) in pairs {
        assert_eq!(u.get(name).as_deref(), Some(value), "{name}");
    }
    // Tracing said off is off, whatever OTEL_* say; unset, Spillway's own decide.
    let off = read(&[("USE_STATSD", "false"), ("TRACING_ENABLED", "false")])
        .unwrap()
        .unwrap();
    assert_eq!(off.get("OTEL_SDK_DISABLED").as_deref(), Some("true"));
    let unset = read(&[("USE_STATSD", "false")]).unwrap().unwrap();
    assert_eq!(unset.get("OTEL_SDK_DISABLED"), None);
    assert_eq!(unset.get("SPILLWAY_METRICS_ADDR"), None);
}

#[test]
fn redis_client_certificates_go_only_where_they_are_shown() {
    let read = |redis_url: &str, redis_type: &str| {
        crate::config::Config::from_lookup(|name| match name {
            "USE_STATSD" => Some("false".into()),
            "REDIS_URL" => Some(redis_url.into()),
            "REDIS_TYPE" => Some(redis_type.into()),
            "REDIS_TLS" => Some("true".into()),
            "REDIS_TLS_CLIENT_CERT" => Some("/redis-certs/tls.crt".into()),
            "REDIS_TLS_CLIENT_KEY" => Some("/redis-certs/tls.key".into()),
            _ => None,
        })
        .map(|c| c.redis_client_cert.is_some())
        .map_err(|e| e.to_string())
    };
    assert_eq!(read("redis.infra:6380", "single"), Ok(true));
    let cluster = read("a:7000,b:7001", "cluster").unwrap_err();
    assert!(
        cluster.contains("REDIS_CLIENT_CERT") && cluster.contains("Cluster"),
        "{cluster}"
    );
    // Spillway's own variables: a certificate over plain TCP would never be shown.
    let plain = crate::config::Config::from_lookup(|name| match name {
        "REDIS_URL" => Some("redis://redis:6379".into()),
        "REDIS_CLIENT_CERT" => Some("/c.crt".into()),
        "REDIS_CLIENT_KEY" => Some("/c.key".into()),
        _ => None,
    })
    .map(|_| ())
    .map_err(|e| e.to_string())
    .unwrap_err();
    assert!(plain.contains("over TLS only"), "{plain}");
}
