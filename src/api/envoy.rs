//! Envoy rate limit domains in envoyproxy/ratelimit's own file format: `PUT` one (YAML with
//! `Content-Type: application/yaml`, the file's bytes as uploaded with
//! `application/octet-stream`, or the same document as JSON) to load it as its
//! policy's next version, `GET` it back. Admin keys, or a signed-in session.

use axum::{
    Router,
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use serde::Deserialize;
use serde_json::Value;

use super::{Admin, ApiError, may};
use crate::{
    domain::{
        FailureMode,
        envoy::{Counting, EnvoyDomain},
    },
    state::AppState,
};

/// Largest domain file read (a tree of up to 10,000 descriptors).
pub const MAX_FILE: usize = 1024 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/envoy/domains/{domain}", get(read).put(put))
        .route("/api/v1/envoy/domains/{domain}/wiring", get(wiring))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FILE))
}

/// The body's media type: YAML or JSON; anything else is 415.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Yaml,
    Json,
}

fn format_of(value: Option<&str>) -> Option<Format> {
    let media = value?.split(';').next()?.trim().to_ascii_lowercase();
    match media.as_str() {
        "application/json" => Some(Format::Json),
        // A file uploaded as it is (what generated clients send for a file) is read as
        // YAML, which holds JSON too.
        "application/yaml"
        | "application/x-yaml"
        | "text/yaml"
        | "text/x-yaml"
        | "application/octet-stream" => Some(Format::Yaml),
        _ => None,
    }
}

