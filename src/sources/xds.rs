//! Domains over xDS, state of the world, as Envoy Gateway serves them to
//! envoyproxy/ratelimit: this instance subscribes to `RateLimitConfig` resources on the
//! management server's aggregated discovery service, one resource a domain.
//!
//! Every response holds the whole set. It is loaded all or none, as a domains folder is
//! ([`Service::sync_envoy_files`]: only domains whose stored version differs are written, so
//! instances subscribing at once end on the same versions), then ACKed. A set that does not
//! load is NACKed with the resource and field in `error_detail`, and the previous set stays
//! in force. A broken stream is opened again after a backoff (half a second, doubling to 30
//! seconds, reset by a response), and the server sends the whole set again.

use std::time::Duration;

use envoy_types::pb::{
    envoy::{
        config::core::v3::Node,
        service::discovery::v3::{
            DiscoveryRequest, DiscoveryResponse,
            aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
        },
    },
    google::{
        protobuf::{Struct, Value as ProtoValue, value::Kind},
        rpc::Status,
    },
    ratelimit::config::ratelimit::v3::{RateLimitConfig, RateLimitDescriptor, RateLimitUnit},
};
use prost::Message;
use serde_json::{Value, json};

use crate::{config::xds::XdsSettings, service::Service, service::audit::Actor};

/// The resource type: upstream's rate limit configuration.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const LAST_BACKOFF: Duration = Duration::from_secs(30);

/// Subscribes for ever (the server's shutdown handle runs it, and ends it).
pub async fn run(service: Service, settings: XdsSettings) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let (answered, problem) = subscribe(&service, &settings).await;
        if answered {
            backoff = FIRST_BACKOFF;
        }
        let problem = problem.unwrap_or_else(|| "the server ended the stream".into());
        tracing::warn!(server = %settings.server, "xDS: {problem}; subscribing again in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LAST_BACKOFF);
    }
}

/// One stream, until it breaks: whether any response came on it, and why it ended.
async fn subscribe(service: &Service, settings: &XdsSettings) -> (bool, Option<String>) {
    let mut answered = false;
    let ended = stream(service, settings, &mut answered).await.err();
    (answered, ended)
}

async fn stream(
    service: &Service,
    settings: &XdsSettings,
    answered: &mut bool,
) -> Result<(), String> {
    let channel = connect(settings).await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (requests, outgoing) = tokio::sync::mpsc::channel::<DiscoveryRequest>(4);
    let node = node(settings);
    let request = |version: &str, nonce: &str, error: Option<String>| DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(node.clone()),
        type_url: TYPE_URL.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| Status {
            // INVALID_ARGUMENT
            code: 3,
            message,
            details: Vec::new(),
        }),
        ..Default::default()
    };
    let _ = requests.send(request("", "", None)).await;
    let stream = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|r| (r, outgoing))
    });
    let mut responses = client
        .stream_aggregated_resources(stream)
        .await
        .map_err(|s| format!("the server refused the stream: {}", s.message()))?
        .into_inner();
    let mut acked = String::new();
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return Ok(()),
            Err(status) => return Err(format!("the stream broke: {}", status.message())),
        };
        *answered = true;
        match apply(service, settings, &response).await {
            Ok(()) => {
                acked = response.version_info.clone();
                let _ = requests.send(request(&acked, &response.nonce, None)).await;
            }
            Err(Refused::Invalid(problem)) => {
                tracing::error!(
                    version = %response.version_info,
                    "xDS version refused, the previous domains stay in force: {problem}"
                );
                let _ = requests
                    .send(request(&acked, &response.nonce, Some(problem)))
                    .await;
            }
            // Neither ACK nor NACK: a new stream gets the whole set again.
            Err(Refused::Unavailable(problem)) => return Err(problem),
        }
    }
}

/// Why a response was not taken.
enum Refused {
    /// It does not load (NACK).
    Invalid(String),
    /// Redis could not store it (tried again on a new stream).
    Unavailable(String),
}

