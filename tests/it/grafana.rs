//! The Grafana dashboard (deploy/grafana/spillway.json) and the Helm chart's alerts
//! (deploy/helm/spillway/templates/prometheusrule.yaml) read what /metrics serves: after some
//! traffic, a Redis stall and an Envoy request, every series each panel and alert queries
//! exists with the label values it filters on, and every series /metrics serves has its
//! `# HELP`.

use serde_json::{Value, json};

use crate::helpers::{RedisServer, spawn_app_with};

/// `(name, [(label, value)])` of every selector in a PromQL expression, with the equality
/// matchers it filters on (`job=~"$job"` and other regex matchers left out).
fn selectors(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    let next = |s: &str| {
        ["spillway_", "process_"]
            .iter()
            .filter_map(|p| s.find(p))
            .min()
    };
    while let Some(start) = next(rest) {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_owned();
        let mut matchers = Vec::new();
        if tail[end..].starts_with('{') {
            let close = tail[end..].find('}').unwrap() + end;
            for m in tail[end + 1..close].split(',') {
                if let Some((k, v)) = m.split_once("=\"")
                    && !k.ends_with('=')
                    && !k.ends_with('!')
                    && !k.ends_with('~')
                {
                    matchers.push((k.trim().to_owned(), v.trim_end_matches('"').to_owned()));
                }
            }
        }
        out.push((name, matchers));
        rest = &tail[end..];
    }
    out
}

#[tokio::test]
async fn every_series_the_grafana_dashboard_queries_is_served_with_its_help() {
    let redis = RedisServer::start();
    // A Redis timeout short enough for a stall to pass it (the tests' default is 2 s).
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_METRICS_RULE_LABEL", "true"),
            ("SPILLWAY_REDIS_TIMEOUT_MS", "250"),
        ],
    )
    .await;
    let hourly = |limit: u64| json!({"name": "hourly", "algorithm": "fixed_window", "limit": limit, "window_ms": 3600000});
    app.put_policy("gf-enforce", json!({"rules": [hourly(5)]}))
        .await;
    app.put_policy("gf-shadow", json!({"mode": "shadow", "rules": [hourly(1)]}))
        .await;
    app.put_policy(
        "gf-lenient",
        json!({"strict": false, "rules": [{"name": "hourly", "algorithm": "fixed_window", "limit": 5, "window_ms": 3600000, "dimensions": ["user"]}]}),
    )
    .await;
    // Allowed, near the limit (the 5th of 5), denied, then denied from the over-limit cache;
    // shadow denials; an unmatched check.
    for _ in 0..8 {
        app.check(json!({"policy": "gf-enforce", "identifiers": {"user": "ada"}}))
            .await;
    }
    for _ in 0..3 {
        app.check(json!({"policy": "gf-shadow", "identifiers": {"user": "ada"}}))
            .await;
    }
    app.check(json!({"policy": "gf-lenient", "identifiers": {"ip": "10.0.0.7"}}))
        .await;
    crate::envoy::load(
        &app,
        "gf-edge",
        "domain: gf-edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .await;
    let mut grpc = crate::envoy::client(&app).await;
    let message = crate::envoy::request(
        "gf-edge",
        vec![crate::envoy::descriptor(&[("client", "c1")])],
    );
    crate::envoy::ask(&mut grpc, message).await;
    // Then Redis stalls past the check's timeout: answered by the failure mode (degraded).
    redis.pause(1_000);
    let stalled = app
        .check(json!({"policy": "gf-enforce", "identifiers": {"user": "bo"}}))
        .await;
    assert_eq!(stalled.status(), 200);
    // A readiness probe, as Kubernetes sends every few seconds, sets spillway_redis_up.
    app.client.get(app.url("/readyz")).send().await.unwrap();
    let metrics = app.metrics().await;

    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/spillway.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (name, matchers) in selectors(expr) {
                queried += 1;
                let found = metrics.lines().any(|line| {
                    !line.starts_with('#')
                        && line.starts_with(&name)
                        && matches!(line.as_bytes().get(name.len()), Some(b'{' | b' '))
                        && matchers
                            .iter()
                            .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
                });
                assert!(
                    found,
                    "panel {:?} queries {name}{matchers:?}, not in /metrics:\n{metrics}",
                    panel["title"]
                );
            }
        }
    }
    assert!(queried >= 15, "{queried}");
    let rules = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/helm/spillway/templates/prometheusrule.yaml"),
    )
    .unwrap();
    let alerted = selectors(&rules);
    assert!(alerted.len() >= 8, "{alerted:?}");
    for (name, matchers) in alerted {
        let found = metrics.lines().any(|line| {
            !line.starts_with('#')
                && line.starts_with(&name)
                && matchers
                    .iter()
                    .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        });
        assert!(
            found,
            "an alert queries {name}{matchers:?}, not in /metrics:\n{metrics}"
        );
    }
    // Every series has its HELP (a histogram's under its own name).
    for line in metrics.lines().filter(|l| l.starts_with("spillway_")) {
        let series = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| series.strip_suffix(s))
            .filter(|f| metrics.contains(&format!("# TYPE {f} histogram")))
            .unwrap_or(series);
        assert!(
            metrics.contains(&format!("# HELP {family} ")),
            "{family} has no HELP:\n{metrics}"
        );
    }
}

/// The per-rule label is the operator's choice, spelled as a flag; anything else stops the
/// start naming the setting.
#[test]
fn the_rule_label_setting_is_a_flag_named_when_wrong() {
    use spillway::config::Config;
    let with = |value: &'static str| {
        Config::from_lookup(move |name| {
            (name == "SPILLWAY_METRICS_RULE_LABEL").then(|| value.to_owned())
        })
    };
    assert!(with("true").unwrap().metrics_rule_label);
    assert!(!with("false").unwrap().metrics_rule_label);
    let error = with("per-rule").err().unwrap().to_string();
    assert!(error.contains("SPILLWAY_METRICS_RULE_LABEL"), "{error}");
}
