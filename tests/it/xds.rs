//! Domains over xDS: a management server inside the test (tonic, the aggregated discovery
//! service, over mutual TLS as Envoy Gateway serves it) sends `RateLimitConfig` resources to
//! two instances; a first version, a change, a bad version (NACKed, the old one still
//! answers), and a restart of the server that starts its versions again.

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use envoy_types::pb::{
    envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
        aggregated_discovery_service_server::{
            AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
        },
    },
    google::protobuf::Any,
    ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    },
};
use prost::Message;
use tokio::sync::watch;

use crate::{
    helpers::{PATIENCE, RedisServer, eventually, spawn_app_with},
    listeners_tls::{Ca, Folder},
    upstream_env::{allows, limit_of},
};

const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The set the server serves: its version and domains.
pub(crate) type Snapshot = (String, Vec<RateLimitConfig>);

/// A management server of the test's own: serves the current snapshot on every stream and
/// again whenever it changes, and keeps every request it is sent.
#[derive(Clone)]
struct Management {
    snapshot: watch::Receiver<Snapshot>,
    requests: Arc<Mutex<Vec<DiscoveryRequest>>>,
    streams: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

type Responses =
    Pin<Box<dyn futures_util::Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn futures_util::Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Management {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let (mut snapshot, requests) = (self.snapshot.clone(), self.requests.clone());
        let task = tokio::spawn(async move {
            let mut nonce = 0u32;
            snapshot.mark_changed();
            loop {
                tokio::select! {
                    changed = snapshot.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let (version, configs) = snapshot.borrow_and_update().clone();
                        nonce += 1;
                        let response = DiscoveryResponse {
                            version_info: version,
                            type_url: TYPE_URL.into(),
                            nonce: nonce.to_string(),
                            resources: configs
                                .iter()
                                .map(|c| Any { type_url: TYPE_URL.into(), value: c.encode_to_vec() })
                                .collect(),
                            ..Default::default()
                        };
                        if tx.send(Ok(response)).await.is_err() {
                            return;
                        }
                    }
                    request = incoming.message() => match request {
                        Ok(Some(request)) => requests.lock().unwrap().push(request),
                        _ => return,
                    },
                }
            }
        });
        self.streams.lock().unwrap().push(task);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// The management server running on `addr` over mTLS, until `stop`.
pub(crate) struct Running {
    server: tokio::task::JoinHandle<()>,
    management: Management,
    publish: watch::Sender<Snapshot>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    pub(crate) async fn start(addr: SocketAddr, pki: &Pki, first: Snapshot) -> Self {
        let (publish, snapshot) = watch::channel(first);
        let management = Management {
            snapshot,
            requests: Default::default(),
            streams: Default::default(),
        };
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &pki.server.cert,
                &pki.server.key,
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(&pki.ca.pem));
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = AggregatedDiscoveryServiceServer::new(management.clone());
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .tls_config(tls)
                .unwrap()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await
                .unwrap();
        });
        Self {
            server,
            management,
            publish,
            stop: Some(stop),
        }
    }

    /// Stops the server and every stream it holds open.
    pub(crate) async fn stop(mut self) {
        for task in self.management.streams.lock().unwrap().drain(..) {
            task.abort();
        }
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.server).await;
        self.server.abort();
    }

    fn requests(&self) -> Vec<DiscoveryRequest> {
        self.management.requests.lock().unwrap().clone()
    }
}

/// The certificates of the control plane and the limiter (one CA, as Envoy Gateway's).
pub(crate) struct Pki {
    pub ca: Ca,
    pub server: crate::listeners_tls::Signed,
}

/// The domain `xds` with one `user` rule of `limit` an hour (`unit` as given).
fn config(limit: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: "xds".into(),
        domain: "xds".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: limit,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// The requests the management server received, shown by version, nonce and error when a
/// wait for them fails.
struct Requests(Vec<DiscoveryRequest>);

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<_> = self
            .0
            .iter()
            .map(|r| (&r.version_info, &r.response_nonce, &r.error_detail))
            .collect();
        write!(f, "{shown:#?}")
    }
}

/// Waits until `ready` holds on the server's requests.
async fn until_requested(
    server: &Running,
    what: &str,
    ready: impl Fn(&[DiscoveryRequest]) -> bool,
) {
    eventually(
        what,
        PATIENCE,
        async || Requests(server.requests()),
        |requests| ready(&requests.0),
    )
    .await;
}