/// Loads the response's domains, all or none.
async fn apply(
    service: &Service,
    settings: &XdsSettings,
    response: &DiscoveryResponse,
) -> Result<(), Refused> {
    let mut files = Vec::with_capacity(response.resources.len());
    for any in &response.resources {
        if any.type_url != TYPE_URL {
            return Err(Refused::Invalid(format!(
                "a resource of type {} (expected {TYPE_URL})",
                any.type_url
            )));
        }
        let config = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| Refused::Invalid(format!("a resource does not decode: {e}")))?;
        let name = if config.name.is_empty() {
            config.domain.clone()
        } else {
            config.name.clone()
        };
        let text = serde_yaml::to_string(&domain_value(&config))
            .map_err(|e| Refused::Invalid(format!("{name}: {e}")))?;
        files.push((format!("resource {name}"), text));
    }
    let actor = Actor {
        name: format!("xds:{} version {}", settings.server, response.version_info),
        role: "admin".into(),
        ip: String::new(),
    };
    let source = format!("xds:{}", settings.server);
    match service.sync_envoy_files(&actor, &source, &files).await {
        Ok(written) => {
            tracing::info!(
                version = %response.version_info,
                domains = files.len(),
                written = %written.join(","),
                "xDS version in force"
            );
            service
                .record_domains_version(&actor, &source, &response.version_info, Ok(&written))
                .await;
            Ok(())
        }
        Err(crate::service::policies::ChangeError::Unavailable(e)) => {
            Err(Refused::Unavailable(format!("Redis is unavailable: {e}")))
        }
        Err(e) => {
            let problem = e.to_string();
            service
                .record_domains_version(&actor, &source, &response.version_info, Err(&problem))
                .await;
            Err(Refused::Invalid(problem))
        }
    }
}

/// A resource as upstream's YAML file would say it (the same fields and meaning).
pub fn domain_value(config: &RateLimitConfig) -> Value {
    json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor_value).collect::<Vec<_>>(),
    })
}

fn descriptor_value(d: &RateLimitDescriptor) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("key".into(), json!(d.key));
    if !d.value.is_empty() {
        out.insert("value".into(), json!(d.value));
    }
    if let Some(limit) = &d.rate_limit {
        let unit = RateLimitUnit::try_from(limit.unit)
            .map(|u| u.as_str_name().to_ascii_lowercase())
            .unwrap_or_else(|_| format!("unit {}", limit.unit));
        let mut rate = serde_json::Map::new();
        rate.insert("unit".into(), json!(unit));
        rate.insert("requests_per_unit".into(), json!(limit.requests_per_unit));
        if limit.unlimited {
            rate.insert("unlimited".into(), json!(true));
        }
        if !limit.name.is_empty() {
            rate.insert("name".into(), json!(limit.name));
        }
        if !limit.replaces.is_empty() {
            let replaces: Vec<Value> = limit
                .replaces
                .iter()
                .map(|r| json!({ "name": r.name }))
                .collect();
            rate.insert("replaces".into(), json!(replaces));
        }
        out.insert("rate_limit".into(), Value::Object(rate));
    }
    if !d.descriptors.is_empty() {
        let nested: Vec<Value> = d.descriptors.iter().map(descriptor_value).collect();
        out.insert("descriptors".into(), json!(nested));
    }
    if d.shadow_mode {
        out.insert("shadow_mode".into(), json!(true));
    }
    if d.detailed_metric {
        out.insert("detailed_metric".into(), json!(true));
    }
    if d.quota_mode {
        out.insert("quota_mode".into(), json!(true));
    }
    Value::Object(out)
}

/// This instance as the management server sees it.
fn node(settings: &XdsSettings) -> Node {
    Node {
        id: settings.node_id.clone(),
        metadata: (!settings.node_metadata.is_empty()).then(|| Struct {
            fields: settings
                .node_metadata
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        ProtoValue {
                            kind: Some(Kind::StringValue(v.clone())),
                        },
                    )
                })
                .collect(),
        }),
        user_agent_name: "spillway".into(),
        ..Default::default()
    }
}

/// A channel to the management server, over TLS for an `https://` one.
async fn connect(settings: &XdsSettings) -> Result<tonic::transport::Channel, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut endpoint = Endpoint::from_shared(settings.server.clone())
        .map_err(|e| format!("{}: {e}", settings.server))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30));
    if settings.server.starts_with("https://") {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
        };
        let mut tls = ClientTlsConfig::new();
        tls = match &settings.ca {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
            None => tls.with_webpki_roots(),
        };
        if let Some((cert, key)) = &settings.identity {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(name) = &settings.server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("TLS settings: {e}"))?;
    }
    endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot reach {}: {e}", settings.server))
}
