//! The OpenAPI document: well formed, and in step with the router.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::helpers::{ADMIN_KEY, RedisServer, SERVICE_KEY, spawn_app};

/// Every route of the JSON API, as the router serves it.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/healthcheck"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/api/openapi.json"),
    ("post", "/api/v1/check"),
    ("post", "/api/v1/check/batch"),
    ("get", "/api/v1/forward-auth"),
    ("post", "/api/v1/report"),
    ("post", "/api/v1/leases/release"),
    ("post", "/api/v1/leases/renew"),
    ("get", "/api/v1/policies"),
    ("get", "/api/v1/policies/{name}"),
    ("put", "/api/v1/policies/{name}"),
    ("delete", "/api/v1/policies/{name}"),
    ("get", "/api/v1/policies/{name}/versions"),
    ("get", "/api/v1/policies/{name}/overrides"),
    ("post", "/api/v1/policies/{name}/overrides"),
    ("delete", "/api/v1/policies/{name}/overrides/{index}"),
    ("post", "/api/v1/policies/{name}/what-if"),
    ("get", "/api/v1/policies/{name}/suggestions"),
    ("get", "/api/v1/identifiers/{dimension}/{value}"),
    ("delete", "/api/v1/identifiers/{dimension}/{value}"),
    ("post", "/api/v1/resets/{token}/undo"),
    ("get", "/api/v1/audit"),
    ("get", "/api/v1/history"),
    ("get", "/api/v1/history/csv"),
    ("get", "/api/v1/alerts"),
    ("put", "/api/v1/alerts/{name}"),
    ("delete", "/api/v1/alerts/{name}"),
    ("get", "/api/v1/envoy/domains/{domain}"),
    ("put", "/api/v1/envoy/domains/{domain}"),
    ("get", "/api/v1/envoy/domains/{domain}/wiring"),
];

fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "$ref" {
                    out.push(v.as_str().unwrap().to_owned());
                }
                refs(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_document_lists_exactly_the_routes_served_and_its_refs_resolve() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let doc: Value = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, expected);

    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "dangling {r}"
        );
    }

    // Every documented route is served: none answers 404 for the route itself or 405.
    for (method, path) in ROUTES {
        let url = app.url(
            &path
                .replace("{name}", "demo")
                .replace("{dimension}", "user")
                .replace("{value}", "42"),
        );
        let request = match *method {
            "get" => app.client.get(&url),
            "post" => app.client.post(&url),
            "put" => app.client.put(&url),
            "delete" => app.client.delete(&url),
            _ => unreachable!(),
        };
        let response = request
            .bearer_auth(ADMIN_KEY)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        assert_ne!(status, 405, "{method} {path}");
        if status == 404 {
            // A 404 of the route itself (no such policy or domain), not the catch-all's.
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let detail = body["detail"].as_str().unwrap_or_default();
            assert!(
                body["field"] != "path" && !detail.starts_with("path:") && !detail.is_empty(),
                "{method} {path} is not routed: {body}"
            );
        }
    }
}

/// What a generated client is made of: every operation has a person's name and a tag from
/// the document's list, and a path parameter exists only where the path has its placeholder
/// (the reset's policy, rule and reason are optional query parameters).
#[tokio::test]
async fn operations_are_named_for_people_and_parameters_sit_where_they_are() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let doc: Value = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tags: BTreeSet<&str> = doc["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    let mut ids = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(
                !id.is_empty()
                    && id.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    && !id.contains("handler"),
                "{method} {path}: operationId {id:?}"
            );
            assert!(ids.insert(id.to_owned()), "{id} twice");
            let op_tags = op["tags"].as_array().unwrap();
            assert_eq!(op_tags.len(), 1, "{method} {path}");
            assert!(
                tags.contains(op_tags[0].as_str().unwrap()),
                "{method} {path}: {op_tags:?}"
            );
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap();
                let placeholder = path.contains(&format!("{{{name}}}"));
                assert_eq!(
                    p["in"] == "path",
                    placeholder,
                    "{method} {path}: {name} is in {}",
                    p["in"]
                );
                if p["in"] == "path" {
                    assert_eq!(p["required"], true, "{method} {path}: {name}");
                }
            }
        }
    }
    let reset = &doc["paths"]["/api/v1/identifiers/{dimension}/{value}"]["delete"]["parameters"];
    for name in ["policy", "rule", "reason"] {
        let p = reset
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        assert_eq!(p["in"], "query", "{name}");
        assert_ne!(p["required"], true, "{name}");
    }
}

