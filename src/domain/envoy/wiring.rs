//! What to add to Envoy's configuration so it asks Spillway about a domain: the filter, the
//! route's `rate_limits` (one entry per descriptor path of the domain's tree, so siblings are
//! separate descriptors and nested keys are chained) and the cluster.

use super::{DescriptorDoc, DomainDoc};

/// One `rate_limits` entry: the keys of one descriptor path, root first, as
/// (key, the value the file gives it when the action needs it), and the paths it stands for.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    keys: Vec<(String, Option<String>)>,
    shown: Vec<String>,
}

/// Envoy's action that puts `key` into a descriptor, YAML flow style.
fn action(key: &str, value: Option<&str>) -> String {
    let quoted = |v: &str| format!("{v:?}");
    match key {
        "remote_address" => "remote_address: {}".to_owned(),
        "destination_cluster" => "destination_cluster: {}".to_owned(),
        "source_cluster" => "source_cluster: {}".to_owned(),
        "masked_remote_address" => "masked_remote_address: {v4_prefix_mask_len: 24}".to_owned(),
        "generic_key" => format!(
            "generic_key: {{descriptor_value: {}}}",
            quoted(value.unwrap_or("..."))
        ),
        "header_match" => format!(
            "header_value_match: {{descriptor_value: {}, headers: [{{name: \":path\", string_match: {{prefix: \"/\"}}}}]}}  # adjust: when this entry applies",
            quoted(value.unwrap_or("..."))
        ),
        k if is_path(k, value) => {
            format!(
                "request_headers: {{header_name: \":path\", descriptor_key: {}}}",
                quoted(k)
            )
        }
        k => format!(
            "request_headers: {{header_name: {}, descriptor_key: {}}}",
            quoted(&format!("x-{}", k.to_ascii_lowercase())),
            quoted(k)
        ),
    }
}

/// A key whose values are request paths: named so, or given a value that starts with `/`.
fn is_path(key: &str, value: Option<&str>) -> bool {
    let lower = key.to_ascii_lowercase();
    matches!(lower.as_str(), "path" | ":path" | "request_path" | "uri")
        || value.is_some_and(|v| v.starts_with('/'))
}

/// Which part of a descriptor's value the action needs: `generic_key` and `header_match` send
/// the file's own value, so each value is an entry of its own; every other action sends what
/// the request carries.
fn needs_value(key: &str) -> bool {
    matches!(key, "generic_key" | "header_match")
}

/// Every descriptor path of `descriptors` (below `above`) that has a `rate_limit`, merged
/// where the actions are the same, in the file's order.
fn entries(
    descriptors: &[DescriptorDoc],
    above: &[(String, Option<String>)],
    out: &mut Vec<Entry>,
) {
    for d in descriptors {
        let mut keys = above.to_vec();
        let value = needs_value(&d.key).then(|| d.value.clone()).flatten();
        // A path key keeps its value's shape (it decides the action), not the value itself.
        let value = value.or_else(|| {
            d.value
                .as_deref()
                .filter(|v| v.starts_with('/'))
                .map(|_| "/".to_owned())
        });
        keys.push((d.key.clone(), value));
        if d.rate_limit.is_some() {
            let shown = keys_shown(above, d);
            match out.iter_mut().find(|e| e.keys == keys) {
                Some(e) => e.shown.push(shown),
                None => out.push(Entry {
                    keys: keys.clone(),
                    shown: vec![shown],
                }),
            }
        }
        entries(&d.descriptors, &keys, out);
    }
}

/// `user › PATH=/login`: the path as the file writes it.
fn keys_shown(above: &[(String, Option<String>)], d: &DescriptorDoc) -> String {
    let mut parts: Vec<String> = above.iter().map(|(k, _)| k.clone()).collect();
    parts.push(match &d.value {
        Some(v) => format!("{}={v}", d.key),
        None => d.key.clone(),
    });
    parts.join(" › ")
}

/// The route's `rate_limits` for `doc`: one entry per descriptor path with a limit.
fn route(doc: &DomainDoc) -> String {
    let mut found = Vec::new();
    entries(&doc.descriptors, &[], &mut found);
    if found.is_empty() {
        return "# This domain has no limit yet: nothing to send.\nrate_limits: []\n".to_owned();
    }
    let mut out = String::from(
        "# One entry per descriptor path: each entry is one descriptor Envoy sends, and a\n# descriptor counts only where its keys, in order, meet a limit of the file.\nrate_limits:\n",
    );
    for e in found {
        out.push_str(&format!("  # {}\n  - actions:\n", e.shown.join(", ")));
        for (key, value) in &e.keys {
            out.push_str(&format!("      - {}\n", action(key, value.as_deref())));
        }
    }
    out
}