/// A domain's file, YAML or JSON, as a JSON value; the error names `body`.
pub fn parse_file(bytes: &[u8], format_yaml: bool) -> Result<Value, ApiError> {
    if format_yaml {
        crate::service::envoy::domain_yaml(bytes).map_err(|e| ApiError::bad("body", e))
    } else {
        serde_json::from_slice::<Value>(bytes)
            .map_err(|e| ApiError::bad("body", format!("is not valid JSON: {e}")))
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct PutQuery {
    /// `open` or `closed`: what a check answers when Redis cannot be reached (default: the
    /// domain's current setting; `open` for a new one).
    failure_mode: Option<String>,
    /// `every_hit` or `all_or_nothing`: how a request over a limit is counted (default: the
    /// file's `counting`, else the domain's current setting, else the server's default:
    /// `every_hit` unless `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is true).
    counting: Option<String>,
}

impl PutQuery {
    /// The failure mode and counting the query asks for (`None`: as the domain has them).
    fn settings(&self) -> Result<(Option<FailureMode>, Option<Counting>), ApiError> {
        let failure_mode = match self.failure_mode.as_deref() {
            None => None,
            Some("open") => Some(FailureMode::Open),
            Some("closed") => Some(FailureMode::Closed),
            Some(other) => {
                return Err(ApiError::bad(
                    "failure_mode",
                    format!("expected open or closed, got {other:?}"),
                ));
            }
        };
        let counting = self
            .counting
            .as_deref()
            .map(Counting::parse)
            .transpose()
            .map_err(|m| ApiError::bad("counting", m))?;
        Ok((failure_mode, counting))
    }
}

/// Loads the domain's file as the next version of its policy (audited). The domain in the
/// file must be the one in the path (or be left out). On any error the previous version
/// stays in force.
#[utoipa::path(put, path = "/api/v1/envoy/domains/{domain}", tag = "envoy", operation_id = "put_envoy_domain",
    params(("domain" = String, Path, description = "The domain, as Envoy's rate limit filter names it"), PutQuery),
    request_body(description = "envoyproxy/ratelimit's configuration file: as JSON, as YAML, or its bytes as uploaded (`application/octet-stream`, read as YAML)", content(
        (crate::api::openapi::EnvoyDomainFile = "application/json"),
        (String = "application/yaml"),
        (crate::api::openapi::FileBytes = "application/octet-stream"))),
    responses((status = 200, description = "Loaded; the file as stored", body = crate::api::openapi::EnvoyDomainFile), (status = 201, description = "Loaded as a new domain", body = crate::api::openapi::EnvoyDomainFile),
    (status = 400, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 409, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 413, body = crate::api::openapi::Problem, content_type = "application/problem+json"),
    (status = 415, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn put(
    State(state): State<AppState>,
    Admin(actor, _): Admin<may::EditPolicies>,
    headers: HeaderMap,
    Path(domain): Path<String>,
    Query(query): Query<PutQuery>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let format = format_of(
        headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or(ApiError::UnsupportedMediaType)?;
    if body.len() > MAX_FILE {
        return Err(ApiError::PayloadTooLarge);
    }
    let (failure_mode, counting) = query.settings()?;
    // Up to a megabyte of YAML and 10,000 descriptors: read off the request threads, so
    // other requests (checks) are not held up behind it.
    let yaml = format == Format::Yaml;
    let mut value = tokio::task::spawn_blocking(move || parse_file(&body, yaml))
        .await
        .map_err(|_| ApiError::bad("body", "could not be read"))??;
    match value.get("domain") {
        None | Some(Value::Null) if value.is_object() => {
            value["domain"] = Value::String(domain.clone());
        }
        Some(Value::String(d)) if *d != domain => {
            return Err(ApiError::bad(
                "domain",
                format!("the file is for {d:?}, the path names {domain:?}"),
            ));
        }
        _ => {}
    }
    let parsed = tokio::task::spawn_blocking(move || EnvoyDomain::from_value(&value))
        .await
        .map_err(|_| ApiError::bad("body", "could not be read"))??;
    // Saving a domain of thousands of descriptors is CPU work (its rules, the version it
    // replaces, the audit record's documents): done on a blocking thread, so the checks on
    // the runtime's workers are not held up behind it.
    let runtime = tokio::runtime::Handle::current();
    let saving = state.clone();
    let saved = tokio::task::spawn_blocking(move || {
        runtime.block_on(saving.service().save_envoy_domain(
            &actor,
            parsed,
            (failure_mode, counting.map(Some)),
            None,
        ))
    })
    .await
    .map_err(|_| ApiError::bad("body", "could not be saved"))??;
    let status = if saved.version == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let doc = saved.envoy.as_ref().map(|t| &t.doc);
    Ok((
        status,
        [(header::ETAG, format!("\"{}\"", saved.version))],
        axum::Json(serde_json::to_value(doc).unwrap_or_default()),
    ))
}

/// The domain's file as loaded: YAML when the request accepts `application/yaml`, else JSON.
#[utoipa::path(get, path = "/api/v1/envoy/domains/{domain}", tag = "envoy", operation_id = "get_envoy_domain",
    params(("domain" = String, Path, description = "The domain")),
    responses((status = 200, description = "The file (JSON, or YAML when asked for)", content(
        (crate::api::openapi::EnvoyDomainFile = "application/json"),
        (String = "application/yaml"))),
    (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn read(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    headers: HeaderMap,
    Path(domain): Path<String>,
) -> Result<axum::response::Response, ApiError> {
    let (version, doc) = stored_domain(&state, &domain).await?;
    let doc = &doc;
    let etag = [(header::ETAG, format!("\"{version}\""))];
    let wants_yaml = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("yaml"));
    Ok(if wants_yaml {
        let text = serde_yaml::to_string(doc).unwrap_or_default();
        (etag, [(header::CONTENT_TYPE, "application/yaml")], text).into_response()
    } else {
        (etag, axum::Json(doc)).into_response()
    })
}

/// The stored domain `domain`: its policy's version and its file (404 when there is none).
async fn stored_domain(
    state: &AppState,
    domain: &str,
) -> Result<(u64, crate::domain::envoy::DomainDoc), ApiError> {
    let missing = || ApiError::NotFound(format!("domain: no Envoy domain named {domain:?}"));
    let name = crate::domain::envoy::policy_name(domain).map_err(|_| missing())?;
    let policy = state
        .service()
        .stored_policy(&name)
        .await
        .map_err(ApiError::RedisUnavailable)?
        .ok_or_else(missing)?;
    let version = policy.version;
    policy
        .envoy
        .filter(|t| t.doc.domain == domain)
        .map(|t| (version, t.doc))
        .ok_or_else(missing)
}

/// What to add to Envoy's configuration so it asks this server about the domain: the
/// filter, the route's `rate_limits` (one entry per descriptor path) and the cluster, each a
/// YAML document, as the domain's dashboard page shows them.
#[utoipa::path(get, path = "/api/v1/envoy/domains/{domain}/wiring", tag = "envoy", operation_id = "get_envoy_domain_wiring",
    params(("domain" = String, Path, description = "The domain")),
    responses((status = 200, description = "The snippets, in the order they are shown", body = [crate::api::openapi::WiringPart]),
    (status = 404, body = crate::api::openapi::Problem, content_type = "application/problem+json")))]
pub(super) async fn wiring(
    State(state): State<AppState>,
    Admin(..): Admin<may::View>,
    Path(domain): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let (_, doc) = stored_domain(&state, &domain).await?;
    let parts = crate::domain::envoy::wiring(
        &doc,
        state.envoy.grpc_addr.map(|a| a.port()),
        state.envoy.require_key,
    );
    Ok(axum::Json(Value::Array(
        parts
            .into_iter()
            .map(|(place, yaml)| serde_json::json!({"where": place, "yaml": yaml}))
            .collect(),
    )))
}
