//! The use cases every front door calls: checking (`check`, and Envoy's `envoy`, which share
//! the failure mode, history and metrics), reports and leases, inspecting and resetting an
//! identifier, changing, importing and reading policies, alerts, the history, the audit log,
//! the overview's facts, users and API keys (`people`, `keys`), signing in and sessions
//! (`sessions`, `signin`), and the first admin and demo policy of a first start. The JSON
//! API, Envoy's gRPC and `/json`, the dashboard's server functions and the command line parse
//! their input, call these through [`Service`]'s methods, and render what comes back; none of
//! them checks, counts or audits on its own, and none names the store. This layer knows
//! neither HTTP nor Redis (the store does).
//!
//! With the use cases live the caches they keep in front of Redis: the policies
//! (`policy_cache`), denials that stand until a known time (`deny_cache`) and the denials
//! answered from it, on their way to the overview's counters (`live`), and every answered
//! check on its way to the history (`history`). Their locks recover a poisoned guard
//! (`PoisonError::into_inner`): what they hold (counters, caches, snapshots) is whole at
//! every step, and one panic while a lock was held must not make every later check panic.

pub mod alerts;
pub mod audit;
pub mod backup;
pub mod check;
pub mod deny_cache;
pub mod envoy;
pub mod history;
pub mod identifiers;
pub mod keys;
pub mod leases;
pub mod live;
pub mod local;
pub mod overview;
pub mod password;
pub mod people;
pub mod policies;
pub mod policy_cache;
pub mod record;
pub mod report;
pub mod sessions;
pub mod signin;
mod waiting;

pub use check::{CheckError, CheckRequest, Checked};

use crate::{config::Config, store::Store, support::clock::now_ms, support::shutdown::Shutdown};

/// What a use case answers when Redis did not: the store's error, named here so front doors
/// need not know the store.
pub use crate::store::StoreError;
/// Records the use cases hand out as they are kept.
pub use crate::store::{
    RedisHealth,
    people::{ApiKeyRecord, UserRecord},
    sessions::SessionRecord,
    stats::Ranked,
};

/// The store and the caches in front of it: what every use case works with. Cloned
/// cheaply (each part is a handle). Its parts are its own: front doors call its methods.
#[derive(Clone)]
pub struct Service {
    store: Store,
    policies: policy_cache::PolicyCache,
    denials: deny_cache::DenyCache,
    /// This instance's counters of local rules (`sync: local`).
    local: local::LocalCounts,
    live: live::LiveCounts,
    /// This instance's counts on their way to the history.
    history: history::HistoryCounts,
    /// Since when this instance's checks fail on Redis (for the `degraded` alerts).
    outage: alerts::RedisOutage,
    /// The internal hosts alert webhooks may reach.
    webhook_targets: crate::net::outbound::Targets,
    /// The API keys this instance accepts.
    keys: std::sync::Arc<keys::ApiKeys>,
    /// Whether checks are also counted per rule in the metrics (`SPILLWAY_METRICS_RULE_LABEL`).
    rule_metrics: bool,
    /// The domains folder kept loaded, if any: where, and why its latest files are not in
    /// force.
    domains_folder: std::sync::Arc<std::sync::Mutex<Option<DomainsFolder>>>,
    /// Places for denied requests held by policies that wait (`SPILLWAY_MAX_WAITING`).
    waiting: std::sync::Arc<tokio::sync::Semaphore>,
    /// Checks on their way to the record that what-if replays read.
    recorder: record::Recorder,
    /// Every Envoy request answered OK, its over-limit descriptors still said
    /// (`SPILLWAY_ENVOY_SHADOW_MODE`, upstream's `SHADOW_MODE`).
    envoy_shadow_all: bool,
    /// A domain in several files is one domain, their descriptors added together
    /// (`SPILLWAY_ENVOY_MERGE_DOMAINS`, upstream's `MERGE_DOMAIN_CONFIG`).
    envoy_merge_domains: bool,
}

/// The domains folder's state, as its reader reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainsFolder {
    pub dir: String,
    /// Why the folder's latest files are not in force (file and field), if they are not.
    pub problem: Option<String>,
}

