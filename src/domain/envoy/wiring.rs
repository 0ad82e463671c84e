//! What to add to Envoy's configuration so it asks Spillway about a domain.

use super::DomainDoc;

/// What to add to Envoy's configuration so it asks Spillway about `doc`'s domain, as
/// (where it goes, YAML): the rate limit filter, a route's `rate_limits` with one action per
/// top-level descriptor key, and the cluster for a gRPC port `grpc_port` (`None`: Envoy's
/// protocol is off on this server). Each part is a YAML document of its own.
pub fn wiring(
    doc: &DomainDoc,
    grpc_port: Option<u16>,
    key_required: bool,
) -> Vec<(String, String)> {
    let key = if key_required {
        "\n      initial_metadata:\n        - {key: authorization, value: \"Bearer spw_svc_...\"}  # a service key"
    } else {
        ""
    };
    let mut keys: Vec<&str> = Vec::new();
    for d in &doc.descriptors {
        if !keys.contains(&d.key.as_str()) {
            keys.push(&d.key);
        }
    }
    let actions: String = keys
        .iter()
        .map(|k| match *k {
            "remote_address" => "      - remote_address: {}\n".to_owned(),
            k => format!("      - request_headers: {{header_name: x-{k}, descriptor_key: {k}}}\n"),
        })
        .collect();
    let filter = format!(
        "- name: envoy.filters.http.ratelimit\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n    domain: {:?}\n    failure_mode_deny: false\n    timeout: 0.1s  # the filter's own default is 20 ms\n    rate_limit_service:\n      transport_api_version: V3\n      grpc_service:\n        envoy_grpc: {{cluster_name: spillway}}{}\n",
        doc.domain,
        key.replace("\n      ", "\n        ")
    );
    let route = format!("rate_limits:\n  - actions:\n{actions}");
    let port = grpc_port.unwrap_or(8081);
    let off = if grpc_port.is_none() {
        "# Envoy's protocol is off on this server: set SPILLWAY_GRPC_ADDR\n"
    } else {
        ""
    };
    let cluster = format!(
        "{off}- name: spillway\n  type: STRICT_DNS\n  typed_extension_protocol_options:\n    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n      \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n      explicit_http_config: {{http2_protocol_options: {{}}}}\n  load_assignment:\n    cluster_name: spillway\n    endpoints:\n      - lb_endpoints:\n          - endpoint: {{address: {{socket_address: {{address: spillway, port_value: {port}}}}}}}\n"
    );
    vec![
        (
            "The HTTP connection manager's http_filters, before the router".to_owned(),
            filter,
        ),
        (
            "The route or virtual host: what each request is counted by".to_owned(),
            route,
        ),
        (
            "The clusters: Spillway's gRPC port (HTTP/2)".to_owned(),
            cluster,
        ),
    ]
}

#[cfg(test)]
mod wiring_tests {
    use super::*;

    #[test]
    fn each_part_of_the_wiring_is_yaml_envoy_reads() {
        let doc: DomainDoc = serde_yaml::from_str(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        )
        .unwrap();
        let parts = wiring(&doc, Some(9091), true);
        let filter: serde_yaml::Value = serde_yaml::from_str(&parts[0].1).unwrap();
        assert_eq!(filter[0]["typed_config"]["domain"], "edge");
        assert_eq!(
            filter[0]["typed_config"]["rate_limit_service"]["grpc_service"]["initial_metadata"][0]
                ["key"],
            "authorization"
        );
        let route: serde_yaml::Value = serde_yaml::from_str(&parts[1].1).unwrap();
        let actions = &route["rate_limits"][0]["actions"];
        assert!(actions[0]["remote_address"].is_mapping());
        assert_eq!(actions[1]["request_headers"]["descriptor_key"], "user");
        let cluster: serde_yaml::Value = serde_yaml::from_str(&parts[2].1).unwrap();
        assert_eq!(
            cluster[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["port_value"],
            9091
        );
        let without_key = wiring(&doc, None, false);
        assert!(!without_key[0].1.contains("initial_metadata"));
        assert!(without_key[2].1.contains("SPILLWAY_GRPC_ADDR"));
    }
}
