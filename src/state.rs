//! Shared application state, built once at startup and handed to every handler: the
//! service, and the settings the front doors read (sessions, proxies, timeouts, Envoy).

use std::sync::Arc;

use axum::extract::FromRef;
use leptos::config::LeptosOptions;

use crate::{
    config::{Config, SessionSettings},
    service::Service,
    store::{Store, StoreError},
};

/// Forward-auth settings: which header carries which dimension, and the deny status.
#[derive(Clone, Debug)]
pub struct ForwardAuth {
    pub identifiers: Vec<(String, String)>,
    pub deny_status: u16,
}

/// What every handler and server function can reach. Cloned for every request (axum's
/// `State`), so it is one reference count, not a copy of the settings.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The state itself, reached through `AppState`: the front doors' settings, and the
/// [`Service`] whose use cases they call (`state.service().check(..)`).
pub struct Shared {
    pub leptos_options: LeptosOptions,
    /// The use cases, with the store and the caches in front of it.
    service: Service,
    pub sessions: SessionSettings,
    /// This server's shutdown: draining, then stopping its background tasks.
    pub shutdown: crate::support::shutdown::Shutdown,
    pub forward_auth: Arc<ForwardAuth>,
    /// Longest time any HTTP request may take.
    pub request_timeout: std::time::Duration,
    /// Longest a connection may take to send a request's header, and may sit idle between
    /// requests.
    pub header_read_timeout: std::time::Duration,
    /// Connections each listener holds open at most.
    pub max_connections: usize,
    /// Calls each port has begun and not yet read (see `config::capacity`).
    pub max_pending: usize,
    /// Requests held at once by policies that wait (`SPILLWAY_MAX_WAITING`).
    pub max_waiting: usize,
    /// The reverse proxies whose forwarded headers are believed.
    pub trusted_proxies: crate::net::forwarded::TrustedProxies,
    /// Envoy's rate limit protocol: the gRPC address, key requirement and headers.
    pub envoy: crate::config::EnvoySettings,
    /// The dashboard's live streams each user holds open here.
    pub streams: Arc<crate::net::connection::StreamSlots>,
    /// The latest read of each live view, shared by the streams that follow it.
    pub live_reads: Arc<crate::net::connection::LatestReads>,
    /// TLS on the HTTP and gRPC ports, when configured.
    pub tls: crate::net::tls::Ports,
    /// The folder of Envoy domain files kept loaded, when configured.
    pub domains_dir: Option<std::path::PathBuf>,
    /// The xDS management server domains come from, when configured.
    pub xds: Option<crate::config::xds::XdsSettings>,
}

impl Shared {
    /// The use cases: what every front door calls.
    pub fn service(&self) -> &Service {
        &self.service
    }
}

impl AppState {
    /// [`AppState::connect`], tried again with backoff (a quarter second, doubling to 5 s)
    /// while Redis cannot be reached: a pod started during an outage waits for it instead of
    /// exiting. Said once when the wait begins and once when it ends; a setting that is
    /// wrong (not an unreachable Redis) ends the start at once.
    pub async fn connect_patiently(config: Config) -> Result<Self, StoreError> {
        let started = std::time::Instant::now();
        let mut backoff = std::time::Duration::from_millis(250);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match Self::connect(config.clone()).await {
                Ok(state) => {
                    if attempts > 1 {
                        tracing::info!(
                            attempts,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "Redis answered: starting"
                        );
                    }
                    return Ok(state);
                }
                Err(error) if error.is_unreachable() => {
                    if attempts == 1 {
                        tracing::warn!(%error, "Redis cannot be reached: /healthz answers, /readyz says not ready, and connecting is retried until Redis answers");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Connects to Redis as configured and starts the service (see [`Service::start`]).
    /// Starts even when Redis is down: checks then answer by failure mode, and the policies
    /// load once Redis is back.
    pub async fn connect(config: Config) -> Result<Self, StoreError> {
        let store = Store::connect_configured(&config, config.redis_timeout).await?;
        let shutdown = crate::support::shutdown::Shutdown::default();
        let service = Service::start(&config, store, &shutdown).await;
        Ok(Self(Arc::new(Shared {
            leptos_options: config.leptos_options,
            service,
            sessions: config.sessions,
            shutdown,
            request_timeout: config.request_timeout,
            header_read_timeout: config.header_read_timeout,
            max_connections: config.max_connections,
            max_pending: config.max_pending,
            max_waiting: config.max_waiting,
            trusted_proxies: config.trusted_proxies.clone(),
            envoy: config.envoy.clone(),
            streams: Default::default(),
            live_reads: Default::default(),
            tls: config.tls.clone(),
            domains_dir: config.domains_dir.clone(),
            xds: config.xds.clone(),
            forward_auth: Arc::new(ForwardAuth {
                identifiers: config.forward_auth_identifiers,
                deny_status: config.forward_auth_deny_status,
            }),
        })))
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