/// Waits up to `within` until each app lets `hits` through and refuses `hits + 1`: until
/// each enforces a limit of exactly `hits`.
async fn until_limit(apps: &[&crate::helpers::TestApp], hits: u32, within: Duration) {
    eventually(
        &format!("limit {hits} in force on each instance"),
        within,
        async || {
            let mut exact = Vec::new();
            for app in apps {
                exact.push(allows(app, "xds", hits).await && !allows(app, "xds", hits + 1).await);
            }
            exact
        },
        |exact| exact.iter().all(|e| *e),
    )
    .await;
}

#[tokio::test]
async fn domains_over_xds_follow_versions_refuse_a_bad_one_and_survive_a_restart() {
    let redis = RedisServer::start();
    let ca = Ca::new("control plane CA");
    let pki = Pki {
        server: ca.server(),
        ca,
    };
    let files = Folder::new("xds-certs");
    let client = pki.ca.client("envoy-ratelimit");
    let addr: SocketAddr = format!("127.0.0.1:{}", crate::helpers::free_port())
        .parse()
        .unwrap();
    let server = Running::start(
        addr,
        &pki,
        ("1".into(), vec![config(2, RateLimitUnit::Hour)]),
    )
    .await;
    // Envoy Gateway's variables, as upstream reads them, naming the mTLS files.
    let (cert, key, ca_file) = (
        files.write("tls.crt", &client.cert),
        files.write("tls.key", &client.key),
        files.write("ca.crt", &pki.ca.pem),
    );
    let url = format!("localhost:{}", addr.port());
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca_file.as_str()),
        // The test apps' own ports and key, over upstream's defaults.
        ("SPILLWAY_UPSTREAM_ENV", "true"),
        ("SPILLWAY_GRPC_AUTH", "key"),
    ];
    let one = spawn_app_with(&redis, &env).await;
    let two = spawn_app_with(&redis, &env).await;

    // The first version: in force on both, ACKed by both with the node's id.
    until_limit(&[&one, &two], 2, PATIENCE).await;
    until_requested(&server, "two ACKs of 1", |r| {
        r.iter()
            .filter(|r| r.version_info == "1" && r.error_detail.is_none())
            .count()
            >= 2
    })
    .await;
    assert!(server.requests().iter().all(|r| {
        r.node.as_ref().is_some_and(|n| n.id == "envoy-ratelimit") && r.type_url == TYPE_URL
    }));

    // A change: in force on both within 2 s.
    let started = Instant::now();
    server
        .publish
        .send(("2".into(), vec![config(5, RateLimitUnit::Hour)]))
        .unwrap();
    until_limit(&[&one, &two], 5, PATIENCE).await;
    let took = started.elapsed();
    // The folder and the stream are read every second or at once: about a second on an
    // idle machine (printed); the bound is loose so a busy machine does not decide.
    println!("in force on both instances after {took:?}");
    assert!(took < Duration::from_secs(6), "in force after {took:?}");

    // A bad version: NACKed (the previous version and the field in error_detail); version 2
    // still answers.
    server
        .publish
        .send(("3".into(), vec![config(7, RateLimitUnit::Unknown)]))
        .unwrap();
    until_requested(&server, "two NACKs of 3", |r| {
        r.iter()
            .filter(|r| {
                r.version_info == "2"
                    && r.error_detail
                        .as_ref()
                        .is_some_and(|e| e.message.contains("unit"))
            })
            .count()
            >= 2
    })
    .await;
    // Still: at the first look, or within a second.
    until_limit(&[&one, &two], 5, Duration::from_secs(1)).await;
    // Each version that arrived is in the audit log: taken, or refused with why.
    let audit: serde_json::Value = one
        .client
        .get(one.url("/api/v1/audit?action=domains.version"))
        .bearer_auth(crate::helpers::ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let seen = audit.to_string();
    // `after` is a JSON document inside the record: its quotes may come escaped.
    let seen = seen.replace("\\\"", "\"");
    for needle in [
        r#""version":"1""#,
        r#""version":"2""#,
        "domains.version.refused",
    ] {
        assert!(seen.contains(needle), "{needle} not in {seen}");
    }

    // The control plane restarts and counts its versions from 1 again: both instances
    // subscribe again and take its set.
    server.stop().await;
    let server = Running::start(
        addr,
        &pki,
        ("1".into(), vec![config(7, RateLimitUnit::Hour)]),
    )
    .await;
    until_limit(&[&one, &two], 7, PATIENCE).await;
    until_requested(&server, "two ACKs after the restart", |r| {
        r.iter()
            .filter(|r| r.version_info == "1" && r.error_detail.is_none())
            .count()
            >= 2
    })
    .await;

    // A version without the domain: it goes (each response is the whole set).
    server.publish.send(("2".into(), Vec::new())).unwrap();
    eventually(
        "xds deleted",
        PATIENCE,
        async || limit_of(&one, "xds").await,
        Option::is_none,
    )
    .await;
    server.stop().await;
}