/// A client generated from the document by a mainstream generator (openapi-python-client,
/// which `make test` installs into `.tools/py`) calls every operation and gets typed answers:
/// `tests/client/every_operation.py` drives it and reports each operation it called.
#[tokio::test]
async fn a_generated_client_calls_every_operation() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tools = root.join(".tools/py/bin");
    assert!(
        tools.join("openapi-python-client").exists(),
        "openapi-python-client is not installed: run `scripts/deps.sh test` (make test does)"
    );
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let text = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let dir = std::env::temp_dir().join(format!("spillway-client-{}", app.addr.port()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("openapi.json"), &text).unwrap();
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let url = format!("http://{}", app.addr);
    let script = root.join("tests/client/every_operation.py");
    let run = {
        let (dir, tools) = (dir.clone(), tools.clone());
        tokio::task::spawn_blocking(move || {
            let generated = std::process::Command::new(tools.join("openapi-python-client"))
                .args([
                    "generate",
                    "--path",
                    "openapi.json",
                    "--output-path",
                    "client",
                ])
                .current_dir(&dir)
                .env("PATH", &path)
                .output()
                .unwrap();
            assert!(
                dir.join("client/spillway_client/api").is_dir(),
                "the generator made no client: {}{}",
                String::from_utf8_lossy(&generated.stdout),
                String::from_utf8_lossy(&generated.stderr)
            );
            std::process::Command::new(tools.join("python"))
                .arg(script)
                .env("PYTHONPATH", dir.join("client"))
                .env("SPILLWAY_URL", url)
                .env("SPILLWAY_ADMIN_KEY", ADMIN_KEY)
                .env("SPILLWAY_SERVICE_KEY", SERVICE_KEY)
                .output()
                .unwrap()
        })
    };
    let out = run.await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let called: BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("called "))
        .collect();
    let operations: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|ops| ops.as_object().unwrap().values())
        .map(|op| op["operationId"].as_str().unwrap())
        .collect();
    assert_eq!(called, operations, "operations the client did not call");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What generators build types from (issue 38): the rate-limit headers are declared, closed
/// sets are enums (not patterns), a count is an integer, and the check's refusals are
/// listed (400 for unmatched identifiers, 422 for a cost no rule admits).
#[tokio::test]
async fn generators_get_headers_enums_and_integers() {
    let redis = RedisServer::start();
    let app = spawn_app(&redis).await;
    let doc: Value = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let check = &doc["paths"]["/api/v1/check"]["post"]["responses"];
    for header in ["RateLimit-Policy", "RateLimit", "Spillway-Unmatched"] {
        assert!(check["200"]["headers"][header].is_object(), "200 {header}");
    }
    assert!(check["429"]["headers"]["Retry-After"].is_object());
    assert!(check["422"].is_object() && check["400"].is_object());
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["PolicyMode"]["enum"], json!(["enforce", "shadow"]));
    assert_eq!(schemas["FailureMode"]["enum"], json!(["open", "closed"]));
    assert_eq!(
        schemas["AlgorithmName"]["enum"].as_array().unwrap().len(),
        9
    );
    assert_eq!(
        schemas["CheckResponse"]["properties"]["mode"]["$ref"],
        "#/components/schemas/PolicyMode"
    );
    assert!(schemas["CheckResponse"]["properties"]["unmatched"].is_object());
    for request in ["CheckRequest", "ReportRequest"] {
        assert_eq!(
            schemas[request]["properties"]["identifiers"]["$ref"],
            "#/components/schemas/Identifiers",
            "one identifiers schema"
        );
    }
    let top = doc["paths"]["/api/v1/history"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "top")
        .unwrap()
        .clone();
    assert!(
        top["schema"]["type"].to_string().contains("integer"),
        "{top}"
    );
}