/// What to add to Envoy's configuration so it asks Spillway about `doc`'s domain, as
/// (where it goes, YAML): the rate limit filter, the route's `rate_limits` (one entry per
/// descriptor path with a limit: siblings apart, nested keys chained, `:path` for paths), and
/// the cluster for a gRPC port `grpc_port` (`None`: Envoy's protocol is off on this server).
/// Each part is a YAML document of its own.
pub fn wiring(
    doc: &DomainDoc,
    grpc_port: Option<u16>,
    key_required: bool,
) -> Vec<(String, String)> {
    let key = if key_required {
        "\n        initial_metadata:\n          - {key: authorization, value: \"Bearer spw_svc_...\"}  # a service key"
    } else {
        ""
    };
    let filter = format!(
        "- name: envoy.filters.http.ratelimit\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n    domain: {:?}\n    failure_mode_deny: false\n    timeout: 0.1s  # the filter's own default is 20 ms\n    rate_limit_service:\n      transport_api_version: V3\n      grpc_service:\n        envoy_grpc: {{cluster_name: spillway}}{key}\n    # To count what the response reports (tokens, bytes), move that entry of the route's\n    # rate_limits here, where Envoy applies these two:\n    # rate_limits:\n    #   - actions: [...]\n    #     apply_on_stream_done: true\n    #     hits_addend: {{format: \"%RESP(x-tokens)%\"}}\n",
        doc.domain,
    );
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
            route(doc),
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

    fn doc(yaml: &str) -> DomainDoc {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn actions(route: &serde_yaml::Value, i: usize) -> Vec<String> {
        route["rate_limits"][i]["actions"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| {
                let text = serde_yaml::to_string(a).unwrap();
                text.split_whitespace().collect::<Vec<_>>().join(" ")
            })
            .collect()
    }

    #[test]
    fn each_part_of_the_wiring_is_yaml_envoy_reads() {
        let d = doc(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        );
        let parts = wiring(&d, Some(9091), true);
        let filter: serde_yaml::Value = serde_yaml::from_str(&parts[0].1).unwrap();
        assert_eq!(filter[0]["typed_config"]["domain"], "edge");
        assert_eq!(
            filter[0]["typed_config"]["rate_limit_service"]["grpc_service"]["initial_metadata"][0]
                ["key"],
            "authorization"
        );
        let cluster: serde_yaml::Value = serde_yaml::from_str(&parts[2].1).unwrap();
        assert_eq!(
            cluster[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["port_value"],
            9091
        );
        let without_key = wiring(&d, None, false);
        assert!(!without_key[0].1.contains("initial_metadata"));
        assert!(without_key[2].1.contains("SPILLWAY_GRPC_ADDR"));
    }

    #[test]
    fn siblings_are_entries_apart_and_nested_keys_are_chained() {
        let d = doc(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: PATH\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: PATH\n    value: /signup\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: user\n    descriptors:\n      - key: plan\n        value: free\n        rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: generic_key\n    value: everyone\n    rate_limit: {unit: second, requests_per_unit: 1000}\n",
        );
        let route: serde_yaml::Value = serde_yaml::from_str(&wiring(&d, None, false)[1].1).unwrap();
        assert_eq!(route["rate_limits"].as_sequence().unwrap().len(), 4);
        assert_eq!(actions(&route, 0), ["remote_address: {}"]);
        // Two values of one path key: one entry, `:path` for its header.
        assert_eq!(
            actions(&route, 1),
            ["request_headers: header_name: :path descriptor_key: PATH"]
        );
        // A nested key follows its parent in one entry; the parent alone has no limit.
        assert_eq!(
            actions(&route, 2),
            [
                "request_headers: header_name: x-user descriptor_key: user",
                "request_headers: header_name: x-plan descriptor_key: plan"
            ]
        );
        assert_eq!(
            actions(&route, 3),
            ["generic_key: descriptor_value: everyone"]
        );
        let empty = wiring(&doc("domain: edge\n"), None, false);
        let route: serde_yaml::Value = serde_yaml::from_str(&empty[1].1).unwrap();
        assert!(route["rate_limits"].as_sequence().unwrap().is_empty());
    }
}