impl Service {
    /// The service of a running server: loads the policies (seeding the demo policy on a
    /// first start, when configured), creates the first admin when there are no users, and
    /// starts the background work that keeps the caches fresh and the counters flowing.
    /// Starts even when Redis is down: checks then answer by failure mode, and the policies
    /// load once Redis is back.
    pub async fn start(config: &Config, store: Store, shutdown: &Shutdown) -> Self {
        if config.seed_demo
            && let Err(error) = policies::seed_demo_policy(&store).await
        {
            tracing::warn!(%error, "could not seed the demo policy");
        }
        let service = Self::new(store, config);
        if let Err(error) = service.policies.reload(&service.store).await {
            tracing::warn!(%error, "policies not loaded yet");
        }
        service.policies.spawn_refresher(
            service.store.clone(),
            service.denials.clone(),
            service.local.clone(),
            shutdown,
        );
        service.announce_first_admin(&config.first_admin).await;
        if let Err(error) = service.keys.reload(&service.store).await {
            tracing::warn!(%error, "stored API keys not loaded yet");
        }
        service
            .keys
            .spawn_refresher(service.store.clone(), shutdown);
        tokio::task::spawn_blocking(password::warm_up);
        service.live.spawn_flusher(service.store.clone(), shutdown);
        service
            .recorder
            .spawn_flusher(service.store.clone(), shutdown);
        service
            .local
            .spawn_flusher(service.store.clone(), service.outage.clone(), shutdown);
        service
            .history
            .spawn_flusher(service.store.clone(), config.history_flush, shutdown);
        crate::telemetry::metrics::spawn_upkeep(shutdown);
        service.spawn_alerts(
            alerts::AlertSettings {
                every: config.alert_eval,
                public_url: config.public_url.clone(),
            },
            shutdown,
        );
        service
    }

    /// The service of a one-off command (the command line, a test's setup): the same use
    /// cases over `store`, with no background work, no cached policies (a command reads what
    /// it needs) and no configured keys.
    pub fn for_command(store: Store) -> Self {
        Self {
            store,
            policies: Default::default(),
            denials: Default::default(),
            local: Default::default(),
            live: Default::default(),
            history: Default::default(),
            outage: Default::default(),
            webhook_targets: Default::default(),
            keys: Default::default(),
            rule_metrics: false,
            domains_folder: Default::default(),
            waiting: std::sync::Arc::new(tokio::sync::Semaphore::new(10_000)),
            recorder: Default::default(),
            envoy_shadow_all: false,
            envoy_merge_domains: false,
        }
    }

    fn new(store: Store, config: &Config) -> Self {
        Self {
            policies: policy_cache::PolicyCache::new(config.envoy.counting, config.envoy.quota_all),
            webhook_targets: config.webhook_targets.clone(),
            rule_metrics: config.metrics_rule_label,
            recorder: record::Recorder::new(config.record_checks),
            envoy_shadow_all: config.envoy.shadow_all,
            envoy_merge_domains: config.envoy.merge_domains,
            waiting: std::sync::Arc::new(tokio::sync::Semaphore::new(config.max_waiting)),
            keys: std::sync::Arc::new(keys::ApiKeys::new(
                config.service_keys.iter().map(String::as_str),
                config.admin_keys.iter().map(String::as_str),
            )),
            ..Self::for_command(store)
        }
    }

    /// The domains folder's reader says how its latest reading went.
    pub fn report_domains_folder(&self, dir: &str, problem: Option<String>) {
        *self
            .domains_folder
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(DomainsFolder {
            dir: dir.to_owned(),
            problem,
        });
    }

    /// The domains folder's state, when one is read.
    pub fn domains_folder(&self) -> Option<DomainsFolder> {
        self.domains_folder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The API keys this instance accepts.
    pub fn keys(&self) -> &keys::ApiKeys {
        &self.keys
    }

    /// Whether the policies have been read from Redis since this instance started.
    pub fn policies_loaded(&self) -> bool {
        self.policies.is_loaded()
    }

    /// The policy `name` as this instance holds it.
    pub fn known_policy(&self, name: &str) -> Option<std::sync::Arc<crate::domain::Policy>> {
        self.policies.get(name)
    }

    /// Whether Redis answers and runs scripts, and how fast.
    pub async fn redis_health(&self) -> Result<RedisHealth, StoreError> {
        let health = self.store.health().await;
        metrics::gauge!("spillway_redis_up").set(if health.is_ok() { 1.0 } else { 0.0 });
        health
    }
}
