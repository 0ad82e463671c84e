//! The domain page's "Wire Envoy to this domain" through a real Envoy: for each example
//! domain (siblings at the top, a nested key, a generic key), the snippets the server gives
//! (`GET /api/v1/envoy/domains/{domain}/wiring`, the same the page shows) go into Envoy's
//! configuration as they are, and every limit of the file trips.

use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    envoy::load,
    gateway::{Envoy, backend},
    helpers::{ADMIN_KEY, RedisServer, SERVICE_KEY, TestApp, spawn_app},
};

/// The wiring the server gives for domain `gw`: (filter, route), as the page shows them,
/// with the service key filled in and a filter timeout a busy test machine keeps to (the
/// snippet's 0.1 s would let a slow answer through, as `failure_mode_deny: false` says).
async fn snippets(app: &TestApp) -> (String, String) {
    let parts: Value = app
        .client
        .get(app.url("/api/v1/envoy/domains/gw/wiring"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let yaml = |i: usize| parts[i]["yaml"].as_str().unwrap().to_owned();
    let filter = yaml(0)
        .replace("spw_svc_...", SERVICE_KEY)
        .replace("timeout: 0.1s", "timeout: 5s");
    assert!(filter.contains(SERVICE_KEY), "{filter}");
    (filter, yaml(1))
}

/// Requests to `path` with `headers` until the first 429 (at most 10): how many passed.
async fn passes_before_429(envoy: &Envoy, path: &str, headers: &[(&str, &str)]) -> usize {
    let http = reqwest::Client::new();
    for passed in 0..10 {
        let mut r = http.get(envoy.url(path));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        match r.send().await.unwrap().status() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => return passed,
            other => panic!("{path}: {other}"),
        }
    }
    10
}

/// Loads `file` as domain `gw` on a fresh server and starts Envoy from its wiring.
async fn wired(redis: &RedisServer, file: &str) -> (TestApp, Envoy, String) {
    let app = spawn_app(redis).await;
    load(&app, "gw", file).await;
    let (filter, route) = snippets(&app).await;
    let envoy = Envoy::from_wiring(&app, backend().await, &filter, &route).await;
    (app, envoy, route)
}

#[tokio::test]
async fn sibling_descriptors_each_get_an_entry_and_trip() {
    let redis = RedisServer::start();
    let (_app, envoy, route) = wired(
        &redis,
        "domain: gw\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 6}\n  - key: PATH\n    value: /login\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .await;
    // The login limit trips on its own: three pass, the fourth is refused.
    assert_eq!(passes_before_429(&envoy, "/login", &[]).await, 3, "{route}");
    // The address limit trips for other paths: what is left of its 6 (2 or 3, as the
    // refused /login was counted or not), then a 429.
    let left = passes_before_429(&envoy, "/other", &[]).await;
    assert!((2..=3).contains(&left), "{left} passed; {route}");
}

#[tokio::test]
async fn nested_keys_are_chained_in_one_entry() {
    let redis = RedisServer::start();
    let (_app, envoy, route) = wired(
        &redis,
        "domain: gw\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n    descriptors:\n      - key: plan\n        value: free\n        rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .await;
    let free = [("x-user", "ann"), ("x-plan", "free")];
    assert_eq!(passes_before_429(&envoy, "/", &free).await, 2, "{route}");
    // The user's own limit (5) trips for another plan: 2 or 3 are left.
    let pro = [("x-user", "ann"), ("x-plan", "pro")];
    let left = passes_before_429(&envoy, "/", &pro).await;
    assert!((2..=3).contains(&left), "{left} passed; {route}");
    // Another user has both limits untouched.
    let bob = [("x-user", "bob"), ("x-plan", "free")];
    assert_eq!(passes_before_429(&envoy, "/", &bob).await, 2, "{route}");
}

#[tokio::test]
async fn a_generic_key_and_a_header_key_trip_apart() {
    let redis = RedisServer::start();
    let (_app, envoy, route) = wired(
        &redis,
        "domain: gw\ndescriptors:\n  - key: generic_key\n    value: everyone\n    rate_limit: {unit: hour, requests_per_unit: 8}\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .await;
    let acme = [("x-tenant", "acme")];
    assert_eq!(passes_before_429(&envoy, "/", &acme).await, 2, "{route}");
    // Everyone's 8 trip without the tenant header: 5 or 6 are left of them.
    let left = passes_before_429(&envoy, "/", &[]).await;
    assert!((5..=6).contains(&left), "{left} passed; {route}");
}

#[tokio::test]
async fn descriptors_that_match_no_limit_are_named_on_the_domains_page() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    load(
        &app,
        "gw",
        "domain: gw\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 6}\n  - key: PATH\n    value: /login\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .await;
    // The old snippet: both keys in one entry, one descriptor no limit of the file meets.
    let one_entry = "                  - actions: [{remote_address: {}}, {request_headers: {header_name: \":path\", descriptor_key: PATH}}]";
    let envoy = Envoy::start(&app, backend().await, SERVICE_KEY, one_entry).await;
    assert_eq!(
        passes_before_429(&envoy, "/login", &[]).await,
        10,
        "limits nothing"
    );
    let mut v = crate::auth::admin(&app, &redis).await;
    let policy = spillway::domain::envoy::policy_name("gw").unwrap();
    let page = crate::helpers::eventually(
        "the unmatched descriptors named",
        crate::helpers::PATIENCE,
        async || {
            v.get(&format!("/policy?name={policy}"))
                .await
                .text()
                .await
                .unwrap()
        },
        |page| page.contains("data-testid=\"unmatched-descriptors\""),
    )
    .await;
    assert!(
        page.contains("10 descriptors in the last hour matched no limit of this file and limited nothing: remote_address › PATH (10)"),
        "{}",
        &page[page.find("unmatched-descriptors").unwrap()..][..400]
    );
}
