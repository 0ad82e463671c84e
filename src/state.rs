//! Shared application state, built once at startup and handed to every handler.

use std::sync::Arc;

use axum::extract::FromRef;
use leptos::config::LeptosOptions;

use crate::{
    auth::ApiKeys,
    config::{Config, SessionSettings},
    service::{
        Service, deny_cache::DenyCache, history::HistoryCounts, live::LiveCounts,
        policies::seed_demo_policy, policy_cache::PolicyCache,
    },
    store::{Keys, Store, StoreError},
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

/// The state itself, reached through `AppState`. It derefs to the [`Service`], so handlers
/// call the use cases (`state.check(..)`) and reach the store and caches (`state.store`)
/// directly.
pub struct Shared {
    pub leptos_options: LeptosOptions,
    /// The use cases, with the store and the caches in front of it.
    pub service: Service,
    pub keys: Arc<ApiKeys>,
    pub sessions: SessionSettings,
    /// This server's shutdown: draining, then stopping its background tasks.
    pub shutdown: crate::shutdown::Shutdown,
    pub forward_auth: Arc<ForwardAuth>,
    /// Longest time any HTTP request may take.
    pub request_timeout: std::time::Duration,
    /// Longest a connection may take to send a request's header, and may sit idle between
    /// requests.
    pub header_read_timeout: std::time::Duration,
    /// Connections each listener holds open at most.
    pub max_connections: usize,
    /// The reverse proxies whose forwarded headers are believed.
    pub trusted_proxies: crate::forwarded::TrustedProxies,
    /// Envoy's rate limit protocol: the gRPC address, key requirement and headers.
    pub envoy: crate::config::EnvoySettings,
    /// The dashboard's live streams each session holds open here.
    pub streams: Arc<crate::app::events::StreamSlots>,
}

impl std::ops::Deref for Shared {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

impl AppState {
    /// Connects to Redis as configured, loads the policies (seeding the demo policy on a
    /// first start) and starts keeping them fresh. Starts even when Redis is down: checks
    /// then answer by failure mode, and the policies load once Redis is back.
    pub async fn connect(config: Config) -> Result<Self, StoreError> {
        let store = connect_store(&config, config.redis_timeout).await?;
        if config.seed_demo
            && let Err(error) = seed_demo_policy(&store).await
        {
            tracing::warn!(%error, "could not seed the demo policy");
        }
        let policies = PolicyCache::default();
        if let Err(error) = policies.reload(&store).await {
            tracing::warn!(%error, "policies not loaded yet");
        }
        let denials = DenyCache::default();
        let shutdown = crate::shutdown::Shutdown::default();
        policies.spawn_refresher(store.clone(), denials.clone(), &shutdown);
        match ensure_first_admin(&store).await {
            Ok(Some((user, password))) => {
                // Printed once, to the terminal only: never logged.
                println!(
                    "\n  First start: created the admin user {user:?} with password\n\n      {password}\n\n  Sign in at the dashboard and keep it safe; it is not shown again.\n  Change it with `spillway user set-password {user}`.\n"
                );
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "could not check for a first admin"),
        }
        let keys = ApiKeys::new(
            config.service_keys.iter().map(String::as_str),
            config.admin_keys.iter().map(String::as_str),
        );
        if let Err(error) = keys.reload(&store).await {
            tracing::warn!(%error, "stored API keys not loaded yet");
        }
        keys.spawn_refresher(store.clone(), &shutdown);
        tokio::task::spawn_blocking(crate::auth::password::warm_up);
        let live = LiveCounts::default();
        live.spawn_flusher(store.clone(), &shutdown);
        let history = HistoryCounts::default();
        history.spawn_flusher(store.clone(), config.history_flush, &shutdown);
        crate::metrics::spawn_upkeep(&shutdown);
        let service = Service {
            store,
            policies,
            denials,
            live,
            history,
            outage: Default::default(),
            webhook_targets: config.webhook_targets.clone(),
        };
        service.spawn_alerts(
            crate::service::alerts::AlertSettings {
                every: config.alert_eval,
                public_url: config.public_url.clone(),
            },
            &shutdown,
        );
        Ok(Self(Arc::new(Shared {
            leptos_options: config.leptos_options,
            service,
            keys: Arc::new(keys),
            sessions: config.sessions,
            shutdown,
            request_timeout: config.request_timeout,
            header_read_timeout: config.header_read_timeout,
            max_connections: config.max_connections,
            trusted_proxies: config.trusted_proxies.clone(),
            envoy: config.envoy.clone(),
            streams: Default::default(),
            forward_auth: Arc::new(ForwardAuth {
                identifiers: config.forward_auth_identifiers,
                deny_status: config.forward_auth_deny_status,
            }),
        })))
    }
}

/// The Redis the configuration names: a cluster, or one server (with a private CA for
/// `rediss://` when `REDIS_CA_CERT` is set). The server and the command line both connect here.
pub async fn connect_store(
    config: &Config,
    timeout: std::time::Duration,
) -> Result<Store, StoreError> {
    if !config.redis_cluster_urls.is_empty() {
        return Store::connect_cluster(&config.redis_cluster_urls, timeout, Keys::default()).await;
    }
    let ca = match &config.redis_ca_cert {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| StoreError::Reply(format!("REDIS_CA_CERT {}: {e}", path.display())))?,
        ),
        None => None,
    };
    Store::connect_tls(&config.redis_url, ca, timeout, Keys::default()).await
}

/// Creates the user `admin` with a random password when there are no users at all;
/// returns the name and password to show once. Several instances starting together create
/// it once (HSETNX).
pub async fn ensure_first_admin(store: &Store) -> Result<Option<(String, String)>, StoreError> {
    use crate::{
        domain::people::{Role, Username},
        store::people::UserRecord,
    };
    if !store.list_users().await?.is_empty() {
        return Ok(None);
    }
    let password = crate::auth::password::generate_password();
    let user = UserRecord {
        username: Username::parse("admin").expect("a valid name"),
        role: Role::Admin,
        password_hash: crate::auth::password::hash(password.clone()).await,
        created_at_ms: crate::clock::now_ms(),
    };
    if store.add_user(&user).await? {
        let _ = crate::audit::Actor {
            name: "system".into(),
            role: "system".into(),
            ip: String::new(),
        }
        .record(
            store,
            crate::audit::Change {
                action: "user.add",
                target: "admin",
                after: serde_json::json!({ "username": "admin", "role": "admin" }).to_string(),
                reason: "first start",
                ..Default::default()
            },
        )
        .await;
        Ok(Some(("admin".into(), password)))
    } else {
        Ok(None)
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
